"""BL115 deepspeed-engine-gated: with a ``deepspeed.initialize`` engine, ``engine.step()`` must run after every
micro-batch — the engine counts micro-steps and updates only at its own boundary. Gating it behind
``(i + 1) % N == 0`` gives one update per N² micro-batches (``exp_deepspeed_ga.out``: global_steps=1 after 16).
Calling ``zero_grad`` yourself clears the gradients the engine is accumulating.

Invariant over the dry run (``bertlint.trace.engine_owns_boundary``): one ``engine.step()`` per
``engine.backward()``, and no hand ``zero_grad``."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL115", "deepspeed-engine-gated", Severity.ERROR,
      "DeepSpeed engine.step() behind an index gate, or manual zero_grad with the engine")
def check(ctx) -> None:
    ds = _ga.fw(ctx, "deepspeed", "DeepSpeed")
    for run, v, tr in _ga.violations(ctx, "BL115", ("deepspeed",)):
        e = v.event
        if v.data.get("kind") == "gated":
            msg = (f"`{e.text}` does not run after every `engine.backward()`{_ga.when(tr)}: {v.message}. The DeepSpeed "
                   f"engine ({ds}) accumulates by itself: call `{e.opt or 'engine'}.step()` unconditionally.")
        else:
            msg = (f"`{e.text}` with a DeepSpeed engine ({ds}){_ga.when(tr)}: {v.message}. Remove the call.")
        _ga.treport(ctx, run, tr, e.node, msg, severity=_ga.tsev(e))
