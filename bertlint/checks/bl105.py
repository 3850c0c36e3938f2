"""BL105 scheduler-steps-each-micro-batch: ``scheduler.step()`` on every micro-batch while the optimizer steps
once per window, with a schedule whose length counts optimizer steps: the schedule runs N times too fast
(REFERENCE §3.5: an LR meant to reach 0.5 after 5 of 10 optimizer steps is already 0.00).

Invariant over the dry run (``bertlint.trace.scheduler_per_step``): effective scheduler steps = effective optimizer
steps. Not flagged: accelerate-prepared schedulers inside ``accumulate()`` (no-ops off the sync step: the trace
shows them not taking effect); a schedule built in micro-batch units (its length is ``len(dl) * epochs`` with no
``/ N``) — that pairing is consistent; a schedule whose length the file does not show (we do not guess)."""

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
    for run, v, tr in _ga.violations(ctx, "BL105", _ga.PLAIN_OWNERS + ("accelerate",)):
        e = v.event
        length, _call = _ga.sched_length(f, e.target)
        if length is None:
            continue
        acc = run.factor
        units = f.units_of(length, run.loop.func, acc.text if acc is not None else None)
        if units != "optimizer-steps":
            continue
        anchor = next((s for s in tr.effective_steps() if s.mb >= e.mb), None)
        n = _ga.n_of(tr)
        if run.loop.owner == "accelerate":
            # inside accumulate(): the optimizer's step is a no-op off the sync step, the raw scheduler's is not
            _ga.treport(
                ctx, run, tr, e.node,
                f"`{e.text}` takes effect on every micro-batch inside `accelerator.accumulate()`{_ga.when(tr)}: "
                f"{v.message}, while the schedule length `{_ga.code_of(length).strip()}` counts optimizer steps: "
                f"warm-up and decay run {n}× too fast. The scheduler is not passed to `accelerator.prepare()`, so "
                f"accelerate does not skip its step off the sync micro-batches as it does the prepared optimizer's. "
                f"Pass it to `accelerator.prepare(...)`, or step it under `if accelerator.sync_gradients:`. "
                f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})",
                severity=_ga.tsev(e),
            )
            continue
        _ga.treport(
            ctx, run, tr, e.node,
            f"`{e.text}` runs on every micro-batch{_ga.when(tr)}: {v.message}, while the schedule length "
            f"`{_ga.code_of(length).strip()}` counts optimizer steps: warm-up and decay run {n}× too fast (the "
            f"learning rate reaches its final value after 1/{n} of training) and the LR changes between updates. "
            f"Call it right after `optimizer.step()`, inside the same gate. ({_ga.owner_note(ctx, run.loop)}"
            f"{_ga.trace_note(tr)})",
            fix=_ga.tmove_under(ctx, e, anchor, "Step the scheduler only after the optimizer step"),
            severity=_ga.tsev(e),
        )
