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
        site = e.meta.get("site")  # a clip inside a helper: reported where the loop calls it
        _ga.treport(ctx, run, tr, site if site is not None else e.node, msg, fix=fix)
