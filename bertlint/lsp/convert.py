"""Pure helpers of the language server: the link to the library API, edit application, ``# noqa``
edits, rule pages, notebook assembly. Nothing here imports pygls, so it is cheap to test.

Positions inside this module are bertlint's: rows and columns 1-based, counted in code points.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Optional

from bertlint.types import Diagnostic

# ---------------------------------------------------------------------------------------------------
# The library API: the server lints exactly as the command line does.

LINTABLE_SUFFIXES = (".py", ".pyi", ".ipynb", ".json", ".yaml", ".yml")


def lint(text: str, filename: str, settings: Any = None, parse=None) -> list[Diagnostic]:
    """Lint the unsaved ``text`` as if it were the file ``filename`` (the CLI's path and rules). ``parse``: the
    server's incremental parser (``bertlint.incremental``), same module as a full parse."""
    from bertlint import api

    return list(api.lint_text(text, filename, settings, parse=parse))


def load_settings(path: str):
    """The settings of the nearest pyproject.toml / bertlint.toml above ``path`` (may raise the
    core's ConfigError). Read afresh every time: the user edits the configuration while the server
    runs, and finding and parsing it costs well under a millisecond."""
    from bertlint import api, config

    config.clear_caches()
    return api.load_settings(path)


def is_excluded(settings, filename: str) -> bool:
    """``exclude`` in the configuration: the server stays silent on those files, as the CLI does."""
    try:
        return bool(settings.is_excluded(filename))
    except Exception:
        return False


def apply_fixes(text: str, diagnostics: list[Diagnostic], *, unsafe: bool = False):
    """``bertlint.api.apply_fixes``: ``.text``, ``.applied``, ``.failed``."""
    from bertlint import api

    return api.apply_fixes(text, diagnostics, unsafe=unsafe)


FIX_ROUNDS = 10


def fix_all(text: str, diagnostics: list[Diagnostic], filename: str, settings: Any = None, *, unsafe: bool = False):
    """The fix-all action's text: the fixes of ``diagnostics`` (the published ones), then lint and fix again until
    nothing changes (at most ``FIX_ROUNDS`` rounds, as ``bertlint --fix``). Returns ``(text, applied)``: the fixed
    text and the published diagnostics whose fixes the first round applied."""
    from bertlint import api

    first = api.apply_fixes(text, diagnostics, unsafe=unsafe)
    if not first.applied:
        return text, []
    fixed = api.fix_text(first.text, filename, settings, unsafe=unsafe, rounds=FIX_ROUNDS - 1)
    return fixed[0], first.applied


# ---------------------------------------------------------------------------------------------------
# ``# noqa: CODE`` suppression edits.

# ``bertlint.noqa`` holds the edit (the engine's own pattern), shared with ``--add-noqa``.
from bertlint.noqa import noqa_edit  # noqa: E402,F401


# ---------------------------------------------------------------------------------------------------
# Rule pages.

_PKG = Path(__file__).resolve().parent.parent


def page_path(code: str) -> Optional[Path]:
    """The rule's page: bundled in the package (``bertlint/pages``) or in the source tree (``rules/``)."""
    for base in (_PKG / "pages", _PKG.parent / "rules"):
        p = base / f"{code}.md"
        if p.is_file():
            return p.resolve()  # bertlint/pages may be a link to rules/: give the editor the real file
    return None


def rule_meta(code: str):
    from bertlint.registry import ENGINE_CODES, get

    r = get(code)
    if r is not None:
        return r.meta
    return ENGINE_CODES.get(code)


def page_intro(code: str, limit: int = 900) -> str:
    """The start of the rule's page: its opening lines and first section (``## What it finds``, its
    heading made bold), cut at ``limit`` characters on a paragraph or line boundary."""
    p = page_path(code)
    if p is None:
        return ""
    try:
        text = p.read_text(encoding="utf-8")
    except OSError:
        return ""
    lines = text.splitlines()
    # drop the title; keep the first section (its heading included) up to the next heading
    body: list[str] = []
    seen_section = False
    for ln in lines:
        if ln.startswith("# ") and not body:
            continue
        if ln.startswith("## "):
            if seen_section:
                break
            seen_section = True
            ln = f"**{ln[3:].strip()}**"  # a heading is too loud in a hover
        body.append(ln)
    intro = "\n".join(body).strip()
    if len(intro) > limit:
        cut = intro.rfind("\n\n", 0, limit)
        if cut < limit // 3:
            cut = intro.rfind("\n", 0, limit)
        if cut < limit // 3:
            cut = limit
        intro = intro[:cut].rstrip() + "\n\n…"
    return intro


def hover_markdown(code: str) -> str:
    meta = rule_meta(code)
    head = f"**{code}**"
    if meta is not None:
        head += f" `{meta.name}` — {meta.summary}"
    parts = [head]
    intro = page_intro(code)
    if intro:
        parts.append(intro)
    p = page_path(code)
    if p is not None:
        parts.append(f"[Full rule page]({p.as_uri()})")
    return "\n\n".join(parts)


def hover_plain(code: str) -> str:
    meta = rule_meta(code)
    head = code if meta is None else f"{code} {meta.name}: {meta.summary}"
    intro = page_intro(code)
    return head + ("\n\n" + intro if intro else "")


# ---------------------------------------------------------------------------------------------------
# Lines as LSP and libcst count them.

_LINE = re.compile(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$")


def split_lines(text: str) -> list[str]:
    """``text`` split after each ``\n``, ``\r\n`` or ``\r`` (the line ends LSP and libcst count), ends kept.
    Unlike ``str.splitlines``, a form feed or U+2028 inside a line does not start a new one."""
    return _LINE.findall(text)


# ---------------------------------------------------------------------------------------------------
# Whole-document edits: the smallest block of whole lines that changed.


def changed_block(old: str, new: str) -> Optional[tuple[int, int, str]]:
    """``(first_line, end_line, replacement)``: replace 0-based lines ``[first_line, end_line)`` of
    ``old`` with ``replacement`` to get ``new``; None when nothing changed."""
    if old == new:
        return None
    a = split_lines(old)
    b = split_lines(new)
    i = 0
    while i < len(a) and i < len(b) and a[i] == b[i]:
        i += 1
    j = 0
    while j < len(a) - i and j < len(b) - i and a[len(a) - 1 - j] == b[len(b) - 1 - j]:
        j += 1
    return i, len(a) - j, "".join(b[i : len(b) - j])


# ---------------------------------------------------------------------------------------------------
# Notebooks.


def notebook_json(cells: list[str]) -> str:
    """A minimal nbformat-4 notebook holding ``cells`` as code cells, in order (cell k of the result
    is code cell k + 1 in bertlint's numbering)."""
    nb = {
        "cells": [
            {
                "cell_type": "code",
                "execution_count": None,
                "metadata": {},
                "outputs": [],
                "source": split_lines(src),
            }
            for src in cells
        ],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    return json.dumps(nb, indent=1)
