"""BL102 gradients-cleared-each-micro-batch: ``zero_grad()`` on every micro-batch while the step is gated, so
only the last micro-batch of each window reaches the update (``exp_manual_ga_patterns.out`` P2: total weight
0.25 with N=4); also ``model.zero_grad()`` inside ``accelerator.accumulate()`` (the model is not the prepared
optimizer, so accelerate does not skip it off the sync step)."""

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
    f = ctx.loops
    for loop in f:
        owner = loop.owner
        if owner in _ga.PLAIN_OWNERS:
            if not _ga.accum_gated(loop) or not _ga.single_optimizer(loop):
                continue
            if not any(_ga.accum_gate(ctx, loop, g) for e in loop.steps for g in e.frequency_gates):
                continue
            n = _ga.times(loop)
            anchor = _ga.last_window_event(loop)
            opts = _ga.optimizers(loop)
            for e in loop.of("opt_zero", "model_zero"):
                if not e.per_micro_batch:
                    continue
                if e.kind == "opt_zero" and e.receiver not in opts and "?" not in opts:
                    continue
                fix = _ga.move_under(ctx, e, anchor, f"Move `{e.name}()` under the step gate, after the step") if anchor else None
                _ga.report(
                ctx, loop,
                    e.call,
                    f"`{e.name}()` runs on every micro-batch while the optimizer steps once per {_ga.n_shown(loop)} "
                    f"micro-batches: the gradients of the first {n} - 1 micro-batches of each window are erased, so "
                    f"each update sees only the last micro-batch, weighted 1/{n}. Clear the gradients only after "
                    f"`optimizer.step()`, inside the same gate. ({_ga.owner_note(ctx, loop)})",
                    fix=fix,
                    severity=_ga.sev(e),
                )
        elif owner == "accelerate":
            ga = f.accelerator_ga
            if ga is None or ga.is_more_than_one() is False:
                continue
            for e in loop.of("model_zero"):
                if not e.in_accumulate or not e.per_micro_batch or e.receiver in loop.accelerate_receivers:
                    continue
                if e.receiver and f.kinds.get(e.receiver) in ("optimizer", "ds_optimizer"):
                    continue
                _ga.report(
                ctx, loop,
                    e.call,
                    f"`{e.name}()` inside `accelerator.accumulate()` clears the model's gradients on every micro-batch "
                    f"({_ga.fw(ctx, 'accelerate')} skips only the prepared optimizer's `zero_grad()` off the sync step): "
                    f"with {ga.shown} accumulation steps each update sees only the last micro-batch. Call "
                    f"`optimizer.zero_grad()` on the prepared optimizer instead.",
                )
