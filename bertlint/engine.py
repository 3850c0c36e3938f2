"""The lint engine: text of one file -> sorted diagnostics. Used by the CLI, the LSP server and the verifier.

Flow: prefilter text -> parse once -> FileContext (shared, lazy analyses) -> enabled rules -> suppression -> sort.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from bertlint.config import Settings
from bertlint.context import FileContext
from bertlint.registry import ENGINE_CODES, all_rules
from bertlint.types import Diagnostic, Position

# Files that mention none of these are not parsed (TorchFix's trick).
_PREFILTER = re.compile(
    r"torch|transformers|accelerate|deepspeed|lightning|backward|optimizer|Trainer|TrainingArguments|zero_grad"
)

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_BL_IGNORE = re.compile(r"#\s*bertlint:\s*ignore\[(?P<codes>[^\]]*)\]")


def parse_error(filename: str, message: str, row: int = 1, col: int = 1) -> Diagnostic:
    meta = ENGINE_CODES["BL001"]
    pos = Position(max(row, 1), max(col, 1))
    return Diagnostic(meta.code, meta.name, meta.severity, message, filename, pos, pos)


def lint_python(source: str, filename: str, settings: Optional[Settings] = None) -> list[Diagnostic]:
    settings = settings or Settings()
    if not _PREFILTER.search(source):
        return []
    try:
        module = cst.parse_module(source)
    except cst.ParserSyntaxError as e:
        return [parse_error(filename, f"SyntaxError: {e.message}", e.raw_line, e.raw_column + 1)]
    ctx = FileContext(filename, source, module, settings)
    for r in all_rules():
        if "python" not in r.meta.targets or not settings.is_enabled(r.meta.code, r.meta.default_enabled):
            continue
        ctx.current = r.meta
        r.check(ctx)
    ctx.current = None
    diags = [d for d in ctx.diagnostics if not is_suppressed(d, ctx.lines)]
    return sorted(diags, key=Diagnostic.sort_key)


def is_suppressed(d: Diagnostic, lines: list[str]) -> bool:
    rows = {d.start.row}
    first = d.data.get("statement_row")
    if isinstance(first, int):
        rows.add(first)
    for row in rows:
        if not 1 <= row <= len(lines):
            continue
        text = lines[row - 1]
        if "#" not in text:
            continue
        m = _BL_IGNORE.search(text)
        if m and _codes_match(d.code, m.group("codes")):
            return True
        m = _NOQA.search(text)
        if m:
            if not m.group("codes"):
                return True
            if _codes_match(d.code, m.group("codes")):
                return True
    return False


def _codes_match(code: str, codes: str) -> bool:
    return any(code.startswith(c.strip()) for c in re.split(r"[\s,]+", codes) if c.strip())
