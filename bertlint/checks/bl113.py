"""BL113 deferred-backward: losses summed over the window (``total = total + loss``) and one ``backward()`` at
the end — all N micro-batches' activations stay alive until then, so peak memory is that of one big batch and
accumulation saves nothing (REFERENCE §3.7 D). Call ``backward()`` on each micro-batch's ``loss / N``."""

from __future__ import annotations

import re

import libcst as cst

from bertlint.analysis.symbols import code_of, dotted
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity

_BATCHY = re.compile(r"batch|loader|micro|window|chunk|\bdl\b|data|accum", re.IGNORECASE)


# an inner loop over tasks / objectives / heads / layers / domains / languages sums *different* losses of one
# step (multi-task training), not the micro-batches of one window: that is the model's objective, not deferred
# accumulation, even when its items are called ``batch``.
_NOT_MICRO = re.compile(r"task|objective|head|layer|domain|lang|modal|loss_fn|criteri", re.IGNORECASE)


def _batch_loop(node) -> bool:
    """An inner loop over micro-batches (not over heads, tasks or layers)."""
    if isinstance(node, cst.For):
        text = code_of(node.target) + " " + code_of(node.iter)
        return bool(_BATCHY.search(text)) and not _NOT_MICRO.search(text)
    return False


_DETACHED = re.compile(r"\.item\(\)|\.detach\(\)|float\(|\.cpu\(\)|\.tolist\(\)|\.numpy\(\)")


@rule("BL113", "deferred-backward", Severity.WARNING,
      "losses summed over the window and one backward() at the end: all activations stay alive")
def check(ctx) -> None:
    for loop in ctx.loops:
        for bw in loop.backwards:
            target = dotted(bw.arg) if bw.arg is not None else None
            if not target:
                continue
            for name, node, seq, gates in loop.accum_adds:
                if name != target:
                    continue
                value = node.value if isinstance(node, cst.AugAssign) else node.value
                vt = code_of(value)
                if "loss" not in vt.lower() and "model(" not in vt and "out" not in vt.lower():
                    continue
                if _DETACHED.search(vt):
                    continue
                inner = [g for g in gates if g.kind == "loop"]
                add_in_inner = bool(inner) and all(_batch_loop(g.node) for g in inner)
                bw_in_inner = any(g.kind == "loop" for g in bw.gates)
                add_per_mb = all(g.kind == "invariant" for g in gates)
                if (add_per_mb and not bw.per_micro_batch and bw.frequency_gates) or (add_in_inner and not bw_in_inner):
                    _ga.report(
                ctx, loop,
                        bw.call,
                        f"`{target}` sums the losses of the whole window and `backward()` runs once at its end: the "
                        f"autograd graphs (all saved activations) of every micro-batch stay alive until then, so peak "
                        f"memory equals one batch of N micro-batches and accumulation saves nothing. Call "
                        f"`(loss / N).backward()` on each micro-batch and keep `{target}` as a float (`loss.item()`) "
                        f"for logging.",
                    )
                    break
