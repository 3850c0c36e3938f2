"""BL304 reentrant-checkpointing-find-unused: reentrant checkpointing with DDP ``find_unused_parameters=True``
(``exp_ddp_checkpoint.out``: RuntimeError "Expected to mark a variable ready only once").

Two ways to get ``find_unused_parameters=True``:

* ``ddp_find_unused_parameters=True`` given;
* not given, and the model handed to the Trainer is not a ``PreTrainedModel`` (a PEFT ``get_peft_model`` wrapper):
  the Trainer then passes ``find_unused_parameters=True`` itself (``_build_accelerator_args`` in 5.x,
  ``_wrap_model`` in 4.x: ``elif isinstance(model, PreTrainedModel): not checkpointing; else: True``). Reported
  only when the script is written to run under DDP (it reads ``LOCAL_RANK`` / ``WORLD_SIZE`` / ``local_rank`` or sets
  up a process group) and not for DeepSpeed (which does not use DDP), as a warning "when launched with several
  processes".
"""

from __future__ import annotations

import re

from bertlint.analysis.symbols import UNKNOWN
from bertlint.checks._trainer import checkpointing_sites
from bertlint.registry import rule
from bertlint.types import Severity

_DDP_HINT = re.compile(r"LOCAL_RANK|WORLD_SIZE|\blocal_rank\b|init_process_group|torchrun")


def _set_elsewhere(ctx) -> bool:
    """``training_args.ddp_find_unused_parameters = ...`` / ``setattr(args, "ddp_find_unused_parameters", ...)``."""
    for target in ctx.symbols.assignments:
        if target.rsplit(".", 1)[-1] == "ddp_find_unused_parameters":
            return True
    return "\"ddp_find_unused_parameters\"" in ctx.source or "'ddp_find_unused_parameters'" in ctx.source


@rule("BL304", "reentrant-checkpointing-find-unused", Severity.ERROR,
      "reentrant checkpointing with DDP find_unused_parameters=True")
def check(ctx) -> None:
    explicit_src = "find_unused_parameters" in ctx.source
    # a script written for DeepSpeed (it imports or reads it) does not run the Trainer's DDP wrapper: not implicit
    implicit_src = "peft" in ctx.source and "checkpointing" in ctx.source and _DDP_HINT.search(ctx.source) and \
        "deepspeed" not in ctx.source.lower()
    if not explicit_src and not implicit_src:
        return
    tv = ctx.versions.transformers
    for s in ctx.setup.setups:
        a = s.args
        if a is None:
            continue
        value = a.get("ddp_find_unused_parameters")
        if value is True:
            for node, kwargs, via, reentrant, why in checkpointing_sites(s, tv):
                if reentrant is not True:
                    continue
                ctx.report(
                    a.keyword_node("ddp_find_unused_parameters") or a.node,
                    f"`ddp_find_unused_parameters=True` with reentrant activation checkpointing ({why}): under DDP "
                    f"the reentrant backward marks the checkpointed parameters ready twice and training fails with "
                    f"`RuntimeError: Expected to mark a variable ready only once`. Fix: drop "
                    f"`ddp_find_unused_parameters` (the Trainer turns it off when checkpointing is on) or use "
                    f"`gradient_checkpointing_kwargs={{\"use_reentrant\": False}}`.",
                )
                break
            continue
        if not implicit_src or s.trainer is None:
            continue
        m = s.model
        if m is None or not m.peft or a.setting("ddp_find_unused_parameters") is not None or _set_elsewhere(ctx):
            continue
        if value is not UNKNOWN and value is not None:
            continue
        cli = value is UNKNOWN  # parsed at launch: `--ddp_find_unused_parameters False` would fix it
        for node, kwargs, via, reentrant, why in checkpointing_sites(s, tv, launch=True):
            if reentrant is not True:
                continue
            how = (" and without `--ddp_find_unused_parameters False`" if cli else "")
            ctx.report(
                s.trainer.node,
                f"When launched with several processes (the script reads the process rank){how}: the model given to "
                f"the Trainer is a PEFT wrapper, not a `PreTrainedModel`, and `ddp_find_unused_parameters` is not "
                f"set, so the Trainer wraps it in DDP with `find_unused_parameters=True` "
                f"(`isinstance(model, PreTrainedModel)` fails; {tv.describe()}); with reentrant activation "
                f"checkpointing ({why}) the reentrant backward marks the checkpointed parameters ready twice and "
                f"training fails with `RuntimeError: Expected to mark a variable ready only once`. Fix: "
                f"`ddp_find_unused_parameters=False` in the TrainingArguments, or "
                f"`gradient_checkpointing_kwargs={{\"use_reentrant\": False}}`.",
                severity=Severity.WARNING,
            )
            break
