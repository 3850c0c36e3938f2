"""BL504 extra-outputs-in-training: ``output_hidden_states`` / ``output_attentions`` switched on for a model the
Trainer trains: every layer's hidden states / attention maps are returned and kept alive for the whole step."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import kwarg, literal
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL504", "extra-outputs-in-training", Severity.INFO,
      "output_hidden_states / output_attentions switched on in the training forward")
def check(ctx) -> None:
    src = ctx.source
    if "output_hidden_states" not in src and "output_attentions" not in src:
        return
    for ti in ctx.setup.trainers:
        m = ti.model
        if m is None or not isinstance(m.node, cst.Call):
            continue
        cl = ti.compute_loss
        if cl is not None:
            body = ctx.module.code_for_node(cl)
            if "hidden_states" in body or "attentions" in body:
                continue  # used by the loss (distillation, auxiliary losses)
        if ti.compute_loss_func is not None:
            continue
        for key in ("output_hidden_states", "output_attentions"):
            e = kwarg(m.node, key)
            if e is None or literal(e) is not True:
                continue
            what = "every layer's hidden states" if key == "output_hidden_states" else "every layer's attention maps"
            ctx.report(
                e,
                f"`{key}=True` on the model the Trainer trains: each training forward returns {what}, which the "
                f"Trainer never uses for the loss; the outputs stay referenced until the step ends (and "
                f"`output_attentions` also forces the eager attention path, B × heads × L × L per layer). Fix: "
                f"leave it off for training; request it per call where you need it.",
            )
