"""--verify on a real Lightning Trainer (CPU): automatic optimization with accumulate_grad_batches."""

import os
from pathlib import Path

import pytest

pytest.importorskip("lightning")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from bertlint.api import lint_path  # noqa: E402
from bertlint.verify import verify_script  # noqa: E402

SCRIPT = Path(__file__).resolve().parents[1] / "fixtures" / "verify" / "lightning_double_division.py"


def test_lightning_double_division_is_confirmed_by_the_observed_loss_scale():
    diags = [d for d in lint_path(str(SCRIPT)) if d.code == "BL104"]
    assert [d.start.row for d in diags] == [24]
    res = verify_script(str(SCRIPT), [], diags, timeout=240.0)
    (d,) = [x for x in res.diagnostics if x.code == "BL104"]
    assert d.verification.status == "confirmed", d.verification.evidence
    # Lightning divides by 4 and the script divides by 4 again: 1/16 reaches backward
    ev = d.verification.evidence
    assert ev.startswith("observed: micro-batch 1: backward with loss × 1/N² = 1/16 (`/ N` by hand and Lightning's "
                         "own `/ N`) → a window of 4 micro-batches weighs 1/4 in all, not 1"), ev
    assert "loss × 1/N² = 1/16 at backward (0.0625 observed)]" in ev
    # the window is 4 micro-batches per optimizer step, as accumulate_grad_batches says
    assert "optimizer steps" in res.report_text


def test_lightning_fixed_twin_gets_no_runtime_finding():
    res = verify_script(str(SCRIPT), ["--fixed"], [], timeout=240.0)
    assert [d.code for d in res.diagnostics] == []
    assert "0.25" in res.report_text  # Lightning's own 1/4 is the only division
