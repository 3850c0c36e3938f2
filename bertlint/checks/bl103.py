"""BL103 loss-not-scaled: a hand-written accumulation loop (backward every micro-batch, step every N) that
never divides the loss by N nor rescales the gradients: the update is the *sum* of N micro-batch gradients,
N× the mean (``exp_manual_ga_patterns.out`` P4: total weight 4.00 with N=4)."""

from __future__ import annotations

import re

from bertlint.analysis.symbols import code_of, dotted
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity

_SCALING = re.compile(r"/|\.div_?\(|\.mul_?\(|\*=|reduction|num_items|scale_wrt|\bloss\w*\s*\*|\*\s*\(?\s*1\s*/|normaliz")


@rule("BL103", "loss-not-scaled", Severity.WARNING, "hand-written accumulation without dividing the loss by N")
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        if loop.owner not in ("plain", "fabric"):
            continue
        if not _ga.accum_gated(loop) or loop.divisions or not _ga.single_optimizer(loop):
            continue
        g = _ga.step_gate(loop)
        if g is None or g.kind not in ("modulo", "counter", "window"):
            continue
        acc = loop.accum()
        if acc is None or acc.value == 1:
            continue
        if acc.value is None and not _accumish(acc.text):
            continue
        bws = [b for b in loop.backwards if b.per_micro_batch]
        if not bws:
            continue
        texts = [code_of(loop.node)] + [code_of(fn) for fn in loop.callees]
        if any(_SCALING.search(t) for t in texts):
            continue
        if _external_loss(f, loop, bws[0]):
            continue
        n = _ga.times(loop)
        sgd = any(k == "optimizer" and "SGD" in (_ctor(f, name) or "") for name, k in f.kinds.items())
        _ga.report(
                ctx, loop,
            bws[0].call,
            f"The loss is not divided by the accumulation factor {acc.shown}: the {n} micro-batch gradients are "
            f"summed, so each update uses {n}× the mean gradient of the window"
            + (" (with SGD that is a learning rate " + n + "× too large)" if sgd else
               " (an effective learning rate up to " + n + "× too large with SGD; gradient clipping thresholds are hit "
               "N× sooner with Adam)")
            + f". Divide before backward: `loss = loss / {acc.text}`. ({_ga.owner_note(ctx, loop)})",
        )


def _accumish(text: str) -> bool:
    from bertlint.analysis.loops import ACCUM_RE

    return bool(ACCUM_RE.search(text))


def _ctor(f, name):
    for a in f.t.assignments.get(name, []):
        return code_of(a.value)
    return None


def _external_loss(f, loop, bw) -> bool:
    """The loss comes from a function imported from another project module (it may divide there)."""
    name = dotted(bw.arg) if bw.arg is not None else None
    if not name:
        return False
    for a in f.t.assignments_of(name, loop.func):
        v = a.value
        import libcst as cst

        if isinstance(v, cst.Call) and isinstance(v.func, cst.Name):
            q = f.t.imports.get(v.func.value)
            if q and not q.startswith(("torch", "transformers")):
                return True
    return False
