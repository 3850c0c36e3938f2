"""BL302 checkpointing-with-kv-cache: checkpointing on a decoder model with ``use_cache=True``
(REFERENCE §1.7: the checkpointed layer forces ``use_cache=False`` with a warning; the cache is useless in training)."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import kwarg, literal
from bertlint.checks._trainer import checkpointing_sites
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL302", "checkpointing-with-kv-cache", Severity.WARNING, "checkpointing on a decoder model with use_cache=True")
def check(ctx) -> None:
    if "use_cache" not in ctx.source:
        return
    tv = ctx.versions.transformers
    reported: set[int] = set()
    for s in ctx.setup.setups:
        m = s.model
        if m is None:
            continue
        decoder = m.head in ("ForCausalLM", "LMHeadModel") or m.is_decoder is True or (
            (m.architecture or {}).get("is_decoder") is True)
        if not decoder or not checkpointing_sites(s, tv):
            continue
        node = m.use_cache_true
        how = ""
        if node is None and m.node is not None and hasattr(m.node, "args"):
            e = kwarg(m.node, "use_cache")
            if e is not None and literal(e) is True:
                node = e
            elif e is not None:
                # `use_cache=not args.no_gradient_checkpointing`: the shared evaluator, with its source
                func = next((x for x in ctx.index.ancestors(e) if isinstance(x, cst.FunctionDef)), None)
                f = ctx.resolver.fact(e, func) if hasattr(ctx.resolver, "fact") else None
                if f is not None and f.value is True:
                    node = e
                    if f.kind != "literal":
                        how = f" (`{ctx.module.code_for_node(e)}` is True: {f.source})"
        if node is None and s.args is not None and s.args.get("use_cache") is True:
            node = s.args.keyword_node("use_cache")
        if node is None:
            continue
        ckpt = ""
        a = s.args
        if a is not None and a.get("gradient_checkpointing") is True:
            o = a.origin("gradient_checkpointing")
            if o.startswith("argparse"):
                ckpt = f" Checkpointing is on with the command-line defaults ({o})."
        reported.add(id(node))
        ctx.report(
            node,
            f"`use_cache=True`{how} on a decoder model trained with activation checkpointing: the KV cache is of no "
            f"use in training, and each checkpointed layer forces `use_cache=False` with a warning (on "
            f"{tv.describe()}); the setting is also saved into the model's config.{ckpt} Fix: `use_cache=False` "
            f"while training.",
        )

    _handed_models(ctx, tv, reported)


def _handed_models(ctx, tv, reported: set) -> None:
    """A model the file does not build (a function's parameter, ``self.model``): it is a transformers model by usage
    when the same function calls ``X.gradient_checkpointing_enable()`` on it, and one with a KV cache when the
    function sets ``X.config.use_cache = True``. Whether it is a decoder is not known here, so the finding says
    that it holds for a decoder (an encoder ignores the flag)."""
    enabled: dict[tuple, cst.Call] = {}  # (model expression, function) -> its first enable call
    for call, name, func in ctx.symbols.calls:
        if name.endswith(".gradient_checkpointing_enable"):
            enabled.setdefault((name[: -len(".gradient_checkpointing_enable")], id(func)), call)
    if not enabled:
        return
    for target, assigns in ctx.symbols.assignments.items():
        if not target.endswith(".config.use_cache"):
            continue
        owner = target[: -len(".config.use_cache")]
        if any(literal(a.value) is not True for a in assigns):
            continue  # the file also sets it otherwise (per configuration, or restored later): not left on
        for a in assigns:
            if id(a.node) in reported or literal(a.value) is not True or (owner, id(a.func)) not in enabled:
                continue
            if any(s.model is not None and s.model.use_cache_true is a.node for s in ctx.setup.setups):
                continue
            at, on = ctx.span(a.node)[0], ctx.span(enabled[(owner, id(a.func))])[0]
            if (at.row, at.column) > (on.row, on.column):
                continue  # set after checkpointing was switched on: typically restored for saving or generation
            ctx.report(
                a.node,
                f"`{target} = True` and `{owner}.gradient_checkpointing_enable()` in the same function: when "
                f"`{owner}` is a decoder (a model with a KV cache, which the `use_cache` flag implies), the cache is "
                f"of no use in training and each checkpointed layer forces `use_cache=False` with a warning (on "
                f"{tv.describe()}); the setting is also saved into the model's config. Fix: "
                f"`{target} = False` while training.",
            )
