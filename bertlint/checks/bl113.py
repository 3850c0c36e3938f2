"""BL113 deferred-backward: losses summed over the window (``total = total + loss``) and one ``backward()`` at
the end — all N micro-batches' activations stay alive until then, so peak memory is that of one big batch and
accumulation saves nothing (REFERENCE §3.7 D). Call ``backward()`` on each micro-batch's ``loss / N``.

Invariant over the dry run (``bertlint.trace.backward_each_micro_batch``): the graph a backward frees holds only
its own micro-batch's forward. The trace follows the loss value: a sum of several micro-batches' losses carries the
earliest one. Summing the losses of one micro-batch (several tasks, heads or objectives) is one graph: not this."""

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



@rule("BL113", "deferred-backward", Severity.WARNING, "losses summed over the window and one backward() at its end")
def check(ctx) -> None:
    reported: set = set()
    for run, v, tr in _ga.violations(ctx, "BL113", _ga.PLAIN_OWNERS + ("accelerate", "deepspeed")):
        e = v.event
        target = e.text.split(".backward")[0] if ".backward" in e.text else "the summed loss"
        _ga.treport(
            ctx, run, tr, e.node,
            f"`{target}` sums the losses of the whole window and `backward()` runs once at its end{_ga.when(tr)}: "
            f"{v.message}, so accumulation saves no memory. Call `(loss / N).backward()` on each micro-batch and keep "
            f"the running total as a float (`loss.item()`) for logging.",
        )
        reported.add(v.event.line)
    _inner_windows(ctx, reported)


def _inner_windows(ctx, reported: set) -> None:
    """The window-loop shape (``for batch in window: total += loss`` then one backward): the inner loop runs once in
    the dry run, so its iterations are told apart here (an inner loop over micro-batches, not tasks or heads)."""
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
                # the across-micro-batch case is the trace's (above); only an inner loop over micro-batches here
                if add_in_inner and not bw_in_inner and not add_per_mb:
                    row = ctx.span(bw.call)[0].row
                    if row in reported:
                        break
                    reported.add(row)
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
