"""Shared helpers of the Hugging Face Trainer rules (not a rule module: the leading underscore keeps the registry
from loading it as one)."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from bertlint.analysis.walk import walk

from bertlint.analysis.symbols import UNKNOWN, code_of

TASK_HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForMaskedLM", "ForQuestionAnswering",
              "ForMultipleChoice")
FAMILIES_5X = ("bert", "roberta", "xlm-roberta", "electra", "deberta-v2", "albert", "distilbert", "modernbert")
# ModernBert heads that pass **kwargs on to self.loss_function (token-exact, not affected): REFERENCE §1.2
MODERNBERT_EXACT = ("ForMaskedLM", "ForQuestionAnswering")


def loss_ignores_num_items(tv, family: Optional[str], head: Optional[str]) -> Optional[str]:
    """Why the Trainer will not divide this head's loss by N on target version ``tv``; None if it will.

    5.x: BERT-family task heads declare ``**kwargs`` (so ``model_accepts_loss_kwargs`` is True) but compute a plain
    mean loss. 4.46.0–4.47.x: the Trainer does not divide the loss of any model that does not consume
    ``num_items_in_batch`` (all 4.x BERT-family task heads)."""
    if family is None or head not in TASK_HEADS:
        return None
    if tv.at_least("5.0.0"):
        if family not in FAMILIES_5X:
            return None
        if family == "modernbert" and head in MODERNBERT_EXACT:
            return None
        return "5x"
    if tv.between("4.46.0", "4.48.0"):
        if family == "modernbert":
            return None
        return "446"
    return None


def model_phrase(model) -> str:
    if model is None:
        return "the model"
    cls = model.class_name or model.declared_class or "the model"
    if model.declared_class and model.declared_class.startswith("AutoModel") and model.checkpoint:
        return f"`{cls}` (`{model.declared_class}.from_pretrained({model.checkpoint!r})`)"
    return f"`{cls}`"


def fmt(v) -> str:
    if v is UNKNOWN:
        return "unknown"
    return repr(v) if isinstance(v, str) else str(v)


def calls_super_compute_loss(fdef: cst.FunctionDef) -> bool:
    text = code_of(fdef)
    return "super().compute_loss(" in text or "super(" in text and ".compute_loss(" in text


def reads_name(fdef: cst.FunctionDef, name: str) -> bool:
    """``name`` occurs in the body (not only in the signature)."""
    found = []

    class V(cst.CSTVisitor):
        def visit_Name(self, node):
            if node.value == name:
                found.append(node)

        def visit_Parameters(self, node):
            return False

    walk(fdef.body, V())
    return bool(found)


def param_names(fdef: cst.FunctionDef) -> tuple[set, bool]:
    p = fdef.params
    names = {x.name.value for x in (*p.posonly_params, *p.params, *p.kwonly_params)}
    has_kwargs = p.star_kwarg is not None
    return names, has_kwargs


# ---------------------------------------------------------------------------------------------------------------
# activation checkpointing (REFERENCE §1.7, §3.1)

TRAINER_ONLY_KEYS = ("every_n_layers", "offload")


def reentrant_of(kwargs, tv, via: str):
    """Whether checkpointing is reentrant. ``via``: "trainer" (TrainingArguments) or "model" (an enable call).
    Returns (True | False | None, reason text)."""
    if kwargs is UNKNOWN:
        return None, "kwargs not statically known"
    if via == "trainer" and isinstance(kwargs, dict):
        rest = {k: v for k, v in kwargs.items() if k not in TRAINER_ONLY_KEYS}
        kwargs = rest or None
    if kwargs is None:
        if tv.at_least("5.0.0"):
            return False, f"no kwargs: {tv.describe()} uses `use_reentrant=False`"
        return True, f"no kwargs: {tv.describe()} uses `use_reentrant=True`"
    if not isinstance(kwargs, dict):
        return None, "kwargs not a dict"
    if "use_reentrant" in kwargs:
        v = kwargs["use_reentrant"]
        if v is True:
            return True, "`use_reentrant=True` passed"
        if v is False:
            return False, "`use_reentrant=False` passed"
        return None, "use_reentrant not statically known"
    return True, "a kwargs dict without `use_reentrant` replaces transformers' default and torch falls back to reentrant"


def checkpointing_sites(setup, tv, launch: bool = False):
    """[(node, kwargs, via, reentrant, reason)] for one TrainingSetup: TrainingArguments flags and enable calls.
    ``launch``: also a flag that comes from the command line (``HfArgumentParser`` / argparse, not known statically)
    when the script itself reads it (``if training_args.gradient_checkpointing:``): via "launch", judged with the
    other fields at their defaults, for findings that say "when launched with --gradient_checkpointing"."""
    out = []
    a, m = setup.args, setup.model
    if m is not None:
        for c in m.checkpointing:
            r, why = reentrant_of(c.kwargs, tv, "model")
            out.append((c.node, c.kwargs, "model", r, why))
    if a is not None:
        for flag, kw in (("gradient_checkpointing", "gradient_checkpointing_kwargs"),
                         ("activation_checkpointing", "activation_checkpointing_kwargs")):
            if a.get(flag) is True:
                kws = a.get(kw)
                if flag == "gradient_checkpointing" and a.setting(kw) is None and a.setting("activation_checkpointing_kwargs") is not None:
                    kws = a.get("activation_checkpointing_kwargs")
                if kws is UNKNOWN and a.runtime_cli and not a.open_ended and a.setting(kw) is None:
                    kws = None  # parsed at launch and not set in the script: judged at its default, as launch is
                r, why = reentrant_of(kws, tv, "trainer")
                out.append((a.keyword_node(flag) or a.node, kws, "trainer", r, why))
    if launch and a is not None and not out:
        for flag in ("gradient_checkpointing", "activation_checkpointing"):
            read = a.reads.get(flag)
            if a.get(flag) is UNKNOWN and read is not None and (a.runtime_cli or a.origin(flag).startswith("argparse")):
                kws = a.get(flag + "_kwargs")
                if kws is UNKNOWN:
                    kws = None  # judged at its default, as the flag's own launch is
                r, why = reentrant_of(kws, tv, "trainer")
                out.append((read, kws, "launch", r, why))
                break
    trainer_sites = [x for x in out if x[2] == "trainer"]
    if trainer_sites and setup.trainer is not None:
        # Trainer.train() enables checkpointing again with the TrainingArguments kwargs: those win
        return trainer_sites[-1:]
    return out


def collator_batch_keys(ctx, call: cst.Call) -> Optional[frozenset]:
    """The keys of the batches the ``data_collator`` of the Trainer construction ``call`` returns, when the collator is
    a class or function of this file whose every ``return`` hands back a dict built here with literal keys
    (``return {"input_ids": ..., ...}``, ``batch = {...}; batch["x"] = ...; return batch``, ``dict(input_ids=...)``).
    None whenever that is not known (no collator given: the default collators pass the dataset's columns through; a
    collator of another package; a return the reading cannot follow)."""
    from bertlint.analysis.symbols import dotted, kwarg, positional

    expr = kwarg(call, "data_collator")
    if expr is None and (dotted(call.func) or "").split(".")[-1] in ("Trainer", "Seq2SeqTrainer"):
        expr = positional(call, 2)
    if expr is None:
        return None
    fn = None
    target = expr
    if isinstance(expr, cst.Name):
        assigns = ctx.symbols.assignments.get(expr.value, [])
        if len(assigns) == 1 and isinstance(assigns[0].value, cst.Call):
            target = assigns[0].value
        elif not assigns:
            defs = ctx.symbols.functions.get(expr.value, [])
            fn = defs[0] if len(defs) == 1 else None
            if fn is None:
                return None
    if fn is None:
        if not isinstance(target, cst.Call) or not isinstance(target.func, cst.Name):
            return None
        cls = ctx.symbols.classes.get(target.func.value)
        if cls is None:
            return None
        body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
        calls = [s for s in body if isinstance(s, cst.FunctionDef) and s.name.value == "__call__"]
        if len(calls) != 1:
            return None  # an inherited __call__ (DataCollatorWithPadding ...): not read here
        fn = calls[0]
    return _returned_dict_keys(fn)


def _literal_dict_keys(value: cst.BaseExpression) -> Optional[set]:
    if isinstance(value, cst.Dict):
        keys = set()
        for el in value.elements:
            if not isinstance(el, cst.DictElement) or not isinstance(el.key, cst.SimpleString):
                return None  # ``**other`` or a computed key
            keys.add(el.key.evaluated_value)
        return keys
    if isinstance(value, cst.Call) and isinstance(value.func, cst.Name) and value.func.value == "dict":
        keys = set()
        for a in value.args:
            if a.keyword is None:
                return None
            keys.add(a.keyword.value)
        return keys
    return None


def _returned_dict_keys(fn: cst.FunctionDef) -> Optional[frozenset]:
    """Every ``return`` of ``fn`` (nested functions excluded) gives a dict of literal keys: their union, plus the keys
    written later with ``name["key"] = ...`` into a returned name; None otherwise."""
    returns, assigns, subs, other_writes = [], {}, {}, set()

    class V(cst.CSTVisitor):
        depth = 0

        def visit_FunctionDef(self, node):
            self.depth += 1
            return self.depth == 1

        def leave_FunctionDef(self, node):
            self.depth -= 1

        def visit_Lambda(self, node):
            return False

        def visit_Return(self, node):
            returns.append(node.value)

        def visit_Assign(self, node):
            for t in node.targets:
                tg = t.target
                if isinstance(tg, cst.Name):
                    assigns.setdefault(tg.value, []).append(node.value)
                elif isinstance(tg, cst.Subscript) and isinstance(tg.value, cst.Name):
                    sl = tg.slice
                    key = None
                    if len(sl) == 1 and isinstance(sl[0].slice, cst.Index) and isinstance(sl[0].slice.value, cst.SimpleString):
                        key = sl[0].slice.value.evaluated_value
                    if key is None:
                        other_writes.add(tg.value.value)
                    else:
                        subs.setdefault(tg.value.value, set()).add(key)

        def visit_Call(self, node):
            f = node.func
            if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.attr.value in (
                    "update", "setdefault", "__setitem__"):
                other_writes.add(f.value.value)

    fn.body.visit(V())
    if not returns:
        return None
    keys: set = set()
    for r in returns:
        if r is None:
            return None
        if isinstance(r, cst.Name):
            vals = assigns.get(r.value, [])
            if len(vals) != 1 or r.value in other_writes:
                return None
            k = _literal_dict_keys(vals[0])
            if k is None:
                return None
            keys |= k | subs.get(r.value, set())
        else:
            k = _literal_dict_keys(r)
            if k is None:
                return None
            keys |= k
    return frozenset(keys)
