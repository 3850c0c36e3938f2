"""Output formats: full, concise, json, json-lines, sarif 2.1.0, github, junit; colour rules; summaries."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from bertlint import reporters
from bertlint.cli import _color
from bertlint.types import Applicability, Diagnostic, Edit, Fix, Position, RuleMeta, Severity, Verification

SRC = "import torch\nfor b in loader:\n\tloss.backward()\n    optimizer.step()\n"


def diag(code="BL101", row=4, col=5, end=21, sev=Severity.ERROR, fix=True, cell=None, filename="train.py", msg=None):
    f = None
    if fix:
        e = Edit("if (i + 1) % N == 0:\n        optimizer.step()", Position(row, col), Position(row, end))
        f = Fix("Gate the step on the accumulation window", Applicability.UNSAFE, (e,))
    return Diagnostic(
        code, "optimizer-step-not-delayed", sev, msg or "`optimizer.step()` runs on every micro-batch: 2, not 2 × 8 = 16",
        filename, Position(row, col), Position(row, end), f, cell,
    )


def test_full_shows_location_code_name_message_source_marker_and_fix():
    out = reporters.full([diag()], sources={"train.py": SRC})
    assert out == (
        "train.py:4:5: BL101 [-] optimizer-step-not-delayed (error)\n"
        "  `optimizer.step()` runs on every micro-batch: 2, not 2 × 8 = 16\n"
        "  |\n"
        "4 |     optimizer.step()\n"
        "  |     ^^^^^^^^^^^^^^^^ BL101\n"
        "  |\n"
        "  = fix (unsafe fix, applied with --fix --unsafe-fixes): Gate the step on the accumulation window\n"
    )
    assert "\x1b[" not in out


def test_full_marker_for_tabs_multiline_and_missing_source():
    d = diag(row=3, col=2, end=17, fix=False, sev=Severity.WARNING)
    out = reporters.full([d], sources={"train.py": SRC})
    assert "3 |  loss.backward()\n  |  ^^^^^^^^^^^^^^^ BL101\n" in out
    d = Diagnostic("BL501", "graph-kept", Severity.INFO, "m", "train.py", Position(2, 1), Position(4, 3))
    out = reporters.full([d], sources={"train.py": SRC})
    assert "2 | for b in loader:\n  | ^^^^^^^^^^^^^^^^ BL501\n" in out
    out = reporters.full([d], sources={})
    assert out == "train.py:2:1: BL501 graph-kept (info)\n  m\n"


def test_full_for_notebook_cells():
    nb = json.dumps({"cells": [{"cell_type": "code", "source": ["import torch\n", "opt.step()\n"]}]})
    d = diag(row=2, col=1, end=11, fix=False, cell=1, filename="nb.ipynb")
    out = reporters.full([d], sources={"nb.ipynb": nb})
    assert out.startswith("nb.ipynb:cell 1:2:1: BL101")
    assert "2 | opt.step()\n  | ^^^^^^^^^^ BL101" in out


def test_colour_only_when_asked():
    out = reporters.full([diag()], sources={"train.py": SRC}, color=True)
    assert "\x1b[1;31mBL101\x1b[0m" in out
    assert "\x1b[" in reporters.concise([diag()], color=True)


class _Stream:
    def __init__(self, tty):
        self.tty = tty

    def isatty(self):
        return self.tty


def test_colour_needs_a_terminal_and_honours_no_color(monkeypatch):
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    assert _color(_Stream(True)) is True
    assert _color(_Stream(False)) is False
    monkeypatch.setenv("NO_COLOR", "1")
    assert _color(_Stream(True)) is False
    monkeypatch.delenv("NO_COLOR")
    monkeypatch.setenv("FORCE_COLOR", "1")
    assert _color(_Stream(False)) is True


def test_concise():
    out = reporters.concise([diag(), diag(code="BL001", row=1, col=1, end=1, fix=False, msg="SyntaxError: x")])
    assert out == (
        "train.py:4:5: BL101 [-] `optimizer.step()` runs on every micro-batch: 2, not 2 × 8 = 16\n"
        "train.py:1:1: BL001 SyntaxError: x\n"
    )
    d = diag(fix=False)
    d.verification = Verification("confirmed", "update every micro-batch: 8 steps for 8 batches")
    assert reporters.concise([d]).endswith("[verify: confirmed: update every micro-batch: 8 steps for 8 batches]\n")


def test_json_follows_the_output_contract():
    d = diag()
    d.verification = Verification("refuted", "stepped 2 times in 8 micro-batches")
    item = json.loads(reporters.json_array([d]))[0]
    assert item["code"] == "BL101" and item["name"] == "optimizer-step-not-delayed" and item["severity"] == "E"
    assert item["filename"] == "train.py"
    assert item["location"] == {"row": 4, "column": 5} and item["end_location"] == {"row": 4, "column": 21}
    assert item["fix"]["applicability"] == "unsafe" and item["fix"]["message"].startswith("Gate")
    assert item["fix"]["edits"][0] == {
        "content": "if (i + 1) % N == 0:\n        optimizer.step()",
        "location": {"row": 4, "column": 5},
        "end_location": {"row": 4, "column": 21},
    }
    assert item["url"] == "rules/BL101.md"
    assert item["verification"] == {"status": "refuted", "evidence": "stepped 2 times in 8 micro-batches"}
    assert json.loads(reporters.json_array([])) == []


def test_json_lines():
    out = reporters.json_lines([diag(), diag(row=1)])
    rows = [json.loads(x) for x in out.splitlines()]
    assert [r["location"]["row"] for r in rows] == [4, 1]
    assert reporters.json_lines([]) == ""


def test_sarif_has_rule_metadata_results_and_fixes():
    metas = [
        RuleMeta("BL101", "optimizer-step-not-delayed", Severity.ERROR, "steps every micro-batch", Applicability.UNSAFE),
        RuleMeta("BL206", "deprecated-cuda-amp", Severity.INFO, "torch.cuda.amp", None, False),
    ]
    doc = json.loads(reporters.sarif([diag(), diag(code="BL001", fix=False, cell=3, filename="my nb.ipynb")], rules=metas))
    assert doc["version"] == "2.1.0" and "sarif-2.1.0" in doc["$schema"]
    run = doc["runs"][0]
    rules = run["tool"]["driver"]["rules"]
    assert [r["id"] for r in rules] == ["BL001", "BL101", "BL206"]
    assert rules[1]["shortDescription"]["text"] == "steps every micro-batch"
    assert rules[1]["defaultConfiguration"]["level"] == "error"
    assert rules[2]["defaultConfiguration"] == {"level": "note", "enabled": False}
    r0, r1 = run["results"]
    assert r0["ruleId"] == "BL101" and rules[r0["ruleIndex"]]["id"] == "BL101" and r0["level"] == "error"
    loc = r0["locations"][0]["physicalLocation"]
    assert loc["artifactLocation"]["uri"] == "train.py"
    assert loc["region"] == {"startLine": 4, "startColumn": 5, "endLine": 4, "endColumn": 21}
    rep = r0["fixes"][0]["artifactChanges"][0]["replacements"][0]
    assert rep["insertedContent"]["text"].startswith("if (i + 1)") and rep["deletedRegion"]["startLine"] == 4
    assert r1["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == "my%20nb.ipynb"
    assert r1["properties"]["cell"] == 3 and "fixes" not in r1


def test_github_annotations_escape():
    d = diag(msg="50% of\nthe steps", sev=Severity.WARNING, filename="a,b:c.py")
    out = reporters.github([d, diag(sev=Severity.INFO)])
    lines = out.splitlines()
    assert lines[0] == (
        "::warning title=bertlint (BL101),file=a%2Cb%3Ac.py,line=4,col=5,endLine=4,endColumn=21::"
        "BL101 optimizer-step-not-delayed: 50%25 of%0Athe steps"
    )
    assert lines[1].startswith("::notice ")


def test_junit_is_valid_xml():
    out = reporters.junit([diag(msg="a < b & c"), diag(filename="b.py", row=1)])
    root = ET.fromstring(out)
    assert root.tag == "testsuites" and root.get("failures") == "2"
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == ["train.py", "b.py"]
    case = suites[0].find("testcase")
    assert case.get("name") == "org.bertlint.BL101" and case.get("line") == "4"
    assert case.find("failure").get("message") == "a < b & c"
    empty = ET.fromstring(reporters.junit([]))
    assert empty.get("failures") == "0" and empty.find("testsuite/testcase") is not None


def test_summary_and_statistics():
    ds = [diag(), diag(code="BL105", fix=False, sev=Severity.WARNING), diag(code="BL105", fix=False, row=1)]
    assert reporters.summary([]) == "All checks passed!\n"
    assert reporters.summary(ds) == (
        "Found 3 problems (2 errors, 1 warning).\n1 more fix available with `--fix --unsafe-fixes`.\n"
    )
    assert reporters.summary(ds, unsafe=True).endswith("[*] 1 fixable with `--fix --unsafe-fixes`.\n")
    assert reporters.summary(ds[1:], fixed=2) == "Found 4 problems (2 fixed, 2 remaining).\n"
    # BL101's fix is unsafe: not fixable by --fix, fixable with --unsafe-fixes
    assert reporters.statistics(ds) == "    2\tBL105\toptimizer-step-not-delayed\n    1\tBL101\toptimizer-step-not-delayed\n"
    assert "1\tBL101\t[*] optimizer" in reporters.statistics(ds, unsafe=True)
    assert json.loads(reporters.statistics(ds, "json"))[1]["fixable"] is False
    assert json.loads(reporters.statistics(ds, "json", unsafe=True))[1]["fixable"] is True
    assert reporters.summary(ds[2:], fixed=0) == "Found 1 problem (1 error).\n"
    assert reporters.summary([], fixed=1) == "Found 1 problem (1 fixed, 0 remaining).\n"
    assert json.loads(reporters.statistics(ds, "json"))[0] == {
        "code": "BL105", "name": "optimizer-step-not-delayed", "count": 2, "fixable": False,
    }
