"""The runtime verifier: ``bertlint --verify SCRIPT [-- ARGS]``.

``verify_script`` runs the script in a child process under instrumentation (``bertlint.verify._runner``; the
script is not edited), stops it after a bounded amount of training, and gives every static diagnostic a
``verification`` {status, evidence}; it also reports what only the run shows, and where the memory goes.

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
import time
from dataclasses import dataclass, field
from typing import Any, Optional

__all__ = ["VerifyResult", "verify_script"]


@dataclass
class VerifyResult:
    diagnostics: list  # the input diagnostics with .verification set, plus runtime-only findings
    report_text: str = ""
    report_json: dict = field(default_factory=dict)
    records: list = field(default_factory=list)  # raw per-rank records of the run
    report_files: list = field(default_factory=list)


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


def _child_env() -> dict:
    env = dict(os.environ)
    pkg_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.setdefault("PYTHONUNBUFFERED", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def _run_child(cmd: list[str], log_path: str, timeout: float, env: dict) -> tuple[Optional[int], bool]:
    with open(log_path, "wb") as log:
        try:
            p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 start_new_session=True)
        except OSError as e:
            log.write(f"could not start the child: {e}\n".encode())
            return None, False
        try:
            return p.wait(timeout=timeout), False
        except subprocess.TimeoutExpired:
            pass
        for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 10)):
            try:
                os.killpg(p.pid, sig)
            except Exception:
                pass
            try:
                return p.wait(timeout=grace), True
            except subprocess.TimeoutExpired:
                continue
        return None, True


def _load_records(record_dir: str, since: float) -> list[dict]:
    recs = []
    for name in sorted(os.listdir(record_dir)):
        if name.startswith("rank") and name.endswith(".json"):
            p = os.path.join(record_dir, name)
            try:
                if os.path.getmtime(p) < since - 5:
                    continue
                with open(p) as f:
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

    steps: optimizer steps to observe (default 2: two full accumulation windows plus one micro-batch);
    timeout: wall-clock seconds for the run; nproc: launch the script with torchrun on that many processes
    (default: 2 when the script initialises torch.distributed and bertlint is not already under torchrun);
    memory_limit: bytes of accounted training memory after which an out-of-memory error is simulated.
    """
    diagnostics = list(diagnostics or [])
    try:
        return _verify(path, list(script_args or []), diagnostics, steps, float(timeout or 300.0), report_dir,
                       settings, nproc, memory_limit)
    except Exception as e:  # never a traceback from bertlint itself
        from bertlint.types import Verification

        for d in diagnostics:
            if d.verification is None:
                d.verification = Verification("not-run", f"the verifier failed: {type(e).__name__}: {e}")
        return VerifyResult(diagnostics, f"bertlint --verify: the verifier failed: {type(e).__name__}: {e}",
                            {"error": f"{type(e).__name__}: {e}"})


def _verify(path, args, diagnostics, steps, timeout, report_dir, settings, nproc, memory_limit) -> VerifyResult:
    from bertlint.types import Verification

    script = os.path.realpath(path)
    t0 = time.time()
    if not os.path.isfile(script):
        for d in diagnostics:
            d.verification = Verification("not-run", f"{path} is not a file that can be run")
        return VerifyResult(diagnostics, f"bertlint --verify: {path} is not a file", {"error": "not a file"})
    if not script.endswith(".py"):
        for d in diagnostics:
            d.verification = Verification("not-run", "only Python scripts can be run by --verify (export the "
                                                     "notebook with `jupyter nbconvert --to script`)")
        return VerifyResult(diagnostics, f"bertlint --verify: {path} is not a Python script", {"error": "not a script"})
    try:
        with open(script, encoding="utf-8", errors="replace") as f:
            source = f.read()
    except OSError as e:
        source = ""
    mine = [d for d in diagnostics if os.path.realpath(d.filename) == script]
    static_n = _static_n(mine)
    want_eval = any(d.code == "BL502" or (d.code == "BL501" and (d.data or {}).get("evaluation")) for d in mine)
    from bertlint.verify._rules import _watch_name

    lines = source.splitlines()
    watch = sorted({n for d in mine if d.code == "BL110" for n in [_watch_name(d, lines)] if n})
    torchrun_env = _under_torchrun()
    if nproc is None:
        env_n = os.environ.get("BERTLINT_VERIFY_NPROC")
        if env_n and env_n.isdigit():
            nproc = int(env_n)
        elif not torchrun_env and "init_process_group" in source:
            nproc = 2
        else:
            nproc = 1
    if torchrun_env:
        key = "|".join(os.environ.get(k, "") for k in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID")) + script
        record_dir = os.path.join(tempfile.gettempdir(), "bertlint-verify-" + hashlib.sha1(key.encode()).hexdigest()[:12])
        os.makedirs(record_dir, exist_ok=True)
        rank = os.environ.get("RANK", "0")
        try:
            os.remove(os.path.join(record_dir, f"rank{rank}.json"))
        except OSError:
            pass
    else:
        record_dir = tempfile.mkdtemp(prefix="bertlint-verify-")
        rank = "0"
    cfg = {"record_dir": record_dir, "timeout": timeout, "steps": steps, "accumulation": static_n,
           "want_eval": want_eval, "watch": watch, "memory_limit": memory_limit,
           "min_microbatches": 8 if any(d.code in ("BL501", "BL113") for d in mine) else 0}
    cfg_path = os.path.join(record_dir, f"config{rank}.json")
    with open(cfg_path, "w") as f:
        json.dump(cfg, f)
    runner = ["-m", "bertlint.verify._runner", cfg_path, "--", script, *args]
    if nproc and nproc > 1 and not torchrun_env:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--master_port",
               str(_free_port()), *runner]
    else:
        cmd = [sys.executable, *runner]
    log_path = os.path.join(record_dir, f"child{rank}.log")
    rc, killed = _run_child(cmd, log_path, timeout + min(60.0, 10.0 + 0.1 * timeout), _child_env())
    if torchrun_env and rank != "0":
        for d in mine:
            d.verification = Verification("not-run", f"rank {rank}: rank 0 reports the verification")
        return VerifyResult(diagnostics, f"bertlint --verify: rank {rank} recorded to {record_dir}; rank 0 reports", {})
    records = _load_records(record_dir, t0)
    if torchrun_env:
        want = int(os.environ.get("WORLD_SIZE", "1"))
        deadline = time.time() + 60
        while len(records) < want and time.time() < deadline:
            time.sleep(0.5)
            records = _load_records(record_dir, t0)
    wall = time.time() - t0
    res = _build(script, source, diagnostics, mine, records, static_n, settings, wall, log_path, killed, rc,
                 shown_name=str(path))
    if report_dir:
        from bertlint.verify._report import write_report_dir
        from bertlint.verify._rules import Run

        try:
            res.report_files = write_report_dir(report_dir, res.report_json, Run(records, static_n))
            shutil.copy(log_path, os.path.join(report_dir, "script_output.log"))
            res.report_files.append(os.path.join(report_dir, "script_output.log"))
            res.report_text += "\n  report written: " + ", ".join(res.report_files)
        except Exception as e:
            res.report_text += f"\n  could not write the report to {report_dir}: {type(e).__name__}: {e}"
    if not torchrun_env:
        shutil.rmtree(record_dir, ignore_errors=True)
    return res


def _build(script, source, diagnostics, mine, records, static_n, settings, wall, log_path, killed, rc,
           shown_name=None) -> VerifyResult:
    from bertlint.types import Diagnostic, Position, Severity, Verification
    from bertlint.verify._report import memory_report, report_text
    from bertlint.verify._rules import NOT_RUN, Run, runtime_findings, verify_diagnostic

    lines = source.splitlines()
    shown_name = shown_name or script
    run = Run(records, static_n)
    if not records:
        why = "the run was killed at the timeout before it wrote its record" if killed else (
            f"the child process wrote no record (exit code {rc})")
        tail = _tail(log_path, 1500).strip()
        for d in mine:
            d.verification = Verification("inconclusive", why)
        for d in diagnostics:
            if d.verification is None:
                d.verification = Verification(NOT_RUN, "not part of the verified script")
        text = f"bertlint --verify {os.path.basename(script)}: {why}" + (f"\n  output tail:\n{tail}" if tail else "")
        return VerifyResult(diagnostics, text, {"error": why, "output_tail": tail})
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
    for f in runtime_findings(run, static_codes):
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
    data: dict[str, Any] = {
        "script": script,
        "wall_s": round(wall, 2),
        "status": run.r.get("status"),
        "stop_reason": run.r.get("stop_reason"),
        "microbatches": run.mb,
        "optimizer_steps": run.steps,
        "bound_microbatches": run.r.get("bound"),
        "accumulation": run.n,
        "ranks": len(records),
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
        "instrumentation_notes": run.r.get("patch_errors"),
    }
    text = report_text(run, mem, verifs, [dict(f, line=[script, f["row"]]) for f in runtime_json], script, wall)
    if run.r.get("status") == "crashed" and run.crash and not run.crash.get("user_frame"):
        tail = _tail(log_path, 800).strip()
        if tail:
            text += "\n  script output tail:\n" + "\n".join("    " + x for x in tail.splitlines()[-12:])
    return VerifyResult(diagnostics + extra, text, data, records)


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
