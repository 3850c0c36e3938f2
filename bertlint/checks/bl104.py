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

from bertlint import trace as T
from bertlint.analysis.walk import scope_nodes as walk
from bertlint.analysis import accum
from bertlint.analysis.symbols import code_of, dotted, kwarg
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


def _fix_drop(ctx, node):
    """Drop the ``/ N``: ``loss / N`` -> ``loss``."""
    try:
        if isinstance(node, cst.BinaryOperation):
            return ctx.fix("Drop the manual division", [ctx.edit_replace(node, code_of(node.left).strip())],
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
    for run, v, tr in _ga.violations(ctx, "BL104"):
        bw = v.event
        user = v.data.get("factor")
        node = user.node if user is not None and user.node is not None else bw.node
        fws = bw.scale.by(T.ACCUM_FRAMEWORK) if bw.scale is not None else []
        under_ds = any("DeepSpeed" in (x.who or "") for x in fws)
        # a factor of unknown value beside the two divisions (``loss / num_tokens`` through a helper) or a
        # configuration the file does not decide (a DeepSpeed launch): the 1/N² is shown, at warning severity
        sev = Severity.WARNING if (under_ds or (bw.scale is not None and bw.scale.by(T.OTHER))) else None
        if bw.via == "accelerator" and under_ds:
            msg = (f"The loss is divided by `{user.text}` by hand, and `{user.text}` is read from the DeepSpeed config "
                   f"(when launched with DeepSpeed): `accelerator.backward()` then runs the DeepSpeed engine's "
                   f"backward, which divides by that config's `gradient_accumulation_steps` itself "
                   f"({_ga.fw(ctx, 'accelerate')}, {_ga.fw(ctx, 'deepspeed', 'DeepSpeed')}, `scale_wrt_gas=True`)"
                   f"{_ga.when(tr)}: {v.message}; every update is 1/{_ga.n_of(tr)} of the intended one. Pass the raw "
                   f"loss: `accelerator.backward(loss)`.")
        elif bw.via == "accelerator":
            ga = f.accelerator_ga
            shown = ga.shown if ga is not None else "`gradient_accumulation_steps`"
            msg = (f"The loss is divided by `{user.text}` by hand, but `accelerator.backward()` already divides it by "
                   f"`gradient_accumulation_steps` ({shown}, {_ga.fw(ctx, 'accelerate')}){_ga.when(tr)}: "
                   f"{v.message}; every update is 1/{_ga.n_of(tr)} of the full-batch one (0.25× at N=4 in "
                   f"accelerate's own experiment). Pass the raw loss: `accelerator.backward(loss)`.")
        else:
            msg = (f"`{bw.text.split('(')[0]}()` already divides the loss by the engine's `gradient_accumulation_steps` "
                   f"({_ga.fw(ctx, 'deepspeed', 'DeepSpeed')}, `scale_wrt_gas=True`){_ga.when(tr)}: {v.message}; "
                   f"every update is 1/{_ga.n_of(tr)} of the intended one (0.25× at N=4 on every ZeRO stage). "
                   f"Pass the raw loss.")
        _ga.treport(ctx, run, tr, node, msg, fix=_fix_drop(ctx, node), severity=sev)
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
        meth = f.t.class_methods.get(cname, {}).get("training_step")
        if meth is None:
            continue
        for node in _divs(meth):
            right = node.right
            rt = code_of(right).strip()
            same = rt == k.text or (k.value is not None and f.r.int_value(right) == k.value)
            if not same and not accum.is_accum_name(rt):
                continue
            # the divisor is the Trainer's setting (same expression or value); by its name alone it is a hint: a
            # warning that says so, never an error
            note = "" if same else (f" (`{rt}` is taken for the accumulation factor by its name alone: it is "
                                    f"neither `{k.text}` nor a value the linter resolves to it)")
            ctx.report(
                node,
                f"`training_step` divides the loss by `{rt}`, but with `Trainer(accumulate_grad_batches={k.text})` "
                f"Lightning ({_ga.fw(ctx, 'lightning')}) already divides the returned loss by {k.n} under automatic "
                f"optimization: the gradient is 1/{k.n}² of the sum instead of 1/{k.n}{note}. Return the raw loss.",
                fix=_fix_drop_node(ctx, node),
                **({} if same else {"severity": Severity.WARNING}),
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
