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
