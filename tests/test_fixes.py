"""Fix plumbing: safe/unsafe selection, edits applied from the end, overlaps deferred, a fix that breaks parsing
reverted and reported with its code, atomic writes, idempotence (a second --fix changes nothing), notebooks."""

from __future__ import annotations

import json
import os

import libcst as cst
import pytest

from bertlint import registry
from bertlint.analysis.symbols import call_name
from bertlint.api import apply_fixes, check_file, fix_text, lint_text
from bertlint.cli import main
from bertlint.config import Settings, clear_caches
from bertlint.fixes import apply_fixes as raw_apply, atomic_write
from bertlint.types import Applicability, Diagnostic, Edit, Fix, Position, Severity

S = Settings(select=["BL999", "BL001"])


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[cst.Call] = []

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)


def demo_check(ctx) -> None:
    """old_api() -> new_api() (safe); risky() -> careful() (unsafe); breakme() -> a fix that does not parse;
    stepper() -> insert a line after the statement (safe)."""
    v = _Calls()
    ctx.module.visit(v)
    for c in v.calls:
        name = call_name(c)
        if name == "old_api":
            ctx.report(c, "old_api() is gone", fix=ctx.fix("Use new_api()", [ctx.edit_replace(c.func, "new_api")]))
        elif name == "risky":
            ctx.report(
                c, "risky()", fix=ctx.fix("Use careful()", [ctx.edit_replace(c.func, "careful")], Applicability.UNSAFE)
            )
        elif name == "breakme":
            ctx.report(c, "breakme()", fix=ctx.fix("Break it", [ctx.edit_replace(c, "breakme((")]))
        elif name == "flagged":
            ctx.report(c, "flagged() has no fix")


@pytest.fixture
def demo_rule():
    registry.all_rules()
    registry.rule("BL999", "demo-rule", Severity.WARNING, "demo rule for the fix plumbing", fix=Applicability.SAFE)(
        demo_check
    )
    clear_caches()
    yield
    registry._RULES.pop("BL999", None)


SRC = "import torch\n\nold_api(1)\nx = risky(2) + old_api(3)\nflagged()\n"


def test_safe_fixes_only_by_default(demo_rule):
    diags = lint_text(SRC, "t.py", S)
    assert [(d.start.row, d.start.column) for d in diags] == [(3, 1), (4, 5), (4, 16), (5, 1)]
    r = apply_fixes(SRC, diags)
    assert r.text == "import torch\n\nnew_api(1)\nx = risky(2) + new_api(3)\nflagged()\n"
    assert [d.start.row for d in r.applied] == [3, 4] and r.failed == []
    r = apply_fixes(SRC, diags, unsafe=True)
    assert r.text == "import torch\n\nnew_api(1)\nx = careful(2) + new_api(3)\nflagged()\n"


def test_breaking_fix_is_reverted_and_reported_with_its_code(demo_rule):
    src = "import torch\nold_api(1)\nbreakme()\n"
    r = apply_fixes(src, lint_text(src, "t.py", S))
    assert r.text == "import torch\nnew_api(1)\nbreakme()\n"
    assert len(r.failed) == 1
    d, why = r.failed[0]
    assert d.code == "BL999" and why.startswith("BL999: the fix was reverted because the result does not parse")


def test_overlapping_fixes_are_deferred_to_the_next_round():
    def diag(row, c1, c2, content):
        e = Edit(content, Position(row, c1), Position(row, c2))
        return Diagnostic("BL999", "demo", Severity.WARNING, "m", "t.py", e.start, e.end, Fix("f", Applicability.SAFE, (e,)))

    text = "abcdef\n"
    r = raw_apply(text, [diag(1, 1, 4, "X"), diag(1, 3, 6, "Y"), diag(1, 6, 7, "Z")], parses=lambda t: None)
    assert r.text == "XdeZ\n" and len(r.applied) == 2 and r.failed == []
    # an edit outside the file is reported, not applied
    r = raw_apply(text, [diag(9, 1, 2, "Q")], parses=lambda t: None)
    assert r.text == text and r.failed and "outside the file" in r.failed[0][1]


def test_fix_text_reaches_a_fixed_point(demo_rule):
    new, applied, failed, remaining = fix_text(SRC, "t.py", S, unsafe=True)
    assert len(applied) == 3 and failed == []
    assert [d.message for d in remaining] == ["flagged() has no fix"]
    again, applied2, _, _ = fix_text(new, "t.py", S, unsafe=True)
    assert again == new and applied2 == []


def test_cli_fix_writes_atomically_and_second_run_changes_nothing(demo_rule, tmp_path, capsys):
    p = tmp_path / "train.py"
    p.write_text(SRC)
    os.chmod(p, 0o640)
    assert main(["--select", "BL999", "--fix", str(p)]) == 1  # flagged() remains
    assert p.read_text() == "import torch\n\nnew_api(1)\nx = risky(2) + new_api(3)\nflagged()\n"
    assert oct(os.stat(p).st_mode & 0o777) == "0o640"
    out = capsys.readouterr().out
    assert "Found 4 problems (2 fixed, 2 remaining)." in out
    before = p.read_bytes()
    mtime = os.stat(p).st_mtime_ns
    main(["--select", "BL999", "--fix", str(p)])
    assert p.read_bytes() == before and os.stat(p).st_mtime_ns == mtime
    assert [f for f in os.listdir(tmp_path) if f.startswith(".bertlint-")] == []
    assert main(["--select", "BL999", "--fix", "--unsafe-fixes", str(p)]) == 1
    assert "careful(2)" in p.read_text()


def test_cli_fix_exit_0_when_everything_was_fixed(demo_rule, tmp_path, capsys):
    p = tmp_path / "train.py"
    p.write_text("import torch\nold_api()\n")
    assert main(["--select", "BL999", "--fix", str(p)]) == 0
    assert p.read_text() == "import torch\nnew_api()\n"


def test_cli_diff_writes_nothing(demo_rule, tmp_path, capsys):
    p = tmp_path / "train.py"
    p.write_text(SRC)
    assert main(["--select", "BL999", "--diff", str(p)]) == 1
    out = capsys.readouterr().out
    assert p.read_text() == SRC
    assert out.startswith(f"--- {p}\n+++ {p}\n@@ -1,5 +1,5 @@\n")
    assert "-old_api(1)\n-x = risky(2) + old_api(3)\n+new_api(1)\n+x = risky(2) + new_api(3)\n" in out
    q = tmp_path / "clean.py"
    q.write_text("import torch\n")
    assert main(["--select", "BL999", "--diff", str(q)]) == 0


def test_cli_reports_a_reverted_fix(demo_rule, tmp_path, capsys):
    p = tmp_path / "train.py"
    p.write_text("import torch\nbreakme()\n")
    assert main(["--select", "BL999", "--fix", str(p)]) == 1
    assert p.read_text() == "import torch\nbreakme()\n"
    err = capsys.readouterr().err
    assert "failed to apply the fix for BL999 at 2:1: BL999: the fix was reverted" in err


def test_encoding_and_newlines_are_preserved(demo_rule, tmp_path):
    p = tmp_path / "train.py"
    p.write_bytes("# -*- coding: latin-1 -*-\r\nimport torch\r\nold_api('café')\r\n".encode("latin-1"))
    r = check_file(str(p), S, fix=True, write=True)
    assert len(r.applied) == 1
    assert p.read_bytes() == "# -*- coding: latin-1 -*-\r\nimport torch\r\nnew_api('café')\r\n".encode("latin-1")


def test_atomic_write_leaves_no_temp_on_failure(tmp_path, monkeypatch):
    p = tmp_path / "f.py"
    p.write_text("old")

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError):
        atomic_write(str(p), b"new")
    assert p.read_text() == "old" and os.listdir(tmp_path) == ["f.py"]


def test_notebook_fixes_are_applied_per_cell(demo_rule, tmp_path, capsys):
    nb = {
        "cells": [
            {"cell_type": "code", "source": ["import torch\n", "%matplotlib inline"], "metadata": {}, "outputs": [], "execution_count": None},
            {"cell_type": "markdown", "source": "old_api()", "metadata": {}},
            {"cell_type": "code", "source": ["x = 1\n", "old_api(x)"], "metadata": {}, "outputs": [], "execution_count": None},
        ],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb))
    diags = lint_text(p.read_text(), str(p), S)
    assert [(d.cell, d.start.row, d.start.column) for d in diags] == [(3, 2, 1)]  # the markdown cell is cell 2
    assert diags[0].fix.edits[0].start == Position(2, 1)
    assert main(["--select", "BL999", "--fix", str(p)]) == 0
    fixed = json.loads(p.read_text())
    assert fixed["cells"][2]["source"] == ["x = 1\n", "new_api(x)"]
    assert fixed["cells"][0]["source"] == ["import torch\n", "%matplotlib inline"]
    assert fixed["cells"][1]["source"] == "old_api()"


def test_fixing_every_fixture_is_idempotent_and_never_breaks_a_file(tmp_path, capsys):
    """All the real rules' fixes over the fixture corpus: applied, the files still parse, a second
    `--fix --unsafe-fixes` changes nothing, and no fix had to be reverted."""
    import shutil
    from pathlib import Path

    from bertlint.engine import parse_python

    root = Path(__file__).resolve().parent.parent / "fixtures"
    if not root.is_dir():
        pytest.skip("no fixtures")
    work = tmp_path / "fixtures"
    shutil.copytree(root, work)
    parsed_before = {
        p for p in work.rglob("*.py") if not isinstance(parse_python(p.read_text(encoding="utf-8", errors="replace")), tuple)
    }
    main(["--fix", "--unsafe-fixes", "-q", "--output-format", "concise", str(work)])
    err = capsys.readouterr().err
    assert "failed to apply the fix" not in err, err
    assert "Traceback" not in err
    first = {p: p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()}
    for p, data in first.items():
        if p in parsed_before:
            assert not isinstance(parse_python(data.decode("utf-8")), tuple), f"{p} no longer parses"
    main(["--fix", "--unsafe-fixes", "-q", "--output-format", "concise", str(work)])
    capsys.readouterr()
    second = {p: p.read_bytes() for p in sorted(work.rglob("*")) if p.is_file()}
    assert [p.name for p in first if first[p] != second.get(p)] == []


def _config_demo(ctx) -> None:
    if isinstance(ctx.data, dict) and "bad" in ctx.data:
        p = ctx.key_position(("bad",))
        e = Edit("good", Position(p.row, p.column + 1), Position(p.row, p.column + 4))
        ctx.report_at(p.row, p.column, "rename", fix=Fix("rename the key", Applicability.SAFE, (e,)))
    if isinstance(ctx.data, dict) and "breaks" in ctx.data:
        p = ctx.key_position(("breaks",))
        e = Edit("{", Position(p.row, p.column), Position(p.row, p.column))
        ctx.report_at(p.row, p.column, "break", fix=Fix("break it", Applicability.SAFE, (e,)))


@pytest.fixture
def config_rule():
    registry.all_rules()
    registry.rule("BL995", "demo-config", Severity.WARNING, "config demo", fix=Applicability.SAFE, targets=("config",))(
        _config_demo
    )
    yield
    registry._RULES.pop("BL995", None)


@pytest.mark.parametrize("name, text, fixed", [
    ("ds.json", '{"bad": 1}\n', '{"good": 1}\n'),
    ("acc.yaml", "x: 1\n'bad': 2\n", "x: 1\n'good': 2\n"),
])
def test_config_fixes_are_checked_with_the_config_parser(config_rule, name, text, fixed):
    new, applied, failed, remaining = fix_text(text, name, Settings(select=["BL995"]))
    assert new == fixed and len(applied) == 1 and failed == [] and remaining == []
    broken = text.replace("bad", "breaks")
    new, applied, failed, _ = fix_text(broken, name, Settings(select=["BL995"]))
    assert new == broken and applied == [] and failed and failed[0][1].startswith("BL995: the fix was reverted")
    r = apply_fixes(text, lint_text(text, name, Settings(select=["BL995"])))
    assert r.text == fixed


def test_notebook_fix_keeps_the_json_layout(demo_rule, tmp_path):
    nb = {"cells": [{"cell_type": "code", "source": ["import torch\n", "old_api('é')"], "metadata": {},
                     "outputs": [], "execution_count": None}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(nb, indent=2, ensure_ascii=True))  # no final newline, \u escapes
    assert main(["--select", "BL999", "--fix", str(p)]) == 0
    nb["cells"][0]["source"][1] = "new_api('é')"
    assert p.read_text() == json.dumps(nb, indent=2, ensure_ascii=True)
