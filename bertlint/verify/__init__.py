"""The runtime verifier: ``bertlint --verify SCRIPT [-- ARGS]``.

``verify_script`` runs the script in a child process under instrumentation (``bertlint.verify._runner``; the
script is not edited), stops it after a bounded amount of training, and gives every static diagnostic a
``verification`` {status, evidence}; it also reports what only the run shows, and where the memory goes.

The child runs in its own process group, bounded by a wall-clock deadline, with what it saves redirected to a
temporary folder (``_sandbox``); the group and the folders are gone on every way out. ``VerifyResult.outcome``
(:data:`OUTCOMES`) and ``exit_code`` (0 verified, nothing found; 1 verified, findings; 3 the script failed or
nothing could be verified) say whether the run verified anything.

This module does not import torch: the child process does. bertlint itself never dies with a traceback here:
any failure of the verifier becomes an "inconclusive"/"not-run" verification with the reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import re
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["VerifyResult", "verify_script"]


# Outcomes of a verify run and the exit status bertlint returns for each (README "Verifier"):
# 0 verified, nothing found; 1 verified, findings; 3 the script failed or nothing could be verified.
OUTCOMES = {
    "verified": "the run reached training and was observed",
    "crashed": "the script failed",
    "out-of-memory": "the script ran out of memory",
    "timeout": "stopped by --verify-timeout",
    "no-training": "no training step was reached",
    "not-run": "the script could not be run",
}
EXIT_FAILED = 3


@dataclass
class VerifyResult:
    diagnostics: list  # the input diagnostics with .verification set, plus runtime-only findings
    report_text: str = ""
    report_json: dict = field(default_factory=dict)
    records: list = field(default_factory=list)  # raw per-rank records of the run
    report_files: list = field(default_factory=list)
    outcome: str = "not-run"  # one of OUTCOMES

    @property
    def exit_code(self) -> int:
        if self.outcome != "verified":
            return EXIT_FAILED
        return 1 if self.diagnostics else 0


_N_KEYS = ("n", "accumulation", "gradient_accumulation_steps", "accumulate", "accumulation_steps", "ga")


def _static_n(diagnostics) -> Optional[int]:
    for d in diagnostics:
        data = getattr(d, "data", None) or {}
        for k in _N_KEYS:
            v = data.get(k)
            if isinstance(v, int) and not isinstance(v, bool) and v > 1:
                return v
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _under_torchrun() -> bool:
    e = os.environ
    try:
        return "RANK" in e and int(e.get("WORLD_SIZE", "1")) > 1 and "MASTER_ADDR" in e
    except ValueError:
        return False


_OWN_RANKS = re.compile(r"\b(?:spawn|start_processes)\s*\(|\bmultiprocessing\b[\s\S]*\bProcess\s*\(")


def launches_own_ranks(source: str) -> bool:
    """The script starts its own worker processes (torch.multiprocessing.spawn, start_processes, Process): it is
    run as it is, never under torchrun (its workers are instrumented where they start)."""
    return bool(_OWN_RANKS.search(source or ""))


def _child_env(sandbox: str) -> dict:
    from bertlint.verify._sandbox import child_environment

    env = dict(os.environ)  # the script's own environment: nothing is added to PYTHONPATH
    env.setdefault("PYTHONUNBUFFERED", "1")  # the output log is complete up to a kill
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return child_environment(env, sandbox)


class _Terminated(BaseException):
    """SIGTERM reached bertlint while the child ran."""


def _kill_group(pgid: int, grace: float = 1.5) -> None:
    """SIGTERM to the whole process group (the script, its DataLoader workers, torchrun and its ranks, spawned
    workers), then SIGKILL to whatever is left."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    except Exception:
        pass
    end = time.time() + grace
    while time.time() < end:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        except Exception:
            break
        time.sleep(0.05)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except Exception:
        pass


def _final_main_record(record_dir: str) -> bool:
    try:
        return any(name.startswith("rec-main") and name.endswith(".json.final") for name in os.listdir(record_dir))
    except Exception:
        return False


SHUTDOWN_GRACE = 15.0  # seconds the script may take to exit after its run ended (atexit handlers, flushing)
DEADLINE_GRACE = 2.5  # seconds past the deadline before the process group is ended


def _run_child(cmd: list[str], log_path: str, deadline: float, env: dict, record_dir: str) -> tuple:
    """Run the child in its own process group; returns (exit code or None, killed at the deadline). The group is
    ended on every way out (deadline, Ctrl-C or SIGTERM to bertlint, an error here). Ctrl-C is the
    KeyboardInterrupt CPython raises for SIGINT; a bertlint started with SIGINT ignored (a background command
    `bertlint --verify ... &` of a non-interactive shell, and whatever such a command starts) keeps ignoring it, as
    POSIX and CPython intend, and runs on to its deadline: SIGTERM ends it then."""
    with open(log_path, "wb") as log:
        try:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True)
        except OSError as e:
            log.write(f"could not start the child: {e}\n".encode())
            return None, False
        old = None
        if threading.current_thread() is threading.main_thread():
            def _term(signum, frame):
                raise _Terminated()

            try:
                old = signal.signal(signal.SIGTERM, _term)
            except Exception:
                old = None
        killed = False
        try:
            ended_at = None
            while True:
                rc = p.poll()
                if rc is not None:
                    return rc, False
                now = time.time()
                if now > deadline + DEADLINE_GRACE:
                    # a run that had ended (its final record written) and was only shutting down is not a timeout
                    killed = ended_at is None
                    _kill_group(p.pid)
                    return p.wait(), killed
                if ended_at is None and _final_main_record(record_dir):
                    ended_at = now
                if ended_at is not None and now > ended_at + SHUTDOWN_GRACE:
                    _kill_group(p.pid)  # the run ended but the process does not exit (a non-daemon thread)
                    return p.wait(), False
                time.sleep(0.1)
        finally:
            _kill_group(p.pid, grace=0.5 if killed else 1.5)  # leftovers: workers, ranks (no-op when none)
            if p.poll() is None:
                try:
                    p.wait(timeout=5)
                except Exception:
                    pass
            if old is not None:
                try:
                    signal.signal(signal.SIGTERM, old)
                except Exception:
                    pass


def _load_records(record_dir: str) -> list[dict]:
    recs = []
    for name in sorted(os.listdir(record_dir)):
        if name.startswith("rec-") and name.endswith(".json"):
            try:
                with open(os.path.join(record_dir, name)) as f:
                    recs.append(json.load(f))
            except Exception:
                continue
    return recs


def _tail(path: str, n: int = 2000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
        return data[-n:].decode("utf-8", "replace")
    except Exception:
        return ""


def verify_script(path, script_args, diagnostics, *, steps=None, timeout=300.0, report_dir=None, settings=None,
                  nproc=None, memory_limit=None) -> VerifyResult:
    """Run ``path`` under instrumentation and verify ``diagnostics`` (see the module docstring).

    steps: optimizer steps to observe (default 3: three accumulation windows — what the loop invariants need — plus one micro-batch);
    timeout: wall-clock seconds for the run; nproc: launch the script with torchrun on that many processes
    (default: 2 when the script initialises torch.distributed, does not start its own workers, and bertlint is
    not already under torchrun); memory_limit: bytes of live tensors after which an out-of-memory error is
    simulated. ``result.outcome`` / ``result.exit_code`` say whether the run could verify anything.
    """
    diagnostics = list(diagnostics or [])
    try:
        return _verify(path, list(script_args or []), diagnostics, steps, float(timeout or 300.0), report_dir,
                       settings, nproc, memory_limit)
    except _Terminated:
        # SIGTERM to bertlint: the child's group is gone (see _run_child); end as the signal asks
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        raise SystemExit(143)
    except KeyboardInterrupt:
        raise
    except Exception as e:  # never a traceback from bertlint itself
        from bertlint.types import Verification

        for d in diagnostics:
            if d.verification is None:
                d.verification = Verification("not-run", f"the verifier failed: {type(e).__name__}: {e}")
        return VerifyResult(diagnostics, f"bertlint --verify: the verifier failed: {type(e).__name__}: {e}\n"
                            f"  outcome: not verified (exit status {EXIT_FAILED})",
                            {"error": f"{type(e).__name__}: {e}", "outcome": "not-run"})


def _not_run(diagnostics, why: str, text: str) -> VerifyResult:
    from bertlint.types import Verification

    for d in diagnostics:
        d.verification = Verification("not-run", why)
    return VerifyResult(diagnostics, f"{text}\n  outcome: not verified: {why} (exit status {EXIT_FAILED})",
                        {"error": why, "outcome": "not-run"})


def _verify(path, args, diagnostics, steps, timeout, report_dir, settings, nproc, memory_limit) -> VerifyResult:
    from bertlint.types import Verification
    from bertlint.verify._sandbox import snapshot_temp

    script = os.path.realpath(path)
    t0 = time.time()
    if not os.path.isfile(script):
        return _not_run(diagnostics, f"{path} is not a file that can be run", f"bertlint --verify: {path} is not a file")
    if not script.endswith(".py"):
        return _not_run(diagnostics, "only Python scripts can be run by --verify (export the notebook with "
                                     "`jupyter nbconvert --to script`)",
                        f"bertlint --verify: {path} is not a Python script")
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError:
        source = ""
    mine = [d for d in diagnostics if os.path.realpath(d.filename) == script]
    from bertlint.verify._setup import static_setup

    setup = static_setup(script, source, settings)  # the set-up model `explain` prints (N bounds the run)
    setup_n = ((setup or {}).get("accumulation") or {}).get("value")
    static_n = setup_n if isinstance(setup_n, int) and setup_n > 1 else _static_n(mine)
    want_eval = any(d.code == "BL502" or (d.code == "BL501" and (d.data or {}).get("evaluation")) for d in mine)
    from bertlint.verify._rules import _watch_name

    lines = source.splitlines()
    watch = sorted({n for d in mine if d.code == "BL110" for n in [_watch_name(d, lines)] if n})
    torchrun_env = _under_torchrun()
    own_ranks = launches_own_ranks(source)
    notes = []
    if nproc is None:
        env_n = os.environ.get("BERTLINT_VERIFY_NPROC")
        if env_n and env_n.isdigit():
            nproc = int(env_n)
        elif not torchrun_env and not own_ranks and "init_process_group" in source:
            nproc = 2
        else:
            nproc = 1
    if own_ranks and nproc > 1:
        notes.append("the script starts its own worker processes: run as it is, not under torchrun")
        nproc = 1
    if torchrun_env:
        key = "|".join(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")) + script
        record_dir = os.path.join(tempfile.gettempdir(), "bertlint-verify-" + hashlib.sha1(key.encode()).hexdigest()[:12])
        os.makedirs(record_dir, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        for name in os.listdir(record_dir):
            if name.startswith(f"rec-main{rank}-"):
                try:
                    os.remove(os.path.join(record_dir, name))
                except OSError:
                    pass
    else:
        record_dir = tempfile.mkdtemp(prefix="bertlint-verify-")
        rank = "0"
    try:
        sandbox = os.path.join(record_dir, "sandbox")
        os.makedirs(sandbox, exist_ok=True)
        temp_snapshot = os.path.join(record_dir, f"temp_before{rank}.json")
        snapshot_temp(temp_snapshot)
        deadline = t0 + timeout
        cfg = {"record_dir": record_dir, "timeout": timeout, "deadline": deadline, "parent_pid": os.getpid(),
               "steps": steps, "accumulation": static_n, "want_eval": want_eval, "watch": watch,
               "memory_limit": memory_limit, "sandbox": sandbox, "temp_snapshot": temp_snapshot,
               "min_microbatches": 8 if any(d.code in ("BL501", "BL113") for d in mine) else 0}
        cfg_path = os.path.join(record_dir, f"config{rank}.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        runner = [os.path.join(os.path.dirname(os.path.abspath(__file__)), "_runner.py"), cfg_path, "--", script,
                  *args]
        if nproc and nproc > 1 and not torchrun_env:
            cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
                   str(_free_port()), *runner]
        else:
            cmd = [sys.executable, *runner]
        log_path = os.path.join(record_dir, f"child{rank}.log")
        rc, killed = _run_child(cmd, log_path, deadline, _child_env(sandbox), record_dir)
        if torchrun_env and rank != "0":
            for d in mine:
                d.verification = Verification("not-run", f"rank {rank}: rank 0 reports the verification")
            return VerifyResult(diagnostics, f"bertlint --verify: rank {rank} recorded; rank 0 reports", {},
                                outcome="verified")
        records = _load_records(record_dir)
        if torchrun_env:
            want = int(os.environ.get("WORLD_SIZE", "1"))
            wait_until = time.time() + 60
            while len([r for r in records if r.get("role") == "main" and r.get("final")]) < want and \
                    time.time() < wait_until:
                time.sleep(0.3)
                records = _load_records(record_dir)
        wall = time.time() - t0
        res = _build(script, source, diagnostics, mine, records, static_n, settings, wall, log_path, killed, rc,
                     shown_name=str(path), timeout=timeout, notes=notes, script_args=args, setup=setup)
        if report_dir:
            from bertlint.verify._report import write_report_dir
            from bertlint.verify._rules import Run

            try:
                res.report_files = write_report_dir(report_dir, res.report_json, Run(_ranks(records), static_n))
                shutil.copy(log_path, os.path.join(report_dir, "script_output.log"))
                res.report_files.append(os.path.join(report_dir, "script_output.log"))
                for r in records:
                    snap = (r.get("memory") or {}).get("cuda_snapshot")
                    if snap and os.path.exists(snap):
                        dst = os.path.join(report_dir, os.path.basename(snap))
                        shutil.copy(snap, dst)
                        res.report_files.append(dst)
                res.report_text = _insert_before_outcome(res.report_text,
                                                         "  report written: " + ", ".join(res.report_files))
            except Exception as e:
                res.report_text = _insert_before_outcome(
                    res.report_text, f"  could not write the report to {report_dir}: {type(e).__name__}: {e}")
        return res
    finally:
        if not torchrun_env:
            shutil.rmtree(record_dir, ignore_errors=True)
        elif rank == "0":
            # rank 0 read every rank's record (or waited for them): the shared folder goes
            shutil.rmtree(record_dir, ignore_errors=True)


def _insert_before_outcome(text: str, line: str) -> str:
    lines = text.split("\n")
    if lines and lines[-1].startswith("  outcome:"):
        return "\n".join(lines[:-1] + [line, lines[-1]])
    return text + "\n" + line


def _ranks(records: list) -> list:
    """The records that describe the training: the workers the script spawned when it spawned any, else the main
    process of each rank."""
    spawned = [r for r in records if r.get("role") == "spawn"]
    if spawned and any(r.get("microbatches") for r in spawned):
        return spawned
    return [r for r in records if r.get("role", "main") == "main"] or records


def _main_record(records: list) -> dict:
    mains = sorted((r for r in records if r.get("role", "main") == "main"), key=lambda r: r.get("rank", 0))
    return mains[0] if mains else {}


def _outcome(records: list, ranks: list, killed: bool) -> str:
    main = _main_record(records)
    if not records:
        return "timeout" if killed else "not-run"
    crashed = [r for r in [main] + ranks if r.get("status") == "crashed"]
    if any((r.get("crash") or {}).get("oom") for r in crashed):
        return "out-of-memory"
    if crashed or main.get("status") in ("no-torch", "record-error"):
        return "crashed"
    if killed or any(r.get("stop_reason") in ("timeout", "terminated") for r in [main] + ranks):
        return "timeout"
    if not any(r.get("microbatches") for r in ranks):
        return "no-training"
    return "verified"


def _build(script, source, diagnostics, mine, records, static_n, settings, wall, log_path, killed, rc,
           shown_name=None, timeout=None, notes=(), script_args=(), setup=None) -> VerifyResult:
    from bertlint.types import Diagnostic, Position, Verification
    from bertlint.verify._report import memory_report, outcome_line, report_text, script_error_text
    from bertlint.verify._rules import NOT_RUN, Run, runtime_findings, verify_diagnostic

    lines = source.splitlines()
    shown_name = shown_name or script
    ranks = _ranks(records)
    main = _main_record(records)
    outcome = _outcome(records, ranks, killed)
    if killed:
        for r in [main] + ranks:
            if r and r.get("status") == "running":
                r["status"], r["stop_reason"] = "stopped", "timeout"
    run = Run(ranks, static_n)
    if main and main is not run.r and main.get("crash") and not run.crash:
        run.crash = main["crash"]  # the main process failed after (or while) its workers ran
    if not records:
        why = (f"the run was stopped at the --verify-timeout ({timeout:g} s) before it wrote a record" if killed
               else f"the child process wrote no record (exit code {rc})")
        tail = _tail(log_path, 1500).strip()
        for d in mine:
            d.verification = Verification("inconclusive", why)
        for d in diagnostics:
            if d.verification is None:
                d.verification = Verification(NOT_RUN, "not part of the verified script")
        text = f"bertlint --verify {os.path.basename(script)}: {why}" + (
            "\n  script output (last lines):\n" + "\n".join("    " + x for x in tail.splitlines()[-12:]) if tail else "")
        res = VerifyResult(diagnostics, "", {"error": why, "output_tail": tail, "outcome": outcome}, outcome=outcome)
        res.report_text = text + "\n" + outcome_line(res, run, timeout)
        return res
    verifs = []
    for d in diagnostics:
        if d not in mine:
            d.verification = Verification(NOT_RUN, "not part of the verified script")
            continue
        st, ev = verify_diagnostic(run, d, lines)
        d.verification = Verification(st, ev)
        verifs.append((d.code, d.start.row, st, ev))
    static_codes = {d.code for d in mine}
    extra = []
    try:
        from bertlint.engine import is_suppressed
    except Exception:  # pragma: no cover
        is_suppressed = None
    named = bool(re.search(r"accum|grad(?:ient)?_?acc|\bga_steps\b", source + " " + " ".join(script_args), re.I))
    for f in runtime_findings(run, static_codes, accumulation_named=named, source_lines=lines):
        line = f["line"]
        if not line or os.path.realpath(line[0]) != script:
            continue
        row = int(line[1])
        meta = _meta(f["code"])
        if settings is not None and not settings.is_enabled(meta.code, meta.default_enabled):
            continue
        text = lines[row - 1] if 1 <= row <= len(lines) else ""
        col = len(text) - len(text.lstrip()) + 1
        d = Diagnostic(meta.code, meta.name, meta.severity, f["message"], mine[0].filename if mine else shown_name,
                       Position(row, col), Position(row, max(len(text) + 1, col)),
                       verification=Verification("confirmed", f["evidence"]), data={"runtime_only": True})
        if is_suppressed is not None and is_suppressed(d, lines):
            continue
        extra.append(d)
    mem = memory_report(run)
    runtime_json = [{"code": d.code, "row": d.start.row, "message": d.message, "evidence": d.verification.evidence}
                    for d in extra]
    merged: dict = {}
    for r in records:
        for e in r.get("redirected") or []:
            k = (e.get("what"), e.get("path"))
            if k in merged:
                merged[k]["count"] += e.get("count", 1)
            else:
                merged[k] = dict(e)
    redirected = list(merged.values())
    data: dict[str, Any] = {
        "script": script,
        "outcome": outcome,
        "wall_s": round(wall, 2),
        "status": run.r.get("status"),
        "stop_reason": run.r.get("stop_reason"),
        "microbatches": run.mb,
        "optimizer_steps": run.steps,
        "bound_microbatches": run.r.get("bound"),
        "accumulation": run.n,
        "ranks": len(ranks),
        "spawned_workers": len([r for r in records if r.get("role") == "spawn"]),
        "counts": run.r.get("counts"),
        "windows": [{k: v for k, v in w.items() if k != "opt"} for w in run.windows],
        "loss_factor": run.factor,
        "trainer": run.r.get("trainer"),
        "accelerate": run.r.get("accelerate"),
        "deepspeed": run.r.get("deepspeed"),
        "ddp": run.r.get("ddp"),
        "checkpoint": run.r.get("checkpoint"),
        "dtypes": run.r.get("dtypes"),
        "crash": run.crash,
        "memory": mem,
        "memory_timeline": (run.r.get("memory") or {}).get("samples"),
        "verifications": [{"code": c, "row": r, "status": s, "evidence": e} for c, r, s, e in verifs],
        "runtime_findings": runtime_json,
        "redirected": redirected,
        "instrumentation_notes": (run.r.get("patch_errors") or []) + list(notes),
    }
    from bertlint.verify._setup import observed, setup_lines

    obs = observed(records, run)
    s_lines, s_diffs = setup_lines(setup, obs)
    data["setup"] = setup
    data["setup_observed"] = {k: {"value": v[0], "source": v[1]} for k, v in obs.items()}
    data["setup_differences"] = s_diffs
    text = report_text(run, mem, verifs, [dict(f, line=[script, f["row"]]) for f in runtime_json], script, wall,
                       redirected=redirected, timeout=timeout)
    head, _, rest = text.partition("\n")
    text = "\n".join([head] + s_lines + [f"  set-up differs: {x}" for x in s_diffs] + ([rest] if rest else []))
    err = script_error_text(run, _tail(log_path, 4000), outcome)
    if err:
        text += "\n" + err
    res = VerifyResult(diagnostics + extra, text, data, records, outcome=outcome)
    res.report_text = text + "\n" + outcome_line(res, run, timeout)
    return res


def _meta(code: str):
    from bertlint.types import RuleMeta, Severity

    try:
        from bertlint.registry import get

        r = get(code)
        if r is not None:
            return r.meta
    except Exception:
        pass
    names = {"BL102": ("gradients-cleared-each-micro-batch", "E"), "BL112": ("clip-each-micro-batch", "W"),
             "BL201": ("clip-scaled-gradients", "E"), "BL202": ("scaler-calls-each-micro-batch", "E"),
             "BL204": ("fp16-amp-on-half-weights", "E"), "BL303": ("reentrant-checkpointing-frozen-inputs", "E"),
             "BL405": ("trainer-loss-inflated-by-accumulation", "E"), "BL501": ("graph-kept-across-iterations", "W"),
             "BL502": ("eval-without-no-grad", "W"), "BL506": ("inference-tensor-reuse", "E"),
             "BL114": ("ddp-accumulation-sync", "E")}
    name, sev = names.get(code, (code.lower(), "W"))
    return RuleMeta(code, name, Severity(sev), name)
