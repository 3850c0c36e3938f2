"""Honest outcomes of --verify (ISSUE 15 part 3): a crash, an out-of-memory error, a timeout and a run that reaches
no training step each get their own outcome line and exit status 3 (never "All checks passed!" and 0), with the
script's own error output (argparse's message, the traceback's frames in the script only); a violated invariant the
run observes is reported although the linter was given nothing (accumulation from `--grad-accum 4`)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bertlint.verify import verify_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
V = ROOT / "fixtures" / "verify"


def bertlint(*args, module="bertlint"):
    env = dict(os.environ, HF_HUB_OFFLINE="1", NO_COLOR="1")
    p = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=180, cwd=ROOT,
                       env=env)
    return p.returncode, p.stdout + p.stderr


CASES = {
    "crash": (["--verify", str(V / "crash_in_training.py")],
              ["outcome: the script failed (RuntimeError: mat1 and mat2 shapes cannot be multiplied (4x7 and 8x2) at "
               "crash_in_training.py:11) after 2 micro-batches, 2 optimizer steps observed",
               'File "' + str(V / "crash_in_training.py") + '", line 11, in <module>',
               "RuntimeError: mat1 and mat2 shapes cannot be multiplied"]),
    "argparse": (["--verify", str(V / "needs_args.py")],
                 ["needs_args.py: error: the following arguments are required: --data",
                  "outcome: the script failed (SystemExit: exit status 2 at needs_args.py:8)"]),
    "no-training": (["--verify", str(V / "no_training.py")],
                    ["outcome: no training step was reached: the script finished without a backward call"]),
    "timeout": (["--verify", "--verify-steps", "100000", "--verify-timeout", "6", str(V / "runs_forever.py")],
                ["outcome: stopped by --verify-timeout (6 s) after"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_failed_runs_have_their_own_outcome_and_exit_status_3(case):
    args, expected = CASES[case]
    rc, out = bertlint(*args)
    assert rc == 3, out
    assert "All checks passed" not in out
    for text in expected:
        assert text in out, (text, out)
    # the crash is placed in the user's code only
    assert "<frozen runpy>" not in out and "<string>" not in out and "_runner.py" not in out


def test_out_of_memory_has_its_outcome_and_phase():
    rc, out = bertlint(str(V / "bl502_good.py"), "--memory-limit", "9000", module="bertlint.verify")
    assert rc == 3, out
    assert "OUT OF MEMORY in forward" in out
    assert "outcome: the script ran out of memory in forward" in out


def test_accumulation_from_the_command_line_is_found_at_runtime_without_a_static_finding():
    res = verify_script(str(V / "accum_from_argv.py"), ["--grad-accum", "4"], [], timeout=60)
    (d,) = [d for d in res.diagnostics if d.code == "BL101"]
    assert d.data.get("runtime_only") and d.start.row == 19
    assert d.verification.status == "confirmed"
    ev = d.verification.evidence
    assert ev.startswith("observed: micro-batches 1–4: backward, then `optimizer.step()` after each → each update "
                         "sees one micro-batch weighted 1/N = 1/4 instead of 4 micro-batches summing to 1"), ev
    assert "loss × 1/N = 1/4 at backward (0.25 observed)]" in ev
    assert res.outcome == "verified" and res.exit_code == 1
    res = verify_script(str(V / "accum_from_argv.py"), ["--grad-accum", "1"], [], timeout=60)
    assert [d.code for d in res.diagnostics] == [] and res.exit_code == 0


def test_the_report_prints_the_static_set_up_and_where_the_run_differs():
    """The set-up the verifier verifies is the static set-up model's (the facts `explain` prints, with their
    sources); the run's own micro-batch and window length, read at runtime from arguments, are reported where they
    differ — and the bound follows the run's longer windows (three of them), not the static N = 2."""
    res = verify_script(str(V / "setup_from_args.py"), ["--batch-size", "4", "--grad-accum", "4"], [], timeout=120)
    assert res.outcome == "verified", res.report_text
    st = res.report_json["setup"]
    assert st["accumulation"] == {"value": 2, "source": "`args.grad_accum` (gate)"}
    assert st["micro_batch"] == {"value": 8, "source": "DataLoader batch_size (argparse default of --batch-size)"}
    assert "set-up verified (plain, line 17), as `bertlint explain` reads it:" in res.report_text
    diffs = res.report_json["setup_differences"]
    assert any(d.startswith("the run observed accumulation N 4 (micro-batches per optimizer step (4, 4))")
               and d.endswith("where the static set-up says 2 (`args.grad_accum` (gate))") for d in diffs), diffs
    assert any(d.startswith("the run observed micro-batch 4 (leading dimension of the training forwards' input)")
               for d in diffs), diffs
    assert "  set-up differs: the run observed micro-batch 4" in res.report_text
    assert res.report_json["optimizer_steps"] == 3 and res.report_json["microbatches"] == 13
    # the same file run with its defaults: what the static set-up says is what the run does
    res = verify_script(str(V / "setup_from_args.py"), [], [], timeout=120)
    assert res.report_json["setup_differences"] == [] and res.report_json["microbatches"] == 7
