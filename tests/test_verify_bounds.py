"""--verify is bounded and leaves nothing running (ISSUE 15 part 2): Ctrl-C / SIGTERM to bertlint end the whole
process group (the script and its DataLoader worker) and remove the record folder; --verify-timeout is honoured
within a few seconds with the partial record kept, even when the script ignores SIGTERM or hangs in one call;
a script that starts its own ranks with torch.multiprocessing.spawn is run as it is (never under torchrun) with every
worker instrumented and bounded; `torchrun -m bertlint.verify` ends without a ChildFailedError traceback and
leaves no record folder. Real torch, gloo on the CPU."""

from __future__ import annotations

import glob
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")

from bertlint.types import Diagnostic, Position, Severity  # noqa: E402
from bertlint.verify import verify_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
V = ROOT / "fixtures" / "verify"
FOREVER = V / "runs_forever.py"


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie waiting for its parent is gone for our purpose
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def wait_for(cond, timeout: float) -> bool:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def _signal_state(pids) -> str:
    """Each process's signal dispositions and state (/proc: blocked, ignored, caught, pending) and ps's line."""
    out = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/status") as f:
                out.append(f"{pid}: " + " ".join(x.split()[0] + x.split()[1] for x in f
                                                 if x.startswith(("State", "SigPnd", "ShdPnd", "SigBlk", "SigIgn",
                                                                  "SigCgt"))))
        except OSError as e:
            out.append(f"{pid}: {e!r}")
    ps = subprocess.run(["ps", "-o", "pid,ppid,pgid,stat,wchan:20,cmd", "-p", ",".join(map(str, pids))],
                        capture_output=True, text=True)
    return "\n".join(out) + "\n" + ps.stdout


def _start_as_a_foreground_command(cmd, **kw) -> subprocess.Popen:
    """Popen(cmd) with SIGINT at its default disposition in the new process, as an interactive shell starts the
    command Ctrl-C is pressed in. A disposition of SIG_IGN is inherited through fork and exec (POSIX), and a
    non-interactive shell starts every background command (`cmd &`) with SIGINT ignored (bash manual, "Signals"),
    so a suite started that way passes the ignore on to every bertlint it starts; CPython then installs no
    KeyboardInterrupt handler (signal module: "SIGINT is translated into a KeyboardInterrupt exception if the parent
    process has not changed it") and the SIGINT sent below is discarded: bertlint keeps running its script, as a
    background command must. Setting the handler here (and back after the fork) gives the child SIG_DFL: exec
    resets caught signals to their default."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return subprocess.Popen(cmd, **kw)
    finally:
        signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_to_bertlint_ends_the_process_group_and_removes_the_record_folder(tmp_path, sig):
    pids = tmp_path / "pids.json"
    p = _start_as_a_foreground_command(
        [sys.executable, "-m", "bertlint", "--verify", "--verify-steps", "100000", str(FOREVER), "--", "--pids",
         str(pids)], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONFAULTHANDLER": "1"})  # (the Python stacks on SIGABRT, should it not exit)
    try:
        assert wait_for(pids.exists, 90), "the script did not start training"
        info = json.loads(pids.read_text())
        procs = [info["script"], *info["workers"]]
        record_dir = Path(next(x for x in info["cmdline"] if x.endswith(".json"))).parent
        assert all(alive(x) for x in procs) and record_dir.is_dir()
        p.send_signal(sig)
        try:
            rc = p.wait(timeout=90)  # (bertlint ends the group within its 1.5 s grace: seconds, even when loaded)
        except subprocess.TimeoutExpired:
            state = _signal_state([os.getpid(), p.pid, *procs])
            p.send_signal(signal.SIGABRT)
            out = p.communicate(timeout=30)[0].decode("utf-8", "replace")
            pytest.fail(f"bertlint did not exit within 90 s of {sig!r}; signal state (pytest, bertlint, script, "
                        f"workers):\n{state}--- bertlint's output:\n{out[-6000:]}")
        assert wait_for(lambda: not any(alive(x) for x in procs), 10), [x for x in procs if alive(x)]
        assert not record_dir.exists()
        assert rc == (130 if sig == signal.SIGINT else -signal.SIGTERM)
    finally:
        if p.poll() is None:
            p.kill()


def test_timeout_is_honoured_with_a_sigterm_ignoring_script_and_keeps_the_partial_record():
    t0 = time.time()
    res = verify_script(str(FOREVER), ["--ignore-sigterm"], [], steps=100000, timeout=15)
    wall = time.time() - t0
    assert wall < 15 + 5, wall
    assert res.outcome == "timeout" and res.exit_code == 3
    assert res.report_json["microbatches"] > 5  # what ran before the deadline was recorded
    assert "outcome: stopped by --verify-timeout (15 s)" in res.report_text


def test_timeout_is_honoured_when_the_script_hangs_in_one_call():
    t0 = time.time()
    res = verify_script(str(FOREVER), ["--ignore-sigterm", "--hang-after", "3"], [], steps=100000, timeout=12)
    wall = time.time() - t0
    assert wall < 12 + 6, wall
    assert res.outcome == "timeout"
    assert res.report_json["optimizer_steps"] == 3  # the incremental record survived the kill


def test_spawned_workers_are_instrumented_bounded_and_not_wrapped_in_torchrun():
    script = V / "spawn_workers.py"
    d = Diagnostic("BL114", "ddp-accumulation-sync", Severity("W"), "m", str(script), Position(27, 1),
                   Position(27, 2))
    t0 = time.time()
    res = verify_script(str(script), [], [d], timeout=120)
    assert time.time() - t0 < 90
    assert res.outcome == "verified", res.report_text
    assert res.report_json["ranks"] == 2 and res.report_json["spawned_workers"] == 2
    assert {r["role"] for r in res.records} == {"main", "spawn"}
    # accumulation 4, default bound: 3 windows + 1 micro-batch in each worker
    assert res.report_json["microbatches"] == 13 and res.report_json["optimizer_steps"] == 3
    assert "workers started by the script, each instrumented" in res.report_text
    assert d.verification.status == "refuted", d.verification.evidence  # no_sync: one all-reduce per step


def _alive(pids) -> list:
    out = []
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        except PermissionError:
            pass
        out.append(pid)
    return out


@pytest.mark.parametrize("args", [["--start-method", "spawn"], ["--start-method", "fork", "--subclass"]],
                         ids=["spawn-target", "fork-subclass"])
def test_multiprocessing_process_workers_are_instrumented_bounded_and_ended(args):
    script = V / "process_workers.py"
    d = Diagnostic("BL105", "scheduler-every-micro-batch", Severity("E"), "m", str(script), Position(23, 1),
                   Position(23, 2))
    t0 = time.time()
    res = verify_script(str(script), args, [d], timeout=120)
    assert time.time() - t0 < 90  # the workers' loops are endless: only the bound ends them
    assert res.outcome == "verified", res.report_text
    workers = [r for r in res.records if r["role"] == "spawn"]
    assert len(workers) == 2 and res.report_json["spawned_workers"] == 2
    # the static set-up says N = 4 (the loop's gate): each worker stops at 3 windows + 1 micro-batch
    assert [r["microbatches"] for r in workers] == [13, 13] and {r["stop_reason"] for r in workers} == {"bound"}
    assert d.verification.status == "confirmed", d.verification.evidence
    assert "`scheduler.step()` ×4, `optimizer.step()` ×1" in d.verification.evidence
    assert not _alive([r["pid"] for r in res.records])


def test_torchrun_module_exits_cleanly_without_a_record_folder():
    def shared_folders():  # the folder the ranks share under torchrun: bertlint-verify-<12 hex digits>
        return {p for p in glob.glob(os.path.join(tempfile.gettempdir(), "bertlint-verify-*"))
                if re.fullmatch(r"bertlint-verify-[0-9a-f]{12}", os.path.basename(p))}

    before = shared_folders()
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port",
                        port, "-m", "bertlint.verify", str(V / "ddp_accumulation.py"), "--timeout", "120", "--",
                        "--mode", "split"], capture_output=True, text=True, timeout=240, cwd=ROOT)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "ChildFailedError" not in out and "Traceback" not in out
    assert "gradient checksum differs across ranks" in out and "outcome: verified" in out
    assert "without torchrun the exit status would be 1" in out
    assert shared_folders() <= before
