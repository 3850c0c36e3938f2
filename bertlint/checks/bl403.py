"""BL403 deepspeed-trainer-mismatch.

``TrainingArguments(deepspeed=cfg)`` → ``HfTrainerDeepSpeedConfig.trainer_config_process`` (transformers
``integrations/deepspeed.py``): every ``"auto"`` value is filled from TrainingArguments; every literal that differs
is recorded, and ``trainer.train()`` raises "Please correct the following DeepSpeed config values that mismatch
TrainingArguments values" (REFERENCE §1.12, ``exp_trainer_deepspeed.out``). The fields compared (``fill_match``):

    train_micro_batch_size_per_gpu  per_device_train_batch_size      (not with auto_find_batch_size)
    gradient_accumulation_steps     gradient_accumulation_steps
    train_batch_size                world_size × per_device × GA      (not with auto_find_batch_size)
    gradient_clipping               max_grad_norm
    optimizer.params.lr             learning_rate
    optimizer.params.betas          [adam_beta1, adam_beta2]
    optimizer.params.eps            adam_epsilon
    optimizer.params.weight_decay   weight_decay
    scheduler.params.warmup_max_lr  learning_rate
    fp16.enabled / bf16.enabled     fp16 or fp16_full_eval / bf16 or bf16_full_eval
    scheduler.params.total_num_steps   the number of training steps (compared only when max_steps > 0 is given)
    scheduler.params.warmup_num_steps  warmup_steps (only when an integer warmup_steps >= 1 is given)

``"auto"`` and absent keys are never a mismatch. A TrainingArguments value is used only when it is certain: a
literal (or a constant), a ``**dict`` literal, a JSON/YAML arguments file, an attribute assignment, or the
TrainingArguments default when the call is fully visible. Values that come from the command line (argparse
defaults, ``parse_args_into_dataclasses``) are not compared. ``train_batch_size`` needs the world size: known from
``[tool.bertlint] world-size`` or the accelerate launcher config, else reported only when no world size can match.
"""

from __future__ import annotations

import os

import libcst as cst

from bertlint.analysis import configfiles as cf
from bertlint.analysis.symbols import UNKNOWN
from bertlint.registry import rule
from bertlint.types import Applicability, Severity

# TrainingArguments defaults for the fields compared here (stable across 4.4x-5.24).
_DEFAULTS = {
    "per_device_train_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "max_grad_norm": 1.0,
    "learning_rate": 5e-05,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "adam_epsilon": 1e-08,
    "weight_decay": 0.0,
    "fp16": False,
    "bf16": False,
    "fp16_full_eval": False,
    "bf16_full_eval": False,
    "auto_find_batch_size": False,
    "max_steps": -1,
    "warmup_steps": 0,
}

_CERTAIN_ORIGINS = ("keyword", "**", "attribute assignment", "parse_dict", "default of the `")


_static = cf.is_static_expr


class _OneWorldSize(str):
    """A mismatch note for a ``train_batch_size`` that holds at one world size only (a warning: the launch may use
    exactly that one)."""


class _HF:
    """Certain TrainingArguments values of one ``TrainingArgs``."""

    def __init__(self, ctx, ta, launch: bool = False) -> None:
        self.ctx = ctx
        self.ta = ta
        self.launch = launch  # judging a launch with the command line's defaults: argparse defaults count

    def get(self, name: str):
        """(value, origin text) or (UNKNOWN, "")."""
        ta = self.ta
        if ta.runtime_cli:
            return UNKNOWN, ""
        s = ta.setting(name)
        if s is not None:
            cli = self.launch and s.origin.startswith("argparse default of --")
            if s.value is UNKNOWN or not cli and not any(s.origin.startswith(o) for o in _CERTAIN_ORIGINS) and \
                    not (ta.source_file and s.origin == os.path.basename(ta.source_file)):
                return UNKNOWN, ""
            node = s.node
            if isinstance(node, cst.Arg) and node.keyword is not None and not cli and \
                    not _static(self.ctx, node.value, ta.func):
                return UNKNOWN, ""
            if cli:
                return s.value, f"the default of `{s.origin[len('argparse default of '):]}`"
            where = s.origin
            try:
                if node is not None:
                    where = f"{s.origin.split(' (')[0]}, line {self.ctx.span(node)[0].row}"
            except Exception:
                pass
            if ta.source_file and s.origin == os.path.basename(ta.source_file):
                where = s.origin
            return s.value, where
        if ta.open_ended or ta.class_name.split(".")[-1] not in ("TrainingArguments", "Seq2SeqTrainingArguments"):
            return UNKNOWN, ""
        if name in _DEFAULTS:
            return _DEFAULTS[name], "TrainingArguments default"
        return UNKNOWN, ""


def _num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _fmt(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e6:
        return repr(v)
    return repr(v) if not isinstance(v, list) else "[" + ", ".join(_fmt(x) for x in v) + "]"


def mismatches(ctx, ta, data: dict, launch: bool = False):
    """[(ds key path, ds value, hf name, hf value, hf origin, note)] for one TrainingArguments + DS config.
    ``launch``: the config arrives from the command line, and argparse defaults stand for the launch's values."""
    hf = _HF(ctx, ta, launch)
    out = []

    def val(path):
        return cf._get(data, path)

    afbs, _ = hf.get("auto_find_batch_size")
    afbs_known = afbs is not UNKNOWN
    pd, pd_o = hf.get("per_device_train_batch_size")
    ga, ga_o = hf.get("gradient_accumulation_steps")

    def cmp_num(path, hf_name, hv, ho):
        dv = val(path)
        if dv is None or dv == cf.AUTO or not _num(dv) or hv is UNKNOWN or not _num(hv):
            return
        if dv != hv:
            out.append((path, dv, hf_name, hv, ho, ""))

    if afbs_known and not afbs:
        cmp_num(("train_micro_batch_size_per_gpu",), "per_device_train_batch_size", pd, pd_o)
    cmp_num(("gradient_accumulation_steps",), "gradient_accumulation_steps", ga, ga_o)
    # train_batch_size: world_size × per_device × GA
    tb = val(("train_batch_size",))
    if afbs_known and not afbs and isinstance(tb, int) and not isinstance(tb, bool) and \
            isinstance(pd, int) and not isinstance(pd, bool) and isinstance(ga, int) and not isinstance(ga, bool) \
            and pd > 0 and ga > 0:
        ws, ws_src = cf.launcher_world_size(ctx)
        per = pd * ga
        if ws is not None:
            if tb != ws * per:
                out.append((("train_batch_size",), tb, "train_batch_size (calculated)", ws * per,
                            f"world size {ws} ({ws_src}) × {pd} × {ga}", ""))
        elif tb % per != 0 or tb < per:
            out.append((("train_batch_size",), tb, "train_batch_size (calculated)", None,
                        f"world_size × {pd} × {ga}",
                        f"{tb} is not a multiple of per_device_train_batch_size × gradient_accumulation_steps = "
                        f"{pd} × {ga} = {per}, so it differs at every world size"))
        elif tb != per:
            only = tb // per
            out.append((("train_batch_size",), tb, "train_batch_size (calculated)", None,
                        f"world_size × {pd} × {ga}",
                        _OneWorldSize(f"{tb} = {pd} × {ga} × {only} holds only on exactly {only} GPUs (processes); "
                                      f"on any other number — one GPU included — it differs (the world size comes "
                                      f"from the launch and is not in the script or `[tool.bertlint] world-size`)")))
    mg, mg_o = hf.get("max_grad_norm")
    cmp_num(("gradient_clipping",), "max_grad_norm", mg, mg_o)
    lr, lr_o = hf.get("learning_rate")
    cmp_num(("optimizer", "params", "lr"), "learning_rate", lr, lr_o)
    b1, b1_o = hf.get("adam_beta1")
    b2, b2_o = hf.get("adam_beta2")
    betas = val(("optimizer", "params", "betas"))
    if isinstance(betas, list) and len(betas) == 2 and all(_num(b) for b in betas) and _num(b1) and _num(b2):
        if betas != [b1, b2]:
            o = b1_o if b1_o == b2_o else f"{b1_o} / {b2_o}"
            out.append((("optimizer", "params", "betas"), betas, "adam_beta1+adam_beta2", [b1, b2], o, ""))
    eps, eps_o = hf.get("adam_epsilon")
    cmp_num(("optimizer", "params", "eps"), "adam_epsilon", eps, eps_o)
    wd, wd_o = hf.get("weight_decay")
    cmp_num(("optimizer", "params", "weight_decay"), "weight_decay", wd, wd_o)
    cmp_num(("scheduler", "params", "warmup_max_lr"), "learning_rate", lr, lr_o)
    for prec in ("fp16", "bf16"):
        dv = val((prec, "enabled"))
        if not isinstance(dv, bool):
            continue
        a, a_o = hf.get(prec)
        b, b_o = hf.get(f"{prec}_full_eval")
        if not isinstance(a, bool) or not isinstance(b, bool):
            continue
        hv = a or b
        if dv != hv:
            out.append(((prec, "enabled"), dv, f"{prec}|{prec}_full_eval", hv, a_o, ""))
    ms, ms_o = hf.get("max_steps")
    if isinstance(ms, int) and not isinstance(ms, bool) and ms > 0:
        cmp_num(("scheduler", "params", "total_num_steps"), "num_training_steps (max_steps)", ms, ms_o)
    ws_, ws_o = hf.get("warmup_steps")
    if isinstance(ws_, int) and not isinstance(ws_, bool) and ws_ >= 1 and ta.setting("warmup_ratio") is None:
        cmp_num(("scheduler", "params", "warmup_num_steps"), "warmup_steps", ws_, ws_o)
    return out


@rule(
    "BL403",
    "deepspeed-trainer-mismatch",
    Severity.ERROR,
    "literal DeepSpeed config values that differ from the TrainingArguments the script passes (use \"auto\")",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    # the deepspeed path may sit in a JSON/YAML arguments file, so the script need not mention "deepspeed"
    if "TrainingArguments" not in ctx.source and "HfArgumentParser" not in ctx.source:
        return
    try:
        fs = ctx.setup
    except Exception:
        return
    seen = set()
    tv = None
    for ta in getattr(fs, "training_args", []) or []:
        s = ta.setting("deepspeed")
        if s is not None and s.value is None and s.origin.startswith("argparse default of --"):
            _check_launch(ctx, ta, s)
            continue
        if s is None or s.value is UNKNOWN or s.value is None:
            continue
        info = {"data": None, "doc": None, "path": None, "dict_node": None, "key_nodes": {}, "mutated": False}
        anchor = s.node if s.node is not None else ta.node
        if isinstance(s.node, cst.Arg) and s.node.keyword is not None:
            info = cf._resolve_config_arg(ctx, s.node.value, ta.func)
        elif isinstance(s.value, str):
            path = s.value if os.path.isabs(s.value) else os.path.join(cf._script_dir(ctx), s.value)
            doc = cf.load_document(path)
            if doc.error is None and isinstance(doc.data, dict):
                info.update(data=doc.data, doc=doc, path=path)
        elif isinstance(s.value, dict):
            info["data"] = s.value
        data = info["data"]
        if not isinstance(data, dict) or info["mutated"] or anchor is None:
            continue
        found = mismatches(ctx, ta, data)
        if not found:
            continue
        if tv is None:
            try:
                tv = ctx.versions.transformers.describe()
            except Exception:
                tv = "transformers"
        doc = info["doc"]
        for path, dv, hname, hv, horigin, note in found:
            key = ".".join(str(p) for p in path)
            el = info["key_nodes"].get(path)
            node = el if el is not None else anchor
            ident = (id(node), key)
            if ident in seen:
                continue
            seen.add(ident)
            if doc is not None:
                row, _ = doc.key_position(path)
                where = f" ({os.path.basename(info['path'])}:{row})"
            else:
                where = ""
            if note:
                diff = f"`{key}`={_fmt(dv)}{where} does not match `{hname}` = {horigin}: {note}"
                shown_hv = f"{horigin}"
                shown_raw = shown_hv
            else:
                diff = (f"DeepSpeed `{key}`={_fmt(dv)}{where} differs from TrainingArguments `{hname}`={_fmt(hv)} "
                        f"({horigin})")
                shown_hv = _fmt(hv)
                shown_raw = str(hv)
            msg = (
                f"{diff}. The Trainer fills only \"auto\" values and records every literal that differs; on {tv} "
                f"`trainer.train()` raises `ValueError: Please correct the following DeepSpeed config values that "
                f"mismatch TrainingArguments values: - ds {key}={dv} vs hf {hname}={shown_raw}`. Set "
                f"`{key}` to \"auto\" so the Trainer fills it from TrainingArguments, or make the two values agree."
            )
            fix = None
            if isinstance(el, cst.DictElement):
                fix = ctx.fix(f"Set `{key}` to \"auto\" (the Trainer fills it from TrainingArguments)",
                              [ctx.edit_replace(el.value, '"auto"')], Applicability.UNSAFE)
            one_ws = isinstance(note, _OneWorldSize)
            if one_ws:
                # the note itself says "...; on any other number": name the world size where the Trainer's sentence
                # begins, not inside the note
                msg = msg.replace("records every literal that differs; on ",
                                  "records every literal that differs; on such another number of GPUs, on ", 1)
            ctx.report(node, msg, fix=fix, severity=Severity.WARNING if one_ws else None,
                       data={"key": key, "ds_value": dv, "hf_name": hname,
                             "hf_value": hv if not isinstance(hv, float) else float(hv)})


def _check_launch(ctx, ta, s) -> None:
    """``TrainingArguments(deepspeed=args.deepspeed)`` with no default: DeepSpeed arrives with the launch
    (``--deepspeed ds_config.json``). When the config it would name is known (the script names it, or it is the single
    DeepSpeed config beside the script), compare it with the TrainingArguments the command-line defaults give, and
    report once, as a warning that says what it assumes."""
    docs = cf.deepspeed_configs_near(getattr(ctx, "filename", None), ctx.source)
    if len(docs) != 1:
        return
    doc = docs[0]
    found = mismatches(ctx, ta, doc.data, launch=True)
    if not found:
        return
    flag = s.origin[len("argparse default of "):]
    name = os.path.basename(doc.path or "")
    named = name in ctx.source
    parts = []
    for path, dv, hname, hv, horigin, note in found:
        key = ".".join(str(p) for p in path)
        row, _ = doc.key_position(path)
        if note:
            parts.append(f"`{key}`={_fmt(dv)} ({name}:{row}) vs `{hname}` = {horigin}: {note}")
        else:
            parts.append(f"`{key}`={_fmt(dv)} ({name}:{row}) vs `{hname}`={_fmt(hv)} ({horigin})")
    try:
        tv = ctx.versions.transformers.describe()
    except Exception:
        tv = "transformers"
    where = "the script names it" if named else "the only DeepSpeed config beside the script"
    node = s.node if s.node is not None else ta.node
    ctx.report(
        node,
        f"When launched with `{flag} {name}` ({where}) and the other command-line defaults, the DeepSpeed config "
        f"disagrees with the TrainingArguments: " + "; ".join(parts) + f". The Trainer fills only \"auto\" values "
        f"and records every literal that differs; on {tv} `trainer.train()` then raises `ValueError: Please correct "
        f"the following DeepSpeed config values that mismatch TrainingArguments values`. Fix: set these keys to "
        f"\"auto\" in {name} so the Trainer fills them from the command line's values.",
        severity=Severity.WARNING,
        data={"keys": [".".join(str(p) for p in f[0]) for f in found], "launch": True, "config": name},
    )
