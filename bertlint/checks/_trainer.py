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
