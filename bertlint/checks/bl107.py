"""BL107 partial-window: a window of the wrong length at either end of an epoch.

- the first window is shorter than the others: ``if i % N == 0: optimizer.step()`` on a 0-based index makes the
  first update from one micro-batch and shifts every window (``exp_manual_ga_patterns.out`` P3: first step weight
  0.25) — ``bertlint.trace.first_window_complete``;
- the epoch's last, partial window is dropped or leaks into the next epoch: ``(i + 1) % N == 0`` alone never holds
  on the last ``len(loader) % N`` micro-batches, so their gradients are erased by the ``zero_grad`` that starts the
  next epoch, or added to the next epoch's first update (REFERENCE §2.2, §7 BL107) — ``bertlint.trace.epoch_tail``.

Invariants over the dry run; one finding per loop (the first window first). Not flagged: ``enumerate(dl, 1)``, a
counter incremented before the test, ``(i + 1) % N == 0`` together with ``or i + 1 == len(loader)``, a step after
the loop, accelerate's ``accumulate()`` (it syncs at the end of the prepared loader), a counter carried across
epochs and never cleared (every window stays N long), a loop over a ``range`` of steps, DeepSpeed engines."""

from __future__ import annotations

import libcst as cst

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL107", "partial-window", Severity.WARNING,
      "the first or the epoch's last accumulation window is partial (i % N == 0 on a 0-based index; tail not stepped)")
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL107", _ga.PLAIN_OWNERS):
        step = v.event
        conds = step.meta.get("conds") or []
        # the gate on N among the conditions the step runs under (not an inner `if scaler:`)
        cond = next((c for c in reversed(conds) if tr.n_text in _ga.code_of(c)), step.meta.get("cond"))
        node = cond if cond is not None else step.node
        ctext = _ga.code_of(cond).strip() if cond is not None else ""
        arg = step.meta.get("cond_args", {}).get(id(cond)) if cond is not None else None
        if arg is not None:
            ctext = f"{ctext}` = `{_ga.code_of(arg).strip()}"  # a helper's flag: what the caller passes
        when = f" when `{ctext}`" if ctext else ""
        note = f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})"
        kind = v.data.get("kind")
        if kind in ("dropped", "leaked"):
            if tr.owner in ("accelerate-manual", "fabric") and "deepspeed" in ctx.source.lower():
                continue  # the backward may go through a DeepSpeed engine, which keeps its own boundary
            what = ("its gradients are erased by the `zero_grad` that starts the next epoch" if kind == "dropped" else
                    "its gradients are added to the next epoch's first update")
            ld = tr.loader_text or "loader"
            gate = f" under `{ctext}`" if ctext else ""
            idx = tr.index_text or "step"
            _ga.treport(
                ctx, run, tr, node,
                f"The optimizer step{gate} misses the epoch's last micro-batches: when `len({ld})` is not a multiple "
                f"of {_ga.n_shown_t(tr)}, the epoch's last partial window is never stepped and {what}{_ga.when(tr)}: "
                f"{v.message}. Step on the epoch's last micro-batch too (`... or {idx} + 1 == len({ld})`), or step "
                f"once after the loop, or let accelerate's `accumulate()` sync at the end of the prepared loader. "
                f"{note}",
                data={"tail": v.data},
            )
            continue
        if getattr(tr, "driver", ""):
            continue  # the run chose where the caller's count starts (0): the first window's length is not known
        flag = _flag_definition(ctx, cond, tr.n_text, run.loop)
        if flag is not None:
            # ``if is_accumulation_step: ... else: step``: the gate is the flag's definition
            name, value = flag
            node = value
            when = f" on the gate `{name} = {_ga.code_of(value).strip()}`"
            ctext = ""
        k = v.data.get("first") or 1
        if k == 1:
            msg = (f"The optimizer steps{when}, which already holds on the first micro-batch{_ga.when(tr)}: "
                   f"{v.message}. Step when `(i + 1) % {tr.n_text} == 0` on a 0-based index, or count from 1 "
                   f"(`enumerate(..., 1)`). {note}")
        else:
            # an index one ahead of the gate's count (``enumerate(loader, start=1)`` with ``(step + 1) % N``)
            msg = (f"The optimizer steps{when}, which first holds after {k} micro-batches, not {_ga.n_shown_t(tr)}"
                   f"{_ga.when(tr)}: {v.message}. Make the gate hold on the window's last micro-batch: "
                   f"`(i + 1) % {tr.n_text} == 0` on a 0-based index, `i % {tr.n_text} == 0` on a 1-based one. "
                   f"{note}")
        _ga.treport(ctx, run, tr, node, msg)


def _flag_definition(ctx, cond, n_text: str, loop):
    """``(name, value)`` when the step's condition is a flag (``if not is_accumulation_step:``) assigned once in the
    loop's function from an expression that tests N (``global_step % N != 0``)."""
    e = cond
    while isinstance(e, cst.UnaryOperation) and isinstance(e.operator, cst.Not):
        e = e.expression
    if not isinstance(e, cst.Name) or not n_text:
        return None
    func = getattr(loop, "func", None)
    try:
        assigns = ctx.symbols.assignments_of(e.value, func) or []
    except Exception:
        return None
    hits = [a for a in assigns if n_text in _ga.code_of(a.value)]
    if len(hits) != 1:
        return None
    return e.value, hits[0].value
