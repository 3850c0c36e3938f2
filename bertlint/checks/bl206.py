"""BL206 deprecated-cuda-amp — ``torch.cuda.amp.*`` (and ``torch.cpu.amp.autocast``) instead of ``torch.amp.*``.

Since torch 2.4 ``torch.cuda.amp.GradScaler(args...)``, ``torch.cuda.amp.autocast(args...)`` and
``torch.cuda.amp.custom_fwd/custom_bwd`` emit a FutureWarning; they are thin wrappers that pass ``"cuda"`` to the
``torch.amp`` versions (``torch/cuda/amp/grad_scaler.py``, ``autocast_mode.py``). Only uses are reported (calls,
``with`` items, decorators), whatever the import spelling (``torch.cuda.amp.X``, ``from torch.cuda.amp import X``,
``import torch.cuda.amp as amp``, ``from torch.cuda import amp``); an import alone warns nothing and is not reported.

The fix rewrites the use to ``torch.amp.X("cuda", ...)``: positional arguments of ``autocast`` become keywords
(``torch.cuda.amp.autocast(enabled, dtype, cache_enabled)`` vs ``torch.amp.autocast(device_type, dtype, enabled,
cache_enabled)``), ``custom_fwd/custom_bwd`` get ``device_type="cuda"``. It needs a ``torch`` module name in the
file (``import torch``); the now-unused ``from torch.cuda.amp import X`` is left for the user or an unused-import
fixer.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst


from bertlint.analysis.evalflow import torch_alias
from bertlint.analysis.symbols import dotted
from bertlint.registry import rule
from bertlint.types import Applicability, Severity

_DEPRECATED = {
    "torch.cuda.amp.GradScaler": ("GradScaler", "cuda"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("GradScaler", "cuda"),
    "torch.cuda.amp.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.autocast_mode.autocast": ("autocast", "cuda"),
    "torch.cuda.amp.custom_fwd": ("custom_fwd", "cuda"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("custom_fwd", "cuda"),
    "torch.cuda.amp.custom_bwd": ("custom_bwd", "cuda"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("custom_bwd", "cuda"),
    "torch.cpu.amp.autocast": ("autocast", "cpu"),
    "torch.cpu.amp.autocast_mode.autocast": ("autocast", "cpu"),
}
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")


class _Uses:
    """Calls, name decorators and imports of the file, from the shared index (``ctx.index``), in source order."""

    def __init__(self, index) -> None:
        self.calls: list[cst.Call] = index.of(cst.Call)
        self.decorators: list[cst.Decorator] = [d for d in index.of(cst.Decorator)
                                                if isinstance(d.decorator, (cst.Name, cst.Attribute))]
        self.imports: list[cst.CSTNode] = index.of(cst.Import, cst.ImportFrom)


def _kw(name: str) -> dict:
    return dict(keyword=cst.Name(name), equal=cst.AssignEqual(whitespace_before=cst.SimpleWhitespace(""),
                                                              whitespace_after=cst.SimpleWhitespace("")))


def _comma() -> cst.Comma:
    return cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))


def _new_call(call: Optional[cst.Call], callee: str, kind: str, device: str) -> Optional[cst.Call]:
    args = list(call.args) if call is not None else []
    dev = cst.SimpleString(f'"{device}"')
    if kind == "GradScaler":
        first = cst.Arg(value=dev, comma=_comma() if args else cst.MaybeSentinel.DEFAULT)
        new_args = [first] + args
    elif kind == "autocast":
        new_args = [cst.Arg(value=dev, comma=_comma() if args else cst.MaybeSentinel.DEFAULT)]
        i = 0
        for a in args:
            if a.star:
                if a.star == "*":
                    return None
                new_args.append(a)
                continue
            if a.keyword is None:
                if i >= len(_AUTOCAST_POSITIONAL):
                    return None
                a = a.with_changes(**_kw(_AUTOCAST_POSITIONAL[i]))
                i += 1
            new_args.append(a)
    else:  # custom_fwd / custom_bwd: keyword-only device_type
        if any(a.keyword is not None and a.keyword.value == "device_type" for a in args):
            return None
        dev_arg = cst.Arg(value=dev, **_kw("device_type"))
        if args:
            last = args[-1]
            args[-1] = last.with_changes(comma=_comma())
        new_args = args + [dev_arg]
    func = cst.parse_expression(callee)
    if call is None:
        return cst.Call(func=func, args=new_args)
    return call.with_changes(func=func, args=new_args)


_GUARD_WORDS = ("version", "hasattr", "TORCH_", "torch_version", "is_torch", "LooseVersion", "packaging")


def _version_guarded(ctx, node) -> bool:
    """A fallback for old torch: under an ``if`` / ``else`` whose test checks the torch version or ``hasattr``,
    or in an ``except`` handler (``try: torch.amp... except AttributeError: torch.cuda.amp...``)."""
    flow = ctx.evalflow
    cur = flow.parent.get(node)
    while cur is not None:
        if isinstance(cur, (cst.If, cst.IfExp, cst.While)):
            code = ctx.module.code_for_node(cur.test)
            if any(w in code for w in _GUARD_WORDS):
                return True
        elif isinstance(cur, cst.ExceptHandler):
            return True
        elif isinstance(cur, (cst.FunctionDef, cst.ClassDef)):
            return False
        cur = flow.parent.get(cur)
    return False


def _fallback_names(ctx, imports) -> set[str]:
    """Local names bound by an import made only as an old-torch fallback (``try: from torch.amp import autocast``
    / ``except ImportError: from torch.cuda.amp import autocast``, or under a version / ``hasattr`` test): on a
    current torch the name is ``torch.amp``'s, so its uses are not the deprecated API."""
    out: set[str] = set()
    for imp in imports:
        if not _version_guarded(ctx, imp) or isinstance(imp.names, cst.ImportStar):
            continue
        if isinstance(imp, cst.ImportFrom):
            mod = dotted(imp.module) if imp.module is not None else ""
            if not (mod or "").startswith(("torch.cuda", "torch.cpu")):
                continue
        for alias in imp.names:
            if isinstance(imp, cst.Import) and not (dotted(alias.name) or "").startswith(("torch.cuda.amp",
                                                                                          "torch.cpu.amp")):
                continue
            bound = alias.asname.name if alias.asname is not None else alias.name
            if isinstance(bound, (cst.Name, cst.Attribute)):
                d = dotted(bound)
                if d:
                    out.add(d.split(".")[0])
    return out


def _torch_target(ctx):
    try:
        tv = ctx.versions.torch
    except Exception:
        return None
    return tv


@rule(
    "BL206",
    "deprecated-cuda-amp",
    Severity.INFO,
    "torch.cuda.amp.* instead of torch.amp.*(\"cuda\")",
    fix=Applicability.SAFE,
)
def check(ctx) -> None:
    src = ctx.source
    if "amp" not in src:
        return
    sym = ctx.symbols
    if not sym.uses("torch"):
        return
    if "cuda.amp" not in src and "cpu.amp" not in src and not any(
            q.startswith(("torch.cuda.amp", "torch.cpu.amp")) for q in sym.imports.values()):
        return
    uses = _Uses(ctx.index)
    found: list[tuple[cst.CSTNode, Optional[cst.Call], str, str, str]] = []
    for c in uses.calls:
        if not isinstance(c.func, (cst.Name, cst.Attribute)):
            continue
        q = sym.qualname(c.func)
        if q in _DEPRECATED:
            found.append((c, c, q, *_DEPRECATED[q]))
    for d in uses.decorators:
        q = sym.qualname(d.decorator)
        if q in _DEPRECATED and _DEPRECATED[q][0] in ("custom_fwd", "custom_bwd"):
            found.append((d.decorator, None, q, *_DEPRECATED[q]))
    if not found:
        return
    fallback = _fallback_names(ctx, uses.imports)
    found = [f for f in found if not _version_guarded(ctx, f[0]) and not (
        fallback and (dotted(f[0].func if isinstance(f[0], cst.Call) else f[0]) or "").split(".")[0] in fallback)]
    if not found:
        return
    tv = _torch_target(ctx)
    if tv is not None and tv.below("2.4"):
        return  # not deprecated before torch 2.4 (and torch.amp.GradScaler only exists from 2.3)
    version = tv.describe() if tv is not None else "torch >= 2.4"
    t = torch_alias(sym)
    for node, call, q, kind, device in found:
        written = dotted(node.func if isinstance(node, cst.Call) else node) or q
        callee = f"{t}.amp.{kind}" if t else None
        fix = None
        if callee is not None:
            new = _new_call(call, callee, kind, device)
            if new is not None:
                new_code = ctx.module.code_for_node(new)
                note = "" if written.startswith(f"{t}.") else f" (then drop the `{written}` import if unused)"
                fix = ctx.fix(f"Use `{new_code}`{note}", [ctx.edit_replace(node, new_code)], Applicability.SAFE)
        if kind == "GradScaler":
            replacement = f'torch.amp.GradScaler("{device}", ...)'
        elif kind == "autocast":
            replacement = f'torch.amp.autocast("{device}", ...)'
        else:
            replacement = f'torch.amp.{kind}(..., device_type="{device}")'
        shown = f"{written}(...)" if call is not None else f"@{written}"
        alias = f" (`{written}` is `{q}`)" if written != q else ""
        ctx.report(
            node,
            f"`{shown}`{alias} is deprecated since torch 2.4 (it emits a FutureWarning); it is a "
            f"thin wrapper that passes \"{device}\" to the `torch.amp` version, so `{replacement}` behaves the "
            f"same. Target: {version}.",
            fix=fix,
            data={"qualname": q, "replacement": replacement},
        )
