"""Every fixture script reports exactly the (code, line) pairs its NAME.expect.json lists."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from fixture_support import ROOT, expectation_files, expected_pairs, load, lint, reported_pairs, script_for  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")

CASES = expectation_files()


def test_fixtures_exist():
    assert len([c for c in CASES if os.sep + "loops" + os.sep in c]) >= 24


@pytest.mark.parametrize("expect_path", CASES, ids=[os.path.relpath(c, ROOT) for c in CASES])
def test_fixture(expect_path):
    script = script_for(expect_path)
    assert script is not None, f"no script next to {expect_path}"
    data = load(expect_path)
    got = reported_pairs(lint(script))
    want = expected_pairs(data)
    assert got == want, f"{os.path.relpath(script, ROOT)}: missing {sorted(want - got)}, unexpected {sorted(got - want)}"


@pytest.mark.parametrize("expect_path", CASES, ids=[os.path.relpath(c, ROOT) for c in CASES])
def test_expectation_format(expect_path):
    data = load(expect_path)
    assert isinstance(data.get("findings"), list)
    for f in data["findings"]:
        assert isinstance(f["code"], str) and f["code"].startswith("BL")
        assert isinstance(f["line"], int) and f["line"] >= 1
        assert isinstance(f.get("confirmable", False), bool)
