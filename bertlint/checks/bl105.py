"""BL105 scheduler-steps-each-micro-batch: ``scheduler.step()`` on every micro-batch while the optimizer steps
once per window, with a schedule whose length counts optimizer steps: the schedule runs N times too fast
(REFERENCE §3.5: an LR meant to reach 0.5 after 5 of 10 optimizer steps is already 0.00).

Not flagged: accelerate-prepared schedulers inside ``accumulate()`` (no-op off the sync step); a schedule built
in micro-batch units (its length is ``len(dl) * epochs`` with no ``/ N``) — that pairing is consistent; a schedule
whose length the file does not show (we do not guess)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule(
    "BL105",
    "scheduler-steps-each-micro-batch",
    Severity.ERROR,
    "scheduler.step() every micro-batch while the optimizer steps every N",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        if loop.owner not in _ga.PLAIN_OWNERS or not _ga.accum_gated(loop) or not _ga.single_optimizer(loop):
            continue
        acc = loop.accum()
        n = _ga.times(loop)
        anchor = _ga.last_window_event(loop)
        for e in loop.of("sched_step"):
            if not e.per_micro_batch:
                continue
            length, _call = _ga.sched_length(f, e.receiver)
            if length is None:
                continue
            units = f.units_of(length, loop.func, acc.text if acc else None)
            if units != "optimizer-steps":
                continue
            fix = _ga.move_under(ctx, e, anchor, f"Step the scheduler only after the optimizer step") if anchor else None
            _ga.report(
                ctx, loop,
                e.call,
                f"`{e.name}()` runs on every micro-batch, but the optimizer steps once per {_ga.n_shown(loop)} "
                f"micro-batches and the schedule length `{_ga.code_of(length).strip()}` counts optimizer steps: warm-up and "
                f"decay run {n}× too fast (the learning rate reaches its final value after 1/{n} of training) and the "
                f"LR changes between updates. Call it right after `optimizer.step()`, inside the same gate. "
                f"({_ga.owner_note(ctx, loop)})",
                fix=fix,
                severity=_ga.sev(e),
            )
