"""BL115 deepspeed-engine-gated: with a ``deepspeed.initialize`` engine, ``engine.step()`` must run after every
micro-batch — the engine counts micro-steps and updates only at its own boundary. Gating it behind
``(i + 1) % N == 0`` gives one update per N² micro-batches (``exp_deepspeed_ga.out``: global_steps=1 after 16).
Calling ``zero_grad`` yourself clears the gradients the engine is accumulating."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL115", "deepspeed-engine-gated", Severity.ERROR,
      "DeepSpeed engine.step() behind an index gate, or manual zero_grad with the engine")
def check(ctx) -> None:
    f = ctx.loops
    ds = _ga.fw(ctx, "deepspeed", "DeepSpeed")
    for loop in f:
        if loop.owner != "deepspeed":
            continue
        for e in loop.of("engine_step"):
            gs = e.frequency_gates
            if not gs:
                continue
            g = gs[0]
            _ga.report(
                ctx, loop,
                e.call,
                f"`{e.name}()` is gated by `{g.text}`, but the DeepSpeed engine ({ds}) accumulates by itself: "
                f"`engine.step()` must run after every `engine.backward()` (it counts micro-steps and updates only "
                f"at its own boundary). Gated, the engine sees one micro-step per window and updates once per N² "
                f"micro-batches. Call `{e.receiver}.step()` unconditionally.",
                severity=_ga.sev(e),
            )
        for e in loop.of("engine_zero", "opt_zero"):
            if e.kind == "opt_zero" and f.kinds.get(e.receiver or "") != "ds_optimizer":
                continue
            _ga.report(
                ctx, loop,
                e.call,
                f"`{e.name}()` with a DeepSpeed engine ({ds}): `engine.step()` zeroes the gradients itself at each "
                f"accumulation boundary; clearing them by hand erases the micro-batches accumulated so far. "
                f"Remove the call.",
            )
