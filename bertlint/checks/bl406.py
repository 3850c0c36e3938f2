"""BL406 eval-logits-kept-on-device: Trainer evaluation of a token-level head with ``compute_metrics`` and nothing that
bounds the stored logits (REFERENCE §1.9: every batch's B×L×V logits stay on the device until the end of eval)."""

from __future__ import annotations

import libcst as cst

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
        # arguments parsed at launch (HfArgumentParser / argparse) and not set in the script are judged at their
        # defaults, as the launch does when the flag is not given; the finding then names the flags it needs
        launch = a.runtime_cli and not a.open_ended
        guards = [_at_launch(a, k, launch) for k in ("eval_accumulation_steps", "batch_eval_metrics",
                                                      "prediction_loss_only")]
        if any(g is UNKNOWN_ or (g not in (None, False)) for g in guards):
            continue
        strategy = a.get("eval_strategy")
        condition = ""
        evaluates = strategy in ("steps", "epoch") or (
            ti.var is not None and (f"{ti.var}.evaluate(" in ctx.source or f"{ti.var}.predict(" in ctx.source))
        if not evaluates and strategy is UNKNOWN_ and launch and a.setting("eval_strategy") is None \
                and _passes_eval_dataset(ti.node):
            # compute_metrics and an eval set handed over: the script evaluates whenever it is launched with an
            # evaluation strategy
            evaluates, condition = True, " when launched with `--eval_strategy steps` or `epoch`"
        if not evaluates:
            continue
        vocab = (m.architecture or {}).get("vocab_size")
        size = "B × L × vocab"
        extra = f" (vocab {vocab})" if vocab else ""
        ctx.report(
            ti.node,
            f"Evaluation of {f'`{m.class_name}`' if m.class_name else f'the `*{m.head}` model'} with `compute_metrics`{condition}: the Trainer keeps every eval batch's "
            f"{size}{extra} logits on the device and concatenates them until evaluation ends, so device memory grows "
            f"with the eval set and evaluation can run out of memory after training fit. Fix: "
            f"`preprocess_logits_for_metrics=lambda logits, labels: logits.argmax(-1)`, or "
            f"`eval_accumulation_steps=k` (moves them to host memory every k steps), or `batch_eval_metrics=True`"
            + (" (none is set in the script; the launch flag `--eval_accumulation_steps k` also bounds them)." if launch else "."),
        )


def _at_launch(a, name: str, launch: bool):
    if launch and a.setting(name) is None:
        return a.default(name)
    return a.get(name)


def _passes_eval_dataset(call) -> bool:
    """``Trainer(..., eval_dataset=X)`` with X not the literal None."""
    for arg in getattr(call, "args", ()):
        if arg.keyword is not None and arg.keyword.value == "eval_dataset":
            return not (isinstance(arg.value, cst.Name) and arg.value.value == "None")
    return False

