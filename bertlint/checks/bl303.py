"""BL303 reentrant-checkpointing-frozen-inputs: reentrant checkpointing whose inputs come from frozen modules (frozen
embeddings, PEFT) with no input-grad hook: the checkpointed layers get no gradient (REFERENCE §1.7,
``exp_checkpointing.out`` [3], ``exp_peft_checkpointing.out``: LoRA-B with a gradient 4/4 -> 0/4).

transformers ≥ 5.0 installs the input-grad hook itself for text models, so only < 5.0 is reported."""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from bertlint.analysis.symbols import code_of, dotted, literal

from bertlint.analysis.versions import severity_for
from bertlint.checks._trainer import checkpointing_sites
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL303", "reentrant-checkpointing-frozen-inputs", Severity.ERROR,
      "reentrant checkpointing with frozen inputs and no input-grad hook: checkpointed layers get no gradient")
def check(ctx) -> None:
    if "checkpointing" not in ctx.source:
        return
    if "enable_gradient_checkpointing" in ctx.source and "diffusers" in ctx.source:
        _diffusers(ctx)
    _transformers(ctx)


# diffusers blocks call torch.utils.checkpoint.checkpoint without use_reentrant (reentrant) before 0.17.0; from 0.17.0
# on they pass use_reentrant=False on torch >= 1.11 (huggingface/diffusers#3404, merged 2023-05-16: "Fix gradient
# checkpointing bugs in freezing part of models (requires_grad=False)")
DIFFUSERS_NON_REENTRANT = "0.17.0"
_OPTIMIZER = re.compile(r"(adam|sgd|lion|adafactor|lamb|prodigy|optim)", re.IGNORECASE)


def _diffusers(ctx) -> None:
    """A diffusers model frozen with ``requires_grad_(False)`` that then receives trainable parameters (a function of
    it whose result goes to the optimizer: LoRA injected into it), with ``enable_gradient_checkpointing()`` on a
    diffusers release whose blocks checkpoint reentrantly: the hidden states entering each checkpointed block come
    from frozen layers, so nothing inside the blocks (the injected weights) gets a gradient."""
    from bertlint.analysis.versions import severity_for

    tv = ctx.versions.get("diffusers")
    lowest = getattr(tv, "lowest", None)
    if tv.below(DIFFUSERS_NON_REENTRANT):
        era, sev = tv.describe(), severity_for(Severity.ERROR, tv)
    elif lowest is not None and lowest < (0, 17) and not tv.assumed:
        era = (f"diffusers {'.'.join(map(str, lowest))}–0.16, which `diffusers{tv.spec}` ({tv.source.split(' in ')[-1]}) "
               f"allows")
        sev = Severity.WARNING
    else:
        return
    calls = ctx.index.of(cst.Call)
    for call in calls:
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value == "enable_gradient_checkpointing"):
            continue
        recv = dotted(call.func.value)
        built = _diffusers_model(ctx, recv) if recv else None
        if built is None:
            continue
        freeze = next((c for c in calls if isinstance(c.func, cst.Attribute) and
                       c.func.attr.value == "requires_grad_" and dotted(c.func.value) == recv and c.args and
                       literal(c.args[0].value) is False), None)
        if freeze is None:
            continue
        inject = _injection(ctx, calls, recv, freeze)
        if inject is None:
            continue
        row = lambda n: ctx.span(n)[0].row  # noqa: E731
        when, this_sev = "", sev
        if built is False:
            # one branch builds the project's own class, whose checkpoint calls are its own: only the diffusers
            # branch is known to checkpoint reentrantly
            when = (f"When `{recv}` is built from a diffusers class (another assignment builds it from a class that "
                    f"is not diffusers', whose blocks checkpoint as its own code does): ")
            this_sev = Severity.WARNING
        ctx.report(
            call,
            f"{when}`{recv}` is frozen (`{code_of(freeze).strip()}`, line {row(freeze)}) and then given trainable weights "
            f"(`{code_of(inject).strip()[:80]}`, line {row(inject)}, whose result goes to the optimizer); on {era} "
            f"`enable_gradient_checkpointing()` makes its blocks call `torch.utils.checkpoint.checkpoint` reentrantly "
            f"(no `use_reentrant` argument), and a reentrant checkpoint only back-propagates into a block when one of "
            f"its tensor inputs requires grad — the hidden states come from the frozen layers, so the weights injected "
            f"inside the checkpointed blocks get no gradient (they stay at their initial values; torch warns `None "
            f"of the inputs have requires_grad=True`). diffusers >= {DIFFUSERS_NON_REENTRANT} passes "
            f"`use_reentrant=False` (huggingface/diffusers#3404). Fix: require diffusers>={DIFFUSERS_NON_REENTRANT}, "
            f"or make the first block's input require grad, or do not enable checkpointing on the frozen model.",
            severity=this_sev,
        )


def _diffusers_model(ctx, name: str):
    """The assignment building ``name`` from a diffusers class, or None. ``False`` when another assignment builds it
    from a class that is not diffusers' (``UNet3DConditionModel.from_pretrained_2d(...)`` of the project, whose blocks
    call the checkpoint as that code does: AnimateDiff's motion modules pass ``hidden_states.requires_grad_()``)
    while one builds a diffusers model: the verdict then holds only for the diffusers branch. Wrappers of the model
    itself (``unet = DDP(unet)``, ``accelerator.prepare(unet)``) build nothing."""
    diff, other = None, False
    for a in ctx.symbols.assignments.get(name, []):
        v = a.value
        if not isinstance(v, cst.Call):
            continue
        if any(dotted(x.value) == name for x in v.args) or (isinstance(v.func, cst.Attribute) and
                                                              dotted(v.func.value) == name):
            continue  # wraps or moves the model itself
        f = v.func.value if isinstance(v.func, cst.Attribute) and v.func.attr.value.startswith("from_") else v.func
        q = ctx.symbols.qualname(f) if isinstance(f, (cst.Name, cst.Attribute)) else None
        if q and q.startswith("diffusers."):
            diff = diff or a
        else:
            other = True
    if diff is not None and other:
        return False
    return diff


def _injection(ctx, calls, recv: str, freeze) -> Optional[cst.Call]:
    """A call after the freeze that takes ``recv`` as an argument and whose result (through names) is handed to an
    optimizer: trainable parameters made inside the frozen model (LoRA injection)."""
    after = ctx.span(freeze)[0].row
    opt_args = []
    for c in calls:
        name = (dotted(c.func) or "") if isinstance(c.func, (cst.Name, cst.Attribute)) else ""
        target = None
        p = ctx.index.parent(c)
        if isinstance(p, cst.Assign) and len(p.targets) == 1:
            target = code_of(p.targets[0].target)
        if (_OPTIMIZER.search(name.rsplit(".", 1)[-1]) or (target and "optim" in target.lower())) and c.args:
            opt_args.append(c.args[0].value)
    if not opt_args:
        return None
    for c in calls:
        if ctx.span(c)[0].row <= after or not any(dotted(a.value) == recv for a in c.args):
            continue
        if isinstance(c.func, cst.Attribute) and c.func.attr.value in ("requires_grad_", "to", "enable_gradient_checkpointing"):
            continue
        last = ((dotted(c.func) or "") if isinstance(c.func, (cst.Name, cst.Attribute)) else "").rsplit(".", 1)[-1]
        if last in _WRAPPERS:
            continue  # `unet = DDP(unet, ...)`: wraps the model, adds no trainable weights
        p = ctx.index.parent(c)
        if not isinstance(p, cst.Assign):
            continue
        names = set()
        for t in p.targets:
            names |= _names(t.target)
        names.discard("_")
        if names and any(_reaches(ctx, e, names) for e in opt_args):
            return c
    return None


# calls that wrap or place a model without adding parameters to it
_WRAPPERS = {"DDP", "DistributedDataParallel", "DataParallel", "FSDP", "FullyShardedDataParallel", "compile",
             "prepare", "prepare_model", "cuda", "half", "float", "bfloat16", "train", "eval"}


def _names(node) -> set:
    out = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, n):
            out.add(n.value)

    node.visit(V())
    return out


def _reaches(ctx, expr, names: set, depth: int = 0) -> bool:
    """``expr`` uses one of ``names``, directly or through the assignments of the names it uses (3 levels)."""
    used = _names(expr)
    if used & names:
        return True
    if depth >= 3:
        return False
    return any(_reaches(ctx, a.value, names, depth + 1) for n in used for a in ctx.symbols.assignments.get(n, [])[:3])


def _transformers(ctx) -> None:
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
    for s in _setups(ctx):
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


def _setups(ctx) -> list:
    """The Trainer set-ups, then every model the file builds outside them whose own checkpointing call is known
    (a LightningModule's ``self.model``, a hand-written loop's model): enabling checkpointing on a PEFT model is
    training set-up wherever the loop is, and the model's reentrancy does not depend on who runs the steps."""
    from bertlint.analysis.setup import TrainingSetup

    fs = ctx.setup
    out = list(fs.setups)
    have = {id(s.model) for s in out if s.model is not None}
    have_nodes = {id(s.model.node) for s in out if s.model is not None and s.model.node is not None}
    for m in fs.models:
        if id(m) in have or (m.node is not None and id(m.node) in have_nodes) or not m.checkpointing:
            continue
        out.append(TrainingSetup("model", m.node, None, None, m))
    return out


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
