"""The command line's result cache (.bertlint_cache/): hits on an unchanged file, misses on whatever changes the
result (content, settings, rules, pins, files the lint read), identical output, nothing cached after a crash."""

from __future__ import annotations

import json
import os

import libcst as cst
import pytest

from bertlint import registry
from bertlint.analysis.symbols import call_name
from bertlint.cli import main
from bertlint.config import clear_caches
from bertlint.types import Applicability, Severity


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
        if call_name(c) == "read_limits":  # reads a file the script names: a dependency of the result
            arg = c.args[0].value
            if isinstance(arg, cst.SimpleString):
                path = os.path.join(os.path.dirname(ctx.filename), arg.evaluated_value)
                try:
                    with open(path, encoding="utf-8") as f:
                        limit = f.read().strip()
                except OSError:
                    limit = "none"
                ctx.report(c, f"limit {limit}")


@pytest.fixture(autouse=True)
def setup(monkeypatch, tmp_path):
    registry.all_rules()
    registry.rule("BL999", "demo-rule", Severity.WARNING, "demo", fix=Applicability.SAFE)(_check)
    monkeypatch.delenv("BERTLINT_NO_CACHE", raising=False)
    monkeypatch.delenv("BERTLINT_CACHE_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    from bertlint import cache

    # bertlint's own files are part of the key; other people editing this checkout while the tests run must not
    # turn an expected hit into a miss
    monkeypatch.setattr(cache, "_package_stamp", lambda: [])
    clear_caches()
    yield
    registry._RULES.pop("BL999", None)
    clear_caches()


SEL = ["--select", "BL999,BL001", "--output-format", "json", "-v"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def hits(err: str) -> tuple[int, int]:
    line = next(ln for ln in err.splitlines() if "bertlint: cache " in ln)
    tail = line.split(": ", 2)[-1]
    h, m = tail.split(", ")
    return int(h.split()[0]), int(m.split()[0])


def test_warm_run_is_answered_from_the_cache_with_identical_output(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import torch\nold_api()\n")
    (tmp_path / "b.py").write_text("import torch\nx = 1\n")
    (tmp_path / "c.py").write_text("x = 1\n")  # no training machinery: not parsed, not cached
    rc1, out1, err1 = run(capsys, *SEL, ".")
    assert hits(err1) == (0, 2)
    assert (tmp_path / ".bertlint_cache" / ".gitignore").read_text().splitlines()[-1] == "*"
    rc2, out2, err2 = run(capsys, *SEL, ".")
    assert hits(err2) == (2, 0)
    assert (rc1, out1) == (rc2, out2) and json.loads(out2)[0]["code"] == "BL999"
    _, full, _ = run(capsys, "--select", "BL999", "a.py")
    assert "2 | old_api()" in full  # a cached finding still shows its source line
    assert run(capsys, *SEL, "--no-cache", ".")[2].count("bertlint: cache") == 0


def test_what_changes_the_result_misses(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\n")
    run(capsys, *SEL, "a.py")
    assert hits(run(capsys, *SEL, "a.py")[2]) == (1, 0)
    p.write_text("import torch\nold_api()\nold_api()\n")  # content
    rc, out, err = run(capsys, *SEL, "a.py")
    assert hits(err) == (0, 1) and len(json.loads(out)) == 2
    assert hits(run(capsys, *SEL, "--config", "world-size = 4", "a.py")[2]) == (0, 1)  # settings
    (tmp_path / "pyproject.toml").write_text("[tool.bertlint]\nworld-size = 2\n")  # a configuration file
    assert hits(run(capsys, *SEL, "a.py")[2]) == (0, 1)
    assert hits(run(capsys, *SEL, "a.py")[2]) == (1, 0)
    (tmp_path / "requirements.txt").write_text("transformers==4.46.3\n")  # a pin the version discovery reads
    assert hits(run(capsys, *SEL, "a.py")[2]) == (0, 1)
    assert hits(run(capsys, *SEL, "a.py")[2]) == (1, 0)
    (tmp_path / "requirements.txt").write_text("transformers==4.57.1\n")
    os.utime(tmp_path / "requirements.txt", ns=(1, 10**18))
    assert hits(run(capsys, *SEL, "a.py")[2]) == (0, 1)
    (tmp_path / "ds_config.json").write_text('{"train_batch_size": 8}\n')  # a launcher configuration beside it
    assert hits(run(capsys, *SEL, "a.py")[2]) == (0, 1)
    from bertlint import cache

    # the installed frameworks are part of the key by their dist-info names (which carry the versions)
    assert any(n.startswith("torch-") and n.endswith(".dist-info") for n in cache._installed_stamp())


def test_a_changed_rule_misses(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import torch\nold_api()\n")
    run(capsys, *SEL, "a.py")

    def other(ctx) -> None:
        ctx.report(ctx.module.body[0], "another rule body")

    registry._RULES.pop("BL999")
    registry.rule("BL999", "demo-rule", Severity.WARNING, "demo")(other)
    rc, out, err = run(capsys, *SEL, "a.py")
    assert hits(err) == (0, 1) and json.loads(out)[0]["message"] == "another rule body"


def test_a_file_the_lint_read_is_a_dependency(tmp_path, capsys):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "limits.dat").write_text("8\n")
    (tmp_path / "a.py").write_text('import torch\nread_limits("data/limits.dat")\n')
    rc, out, err = run(capsys, *SEL, "a.py")
    assert json.loads(out)[0]["message"] == "limit 8"
    assert hits(run(capsys, *SEL, "a.py")[2]) == (1, 0)
    (tmp_path / "data" / "limits.dat").write_text("16\n")
    rc, out, err = run(capsys, *SEL, "a.py")
    assert hits(err) == (0, 1) and json.loads(out)[0]["message"] == "limit 16"


def test_nothing_is_cached_after_a_rule_crash(tmp_path, capsys, monkeypatch):
    from bertlint import engine

    monkeypatch.setattr(engine, "on_internal_error", lambda code, filename, exc: None)

    def boom(ctx) -> None:
        raise RuntimeError("bug")

    registry.rule("BL998", "demo-crash", Severity.WARNING, "crashes")(boom)
    try:
        (tmp_path / "a.py").write_text("import torch\nold_api()\n")
        run(capsys, "--select", "BL998,BL999", "-v", "a.py")
        assert hits(run(capsys, "--select", "BL998,BL999", "-v", "a.py")[2]) == (0, 1)
    finally:
        registry._RULES.pop("BL998", None)


def test_fix_uses_an_entry_only_when_nothing_is_to_fix(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\n")
    run(capsys, *SEL, "a.py")
    rc, out, err = run(capsys, *SEL, "--fix", "a.py")
    assert "new_api()" in p.read_text() and rc == 0
    run(capsys, *SEL, "a.py")  # the fixed text is linted and cached
    rc, out, err = run(capsys, *SEL, "--fix", "a.py")
    assert hits(err) == (1, 0) and rc == 0


def test_cache_dir_option_and_unwritable_folder(tmp_path, capsys):
    (tmp_path / "a.py").write_text("import torch\nold_api()\n")
    run(capsys, *SEL, "--cache-dir", str(tmp_path / "elsewhere"), "a.py")
    assert (tmp_path / "elsewhere" / ".gitignore").is_file() and not (tmp_path / ".bertlint_cache").exists()
    blocker = tmp_path / "file_not_folder"
    blocker.write_text("x")
    rc, out, err = run(capsys, *SEL, "--cache-dir", str(blocker / "c"), "a.py")
    assert rc == 1 and json.loads(out)[0]["code"] == "BL999"  # runs as without a cache


def test_bertlint_own_files_are_part_of_the_key(monkeypatch):
    from bertlint import cache

    real = cache.__dict__.get("_package_stamp")
    monkeypatch.setattr(cache, "_package_stamp", lambda: [["analysis/loops.py", 100, 1]])
    a = cache.global_key()
    monkeypatch.setattr(cache, "_package_stamp", lambda: [["analysis/loops.py", 100, 2]])  # edited in a checkout
    assert cache.global_key() != a
    monkeypatch.undo()
    stamp = cache._package_stamp()
    assert real is not None and any(p[0].endswith("cli.py") for p in stamp)  # the real stamp lists the modules
