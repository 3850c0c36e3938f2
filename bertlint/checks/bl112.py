"""BL112 clip-each-micro-batch: gradient clipping on every micro-batch of an accumulation window clips partial
sums (and, after ``scaler.unscale_``, fp16 raises). Clip once, right before the optimizer step; inside
``accelerator.accumulate()`` guard it with ``if accelerator.sync_gradients:``."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL112", "clip-each-micro-batch", Severity.WARNING, "gradient clipping on every micro-batch (partial sums)",
      fix=Applicability.UNSAFE)
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        owner = loop.owner
        if owner in _ga.PLAIN_OWNERS and _ga.accum_gated(loop) and _ga.single_optimizer(loop):
            anchor = next((e for e in loop.steps if e.per_window), None)
            for e in loop.of("clip"):
                if not e.per_micro_batch:
                    continue
                fix = _ga.move_before(ctx, e, anchor, "Clip once per window, right before the step") if anchor else None
                _ga.report(
                ctx, loop,
                    e.call,
                    f"`{e.name}()` runs on every micro-batch while the optimizer steps once per {_ga.n_shown(loop)}: it "
                    f"clips partial sums of the window's gradient (the first micro-batches are clipped more than the "
                    f"last), so the update is not the clipped full-batch gradient. Clip once, right before the step, "
                    f"inside the gate. ({_ga.owner_note(ctx, loop)})",
                    fix=fix,
                )
        elif owner == "accelerate":
            ga = f.accelerator_ga
            if ga is None or ga.is_more_than_one() is False:
                continue
            for e in loop.of("clip"):
                if not e.in_accumulate or not e.per_micro_batch:
                    continue
                _ga.report(
                ctx, loop,
                    e.call,
                    f"`{e.name}()` runs on every micro-batch inside `accelerator.accumulate()` ({ga.shown} steps, "
                    f"{_ga.fw(ctx, 'accelerate')}): it clips partial sums of the window's gradient. Guard it with "
                    f"`if accelerator.sync_gradients:`.",
                )
