"""BL103 loss-not-scaled: a hand-written accumulation window whose N backwards use the raw loss, with no gradient
rescaling before the step: the update is the *sum* of N micro-batch gradients, N× the mean
(``exp_manual_ga_patterns.out`` P4: total weight 4.00 with N=4).

Invariant over the dry run (``bertlint.trace.window_weights``): the loss scales of one full window sum to 1. The
scale comes from data flow (the value handed to ``backward``), never from a ``/`` somewhere in the loop's text; a
factor of unknown value (``loss / num_tokens``, a loss from another module) makes the sum unknown: no finding."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL103", "loss-not-scaled", Severity.WARNING, "hand-written accumulation without dividing the loss by N")
def check(ctx) -> None:
    f = ctx.loops
    for run, v, tr in _ga.violations(ctx, "BL103", ("plain", "fabric", "lightning-manual")):
        n = _ga.n_of(tr)
        if v.data.get("kind") == "uneven":
            _ga.treport(
                ctx, run, tr, v.event.node,
                f"The micro-batches of one accumulation window are weighted unequally{_ga.when(tr)}: {v.message}. "
                f"Divide every micro-batch's loss by the window length {_ga.n_shown_t(tr)}, not by a running count. "
                f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})",
            )
            continue
        sgd = _sgd(ctx)
        _ga.treport(
            ctx, run, tr, v.event.node,
            f"The loss is not divided by the accumulation factor {_ga.n_shown_t(tr)}{_ga.when(tr)}: {v.message}"
            + (f" (with SGD that is a learning rate {n}× too large)" if sgd else
               f" (an effective learning rate up to {n}× too large with SGD; gradient clipping thresholds are hit "
               f"{n}× sooner with Adam)")
            + f". Divide before backward: `loss = loss / {tr.n_text}`. ({_ga.owner_note(ctx, run.loop)}"
            f"{_ga.trace_note(tr)})",
        )


def _sgd(ctx) -> bool:
    """An optimizer of the file is built by an SGD constructor (roles from usage)."""
    try:
        return any(r.by_constructor and "SGD" in (r.qualname or "") for _s, _p, r in ctx.roles.all("optimizer"))
    except Exception:
        return False
