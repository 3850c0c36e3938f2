"""Issue 12 (speed): decisions made from the tree instead of regenerated source positions give the same answers.

BL109's "some ``accelerator.prepare`` runs before the loop ends" compares a call with a loop by their places in the
tree (lowest common ancestor, children in source order) instead of their positions; the positions stay the
reference, checked here node for node on every pair of a file's calls and loops."""

import textwrap

import libcst as cst

from bertlint.api import lint_text
from bertlint.checks.bl109 import _starts_before_end
from bertlint.config import Settings
from bertlint.context import FileContext

PLAIN_LOOP = """\
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dl = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)
"""


def _script(prepare_where: str) -> str:
    before = "    model, optimizer, dl = accelerator.prepare(model, optimizer, dl)\n"
    loop = (
        "    for batch in dl:\n"
        "        loss = model(batch).sum()\n"
        "        loss.backward()\n"
        "        optimizer.step()\n"
        "        optimizer.zero_grad()\n"
    )
    body = PLAIN_LOOP
    if prepare_where == "before":
        body += before + loop
    elif prepare_where == "after":
        body += loop + before
    elif prepare_where == "after_same_line_start":
        body += loop + "    accelerator.prepare(model)\n"
    return (
        "import torch\nfrom accelerate import Accelerator\n\n\ndef main():\n"
        "    accelerator = Accelerator()\n" + body + "\n\nmain()\n"
    )


def _bl109(src: str) -> list:
    return [d for d in lint_text(src, "train.py", Settings()) if d.code == "BL109"]


def test_prepare_before_the_loop_flags_plain_backward():
    assert len(_bl109(_script("before"))) == 1


def test_prepare_only_after_the_loop_is_silent():
    # looks like the flagged file (a prepared model, a plain loss.backward()), but the loop trains first
    assert _bl109(_script("after")) == []
    assert _bl109(_script("after_same_line_start")) == []


SHAPES = textwrap.dedent(
    """\
    import torch
    x = accelerator.prepare(a)
    for i in range(3):
        y = accelerator.prepare(b) if i else f(accelerator.prepare(c))
        while g(accelerator.prepare(d)):
            pass
    z = [accelerator.prepare(e) for e in range(2)]
    def fn():
        for j in h(accelerator.prepare(k)):
            q = accelerator.prepare(m)
        else:
            accelerator.prepare(n)
        try:
            accelerator.prepare(o)
        finally:
            for _ in accelerator.prepare(p): pass
        accelerator.prepare(r)
    @deco(accelerator.prepare(s))
    def later(): pass
    for t in [1]: accelerator.prepare(u)
    accelerator.prepare(v)
    """
)


def test_tree_order_agrees_with_positions():
    module = cst.parse_module(SHAPES)
    ctx = FileContext("t.py", SHAPES, module, Settings())
    calls = ctx.index.of(cst.Call)
    loops = ctx.index.of(cst.For, cst.While, cst.FunctionDef)
    assert len(calls) > 10 and len(loops) > 4
    for loop in loops:
        end = ctx.span(loop)[1]
        for c in calls:
            at = ctx.span(c)[0]
            assert _starts_before_end(ctx, c, loop) == ((at.row, at.column) < (end.row, end.column)), (
                cst.Module([]).code_for_node(c), cst.Module([]).code_for_node(loop)[:30])


# Suppression: a text with no ``# noqa`` / ``# bertlint: ignore[...]`` anywhere is not tokenized (nothing in it can
# suppress); the look-alikes below still are, and decide as before.


def _with_comment_on_backward(comment: str) -> str:
    return _script("before").replace("        loss.backward()\n", f"        loss.backward()  {comment}\n")


def test_noqa_comment_still_suppresses():
    assert _bl109(_with_comment_on_backward("# NoQA: BL109")) == []
    assert _bl109(_with_comment_on_backward("# bertlint: ignore[BL1]")) == []


def test_noqa_in_a_string_or_for_another_code_does_not_suppress():
    src = _script("before").replace("        loss.backward()\n", '        loss.backward(); s = "# noqa"\n')
    assert len(_bl109(src)) == 1
    assert len(_bl109(_with_comment_on_backward("# noqa: BL2"))) == 1
    assert len(_bl109(_with_comment_on_backward("# a comment"))) == 1

