"""BL107 partial-window: ``if i % N == 0: optimizer.step()`` on a 0-based index — the first update is made
from one micro-batch and every window is shifted (``exp_manual_ga_patterns.out`` P3: first step weight 0.25).

Not flagged: ``enumerate(dl, 1)``, a counter incremented before the test, ``(i + 1) % N == 0``. The end-of-epoch
tail (``(i + 1) % N`` without ``or i + 1 == len(dl)``) is not reported by this static pass: whether a tail
exists depends on the dataset length."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL107", "partial-window", Severity.WARNING,
      "i % N == 0 on a 0-based index: the first update comes from a single micro-batch")
def check(ctx) -> None:
    seen = set()
    for loop in ctx.loops:
        if loop.owner not in _ga.PLAIN_OWNERS:
            continue
        for e in loop.steps:
            for g in e.frequency_gates:
                if g.kind != "modulo" or not g.on_boundary or g.negated or not g.eq_zero:
                    continue
                if g.modulus_text and _ga._logging(g.modulus_text):
                    continue
                start = loop.index_start_at(g)
                if start != 0 or id(g.node) in seen:
                    continue
                nv = ctx.resolver.int_value(g.modulus, loop.func)
                if nv is not None and nv <= 1:
                    continue
                seen.add(id(g.node))
                n = str(nv) if nv is not None else g.modulus_text
                ctx.report(
                    g.node,
                    f"`{g.text}` is true on the very first micro-batch (`{g.index_text}` starts at 0): the first "
                    f"update is made from 1 micro-batch instead of {n}, and every later window is shifted by one "
                    f"(steps after micro-batches 1, {n}+1, 2×{n}+1, …). Use `({g.index_text} + 1) % {g.modulus_text} == 0`"
                    f" or `enumerate(..., 1)`.",
                )
