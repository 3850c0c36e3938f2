"""One set-up model for ``explain`` and ``bertlint memory`` (issue 14): each set-up defect read from a script of our
own is checked against the expected set-up, and ``bertlint memory --device cpu`` against a real CPU step of the
tiny model with the correct set-up (the same byte count)."""

import glob
import json
import os
import textwrap

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from bertlint.explain import explain_source  # noqa: E402
from bertlint.memory.cli import main  # noqa: E402
from bertlint.memory.script import Overrides, specs_from_script  # noqa: E402
from bertlint.memory.simulate import measure_real  # noqa: E402
from bertlint.memory.spec import MemorySpec, lookup_architecture  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_BERT = dict(model_type="bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                 vocab_size=100, max_position_embeddings=64)


def _write(tmp_path, text, name="train.py", tail=False):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text) + (LOOP_TAIL if tail else ""))
    return str(p)


def _cli_cpu(path, capsys, *extra):
    capsys.readouterr()
    rc = main([path, "--device", "cpu", "--no-what-if", "--output-format", "json", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    (d,) = json.loads(out.out)
    return d


def _real_peak(**kw):
    return measure_real(MemorySpec(**kw)).peak_bytes


LOOP_TAIL = """
for batch in train_loader:
    loss = model(**batch).loss
    loss.backward()
    opt.step()
    opt.zero_grad()
"""


def test_config_from_a_dict_is_read_not_bert_base(tmp_path, capsys):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from transformers import BertConfig, BertForSequenceClassification
        cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=100,
                   max_position_embeddings=64)
        model = BertForSequenceClassification(BertConfig(**cfg))
        train_loader = DataLoader(ds, batch_size=4, shuffle=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    """, tail=True)
    (spec,) = specs_from_script(path, overrides=Overrides(seq_len=16))
    assert {k: spec.config[k] for k in TINY_BERT} == TINY_BERT
    d = _cli_cpu(path, capsys, "--seq-len", "16")
    assert d["peak_bytes"] == _real_peak(config=TINY_BERT, head="BertForSequenceClassification", micro_batch=4,
                                         seq_len=16)


def test_training_loader_not_the_first_loader(tmp_path, capsys):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=37, vocab_size=100, max_position_embeddings=64))
        eval_loader = DataLoader(eval_ds, batch_size=64)
        train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        def train():
            for epoch in range(2):
                for step, batch in enumerate(train_loader):
                    loss = model(**batch).loss
                    loss.backward()
                    opt.step()
                    opt.zero_grad()
        train()
    """)
    (spec,) = specs_from_script(path, overrides=Overrides(seq_len=16))
    assert spec.micro_batch == 8
    d = _cli_cpu(path, capsys, "--seq-len", "16")
    assert d["peak_bytes"] == _real_peak(config=TINY_BERT, head="BertForSequenceClassification", micro_batch=8,
                                         seq_len=16)
    # explain prints the same micro-batch
    rep = explain_source(open(path).read(), path)
    assert rep["loops"][0]["micro_batch"]["value"] == 8


def test_two_loaders_and_no_training_loop_is_unknown(tmp_path):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2))
        a = DataLoader(ds1, batch_size=64)
        b = DataLoader(ds2, batch_size=8)
    """)
    from bertlint.memory import MemoryInputError

    with pytest.raises(MemoryInputError, match="--micro-batch"):
        specs_from_script(path, overrides=Overrides(seq_len=16))


def test_trainer_default_optimizer_is_fused_adamw_on_5x(tmp_path, capsys):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY_BERT))
    path = _write(tmp_path, """
        from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments
        model = AutoModelForSequenceClassification.from_pretrained("./tiny")
        args = TrainingArguments(output_dir="o", per_device_train_batch_size=4)
        Trainer(model=model, args=args).train()
    """)
    (tmp_path / "requirements.txt").write_text("transformers==5.24.0\ntorch==2.13.0\n")
    (spec,) = specs_from_script(path, overrides=Overrides(seq_len=16))
    assert spec.optimizer == "adamw" and spec.fused is True
    assert any("adamw_torch_fused" in a for a in spec.assumptions)
    d = _cli_cpu(path, capsys, "--seq-len", "16")
    fused = _real_peak(config=TINY_BERT, head="AutoModelForSequenceClassification", micro_batch=4, seq_len=16,
                       fused=True)
    assert d["peak_bytes"] == fused and d["fused_optimizer"] is True
    # on 4.x the default is the for-loop adamw_torch
    (tmp_path / "requirements.txt").write_text("transformers==4.46.0\ntorch==2.5.0\n")
    (spec4,) = specs_from_script(path, overrides=Overrides(seq_len=16))
    assert not spec4.fused


def test_hand_loop_fused_adamw_is_read(tmp_path, capsys):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=37, vocab_size=100, max_position_embeddings=64))
        train_loader = DataLoader(ds, batch_size=2)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    """, tail=True)
    (spec,) = specs_from_script(path, overrides=Overrides(seq_len=16))
    assert spec.fused is True
    d = _cli_cpu(path, capsys, "--seq-len", "16")
    kw = dict(config=TINY_BERT, head="BertForSequenceClassification", micro_batch=2, seq_len=16)
    fused, loop = measure_real(MemorySpec(fused=True, **kw)), measure_real(MemorySpec(**kw))
    assert d["peak_bytes"] == fused.peak_bytes
    assert d["phase_peaks"] == fused.phase_peaks
    # the for-loop optimizer allocates temporaries during the step; the fused kernel none
    assert loop.phase_peaks["optimizer"]["peak_bytes"] > 0 and "optimizer" not in fused.phase_peaks


def test_lora_dropout_is_read(tmp_path, capsys):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from peft import LoraConfig, get_peft_model
        from transformers import AutoModelForSequenceClassification, BertConfig
        config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                            vocab_size=100, max_position_embeddings=64)
        model = AutoModelForSequenceClassification.from_config(config)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=["query", "value"]))
        train_loader = DataLoader(ds, batch_size=4)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    """, tail=True)
    (spec,) = specs_from_script(path, overrides=Overrides(seq_len=16))
    assert (spec.lora_rank, spec.lora_targets, spec.lora_dropout, spec.lora_alpha) == (4, ("query", "value"), 0.1, 8)
    d = _cli_cpu(path, capsys, "--seq-len", "16")
    kw = dict(config=TINY_BERT, head="AutoModelForSequenceClassification", micro_batch=4, seq_len=16, lora_rank=4,
              lora_targets=("query", "value"), lora_alpha=8)
    with_dropout = _real_peak(lora_dropout=0.1, **kw)
    assert d["peak_bytes"] == with_dropout and with_dropout > _real_peak(**kw)


CONFIG_FORMS = [
    ("from transformers import DistilBertConfig, DistilBertForSequenceClassification\n"
     "model = DistilBertForSequenceClassification(DistilBertConfig(dim=32, n_layers=2, n_heads=2, hidden_dim=37, "
     "vocab_size=100))", "distilbert", {"dim": 32, "n_layers": 2}),
    ("from transformers import GPT2Config, GPT2LMHeadModel\n"
     "model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64))",
     "gpt2", {"n_embd": 32, "n_layer": 2}),
    ("from transformers import LlamaConfig, LlamaForCausalLM\n"
     "model = LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, "
     "num_key_value_heads=1, intermediate_size=64, vocab_size=100))", "llama", {"num_key_value_heads": 1}),
    ("from transformers import AutoModelForMaskedLM, AutoConfig\n"
     "config = AutoConfig.for_model('bert', hidden_size=32, num_hidden_layers=2, num_attention_heads=2)\n"
     "model = AutoModelForMaskedLM.from_config(config)", "bert", {"hidden_size": 32}),
    ("from transformers import BertConfig, BertForMaskedLM\n"
     "model = BertForMaskedLM(BertConfig.from_dict({'hidden_size': 32, 'num_hidden_layers': 2, "
     "'num_attention_heads': 2}))", "bert", {"num_hidden_layers": 2}),
    ("from transformers import AutoConfig, AutoModelForSequenceClassification\n"
     "config = AutoConfig.from_pretrained('./tiny', num_labels=3)\n"
     "model = AutoModelForSequenceClassification.from_config(config)", "bert", {"hidden_size": 32, "num_labels": 3}),
    ("from transformers import BertForSequenceClassification\n"
     "model = BertForSequenceClassification.from_pretrained('./tiny')", "bert", {"intermediate_size": 37}),
    ("from transformers import BertConfig, BertForSequenceClassification\n"
     "config = BertConfig(hidden_size=32, num_attention_heads=2)\nconfig.num_hidden_layers = 3\n"
     "model = BertForSequenceClassification(config)", "bert", {"num_hidden_layers": 3}),
]


@pytest.mark.parametrize("src,model_type,expect", CONFIG_FORMS)
def test_configuration_forms_are_read(tmp_path, src, model_type, expect):
    (tmp_path / "tiny").mkdir()
    (tmp_path / "tiny" / "config.json").write_text(json.dumps(TINY_BERT))
    path = _write(tmp_path, "import torch\nfrom torch.utils.data import DataLoader\n" + src +
                  "\ntrain_loader = DataLoader(ds, batch_size=2)\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                  + LOOP_TAIL)
    (spec,) = specs_from_script(path, overrides=Overrides(seq_len=8))
    assert spec.config["model_type"] == model_type
    for k, v in expect.items():
        assert spec.config[k] == v


def test_gpt2_literal_memory_equals_a_real_step(tmp_path, capsys):
    path = _write(tmp_path, "import torch\nfrom torch.utils.data import DataLoader\n" + CONFIG_FORMS[1][0] +
                  "\ntrain_loader = DataLoader(ds, batch_size=2)\nopt = torch.optim.AdamW(model.parameters())\n"
                  + LOOP_TAIL)
    d = _cli_cpu(path, capsys, "--seq-len", "16")
    cfg = dict(model_type="gpt2", n_embd=32, n_layer=2, n_head=2, vocab_size=100, n_positions=64)
    assert d["peak_bytes"] == _real_peak(config=cfg, head="GPT2LMHeadModel", micro_batch=2, seq_len=16)


def test_unreadable_configuration_stays_unknown(tmp_path):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from transformers import BertConfig, BertForSequenceClassification
        def make(n):
            return BertForSequenceClassification(BertConfig(num_hidden_layers=n))
        model = make(4)
        train_loader = DataLoader(ds, batch_size=2)
        opt = torch.optim.AdamW(model.parameters())
    """, tail=True)
    from bertlint.memory import MemoryInputError

    with pytest.raises(MemoryInputError, match="--model-config"):
        specs_from_script(path, overrides=Overrides(seq_len=8))


def test_table_keeps_every_published_hyper_parameter():
    deb = lookup_architecture("microsoft/deberta-v3-base")
    assert deb["relative_attention"] is True and deb["position_buckets"] == 256 and deb["type_vocab_size"] == 0
    el = lookup_architecture("google/electra-base-discriminator")
    assert el["embedding_size"] == 768


def test_unknown_model_type_message_is_short_with_closest_names(tmp_path, capsys):
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps({"model_type": "bertt", "hidden_size": 32}))
    path = _write(tmp_path, "x = 1\n")
    rc = main([path, "--device", "cpu", "--no-what-if", "--model-config", str(cfg), "--head", "AutoModel",
               "--micro-batch", "1", "--seq-len", "8"])
    err = capsys.readouterr().err
    assert rc == 2 and len(err) < 400 and "closest" in err and "bert" in err


def test_lora_targets_option_and_what_if_phase(tmp_path, capsys):
    path = _write(tmp_path, """
        import torch
        from torch.utils.data import DataLoader
        from transformers import BertConfig, BertForSequenceClassification
        model = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                         intermediate_size=37, vocab_size=100, max_position_embeddings=64))
        train_loader = DataLoader(ds, batch_size=2)
        opt = torch.optim.AdamW(model.parameters())
    """, tail=True)
    capsys.readouterr()
    rc = main([path, "--device", "cpu", "--seq-len", "16", "--lora-rank", "2", "--lora-targets", "query,key",
               "--output-format", "json"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    (d,) = json.loads(out.out)
    assert d["lora_targets"] == ["query", "key"]
    rows = [r for r in d["what_if"] if r.get("peak_bytes") is not None]
    assert rows and all(r["peak_phase"] in ("forward", "backward", "optimizer") for r in rows)


def _fixture_scripts():
    out = sorted(glob.glob(os.path.join(ROOT, "fixtures", "**", "*.py"), recursive=True))
    out.append(os.path.join(ROOT, "examples", "train_bert_accum.py"))
    return out


def test_explain_and_memory_read_the_same_set_up(tmp_path):
    """On every fixture where explain states a micro-batch, bertlint memory (with the model and the optimizer
    given, so that only the set-up facts are compared) reads the same micro-batch and accumulation."""
    tiny = tmp_path / "tiny.json"
    tiny.write_text(json.dumps(TINY_BERT))
    ov = Overrides(seq_len=16, model_config=str(tiny), head="AutoModelForSequenceClassification", optimizer="adamw")
    compared = 0
    for path in _fixture_scripts():
        rep = explain_source(open(path, encoding="utf-8").read(), path)
        explained = [s for s in rep["setups"] if s.get("model") is not None or s.get("trainer")] or rep["loops"]
        explained = [e for e in explained if e["micro_batch"]["value"] is not None]
        if not explained:
            continue
        specs = specs_from_script(path, overrides=ov)
        assert sorted({s.micro_batch for s in specs}) == sorted({e["micro_batch"]["value"] for e in explained}), path
        for spec, e in zip(specs, explained):
            acc = (e.get("accumulation") or {}).get("value") if e.get("framework") == "transformers.Trainer" else None
            if isinstance(acc, int):
                assert spec.accumulation == acc, path
        compared += 1
    assert compared >= 50


def test_memory_on_the_accumulation_example(capsys):
    path = os.path.join(ROOT, "examples", "train_bert_accum.py")
    d = _cli_cpu(path, capsys, "--seq-len", "128")
    assert d["micro_batch"] == 8 and d["model"]["class"] == "BertForSequenceClassification"
    assert any("`MICRO_BATCH`" in a for a in d["assumptions"])


@pytest.mark.parametrize("name,shrink", [
    ("deberta-v3-base", dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,
                             vocab_size=100, position_buckets=8)),
    ("electra-base-discriminator", dict(hidden_size=32, embedding_size=16, num_hidden_layers=2, num_attention_heads=2,
                                        intermediate_size=37, vocab_size=100)),
])
def test_table_architectures_simulate_to_the_byte(name, shrink):
    """The table's full hyper-parameters (DeBERTa-v3's relative attention, ELECTRA's embedding_size) build and the
    simulated step equals a real CPU step of the same (shrunk) architecture."""
    from bertlint.memory.simulate import simulate

    cfg = dict(lookup_architecture(name), **shrink)
    spec = MemorySpec(config=cfg, head="AutoModelForSequenceClassification", micro_batch=2, seq_len=16)
    real = measure_real(spec)
    assert simulate(spec, "cpu").peak_bytes == real.peak_bytes
    if name.startswith("deberta"):
        flat = MemorySpec(config=dict(cfg, relative_attention=False, pos_att_type=None, position_biased_input=True),
                          head="AutoModelForSequenceClassification", micro_batch=2, seq_len=16)
        assert measure_real(flat).peak_bytes != real.peak_bytes  # relative attention changes the step's memory


def test_explain_reads_a_config_dict_like_memory(tmp_path):
    """explain's parameter count of ``BertConfig(**cfg)`` is the dict's model (not bert-base's 109 M)."""
    import transformers

    path = _write(tmp_path, """
        import torch
        from transformers import BertConfig, BertForSequenceClassification
        cfg = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=2, intermediate_size=128)
        model = BertForSequenceClassification(BertConfig(**cfg))
        train_loader = torch.utils.data.DataLoader(ds, batch_size=4)
        opt = torch.optim.AdamW(model.parameters())
    """, tail=True)
    rep = explain_source(open(path).read(), path)
    (m,) = [x["model"] for x in rep["loops"] + rep["setups"] if x.get("model")] or [None]
    bare = transformers.BertModel(transformers.BertConfig(hidden_size=64, num_hidden_layers=3, num_attention_heads=2,
                                                          intermediate_size=128))
    assert m is not None and m["parameters"] == sum(p.numel() for p in bare.parameters())
