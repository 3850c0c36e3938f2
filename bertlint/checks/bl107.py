"""BL107 partial-window: the first accumulation window is shorter than the others — ``if i % N == 0:
optimizer.step()`` on a 0-based index makes the first update from one micro-batch and shifts every window
(``exp_manual_ga_patterns.out`` P3: first step weight 0.25).

Invariant over the dry run (``bertlint.trace.first_window_complete``). Not flagged: ``enumerate(dl, 1)``, a counter
incremented before the test, ``(i + 1) % N == 0``. The end-of-epoch tail is not reported: whether a tail exists
depends on the dataset length."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL107", "partial-window", Severity.WARNING,
      "i % N == 0 on a 0-based index: the first update comes from a single micro-batch")
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL107", _ga.PLAIN_OWNERS):
        step = v.event
        conds = step.meta.get("conds") or []
        # the gate on N among the conditions the step runs under (not an inner `if scaler:`)
        cond = next((c for c in reversed(conds) if tr.n_text in _ga.code_of(c)), step.meta.get("cond"))
        node = cond if cond is not None else step.node
        ctext = _ga.code_of(cond).strip() if cond is not None else ""
        when = f" when `{ctext}`" if ctext else ""
        flag = _flag_definition(ctx, cond, tr.n_text, run.loop)
        if flag is not None:
            # ``if is_accumulation_step: ... else: step``: the gate is the flag's definition
            name, value = flag
            node = value
            when = f" on the gate `{name} = {_ga.code_of(value).strip()}`"
            ctext = ""
        _ga.treport(
            ctx, run, tr, node,
            f"The optimizer steps{when}, which already holds on the first micro-batch{_ga.when(tr)}: {v.message}. "
            f"Step when `(i + 1) % {tr.n_text} == 0` on a 0-based index, or count from 1 (`enumerate(..., 1)`). "
            f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})",
        )


def _flag_definition(ctx, cond, n_text: str, loop):
    """``(name, value)`` when the step's condition is a flag (``if not is_accumulation_step:``) assigned once in the
    loop's function from an expression that tests N (``global_step % N != 0``)."""
    import libcst as cst

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
