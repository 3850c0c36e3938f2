"""BL305 renamed-checkpointing-api: transformers 5.23 renamed ``gradient_checkpointing*`` to
``activation_checkpointing*`` (the old names are deprecated aliases with a FutureWarning; removed in v6)."""

from __future__ import annotations

import libcst as cst

from bertlint.registry import rule
from bertlint.types import Applicability, Severity

_METHODS = {
    "gradient_checkpointing_enable": "activation_checkpointing_enable",
    "gradient_checkpointing_disable": "activation_checkpointing_disable",
    "is_gradient_checkpointing": "is_activation_checkpointing",
}
_ARGS = {
    "gradient_checkpointing": "activation_checkpointing",
    "gradient_checkpointing_kwargs": "activation_checkpointing_kwargs",
}


@rule("BL305", "renamed-checkpointing-api", Severity.INFO,
      "gradient_checkpointing* names on transformers that renamed them to activation_checkpointing*",
      fix=Applicability.SAFE)
def check(ctx) -> None:
    if "gradient_checkpointing" not in ctx.source:
        return
    tv = ctx.versions.transformers
    if not tv.at_least("5.23.0"):
        return
    fs = ctx.setup
    for ta in fs.training_args:
        for old, new in _ARGS.items():
            s = ta.setting(old)
            node = s.node if s else None
            if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == old:
                if ta.setting(new) is not None:
                    continue
                ctx.report(
                    node,
                    f"`{old}` is a deprecated alias of `{new}` on {tv.describe()} (renamed in 5.23; a FutureWarning "
                    f"now, removed in v6). Fix: rename it to `{new}`.",
                    fix=ctx.fix(f"Rename to `{new}`", [ctx.edit_replace(node.keyword, new)]),
                )
    seen = set()
    for m in fs.models:
        for c in m.checkpointing:
            if c.method in _METHODS and id(c.node) not in seen and isinstance(c.node.func, cst.Attribute):
                seen.add(id(c.node))
                new = _METHODS[c.method]
                edits = [ctx.edit_replace(c.node.func.attr, new)]
                for a in c.node.args:
                    if a.keyword is not None and a.keyword.value == "gradient_checkpointing_kwargs":
                        edits.append(ctx.edit_replace(a.keyword, "activation_checkpointing_kwargs"))
                ctx.report(
                    c.node,
                    f"`{c.method}()` is a deprecated alias of `{new}()` on {tv.describe()} (renamed in 5.23; "
                    f"removed in v6). Fix: call `{new}()`.",
                    fix=ctx.fix(f"Rename to `{new}`", edits),
                )
