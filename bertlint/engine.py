"""The lint engine: text of one file -> sorted diagnostics. Used by ``bertlint.api`` (CLI, LSP, verifier).

Flow: prefilter text -> parse once -> FileContext (shared, lazy analyses) -> enabled rules -> suppression -> sort.
Notebooks: code cells joined into one module (magics neutralised), diagnostics mapped back to cell and line.
Configuration files (DeepSpeed / accelerate JSON and YAML): parsed, then the config rules read a ConfigContext.
"""

from __future__ import annotations

import gc
import os
import re
import sys
from dataclasses import replace
from typing import Callable, Optional

import libcst as cst

from bertlint import _parse
from bertlint.config import Settings
from bertlint.context import FileContext
from bertlint import registry
from bertlint.registry import ENGINE_CODES
from bertlint.types import Diagnostic, Position

# Files that mention none of these are not parsed (TorchFix's trick).
_PREFILTER = re.compile(
    r"torch|transformers|accelerate|deepspeed|lightning|backward|optimizer|Trainer|TrainingArguments|zero_grad"
)

_NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
_BL_IGNORE = re.compile(r"#\s*bertlint:\s*ignore\[(?P<codes>[^\]]*)\]", re.IGNORECASE)


def _default_internal_error(code: str, filename: str, exc: BaseException) -> None:
    if os.environ.get("BERTLINT_DEBUG"):
        raise exc
    sys.stderr.write(
        f"bertlint: internal error in {code} on {filename}: {type(exc).__name__}: {exc} (the rule was skipped; "
        f"please report it)\n"
    )


# Called when a rule raises: the rule is skipped for this file, the others still run. Tests and the benchmark
# replace it to count crashes; BERTLINT_DEBUG=1 re-raises.
on_internal_error: Callable[[str, str, BaseException], None] = _default_internal_error


def parse_error(filename: str, message: str, row: int = 1, col: int = 1) -> Diagnostic:
    meta = ENGINE_CODES["BL001"]
    pos = Position(max(int(row), 1), max(int(col), 1))
    return Diagnostic(meta.code, meta.name, meta.severity, message, filename, pos, pos)


_BRACKET = re.compile(r"[()\[\]{}]")


def _bracket_depth(source: str) -> int:
    d = m = 0
    for ch in _BRACKET.findall(source):
        if ch in "([{":
            d += 1
            if d > m:
                m = d
        elif d:
            d -= 1
    return m


def parse_python(source: str):
    """cst.Module, or (message, row, col) for a syntax error (never raises)."""
    if source.count("(") + source.count("[") + source.count("{") > 150 and _bracket_depth(source) > 150:
        # libcst's native parser crashes the interpreter on very deep nesting (a few thousand levels); CPython
        # rejects more than 200 nested brackets anyway, so ask it first
        try:
            compile(source, "<bertlint>", "exec", 0x400, dont_inherit=True)
        except SyntaxError as e:
            return (f"SyntaxError: {e.msg}", e.lineno or 1, e.offset or 1)
        except (ValueError, RecursionError, MemoryError):
            pass
        if _bracket_depth(source) > 900:
            return ("the file nests brackets too deeply for the parser", 1, 1)
    try:
        return _parse.parse_module(source)
    except cst.ParserSyntaxError as e:
        fallback = (f"SyntaxError: {e.message}", e.raw_line, e.raw_column + 1)
    except RecursionError:
        return ("the file is nested too deeply to parse", 1, 1)
    except Exception as e:  # libcst's native parser can raise other errors on odd input
        fallback = (f"cannot parse: {type(e).__name__}: {e}", 1, 1)
    # libcst's positions are approximate: ask CPython's parser for the message and position (error path only)
    try:
        compile(source, "<bertlint>", "exec", 0x400, dont_inherit=True)  # ast.PyCF_ONLY_AST
    except SyntaxError as e:
        row = e.lineno or 1
        col = e.offset or 1
        return (f"SyntaxError: {e.msg}", row, col)
    except (ValueError, RecursionError, MemoryError):
        pass
    else:
        msg, row, col = fallback
        return (f"{msg} (this Python accepts the syntax, but the libcst grammar bertlint uses does not)", row, col)
    return fallback


def _default_warning(filename: str, message: str) -> None:
    sys.stderr.write(f"warning: {filename}: {message}\n")


# Called once per file whose tree is too deep for the analyses (RecursionError): those rules are skipped.
on_warning: Callable[[str, str], None] = _default_warning


def _run_rules(ctx, target: str, settings: Settings) -> None:
    too_deep = []
    for r in registry.enabled(settings, target):  # imports only the selected rules' modules
        ctx.current = r.meta
        try:
            r.check(ctx)
        except RecursionError:  # pathological nesting: no finding rather than a guess
            too_deep.append(r.meta.code)
        except Exception as e:  # a rule bug must not take the file (or the run) down
            on_internal_error(r.meta.code, ctx.filename, e)
    ctx.current = None
    if too_deep:
        on_warning(ctx.filename, f"nested too deeply to analyse; skipped {', '.join(too_deep)}")


class _NoGC:
    """No cyclic garbage collection while one file is parsed and analysed (the previous state is restored).

    A parse allocates a few hundred thousand objects that all stay alive, and each automatic collection
    during the parse and the analyses walks all of them again: on a 1,200-line script that was more CPU than
    the analyses themselves. The tree is freed by reference counting afterwards (``_release``)."""

    __slots__ = ("was",)

    def __enter__(self):
        self.was = gc.isenabled()
        gc.disable()
        return self

    def __exit__(self, *exc):
        if self.was:
            gc.enable()
        return False


# Set by the command line when it ends the process without freeing what is still alive (``cli._fast_exit``, as
# mypy's --fast-exit): the tree and analyses of the last file linted are then left to the exit instead of being freed
# one object at a time (~20 ms for a 1,200-line script's few hundred thousand nodes); an earlier file's are freed
# when the next one is done, as always.
keep_last = False
_kept: list = []


def _done(ctx) -> None:
    if not keep_last:
        _release(ctx)
        return
    old = _kept[:]
    _kept[:] = [ctx]
    for c in old:
        _release(c)


def _release(ctx) -> None:
    """Break the reference cycles between a file's context and its analyses (they hold each other), so that the
    tree and the analyses are freed by reference counting now, not by a later garbage collection."""
    from bertlint.analysis import walk

    ctx.__dict__.clear()
    walk.release_children()


DATABRICKS_HEADER = "# Databricks notebook source"


def databricks_to_python(source: str) -> str:
    """A Databricks notebook exported as ``.py`` (first line ``# Databricks notebook source``, cells separated by
    ``# COMMAND ----------``) may hold IPython shell / magic lines in its Python cells (``!deepspeed ... \\``,
    ``%pip install ...``), which Databricks runs but Python cannot parse: each cell's such lines become ``pass``
    (same number of lines, so every position stays where it was), as for a Jupyter notebook's code cells."""
    from bertlint.sources import cell_to_python

    lines = source.splitlines(keepends=True)
    out: list[str] = []
    cell: list[str] = []
    for line in lines:
        if line.startswith("# COMMAND ----------"):
            out.extend(cell_to_python(cell))
            out.append(line)
            cell = []
        else:
            cell.append(line)
    out.extend(cell_to_python(cell))
    return "".join(out)


def lint_python(source: str, filename: str, settings: Optional[Settings] = None, parse=None) -> list[Diagnostic]:
    """``parse``: what turns the text into a module or a syntax error (default ``parse_python``; the language
    server passes one that re-parses only the statements an edit touched, ``bertlint.incremental``)."""
    settings = settings or Settings()
    if not _PREFILTER.search(source):
        return []
    with _NoGC():
        module = (parse or parse_python)(source)
        if isinstance(module, tuple) and source.startswith(DATABRICKS_HEADER):
            py = databricks_to_python(source)
            if py != source:
                again = parse_python(py)
                if not isinstance(again, tuple):
                    source, module = py, again
        if isinstance(module, tuple):
            if not settings.is_enabled("BL001"):
                return []
            return [parse_error(filename, *module)]
        ctx = FileContext(filename, source, module, settings)
        del module
        try:
            _run_rules(ctx, "python", settings)
            raw = ctx.diagnostics
        finally:
            _done(ctx)
    diags = filter_suppressed(raw, source) if raw else raw
    if "#" in source and settings.is_enabled("BL002", False):  # noqa codes that suppress nothing (off by default)
        from bertlint.noqa import unused_noqa

        diags = diags + unused_noqa(raw, source, filename, settings)
    return sorted(diags, key=Diagnostic.sort_key)


# ------------------------------------------------------------------------------------------- suppression


class _Comments:
    """Per-row comment text and the first row of each row's logical line (computed only when a file has
    diagnostics)."""

    def __init__(self, source: str) -> None:
        self.comments: dict[int, str] = {}
        self.first: dict[int, int] = {}
        try:
            self._tokenize(source)
        except Exception:  # tokenize disagrees with libcst (new syntax): fall back to plain text
            self.comments = {}
            self.first = {}
            for i, line in enumerate(source.splitlines(), start=1):
                if "#" in line:
                    self.comments[i] = line[line.index("#") :]

    def _tokenize(self, source: str) -> None:
        import io
        import tokenize

        start: Optional[int] = None
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            t = tok.type
            if t == tokenize.COMMENT:
                self.comments[tok.start[0]] = self.comments.get(tok.start[0], "") + tok.string
                continue
            if t in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            if start is None:
                start = tok.start[0]
            if t == tokenize.NEWLINE:
                for r in range(start, tok.end[0] + 1):
                    self.first[r] = start
                start = None

    def suppressed(self, d: Diagnostic) -> bool:
        rows = {d.start.row, self.first.get(d.start.row, d.start.row)}
        first = d.data.get("statement_row") if d.data else None
        if isinstance(first, int):
            rows.add(first)
        return any(_comment_suppresses(self.comments.get(r), d.code) for r in rows)


def _comment_suppresses(text: Optional[str], code: str) -> bool:
    if not text:
        return False
    m = _BL_IGNORE.search(text)
    if m and _codes_match(code, m.group("codes")):
        return True
    m = _NOQA.search(text)
    if m:
        if not m.group("codes"):
            return True
        if _codes_match(code, m.group("codes")):
            return True
    return False


def filter_suppressed(diags: list[Diagnostic], source: str) -> list[Diagnostic]:
    if "#" not in source:
        return diags
    if _NOQA.search(source) is None and _BL_IGNORE.search(source) is None:
        # a finding is suppressed only by a comment that matches one of the two patterns, and each row's comment
        # is a piece of the text (one comment per physical line): no match in the text, nothing to tokenize
        return diags
    c = _Comments(source)
    return [d for d in diags if not c.suppressed(d)]


def is_suppressed(d: Diagnostic, lines: list[str]) -> bool:
    """Line-based check (kept for callers that hold lines only, with or without line endings)."""
    return _Comments("".join(x if x.endswith("\n") else x + "\n" for x in lines)).suppressed(d)


def _codes_match(code: str, codes: str) -> bool:
    return any(code.startswith(c.strip().upper()) for c in re.split(r"[\s,]+", codes) if c.strip())


# --------------------------------------------------------------------------------------------- notebooks


def lint_notebook(text: str, filename: str, settings: Optional[Settings] = None) -> list[Diagnostic]:
    from bertlint.sources import DecodeError, cell_to_python, join_cells, read_notebook

    settings = settings or Settings()
    try:
        nb = read_notebook(text)
    except DecodeError as e:
        return [parse_error(filename, e.message, e.row, e.column)] if settings.is_enabled("BL001") else []
    problems = [replace(parse_error(filename, m, r, c), cell=n) for n, r, c, m in nb.problems]
    if not settings.is_enabled("BL001"):
        problems = []
    if not _PREFILTER.search(nb.source):
        return problems
    errors: list[Diagnostic] = list(problems)
    blank: set[int] = set()
    raw: set[int] = set()
    first_error: dict[int, tuple] = {}
    module = None
    for _ in range(2 * len(nb.cells) + 1):
        module = parse_python(nb.source)
        if not isinstance(module, tuple):
            break
        msg, row, col = module
        cell, crow = nb.map_row(row)
        if cell in blank or cell < 1:
            module = None
            break
        lines = nb.lines_of(cell) or []
        if cell not in raw and any(a != b for a, b in zip(lines, cell_to_python(lines))):
            # maybe a neutralised "magic" was Python after all (`% b` continuing an expression): retry as is
            raw.add(cell)
            first_error[cell] = (msg, crow, col)
        else:
            blank.add(cell)
            msg, crow, col = first_error.get(cell, (msg, crow, col))
            errors.append(replace(parse_error(filename, msg, crow, col), cell=cell))
        nb = join_cells(nb.cells, nb.cell_index, nb.nb, frozenset(blank), frozenset(raw - blank))
    if not settings.is_enabled("BL001"):
        errors = []
    if module is None or isinstance(module, tuple):
        return sorted(errors, key=Diagnostic.sort_key)
    with _NoGC():
        ctx = FileContext(filename, nb.source, module, settings)
        del module
        ctx.notebook = nb  # type: ignore[attr-defined]
        try:
            _run_rules(ctx, "python", settings)
            found = ctx.diagnostics
        finally:
            _done(ctx)
    diags = filter_suppressed(found, nb.source) if found else []
    if "#" in nb.source and settings.is_enabled("BL002", False):
        from bertlint.noqa import unused_noqa

        diags = diags + unused_noqa(found, nb.source, filename, settings)
    out = [m for m in (map_to_cell(d, nb) for d in diags) if m is not None]
    return sorted(out + errors, key=Diagnostic.sort_key)


def map_to_cell(d: Diagnostic, nb) -> Optional[Diagnostic]:
    """Combined-module positions -> cell-relative positions (the fix is kept only if it stays in the cell)."""
    cell, row = nb.map_row(d.start.row)
    start = Position(row, d.start.column)
    end = _map_pos(d.end, cell, nb) or Position(row, d.start.column)
    fix = d.fix
    if fix is not None:
        edits = []
        for e in fix.edits:
            s, t = _map_pos(e.start, cell, nb), _map_pos(e.end, cell, nb)
            if s is None or t is None:
                fix = None
                break
            edits.append(replace(e, start=s, end=t))
        else:
            fix = replace(fix, edits=tuple(edits))
    return replace(d, start=start, end=end, cell=cell, fix=fix)


def _map_pos(p: Position, cell: int, nb) -> Optional[Position]:
    if 1 <= p.row <= len(nb.rows):
        c, r = nb.rows[p.row - 1]
        if c == cell:
            return Position(r, p.column)
    # the end of a cell's last line: (last row + 1, column 1)
    if p.column == 1 and 2 <= p.row <= len(nb.rows) + 1:
        c, r = nb.rows[p.row - 2]
        if c == cell:
            return Position(r + 1, 1)
    return None


# ------------------------------------------------------------------------------------------ config files


def lint_config(text: str, filename: str, settings: Optional[Settings] = None) -> list[Diagnostic]:
    from bertlint.context import ConfigContext
    from bertlint.sources import DecodeError, parse_config_text

    settings = settings or Settings()
    try:
        data, fmt = parse_config_text(text, filename)
    except DecodeError as e:
        return [parse_error(filename, e.message, e.row, e.column)] if settings.is_enabled("BL001") else []
    ctx = ConfigContext(filename, text, data, settings, fmt)
    _run_rules(ctx, "config", settings)
    diags = ctx.diagnostics
    if diags and fmt == "yaml" and "#" in text:
        lines = text.splitlines()
        diags = [
            d
            for d in diags
            if not (1 <= d.start.row <= len(lines) and _comment_suppresses(_yaml_comment(lines[d.start.row - 1]), d.code))
        ]
    return sorted(diags, key=Diagnostic.sort_key)


def _yaml_comment(line: str) -> Optional[str]:
    i = line.find(" #") if not line.lstrip().startswith("#") else line.find("#")
    return line[i:] if i >= 0 else None
