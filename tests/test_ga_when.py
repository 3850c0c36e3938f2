"""``_ga.when``: the "(when …)" clause of a loop finding names only the conditions the finding depends on, not the
whole configuration of whichever dry-run configuration reported it first."""

from __future__ import annotations

import textwrap

from bertlint.api import lint_text

HEAD = """\
import torch

def train(args, model, optimizer, loader, is_main):
    for step, batch in enumerate(loader):
        loss = model(batch).sum() / args.accum
        loss.backward()
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
"""
LOG = """\
        if is_main:
            print(loss.item())
"""

EVERY_CONFIG = HEAD + """\
        optimizer.step()
        optimizer.zero_grad()
""" + LOG

ONE_FLAG = HEAD + """\
        if args.eager:
            optimizer.step()
            optimizer.zero_grad()
        elif (step + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
""" + LOG


def _bl101(src):
    return [d for d in lint_text(textwrap.dedent(src), "train.py") if d.code == "BL101"]


def test_violation_in_every_configuration_has_no_when_clause():
    # `args.clip` splits the dry run into two configurations; the step runs on every micro-batch in both.
    [d] = _bl101(EVERY_CONFIG)
    assert d.start.row == 9
    assert "(when" not in d.message and "args.clip" not in d.message


def test_when_clause_names_only_the_condition_the_violation_depends_on():
    # Only `args.eager` decides whether the step runs every micro-batch; `args.clip` is set in the first
    # configuration that reported it but changes nothing.
    [d] = _bl101(ONE_FLAG)
    assert d.start.row == 10
    assert "(when `args.eager` is set)" in d.message
    assert "args.clip" not in d.message and "is_main" not in d.message


RAISING_ARM = """\
import torch

def train(args, model, optimizer, loader):
    for step, batch in enumerate(loader):
        if args.target == "eps":
            weight = 1.0
        elif args.target == "v":
            weight = 0.5
        else:
            raise ValueError(args.target)
        loss = model(batch).sum() * weight / args.accum
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_configuration_that_raises_is_not_named_in_when_clause():
    # The third arm raises: that configuration stops the script, so it does not make the finding depend on
    # `args.target`; the step runs on every micro-batch in both arms that train.
    [d] = _bl101(RAISING_ARM)
    assert d.start.row == 13
    assert "(when" not in d.message and "args.target" not in d.message
