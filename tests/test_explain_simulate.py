"""`bertlint explain --simulate` plugs the memory simulator (bertlint memory) into explain."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARTICLE = ROOT / "fixtures" / "memory" / "article_bert_base_512.py"


def _explain(*extra):
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    out = subprocess.run(
        [sys.executable, "-m", "bertlint", "explain", str(ARTICLE), "--output-format", "json", *extra],
        capture_output=True, text=True, env=env, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rep = json.loads(out.stdout)
    return rep[0] if isinstance(rep, list) else rep


def _memory(rep):
    setups = rep.get("setups") or [rep]
    return setups[0]["memory"]


def test_simulated_memory_replaces_first_order_estimate():
    first = _memory(_explain())
    sim = _memory(_explain("--simulate"))
    assert first["method"] == "first-order"
    assert sim["method"] == "simulated"
    # bert-base: 110M fp32 parameters = 417.66 MiB whichever way it is counted
    assert abs(sim["parameters"] - first["parameters"]) / first["parameters"] < 0.01
    # batch 32 x 512 tokens: activations dominate the simulated peak (the 25.1 GiB on the CPU;
    # about 10.8 GiB with CUDA kernels), far above the model states
    assert sim["activations"] > 4 * sim["parameters"]
    assert sim["total"] > sim["parameters"] + sim["activations"]


def _in_process_explain_and_memory(path, seq_len):
    """explain --simulate (in process, CPU storage rules) and bertlint memory --device cpu on the same file."""
    import functools

    import pytest

    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from bertlint.explain import explain_source, register_memory_estimator
    from bertlint.memory import explain_estimator
    from bertlint.memory.script import Overrides, specs_from_script
    from bertlint.memory.simulate import simulate

    register_memory_estimator(functools.partial(explain_estimator, device="cpu"))
    try:
        rep = explain_source(Path(path).read_text(), str(path), seq_len=seq_len)
    finally:
        register_memory_estimator(None)
    mems = [d["memory"] for d in rep["setups"] + rep["loops"]]
    peaks = [simulate(s, "cpu").peak_bytes for s in specs_from_script(str(path), overrides=Overrides(seq_len=seq_len))]
    return mems, peaks


def test_simulate_reads_the_files_context_like_memory(tmp_path):
    # the architecture is a dict spread into BertConfig and the micro-batch a module constant: both are read from the
    # file's context (without it the spec fell back on the table's bert-base, or gave up)
    mems, peaks = _in_process_explain_and_memory(ROOT / "examples" / "train_bert_accum.py", 128)
    assert [m["method"] for m in mems] == ["simulated"]
    assert [m["total"] for m in mems] == peaks
    assert any("MICRO_BATCH" in a for a in mems[0]["assumptions"])

    p = tmp_path / "train.py"
    p.write_text(
        "from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments\n"
        "cfg = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37,\n"
        "           vocab_size=100, max_position_embeddings=64)\n"
        "model = BertForSequenceClassification(BertConfig(**cfg))\n"
        "args = TrainingArguments('out', per_device_train_batch_size=4, gradient_accumulation_steps=2)\n"
        "Trainer(model=model, args=args, train_dataset=ds).train()\n")
    mems, peaks = _in_process_explain_and_memory(p, 16)
    assert [m["method"] for m in mems] == ["simulated"]
    assert [m["total"] for m in mems] == peaks
    # a 2-layer width-32 model: far below bert-base's 417 MiB of fp32 weights
    assert mems[0]["parameters"] < 1 << 20
