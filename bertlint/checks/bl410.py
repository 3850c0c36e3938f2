"""BL410 step-units: logging/eval/save/warmup/max steps computed from a data length (micro-batches) although the Trainer
counts them in optimizer steps (REFERENCE §1.5)."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import code_of
from bertlint.registry import rule
from bertlint.types import Severity

_STEP_ARGS = ("max_steps", "logging_steps", "eval_steps", "save_steps", "warmup_steps")


class _Names(cst.CSTVisitor):
    def __init__(self):
        self.names = []

    def visit_Name(self, node):
        self.names.append(node.value)


def _names_of(ctx, expr, func, depth=0, out=None) -> set:
    """Every name an expression uses, following assignments 3 levels deep."""
    out = set() if out is None else out
    if expr is None or depth >= 3:
        return out
    v = _Names()
    expr.visit(v)
    for name in v.names:
        if name in out:
            continue
        out.add(name)
        for a in ctx.symbols.assignments_of(name, func):
            _names_of(ctx, a.value, a.func, depth + 1, out)
    return out


def _expr_text(ctx, expr, func, depth=0, seen=None) -> str:
    """The expression's code followed by the code of every name it uses (3 levels deep), so that a divisor named
    elsewhere (``EFFECTIVE = BATCH * GRAD_ACC``; ``len(ds) // EFFECTIVE``) is seen."""
    seen = set() if seen is None else seen
    text = code_of(expr)
    if depth >= 3:
        return text
    v = _Names()
    expr.visit(v)
    for name in v.names:
        if name in seen:
            continue
        seen.add(name)
        for a in ctx.symbols.assignments_of(name, func):
            text += " " + _expr_text(ctx, a.value, a.func, depth + 1, seen)
    return text


@rule("BL410", "step-units", Severity.INFO,
      "logging/eval/save/warmup/max steps computed in micro-batches although they count optimizer steps")
def check(ctx) -> None:
    if "len(" not in ctx.source:
        return
    for ta in ctx.setup.training_args:
        n = ta.int("gradient_accumulation_steps")
        if n is None or n <= 1:
            continue
        ga_node = ta.keyword_node("gradient_accumulation_steps")
        ga_text = code_of(ga_node.value) if isinstance(ga_node, cst.Arg) else None
        # names the accumulation is derived from, other than the per-device batch's own: a step count divided by
        # one of them (``GA = GLOBAL // MICRO``; ``len(ds) // GLOBAL``) counts optimizer steps already
        ga_names = _names_of(ctx, ga_node.value, ta.func) if isinstance(ga_node, cst.Arg) else set()
        bs_node = ta.keyword_node("per_device_train_batch_size")
        if isinstance(bs_node, cst.Arg):
            ga_names -= _names_of(ctx, bs_node.value, ta.func)
        for name in _STEP_ARGS:
            node = ta.keyword_node(name)
            if not isinstance(node, cst.Arg) or node.keyword is None or node.keyword.value != name:
                continue
            text = _expr_text(ctx, node.value, ta.func)
            if "len(" not in text:
                continue
            if ga_names & _names_of(ctx, node.value, ta.func):
                continue
            low = text.lower()
            if "accum" in low or (ga_text and ga_text in text) or f"// {n}" in text or f"/ {n}" in text:
                continue
            if isinstance(ta.get(name), float) and name == "warmup_steps" and ta.get(name) < 1:
                continue
            ctx.report(
                node,
                f"`{name}` is computed from a data length ({code_of(node.value)}), which counts micro-batches, but "
                f"the Trainer counts `{name}` in optimizer steps — one per {n} micro-batches "
                f"(gradient_accumulation_steps={n}) — so it is {n}× too large. Fix: divide by "
                f"gradient_accumulation_steps (e.g. `math.ceil(len(train_dataloader) / {n})`).",
            )
