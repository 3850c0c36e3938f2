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
        if loop.owner not in _ga.PLAIN_OWNERS or not _ga.single_optimizer(loop):
            continue
        for e in loop.steps:
            for g in e.frequency_gates:
                if g.kind != "modulo" or not g.on_boundary or g.extra:
                    continue
                if not _ga.accum_gate(ctx, loop, g):
                    continue
                start = loop.index_start_at(g)
                if start != 0 or id(g.node) in seen:
                    continue
                nv = ctx.loops.int_value(g.modulus, loop.func)
                if nv is not None and nv <= 1:
                    continue
                seen.add(id(g.node))
                n = str(nv) if nv is not None else "N"
                idx = f"({g.index_text} + {g.offset})" if g.offset > 0 else g.index_text
                plain = g.text.replace(" ", "") == f"{idx}%{g.modulus_text}==0".replace(" ", "")
                when = f"when `{idx} % {g.modulus_text} == 0`" + (
                    "" if plain else f" (the `else` of `{g.text}`)" if g.in_else else f" (`{g.text}`)"
                )
                seq = f"1, {nv + 1}, {2 * nv + 1}" if nv is not None else "1, N+1, 2N+1"
                _ga.report(
                ctx, loop,
                    g.node,
                    f"The optimizer steps {when}, which holds on the very first micro-batch (`{g.index_text}` "
                    f"starts at 0): the first update is made from 1 micro-batch instead of {n} "
                    f"(`{g.modulus_text}`), and every later window is shifted by one (updates after micro-batches "
                    f"{seq}, …). Step when `({g.index_text} + 1) % {g.modulus_text} == 0`, or use `enumerate(..., 1)`. "
                    f"({_ga.owner_note(ctx, loop)})",
                )
