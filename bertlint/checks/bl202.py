"""BL202 scaler-calls-each-micro-batch: ``scaler.unscale_()`` / ``scaler.update()`` on micro-batches that do not
step. ``update()`` without a ``step()`` raises ``No inf checks were recorded prior to update`` (or, after an
unscale, changes the scale inside a window); a second ``unscale_()`` before ``update()`` raises
``unscale_() has already been called on this optimizer since the last update()`` (REFERENCE §3.2)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL202", "scaler-calls-each-micro-batch", Severity.ERROR,
      "scaler.unscale_() / scaler.update() on micro-batches that do not step", fix=Applicability.UNSAFE)
def check(ctx) -> None:
    for loop in ctx.loops:
        if loop.owner not in _ga.PLAIN_OWNERS or not _ga.single_optimizer(loop):
            continue
        ssteps = loop.of("scaler_step")
        if not ssteps or not all(s.per_window for s in ssteps):
            continue
        anchor = ssteps[-1]
        n = _ga.times(loop)
        for e in loop.of("scaler_unscale", "scaler_update"):
            if not e.per_micro_batch:
                continue
            if e.kind == "scaler_update":
                what = (f"on the {n} - 1 micro-batches that do not step it finds no inf checks and raises "
                        f"`AssertionError: No inf checks were recorded prior to update.`")
                fix = _ga.move_under(ctx, e, anchor, "Call update() right after scaler.step()")
            else:
                what = (f"it unscales a partial sum, and the next micro-batch adds *scaled* gradients to the unscaled "
                        f"ones; the second call in a window raises `RuntimeError: unscale_() has already been called "
                        f"on this optimizer since the last update().`")
                fix = _ga.move_before(ctx, e, anchor, "Unscale once per window, right before clipping / step")
            _ga.report(
                ctx, loop,
                e.call,
                f"`{e.name}()` runs on every micro-batch while `{anchor.name}()` runs once per {_ga.n_shown(loop)} "
                f"(torch.amp GradScaler): {what}. Call it only inside the step gate.",
                fix=fix,
            )
