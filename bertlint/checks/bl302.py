"""BL302 checkpointing-with-kv-cache: checkpointing on a decoder model with ``use_cache=True``
(REFERENCE §1.7: the checkpointed layer forces ``use_cache=False`` with a warning; the cache is useless in training)."""

from __future__ import annotations

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
        if node is None and m.node is not None and hasattr(m.node, "args"):
            e = kwarg(m.node, "use_cache")
            node = e if e is not None and literal(e) is True else None
        if node is None and s.args is not None and s.args.get("use_cache") is True:
            node = s.args.keyword_node("use_cache")
        if node is None:
            continue
        ctx.report(
            node,
            f"`use_cache=True` on a decoder model trained with activation checkpointing: the KV cache is of no use "
            f"in training, and each checkpointed layer forces `use_cache=False` with a warning (on {tv.describe()}); "
            f"the setting is also saved into the model's config. Fix: `use_cache=False` while training.",
        )
