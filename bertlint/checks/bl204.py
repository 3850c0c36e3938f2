"""BL204 fp16-amp-on-half-weights: a Trainer with ``fp16=True`` on a model whose weights are float16
(``.half()``, ``.to(torch.float16)``, ``dtype=torch.float16``, or a local fp16 checkpoint loaded with transformers 5.x's
default ``dtype="auto"``). The GradScaler refuses fp16 gradients: ``ValueError: Attempting to unscale FP16
gradients.`` at the first optimizer step (REFERENCE §1.8, ``exp_gradscaler.out``, ``exp_dtype_auto.out``)."""

from __future__ import annotations

from bertlint.analysis.setup import read_local_config
from bertlint.registry import rule
from bertlint.types import Severity
import os


def _cast_after(ctx, m) -> bool:
    """The model is cast to float16 after PEFT wrapped it (the adapters are then float16 too)."""
    if m.cast != "float16" or m.cast_node is None or m.peft_node is None:
        return False
    try:
        return ctx.span(m.cast_node)[0].row > ctx.span(m.peft_node)[0].row
    except Exception:
        return False


# peft 0.7.0 - 0.11.x: LoraLayer.update_layer ends with `self.to(weight.device, dtype=weight.dtype)` on the base layer's
# weight (src/peft/tuners/lora/layer.py), so LoRA adapters on a float16 base are float16; 0.12.0 added
# `get_peft_model(..., autocast_adapter_dtype=True)`, which upcasts float16/bfloat16 adapters to float32. (0.6.x and
# earlier: the LoRA Linear is an nn.Linear whose own fresh float32 weight sets the dtype.)
PEFT_ADAPTERS_FOLLOW_BASE = ("0.7.0", "0.12.0")


def _adapters_follow_base(ctx):
    """The pinned peft release when it makes LoRA adapters in the base layer's dtype; None otherwise (not pinned:
    the current releases upcast)."""
    pv = ctx.versions.get("peft")
    if pv.assumed or not pv.between(*PEFT_ADAPTERS_FOLLOW_BASE):
        return None
    return pv


@rule("BL204", "fp16-amp-on-half-weights", Severity.ERROR, "fp16 mixed precision on a model loaded or cast to float16")
def check(ctx) -> None:
    if "fp16" not in ctx.source:
        return
    tv = ctx.versions.transformers
    for ti in ctx.setup.trainers:
        if ti.args is None or ti.model is None or ti.args.get("fp16") is not True:
            continue
        if ti.args.get("deepspeed") not in (None,):
            continue  # DeepSpeed keeps its own fp32 master weights and loss scaler
        m = ti.model
        old_peft = _adapters_follow_base(ctx) if (m.peft and not m.kbit) else None
        if (m.peft or m.kbit) and "autocast_adapter_dtype=False" not in ctx.source and not _cast_after(ctx, m) \
                and old_peft is None:
            # PEFT (>= 0.12) creates the trainable adapter weights in float32 even on a float16 base, and
            # prepare_model_for_kbit_training casts the non-quantized parameters to float32: the trainable
            # gradients are float32 and the GradScaler accepts them; the frozen float16 base gets no gradient.
            continue
        node, how = None, None
        if m.cast == "float16":
            node, how = m.cast_node, "is cast to float16"
        elif m.cast is None and m.dtype == "float16":
            node, how = m.dtype_node, "is loaded with `dtype=float16`"
        elif m.cast is None and m.dtype is None and m.from_pretrained and tv.at_least("5.0.0") and m.checkpoint:
            d = m.checkpoint if os.path.isabs(m.checkpoint) else os.path.join(os.path.dirname(os.path.abspath(ctx.filename)), m.checkpoint)
            cfg = read_local_config(d) if os.path.isdir(d) else None
            if cfg and str(cfg.get("dtype") or cfg.get("torch_dtype") or "") in ("float16", "torch.float16"):
                node, how = m.node, (f"is loaded without `dtype` from a float16 checkpoint: on {tv.describe()} "
                                     f"`from_pretrained` defaults to `dtype=\"auto\"` and keeps float16")
        if node is None:
            continue
        if old_peft is not None and not _cast_after(ctx, m):
            from bertlint.analysis.versions import severity_for

            ctx.report(
                node,
                f"The model {how} and is wrapped by PEFT on {old_peft.describe()}, whose LoRA layers create the "
                f"adapter weights in the base layer's dtype (peft 0.7–0.11: `self.to(weight.device, "
                f"dtype=weight.dtype)`), so the only trainable parameters are float16; the Trainer trains with "
                f"`fp16=True`, and the GradScaler stops training at the first optimizer step with `ValueError: "
                f"Attempting to unscale FP16 gradients.` Fix: peft>=0.12 (it upcasts the adapters to float32), or "
                f"load float32 weights and let `fp16=True` autocast, or cast the adapter parameters to float32 after "
                f"`get_peft_model`.",
                severity=severity_for(Severity.ERROR, old_peft),
            )
            continue
        ctx.report(
            node,
            f"The model {how} and the Trainer trains it with `fp16=True`: the weights, hence the gradients, are "
            f"float16, and the GradScaler stops training at the first optimizer step with `ValueError: Attempting "
            f"to unscale FP16 gradients.` (even with `max_grad_norm=0`). Fix: keep float32 weights "
            f"(`dtype=torch.float32`, no `.half()`) and let `fp16=True` autocast, or use `bf16=True` on "
            f"hardware that supports it.",
        )
