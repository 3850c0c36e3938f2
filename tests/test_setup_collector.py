"""setup's call/loop collection read from ctx.evalflow + ctx.index (``_SharedCollector``) equals the walk of its
own it replaced (``_Collector``): same CallSites (call, enclosing function, statement line, targets, expression
statement), same ``for`` loops, same ``order`` numbering, on every fixture and the benchmark scripts."""

import glob
import os

import libcst as cst

from bertlint.analysis import setup as S
from bertlint.analysis.walk import walk
from bertlint.config import Settings
from bertlint.context import FileContext

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _key(col):
    calls = [(id(c.call), id(c.func), id(c.stmt), c.targets, c.is_expr) for c in col.calls]
    return calls, [(id(f), id(fn)) for f, fn in col.fors], list(col.order.items())


def test_shared_collection_equals_own_walk():
    files = sorted(glob.glob(os.path.join(ROOT, "fixtures", "**", "*.py"), recursive=True))
    files += sorted(glob.glob(os.path.join(ROOT, "benchmarks", "data", "*.py")))
    compared = with_calls = 0
    for f in files:
        src = open(f, encoding="utf-8").read()
        try:
            module = cst.parse_module(src)
        except cst.ParserSyntaxError:
            continue
        own = S._Collector()
        walk(module, own)
        shared = S._SharedCollector(FileContext(f, src, module, Settings()))
        assert _key(shared) == _key(own), f
        compared += 1
        with_calls += bool(own.calls)
    assert compared > 50 and with_calls > 50
