"""BL304 reentrant-checkpointing-find-unused: reentrant checkpointing with DDP ``find_unused_parameters=True``
(``exp_ddp_checkpoint.out``: RuntimeError "Expected to mark a variable ready only once")."""

from __future__ import annotations

from bertlint.checks._trainer import checkpointing_sites
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL304", "reentrant-checkpointing-find-unused", Severity.ERROR,
      "reentrant checkpointing with DDP find_unused_parameters=True")
def check(ctx) -> None:
    if "find_unused_parameters" not in ctx.source:
        return
    tv = ctx.versions.transformers
    for s in ctx.setup.setups:
        a = s.args
        if a is None or a.get("ddp_find_unused_parameters") is not True:
            continue
        for node, kwargs, via, reentrant, why in checkpointing_sites(s, tv):
            if reentrant is not True:
                continue
            ctx.report(
                a.keyword_node("ddp_find_unused_parameters") or a.node,
                f"`ddp_find_unused_parameters=True` with reentrant activation checkpointing ({why}): under DDP the "
                f"reentrant backward marks the checkpointed parameters ready twice and training fails with "
                f"`RuntimeError: Expected to mark a variable ready only once`. Fix: drop "
                f"`ddp_find_unused_parameters` (the Trainer turns it off when checkpointing is on) or use "
                f"`gradient_checkpointing_kwargs={{\"use_reentrant\": False}}`.",
            )
            break
