"""BL505 empty-cache-in-loop: ``torch.cuda.empty_cache()`` on every iteration of a loop (slow; does not cure an OOM),
and ``TrainingArguments(torch_empty_cache_steps=k)`` which fires on every micro-batch of matching windows
(REFERENCE §1.10)."""

from __future__ import annotations

import re

import libcst as cst


from bertlint.registry import rule
from bertlint.types import Severity

_STEP_RE = re.compile(r"\.backward\(|\bbackward\(|\.step\(|training_step\(|train_step\(")
_EMPTY = {"torch.cuda.empty_cache", "torch.mps.empty_cache", "torch.xpu.empty_cache"}


def _runs_steps(loop) -> bool:
    """The loop's own body (nested loops excluded) runs a backward or an optimizer step."""

    class Strip(cst.CSTTransformer):
        def leave_For(self, original, updated):
            return cst.RemovalSentinel.REMOVE if original is not loop else updated

        def leave_While(self, original, updated):
            return cst.RemovalSentinel.REMOVE if original is not loop else updated

    try:
        stripped = loop.visit(Strip())
        text = cst.Module(body=[]).code_for_node(stripped.body) if hasattr(stripped, "body") else ""
    except Exception:
        return False
    for m in _STEP_RE.finditer(text):
        if m.group(0) == ".step(":
            recv = re.search(r"([\w\]\)]+)\s*$", text[: m.start()])
            name = (recv.group(1) if recv else "").lower()
            if "sched" in name or name.startswith("lr") or "warmup" in name:
                continue  # an epoch loop stepping its LR scheduler is not a per-step loop
        return True
    return False


def _per_step_calls(ctx) -> list:
    """``empty_cache()`` calls that run on every iteration of a loop that runs training steps: the innermost
    enclosing loop (in the same function) runs steps, and no ``if`` / ``try`` lies between it and the call. A loop
    over runs, folds or epochs that calls train() may clear the cache between them on purpose."""
    out = []
    t = ctx.symbols
    for call in ctx.index.of(cst.Call):
        if t.qualname(call.func) not in _EMPTY:
            continue
        guarded, loop = False, None
        for a in ctx.index.ancestors(call):
            if isinstance(a, cst.FunctionDef):
                break
            if isinstance(a, (cst.If, cst.Try)):
                guarded = True
            elif isinstance(a, (cst.For, cst.While)):
                loop = a
                break
        if loop is not None and not guarded and _runs_steps(loop):
            out.append(call)
    return out


@rule("BL505", "empty-cache-in-loop", Severity.INFO, "torch.cuda.empty_cache() per step (slow; does not cure an OOM)")
def check(ctx) -> None:
    src = ctx.source
    if "empty_cache" in src:
        for call in _per_step_calls(ctx):
            ctx.report(
                call,
                "`empty_cache()` on every iteration: it returns the caching allocator's free blocks to the driver, "
                "and the next step must request them again (a device synchronisation and slow cudaMalloc calls). "
                "It frees no memory a live tensor holds, so it does not prevent an out-of-memory error. Fix: remove "
                "it, or call it rarely (after evaluation, between phases).",
            )
    if "torch_empty_cache_steps" in src:
        for ta in ctx.setup.training_args:
            k = ta.int("torch_empty_cache_steps")
            n = ta.int("gradient_accumulation_steps")
            if k is None or k <= 0:
                continue
            node = ta.keyword_node("torch_empty_cache_steps") or ta.node
            per = f" — with gradient_accumulation_steps={n}, {n} calls per such step" if n and n > 1 else ""
            ctx.report(
                node,
                f"`torch_empty_cache_steps={k}` clears the device cache on every micro-batch of each window whose "
                f"optimizer step is a multiple of {k} (including the whole first window){per}; it slows training "
                f"and does not prevent an out-of-memory error. Fix: remove it unless fragmentation is measured.",
            )
