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
        ctx.report(
            node,
            f"`use_cache=True`{how} on a decoder model trained with activation checkpointing: the KV cache is of no "
            f"use in training, and each checkpointed layer forces `use_cache=False` with a warning (on "
            f"{tv.describe()}); the setting is also saved into the model's config.{ckpt} Fix: `use_cache=False` "
            f"while training.",
        )
