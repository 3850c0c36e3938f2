"""BL104 loss-scaled-twice (loop side): a manual ``/ N`` where the framework already divides.

- accelerate: ``accelerator.backward(loss)`` divides by ``gradient_accumulation_steps`` whenever the Accelerator
  is configured with N > 1 (inside or outside ``accumulate()``): a manual ``loss / N`` gives 1/N² (REFERENCE §2.2).
- DeepSpeed: ``engine.backward(loss)`` divides by the engine's GAS (``scale_wrt_gas=True``): ``engine.backward(loss / N)``
  gives 0.25× at N=4 on every ZeRO stage (§5).
- Lightning: with ``Trainer(accumulate_grad_batches=k)`` Lightning divides the loss ``training_step`` returns by k:
  returning ``loss / k`` divides twice (§4).
The config-file side (a DeepSpeed JSON's ``gradient_accumulation_steps``) lives in another module.
"""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.loops import walk
from bertlint.analysis.symbols import code_of, dotted, kwarg
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


def divisions_into_backward(loop, bw):
    """Divisions whose result is the loss handed to ``bw``."""
    target = dotted(bw.arg) if bw.arg is not None else None
    out = []
    for d in loop.divisions:
        if d.in_backward_arg and d.seq <= bw.seq + 1 and _inside(d.node, bw.call):
            out.append(d)
        elif target and d.var == target and d.seq < bw.seq:
            out.append(d)
    return out


def _inside(node, call) -> bool:
    found = [False]

    class V(cst.CSTVisitor):
        def on_visit(self, n) -> bool:
            if n is node:
                found[0] = True
            return not found[0]

    call.visit(V())
    return found[0]


def _fix_drop(ctx, d):
    """Drop the ``/ N``: ``loss / N`` -> ``loss`` (BinaryOperation) or delete ``loss /= N``."""
    try:
        if isinstance(d.node, cst.BinaryOperation):
            return ctx.fix("Drop the manual division", [ctx.edit_replace(d.node, code_of(d.node.left).strip())],
                           Applicability.UNSAFE)
    except Exception:
        return None
    return None


@rule(
    "BL104",
    "loss-scaled-twice",
    Severity.ERROR,
    "manual loss / N where accelerate, DeepSpeed or Lightning already divides by N",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    f = ctx.loops
    seen = set()
    for loop in f:
        for bw in loop.backwards:
            style = bw.backward_style
            if style == "accelerator":
                ga = f.accelerator_ga
                if ga is None or ga.is_more_than_one() is False:
                    continue
                for d in divisions_into_backward(loop, bw):
                    if not f.is_accum_expr(d.divisor, loop) or id(d.node) in seen:
                        continue
                    seen.add(id(d.node))
                    n = str(ga.value) if ga.value is not None else "N"
                    _ga.report(
                        ctx, loop,
                        d.node,
                        f"The loss is divided by `{d.divisor_text}` by hand, but `accelerator.backward()` already divides "
                        f"it by `gradient_accumulation_steps` ({ga.shown}, {_ga.fw(ctx, 'accelerate')}): each micro-batch "
                        f"is weighted {'1/' + str(ga.value * ga.value) if ga.value else '1/N²'} instead of 1/{n}, so every "
                        f"update is 1/{n} of the full-batch one (0.25× at N=4 in accelerate's own experiment). Pass the "
                        f"raw loss: `accelerator.backward(loss)`.",
                        fix=_fix_drop(ctx, d),
                    )
            elif style == "engine" and bw.receiver and f.kinds.get(bw.receiver) == "engine":
                if kwarg(bw.call, "scale_wrt_gas") is not None:
                    continue
                for d in divisions_into_backward(loop, bw):
                    if not f.is_accum_expr(d.divisor, loop) or id(d.node) in seen:
                        continue
                    seen.add(id(d.node))
                    dv = f.factor(d.divisor, "division", loop.func).value
                    _ga.report(
                        ctx, loop,
                        d.node,
                        f"`{bw.receiver}.backward()` already divides the loss by the engine's "
                        f"`gradient_accumulation_steps` ({_ga.fw(ctx, 'deepspeed', 'DeepSpeed')}, `scale_wrt_gas=True`): "
                        f"dividing by `{d.divisor_text}`{' (= ' + str(dv) + ')' if dv else ''} as well makes every update "
                        f"1/{dv or 'N'} of the intended one "
                        f"(0.25× at N=4 on every ZeRO stage). Pass the raw loss.",
                        fix=_fix_drop(ctx, d),
                    )
    _lightning(ctx, f)


def _lightning(ctx, f) -> None:
    if not f.lightning_trainer_calls:
        return
    k_expr = None
    for call in f.lightning_trainer_calls:
        k_expr = kwarg(call, "accumulate_grad_batches") or k_expr
    if k_expr is None:
        return
    k = f.factor(k_expr, "lightning", None)
    if k.value is not None and k.value <= 1:
        return
    for cname, cls in f.t.classes.items():
        if not f.is_lightning_module(cls):
            continue
        text = code_of(cls)
        if "automatic_optimization = False" in text or "automatic_optimization=False" in text:
            continue
        meth = f.c.class_methods.get(cname, {}).get("training_step")
        if meth is None:
            continue
        for node in _divs(meth):
            right = node.right
            rt = code_of(right).strip()
            if not (f.is_accum_expr(right) or rt == k.text or (k.value is not None and f.r.int_value(right) == k.value)):
                continue
            ctx.report(
                node,
                f"`training_step` divides the loss by `{rt}`, but with `Trainer(accumulate_grad_batches={k.text})` "
                f"Lightning ({_ga.fw(ctx, 'lightning')}) already divides the returned loss by {k.n} under automatic "
                f"optimization: the gradient is 1/{k.n}² of the sum instead of 1/{k.n}. Return the raw loss.",
                fix=_fix_drop_node(ctx, node),
            )


def _fix_drop_node(ctx, node):
    try:
        return ctx.fix("Drop the manual division", [ctx.edit_replace(node, code_of(node.left).strip())],
                       Applicability.UNSAFE)
    except Exception:
        return None


def _divs(meth):
    """Divisions of the loss that ``training_step`` returns: ``return loss / k``, ``loss = loss / k; return loss``,
    ``return {"loss": loss / k}`` (not divisions made for logging)."""
    returns = [n for n in walk(meth) if isinstance(n, cst.Return) and n.value is not None]
    assigns = [n for n in walk(meth) if isinstance(n, (cst.Assign, cst.AugAssign))]
    out = []

    def from_expr(e, depth=0):
        if depth > 3 or e is None:
            return
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Divide):
            if "loss" in code_of(e.left).lower():
                out.append(e)
            return
        if isinstance(e, cst.Dict):
            for el in e.elements:
                if isinstance(el, cst.DictElement) and "loss" in code_of(el.key):
                    from_expr(el.value, depth + 1)
            return
        name = dotted(e)
        if name:
            for a in assigns:
                if isinstance(a, cst.Assign) and any(dotted(t.target) == name for t in a.targets):
                    from_expr(a.value, depth + 1)
                elif isinstance(a, cst.AugAssign) and dotted(a.target) == name and isinstance(a.operator, cst.DivideAssign):
                    pass

    for r in returns:
        from_expr(r.value)
    return out
