"""BL303 reentrant-checkpointing-frozen-inputs: reentrant checkpointing whose inputs come from frozen modules (frozen
embeddings, PEFT) with no input-grad hook: the checkpointed layers get no gradient (REFERENCE §1.7,
``exp_checkpointing.out`` [3], ``exp_peft_checkpointing.out``: LoRA-B with a gradient 4/4 -> 0/4).

transformers ≥ 5.0 installs the input-grad hook itself for text models, so only < 5.0 is reported."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.versions import severity_for
from bertlint.checks._trainer import checkpointing_sites
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL303", "reentrant-checkpointing-frozen-inputs", Severity.ERROR,
      "reentrant checkpointing with frozen inputs and no input-grad hook: checkpointed layers get no gradient")
def check(ctx) -> None:
    if "checkpointing" not in ctx.source:
        return
    tv = ctx.versions.transformers
    era = None
    if tv.at_least("5.0.0"):
        era = _written_for_4x(ctx) if tv.assumed else None
        if era is None:
            return
        # no pin: bertlint's own 5.x says nothing about the script; the script itself shows its era
        from bertlint.analysis.versions import TargetVersion

        before, why = era
        last = (4, 50, 0) if before == "4.51.0" else (4, 57, 1)
        tv = TargetVersion("transformers", last, f"the releases before {before} the script was written for: {why}; "
                           f"no pin near the script", exact=False)
    for s in ctx.setup.setups:
        m = s.model
        if m is None or m.input_require_grads or (m.family is None and not m.from_pretrained):
            continue
        frozen = None
        if m.frozen_inputs:
            frozen = "the embeddings are frozen (`requires_grad=False`)"
        elif m.peft or m.kbit:
            frozen = "PEFT freezes the base model, embeddings included"
        if frozen is None:
            continue
        if (m.peft or m.kbit) and m.peft_node is not None and not m.frozen_inputs:
            fs = ctx.setup
            peft_at = fs.order_of(m.peft_node)
            # PEFT installs the input-grad hook when checkpointing was already on when it wrapped the model
            if any(0 <= fs.order_of(c.node) < peft_at for c in m.checkpointing):
                continue
        if m.kbit and not m.peft:
            continue  # prepare_model_for_kbit_training enables checkpointing and the input-grad hook itself
        if m.kbit_prep is not None and not _prep_without_checkpointing(m.kbit_prep):
            continue  # prepare_model_for_kbit/int8_training installs the input-grad hook (use_gradient_checkpointing)
        for node, kwargs, via, reentrant, why in checkpointing_sites(s, tv, launch=True):
            if reentrant is not True:
                continue
            when = ""
            sev = severity_for(Severity.ERROR, tv) if era is None else Severity.WARNING
            if via == "launch":
                flag = node.attr.value if isinstance(node, cst.Attribute) else "gradient_checkpointing"
                when = (f"When launched with `--{flag} True` (the flag comes from the command line, and the script "
                        f"reads `{ctx.module.code_for_node(node)}`): ")
                sev = Severity.WARNING
            ctx.report(
                node,
                f"{when}Reentrant activation checkpointing ({why}) while {frozen}, and no input-grad hook: the hidden "
                f"states entering each checkpointed layer do not require grad, so the layers inside it (encoder "
                f"weights, LoRA adapters) get no gradient — only the warning `None of the inputs have "
                f"requires_grad=True. Gradients will be None` shows it. Fix: "
                f"`gradient_checkpointing_kwargs={{\"use_reentrant\": False}}`, or call "
                f"`model.enable_input_require_grads()` before training.",
                severity=sev,
            )
            break


def _prep_without_checkpointing(call) -> bool:
    """``prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)``: no input-grad hook then. A value
    not known statically (``use_gradient_checkpointing=args.gradient_checkpointing``, usually the very flag that turns
    checkpointing on) is not taken for False: the hook is installed whenever it is true."""
    from bertlint.analysis.symbols import kwarg, literal

    e = kwarg(call, "use_gradient_checkpointing")
    return e is not None and literal(e) is False


def _written_for_4x(ctx):
    """(first release without it, why) when the script was written for transformers 4.x, from what it passes
    (keywords removed in 4.51 / 5.0 that a 5.x script could not use); None otherwise."""
    from bertlint.checks.bl407 import REMOVED, TRAINER_REMOVED

    for ta in ctx.setup.training_args:
        for name in ta.explicit:
            if name in REMOVED and REMOVED[name][0] in ("4.51.0", "5.0.0"):
                return REMOVED[name][0], f"it passes `{name}=`, removed in transformers {REMOVED[name][0]}"
    for ti in ctx.setup.trainers:
        for a in ti.node.args:
            if a.keyword is not None and a.keyword.value in TRAINER_REMOVED:
                return "5.0.0", f"it passes `Trainer({a.keyword.value}=...)`, removed in transformers 5.0.0"
    return None
