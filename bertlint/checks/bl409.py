"""BL409 auto-find-batch-size-changes-effective-batch: on an OOM the Trainer retries with the batch × 0.9 but keeps
the accumulation steps, so the effective batch silently shrinks (REFERENCE §1.11)."""

from __future__ import annotations

from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL409", "auto-find-batch-size-changes-effective-batch", Severity.INFO,
      "auto_find_batch_size=True silently lowers the effective batch")
def check(ctx) -> None:
    if "auto_find_batch_size" not in ctx.source:
        return
    for ta in ctx.setup.training_args:
        if ta.get("auto_find_batch_size") is not True:
            continue
        b, n = ta.int("per_device_train_batch_size"), ta.int("gradient_accumulation_steps")
        now = f"{b} × {n} = {b * n} per process" if b and n else "per-device batch × accumulation"
        after = f"; after one retry it is {int(b * 0.9)} × {n} = {int(b * 0.9) * n}" if b and n and int(b * 0.9) else ""
        ctx.report(
            ta.keyword_node("auto_find_batch_size") or ta.node,
            f"`auto_find_batch_size=True`: on an out-of-memory error the Trainer multiplies the per-device batch by "
            f"0.9 and restarts, but leaves gradient_accumulation_steps unchanged, so the effective batch ({now}) "
            f"shrinks without notice{after}; a learning rate or schedule tuned for the original batch no longer "
            f"matches, and a `max_steps` derived from epochs grows. Fix: choose the batch explicitly and raise "
            f"gradient_accumulation_steps to keep the effective batch.",
        )
