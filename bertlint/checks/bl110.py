"""BL110 step-counter-counts-micro-batches: a counter advanced on every micro-batch is compared with a budget
that counts optimizer steps (``max_steps``, ``max_train_steps``, ``num_training_steps``): training stops after
1/N of the intended updates (and step-based logging / saving fires N times too often).

From the dry run: the counter's advances (``counter`` events) come on every micro-batch while the effective
optimizer steps come once per N; where it is compared with the budget, and the budget's units, are facts of the
loop's source (a budget visibly counted in micro-batches, or a bare parameter of the loop's function, is not
flagged)."""

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
    from bertlint.analysis import dryrun

    f = ctx.loops
    seen: set = set()
    for run in dryrun.of(ctx):
        loop = run.loop
        for tr in run.traces:
            counters = _per_micro_batch_counters(ctx, tr)
            if not counters:
                continue
            nodes = [loop.node] + [o.test for o in getattr(loop, "outer", []) if isinstance(o, cst.While)]
            for node in nodes:
                for comp in _comparisons(node):
                    if id(comp) in seen:
                        continue
                    sides = [comp.left] + [c.comparator for c in comp.comparisons]
                    names = [dotted(x) for x in sides]
                    ctr = next((n for n in names if n in counters), None)
                    budget = next((x for x in sides if dotted(x) != ctr and BUDGET.search(code_of(x))), None)
                    if ctr is None or budget is None:
                        continue
                    if f.units_of(budget, loop.func, tr.n_text) == "micro-batches" or _param(loop.func, budget):
                        continue
                    seen.add(id(comp))
                    n = str(tr.n) if tr.n_source == "resolved" else "N"
                    _ga.treport(
                        ctx, run, tr, comp,
                        f"`{ctr}` is advanced on every micro-batch, but `{code_of(budget).strip()}` counts optimizer "
                        f"steps and the optimizer steps once per {_ga.n_shown_t(tr)} micro-batches{_ga.when(tr)}: "
                        f"{counters[ctr]} → training stops after 1/{n} of the intended updates. Advance `{ctr}` "
                        f"inside the optimizer-step gate (or compare with `{code_of(budget).strip()} * "
                        f"{tr.n_text}`). ({_ga.owner_note(ctx, loop)}{_ga.trace_note(tr)})",
                    )


def _per_micro_batch_counters(ctx, tr) -> dict:
    """Counters (name -> the arithmetic, quoted from the trace) that the dry run advances on every micro-batch of a
    loop whose optimizer steps once per N of them: N > 1, every micro-batch has a backward, the effective steps are
    fewer than the micro-batches (hand gate, or accelerate's sync steps inside ``accumulate()``), and the counter is
    advanced exactly once on each micro-batch, never under a condition the run could not decide."""
    f = ctx.loops
    if not tr.complete or tr.n is None or tr.n <= 1:
        return {}
    if tr.owner == "accelerate":
        if f.accelerator_ga is None or f.accelerator_ga.is_more_than_one() is False:
            return {}
    elif tr.owner not in _ga.PLAIN_OWNERS or len(tr.optimizers()) > 1:
        return {}
    mbs = tr.micro_batches
    steps = tr.effective_steps()
    bws = [b for b in tr.of("backward") if b.certain]
    if mbs < 2 * tr.n or len({b.mb for b in bws}) < mbs or not steps or len(steps) >= mbs:
        return {}
    if any(not s.certain or s.effective is None for s in tr.of("step")):
        return {}
    if tr.owner != "accelerate":
        wins = tr.window_structure()
        if not wins or not any(w.n_mbs == tr.n for w in wins):
            return {}  # updates are not windows of N backwards
    by: dict = {}
    for e in tr.of("counter"):
        if e.via == "hand" and e.mb >= 0:
            by.setdefault(e.target, []).append(e)
    out = {}
    for name, evs in by.items():
        if any(not e.certain for e in evs) or sorted(e.mb for e in evs) != list(range(mbs)):
            continue
        out[name] = (f"micro-batches 1–{mbs}: `{name}` advanced on each ({len(evs)}×), optimizer stepped "
                     f"{len(steps)}×")
    return out


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
