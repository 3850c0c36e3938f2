"""BL407 removed-training-argument: TrainingArguments / Trainer keywords removed in the target transformers version
(REFERENCE §1.13, ``args_*.txt``, ``exp_removed_args.out``: each raises ``TypeError: ... unexpected keyword``), and the
other side of the same table: keywords the target version does not have *yet* (a pin older than the release that
introduced the name; the dataclass / ``__init__`` rejects it the same way).

Introduction releases (the first release whose ``TrainingArguments`` field list / ``Trainer.__init__`` signature has the
name): ``eval_strategy`` 4.41.0 (``training_args.py`` of the 4.40.2 and 4.41.0 wheels: 4.40.2 has only
``evaluation_strategy``); ``Trainer(processing_class=)`` 4.46.0 (``trainer.py`` of the 4.45.2 and 4.46.0 wheels: 4.45.2
takes ``tokenizer=``); ``average_tokens_across_devices`` 4.47.0 (REFERENCE §1.3); ``use_cache`` 5.0.0 (REFERENCE §1.13,
absent from ``args_4.57.1.txt``); ``activation_checkpointing[_kwargs]`` 5.23.0 (REFERENCE §1.7)."""

from __future__ import annotations

import os

import libcst as cst

from bertlint.analysis.versions import _allows, describe_reaching, parse_version, reaching, severity_for
from bertlint.registry import rule
from bertlint.types import Applicability, Severity

# name -> (first version without it, replacement text or None, keyword to rename to for a safe fix)
REMOVED: dict[str, tuple[str, str | None, str | None]] = {
    "evaluation_strategy": ("4.51.0", "`eval_strategy`", "eval_strategy"),
    "split_batches": ("4.51.0", "`accelerator_config={\"split_batches\": ...}`", None),
    "dispatch_batches": ("4.51.0", "`accelerator_config={\"dispatch_batches\": ...}`", None),
    "use_ipex": ("4.57.0", None, None),
    "warmup_ratio": ("5.15.0", "`warmup_steps=<ratio below 1>` (a float < 1 is a ratio of the total steps)", None),
    "logging_dir": ("5.15.0", "the environment variable `TENSORBOARD_LOGGING_DIR`", None),
    "group_by_length": ("5.2.0", "`train_sampling_strategy=\"group_by_length\"`", None),
    "overwrite_output_dir": ("5.0.0", None, None),
    "no_cuda": ("5.0.0", "`use_cpu`", "use_cpu"),
    "use_mps_device": ("5.0.0", None, None),
    "per_gpu_train_batch_size": ("5.0.0", "`per_device_train_batch_size`", "per_device_train_batch_size"),
    "per_gpu_eval_batch_size": ("5.0.0", "`per_device_eval_batch_size`", "per_device_eval_batch_size"),
    "fp16_backend": ("5.0.0", None, None),
    "half_precision_backend": ("5.0.0", None, None),
    "fp16_opt_level": ("5.0.0", None, None),
    "include_inputs_for_metrics": ("5.0.0", "`include_for_metrics=[\"inputs\"]`", None),
    "include_tokens_per_second": ("5.0.0", None, None),
    "save_safetensors": ("5.0.0", None, None),
    "push_to_hub_token": ("5.0.0", "`hub_token`", "hub_token"),
    "push_to_hub_model_id": ("5.0.0", "`hub_model_id`", "hub_model_id"),
    "push_to_hub_organization": ("5.0.0", "`hub_model_id=\"org/name\"`", None),
    "tpu_num_cores": ("5.0.0", None, None),
    "tpu_metrics_debug": ("5.0.0", None, None),
    "past_index": ("5.0.0", None, None),
    "use_legacy_prediction_loop": ("5.0.0", None, None),
    "adafactor": ("5.0.0", "`optim=\"adafactor\"`", None),
    "torchdynamo": ("5.0.0", "`torch_compile_backend`", "torch_compile_backend"),
    "jit_mode_eval": ("5.0.0", None, None),
    "ray_scope": ("5.0.0", None, None),
    "mp_parameters": ("5.0.0", None, None),
    "fsdp_min_num_params": ("5.0.0", "`fsdp_config={\"min_num_params\": ...}`", None),
    "fsdp_transformer_layer_cls_to_wrap": ("5.0.0", "`fsdp_config={\"transformer_layer_cls_to_wrap\": [...]}`", None),
}
TRAINER_REMOVED = {"tokenizer": ("5.0.0", "`processing_class`", "processing_class")}

# name -> (first version with it, the spelling older releases accept or None, keyword to rename to for a fix)
ADDED: dict[str, tuple[str, str | None, str | None]] = {
    "eval_strategy": ("4.41.0", "`evaluation_strategy`", "evaluation_strategy"),
    "average_tokens_across_devices": ("4.47.0", None, None),
    "use_cache": ("5.0.0", "`model.config.use_cache = ...`", None),
    "activation_checkpointing": ("5.23.0", "`gradient_checkpointing`", "gradient_checkpointing"),
    "activation_checkpointing_kwargs": ("5.23.0", "`gradient_checkpointing_kwargs`", "gradient_checkpointing_kwargs"),
}
TRAINER_ADDED = {"processing_class": ("4.46.0", "`tokenizer`", "tokenizer")}


def _message(kind: str, name: str, removed: str, repl, on: str) -> str:
    what = f"`{kind}({name}=...)`"
    fix = f"use {repl} instead" if repl else "remove it (no replacement)"
    return (
        f"{what} was removed in transformers {removed}; on {on} it raises "
        f"`TypeError: {kind}.__init__() got an unexpected keyword argument '{name}'`. Fix: {fix}."
    )


def _added_message(kind: str, name: str, added: str, older, on: str) -> str:
    what = f"`{kind}({name}=...)`"
    fix = (f"use {older} (the spelling before {added})" if older else f"remove it") + f", or raise the pin to >={added}"
    return (
        f"{what} exists only from transformers {added}; on {on} it raises "
        f"`TypeError: {kind}.__init__() got an unexpected keyword argument '{name}'`. Fix: {fix}."
    )


@rule(
    "BL407",
    "removed-training-argument",
    Severity.ERROR,
    "TrainingArguments / Trainer keywords removed in the targeted transformers version",
    fix=Applicability.SAFE,
)
def check(ctx) -> None:
    if "TrainingArguments" not in ctx.source and "Trainer" not in ctx.source:
        return
    fs = ctx.setup
    tv = ctx.versions.transformers
    sev = severity_for(Severity.ERROR, tv)
    # the new name does not exist on the older releases a script without a pin (or with pins that disagree) may
    # have been written for
    fix_kind = Applicability.UNSAFE if tv.assumed or tv.disagrees is not None else Applicability.SAFE

    def on_removed(removed: str):
        hit = reaching(tv, lambda t: t.at_least(removed))
        return None if hit is None else describe_reaching(tv, hit, "where it is still accepted")

    def on_missing(added: str):
        """The target version predates ``added``: only a version the project states (a pin or ``target-versions``,
        never the installed / assumed one), and for a range only when the range excludes ``added`` itself (the newest
        release bertlint knows inside it may not be the newest that exists)."""
        av = parse_version(added)

        def missing(t) -> bool:
            if t.assumed or not t.below(added):
                return False
            return t.exact or (av is not None and not _allows(t, av))
        hit = reaching(tv, missing)
        return None if hit is None else describe_reaching(tv, hit, "where it exists")

    for ta in fs.training_args:
        for name, s in ta.explicit.items():
            if name in ADDED:
                if not declared_by_project(ta, name):
                    _report_added(ctx, ta, name, s, on_missing, fix_kind, sev)
                continue
            if name not in REMOVED:
                continue
            removed, repl, rename = REMOVED[name]
            if declared_by_project(ta, name):
                continue
            on = on_removed(removed)
            if on is None:
                continue
            _report_keyword(
                ctx, ta, name, s, _message(ta.class_name, name, removed, repl, on),
                f"`{name}` in {ta.source_file} was removed in transformers {removed}; on {on} "
                f"`HfArgumentParser` rejects the key. Fix: " + (f"use {repl} instead." if repl else "remove it."),
                rename, fix_kind, sev)
    unsloth = _imports_unsloth(ctx)
    for ti in fs.trainers:
        if unsloth and _trl_trainer(ctx, ti):
            # unsloth wraps every trl trainer's __init__ (`_backwards_compatible_trainer`): `tokenizer=` is moved to
            # `processing_class` before trl sees it
            continue
        for a in ti.node.args:
            if a.keyword is not None and a.keyword.value in TRAINER_ADDED and not _trl_trainer(ctx, ti) and \
                    not init_takes(ti, a.keyword.value):
                # trl's trainers take `processing_class` by trl's own version, not transformers'
                added, older, rename = TRAINER_ADDED[a.keyword.value]
                on = on_missing(added)
                if on is not None:
                    _report_trainer_keyword(ctx, a, _added_message(ti.class_name or "Trainer", a.keyword.value, added,
                                                                   older, on), rename, fix_kind, sev)
            if a.keyword is not None and a.keyword.value in TRAINER_REMOVED:
                removed, repl, rename = TRAINER_REMOVED[a.keyword.value]
                if init_takes(ti, a.keyword.value):
                    continue
                on = on_removed(removed)
                if on is not None:
                    _report_trainer_keyword(ctx, a, _message(ti.class_name or "Trainer", a.keyword.value, removed,
                                                             repl, on), rename, fix_kind, sev)


def _report_trainer_keyword(ctx, arg, message: str, rename: str, fix_kind, sev) -> None:
    """Report a Trainer keyword argument with the rename as its fix."""
    fix = ctx.fix(f"Rename `{arg.keyword.value}` to `{rename}`", [ctx.edit_replace(arg.keyword, rename)], fix_kind)
    ctx.report(arg, message, fix=fix, severity=sev)


def _report_added(ctx, ta, name, s, on_missing, fix_kind, sev) -> None:
    added, older, rename = ADDED[name]
    on = on_missing(added)
    if on is None:
        return
    _report_keyword(
        ctx, ta, name, s, _added_message(ta.class_name, name, added, older, on),
        f"`{name}` in {ta.source_file} exists only from transformers {added}; on {on} `HfArgumentParser` rejects "
        f"the key. Fix: " + (f"use {older} instead." if older else "remove it."),
        rename, fix_kind, sev, from_file_only=True)


def _report_keyword(ctx, ta, name, s, message, file_message, rename, fix_kind, sev, from_file_only=False) -> None:
    """Report the setting ``name`` of ``ta`` where it is written: the keyword (with the rename as a fix), the ``**``
    it comes through, or the key of the JSON / YAML file it was read from (``from_file_only``: only when the value
    itself came from that file)."""
    node = s.node
    if isinstance(node, cst.Arg) and node.keyword is not None and node.keyword.value == name:
        fix = None
        if rename:
            fix = ctx.fix(f"Rename `{name}` to `{rename}`", [ctx.edit_replace(node.keyword, rename)], fix_kind)
        ctx.report(node, message, fix=fix, severity=sev)
    elif isinstance(node, cst.Arg) and node.star == "**":
        ctx.report(node, message.replace(f"`{ta.class_name}({name}=...)`", f"`{name}` (through `**`)"), severity=sev)
    elif ta.source_file and node is not None and (not from_file_only or s.origin == os.path.basename(ta.source_file)):
        ctx.report(node, file_message, severity=sev)


def declared_by_project(ta, name: str) -> bool:
    """The project's own class in the constructor's class chain declares ``name`` as a field
    (``class MyArgs(TrainingArguments): evaluation_strategy: str = "no"``): the keyword is that dataclass's, on every
    transformers version. A class of the project whose definition is not readable may declare it (unknown: True)."""
    declared = getattr(ta, "declared", frozenset())
    return declared is None or name in declared


def init_takes(ti, name: str) -> bool:
    """A Trainer subclass of the project whose ``__init__`` takes ``name`` itself (a parameter of that name, or a
    string key ``kwargs.pop("tokenizer")`` read in its body): the keyword never reaches transformers' ``__init__``."""
    from bertlint.analysis.walk import iter_nodes

    init = ti.methods.get("__init__") if getattr(ti, "methods", None) else None
    if init is None:
        return False
    p = init.params
    if any(q.name.value == name for q in (*p.posonly_params, *p.params, *p.kwonly_params)):
        return True
    return any(type(n) is cst.SimpleString and n.evaluated_value == name for n in iter_nodes(init.body))


def _imports_unsloth(ctx) -> bool:
    """The module imports unsloth (which patches trl's trainers when imported)."""
    return "unsloth" in ctx.symbols.imported_modules


def _trl_trainer(ctx, ti) -> bool:
    """The trainer is one of trl's (or a user subclass of one)."""
    exprs = [ti.node.func]
    if ti.subclass is not None:
        exprs += [b.value for b in ti.subclass.bases]
    for e in exprs:
        try:
            q = ctx.symbols.qualname(e) or ""
        except Exception:
            q = ""
        if q.split(".")[0] == "trl":
            return True
    return False
