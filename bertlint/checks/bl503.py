"""BL503 static-padding: ``padding="max_length"`` when tokenizing training data: every example is padded to the
maximum length, so activation memory and compute follow the longest length, not the data."""

from __future__ import annotations

import re

import libcst as cst

from bertlint.analysis.walk import walk

from bertlint.analysis.symbols import call_name, kwarg, literal
from bertlint.registry import rule
from bertlint.types import Severity


class _Calls(cst.CSTVisitor):
    def __init__(self):
        self.calls = []

    def visit_Call(self, node):
        self.calls.append(node)


@rule("BL503", "static-padding", Severity.INFO,
      "padding=\"max_length\" for training data: activations scale with the longest length, not the data")
def check(ctx) -> None:
    src = ctx.source
    if "max_length" not in src or "padding" not in src:
        return
    if not ("Trainer" in src or ".backward(" in src):
        return
    if re.search(r"\b(xla|tpu|onnx|torch_xla)\b", src, re.IGNORECASE):
        return  # static shapes wanted on purpose
    v = _Calls()
    walk(ctx.module, v)
    for call in v.calls:
        e = kwarg(call, "padding")
        if e is None or literal(e) != "max_length":
            continue
        name = (call_name(call) or "").lower()
        if "token" not in name and not name.endswith(("encode_plus", "batch_encode_plus", "encode")):
            continue
        ctx.report(
            e,
            "`padding=\"max_length\"` pads every example to `max_length`, so each micro-batch costs activation "
            "memory and compute for the longest possible sequence instead of its own longest one. Fix: tokenize "
            "with `padding=False` (or `truncation=True` only) and pad per batch with `DataCollatorWithPadding` "
            "(`padding=\"longest\"`); keep static padding only where fixed shapes are required (TPU, export).",
        )
