"""The language server's pure helpers: `# noqa` edits agree with the engine's suppression, whole-document
edits are minimal, notebook rows map to their JSON lines, hovers carry the rule's page."""

from __future__ import annotations

import json
import textwrap

import pytest

from bertlint import api
from bertlint.lsp import convert
from bertlint.sources import NotebookJsonMap

BUGGY = textwrap.dedent(
    """\
    import torch


    def train(model, dl, optimizer, accum_steps=8):
        for i, batch in enumerate(dl):
            loss = model(**batch).loss / accum_steps
            loss.backward()
            optimizer.step(){comment}
            optimizer.zero_grad()
    """
)


def _apply(line: str, edit) -> str:
    s, e, new = edit
    return line[:s] + new + line[e:]


@pytest.mark.parametrize(
    "line, expected",
    [
        ("        optimizer.step()", "        optimizer.step()  # noqa: BL101"),
        ("        optimizer.step()   ", "        optimizer.step()  # noqa: BL101"),
        ("        optimizer.step()  # noqa: BL105", "        optimizer.step()  # noqa: BL105, BL101"),
        ("        optimizer.step()  # NOQA:BL105,BL2", "        optimizer.step()  # noqa: BL105, BL2, BL101"),
        ("        optimizer.step()  # keep the lr warm", "        optimizer.step()  # keep the lr warm  # noqa: BL101"),
    ],
)
def test_noqa_edit_text(line, expected):
    assert _apply(line, convert.noqa_edit(line, "BL101")) == expected


@pytest.mark.parametrize(
    "line",
    [
        "        optimizer.step()  # noqa",  # everything suppressed already
        "        optimizer.step()  # noqa: BL1",  # a prefix of the code suppresses it
        "        x = a + \\",  # a comment after a line continuation is a syntax error
    ],
)
def test_noqa_edit_not_offered(line):
    assert convert.noqa_edit(line, "BL101") is None


@pytest.mark.parametrize("comment", ["", "  # noqa: BL105", "  # keep the lr warm"])
def test_noqa_edit_is_what_the_engine_reads(comment):
    src = BUGGY.format(comment=comment)
    diags = [d for d in api.lint_text(src, "train.py") if d.code == "BL101"]
    assert diags, "the buggy loop must be flagged"
    lines = src.splitlines(keepends=True)
    row = diags[0].start.row - 1
    lines[row] = _apply(lines[row].rstrip("\n"), convert.noqa_edit(lines[row].rstrip("\n"), "BL101")) + "\n"
    fixed = "".join(lines)
    assert [d for d in api.lint_text(fixed, "train.py") if d.code == "BL101"] == []


def test_changed_block_is_minimal():
    old = "a\nb\nc\nd\n"
    assert convert.changed_block(old, old) is None
    assert convert.changed_block(old, "a\nB\nc\nd\n") == (1, 2, "B\n")
    assert convert.changed_block(old, "a\nb\nX\nY\nc\nd\n") == (2, 2, "X\nY\n")
    assert convert.changed_block(old, "a\nd\n") == (1, 3, "")
    first, end, new = convert.changed_block("x\ny", "x\nz")
    assert (first, end, new) == (1, 2, "z")


def test_ipynb_rows_skip_markdown_and_follow_code_cells():
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["loss.backward() in prose\n"]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "source": ["import torch\n", "x = 1"]},
            {"cell_type": "code", "metadata": {}, "outputs": [], "execution_count": None,
             "source": "loss.backward()\noptimizer.step()\n"},
        ],
        "metadata": {},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(nb, indent=1)
    rows = NotebookJsonMap(text)  # the map the server uses for an .ipynb opened as JSON (cells as Jupyter counts)
    lines = text.splitlines()
    line, col = rows.locate(2, 2, 1)
    assert lines[line - 1][col - 1 :].startswith("x = 1")
    line, col = rows.locate(3, 1, 1)
    assert lines[line - 1][col - 1 :].startswith("loss.backward()\\noptimizer")  # one JSON string holds both lines
    line, col = rows.locate(3, 2, 1)
    assert lines[line - 1][col - 1 :].startswith("optimizer.step()")
    assert NotebookJsonMap("{not json").locate(1, 1, 1) is None


def test_notebook_json_round_trips_through_the_library():
    text = convert.notebook_json(["import torch\n%pip install x", "for i, b in enumerate(dl):\n    loss = m(b) / accum_steps\n"
                                  "    loss.backward()\n    optimizer.step()\n    optimizer.zero_grad()"])
    diags = [d for d in api.lint_text(text, "nb.ipynb") if d.code == "BL101"]
    assert [(d.cell, d.start.row) for d in diags] == [(2, 4)]


def test_hover_text_has_the_summary():
    from bertlint.registry import get

    meta = get("BL101").meta
    md = convert.hover_markdown("BL101")
    assert md.startswith(f"**BL101** `{meta.name}` — {meta.summary}")
    plain = convert.hover_plain("BL101")
    assert plain.startswith(f"BL101 {meta.name}: {meta.summary}")
    if convert.page_path("BL101") is not None:
        assert "**What it finds**" in md and "Why it matters" not in md


def test_positions_count_lines_as_lsp_and_libcst_do():
    """A form feed (old GNU-style section breaks) or U+2028 inside a line is not a line end: the
    diagnostic's LSP range must still point at the flagged call."""
    pytest.importorskip("pygls")
    from pygls.workspace.position_codec import PositionCodec

    from bertlint.lsp.server import _lsp_range

    src = (
        BUGGY.format(comment="")
        .replace("import torch\n", 'import torch\n\x0c\nNOTE = "a\u2028b"\n')
        .replace("accum_steps\n        loss.backward()", "accum_steps\n\n        loss.backward()")
    )  # two rows above the call: a blank line (str.splitlines would read it for the call's row)
    (d,) = [d for d in api.lint_text(src, "train.py") if d.code == "BL101"]
    lines = convert.split_lines(src)
    rng = _lsp_range(lines, PositionCodec(), d.start, d.end)
    line = src.split("\n")[rng.start.line]
    assert line[rng.start.character : rng.end.character] == "optimizer.step()"
