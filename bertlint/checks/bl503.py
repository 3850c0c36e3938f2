"""BL503 static-padding: ``padding="max_length"`` when tokenizing training data: every example is padded to the
maximum length, so activation memory and compute follow the longest length, not the data."""

from __future__ import annotations

import re

import libcst as cst

from bertlint.analysis.symbols import call_name, kwarg, literal
from bertlint.registry import rule
from bertlint.types import Severity


# Names that say the data is not training data (evaluation, validation, test, prediction, inference).
_EVAL_WORDS = re.compile(
    r"(?<![a-z])(eval|valid|val(?![a-z])|dev(?![a-z])|test|predict|infer)", re.IGNORECASE)
_TRAIN_WORDS = re.compile(r"train", re.IGNORECASE)


def _eval_only_text(text: str) -> bool:
    return bool(_EVAL_WORDS.search(text)) and not _TRAIN_WORDS.search(text)


def _code(ctx, node) -> str:
    try:
        return ctx.module.code_for_node(node)
    except Exception:  # pragma: no cover - defensive
        return ""


def _statement(ctx, node):
    for a in ctx.index.ancestors(node):
        if isinstance(a, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            return a
    return None


def _eval_only(ctx, call: cst.Call) -> bool:
    """True when the padded data is visibly evaluation/test data only: the tokenized argument or the assigned name
    says so, or the enclosing function (or class) is named for evaluation, or every place that uses the enclosing
    function names evaluation data only (``raw["test"].map(prepare_features)``)."""
    first = next((a for a in call.args if a.keyword is None and a.star == ""), None)
    if first is not None and _eval_only_text(_code(ctx, first.value)):
        return True
    stmt = _statement(ctx, call)
    if isinstance(stmt, cst.SimpleStatementLine):
        for small in stmt.body:
            if isinstance(small, cst.Assign) and all(_eval_only_text(_code(ctx, t.target)) for t in small.targets):
                return True
    func = None
    for a in ctx.index.ancestors(call):
        if isinstance(a, cst.ClassDef) and _eval_only_text(a.name.value):
            return True
        if isinstance(a, cst.FunctionDef):
            if _eval_only_text(a.name.value):
                return True
            if func is None:
                func = a
    if func is None:
        return False
    uses = []
    for n in ctx.index.of(cst.Name):
        if n.value != func.name.value or n is func.name:
            continue
        s = _statement(ctx, n)
        if s is None or s is func:
            continue
        if any(x is func for x in ctx.index.ancestors(n)):
            continue  # recursion / inner reference
        uses.append(s)
    if not uses:
        return False
    return all(_eval_only_text(_code(ctx, s.body[0] if isinstance(s, cst.SimpleStatementLine) else s))
               if isinstance(s, cst.SimpleStatementLine) else False for s in uses)


@rule("BL503", "static-padding", Severity.INFO,
      "padding=\"max_length\" for training data: activations scale with the longest length, not the data")
def check(ctx) -> None:
    src = ctx.source
    if "max_length" not in src or "padding" not in src:
        return
    if not re.search(r"\.(train|fit|backward)\(|training_step", src):
        return  # nothing here trains: padding for inference or export is not a training cost
    if re.search(r"\b(xla|tpu|onnx|torch_xla)\b", src, re.IGNORECASE):
        return  # static shapes wanted on purpose
    if ctx.symbols.uses("diffusers"):
        # text-to-image diffusion conditions the UNet on the text encoder's full fixed-length prompt embedding
        # (CLIP's 77 positions, padding tokens included, as in its pre-training): the padding is part of the model
        return
    for call in ctx.index.of(cst.Call):
        e = kwarg(call, "padding")
        if e is None or literal(e) != "max_length":
            continue
        name = (call_name(call) or "").lower()
        if "token" not in name and not name.endswith(("encode_plus", "batch_encode_plus", "encode")):
            continue
        if _eval_only(ctx, call):
            continue  # evaluation/test data only: padding there costs no training memory
        ctx.report(
            e,
            "`padding=\"max_length\"` pads every example to `max_length`, so each micro-batch costs activation "
            "memory and compute for the longest possible sequence instead of its own longest one. Fix: tokenize "
            "with `padding=False` (or `truncation=True` only) and pad per batch with `DataCollatorWithPadding` "
            "(`padding=\"longest\"`); keep static padding only where fixed shapes are required (TPU, export).",
        )
