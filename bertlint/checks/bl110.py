"""BL110 step-counter-counts-micro-batches: a counter advanced on every micro-batch is compared with a budget
that counts optimizer steps (``max_steps``, ``max_train_steps``, ``num_training_steps``): training stops after
1/N of the intended updates (and step-based logging / saving fires N times too often)."""

from __future__ import annotations

import re

import libcst as cst

from bertlint.analysis.symbols import code_of, dotted
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity

BUDGET = re.compile(r"max_(train_)?steps|total_(training_)?steps|num_training_steps|max_updates|num_update_steps|"
                    r"total_updates|max_optim", re.IGNORECASE)
_OPS = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual, cst.Equal)


@rule("BL110", "step-counter-counts-micro-batches", Severity.WARNING,
      "a global-step counter advanced per micro-batch compared with an optimizer-step budget")
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        if loop.owner == "accelerate":
            # inside accumulate() the optimizer steps only on sync steps: a counter advanced outside
            # `if accelerator.sync_gradients:` counts micro-batches
            if f.accelerator_ga is None or f.accelerator_ga.is_more_than_one() is False:
                continue
        elif loop.owner not in _ga.PLAIN_OWNERS or not _ga.accum_gated(loop) or not _ga.single_optimizer(loop):
            continue
        acc = loop.accum()
        if acc is None or acc.value == 1:
            continue
        counters = {c.name for c in loop.counters if c.per_micro_batch}
        gated = {c.name for c in loop.counters if not c.per_micro_batch}
        counters -= gated
        if not counters:
            continue
        nodes = [loop.node] + [o.test for o in loop.outer if isinstance(o, cst.While)]
        seen = set()
        for node in nodes:
            for comp in _comparisons(node):
                if id(comp) in seen:
                    continue
                sides = [comp.left] + [c.comparator for c in comp.comparisons]
                names = [dotted(s) for s in sides]
                ctr = next((n for n in names if n in counters), None)
                budget = next((s for s in sides if dotted(s) != ctr and BUDGET.search(code_of(s))), None)
                if ctr is None or budget is None:
                    continue
                if f.units_of(budget, loop.func, acc.text) == "micro-batches" or _param(loop.func, budget):
                    continue
                seen.add(id(comp))
                _ga.report(
                ctx, loop,
                    comp,
                    f"`{ctr}` is advanced on every micro-batch, but `{code_of(budget).strip()}` counts optimizer steps "
                    f"and the optimizer steps once per {acc.shown} micro-batches: training stops after 1/{acc.n} of the "
                    f"intended updates. Advance `{ctr}` inside the optimizer-step gate (or compare with "
                    f"`{code_of(budget).strip()} * {acc.text}`). ({_ga.owner_note(ctx, loop)})",
                )


def _comparisons(node):
    out = []

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, n) -> bool:
            return False

        def visit_Comparison(self, n: cst.Comparison) -> None:
            if all(isinstance(c.operator, _OPS) for c in n.comparisons):
                out.append(n)

    node.visit(V())
    return out



def _param(func, budget) -> bool:
    """The budget is a bare parameter of the loop's function: its units are whatever the callers pass (a name is
    a hint, not evidence that it counts optimizer steps)."""
    if func is None or not isinstance(budget, cst.Name):
        return False
    ps = list(func.params.params) + list(func.params.kwonly_params) + list(func.params.posonly_params)
    return any(p.name.value == budget.value for p in ps)
