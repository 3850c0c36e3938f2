"""The set-up the verifier verifies: the static set-up model (``bertlint.analysis.setup``, the facts ``explain`` and
``bertlint memory`` print) of the script — accumulation N, micro-batch, precision, world size, each with its
source — read in the parent before the run. N bounds the run (``3·N + 1`` micro-batches: the invariants' windows)
and is the N the invariants hold the observed trace to; the report prints the set-up and says where the run
observed a different N or micro-batch.

Static only (libcst): nothing is imported or run here. Unknown stays unknown (``value`` None, the source says why).
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Optional


def _num(x: Any) -> Optional[int]:
    """An integer fact, or None (explain's reading, so both print the same set-up)."""
    from bertlint.explain import _num as explain_num

    return explain_num(x)


def _fact(value, source: str) -> dict:
    return {"value": value, "source": source}


def static_setup(path: str, source: str, settings=None) -> Optional[dict]:
    """``{framework, row, accumulation, micro_batch, precision, world_size}`` (each ``{value, source}``) of the
    script's training set-up (the first Trainer set-up, else the first training loop); None when there is none or
    the file does not parse."""
    try:
        import libcst as cst

        from bertlint.config import Settings
        from bertlint.context import FileContext

        module = cst.parse_module(source)
        ctx = FileContext(path, source, module, settings or Settings())
    except Exception:  # noqa: BLE001 - no set-up: the run is bounded by what it observes
        return None
    try:
        from bertlint.explain import _world

        world, world_src, known = _world(None, settings, path)
        ws = _fact(world if known else None, world_src)
    except Exception:  # noqa: BLE001
        ws = _fact(None, "not known")
    try:
        setups = list(ctx.setup.setups)
    except Exception:  # noqa: BLE001
        setups = []
    for s in setups:
        a = s.args
        row = ctx.span(s.node)[0].row
        return {"framework": s.framework, "row": row,
                "accumulation": _fact(_num(s.accumulation), a.origin("gradient_accumulation_steps") if a else "unknown"),
                "micro_batch": _fact(_num(s.micro_batch), a.origin("per_device_train_batch_size") if a else "unknown"),
                "precision": _fact(None if s.precision == "unknown" else s.precision,
                                   "TrainingArguments fp16/bf16" if a else "unknown"),
                "world_size": ws}
    try:
        from bertlint.analysis import dryrun

        runs = [r for r in dryrun.of(ctx) if not isinstance(r.loop, dryrun.ManualStep)]
    except Exception:  # noqa: BLE001
        runs = []
    for run in runs:
        lp, acc = run.loop, run.factor
        if acc is not None:
            n = _fact(acc.value if acc.value is not None else None,
                      f"`{acc.text}` ({acc.source})" if acc.value is None or acc.text != str(acc.value)
                      else f"{acc.source}")
        else:
            n = _fact(1, "no accumulation in the loop (no step gate, no loss division)")
        try:
            from bertlint.analysis.setup import loop_micro_batch

            f = loop_micro_batch(ctx, lp)
            mb = _fact(f.value if f.known else None, f.source)
        except Exception:  # noqa: BLE001
            mb = _fact(None, "not known")
        return {"framework": getattr(lp, "owner", "plain"), "row": ctx.span(lp.node)[0].row, "accumulation": n,
                "micro_batch": mb, "precision": _fact(None, "not read for hand-written loops"), "world_size": ws}
    return None


def observed(records: list, run) -> dict:
    """What the run showed for the same facts: N (a framework's setting, else the usual window length), the
    micro-batch (the leading dimension of the training forwards' input), the world size."""
    r = run.r
    out: dict = {}
    fw = [((r.get("trainer") or {}).get("gradient_accumulation_steps"), "TrainingArguments at runtime"),
          ((r.get("accelerate") or {}).get("gradient_accumulation_steps"), "the Accelerator at runtime"),
          ((r.get("deepspeed") or {}).get("gas"), "the DeepSpeed engine at runtime"),
          ((r.get("lightning") or {}).get("accumulate_grad_batches"), "Lightning's Trainer at runtime")]
    n = next(((v, src) for v, src in fw if isinstance(v, int) and v >= 1), None)
    if n is not None:
        out["accumulation"] = n
    else:
        sizes = [w.get("since_step") for w in run.windows[1:] if isinstance(w.get("since_step"), int)]
        if sizes:
            k = Counter(sizes).most_common(1)[0][0]
            out["accumulation"] = (k, f"micro-batches per optimizer step ({', '.join(map(str, sizes[:6]))})")
    bs = Counter({int(k): v for k, v in (r.get("batch_sizes") or {}).items()})
    if bs:
        b = bs.most_common(1)[0][0]
        out["micro_batch"] = (b, "leading dimension of the training forwards' input"
                              + (f" ({dict(bs)})" if len(bs) > 1 else ""))
    ws = r.get("world_size")
    if isinstance(ws, int):
        out["world_size"] = (ws, "WORLD_SIZE of the run")
    return out


def setup_lines(st: Optional[dict], obs: dict) -> tuple[list, list]:
    """(the set-up lines of the report, the differences between the static set-up and the run)."""
    if not st:
        return ["  set-up: no training set-up found statically (the bound follows the run's own steps)"], []
    lines = [f"  set-up verified ({st['framework']}, line {st['row']}), as `bertlint explain` reads it:"]
    diffs = []
    for key, label in (("accumulation", "accumulation N"), ("micro_batch", "micro-batch"),
                       ("precision", "precision"), ("world_size", "world size")):
        f = st.get(key) or {}
        v = f.get("value")
        shown = "unknown" if v is None else v
        o = obs.get(key)
        extra = ""
        if o is not None:
            extra = f"; observed {o[0]} ({o[1]})"
            if v is not None and o[0] != v and key in ("accumulation", "micro_batch"):
                diffs.append(f"the run observed {label} {o[0]} ({o[1]}) where the static set-up says {v} "
                             f"({f.get('source')})")
        lines.append(f"    {label + ':':<16}{shown} ({f.get('source')}){extra}")
    return lines, diffs
