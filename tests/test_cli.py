"""The command line: options, exit codes, formats, stdin, suppression, folders, parallel determinism,
subcommand dispatch and the --verify plumbing."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import types

import libcst as cst
import pytest

from bertlint import cli, registry
from bertlint.analysis.symbols import call_name
from bertlint.cli import main
from bertlint.config import clear_caches
from bertlint.types import Applicability, Severity, Verification


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list = []

    def visit_Call(self, node) -> None:
        self.calls.append(node)


def _check(ctx) -> None:
    v = _Calls()
    ctx.module.visit(v)
    for c in v.calls:
        if call_name(c) == "old_api":
            ctx.report(c, "old_api() is gone", fix=ctx.fix("Use new_api()", [ctx.edit_replace(c.func, "new_api")]))


def _check_off(ctx) -> None:
    v = _Calls()
    ctx.module.visit(v)
    for c in v.calls:
        if call_name(c) == "rare":
            ctx.report(c, "rare() seen")


@pytest.fixture(autouse=True)
def demo_rules(monkeypatch):
    registry.all_rules()
    registry.rule("BL999", "demo-rule", Severity.WARNING, "demo", fix=Applicability.SAFE)(_check)
    registry.rule("BL998", "demo-off", Severity.INFO, "off by default", default_enabled=False)(_check_off)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    clear_caches()
    yield
    registry._RULES.pop("BL999", None)
    registry._RULES.pop("BL998", None)
    clear_caches()


def write(tmp_path, name, text):
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return str(p)


SEL = ["--select", "BL999,BL998,BL001"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


# ------------------------------------------------------------------------------------------- exit codes


def test_exit_codes(tmp_path, capsys):
    clean = write(tmp_path, "clean.py", "import torch\nnew_api()\n")
    bad = write(tmp_path, "bad.py", "import torch\nold_api()\n")
    assert run(capsys, *SEL, clean)[0] == 0
    assert run(capsys, *SEL, bad)[0] == 1
    assert run(capsys, *SEL, "--exit-zero", bad)[0] == 0
    rc, _, err = run(capsys, str(tmp_path / "missing.py"))
    assert rc == 2 and err == f"bertlint: error: {tmp_path / 'missing.py'}: no such file or directory\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--frobnicate"], "unknown option '--frobnicate'"),
        (["--select", "E501"], "--select: 'E501' is not a rule code or prefix"),
        (["--output-format", "xml"], "--output-format: unknown format 'xml'; choose one of full, concise, json"),
        (["--select"], "--select needs a value"),
        (["--jobs", "zero"], "--jobs: expected an integer, got 'zero'"),
        (["--verify", "a.py", "b.py"], "--verify takes exactly one script path"),
        (["--verify-steps", "3", "a.py"], "--verify-steps, --verify-timeout and --report need --verify"),
    ],
)
def test_usage_errors_exit_2(capsys, argv, message):
    rc, out, err = run(capsys, *argv)
    assert rc == 2 and out == ""
    assert err.startswith("bertlint: error: " + message)
    assert "Traceback" not in err


def test_version_and_help(capsys):
    from bertlint import __version__

    assert run(capsys, "--version") == (0, f"bertlint {__version__}\n", "")
    rc, out, _ = run(capsys, "--help")
    assert rc == 0 and "--output-format" in out and "Exit status" in out


# -------------------------------------------------------------------------------------------- selection


def test_select_ignore_extend_select_with_prefixes(tmp_path, capsys):
    f = write(tmp_path, "t.py", "import torch\nold_api()\nrare()\n")
    codes = lambda out: [d["code"] for d in json.loads(out)]  # noqa: E731
    assert codes(run(capsys, "--select", "BL99", "--output-format", "json", f)[1]) == ["BL999"]  # BL998 is off
    assert codes(run(capsys, "--select", "BL998", "--output-format", "json", f)[1]) == ["BL998"]
    assert codes(run(capsys, "--select", "BL999", "--extend-select", "BL998", "--output-format", "json", f)[1]) == [
        "BL999",
        "BL998",
    ]
    assert codes(run(capsys, "--select", "ALL", "--ignore", "BL9", "--output-format=json", f)[1]) == []
    assert codes(run(capsys, "--select=bl9,bl998", "--ignore=BL999", "--output-format=json", f)[1]) == ["BL998"]


def test_per_file_ignores_and_exclude_from_config(tmp_path, capsys):
    write(tmp_path, "pyproject.toml", '[tool.bertlint]\nexclude = ["gen"]\n[tool.bertlint.per-file-ignores]\n"scripts/*.py" = ["BL999"]\n')
    write(tmp_path, "scripts/a.py", "import torch\nold_api()\n")
    write(tmp_path, "gen/b.py", "import torch\nold_api()\n")
    c = write(tmp_path, "c.py", "import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "json", str(tmp_path))
    assert rc == 1 and [d["filename"] for d in json.loads(out)] == [c]
    # an excluded file named explicitly is still linted
    rc, out, _ = run(capsys, *SEL, "--output-format", "json", str(tmp_path / "gen" / "b.py"))
    assert len(json.loads(out)) == 1
    rc, out, _ = run(capsys, *SEL, "--exclude", "c.py", "--output-format", "json", str(tmp_path))
    assert rc == 0


# ------------------------------------------------------------------------------------------ suppression

SUPPRESS = """import torch
old_api()  # noqa: BL999
old_api()  # noqa
old_api()  # bertlint: ignore[BL999]
old_api()  # noqa: BL101
old_api()  # bertlint: ignore[BL1, BL9]
x = [  # noqa: BL999
    old_api(),
]
y = "# noqa"; old_api()
old_api()  # NOQA:bl999
z = f(
    old_api()
)
"""


def test_noqa_and_ignore_comments(tmp_path, capsys):
    f = write(tmp_path, "t.py", SUPPRESS)
    rc, out, _ = run(capsys, "--select", "BL999", "--output-format", "json", f)
    assert [d["location"]["row"] for d in json.loads(out)] == [5, 10, 13]


# ------------------------------------------------------------------------------------------- formats


@pytest.mark.parametrize("fmt", ["full", "concise", "json", "json-lines", "sarif", "github", "junit"])
def test_every_format_is_deterministic_and_sorted(tmp_path, capsys, fmt):
    write(tmp_path, "b.py", "import torch\nold_api()\n\nold_api()\n")
    write(tmp_path, "a.py", "import torch\n\n\nold_api(); old_api()\n")
    outs = {run(capsys, *SEL, "--output-format", fmt, str(tmp_path))[1] for _ in range(2)}
    assert len(outs) == 1
    out = outs.pop()
    a, b = str(tmp_path / "a.py"), str(tmp_path / "b.py")
    if fmt == "json":
        assert [(d["filename"], d["location"]["row"], d["location"]["column"]) for d in json.loads(out)] == [
            (a, 4, 1), (a, 4, 12), (b, 2, 1), (b, 4, 1),
        ]
    elif fmt == "concise":
        assert out.splitlines()[:4] == [
            f"{a}:4:1: BL999 [*] old_api() is gone",
            f"{a}:4:12: BL999 [*] old_api() is gone",
            f"{b}:2:1: BL999 [*] old_api() is gone",
            f"{b}:4:1: BL999 [*] old_api() is gone",
        ]
        assert out.splitlines()[4:] == ["Found 4 problems (4 warnings).", "[*] 4 fixable with `--fix`."]
    elif fmt == "full":
        assert f"{a}:4:1: BL999 [*] demo-rule (warning)\n  old_api() is gone\n  |\n4 | old_api(); old_api()\n  | ^^^^^^^^^ BL999\n" in out
        assert "= fix (safe fix, applied with --fix): Use new_api()" in out
    elif fmt == "json-lines":
        assert len(out.splitlines()) == 4
    elif fmt == "sarif":
        assert len(json.loads(out)["runs"][0]["results"]) == 4
    elif fmt == "github":
        assert out.splitlines()[0].startswith(f"::warning title=bertlint (BL999),file={a},line=4,col=1")
    elif fmt == "junit":
        assert out.count("<testcase ") == 4


def test_statistics(tmp_path, capsys):
    write(tmp_path, "a.py", "import torch\nold_api()\nold_api()\nrare()\n")
    rc, out, _ = run(capsys, *SEL, "--statistics", str(tmp_path))
    assert rc == 1 and out == (
        "    2\tBL999\t[*] demo-rule\n    1\tBL998\tdemo-off\n"
        "Found 3 problems (2 warnings, 1 info).\n[*] 2 fixable with `--fix`.\n"
    )
    rc, out, _ = run(capsys, *SEL, "--statistics", "-q", str(tmp_path))
    assert out == "    2\tBL999\t[*] demo-rule\n    1\tBL998\tdemo-off\n"


def test_quiet_and_clean_summary(tmp_path, capsys):
    f = write(tmp_path, "a.py", "import torch\n")
    assert run(capsys, *SEL, f) == (0, "All checks passed!\n", "")
    assert run(capsys, *SEL, "-q", f) == (0, "", "")


# ----------------------------------------------------------------------------------------------- stdin


def _stdin(monkeypatch, text):
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))


def test_stdin_with_filename(monkeypatch, capsys):
    _stdin(monkeypatch, "import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", "--stdin-filename", "train.py", "-")
    assert rc == 1 and out.startswith("train.py:2:1: BL999")
    _stdin(monkeypatch, "import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", "-")
    assert out.startswith("-:2:1: BL999")
    _stdin(monkeypatch, "import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", "--stdin-filename", "t.py")  # no `-` needed
    assert out.startswith("t.py:2:1: BL999")


def test_stdin_fix_prints_fixed_source(monkeypatch, capsys):
    _stdin(monkeypatch, "import torch\nold_api()\n")
    rc, out, err = run(capsys, *SEL, "--fix", "--stdin-filename", "train.py", "-")
    assert rc == 0 and out == "import torch\nnew_api()\n"
    assert "Found 1 problem" in err


def test_stdin_notebook_and_config_by_name(monkeypatch, capsys):
    nb = {"cells": [{"cell_type": "code", "source": "import torch\n!ls\nold_api()"}], "metadata": {}}
    _stdin(monkeypatch, json.dumps(nb))
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", "--stdin-filename", "nb.ipynb", "-")
    assert out.startswith("nb.ipynb:cell 1:3:1: BL999")
    _stdin(monkeypatch, '{"train_batch_size": 8,}')
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", "--stdin-filename", "ds.json", "-")
    assert rc == 1 and out.startswith("ds.json:1:24: BL001 invalid JSON")


# -------------------------------------------------------------------------------------- bad inputs


def test_bad_files_do_not_stop_the_others(tmp_path, capsys):
    write(tmp_path, "a_syntax.py", "import torch\ndef f(:\n")
    (tmp_path / "b_binary.py").write_bytes(b"\x00\x01\x02")
    (tmp_path / "c_latin.py").write_bytes(b"import torch\nx = '\xe9'\n")
    write(tmp_path, "d_ok.py", "import torch\nold_api()\n")
    rc, out, err = run(capsys, *SEL, "--output-format", "concise", str(tmp_path))
    lines = out.splitlines()
    assert rc == 1
    assert lines[0].startswith(f"{tmp_path / 'a_syntax.py'}:2:7: BL001 SyntaxError")
    assert lines[1].startswith(f"{tmp_path / 'c_latin.py'}:2:6: BL001 the file is not valid utf-8 text")
    assert lines[2].startswith(f"{tmp_path / 'd_ok.py'}:2:1: BL999")
    assert err == f"warning: {tmp_path / 'b_binary.py'}: skipped: binary file\n"


def test_a_crashing_rule_is_reported_and_skipped(tmp_path, capsys):
    def boom(ctx):
        raise ValueError("bad luck")

    registry.rule("BL997", "demo-crash", Severity.ERROR, "crash")(boom)
    try:
        f = write(tmp_path, "a.py", "import torch\nold_api()\n")
        rc, out, err = run(capsys, "--select", "BL997,BL999", "--output-format", "concise", f)
        assert rc == 1 and "BL999" in out
        assert f"bertlint: internal error in BL997 on {f}: ValueError: bad luck" in err
    finally:
        registry._RULES.pop("BL997", None)


# ---------------------------------------------------------------------------------------------- parallel


def test_parallel_output_equals_serial_output(tmp_path, capsys):
    for i in range(cli.PARALLEL_MIN_FILES + 4):
        write(tmp_path, f"m{i:02d}/train.py", "import torch\n" + "old_api()\n" * (i % 3))
    serial = run(capsys, *SEL, "--jobs", "1", "--output-format", "json", str(tmp_path))
    parallel = run(capsys, *SEL, "--jobs", "2", "--output-format", "json", str(tmp_path))
    assert serial == parallel
    assert serial[0] == 1 and len(json.loads(serial[1])) == sum(i % 3 for i in range(cli.PARALLEL_MIN_FILES + 4))


# ------------------------------------------------------------------------------------------ rule / rules


def test_rule_prints_the_page(capsys):
    rc, out, _ = run(capsys, "rule", "bl001")
    assert rc == 0 and out.startswith("# BL001 parse-error\n") and "## What it finds" in out
    rc, out, _ = run(capsys, "rule", "BL999")  # registered but no page: metadata
    assert rc == 0 and out.startswith("# BL999 demo-rule\n")
    rc, out, _ = run(capsys, "rule", "BL001", "--output-format", "json")
    assert json.loads(out)["name"] == "parse-error"
    rc, _, err = run(capsys, "rule", "BL777")
    assert rc == 2 and "unknown rule code 'BL777'" in err


def test_rules_lists_codes(capsys):
    rc, out, _ = run(capsys, "rules")
    lines = out.splitlines()
    assert rc == 0 and lines[0].split()[:5] == ["code", "name", "sev", "fix", "default"]
    assert any(ln.startswith("BL999  demo-rule") and " W " in ln and " safe " in ln for ln in lines)
    assert any(ln.startswith("BL998") and " off " in ln for ln in lines)
    rows = json.loads(run(capsys, "rules", "--output-format", "json")[1])
    assert {"code": "BL001"}.items() <= rows[0].items()


def test_check_alias(tmp_path, capsys):
    f = write(tmp_path, "a.py", "import torch\nold_api()\n")
    assert run(capsys, "check", *SEL, f)[0] == 1


# ------------------------------------------------------------------------------------ subcommands


def test_subcommand_dispatch_and_missing_module(capsys, monkeypatch):
    fake = types.ModuleType("bertlint_fake_sub")
    seen = []
    fake.main = lambda argv: seen.append(argv) or 3
    monkeypatch.setitem(sys.modules, "bertlint_fake_sub", fake)
    monkeypatch.setitem(cli._SUBCOMMANDS, "explain", ("bertlint_fake_sub", "main", "explain"))
    assert main(["explain", "train.py", "--code", "BL101"]) == 3 and seen == [["train.py", "--code", "BL101"]]
    monkeypatch.setitem(cli._SUBCOMMANDS, "memory", ("bertlint.no_such_module", "main", "the memory simulator"))
    rc, _, err = run(capsys, "memory", "x.py")
    assert rc == 2 and err == (
        "bertlint: error: `bertlint memory`: the memory simulator is not part of this installation "
        "(bertlint.no_such_module is missing)\n"
    )


def test_verify_plumbing(tmp_path, capsys, monkeypatch):
    f = write(tmp_path, "train.py", "import torch\nold_api()\n")
    calls = []

    def verify_script(path, script_args, diagnostics, *, steps=None, timeout=300.0, report_dir=None, settings=None):
        calls.append((path, script_args, [d.code for d in diagnostics], steps, timeout, report_dir))
        for d in diagnostics:
            d.verification = Verification("confirmed", "observed 8 optimizer steps for 8 micro-batches")
        return types.SimpleNamespace(diagnostics=diagnostics, report_text="peak memory: 1.0 MiB", report_json={})

    fake = types.ModuleType("bertlint.verify")
    fake.verify_script = verify_script
    monkeypatch.setitem(sys.modules, "bertlint.verify", fake)
    argv = [*SEL, "--verify", "--verify-steps", "4", "--verify-timeout", "60", "--report", str(tmp_path / "r")]
    rc, out, _ = run(capsys, *argv, "--output-format", "json", f, "--", "--lr", "1e-4")
    assert rc == 1
    assert calls == [(f, ["--lr", "1e-4"], ["BL999"], 4, 60.0, str(tmp_path / "r"))]
    assert json.loads(out)[0]["verification"]["status"] == "confirmed"
    rc, out, _ = run(capsys, *SEL, "--verify", "--output-format", "concise", f)
    assert "[verify: confirmed" in out and "peak memory: 1.0 MiB" in out


def test_verify_missing_module(tmp_path, capsys, monkeypatch):
    f = write(tmp_path, "train.py", "import torch\n")
    monkeypatch.setitem(sys.modules, "bertlint.verify", None)  # import fails like a missing module
    rc, _, err = run(capsys, "--verify", f)
    assert rc == 2 and err.startswith("bertlint: error: --verify")


# --------------------------------------------------------------------------------------- whole process


def test_python_m_bertlint_process(tmp_path):
    bad = write(tmp_path, "train.py", "import torch\ndef f(:\n")
    p = subprocess.run(
        [sys.executable, "-m", "bertlint", "--output-format", "concise", bad],
        capture_output=True, text=True, env={**os.environ, "NO_COLOR": "1"},
    )
    assert p.returncode == 1 and p.stdout.startswith(f"{bad}:2:7: BL001 SyntaxError") and p.stderr == ""
    p = subprocess.run([sys.executable, "-m", "bertlint", str(tmp_path / "nope.py")], capture_output=True, text=True)
    assert p.returncode == 2 and "no such file or directory" in p.stderr and "Traceback" not in p.stderr


def test_a_file_named_twice_is_linted_once(tmp_path, capsys):
    f = write(tmp_path, "a.py", "import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "json", f, f, str(tmp_path))
    assert len(json.loads(out)) == 1


def test_unwritable_file_is_a_warning(tmp_path, capsys, monkeypatch):
    f = write(tmp_path, "a.py", "import torch\nold_api()\n")

    def deny(*a, **k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("bertlint.fixes.atomic_write", deny)
    rc, out, err = run(capsys, *SEL, "--fix", "--output-format", "concise", f)
    assert rc == 1 and open(f).read() == "import torch\nold_api()\n"
    assert f"warning: {f}: cannot write the fixes: [Errno 13] Permission denied" in err
    assert "old_api() is gone" in out
