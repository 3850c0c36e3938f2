"""BL113 deferred-backward: losses summed over the window (``total = total + loss``) and one ``backward()`` at
the end — all N micro-batches' activations stay alive until then, so peak memory is that of one big batch and
accumulation saves nothing (REFERENCE §3.7 D). Call ``backward()`` on each micro-batch's ``loss / N``.

Invariant over the dry run (``bertlint.trace.backward_each_micro_batch``): the graph a backward frees holds only
its own micro-batch's forward. The trace follows the loss value: a sum of several micro-batches' losses carries the
earliest one; a sum made in a loop inside the micro-batch (``for batch in window: total += loss``) carries that
loop. Summing the losses of one micro-batch (several tasks, heads or objectives) is one graph: not this.

A sum over an inner loop is over micro-batches by usage when the loop runs N times (``range(N)``, N the run's
accumulation factor), iterates the training loader, or the chunks of the batch (``batch.chunk(N)``,
``torch.split(...)``, directly or through the one name bound to them): then it is reported whatever the loop's
names say. Otherwise nothing says its iterations are micro-batches (a loop over the tasks / heads / objectives of one
step sums one objective), and it is not reported: a loop's names (``for micro, batch in ...``) never make a
finding."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import code_of
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity

def _loader_items(run) -> set:
    """Names the training loop binds to what its loader yields (``for micro_batches in windows:``)."""
    out = set()
    loop = run.loop
    for n in [loop.node] + list(getattr(loop, "outer", None) or []):
        if isinstance(n, cst.For):
            it, tgt = n.iter, n.target
            if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "enumerate" and \
                    it.args and isinstance(tgt, cst.Tuple) and len(tgt.elements) == 2:
                it, tgt = it.args[0].value, tgt.elements[1].value
            if isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value == "zip":
                continue  # one item from each of several loaders (one batch per task): not a window of one loader
            out.update(x.value for x in _names_of(tgt))
    return out


def _names_of(t) -> list:
    if isinstance(t, cst.Name):
        return [t]
    if isinstance(t, (cst.Tuple, cst.List)):
        return [x for el in t.elements for x in _names_of(el.value)]
    return []


_CHUNK_CALLS = ("chunk", "split", "tensor_split")


def _callee_name(call: cst.Call) -> str:
    """The called name's last part: ``chunk`` for ``batch.chunk(4)``, ``range`` for ``range(N)``."""
    f = call.func
    return f.attr.value if isinstance(f, cst.Attribute) else f.value if isinstance(f, cst.Name) else ""


def _chunks_name(ctx, name: str, loop) -> bool:
    """``chunks = batch.chunk(N)`` (or ``.split`` / ``torch.split``) is the only binding of ``name`` in the function
    that holds ``loop`` (or one enclosing it): iterating ``name`` iterates the chunks of a batch."""
    if ctx is None:
        return False
    t = ctx.symbols
    func = next((fn for n, fn, _ in t.loop_nodes if n is loop), None)
    holders = set()
    while func is not None:
        holders.add(id(func))
        func = t.scope_parent.get(id(func))
    mine = [a for a in t.assignments.get(name, []) if a.func is not None and id(a.func) in holders]
    return bool(mine) and all(isinstance(a.value, cst.Call) and _callee_name(a.value) in _CHUNK_CALLS for a in mine)


def _micro_loop_by_usage(node, tr, run, ctx=None) -> bool:
    """The inner loop runs over micro-batches by what it iterates: ``range(N)`` with N the accumulation factor, the
    training loader, what the loader yields (a window of batches), or the chunks of a batch (``.chunk(...)`` /
    ``.split(...)`` / ``torch.chunk`` / ``torch.split``)."""
    if not isinstance(node, cst.For):
        return False
    it = node.iter
    while isinstance(it, cst.Call) and isinstance(it.func, cst.Name) and it.func.value in ("enumerate", "zip", "list") \
            and it.args:
        it = it.args[0].value
    if isinstance(it, cst.Call):
        name = _callee_name(it)
        if name == "range" and len(it.args) == 1 and tr.n_text and code_of(it.args[0].value).strip() == tr.n_text:
            return True
        if name in _CHUNK_CALLS:
            return True
    if isinstance(it, cst.Name) and (it.value in _loader_items(run) or _chunks_name(ctx, it.value, node)):
        return True
    return bool(tr.loader_text) and code_of(it).strip() == tr.loader_text


@rule("BL113", "deferred-backward", Severity.WARNING, "losses summed over the window and one backward() at its end")
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL113", _ga.PLAIN_OWNERS + ("accelerate", "deepspeed")):
        e = v.event
        loop = e.meta.get("graph_loop")
        if loop is not None and not _micro_loop_by_usage(loop, tr, run, ctx):
            continue  # nothing says its iterations are micro-batches (a loop over tasks / heads: one objective)
        target = e.text.split(".backward")[0] if ".backward" in e.text else "the summed loss"
        _ga.treport(
            ctx, run, tr, e.node,
            f"`{target}` sums the losses of the whole window and `backward()` runs once at its end{_ga.when(tr)}: "
            f"{v.message}, so accumulation saves no memory. Call `(loss / N).backward()` on each micro-batch and "
            f"keep the running total as a float (`loss.item()`) for logging.",
        )
