"""BL404 compute-loss-ignores-num-items.

(a) A ``compute_loss`` override of a Trainer subclass without ``num_items_in_batch`` and without ``**kwargs``:
transformers ≥ 4.46 call ``self.compute_loss(model, inputs, num_items_in_batch=...)`` -> TypeError at the first step
(``exp_trainer_compute_loss_override.out`` O1).
(b) On transformers 5.x, an override that never reads ``num_items_in_batch`` (and neither divides by the accumulation
steps nor calls ``super().compute_loss``) for a BERT-family model whose ``forward`` takes ``**kwargs``: the Trainer
treats the returned per-micro-batch mean as already scaled and does not divide it by N (O2: logged loss ×4).
"""

from __future__ import annotations

from bertlint.checks._trainer import calls_super_compute_loss, param_names, reads_name
from bertlint.analysis.symbols import code_of
from bertlint.analysis.versions import severity_for
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


def _insert_param_fix(ctx, fdef):
    import libcst as cst

    from bertlint.types import Edit

    p = fdef.params
    if p.star_kwarg is not None or p.kwonly_params or isinstance(p.star_arg, cst.Param) or not p.params:
        return None
    last = p.params[-1]
    anchor = last.default or (last.annotation if last.annotation is not None else last.name)
    _, end = ctx.span(anchor)
    return ctx.fix("Add `num_items_in_batch=None` to the signature", [Edit(", num_items_in_batch=None", end, end)],
                   Applicability.SAFE)


@rule(
    "BL404",
    "compute-loss-ignores-num-items",
    Severity.ERROR,
    "compute_loss override without num_items_in_batch (TypeError), or returning a mean the Trainer will not divide",
    fix=Applicability.SAFE,
)
def check(ctx) -> None:
    if "compute_loss" not in ctx.source:
        return
    fs = ctx.setup
    tv = ctx.versions.transformers
    for cname, methods in fs.trainer_classes.items():
        fdef = methods.get("compute_loss")
        if fdef is None or "training_step" in methods:
            continue  # an own training_step decides how compute_loss is called
        names, has_kwargs = param_names(fdef)
        if "num_items_in_batch" not in names and not has_kwargs:
            if tv.at_least("4.46.0"):
                ctx.report(
                    fdef.name,
                    f"`{cname}.compute_loss` has no `num_items_in_batch` parameter, but on {tv.describe()} the "
                    f"Trainer calls `self.compute_loss(model, inputs, num_items_in_batch=...)`: training stops at "
                    f"the first step with `TypeError: compute_loss() got an unexpected keyword argument "
                    f"'num_items_in_batch'`. Fix: add `num_items_in_batch=None` to the signature (and use it to "
                    f"normalise a summed loss).",
                    fix=_insert_param_fix(ctx, fdef),
                    severity=severity_for(Severity.ERROR, tv),
                )
            continue
        # (b) the override computes its own mean loss and the Trainer will not divide it
        if not tv.at_least("5.0.0") or fs.disables_loss_kwargs:
            continue
        if calls_super_compute_loss(fdef) or reads_name(fdef, "num_items_in_batch"):
            continue
        body = code_of(fdef)
        if "gradient_accumulation_steps" in body:
            continue  # divides by N itself: correct on 5.x for these heads (O4)
        for ti in fs.trainers:
            if ti.class_name != cname or ti.args is None or ti.model is None:
                continue
            n = ti.args.int("gradient_accumulation_steps")
            if n is None or n <= 1 or ti.loss_scaling_override or ti.compute_loss_func is not None:
                continue
            if ti.model.family is None or ti.model.head is None:
                f = ti.model.forward  # a model class of the script: its forward must take **kwargs and labels
                if f is None or f.params.star_kwarg is None or "labels" not in {
                        x.name.value for x in (*f.params.params, *f.params.kwonly_params)}:
                    continue
            ctx.report(
                fdef.name,
                f"`{cname}.compute_loss` returns a per-micro-batch loss and never reads `num_items_in_batch`, but "
                f"`{ti.model.class_name}` accepts `**kwargs` on {tv.describe()}, so the Trainer treats the returned "
                f"loss as already scaled and does not divide it by gradient_accumulation_steps={n}: loss and "
                f"gradients are {n}× too large. Fix: return `loss_sum / num_items_in_batch`, or set "
                f"`loss_is_scaled_for_ga = False` on `{cname}` (≥ 5.19) / `trainer.model_accepts_loss_kwargs = "
                f"False` so the Trainer divides by N.",
                severity=severity_for(Severity.ERROR, tv),
            )
            break
