"""Library entry points, shared by the CLI, the LSP server and the verifier (as Fixit's api.py).

    lint_text(text, filename, settings=None) -> list[Diagnostic]   # by suffix: .py, .ipynb, .json/.yaml/.yml
    lint_path(path, settings=None) -> list[Diagnostic]             # reads the file; settings from the nearest config
    load_settings(path) -> Settings
    apply_fixes(text, diagnostics, *, unsafe=False) -> FixResult   # .text, .applied, .failed
"""

from __future__ import annotations

from bertlint._dataclass import dataclass, field
from typing import Optional

from bertlint.config import ConfigError, Settings, load_settings
from bertlint.types import Diagnostic

__all__ = [
    "ConfigError",
    "FileResult",
    "Settings",
    "apply_fixes",
    "check_file",
    "fix_text",
    "lint_path",
    "lint_text",
    "load_settings",
    "read_source",
]


def lint_text(text: str, filename: str, settings: Optional[Settings] = None, *, parse=None) -> list[Diagnostic]:
    """Diagnostics for the contents ``text`` of ``filename`` (the name picks the reader and is reported).
    ``parse`` (Python files): text -> module or syntax error, instead of a full parse (the language server's
    incremental one)."""
    from bertlint import engine
    from bertlint.sources import kind_of

    settings = (settings or Settings()).for_file(filename)
    k = kind_of(filename)
    if k == "notebook":
        diags = engine.lint_notebook(text, filename, settings)
    elif k == "config":
        diags = engine.lint_config(text, filename, settings)
    else:
        diags = engine.lint_python(text, filename, settings, parse)
    if diags and "noqa" in text:  # a file-level `# bertlint: noqa[: CODES]` line
        from bertlint.noqa import apply_file_exemption

        diags = apply_file_exemption(diags, text, k)
    return diags


def read_source(path: str, data: Optional[bytes] = None):
    """(text, encoding) of a file; raises ``sources.BinaryFile``, ``sources.DecodeError`` or ``OSError``."""
    from bertlint.sources import decode, kind_of

    if data is None:
        with open(path, "rb") as f:
            data = f.read()
    return decode(data, python=kind_of(path) in ("python", "other"))


def lint_path(path: str, settings: Optional[Settings] = None) -> list[Diagnostic]:
    """Diagnostics for the file at ``path``; unreadable or undecodable files give a BL001 diagnostic, binary
    files give none."""
    if settings is None:
        settings = load_settings(path)
    return check_file(path, settings).diagnostics


def apply_fixes(text: str, diagnostics: list[Diagnostic], *, unsafe: bool = False):
    """Apply the diagnostics' fixes to ``text`` (notebook JSON when the diagnostics carry cells)."""
    from bertlint import fixes
    from bertlint.sources import kind_of

    if any(d.cell is not None for d in diagnostics):
        return fixes.apply_notebook_fixes(text, diagnostics, unsafe=unsafe)
    names = {d.filename for d in diagnostics}
    if len(names) == 1 and kind_of(next(iter(names))) == "config":
        return fixes.apply_fixes(text, diagnostics, unsafe=unsafe, parses=_config_parse_error(next(iter(names))))
    return fixes.apply_fixes(text, diagnostics, unsafe=unsafe)


def fix_text(text: str, filename: str, settings: Optional[Settings] = None, *, unsafe: bool = False, rounds: int = 10):
    """Fix until nothing more applies. Returns (new_text, applied, failed, remaining diagnostics)."""
    from bertlint import fixes
    from bertlint.sources import kind_of

    kind = kind_of(filename)
    nb = kind == "notebook"
    parses = _config_parse_error(filename) if kind == "config" else None
    applied: list[Diagnostic] = []
    failed: list[tuple[Diagnostic, str]] = []
    seen: set = set()
    diags = lint_text(text, filename, settings)
    converged = True
    for n in range(rounds + 1):
        if not any(fixes.wanted(d, unsafe) for d in diags):
            break
        if nb:
            r = fixes.apply_notebook_fixes(text, diags, unsafe=unsafe)
        else:
            r = fixes.apply_fixes(text, diags, unsafe=unsafe, parses=parses)
        if n == rounds:  # a fix would still apply after the last round (ruff: "failed to converge")
            converged = not r.applied
            break
        for d, why in r.failed:
            key = (d.code, d.cell, d.start, d.message)
            if key not in seen:
                seen.add(key)
                failed.append((d, why))
        if not r.applied:
            break
        applied.extend(r.applied)
        text = r.text
        diags = lint_text(text, filename, settings)
    out = _Fixed((text, applied, failed, diags))
    out.converged = converged
    return out


class _Fixed(tuple):
    """``fix_text``'s (text, applied, failed, remaining); ``.converged`` is False when fixes were still left after
    the last round (each round re-lints the fixed text: a fix can expose another finding)."""

    converged: bool = True


def _config_parse_error(filename: str):
    """A ``parses`` check for JSON / YAML configuration files (a fix must leave them parseable)."""

    def check(text: str):
        from bertlint.sources import DecodeError, parse_config_text

        try:
            parse_config_text(text, filename)
        except DecodeError as e:
            return f"{e.message} at {e.row}:{e.column}"
        return None

    return check


@dataclass
class FileResult:
    filename: str
    diagnostics: list[Diagnostic] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    source: Optional[str] = None  # the text the diagnostics refer to (after fixing, the fixed text)
    original: Optional[str] = None  # with --fix/--diff: the text before fixing
    fixed_text: Optional[str] = None  # with --fix/--diff: the text after fixing (None: unchanged)
    applied: list[Diagnostic] = field(default_factory=list)
    failed: list[tuple[Diagnostic, str]] = field(default_factory=list)
    encoding: str = "utf-8"


def check_file(
    path: str,
    settings: Settings,
    *,
    fix: bool = False,
    unsafe: bool = False,
    write: bool = False,
    data: Optional[bytes] = None,
    display_name: Optional[str] = None,
) -> FileResult:
    """Read, lint and (with ``fix``) fix one file. ``write`` writes the fixed file atomically."""
    from bertlint import engine
    from bertlint.sources import BinaryFile, DecodeError

    name = display_name or path
    res = FileResult(name)
    try:
        text, enc = read_source(path, data)
    except BinaryFile:
        res.warnings.append(f"{name}: skipped: binary file")
        return res
    except DecodeError as e:
        if settings.is_enabled("BL001"):
            res.diagnostics = [engine.parse_error(name, e.message, e.row, e.column)]
        return res
    except OSError as e:
        if settings.is_enabled("BL001"):
            res.diagnostics = [engine.parse_error(name, f"cannot read the file: {e.strerror or e}")]
        return res
    res.source = text
    res.encoding = enc
    # engine warnings (a file too deep to analyse) travel with the result: deterministic order in parallel runs
    seen_warnings: set = set()

    def warn(filename: str, message: str) -> None:
        w = f"{filename}: {message}"
        if w not in seen_warnings:
            seen_warnings.add(w)
            res.warnings.append(w)

    previous = engine.on_warning
    engine.on_warning = warn
    try:
        return _check_text(res, path, text, enc, name, settings, fix, unsafe, write)
    finally:
        engine.on_warning = previous


def _check_text(res: FileResult, path, text, enc, name, settings, fix, unsafe, write) -> FileResult:
    if not fix:
        res.diagnostics = lint_text(text, name, settings)
        return res
    fixed = fix_text(text, name, settings, unsafe=unsafe)
    new, applied, failed, remaining = fixed
    if not getattr(fixed, "converged", True):
        res.warnings.append(f"{name}: the fixes did not reach a fixed point in 10 rounds; the file is fixed as far as it got")
    res.diagnostics = remaining
    res.applied = applied
    res.failed = failed
    if new != text:
        res.fixed_text = new
        res.original = text
        res.source = new
        if write:
            from bertlint.fixes import atomic_write
            from bertlint.sources import encode

            try:
                atomic_write(path, encode(new, enc))
            except (OSError, UnicodeEncodeError) as e:
                res.warnings.append(f"{name}: cannot write the fixes: {e}")
                res.applied = []
                res.fixed_text = None
                res.source = text
                res.diagnostics = lint_text(text, name, settings)
    return res
