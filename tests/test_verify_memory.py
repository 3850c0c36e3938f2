"""Memory you can trust (ISSUE 15 part 4): --verify follows every storage allocation and free of the bounded run with
the dispatch-mode tracker `bertlint memory` uses (bertlint.memory.tracker): the reported peak matches torch's
profiler memory timeline of the same run within 1 %, with its phase and the categories alive at that moment
(gradients inside the backward), and growth of tensors that carry no graph is seen per optimizer step."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from bertlint.verify import verify_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "fixtures" / "verify" / "bert_memory.py"


def profiler_peak(tmp_path, argv) -> int:
    """The peak of torch's profiler memory timeline (CPU) over the script's training loop, run with plain python."""
    out = tmp_path / "profile.json"
    subprocess.run([sys.executable, str(SCRIPT), *argv, "--profile", str(out)], check=True, timeout=300)
    return json.loads(out.read_text())["peak"]


def test_peak_matches_the_profiler_timeline_with_phase_and_categories(tmp_path):
    # the default bound (2 optimizer steps + 1 micro-batch) runs the script's 3 steps to their end
    res = verify_script(str(SCRIPT), ["--steps", "3"], [], timeout=120)
    assert res.outcome == "verified", res.report_text
    mem = res.report_json["memory"]
    ref = profiler_peak(tmp_path, ["--steps", "3"])
    assert abs(mem["peak_bytes"] - ref) <= 0.01 * ref, (mem["peak_bytes"], ref)
    cats = mem["peak_by_category"]
    params = cats["parameters"]
    assert params >= 4 * sum(p.numel() for p in __import__("transformers").BertForSequenceClassification(
        __import__("transformers").BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                              intermediate_size=128, vocab_size=500, num_labels=2)).parameters())
    assert 0 <= cats["optimizer_states"] - 2 * params < 1024  # AdamW: exp_avg, exp_avg_sq and 0-dim step counters
    assert mem["peak_phase"] in ("backward", "optimizer") and mem["peak_step"] is not None
    bw = mem["phases"]["backward"]
    assert bw["gradients"] > 0  # the gradients that exist inside the backward are counted there
    assert sum(bw[c] for c in ("parameters", "gradients", "optimizer_states", "activations", "temporaries")) == \
        bw["total"]
    assert f"peak {res.report_json['memory']['peak_bytes'] / 2 ** 20:.2f} MiB in {mem['peak_phase']}" in \
        res.report_text


def test_growth_of_tensors_without_a_graph_is_seen_per_optimizer_step():
    res = verify_script(str(SCRIPT), ["--steps", "50", "--keep", "1"], [], steps=5, timeout=120)
    g = res.report_json["memory"]["growth"]
    assert g["unit"] == "optimizer step"
    for cat in ("temporaries", "total"):
        assert g["growing"][cat]["bytes_per_unit"] == pytest.approx(2 ** 20, rel=0.01)
    assert "live tensors grow every optimizer step: temporaries +1.00 MiB/optimizer step" in res.report_text
    res = verify_script(str(SCRIPT), ["--steps", "50"], [], steps=5, timeout=120)
    assert res.report_json["memory"]["growth"]["growing"] == {}


def test_gpu_check_imports_and_exits_cleanly_without_cuda():
    script = ROOT / "benchmarks" / "gpu_check.py"
    p = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0 and "--budget" in p.stdout
    if not torch.cuda.is_available():
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0 and "CUDA is not available" in p.stdout
