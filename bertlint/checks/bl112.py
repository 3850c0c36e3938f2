"""BL112 clip-each-micro-batch: gradient clipping on every micro-batch of an accumulation window clips partial
sums (and, after ``scaler.unscale_``, fp16 raises). Clip once, right before the optimizer step; inside
``accelerator.accumulate()`` guard it with ``if accelerator.sync_gradients:``.

Invariant over the dry run (``bertlint.trace.clip_once_per_step``): one clip per update, after the window's last
backward."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL112", "clip-each-micro-batch", Severity.WARNING, "gradient clipping on every micro-batch (partial sums)",
      fix=Applicability.UNSAFE)
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL112", _ga.PLAIN_OWNERS + ("accelerate",)):
        e = v.event
        if e.meta.get("in_accumulate"):
            msg = (f"`{e.text}` runs on every micro-batch inside `accelerator.accumulate()` "
                   f"({_ga.fw(ctx, 'accelerate')}){_ga.when(tr)}: {v.message}. Guard it with "
                   f"`if accelerator.sync_gradients:`.")
            fix = None
        else:
            anchor = next((s for s in tr.effective_steps() if s.mb >= e.mb), None)
            msg = (f"`{e.text}` runs on every micro-batch{_ga.when(tr)}: {v.message} (the first micro-batches are "
                   f"clipped more than the last), so the update is not the clipped full-batch gradient. Clip once, "
                   f"right before the step, inside the gate. ({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})")
            fix = _ga.tmove_before(ctx, e, anchor, "Clip once per window, right before the step")
        _ga.treport(ctx, run, tr, _anchor(e, tr), msg, fix=fix)


def _anchor(e, tr):
    """Where to report the clip ``e``: at the clip itself when it runs in the function that takes the step (or in
    one that calls it: ``train_one_step`` clips, gates and steps); inside a helper of its own (``self._clip()``,
    called per micro-batch beside the step), at the call of that helper in the step's function - the call to move."""
    chain = e.meta.get("chain") or ()
    step = next((s for s in tr.effective_steps() if s.mb >= e.mb), None)
    schain = step.meta.get("chain") or () if step is not None else ()
    k = 0
    while k < len(chain) and k < len(schain) and chain[k] is schain[k]:
        k += 1
    if k == len(chain) or (step is None and not chain):
        return e.node
    return chain[k] if step is not None else chain[0]
