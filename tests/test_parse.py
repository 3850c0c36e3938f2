"""bertlint._parse.parse_module: the same tree as libcst.parse_module, the same errors, validation restored."""

import threading

import libcst as cst
import pytest
from libcst._nodes.base import CSTNode

from bertlint import _parse

SRC = '''import torch
from torch.cuda.amp import GradScaler


@torch.no_grad()
def evaluate(model, loader):
    model.eval()
    total = 0.0
    for (x, y) in loader:
        total += model(x, labels=y).loss.item()
    return total / max(1, len(loader))


for step, batch in enumerate(loader):
    with accelerator.accumulate(model):
        loss = model(**batch).loss / (args.gradient_accumulation_steps or 1)
        accelerator.backward(loss)
        if (step + 1) % 4 == 0:
            optimizer.step(); optimizer.zero_grad()
x = [i ** 2 for i in range(3) if i] ; y = {**d, "a": (1, 2)}; z = lambda *a, **k: (yield)
'''


def test_same_tree_and_code():
    a = cst.parse_module(SRC)
    b = _parse.parse_module(SRC)
    assert b.code == SRC
    assert a.deep_equals(b)
    assert CSTNode.__dict__["__post_init__"] is _parse._VALIDATE


def test_same_error_and_validation_restored_after_it():
    with pytest.raises(cst.ParserSyntaxError):
        cst.parse_module("def f(:\n")
    with pytest.raises(cst.ParserSyntaxError):
        _parse.parse_module("def f(:\n")
    assert CSTNode.__dict__["__post_init__"] is _parse._VALIDATE
    # a node built by hand is still checked once the parse is over
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")


def test_overlapping_parses_restore_libcst_validation():
    errors = []

    def work():
        try:
            for _ in range(20):
                assert _parse.parse_module(SRC).code == SRC
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    ts = [threading.Thread(target=work) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors
    assert _parse._active == 0
    assert CSTNode.__dict__["__post_init__"] is _parse._VALIDATE
    with pytest.raises(cst.CSTValidationError):
        cst.Name("")
