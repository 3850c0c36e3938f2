"""BL411 deepspeed-default-clipping.

DeepSpeed's ``GRADIENT_CLIPPING_DEFAULT`` is 1.0 from 0.19.3 (PR #8068; 0.0 = off before). A DeepSpeed config
without ``gradient_clipping`` is clipped at norm 1.0 on those versions (REFERENCE §5). The HF Trainer fills only an
``"auto"`` value (``max_grad_norm`` does not reach a config that omits the key); Lightning's DeepSpeedStrategy
fills a missing key from ``gradient_clip_val`` (so configs handed to Lightning are not reported). accelerate:
``DeepSpeedPlugin(gradient_clipping=0.0)`` / ``gradient_clipping: 0.0`` in the launcher YAML never reach the
DeepSpeed config (``if self.gradient_clipping:``, REFERENCE §2.2), so DeepSpeed's default applies — the opposite
of what was asked (reported as a warning).

Version: ``ctx.versions`` (target-versions, pins, installed), else ``importlib.metadata``, else 0.19.8 assumed.
"""

from __future__ import annotations

from bertlint.analysis import configfiles as cf
from bertlint.registry import rule
from bertlint.types import Applicability, Edit, Fix, Position, Severity


def _version(ctx):
    v, src = cf.deepspeed_version(ctx)
    return v, f"deepspeed {cf.vtext(v)} ({src})"


_HOW = (
    "State it: `\"gradient_clipping\": 1.0` to keep clipping, `0.0` to switch it off, or `\"auto\"` under the HF "
    "Trainer to follow `max_grad_norm`."
)


def missing_message(vdesc: str, where: str = "This DeepSpeed config") -> str:
    return (
        f"{where} has no `gradient_clipping`: {vdesc} clips gradients at norm 1.0 when the key is absent (the "
        f"default changed from 0.0 = off to 1.0 in deepspeed 0.19.3, PR #8068), so updates are clipped although "
        f"nothing here asks for it. The HF Trainer fills only \"auto\" values, so its `max_grad_norm` does not "
        f"reach this key; Lightning's DeepSpeedStrategy fills it from `gradient_clip_val`. {_HOW}"
    )


def zero_message(vdesc: str, what: str) -> str:
    return (
        f"{what} asks for no clipping, but accelerate only copies a truthy value into the DeepSpeed config "
        f"(`if self.gradient_clipping:`), so the key stays absent and {vdesc} applies its default: clipping at "
        f"norm 1.0 (default since deepspeed 0.19.3, PR #8068). Put `\"gradient_clipping\": 0.0` in a DeepSpeed "
        f"config file (`deepspeed_config_file` / `hf_ds_config`) to switch clipping off."
    )


@rule(
    "BL411",
    "deepspeed-default-clipping",
    Severity.INFO,
    "a DeepSpeed config without gradient_clipping on deepspeed versions whose default clips at 1.0",
    fix=Applicability.SAFE,
    targets=("python", "config"),
)
def check(ctx) -> None:
    if hasattr(ctx, "module"):
        _check_script(ctx)
    else:
        _check_config(ctx)


def _json_fix(ctx):
    """Insert ``"gradient_clipping": 1.0,`` as the first key of the top-level JSON object (behaviour-preserving on
    the versions this rule fires for)."""
    if getattr(ctx, "format", "json") != "json" or not ctx.data:
        return None
    text = ctx.source
    i = text.find("{")
    if i < 0 or text[:i].strip():
        return None
    row = text.count("\n", 0, i) + 1
    col = i - (text.rfind("\n", 0, i) + 1) + 1
    rest = text[i + 1:]
    j = len(rest) - len(rest.lstrip(" \t\r\n"))
    after = rest[:j]
    if "\n" in after:
        indent = after.split("\n")[-1]
        content = "\n" + indent + "\"gradient_clipping\": 1.0,"
    else:
        content = " \"gradient_clipping\": 1.0,"
    pos = Position(row, col + 1)
    return Fix("Add \"gradient_clipping\": 1.0 (what this deepspeed version already does)", Applicability.SAFE,
               (Edit(content, pos, pos),))


def _check_config(ctx) -> None:
    kind = cf.classify(ctx.data)
    if kind == "deepspeed":
        if "gradient_clipping" in ctx.data or _asks_norm_one(ctx.data):
            return
        v, vdesc = _version(ctx)
        if v < cf.DS_CLIP_DEFAULT_SINCE:
            return
        text = ctx.source
        i = text.find("{") if getattr(ctx, "format", "json") == "json" else -1
        if i >= 0:
            row = text.count("\n", 0, i) + 1
            col = i - (text.rfind("\n", 0, i) + 1) + 1
        else:
            row, col = 1, 1
        ctx.report_at(row, col, missing_message(vdesc), fix=_json_fix(ctx), data={"deepspeed": cf.vtext(v)})
    elif kind == "accelerate":
        acc = cf.AccelerateConfig.from_data(ctx.data)
        if acc is None or not acc.uses_deepspeed or acc.deepspeed_config_file:
            return
        g = acc.gradient_clipping
        if acc.has_gradient_clipping and isinstance(g, (int, float)) and not isinstance(g, bool) and g == 0:
            v, vdesc = _version(ctx)
            if v < cf.DS_CLIP_DEFAULT_SINCE:
                return
            ctx.report_key(("deepspeed_config", "gradient_clipping"),
                           zero_message(vdesc, f"`gradient_clipping: {g}` in this accelerate config"),
                           severity=Severity.WARNING, data={"deepspeed": cf.vtext(v)})


def _check_script(ctx) -> None:
    src = ctx.source
    if "deepspeed" not in src.lower() and "DeepSpeed" not in src:
        return
    version = None
    for use in cf.deepspeed_uses(ctx):
        if use.framework == "lightning":
            continue
        if use.framework == "accelerate":
            g = use.plugin_kwargs.get("gradient_clipping")
            node = None
            for a in use.call.args:
                if a.keyword is not None and a.keyword.value == "gradient_clipping":
                    node = a
            if node is not None and isinstance(g, (int, float)) and not isinstance(g, bool) and g == 0 \
                    and use.data is None and use.arg is None:
                version = version or _version(ctx)
                if version[0] >= cf.DS_CLIP_DEFAULT_SINCE:
                    ctx.report(node, zero_message(version[1], f"`DeepSpeedPlugin(gradient_clipping={g})`"),
                               severity=Severity.WARNING, data={"deepspeed": cf.vtext(version[0])})
                continue
        # a dict literal in the script (config files are reported in the file itself)
        if use.dict_node is None or use.mutated or not isinstance(use.data, dict):
            continue
        if "gradient_clipping" in use.data or _asks_norm_one(use.data) or cf.classify(use.data) != "deepspeed" and not _looks_ds(use.data):
            continue
        version = version or _version(ctx)
        if version[0] < cf.DS_CLIP_DEFAULT_SINCE:
            continue
        ctx.report(use.dict_node, missing_message(version[1], "This DeepSpeed config dict"),
                   data={"deepspeed": cf.vtext(version[0])})


def _asks_norm_one(d: dict) -> bool:
    """The config asks for clipping at norm 1.0 elsewhere (the optimizer's ``max_grad_norm``, as older DeepSpeed
    examples wrote it): the new default does what the author asked for, so there is nothing to report."""
    opt = d.get("optimizer")
    params = opt.get("params") if isinstance(opt, dict) else None
    g = params.get("max_grad_norm") if isinstance(params, dict) else None
    return isinstance(g, (int, float)) and not isinstance(g, bool) and g == 1.0


def _looks_ds(d: dict) -> bool:
    """A dict handed to a DeepSpeed entry point: any DeepSpeed key is enough (the call site says what it is)."""
    return any(k in d for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                                "zero_optimization", "fp16", "bf16", "optimizer", "scheduler"))


