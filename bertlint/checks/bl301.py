"""BL301 checkpoint-use-reentrant-implicit: ``torch.utils.checkpoint`` calls without ``use_reentrant`` (torch 2.13
warns and defaults to reentrant), and checkpointing kwargs dicts without ``"use_reentrant"`` (the dict replaces
transformers' ``{"use_reentrant": False}`` default; REFERENCE §1.7, ``exp_checkpointing.out`` [4])."""

from __future__ import annotations

import libcst as cst


from bertlint.analysis.symbols import kwarg
from bertlint.checks._trainer import TRAINER_ONLY_KEYS
from bertlint.registry import rule
from bertlint.types import Applicability, Edit, Severity

_TORCH_CKPT = {"torch.utils.checkpoint.checkpoint", "torch.utils.checkpoint.checkpoint_sequential"}


@rule("BL301", "checkpoint-use-reentrant-implicit", Severity.INFO,
      "torch.utils.checkpoint calls or checkpointing kwargs without use_reentrant", fix=Applicability.UNSAFE)
def check(ctx) -> None:
    src = ctx.source
    if "checkpoint" not in src:
        return
    t = ctx.symbols
    if "utils.checkpoint" in src or "checkpoint_sequential" in src:
        for call in ctx.index.of(cst.Call):
            q = t.qualname(call.func)
            if q not in _TORCH_CKPT or kwarg(call, "use_reentrant") is not None:
                continue
            if any(a.star for a in call.args):
                continue
            name = q.split(".")[-1]
            fix = None
            if call.args:
                _, end = ctx.span(call.args[-1].value)
                fix = ctx.fix("Pass `use_reentrant=False` explicitly", [Edit(", use_reentrant=False", end, end)],
                              Applicability.UNSAFE)
            ctx.report(
                call,
                f"`{name}(...)` without `use_reentrant`: torch {ctx.versions.torch.text} "
                f"({ctx.versions.torch.source}) warns on every call and falls back to the reentrant variant, "
                f"which gives no gradient to the checkpointed parameters when no input requires grad and cannot "
                f"be combined with DDP `find_unused_parameters=True`. Fix: pass `use_reentrant=False` (or `True` "
                f"if you need the old behaviour) explicitly.",
                fix=fix,
            )
    if "checkpointing_kwargs" not in src:
        return
    fs = ctx.setup
    seen = set()
    for ta in fs.training_args:
        for key in ("gradient_checkpointing_kwargs", "activation_checkpointing_kwargs"):
            s = ta.setting(key)
            if s is None or not isinstance(s.value, dict) or "use_reentrant" in s.value:
                continue
            rest = {k for k in s.value if k not in TRAINER_ONLY_KEYS}
            if not rest or s.node is None:
                continue
            seen.add(id(s.node))
            ctx.report(s.node, _dict_message(key, sorted(rest)))
    for m in fs.models:
        for c in m.checkpointing:
            if c.kwargs_node is None or id(c.kwargs_node) in seen or not isinstance(c.kwargs, dict):
                continue
            if "use_reentrant" in c.kwargs or not c.kwargs:
                continue
            seen.add(id(c.kwargs_node))
            ctx.report(c.kwargs_node, _dict_message(f"{c.method}(...) kwargs", sorted(c.kwargs)))


def _dict_message(key: str, keys: list) -> str:
    return (
        f"`{key}` ({', '.join(keys)}) has no `\"use_reentrant\"`: a kwargs dict replaces transformers' default "
        f"`{{\"use_reentrant\": False}}`, so torch falls back to reentrant checkpointing with a warning (frozen "
        f"inputs then get no gradient; DDP `find_unused_parameters=True` fails). Fix: add "
        f"`\"use_reentrant\": False` to the dict."
    )
