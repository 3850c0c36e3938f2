"""bertlint memory: the fake-tensor simulation, its agreement with a real step, script set-up resolution,
the CLI's text/JSON/PNG output and its errors. Tiny models only (built from configs, nothing downloaded)."""

from __future__ import annotations

import json
import os
import textwrap

import pytest

os.environ["HF_HUB_OFFLINE"] = "1"

from bertlint.memory import MemoryInputError, MemorySpec  # noqa: E402
from bertlint.memory.cli import main  # noqa: E402
from bertlint.memory.script import Overrides, specs_from_script  # noqa: E402
from bertlint.memory.simulate import measure_real, simulate  # noqa: E402
from bertlint.memory.tracker import CATEGORIES  # noqa: E402

TINY = dict(model_type="bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
            vocab_size=100, max_position_embeddings=64)


def tiny(**kw) -> MemorySpec:
    base = dict(config=dict(TINY), micro_batch=4, seq_len=16)
    base.update(kw)
    return MemorySpec(**base)


# ------------------------------------------------------------------ simulation against a real step

@pytest.mark.parametrize("kw", [
    {},
    {"precision": "bf16"},
    {"checkpointing": True},
    {"checkpointing": True, "reentrant": True, "precision": "bf16"},
    {"optimizer": "sgd", "sgd_momentum": 0.9},
    {"optimizer": "adafactor"},
    {"lora_rank": 4},
    {"precision": "bf16-pure"},
    {"head": "AutoModelForMaskedLM"},
    {"head": "AutoModelForTokenClassification", "micro_batch": 1},
    {"head": "AutoModelForQuestionAnswering"},
])
def test_fake_simulation_equals_real_step(kw):
    spec = tiny(**kw)
    sim = simulate(spec, "cpu")
    real = measure_real(spec)
    assert sim.peak_bytes == real.peak_bytes
    assert sim.by_category == real.by_category
    assert sim.peak_phase == real.peak_phase
    assert sum(sim.by_category.values()) == sim.peak_bytes


def test_categories_match_adamw_arithmetic():
    res = simulate(tiny(micro_batch=1, seq_len=8), "cpu")
    n = res.param_count
    params = res.by_category["parameters"]
    # fp32 parameters (+ the position_ids/token_type_ids buffers: int64, small)
    assert 4 * n <= params <= 4 * n + 2 * 8 * 64 + 64
    # AdamW: exp_avg + exp_avg_sq in fp32, plus one scalar step per parameter tensor
    opt = res.by_category["optimizer_states"]
    assert 8 * n <= opt <= 8 * n + 4 * 64
    assert set(res.by_category) == set(CATEGORIES)


def test_peak_grows_with_batch_and_checkpointing_lowers_activations():
    small = simulate(tiny(micro_batch=1, seq_len=32), "cpu")
    big = simulate(tiny(micro_batch=8, seq_len=32), "cpu")
    assert big.peak_bytes > small.peak_bytes
    assert big.by_category["activations"] > 4 * small.by_category["activations"]
    ck = simulate(tiny(micro_batch=8, seq_len=32, checkpointing=True), "cpu")
    assert ck.phase_peaks["forward"]["by_category"]["activations"] < big.phase_peaks["forward"]["by_category"]["activations"] / 2


def test_lora_has_no_gradients_or_states_for_frozen_weights():
    full = simulate(tiny(), "cpu")
    lora = simulate(tiny(lora_rank=2), "cpu")
    assert lora.trainable_count < full.trainable_count / 10
    assert lora.by_category["optimizer_states"] < full.by_category["optimizer_states"] / 10


def test_cuda_rules_round_to_512_byte_blocks():
    cpu = simulate(tiny(), "cpu")
    cuda = simulate(tiny(), "cuda")
    # small tensors (biases, LayerNorm weights) each take a whole 512-byte block
    assert cuda.by_category["parameters"] > cpu.by_category["parameters"]
    assert all(v % 512 == 0 for v in cuda.by_category.values())


def test_cuda_kernels_keep_no_attention_probabilities():
    # CPU: math attention keeps B x heads x L x L probabilities (and a float dropout mask); CUDA kernels do not
    spec = tiny(micro_batch=2, seq_len=64)
    cpu = simulate(spec, "cpu").phase_peaks["forward"]["by_category"]["activations"]
    cuda = simulate(spec, "cuda").phase_peaks["forward"]["by_category"]["activations"]
    probs = 2 * 2 * 64 * 64 * 4  # one layer's fp32 probabilities
    assert cpu - cuda > 2 * probs
    # checkpointing recomputes through the same kernels
    ck = simulate(tiny(micro_batch=2, seq_len=64, checkpointing=True, precision="bf16"), "cuda")
    assert ck.peak_bytes > 0


def test_adam8bit_states_are_a_quarter_of_adamw():
    big = dict(TINY, hidden_size=128, intermediate_size=256, num_attention_heads=2)
    w = simulate(tiny(config=big), "cpu")
    q = simulate(tiny(config=big, optimizer="adam8bit"), "cpu")
    ratio = q.by_category["optimizer_states"] / w.by_category["optimizer_states"]
    assert 0.24 < ratio < 0.45


def test_what_if_table_order_and_accumulation_row():
    res = simulate(tiny(micro_batch=4, seq_len=64, accumulation=4), "cpu", what_if=True)
    changes = [r["change"] for r in res.what_if]
    order = ["micro-batch 1", "sequence length", "checkpointing", "bf16", "8-bit", "ZeRO stage 1", "ZeRO stage 2",
             "ZeRO stage 3", "LoRA", "gradient accumulation"]
    idx = [next(i for i, c in enumerate(changes) if key in c) for key in order]
    assert idx == sorted(idx)
    by = {r["change"]: r for r in res.what_if}
    assert by["micro-batch 1"]["peak_bytes"] < res.peak_bytes
    acc = next(r for r in res.what_if if "accumulation" in r["change"])
    assert acc["peak_bytes"] == res.peak_bytes and "effective batch 4 x 4 = 16" in acc["note"]
    z1, z3 = (next(r for r in res.what_if if f"stage {s}" in r["change"]) for s in (1, 3))
    assert z1["peak_bytes"] < res.peak_bytes
    assert "over 8 devices" in z3["change"]  # no world size in the spec: W = 8


def test_bad_architecture_and_class_say_which_option():
    with pytest.raises(MemoryInputError, match="--model-config"):
        simulate(tiny(config={"model_type": "no-such-arch", "hidden_size": 8}), "cpu")
    with pytest.raises(MemoryInputError, match="--head"):
        simulate(tiny(head="MyCustomModel"), "cpu")
    with pytest.raises(MemoryInputError, match="--seq-len"):
        simulate(tiny(seq_len=1000), "cpu")


# ------------------------------------------------------------------ scripts

def _write(tmp_path, name: str, text: str, tiny_dir: bool = True) -> str:
    if tiny_dir:
        (tmp_path / "tiny").mkdir(exist_ok=True)
        (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY))
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


TRAINER = """
from transformers import AutoModelForSequenceClassification, AutoTokenizer, Trainer, TrainingArguments
tok = AutoTokenizer.from_pretrained("tiny")
model = AutoModelForSequenceClassification.from_pretrained("tiny", num_labels=2)
def enc(b):
    return tok(b["text"], truncation=True, padding="max_length", max_length=32)
args = TrainingArguments(output_dir="o", per_device_train_batch_size=4, gradient_accumulation_steps=8,
                         bf16=True, gradient_checkpointing=True, optim="adamw_bnb_8bit", deepspeed="ds.json")
Trainer(model=model, args=args).train()
"""

LOOP = """
import torch
from torch.utils.data import DataLoader
from transformers import AutoModelForMaskedLM, AutoTokenizer
model = AutoModelForMaskedLM.from_pretrained("tiny")
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
tok = AutoTokenizer.from_pretrained("tiny")
enc = tok(texts, truncation=True, max_length=24, padding=True)
loader = DataLoader(train_ds, batch_size=3, shuffle=True)
eval_loader = DataLoader(eval_ds, batch_size=64)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for batch in loader:
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_trainer_script_set_up(tmp_path):
    path = _write(tmp_path, "train.py", TRAINER)
    (tmp_path / "ds.json").write_text(json.dumps({"zero_optimization": {"stage": 2}, "train_micro_batch_size_per_gpu": "auto"}))
    (spec,) = specs_from_script(path, overrides=Overrides(world_size=4))
    assert (spec.micro_batch, spec.seq_len, spec.accumulation) == (4, 32, 8)
    assert spec.precision == "bf16" and spec.checkpointing and spec.optimizer == "adam8bit"
    assert (spec.zero_stage, spec.world_size) == (2, 4)
    assert spec.config["hidden_size"] == 32
    assert any("max_length" in a for a in spec.assumptions)


def test_loop_script_set_up(tmp_path):
    path = _write(tmp_path, "loop.py", LOOP)
    (spec,) = specs_from_script(path)
    assert spec.head == "AutoModelForMaskedLM"
    assert (spec.micro_batch, spec.seq_len, spec.precision) == (3, 24, "bf16")
    assert spec.optimizer == "sgd" and spec.sgd_momentum == 0.9
    assert spec.checkpointing and spec.reentrant
    assert any("upper bound" in a for a in spec.assumptions)  # padding=True: at most max_length


def test_missing_sequence_length_is_an_error_naming_the_option(tmp_path, capsys):
    path = _write(tmp_path, "noseq.py", LOOP.replace("max_length=24, padding=True", "truncation=False"))
    assert main([path]) == 2
    err = capsys.readouterr().err
    assert "--seq-len" in err and "Traceback" not in err
    assert main([path, "--seq-len", "16", "--no-what-if", "--device", "cpu"]) == 0


def test_custom_model_class_is_an_error_naming_the_options(tmp_path, capsys):
    path = _write(tmp_path, "custom.py", """
        import torch
        from torch import nn
        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(4, 4)
        model = Net()
        loader = torch.utils.data.DataLoader(ds, batch_size=8)
        enc = tokenizer(x, max_length=16, truncation=True)
    """, tiny_dir=False)
    assert main([path]) == 2
    err = capsys.readouterr().err
    assert "custom class `Net`" in err and "--model-config" in err and "--head" in err


def test_unknown_checkpoint_is_an_error(tmp_path, capsys):
    path = _write(tmp_path, "unk.py", TRAINER.replace('"tiny"', '"someone/private-model"'), tiny_dir=False)
    assert main([path]) == 2
    assert "--model-config" in capsys.readouterr().err


def test_cli_json_fields_and_fit(tmp_path, capsys):
    path = _write(tmp_path, "train.py", TRAINER.replace(', deepspeed="ds.json"', ""))
    rc = main([path, "--output-format", "json", "--gpu", "16GB"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and isinstance(out, list) and len(out) == 1
    d = out[0]
    for key in ("filename", "model", "micro_batch", "seq_len", "precision", "checkpointing", "peak_bytes",
                "peak_phase", "by_category", "assumptions", "what_if"):
        assert key in d
    assert d["peak_phase"] in ("forward", "backward", "optimizer")
    assert set(d["by_category"]) == set(CATEGORIES)
    assert d["model"]["class"] == "BertForSequenceClassification" and d["model"]["parameters"] > 0
    assert d["fits"] is True
    assert all({"change", "peak_bytes"} <= set(r) for r in d["what_if"])
    assert d["needed_bytes"] == d["peak_bytes"] + d["cuda_overhead_bytes"]


def test_cli_text_report_png_and_not_fitting(tmp_path, capsys):
    path = _write(tmp_path, "train.py", TRAINER.replace(', deepspeed="ds.json"', ""))
    rep = tmp_path / "rep"
    rc = main([path, "--gpu", "1MB", "--report", str(rep), "--micro-batch", "2"])
    text = capsys.readouterr().out
    assert rc == 1  # does not fit a 1 MiB card
    assert "by category at the peak" in text and "what if" in text and "NO" in text
    assert "micro-batch 2" in text
    png = (rep / "memory.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads((rep / "memory.json").read_text())[0]["micro_batch"] == 2


def test_cli_bad_gpu_and_model_config(tmp_path, capsys):
    path = _write(tmp_path, "train.py", TRAINER)
    assert main([path, "--gpu", "lots"]) == 2
    assert "--gpu" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{\"hidden_size\": 3}")
    assert main([path, "--model-config", str(bad)]) == 2
    assert "model_type" in capsys.readouterr().err
    assert main([str(tmp_path / "missing.py")]) == 2


# ------------------------------------------------------------------ the fixtures' set-ups (resolution only: fast)

FIX = os.path.join(os.path.dirname(__file__), "..", "fixtures", "memory")


def test_fixture_set_ups():
    (art,) = specs_from_script(os.path.join(FIX, "article_bert_base_512.py"))
    assert (art.model_name, art.micro_batch, art.seq_len, art.precision, art.checkpointing) == \
        ("bert-base-uncased", 32, 512, "fp32", False)
    assert art.config["hidden_size"] == 768 and art.head.endswith("SequenceClassification")
    (loop,) = specs_from_script(os.path.join(FIX, "loop_bf16_checkpointing.py"))
    assert (loop.config["model_type"], loop.micro_batch, loop.seq_len, loop.precision) == ("roberta", 16, 256, "bf16")
    assert loop.checkpointing and not loop.reentrant and loop.head.endswith("MaskedLM")
    (ds,) = specs_from_script(os.path.join(FIX, "trainer_deepspeed_zero2.py"), overrides=Overrides(world_size=8))
    assert (ds.zero_stage, ds.world_size, ds.accumulation, ds.precision, ds.seq_len) == (2, 8, 4, "bf16", 384)
    assert ds.head.endswith("QuestionAnswering") and ds.config["num_hidden_layers"] == 24
    with pytest.raises(MemoryInputError, match="custom class `Classifier`"):
        specs_from_script(os.path.join(FIX, "custom_model.py"))


def test_custom_wrapper_around_a_pretrained_encoder_is_not_guessed(tmp_path):
    path = _write(tmp_path, "wrap.py", """
        import torch
        from transformers import AutoModel
        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.enc = AutoModel.from_pretrained("tiny")
                self.out = torch.nn.Linear(32, 3)
        model = Net()
        loader = torch.utils.data.DataLoader(train_ds, batch_size=8)
        enc = tokenizer(x, max_length=16, truncation=True)
    """)
    with pytest.raises(MemoryInputError, match="custom class `Net`"):
        specs_from_script(path)
    (spec,) = specs_from_script(path, overrides=Overrides(head="AutoModel"))
    assert spec.head == "AutoModel" and spec.config["hidden_size"] == 32 and spec.micro_batch == 8


def test_zero_stage_shards_the_simulated_categories():
    plain = simulate(tiny(), "cpu")
    z2 = simulate(tiny(zero_stage=2, world_size=4), "cpu")
    assert z2.peak_bytes < plain.peak_bytes
    assert z2.by_category["optimizer_states"] <= plain.phase_peaks[z2.peak_phase]["by_category"]["optimizer_states"] // 4 + 1
    assert any("ZeRO stage 2 over 4 devices" in a for a in z2.assumptions)


def test_value_dependent_model_loss_is_computed_outside():
    deberta = dict(model_type="deberta-v2", hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                   intermediate_size=37, vocab_size=100, max_position_embeddings=64)
    res = simulate(tiny(config=deberta), "cuda")  # DeBERTa filters labels with nonzero(): no value under fake tensors
    assert res.model_class == "DebertaV2ForSequenceClassification" and res.peak_bytes > 0
    assert any("outside the model" in a for a in res.assumptions)
