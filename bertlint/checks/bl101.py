"""BL101 optimizer-step-not-delayed — first, simple version proving the pipeline.
The loop-analysis issue replaces it with one reading ``ctx.loops``."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import call_name
from bertlint.registry import rule
from bertlint.types import Severity


class _Finder(cst.CSTVisitor):
    def __init__(self) -> None:
        self.loops: list[cst.For] = []

    def visit_For(self, node: cst.For) -> None:
        self.loops.append(node)


def _direct_calls(body: cst.BaseSuite):
    """Expression-statement calls directly in the loop body (not under an `if`)."""
    if not isinstance(body, cst.IndentedBlock):
        return
    for stmt in body.body:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    yield stmt, small.value


@rule(
    "BL101",
    "optimizer-step-not-delayed",
    Severity.ERROR,
    "optimizer.step() runs on every micro-batch of a loop that accumulates",
)
def check(ctx) -> None:
    f = _Finder()
    ctx.module.visit(f)
    for loop in f.loops:
        calls = list(_direct_calls(loop.body))
        names = [call_name(c) or "" for _, c in calls]
        if not any(n.endswith(".backward") for n in names):
            continue
        has_div = "/ " in ctx.module.code_for_node(loop.body) and "accum" in ctx.module.code_for_node(loop.body)
        for (stmt, call), name in zip(calls, names):
            if name.endswith("optimizer.step") and has_div:
                ctx.report(
                    call,
                    "`optimizer.step()` runs on every micro-batch while the loss is divided for accumulation: "
                    "each update sees one micro-batch. Call it only when `(i + 1) % N == 0`.",
                )
