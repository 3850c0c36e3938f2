"""Test code of a pytest / unittest test module (``test_*.py``, ``*_test.py``): its forwards and training steps check
outputs and numerics, their graphs live until the test returns, and none of it is part of a training run, so the
memory rules (BL501, BL502) do not judge it."""

from __future__ import annotations

import os

import libcst as cst

from bertlint.analysis.symbols import dotted


def pytest_test(ctx, flow, scope) -> bool:
    """``scope`` is test code pytest collects: a function of a ``test_*.py`` / ``*_test.py`` module (a ``test*``
    function, a method of a ``Test*`` class, or a helper of theirs such as ``assert_forward_matches``). Its forwards
    check outputs; their graph lives until the test returns and is no part of a training run, so a single eval-mode
    forward there is not an evaluation that wastes memory. A class counts as test code when pytest collects it (a
    ``Test*`` name, a ``unittest.TestCase``), when its name says it is test machinery (``ModelTesterMixin``,
    ``BertModelTester``), or when a collected test uses it; any other class of the module may be the project's own
    code kept there: still judged."""
    base = os.path.basename(ctx.filename or "")
    if not (base.startswith("test_") and base.endswith(".py") or base.endswith("_test.py")):
        return False
    if not isinstance(scope, cst.FunctionDef):
        return False
    owner = flow.parent.get(scope)
    while owner is not None and not isinstance(owner, (cst.ClassDef, cst.FunctionDef, cst.Module)):
        owner = flow.parent.get(owner)
    if owner is None or isinstance(owner, (cst.Module, cst.FunctionDef)):
        return True
    if not isinstance(owner, cst.ClassDef):
        return False
    collected = _collected_classes(ctx)
    if owner in collected:
        return True
    name = owner.name.value
    if "Test" in name:
        return True  # test machinery by its name in a test module: ``ModelTesterMixin``, ``BertModelTester``
    # a helper class the tests use (``self.helper = ForwardChecker(self)`` in a test case's ``setUp``): the forwards
    # of its methods are test code too
    return any(_loads_name(c, name) for c in collected)


def _collected_classes(ctx) -> list:
    """The test module's classes pytest collects: named ``Test*``, or a ``unittest.TestCase`` (any base whose
    name ends in ``TestCase``: ``unittest.TestCase``, ``absltest.TestCase``, ``parameterized.TestCase``)."""
    got = ctx.__dict__.get("_test_collected")
    if got is not None:
        return got
    out = []
    for st in ctx.module.body:
        if not isinstance(st, cst.ClassDef):
            continue
        if st.name.value.startswith("Test") or any(
                (dotted(b.value) or "").split(".")[-1].endswith("TestCase") for b in st.bases):
            out.append(st)
    ctx.__dict__["_test_collected"] = out
    return out


def _loads_name(node, name: str) -> bool:
    from bertlint.analysis.walk import iter_nodes

    return any(type(n) is cst.Name and n.value == name for n in iter_nodes(node))
