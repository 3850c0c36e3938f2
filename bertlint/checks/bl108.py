"""BL108 misplaced-step-gate: the optimizer steps on the wrong micro-batches.

Invariant over the dry run (``bertlint.trace.window_length``): every full window has N backwards, and inside
``accelerator.accumulate()`` every sync step is stepped. It covers

- an inverted gate (``% N != 0`` or the else branch): steps on N-1 of every N micro-batches;
- the step nested under a second gate (logging / eval frequency): steps every lcm(N, M);
- a hand gate inside ``accelerator.accumulate()``: two gates must both hold — ``i % N == 0`` never coincides
  with a sync step (zero updates, ever) and ``(i + 1) % N == 0`` skips the end-of-epoch sync step
  (REFERENCE §2.2 C/D);
- a gate that stops firing (``global_step % N == 0`` on a counter advanced only by the step): one update, then
  backwards into the next epoch with none."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL108", "misplaced-step-gate", Severity.ERROR, "the optimizer step runs on the wrong micro-batches")
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL108", _ga.PLAIN_OWNERS + ("accelerate",)):
        step = v.event
        cond = step.meta.get("cond")
        node = cond if (v.data.get("at") == "cond" and cond is not None) else step.node
        if tr.owner == "accelerate":
            msg = (f"A hand-written gate decides when `{step.text}` runs inside `accelerator.accumulate()`, where "
                   f"accelerate already syncs every {_ga.n_shown_t(tr)} micro-batches and at the end of the loader "
                   f"({_ga.fw(ctx, 'accelerate')}){_ga.when(tr)}: {v.message}. Drop the gate: call "
                   f"`optimizer.step()` / `zero_grad()` on every micro-batch inside `accumulate()` (they are no-ops "
                   f"off the sync step).")
        else:
            when = f" when `{step.cond_text}`" if step.cond_text else ""
            fix = (f"Move the gated step out of the inner loop, after its last backward" if v.data.get("per_pass")
                   else f"Step when `(i + 1) % {tr.n_text} == 0`")
            msg = (f"The optimizer steps{when} on the wrong micro-batches{_ga.when(tr)}: {v.message}. {fix}. "
                   f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})")
        _ga.treport(ctx, run, tr, node, msg, severity=_ga.tsev(step))
