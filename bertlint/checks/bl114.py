"""BL114 ddp-accumulation-sync: DDP with hand-written accumulation.

- W: no ``no_sync()`` anywhere — every micro-batch's backward all-reduces (N all-reduces per optimizer step);
  also a ``no_sync()`` block holding the backward but not the forward (DDP decides at forward time: no saving).
- E: a ``no_sync()`` block around the forward on every micro-batch with the backward outside it — the window's
  last micro-batch never synchronises and the replicas silently diverge (``exp_ddp_no_sync.out``: 0 all-reduces,
  ranks differ)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL114", "ddp-accumulation-sync", Severity.WARNING,
      "DDP accumulation without no_sync(), or forward inside no_sync() and backward outside")
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        if loop.owner not in ("plain",):
            continue
        for with_node, recv, fwd, bwd in loop.no_sync_blocks:
            gates = loop.no_sync_gates.get(id(with_node), ())
            every = all(g.kind == "invariant" for g in gates)
            wrow = ctx.span(with_node)[0].row
            later_bw = [b for b in loop.backwards if not b.in_no_sync and ctx.span(b.call)[0].row > wrow]
            if fwd and not bwd and every and later_bw:
                _ga.report(
                ctx, loop,
                    with_node,
                    f"The forward runs inside `{recv}()` on every micro-batch and the backward outside it: DDP decides "
                    f"whether to all-reduce at forward time, so no micro-batch — not even the window's last — "
                    f"synchronises gradients and the replicas silently diverge (torch DDP). Run the last micro-batch's "
                    f"forward and backward outside `no_sync()`, the others' both inside.",
                    severity=Severity.ERROR,
                )
            elif bwd and not fwd and loop.backwards:
                _ga.report(
                ctx, loop,
                    with_node,
                    f"Only the backward is inside `{recv}()`; DDP took the sync decision during the forward, which ran "
                    f"outside, so every micro-batch still all-reduces. Put the forward inside the `no_sync()` block too.",
                )
        if f.ddp_calls and not f.no_sync_used and _ga.accum_gated(loop) and "require_backward_grad_sync" not in ctx.source:
            g = _ga.step_gate(loop)
            if g is None or g.kind not in ("modulo", "counter", "window"):
                continue
            bws = [b for b in loop.backwards if b.per_micro_batch]
            if not bws:
                continue
            n = _ga.times(loop)
            _ga.report(
                ctx, loop,
                bws[0].call,
                f"The model is wrapped in `DistributedDataParallel` and gradients are accumulated over "
                f"{_ga.n_shown(loop)} micro-batches, but every backward all-reduces: {n} all-reduces per optimizer step "
                f"instead of 1. Wrap the forward and backward of all but the window's last micro-batch in "
                f"`with model.no_sync():`.",
            )
