"""The language server's incremental parse (bertlint/incremental.py) gives the module a full parse gives."""

from __future__ import annotations

import os
import re

import libcst as cst

from bertlint import api
from bertlint.incremental import Reparser

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "data", "train_small.py")


def _edits(text: str):
    """Editor-like single edits, deterministic: a letter typed into a name, comment and blank lines added and
    removed (at column 0 and indented, so that they may move between a block and the next statement), a
    comment typed at the end of a line, the header changed, text appended at the end."""
    lines = text.splitlines(keepends=True)
    out = []
    for i in range(0, len(lines), max(1, len(lines) // 12)):
        line = lines[i]
        m = re.search(r"[A-Za-z_]", line)
        if m:
            out.append("".join(lines[:i] + [line[: m.end()] + "q" + line[m.end() :]] + lines[i + 1 :]))
        indent = line[: len(line) - len(line.lstrip(" "))]
        out.append("".join(lines[:i] + [indent + "# typed\n"] + lines[i:]))
        out.append("".join(lines[:i] + ["# typed\n"] + lines[i:]))
        out.append("".join(lines[:i] + ["\n"] + lines[i:]))
        if not line.strip() or line.lstrip().startswith("#"):
            out.append("".join(lines[:i] + lines[i + 1 :]))
    out.append("# a header comment\n" + text)
    out.append(text + "# trailing comment")
    out.append(text + "\nx = 1\n")
    return out


def test_incremental_parse_equals_full_parse():
    with open(SCRIPT) as f:
        text = f.read()
    r = Reparser()
    assert isinstance(r.parse("k", text), cst.Module)
    spliced = 0
    for new in _edits(text):
        got = r.parse("k", new)
        try:
            full = cst.parse_module(new)
        except cst.ParserSyntaxError:  # a letter typed into a keyword: the full parse's error, no splice
            assert isinstance(got, tuple)
            continue
        assert isinstance(got, cst.Module)
        assert got.code == new
        assert got.deep_equals(full), new
        spliced += r.last_reparsed is not None
        # back to the original text: a second splice, from the edited module
        back = r.parse("k", text)
        assert back.code == text and back.deep_equals(cst.parse_module(text))
    assert spliced > 25  # the edits were spliced, not parsed in full


def test_incremental_parse_syntax_error_is_the_full_parse_error():
    with open(SCRIPT) as f:
        text = f.read()
    r = Reparser()
    r.parse("k", text)
    i = text.index("def ")
    broken = text[:i] + "def (\n" + text[i:]
    got = r.parse("k", broken)
    assert isinstance(got, tuple)  # (message, row, col) from the full parse
    assert api.lint_text(broken, "t.py")[0].code == "BL001"
    assert isinstance(r.parse("k", text), cst.Module)


def test_lint_with_incremental_parse_same_diagnostics():
    path = os.path.join(ROOT, "examples", "train_bert_accum.py")
    with open(path) as f:
        text = f.read()
    r = Reparser()
    parse = lambda t: r.parse(path, t)  # noqa: E731
    assert api.lint_text(text, path, parse=parse) == api.lint_text(text, path)
    for new in _edits(text)[::9]:
        assert api.lint_text(new, path, parse=parse) == api.lint_text(new, path)


def test_an_edit_after_a_statements_first_line_does_not_parse_the_statement_before():
    # typing at the end of the file (after `if __name__ == "__main__": main()`) re-parses that statement only,
    # not the long main() before it; an edit in the lines between two statements still takes both
    with open(SCRIPT) as f:
        text = f.read()
    r = Reparser()
    r.parse("k", text)
    for new in (text + "# typed at the end\n", text + "    # indented, at the end\n", text + "#"):
        got = r.parse("k", new)
        assert got.code == new and got.deep_equals(cst.parse_module(new))
        assert r.last_reparsed[0] == 1, r.last_reparsed
        r.parse("k", text)
    lines = text.splitlines(keepends=True)
    last = max(i for i, ln in enumerate(lines) if ln.startswith("if __name__"))
    new = "".join(lines[:last] + ["# between\n"] + lines[last:])
    got = r.parse("k", new)
    assert got.deep_equals(cst.parse_module(new)) and r.last_reparsed[0] == 2


def test_stored_statement_lengths_are_the_printed_ones():
    """After every splice the lengths the parser keeps (one statement's derived from the fragment's length, the
    others printed) are the printed lengths of the new module's statements: the next edit is placed by them."""
    from bertlint.incremental import _lengths

    path = os.path.join(ROOT, "benchmarks", "data", "train_large.py")
    with open(path) as f:
        text = f.read()
    r = Reparser()
    r.parse("k", text)
    lines = text.splitlines(keepends=True)
    checked = 0
    for i in range(0, len(lines), max(1, len(lines) // 40)):
        for new in ("".join(lines[:i] + [lines[i].rstrip("\n") + "  # q\n"] + lines[i + 1 :]),
                    "".join(lines[:i] + ["    \n"] + lines[i:])):
            got = r.parse("k", new)
            if not isinstance(got, cst.Module) or r.last_reparsed is None:
                continue
            _text, module, header, lens = r._docs["k"]
            assert (header, lens) == _lengths(module, new)
            checked += 1
    assert checked > 40


def test_an_edit_inside_a_function_reparses_only_the_block_statements_it_touches():
    """Typing inside a function's body re-parses the touched statements of the innermost block (with one
    neighbour each side): the function's other statements are the old node objects, the module is the full
    parse's; every line of a script, with several kinds of edits, and back."""
    with open(SCRIPT) as f:
        text = f.read()
    lines = text.splitlines(keepends=True)
    r = Reparser()
    old = r.parse("k", text)
    kept = nested = 0
    for i, line in enumerate(lines):
        indent = line[: len(line) - len(line.lstrip(" "))]
        if not indent or i % 5:
            continue
        for new_lines in (lines[:i] + [indent + "x_typed = 1\n"] + lines[i:],
                          lines[:i] + [line.rstrip("\n") + "  # q\n"] + lines[i + 1 :],
                          lines[:i] + lines[i + 1 :]):  # a line deleted: a block's first line, its indentation
            new = "".join(new_lines)
            got = r.parse("k", new)
            try:
                full = cst.parse_module(new)
            except cst.ParserSyntaxError:
                assert isinstance(got, tuple)
                r.parse("k", text)
                continue
            assert got.code == new and got.deep_equals(full), (i, line)
            edit = r.edits["k"]
            if edit is not None and len(edit.replaced) > 1:
                nested += 1
                old_ids = {id(n) for n in _statements(old)}
                kept += sum(id(n) in old_ids for n in _statements(got)) > len(old_ids) // 2
            back = r.parse("k", text)
            assert back.code == text and back.deep_equals(cst.parse_module(text)), (i, line)
            old = back
    assert nested > 15 and kept > 0.75 * nested


def _statements(module):
    out = []
    stack = list(module.body)
    while stack:
        n = stack.pop()
        out.append(n)
        body = getattr(n, "body", None)
        if isinstance(body, cst.IndentedBlock):
            stack.extend(body.body)
    return out
