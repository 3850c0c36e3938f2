"""BL404 compute-loss-ignores-num-items.

(a) A ``compute_loss`` override of a Trainer subclass without ``num_items_in_batch`` and without ``**kwargs``:
transformers ≥ 4.46 call ``self.compute_loss(model, inputs, num_items_in_batch=...)`` -> TypeError at the first step
(``exp_trainer_compute_loss_override.out`` O1).
(b) On transformers 5.x, an override that never reads ``num_items_in_batch`` (and neither divides by the accumulation
steps nor calls ``super().compute_loss``) for a BERT-family model whose ``forward`` takes ``**kwargs``: the Trainer
treats the returned per-micro-batch mean as already scaled and does not divide it by N (O2: logged loss ×4).
"""

from __future__ import annotations

import re

from bertlint.checks._trainer import calls_super_compute_loss, collator_batch_keys, param_names, reads_name
from bertlint.analysis.symbols import code_of
from bertlint.analysis.versions import describe_reaching, reaching, severity_for
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
            hit = reaching(tv, lambda t: t.at_least("4.46.0"))
            if hit is not None:
                on = describe_reaching(tv, hit, "where the call has no such keyword")
                ctx.report(
                    fdef.name,
                    f"`{cname}.compute_loss` has no `num_items_in_batch` parameter, but on {on} the "
                    f"Trainer calls `self.compute_loss(model, inputs, num_items_in_batch=...)`: training stops at "
                    f"the first step with `TypeError: compute_loss() got an unexpected keyword argument "
                    f"'num_items_in_batch'`. Fix: add `num_items_in_batch=None` to the signature (and use it to "
                    f"normalise a summed loss).",
                    fix=_insert_param_fix(ctx, fdef),
                    severity=severity_for(Severity.ERROR, tv, hit),
                )
            continue
        # (b) the override computes its own loss and never normalises by num_items_in_batch
        _check_unscaled(ctx, fs, tv, cname, methods, fdef)


# trl trainers whose batches carry no `labels` (preference / RL data): the Trainer computes no num_items_in_batch
# and divides by the accumulation steps itself
_NO_LABEL_TRAINERS = re.compile(r"(DPO|KTO|ORPO|CPO|PPO|GRPO|RLOO|Reward|BCO|Online|XPO|Nash|PRM|GKD)\w*Trainer$")


def _check_unscaled(ctx, fs, tv, cname, methods, fdef) -> None:
    """The Trainer skips its own division by the accumulation steps when the model handed to it accepts loss kwargs
    (``forward(..., **kwargs)``: ``model_accepts_loss_kwargs``) and the batch has labels (``num_items_in_batch`` is
    not None): transformers ≥ 4.48 for causal-LM heads and models of the script that take ``**kwargs``, every
    BERT-family task head from 5.0 (REFERENCE §1.1-1.2, ``exp_trainer_compute_loss_override.out`` O2). An override
    that returns its own per-micro-batch loss and never reads ``num_items_in_batch`` then trains on the sum of N
    micro-batch losses. Keyed on what the override does and the target version; the model and N are read from the
    constructions of the class in this file when there are some, else stated as the verdict's assumption. A
    construction whose ``data_collator`` is a collator of this file returning batches without a ``labels`` key is safe:
    the Trainer then computes no ``num_items_in_batch`` and divides by N itself."""
    if not tv.at_least("4.48.0") or fs.disables_loss_kwargs:
        return
    if calls_super_compute_loss(fdef) or reads_name(fdef, "num_items_in_batch"):
        return
    p = fdef.params
    if p.star_kwarg is not None and reads_name(fdef, p.star_kwarg.name.value):
        return
    body = code_of(fdef)
    if "gradient_accumulation_steps" in body or "accepts_loss_kwargs" in body or "loss_is_scaled_for_ga" in body:
        return  # divides by N itself (correct for these models: O4), or switches the Trainer's division on
    cls = ctx.symbols.classes.get(cname)
    if cls is not None:
        text = code_of(cls)
        if "loss_is_scaled_for_ga" in text or "model_accepts_loss_kwargs" in text or "accepts_loss_kwargs" in text:
            return
        base = _framework_base(ctx, cls)
        if base and _NO_LABEL_TRAINERS.search(base.split(".")[-1]):
            return
    built = [ti for ti in fs.trainers if ti.class_name == cname]
    if not built and _annotated_foreign_model(ctx, fdef):
        return  # the model is declared to be another package's class: none the assumption below names
    # the override reads its batch only by keys none of which is `labels`: where no collator of this file says what
    # the batches hold, the batches it is written for carry no `labels` (num_items_in_batch None: the Trainer divides)
    unlabelled = _batch_keys_without_labels(fdef)
    if not built and unlabelled:
        return
    verdicts = []  # (affected: True/None, model text, N or None, N text)
    for ti in built:
        if ti.loss_scaling_override or ti.compute_loss_func is not None:
            return
        n = ti.args.int("gradient_accumulation_steps") if ti.args is not None else None
        if n is not None and n <= 1:
            continue  # no accumulation at this construction
        keys = collator_batch_keys(ctx, ti.node)
        if keys is not None and "labels" not in keys:
            continue  # the collator's batches carry no `labels`: num_items_in_batch is None, the Trainer divides by N
        if keys is None and unlabelled:
            continue  # no collator says otherwise, and the override's own reads show batches without `labels`
        affected, what = _model_takes_loss_kwargs(ti.model, tv)
        if affected is False:
            continue
        ntext = (f"gradient_accumulation_steps={n}" if n is not None else
                 "gradient_accumulation_steps > 1 (its value is not known statically)")
        verdicts.append((affected, what, n, ntext))
    if built and not verdicts:
        return  # every construction here is safe (no accumulation, or a model without **kwargs)
    if not verdicts:
        verdicts = [(None, None, None, "gradient_accumulation_steps > 1")]
    affected, what, n, ntext = verdicts[0]
    certain = affected is True and n is not None and not tv.assumed
    heads = ("every causal-LM head (`*ForCausalLM`) from transformers 4.48, every BERT-family task head on 5.x, or "
             "a model class of yours whose `forward` takes `**kwargs`")
    if what:
        assumes = f"The model given to it here is {what}."
    else:
        assumes = (f"This assumes the model it is given declares `**kwargs` in `forward` ({heads}) and batches "
                   f"with `labels`; with another model the Trainer divides by N itself and this is fine.")
    times = f"{n}×" if n is not None else "N×"
    ctx.report(
        fdef.name,
        f"`{cname}.compute_loss` returns its own per-micro-batch loss and never reads `num_items_in_batch`; on "
        f"{tv.describe()} the Trainer then treats the returned loss as already normalised (the model accepts loss "
        f"kwargs and the batch has labels) and does not divide it by the accumulation steps: with {ntext} each "
        f"optimizer step applies the sum of the micro-batch losses, {times} too large (logged loss too). {assumes} "
        f"Fix: return `loss_sum / num_items_in_batch` (token-exact), or set `trainer.model_accepts_loss_kwargs = "
        f"False` (or class attribute `loss_is_scaled_for_ga = False` on ≥ 5.19) so the Trainer divides by N.",
        severity=Severity.ERROR if certain else Severity.WARNING,
        data={"kind": "unscaled_override", "accumulation": n, "transformers": tv.text,
              "version_source": tv.source, "assumed_model": what is None},
    )


def _batch_keys_without_labels(fdef) -> bool:
    """The override reads its batch (``compute_loss(self, model, inputs, ...)``'s ``inputs``) only by literal keys —
    ``inputs["anchor"]``, ``inputs.get("pixel_values")``, ``inputs.pop("query")`` — and none of them is ``"labels"``:
    the batches it is written for carry no ``labels`` key, so ``Trainer._get_num_items_in_batch`` (which counts only
    when ``"labels" in batch_samples[0]``) gives None, ``loss_is_scaled_for_ga`` is False and the Trainer divides the
    returned loss by N itself (transformers 5.24 ``training_step``). Any other use of the batch (``model(**inputs)``,
    ``model(inputs)``, ``inputs.items()``, a key that is not a string literal, a second name bound to it) leaves the
    keys unknown: False. A hint, not a proof: a collator of the file that is known to add ``labels`` still decides
    (``fixtures/trainer/compute_loss_collator_labels_bad.py``)."""
    import libcst as cst

    params = [p for p in fdef.params.params if p.name.value not in ("self", "cls")]
    if len(params) < 2:
        return False
    name = params[1].name.value
    keys: set[str] = set()
    ok = True

    class _V(cst.CSTVisitor):
        def __init__(self) -> None:
            self.keyed: set[int] = set()

        def visit_Subscript(self, node: cst.Subscript) -> None:
            nonlocal ok
            if isinstance(node.value, cst.Name) and node.value.value == name:
                k = _literal_key(node.slice[0].slice if len(node.slice) == 1 else None)
                if k is None:
                    ok = False
                else:
                    keys.add(k)
                self.keyed.add(id(node.value))

        def visit_Call(self, node: cst.Call) -> None:
            nonlocal ok
            f = node.func
            if (isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == name
                    and f.attr.value in ("get", "pop")):
                k = _literal_key(node.args[0]) if node.args and node.args[0].keyword is None and not node.args[0].star else None
                if k is None:
                    ok = False
                else:
                    keys.add(k)
                self.keyed.add(id(f.value))

        def visit_Name(self, node: cst.Name) -> None:
            nonlocal ok
            if node.value == name and id(node) not in self.keyed:
                ok = False

        def visit_Param(self, node: cst.Param) -> bool:
            return False  # the parameter's own name (and defaults) are not uses

    v = _V()
    fdef.body.visit(v)
    return ok and bool(keys) and "labels" not in keys


def _literal_key(node):
    import libcst as cst

    if isinstance(node, cst.Arg):
        node = node.value
    if isinstance(node, cst.Index):
        node = node.value
    if isinstance(node, cst.SimpleString):
        try:
            v = node.evaluated_value
        except Exception:
            return None
        return v if isinstance(v, str) else None
    return None


# packages whose model classes the assumption of (b) covers, or whose annotations say nothing of the model's forward
_GENERIC_MODEL_PACKAGES = ("transformers", "peft", "trl", "torch", "typing", "builtins", "lightning",
                           "pytorch_lightning", "accelerate")


def _annotated_foreign_model(ctx, fdef) -> bool:
    """The override annotates its model parameter with a class imported from another package
    (``def compute_loss(self, intervenable: pv.IntervenableModel, inputs, ...)``, ``import pyvene as pv``): the model
    the Trainer holds is that class, not a transformers head nor a class of the script, and whether its ``forward``
    takes ``**kwargs`` (what the Trainer's ``model_accepts_loss_kwargs`` reads) is not known here."""
    import libcst as cst

    params = [p for p in fdef.params.params if p.name.value not in ("self", "cls")]
    if not params or params[0].annotation is None:
        return False
    ann = params[0].annotation.annotation
    if not isinstance(ann, (cst.Name, cst.Attribute)):
        return False
    q = ctx.symbols.qualname(ann) or ""
    top = q.split(".")[0]
    if not q or "." not in q or top in _GENERIC_MODEL_PACKAGES or q.split(".")[-1] in ctx.symbols.classes:
        return False
    return top in {v.split(".")[0] for v in ctx.symbols.imports.values()}


def _framework_base(ctx, cls):
    try:
        roles = ctx.roles
        return roles.class_base(cls)
    except Exception:
        return None


def _model_takes_loss_kwargs(model, tv):
    """(True, text) when the model's forward is known to take ``**kwargs`` on ``tv``; (False, text) when known not to;
    (None, None) when the model is not known."""
    if model is None:
        return None, None
    from bertlint.checks._trainer import FAMILIES_5X, TASK_HEADS

    f = model.forward
    if model.local_class is not None:
        if f is None:
            return None, None
        if f.params.star_kwarg is None:
            return False, None
        return True, f"`{model.class_name}`, whose `forward` declares `**{f.params.star_kwarg.name.value}`"
    head, fam = model.head, model.family
    cls = model.class_name or model.declared_class
    if head in ("ForCausalLM", "LMHeadModel"):
        return True, f"a causal-LM head (`{cls}`), whose `forward` takes `**kwargs` on ≥ 4.48"
    if head in TASK_HEADS and fam is not None:
        if tv.at_least("5.0.0") and fam in FAMILIES_5X:
            return True, f"`{cls}`, whose `forward` takes `**kwargs` on 5.x"
        return False, None
    return None, None
