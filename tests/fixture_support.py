"""Shared by tests/test_fixtures.py and benchmarks/precision_recall.py: find fixtures and lint them."""

from __future__ import annotations

import glob
import json
import os
from typing import Optional

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT_SUFFIXES = (".py", ".ipynb", ".json", ".yaml", ".yml")


def expectation_files() -> list[str]:
    return sorted(glob.glob(os.path.join(ROOT, "fixtures", "**", "*.expect.json"), recursive=True))


def script_for(expect_path: str) -> Optional[str]:
    stem = expect_path[: -len(".expect.json")]
    for suf in SCRIPT_SUFFIXES:
        if os.path.exists(stem + suf):
            return stem + suf
    return None


def load(expect_path: str) -> dict:
    with open(expect_path, encoding="utf-8") as fh:
        return json.load(fh)


def lint(path: str):
    try:
        from bertlint.api import lint_path
    except ImportError:  # before the core API lands
        lint_path = None
    if lint_path is not None:
        return lint_path(path)
    from bertlint.engine import lint_python

    with open(path, encoding="utf-8") as fh:
        return lint_python(fh.read(), path)


def expected_pairs(data: dict) -> set[tuple[str, int]]:
    return {(f["code"], int(f["line"])) for f in data.get("findings", [])}


def reported_pairs(diags) -> set[tuple[str, int]]:
    return {(d.code, d.start.row) for d in diags}
