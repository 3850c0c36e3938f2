"""BL401 effective-batch-mismatch: a declared global batch (``total_batch_size = 64``) that differs from
per-device × accumulation × world size of the TrainingArguments in the same file (REFERENCE §1.6)."""

from __future__ import annotations

import re

from bertlint.registry import rule
from bertlint.types import Severity

_DECLARED = re.compile(r"^(effective|global|total)_(train_)?batch(_size)?$", re.IGNORECASE)


@rule("BL401", "effective-batch-mismatch", Severity.WARNING,
      "a declared global batch that differs from per-device × accumulation × world size")
def check(ctx) -> None:
    if "batch" not in ctx.source:
        return
    fs = ctx.setup
    if not fs.training_args:
        return
    declared = []
    for name, assigns in ctx.symbols.assignments.items():
        if not _DECLARED.match(name.split(".")[-1]) or len(assigns) != 1:
            continue
        v = ctx.resolver.int_value(assigns[0].value, assigns[0].func)
        if v and v > 0:
            declared.append((name, v, assigns[0]))
    if not declared:
        return
    world = getattr(ctx.settings, "world_size", None)
    for ta in fs.training_args:
        b, n = ta.int("per_device_train_batch_size"), ta.int("gradient_accumulation_steps")
        if not b or not n or ta.get("auto_find_batch_size") is True:
            continue
        if isinstance(ta.get("accelerator_config"), dict) and ta.get("accelerator_config").get("split_batches"):
            continue
        for name, v, asg in declared:
            text = ctx.module.code_for_node(asg.value)
            if "per_device" in text or "gradient_accumulation" in text:
                continue  # derived from the arguments themselves
            per_proc = b * n
            if world:
                if v == per_proc * world:
                    continue
                why = (f"per-device {b} × accumulation {n} × world size {world} = {per_proc * world} "
                       f"(world size from [tool.bertlint] world-size)")
            else:
                if v % per_proc == 0:
                    continue  # a world size of v / (b × n) would reconcile them
                why = (f"per-device {b} × accumulation {n} = {per_proc} per process, and no whole number of "
                       f"processes makes {v}")
            ctx.report(
                asg.node,
                f"`{name} = {v}` but the TrainingArguments give an effective batch of {why}. The Trainer updates "
                f"with per_device_train_batch_size × gradient_accumulation_steps × world_size examples per step. Fix: "
                f"set gradient_accumulation_steps = {name} // (per_device_train_batch_size × world_size), or correct "
                f"`{name}`.",
            )
