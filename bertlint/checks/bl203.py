"""BL203 conflicting-precision-flags: ``fp16=True`` and ``bf16=True`` together in TrainingArguments
(``__post_init__`` raises ValueError; REFERENCE §1.8)."""

from __future__ import annotations

from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL203", "conflicting-precision-flags", Severity.ERROR, "fp16=True and bf16=True together")
def check(ctx) -> None:
    if "bf16" not in ctx.source or "fp16" not in ctx.source:
        return
    for ta in ctx.setup.training_args:
        if ta.get("fp16") is True and ta.get("bf16") is True:
            node = ta.keyword_node("bf16") or ta.keyword_node("fp16") or ta.node
            ctx.report(
                node,
                f"`{ta.class_name}` sets both `fp16=True` ({ta.origin('fp16')}) and `bf16=True` "
                f"({ta.origin('bf16')}): the two mixed-precision modes exclude each other and TrainingArguments "
                f"raises `ValueError` at construction. Fix: keep one — `bf16=True` on hardware that supports it "
                f"(Ampere or newer), else `fp16=True`.",
            )
