"""Memory report (by phase and category, growth, out-of-memory levers), the human text, the JSON and the PNG."""

from __future__ import annotations

import json
import os
from typing import Any, Optional

from bertlint.verify._rules import Run, _short, fl, mib

CATS = ("parameters", "gradients", "optimizer_states", "activations", "temporaries")


def memory_report(run: Run) -> dict:
    mem = (run.r.get("memory") or {})
    samples = mem.get("samples") or []
    device = mem.get("device", "cpu")
    phases = {}
    for ph, s in (mem.get("phase_peaks") or {}).items():
        if s:
            phases[ph] = {c: s.get(c) for c in CATS} | {"total": s.get("total"), "microbatch": s.get("microbatch"),
                                                        "step": s.get("step")}
    per_step = []
    for s in samples:
        if s.get("event") == "optimizer-end":
            per_step.append({c: s.get(c) for c in CATS} | {"step": s.get("step"), "total": s.get("total")})
    growth = _growth(samples, per_step)
    peak = mem.get("peak") or {}
    out: dict[str, Any] = {
        "device": device,
        "method": mem.get("method") or "tensor accounting",
        "phases": phases,
        "peak_phase": peak.get("phase"),
        "peak_bytes": peak.get("total"),
        "peak_microbatch": peak.get("microbatch"),
        "peak_step": peak.get("step"),
        "peak_by_category": {c: peak.get(c) for c in CATS} if peak else {},
        "allocations": mem.get("allocations"),
        "per_step": per_step,
        "growth": growth,
        "nvml": mem.get("nvml") or {},
    }
    if device == "cuda":
        cp = mem.get("cuda_phase_peaks") or {}
        out["cuda"] = {"max_memory_allocated": max([v for v in cp.values() if v] + [mem.get("cuda_max_allocated") or 0]),
                       "phase_peaks": cp, "snapshot": mem.get("cuda_snapshot")}
    crash = run.crash or {}
    if crash.get("oom"):
        at = crash.get("memory") or (samples[-1] if samples else {})
        out["oom"] = {"phase": crash.get("phase") or "idle", "message": _short(crash.get("message"), 300),
                      "user_frame": crash.get("user_frame"), "at_failure": {c: at.get(c) for c in CATS},
                      "levers": levers(at, run)}
    return out


def _growth(samples: list, per_step: list) -> dict:
    """Bytes per optimizer step (from step 2 on: step 1 creates the optimizer states) or per micro-batch."""
    pts = [(s["step"], s) for s in per_step][1:]
    unit = "optimizer step"
    if len(pts) < 3:
        pts = [(s["microbatch"], s) for s in samples if s.get("event") == "backward-end"][1:]
        unit = "micro-batch"
    res: dict[str, Any] = {"unit": unit, "samples": len(pts)}
    if len(pts) < 3:
        res["verdict"] = "too few steps to measure growth (--verify-steps 5 shows it)"
        return res
    leaks = {}
    for c in ("gradients", "optimizer_states", "activations", "temporaries", "total"):
        vals = [(x, s.get(c)) for x, s in pts if isinstance(s.get(c), (int, float))]
        if len(vals) < 3:
            continue
        xs = [v[0] for v in vals]
        ys = [v[1] for v in vals]
        mx = sum(xs) / len(xs)
        my = sum(ys) / len(ys)
        den = sum((x - mx) ** 2 for x in xs) or 1
        slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / den
        ups = sum(1 for a, b in zip(ys, ys[1:]) if b > a)
        if slope > 0 and ups >= len(ys) - 2 and ys[-1] - ys[0] > max(4096, 0.01 * ys[0]):
            leaks[c] = {"bytes_per_unit": slope, "from": ys[0], "to": ys[-1]}
    res["growing"] = leaks
    plural = unit + "es" if unit.endswith("h") else unit + "s"
    res["verdict"] = ("live tensors grow every " + unit + ": " + ", ".join(
        f"{c} +{mib(v['bytes_per_unit'])}/{unit}" for c, v in leaks.items())) if leaks else (
        f"no growth of live tensors across {len(pts)} {plural}")
    return res


def levers(at: dict, run: Run) -> list[dict]:
    """The concrete levers in order (micro-batch, sequence length, checkpointing, precision, optimizer states)."""
    act = at.get("activations") or 0
    params = at.get("parameters") or 0
    grads = at.get("gradients") or 0
    states = at.get("optimizer_states") or 0
    n = run.n or 1
    dt = (run.r.get("dtypes") or {}).get("all") or {}
    fp32 = bool(dt.get("float32"))
    out = [
        {"lever": "halve the micro-batch (double gradient_accumulation_steps to keep the effective batch"
                  f"{'' if n == 1 else f', now {n}'})", "saves_bytes": act // 2},
        {"lever": "halve the sequence length (max_length / dynamic padding)", "saves_bytes": act // 2,
         "note": "at least half the activations; attention scores shrink 4×"},
        {"lever": "activation checkpointing (use_reentrant=False)", "saves_bytes": int(act * 0.85),
         "note": "keeps only layer inputs: ~85-95 % of activations (REFERENCE §1.7: 21.1 MB → 1.4 MB on a 4-layer BERT)"},
        {"lever": "mixed precision (bf16/fp16 autocast)", "saves_bytes": act // 2 if fp32 else 0,
         "note": "activations in 16 bit; weights stay fp32"},
        {"lever": "optimizer states: 8-bit Adam / Adafactor, or ZeRO-1/2 across ranks", "saves_bytes": states // 2,
         "note": f"states are {mib(states)}; ZeRO-1 over P ranks saves states × (1 - 1/P), ZeRO-2 also gradients "
                 f"({mib(grads)}), ZeRO-3 also parameters ({mib(params)})"},
    ]
    for x in out:
        x["saves"] = mib(x["saves_bytes"])
    return out


def report_text(run: Run, mem: dict, verifs: list, runtime: list, script: str, wall: float, redirected=(),
                timeout=None) -> str:
    r = run.r
    lines = []
    base = os.path.basename(script)
    status = r.get("status")
    head = f"bertlint --verify {base}: "
    if not r:
        return head + "no record was produced (the child process failed to start; see the log)"
    if status == "no-torch":
        return head + f"torch could not be imported in the child: {_short((run.crash or {}).get('message'))}"
    stop = {"bound": f"stopped at the bound of {r.get('bound')} micro-batches",
            "bound-no-eval": f"stopped at the bound of {r.get('microbatches')} micro-batches (no evaluation reached)",
            "timeout": "stopped by the --verify-timeout" + (f" ({timeout:g} s)" if timeout else ""),
            "terminated": "stopped by a signal"}.get(r.get("stop_reason") or "", str(status))
    if status == "completed":
        stop = "the script finished"
    if status == "crashed":
        stop = "the script crashed"
    ranks = f", {len(run.records)} ranks" if len(run.records) > 1 else ""
    if any(x.get("role") == "spawn" for x in run.records):
        ranks += " (workers started by the script, each instrumented)"
    lines.append(f"{head}{run.mb} micro-batches (backward calls), {run.steps} optimizer steps; {stop}; "
                 f"{wall:.1f} s, device {mem.get('device')}{ranks}")
    c = r.get("counts") or {}
    parts = []
    for k, label in (("backward", "backward"), ("optimizer_step", "optimizer.step"), ("zero_grad", "zero_grad"),
                     ("scheduler_step", "scheduler.step"), ("clip", "clip_grad"), ("scaler_scale", "scaler.scale"),
                     ("scaler_unscale", "scaler.unscale_"), ("scaler_step", "scaler.step"),
                     ("scaler_update", "scaler.update")):
        if c.get(k):
            where = r.get("lines", {}).get(k) or {}
            locs = ", ".join(f"{os.path.basename(p.rpartition(':')[0])}:{p.rpartition(':')[2]}" for p in list(where)[:2])
            parts.append(f"{label} {c[k]}" + (f" ({locs})" if locs else ""))
    if parts:
        lines.append("  calls: " + "; ".join(parts))
    if run.windows:
        sizes = [w.get("since_step") for w in run.windows]
        ing = [w.get("in_grad") for w in run.windows]
        lrs = [w.get("lr") for w in run.windows]
        lines.append(f"  optimizer steps: micro-batches per step {sizes[:8]}, micro-batches in the gradient {ing[:8]}, "
                     f"LR {[float(f'{x:.3g}') if x is not None else None for x in lrs[:4]]}"
                     + (f"; {r['skipped_steps']} skipped by the GradScaler (inf/NaN)" if r.get("skipped_steps") else ""))
    if run.factor is not None:
        lines.append(f"  loss scale between the model/criterion loss and backward: {run.factor:.4g}")
    t = r.get("trainer") or {}
    if t.get("steps"):
        s0 = t["steps"][0]
        lines.append(f"  Trainer: gradient_accumulation_steps={t.get('gradient_accumulation_steps')}, "
                     f"model_accepts_loss_kwargs={s0.get('model_accepts_loss_kwargs')}, loss_is_scaled_for_ga="
                     f"{s0.get('loss_is_scaled_for_ga')}, trainer divides={s0.get('trainer_divides')}")
    a = r.get("accelerate") or {}
    if a:
        lines.append(f"  accelerate: gradient_accumulation_steps={a.get('gradient_accumulation_steps')}, mixed_precision="
                     f"{a.get('mixed_precision')}, accumulate() entries {a.get('accumulate_entries', 0)}, syncs "
                     f"{a.get('accumulate_syncs', 0)}")
    if run.crash:
        cr = run.crash
        lines.append(f"  crash: {cr.get('type')}: {_short(cr.get('message'), 200)} at {fl(cr.get('user_frame'))}"
                     + (f" `{cr['user_frame'][2]}`" if cr.get("user_frame") and len(cr["user_frame"]) > 2 and cr["user_frame"][2] else ""))
    # memory
    if mem.get("peak_bytes") is not None:
        at = (f" (micro-batch {mem.get('peak_microbatch')}, step {mem.get('peak_step')})"
              if mem.get("peak_microbatch") is not None else "")
        lines.append(f"  memory ({mem.get('device')}, every tensor allocation and free): peak {mib(mem['peak_bytes'])}"
                     f" in {mem.get('peak_phase')}{at}: " + ", ".join(
                         f"{k.replace('_', ' ')} {mib(v)}" for k, v in (mem.get("peak_by_category") or {}).items()
                         if v))
    else:
        lines.append(f"  memory ({mem.get('device')}): no tensors observed")
    if mem.get("phases"):
        lines.append("    phase peak  total        params       grads        optim        activations  temporaries")
        for ph in ("forward", "backward", "optimizer", "eval"):
            p = mem["phases"].get(ph)
            if not p:
                continue
            vals = [mib(p.get(k)) if p.get(k) is not None else "n/a" for k in ("total",) + CATS]
            lines.append("    " + f"{ph:<11} " + " ".join(f"{v:<12}" for v in vals))
    cu = mem.get("cuda") or {}
    if cu.get("max_memory_allocated"):
        lines.append(f"    torch.cuda.max_memory_allocated: {mib(cu['max_memory_allocated'])}"
                     + (f"; memory snapshot {cu['snapshot']}" if cu.get("snapshot") else ""))
    if mem.get("per_step"):
        lines.append("    live tensors after each optimizer step: " + ", ".join(
            f"step {s.get('step')} {mib(s.get('total'))}" for s in mem["per_step"][:6]))
    nv = mem.get("nvml") or {}
    if nv and "error" not in nv:
        lines.append(f"    NVML: device {mib(nv.get('device_used'))} used of {mib(nv.get('device_total'))}; this process "
                     f"{mib(nv.get('this_process'))}, other processes {mib(nv.get('other_processes'))}, CUDA context "
                     f"and non-torch ≈ {mib(nv.get('cuda_context_and_non_torch'))}")
    lines.append(f"    growth: {mem.get('growth', {}).get('verdict')}")
    if mem.get("oom"):
        o = mem["oom"]
        lines.append(f"  OUT OF MEMORY in {o.get('phase')} at {fl(o.get('user_frame'))}: " + ", ".join(
            f"{k} {mib(v)}" for k, v in (o.get("at_failure") or {}).items() if v is not None))
        for i, lv in enumerate(o.get("levers") or [], 1):
            lines.append(f"    {i}. {lv['lever']}: saves ≈ {lv['saves']}" + (f" ({lv['note']})" if lv.get("note") else ""))
    if redirected:
        lines.append("  side effects redirected to a temporary folder (removed after the run): " + "; ".join(
            f"{e['what']} {e['path']!r}" + (f" ×{e['count']}" if e.get("count", 1) > 1 else "")
            + (" (not sent)" if e.get("to") == "not sent" else "") for e in redirected[:8])
            + (f"; … {len(redirected) - 8} more" if len(redirected) > 8 else ""))
    if verifs:
        lines.append("  verification:")
        for code, row, st, ev in verifs:
            lines.append(f"    {code} line {row}: {st}: {ev}")
    if runtime:
        lines.append("  found at runtime only:")
        for f in runtime:
            lines.append(f"    {f['code']} at {fl(f['line'])}: {f['evidence']}")
    if r.get("patch_errors"):
        lines.append(f"  instrumentation notes: {'; '.join(r['patch_errors'][:3])}")
    return "\n".join(lines)


def script_error_text(run: Run, log_tail: str, outcome: str) -> str:
    """The script's own error output: its traceback (the script's frames only) or, for an exit with a status (an
    argparse error), the last lines it printed."""
    if outcome not in ("crashed", "out-of-memory", "no-training", "timeout"):
        return ""
    cr = run.crash or {}
    out = []
    tail = [x for x in (log_tail or "").strip().splitlines() if x.strip()]
    if cr and cr.get("type") not in ("SystemExit",) and cr.get("traceback"):
        out.append("  the script's error:")
        out += ["    " + x for x in cr["traceback"].rstrip().splitlines()[-14:]]
    elif tail and (cr or outcome != "timeout"):
        out.append("  the script's output (last lines):")
        out += ["    " + x for x in tail[-10:]]
    return "\n".join(out)


def outcome_line(res, run: Run, timeout=None) -> str:
    """The verify run's own outcome and the exit status bertlint returns for it."""
    o = res.outcome
    n = len(res.diagnostics)
    code = res.exit_code
    cr = run.crash or {}
    seen = f"{run.mb} micro-batches, {run.steps} optimizer steps observed"
    if o == "verified":
        what = f"verified ({seen}); " + (f"{n} finding{'s' if n != 1 else ''}" if n else "nothing found")
    elif o == "crashed":
        where = fl(cr.get("user_frame")) if cr.get("user_frame") else None
        what = (f"the script failed ({cr.get('type')}: {_short(cr.get('message'), 120)}"
                + (f" at {where}" if where else "") + f") after {seen}")
    elif o == "out-of-memory":
        what = f"the script ran out of memory in {cr.get('phase') or 'idle'} after {seen}"
    elif o == "timeout":
        what = f"stopped by --verify-timeout" + (f" ({timeout:g} s)" if timeout else "") + f" after {seen}"
    elif o == "no-training":
        what = ("no training step was reached: " + ("the script finished without a backward call"
                                                     if run.r.get("status") == "completed" else _short(str(run.r.get("stop_reason") or run.r.get("status")))))
    else:
        what = "the script could not be run"
    if o != "verified":
        what += "; the verification is incomplete"
    return f"  outcome: {what} (exit status {code})"


def write_report_dir(report_dir: str, data: dict, run: Run) -> list[str]:
    os.makedirs(report_dir, exist_ok=True)
    written = []
    p = os.path.join(report_dir, "verify.json")
    with open(p, "w") as f:
        json.dump(data, f, indent=1, default=str)
    written.append(p)
    png = os.path.join(report_dir, "memory_timeline.png")
    if _plot(run, png):
        written.append(png)
    return written


def _plot(run: Run, path: str) -> bool:
    samples = (run.r.get("memory") or {}).get("samples") or []
    if not samples:
        return False
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:
        return False
    try:
        xs = list(range(len(samples)))
        cats = [c for c in CATS if any(isinstance(s.get(c), (int, float)) and s.get(c) for s in samples)]
        ys = [[(s.get(c) or 0) / (1 << 20) for s in samples] for c in cats]
        fig, ax = plt.subplots(figsize=(10, 4.5), dpi=100)
        ax.stackplot(xs, ys, labels=cats, alpha=0.85)
        if any("allocated" in s for s in samples):
            ax.plot(xs, [(s.get("allocated") or 0) / (1 << 20) for s in samples], color="k", lw=1,
                    label="torch.cuda.memory_allocated")
        steps = [i for i, s in enumerate(samples) if s.get("event") == "optimizer-end"]
        for i in steps:
            ax.axvline(i, color="grey", lw=0.5, ls=":")
        ax.set_xlabel("sample (phase boundaries; dotted = optimizer step)")
        ax.set_ylabel("MiB")
        ax.set_title(f"bertlint --verify memory timeline: {os.path.basename(run.r.get('script') or '')} "
                     f"({(run.r.get('memory') or {}).get('device')})")
        ax.legend(loc="upper left", fontsize=8)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)
        return True
    except Exception:
        return False
