"""BL406 eval-logits-kept-on-device: Trainer evaluation of a token-level head with ``compute_metrics`` and nothing that
bounds the stored logits (REFERENCE §1.9: every batch's B×L×V logits stay on the device until the end of eval)."""

from __future__ import annotations

from bertlint.analysis.setup import TOKEN_LEVEL_HEADS

# heads whose logits have one column per vocabulary entry (B × L × V): token classification has a handful of labels
# per token, small enough not to be reported
_VOCAB_HEADS = TOKEN_LEVEL_HEADS - {"ForTokenClassification"}
from bertlint.analysis.symbols import UNKNOWN as UNKNOWN_
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL406", "eval-logits-kept-on-device", Severity.WARNING,
      "Trainer evaluation of token-level heads with compute_metrics and no eval_accumulation_steps / "
      "preprocess_logits_for_metrics")
def check(ctx) -> None:
    if "compute_metrics" not in ctx.source:
        return
    for ti in ctx.setup.trainers:
        a, m = ti.args, ti.model
        if a is None or m is None or ti.compute_metrics is None or m.head not in _VOCAB_HEADS:
            continue
        if ti.preprocess_logits_for_metrics is not None:
            continue
        guards = [a.get("eval_accumulation_steps"), a.get("batch_eval_metrics"), a.get("prediction_loss_only")]
        if any(g is UNKNOWN_ or (g not in (None, False)) for g in guards):
            continue
        strategy = a.get("eval_strategy")
        evaluates = strategy in ("steps", "epoch") or (
            ti.var is not None and (f"{ti.var}.evaluate(" in ctx.source or f"{ti.var}.predict(" in ctx.source))
        if not evaluates:
            continue
        vocab = (m.architecture or {}).get("vocab_size")
        size = "B × L × vocab"
        extra = f" (vocab {vocab})" if vocab else ""
        ctx.report(
            ti.node,
            f"Evaluation of `{m.class_name}` with `compute_metrics`: the Trainer keeps every eval batch's "
            f"{size}{extra} logits on the device and concatenates them until evaluation ends, so device memory grows "
            f"with the eval set and evaluation can run out of memory after training fit. Fix: "
            f"`preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1)`, or "
            f"`eval_accumulation_steps=k` (moves them to host memory every k steps), or `batch_eval_metrics=True`.",
        )

