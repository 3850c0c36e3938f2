"""BL102 gradients-cleared-each-micro-batch: between two effective optimizer steps, ``zero_grad`` runs after the
window's first backward, so the update sees only the micro-batches after it (``exp_manual_ga_patterns.out`` P2:
total weight 0.25 with N=4). Inside ``accelerator.accumulate()`` the prepared optimizer's ``zero_grad()`` is a
no-op off the sync step, but ``model.zero_grad()`` is not (the trace shows it taking effect)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule(
    "BL102",
    "gradients-cleared-each-micro-batch",
    Severity.ERROR,
    "zero_grad() runs every micro-batch while the optimizer step is gated",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL102", _ga.PLAIN_OWNERS + ("accelerate",)):
        e = v.event
        step = v.related[0] if v.related else None
        prepared = e.of == "optimizer" and e.opt in ctx.loops.prepared
        if e.meta.get("in_accumulate") and prepared:
            # the prepared optimizer's zero_grad is skipped off the sync step, but on the sync micro-batch it runs
            # before that micro-batch's backward (accelerate 1.15 optimizer.py AcceleratedOptimizer.zero_grad)
            msg = (f"`{e.text}` runs before the backward inside `accelerator.accumulate()`: "
                   f"{_ga.fw(ctx, 'accelerate')} skips the prepared optimizer's `zero_grad()` off the sync step, but "
                   f"on the sync micro-batch it takes effect before that micro-batch's backward and erases the "
                   f"gradients the window accumulated{_ga.when(tr)}: {v.message}. Call `{e.text}` after "
                   f"`optimizer.step()` (accelerate skips it off the sync step there too).{_acc_note(tr)}")
            fix = None
        elif e.meta.get("in_accumulate"):
            msg = (f"`{e.text}` inside `accelerator.accumulate()` clears the model's gradients on every micro-batch "
                   f"({_ga.fw(ctx, 'accelerate')} skips only the prepared optimizer's `zero_grad()` off the sync "
                   f"step){_ga.when(tr)}: {v.message}. Call `optimizer.zero_grad()` on the prepared optimizer "
                   f"instead.{_acc_note(tr)}")
            fix = None
        else:
            msg = (f"`{e.text}` clears the gradients inside the accumulation window{_ga.when(tr)}: {v.message}. "
                   f"Clear the gradients only after `optimizer.step()`, inside the same gate. "
                   f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})")
            fix = _ga.tmove_under(ctx, e, step, f"Move `{e.text}` under the step gate, after the step")
        _ga.treport(ctx, run, tr, e.node, msg, fix=fix, severity=_ga.tsev(e))


def _acc_note(tr) -> str:
    """`` (dry run with N = 4 standing for `self.accelerator.gradient_accumulation_steps` ...)`` when the run's N is a
    symbol: the Accelerator is built outside the file, and whenever its setting is above 1 the window is erased."""
    note = _ga.trace_note(tr)
    if not note:
        return ""
    return f" ({note[2:]}: the Accelerator is built outside this file; any value above 1 erases the window)" \
        if tr.n_text.endswith(".gradient_accumulation_steps") else f" ({note[2:]})"
