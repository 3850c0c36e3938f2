"""Packaging glue: the console script, the pre-commit hook, CI running the README's test command."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_pre_commit_hook_definition():
    import yaml

    hooks = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
    hook = next(h for h in hooks if h["id"] == "bertlint")
    assert hook["entry"] == "bertlint" and hook["language"] == "python"
    assert "python" in hook["types_or"] and "jupyter" in hook["types_or"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    blocks = re.findall(r"```sh\n(.*?)\n```", readme, re.S)
    test_cmd = next(b for b in blocks if "pytest" in b)
    runner = test_cmd.split("&&")[-1].strip()  # e.g. HF_HUB_OFFLINE=1 python -m pytest -q
    assert runner in ci
    assert ci.index("pip install torch==2.13.0") < ci.index("pip install -e '.[dev,verify,lsp]'") < ci.index(runner)
    assert "set -euo pipefail" in ci
    assert (ROOT / ".ci" / "run").stat().st_mode & 0o111


def test_console_script_and_module_entry_point():
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib

    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["scripts"]["bertlint"] == "bertlint.cli:main"
    deps = meta["project"]["dependencies"]
    assert [d.split(">")[0].split(";")[0].strip() for d in deps] == ["libcst", "tomli"]
    assert (ROOT / "bertlint" / "__main__.py").is_file()
