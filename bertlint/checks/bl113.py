"""BL113 deferred-backward: losses summed over the window (``total = total + loss``) and one ``backward()`` at
the end — all N micro-batches' activations stay alive until then, so peak memory is that of one big batch and
accumulation saves nothing (REFERENCE §3.7 D). Call ``backward()`` on each micro-batch's ``loss / N``.

Invariant over the dry run (``bertlint.trace.backward_each_micro_batch``): the graph a backward frees holds only
its own micro-batch's forward. The trace follows the loss value: a sum of several micro-batches' losses carries the
earliest one; a sum made in a loop inside the micro-batch (``for batch in window: total += loss``) carries that
loop. Summing the losses of one micro-batch (several tasks, heads or objectives) is one graph: not this; nor is a sum
over an inner loop whose header names tasks, heads or objectives (a name hint: such a loop is one step's objective)."""

from __future__ import annotations

import re

import libcst as cst

from bertlint.analysis.symbols import code_of
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


@rule("BL113", "deferred-backward", Severity.WARNING, "losses summed over the window and one backward() at its end")
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL113", _ga.PLAIN_OWNERS + ("accelerate", "deepspeed")):
        e = v.event
        loop = e.meta.get("graph_loop")
        if loop is not None and not _batch_loop(loop):
            continue  # the sum over an inner loop of tasks / heads / objectives: one step's objective
        target = e.text.split(".backward")[0] if ".backward" in e.text else "the summed loss"
        _ga.treport(
            ctx, run, tr, e.node,
            f"`{target}` sums the losses of the whole window and `backward()` runs once at its end{_ga.when(tr)}: "
            f"{v.message}, so accumulation saves no memory. Call `(loss / N).backward()` on each micro-batch and keep "
            f"the running total as a float (`loss.item()`) for logging.",
        )
