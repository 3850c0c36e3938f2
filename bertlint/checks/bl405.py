"""BL405 trainer-loss-inflated-by-accumulation.

transformers 5.x: every BERT-family task head declares ``**kwargs`` but computes a plain mean loss that ignores
``num_items_in_batch``; the Trainer sees ``**kwargs``, treats the loss as already scaled and does not divide by N, so
loss and gradient are N times too large (REFERENCE §1.2, ``exp_trainer_ga_scaling.out``). transformers
4.46.0–4.47.x do not divide either (``exp_old_trainer_ga_4.46.*.out``). Nothing is reported when the switch that
restores the division is present, when ``compute_loss_func`` is given, when ``compute_loss``/``training_step`` is
overridden (BL404 reads overrides), for causal-LM heads and ModernBert MLM/QA (token-exact), or when N is not
statically > 1.
"""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import code_of, dotted
from bertlint.analysis.versions import severity_for
from bertlint.checks._trainer import calls_super_compute_loss, loss_ignores_num_items, model_phrase, reads_name
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule(
    "BL405",
    "trainer-loss-inflated-by-accumulation",
    Severity.ERROR,
    "Trainer + accumulation > 1 + a head that ignores num_items_in_batch: loss and gradients multiplied by N",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    if "Trainer" not in ctx.source:
        return
    fs = ctx.setup
    if fs.disables_loss_kwargs:
        return
    for ti in fs.trainers:
        args = ti.args
        if args is None:
            continue
        n = args.int("gradient_accumulation_steps")
        if n is None or n <= 1:
            continue
        if ti.loss_scaling_override or "training_step" in ti.methods:
            continue
        if ti.compute_loss_func is not None:
            if ti.compute_loss is None:
                _check_loss_func(ctx, ti, n, args)
            continue
        if ti.model is None:
            continue
        cl = ti.compute_loss
        if cl is not None and not calls_super_compute_loss(cl):
            continue
        tv = ctx.versions.transformers
        kind = loss_ignores_num_items(tv, ti.model.family, ti.model.head)
        if kind is None and ti.model.local_class is not None:
            kind = _custom_forward_ignores(ti.model, tv)
        if kind is None:
            continue
        model = model_phrase(ti.model)
        peft = " PEFT wrapping does not shield it (the Trainer inspects the unwrapped model)." if ti.model.peft else ""
        origin = args.origin("gradient_accumulation_steps")
        ga_text = f"gradient_accumulation_steps={n}" + ("" if origin == "keyword" else f" ({origin})")
        fix = None
        if kind == "custom":
            kw = ti.model.forward.params.star_kwarg.name.value
            msg = (
                f"On {tv.describe()}, `{ti.model.class_name}.forward` declares `**{kw}` and takes `labels`, so the "
                f"Trainer sets `model_accepts_loss_kwargs=True`, passes `num_items_in_batch` into it and skips its own "
                f"division by the accumulation steps — but `forward` never reads it: with {ga_text} each optimizer "
                f"step applies the sum of {n} micro-batch losses, {n}× too large. Fix: set "
                f"`trainer.model_accepts_loss_kwargs = False` after constructing the Trainer, or normalise the loss "
                f"in `forward` by `num_items_in_batch` (sum of token losses / num_items_in_batch)."
            )
            if ti.var and ti.stmt is not None and len(ti.stmt.body) == 1:
                fix = ctx.fix(
                    f"Insert `{ti.var}.model_accepts_loss_kwargs = False` after the Trainer is constructed",
                    [ctx.edit_insert_line_after(ti.stmt, f"{ti.var}.model_accepts_loss_kwargs = False")],
                    Applicability.UNSAFE,
                )
        elif kind == "5x":
            escape = (
                " or a Trainer subclass with `loss_is_scaled_for_ga = False`" if tv.at_least("5.19.0") else ""
            )
            msg = (
                f"On {tv.describe()}, {model} accepts `**kwargs` but its loss ignores `num_items_in_batch`, so the "
                f"Trainer treats the loss as already scaled and never divides it by the accumulation steps: with "
                f"{ga_text} each optimizer step applies the sum of {n} micro-batch mean losses, so loss and "
                f"gradients are {n}× too large (logged loss ×{n}, gradient clipping at `max_grad_norm` nearly always "
                f"active, SGD's learning rate effectively ×{n}).{peft} Fix: set "
                f"`trainer.model_accepts_loss_kwargs = False` after constructing the Trainer{escape}, or pass a "
                f"`compute_loss_func` that divides the summed loss by `num_items_in_batch` "
                f"(huggingface/transformers#47688)."
            )
            if ti.var and ti.stmt is not None and len(ti.stmt.body) == 1:
                fix = ctx.fix(
                    f"Insert `{ti.var}.model_accepts_loss_kwargs = False` after the Trainer is constructed",
                    [ctx.edit_insert_line_after(ti.stmt, f"{ti.var}.model_accepts_loss_kwargs = False")],
                    Applicability.UNSAFE,
                )
        else:
            hidden = (
                " On 4.46.2–4.46.3 the logged loss still looks normal while the gradient is inflated."
                if tv.between("4.46.2", "4.47.0") else ""
            )
            msg = (
                f"On {tv.describe()}, the Trainer does not divide the loss of {model} (which does not consume "
                f"`num_items_in_batch`) by the accumulation steps: with {ga_text} the gradient of each optimizer "
                f"step is the sum of {n} micro-batch means, {n}× too large.{hidden} transformers 4.46.0–4.47.x are "
                f"affected; 4.48–4.57 divide correctly. Fix: upgrade transformers to ≥ 4.48 (≥ 4.55 also divides "
                f"the last partial window by its real size); on 5.x also set `trainer.model_accepts_loss_kwargs = "
                f"False`."
            )
        ctx.report(
            ti.node,
            msg,
            fix=fix,
            severity=severity_for(Severity.ERROR, tv),
            data={
                "accumulation": n,
                "transformers": tv.text,
                "version_source": tv.source,
                "model_class": ti.model.class_name,
                "kind": kind,
                "trainer_var": ti.var,
            },
        )


def _check_loss_func(ctx, ti, n: int, args) -> None:
    """``compute_loss_func=f``: on 5.x the Trainer never divides by N when one is given, so ``f`` must normalise by
    its ``num_items_in_batch`` argument. Reported only for a function of this file whose body never reads it."""
    tv = ctx.versions.transformers
    if not tv.at_least("5.0.0"):
        return
    name = dotted(ti.compute_loss_func)
    defs = ctx.symbols.functions.get(name or "", [])
    if len(defs) != 1 or "." in (name or ""):
        return
    fdef = defs[0]
    p = fdef.params
    params = [x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)]
    if len(params) >= 3:
        third = params[2]
    elif p.star_kwarg is not None or p.star_arg is not None and isinstance(p.star_arg, cst.Param):
        third = None
    else:
        return  # cannot even receive it: a TypeError, not this rule
    if third and reads_name(fdef, third):
        return
    if p.star_kwarg is not None and reads_name(fdef, p.star_kwarg.name.value):
        return
    if isinstance(p.star_arg, cst.Param) and reads_name(fdef, p.star_arg.name.value):
        return
    body = code_of(fdef)
    if "gradient_accumulation_steps" in body or "num_items_in_batch" in body.split(":", 1)[-1]:
        return
    ctx.report(
        ti.node,
        f"On {tv.describe()}, a Trainer given `compute_loss_func={name}` never divides the loss by the accumulation "
        f"steps — the function is expected to normalise by `num_items_in_batch` — but `{name}` never reads "
        f"`{third or 'num_items_in_batch'}`: with gradient_accumulation_steps={n} each optimizer step applies the "
        f"sum of {n} per-micro-batch losses, {n}× too large. Fix: return `loss_sum / num_items_in_batch` from "
        f"`{name}` (token-exact), or divide its result by the accumulation steps.",
        severity=severity_for(Severity.ERROR, tv),
        data={"accumulation": n, "transformers": tv.text, "version_source": tv.source, "kind": "loss_func",
              "trainer_var": ti.var},
    )


def _custom_forward_ignores(model, tv):
    """A model class of the script whose ``forward(..., labels=..., **kwargs)`` computes a loss and never reads
    ``num_items_in_batch`` (nor its ``**kwargs``): from transformers 4.48 the Trainer treats such a model as
    normalising by ``num_items_in_batch`` and does not divide by N."""
    f = model.forward
    if f is None or not tv.at_least("4.48.0"):
        return None
    p = f.params
    if p.star_kwarg is None:
        return None
    names = {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)}
    if "labels" not in names:
        return None  # without a `labels` key in the batch the Trainer computes no num_items_in_batch and divides
    body = code_of(f.body)
    if "num_items_in_batch" in body or "loss" not in body or reads_name(f, p.star_kwarg.name.value):
        return None
    cls_text = code_of(model.local_class)
    if "accepts_loss_kwargs" in cls_text:
        return None
    return "custom"
