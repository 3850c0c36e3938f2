"""BL402 deepspeed-batch-inconsistent.

DeepSpeed 0.19 (``runtime/config.py``: ``_set_batch_related_parameters`` then ``_batch_assertion``) derives a
missing member of the batch triple by floor division and asserts
``train_batch_size == train_micro_batch_size_per_gpu * gradient_accumulation_steps * world_size``
(REFERENCE §5, ``exp_deepspeed_ga.out``). Statically the world size is usually unknown, so the rule reports only
(a) a ``train_batch_size`` that no world size can satisfy (not a multiple of the literal factors), (b) a literal
<= 0, and (c) a mismatch at a world size that is known (``[tool.bertlint] world-size`` or the ``num_processes`` of
the accelerate launcher config). ``"auto"`` values are filled by the HF Trainer / accelerate and never reported.

Runs on DeepSpeed JSON/YAML files (config target) and on dict literals in scripts; a config file a script names
by path is reported in that file, not in the script.
"""

from __future__ import annotations

import os

from bertlint.analysis import configfiles as cf
from bertlint.registry import rule
from bertlint.types import Severity

_FIX = (
    " Fix: drop `train_batch_size` (DeepSpeed derives it as micro × accumulation × world size), set it to "
    "\"auto\" under the HF Trainer or accelerate, or make the three values agree."
)


def findings(data, world_size=None, world_source="", version=""):
    """[(key path, message)] for a DeepSpeed config dict."""
    ds = cf.DeepSpeedConfig.from_data(data)
    if ds is None:
        return []
    bc = cf.check_batch(ds.train_batch_size, ds.micro_batch, ds.gradient_accumulation_steps, world_size,
                        world_source)
    if bc.status in ("never", "mismatch", "invalid"):
        ws = "" if world_size is not None or bc.status != "never" else (
            " The world size is not known statically (set `world-size` in [tool.bertlint] to check it too).")
        on = f" ({version})" if version else ""
        return [(bc.key, f"DeepSpeed batch triple inconsistent{on}: {bc.message}{ws}{_FIX}")]
    return []


def _has_mpu(use) -> bool:
    return any(a.keyword is not None and a.keyword.value in ("mpu", "mesh_param") for a in use.call.args)


def _version(ctx) -> str:
    v, src = cf.deepspeed_version(ctx)
    return f"deepspeed {cf.vtext(v)}, {src}"


@rule(
    "BL402",
    "deepspeed-batch-inconsistent",
    Severity.ERROR,
    "DeepSpeed train_batch_size != micro × accumulation × world size (says which world sizes would be consistent)",
    targets=("python", "config"),
)
def check(ctx) -> None:
    if hasattr(ctx, "module"):
        _check_script(ctx)
    else:
        _check_config(ctx)


def _check_config(ctx) -> None:
    if cf.classify(ctx.data) != "deepspeed" or "train_batch_size" not in ctx.data:
        return
    accs = []
    fn = getattr(ctx, "filename", None)
    if fn and fn not in ("-", "<stdin>") and os.path.isfile(fn):
        try:
            accs = cf.accelerate_configs_referencing(fn)
        except Exception:
            accs = []
    ws, src = cf.world_size_for_config(ctx.settings, ctx.data, accs)
    for key, msg in findings(ctx.data, ws, src, _version(ctx)):
        ctx.report_key(key, msg, data={"world_size": ws})


def _check_script(ctx) -> None:
    if "train_batch_size" not in ctx.source:
        return
    launcher = cf.launcher_world_size(ctx)
    settings_only = cf.world_size_for(ctx.settings, [])
    for use in cf.deepspeed_uses(ctx):
        if use.dict_node is None or use.mutated or not isinstance(use.data, dict):
            continue
        if use.framework == "lightning":
            continue  # Lightning sets the batch values itself (BL408 covers its config)
        # an accelerate launcher config beside the script says nothing about a raw engine started by `deepspeed`
        ws, src = settings_only if use.framework == "engine" else launcher
        if cf._model_parallel(use.data) or _has_mpu(use):
            ws, src = None, ""  # the batch rule's world size is then the data-parallel size
        for key, msg in findings(use.data, ws, src, _version(ctx)):
            node = use.key_nodes.get(key, use.dict_node)
            ctx.report(node, msg, data={"world_size": ws})
