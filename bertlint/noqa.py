"""``# noqa`` comments beyond the one line: the file-level ``# bertlint: noqa`` exemption, ``--add-noqa`` (one
comment on every reported line), the ``# noqa: CODE`` edit the language server offers, and BL002 (``# noqa`` /
``# bertlint: ignore[...]`` codes that suppress nothing, off by default).

Line-level suppression itself is the engine's (``bertlint.engine.filter_suppressed``); the patterns here are the
engine's own, so what these functions write is exactly what the engine reads.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Optional

from bertlint.types import Applicability, Diagnostic, Edit, Fix, Position

NOQA = re.compile(r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", re.IGNORECASE)
BL_IGNORE = re.compile(r"#\s*bertlint:\s*ignore\[(?P<codes>[^\]]*)\]", re.IGNORECASE)
# ``# bertlint: noqa`` (every code) or ``# bertlint: noqa: BL101, BL2`` on a line of its own: the whole file.
FILE_NOQA = re.compile(
    r"^[ \t]*#[ \t]*bertlint:[ \t]*noqa(?:[ \t]*:[ \t]*(?P<codes>[A-Za-z]+[0-9]*(?:[ \t,]+[A-Za-z]+[0-9]*)*))?[ \t]*$",
    re.IGNORECASE | re.MULTILINE,
)


def _split(codes: str) -> list[str]:
    return [c.strip().upper() for c in re.split(r"[\s,]+", codes) if c.strip()]


# ------------------------------------------------------------------------------------------- file level


def file_exemption(source: str) -> Optional[list[str]]:
    """The codes a file-level ``# bertlint: noqa[: CODES]`` exempts (``["ALL"]`` for every code), or None."""
    if "noqa" not in source or "bertlint" not in source.lower():
        return None
    out: list[str] = []
    for m in FILE_NOQA.finditer(source):
        if not m.group("codes"):
            return ["ALL"]
        out.extend(_split(m.group("codes")))
    return out or None


def apply_file_exemption(diags: list[Diagnostic], text: str, kind: str) -> list[Diagnostic]:
    """Drop the diagnostics a file-level exemption covers. ``text`` is the file as read (a notebook's JSON: its
    code cells are searched)."""
    if not diags or "noqa" not in text:
        return diags
    if kind == "notebook":
        try:
            from bertlint.sources import read_notebook

            source = read_notebook(text).source
        except Exception:
            return diags
    elif kind == "config" and not text.lstrip().startswith(("{", "[")):
        source = text  # YAML comments
    elif kind == "config":
        return diags  # JSON has no comments
    else:
        source = text
    codes = file_exemption(source)
    if codes is None:
        return diags
    if "ALL" in codes:
        return []
    return [d for d in diags if not any(d.code.startswith(c) for c in codes)]


# ------------------------------------------------------------------------------------- the noqa edit


def noqa_edit(line: str, code: str) -> Optional[tuple[int, int, str]]:
    """The edit that suppresses ``code`` on ``line`` (its text without the line ending):
    ``(start, end, replacement)`` in 0-based code-point columns, or None when the line cannot take
    a comment (it continues with a backslash) or is suppressed already."""
    return noqa_edit_codes(line, [code])


def noqa_edit_codes(line: str, codes: list[str]) -> Optional[tuple[int, int, str]]:
    """``noqa_edit`` for several codes at once (``--add-noqa``: one comment per line)."""
    m = NOQA.search(line)
    if m:
        listed_text = m.group("codes")
        if not listed_text:
            return None  # a bare `# noqa` suppresses everything already
        listed = [c for c in re.split(r"[\s,]+", listed_text) if c]
        new = [c for c in codes if not any(c.startswith(x.upper()) for x in listed)]
        if not new:
            return None
        return m.start(), m.end(), "# noqa: " + ", ".join(listed + sorted(set(new)))
    b = BL_IGNORE.search(line)
    if b and all(any(c.startswith(x) for x in _split(b.group("codes"))) for c in codes):
        return None
    body = line.rstrip()
    if body.endswith("\\"):
        return None
    return len(body), len(line), f"  # noqa: {', '.join(sorted(set(codes)))}"


# ------------------------------------------------------------------------------------------ --add-noqa


def _commentable_rows(source: str) -> Optional[dict[int, int]]:
    """{row: the row whose end can take the comment} for rows of ``source``: a row inside a multi-line string or
    continued by a backslash sends its comment to the last row of its statement (where the engine also looks: the
    statement's first row is checked, and so is the reported row). None when the source does not tokenize."""
    import io
    import tokenize

    out: dict[int, int] = {}
    bad: set[int] = set()  # rows whose end is inside a string token
    start: Optional[int] = None
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.STRING or getattr(tokenize, "FSTRING_MIDDLE", -1) == tok.type:
                bad.update(range(tok.start[0], tok.end[0]))
            if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
                continue
            if start is None:
                start = tok.start[0]
            if tok.type == tokenize.NEWLINE:
                first = start
                for r in range(start, tok.end[0] + 1):
                    if r not in bad:
                        out[r] = r
                    elif first not in bad:
                        out[r] = first  # a row ending inside a string: comment the statement's first row
                start = None
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return None
    return out


def add_noqa_text(text: str, diags: list[Diagnostic], kind: str) -> tuple[str, int]:
    """``text`` with ``# noqa: CODES`` added on each reported line (Python scripts and notebooks; YAML configs at
    the end of the line). Returns (new text, number of comments added or extended). BL001 (a file that does not
    parse) is not suppressed this way."""
    diags = [d for d in diags if d.code != "BL001"]
    if not diags:
        return text, 0
    if kind == "notebook":
        return _add_noqa_notebook(text, diags)
    if kind == "config" and text.lstrip().startswith(("{", "[")):
        return text, 0  # JSON has no comments
    new, n = _add_noqa_lines(text, [(d.start.row, d.code) for d in diags], python=kind != "config")
    return new, n


def _plan(lines: list[str], wanted: list[tuple[int, str]], rows_map: Optional[dict[int, int]]) -> dict[int, list[str]]:
    by_row: dict[int, list[str]] = {}
    for row, code in wanted:
        r = rows_map.get(row) if rows_map is not None else row
        if r is not None and 1 <= r <= len(lines):
            by_row.setdefault(r, []).append(code)
    return by_row


def _add_noqa_lines(text: str, wanted: list[tuple[int, str]], python: bool = True) -> tuple[str, int]:
    lines = text.splitlines(keepends=True)
    rows_map = _commentable_rows(text) if python else None
    if python and rows_map is None:
        return text, 0
    n = 0
    for r, codes in sorted(_plan(lines, wanted, rows_map).items()):
        line = lines[r - 1]
        body = line.rstrip("\r\n")
        end = line[len(body) :]
        e = noqa_edit_codes(body, codes)
        if e is None:
            continue
        s, t, repl = e
        lines[r - 1] = body[:s] + repl + body[t:] + end
        n += 1
    return "".join(lines), n


def _add_noqa_notebook(text: str, diags: list[Diagnostic]) -> tuple[str, int]:
    """Through the notebook fix machinery: each comment is an edit of its cell (the JSON is written back)."""
    from bertlint import fixes
    from bertlint.sources import cell_to_python, read_notebook

    try:
        nb = read_notebook(text)
    except Exception:
        return text, 0
    by_cell: dict[int, list[Diagnostic]] = {}
    for d in diags:
        if d.cell is not None:
            by_cell.setdefault(d.cell, []).append(d)
    carriers = []
    for cell, ds in by_cell.items():
        lines = nb.lines_of(cell)
        if not lines:
            continue
        src = "".join(cell_to_python(lines))
        rows_map = _commentable_rows(src)
        if rows_map is None:
            continue
        for r, codes in _plan(lines, [(d.start.row, d.code) for d in ds], rows_map).items():
            body = lines[r - 1].rstrip("\r\n")
            e = noqa_edit_codes(body, codes)
            if e is None:
                continue
            s, t, repl = e
            edit = Edit(repl, Position(r, s + 1), Position(r, t + 1))
            carriers.append(replace(ds[0], start=Position(r, 1), end=Position(r, 1),
                                    fix=Fix("add noqa", Applicability.SAFE, (edit,))))
    if not carriers:
        return text, 0
    res = fixes.apply_notebook_fixes(text, carriers)
    return res.text, len(res.applied)


# ------------------------------------------------------------------------------------------------ BL002


def _known_codes() -> set[str]:
    from bertlint.registry import ENGINE_CODES, all_rules

    return set(ENGINE_CODES) | {r.meta.code for r in all_rules()}


def _ran(code_prefix: str, known: set[str], settings, target: str) -> bool:
    """Whether every rule ``code_prefix`` names ran on this file (only then is a silent comment unused)."""
    from bertlint.registry import ENGINE_CODES, get

    covered = [c for c in known if c.startswith(code_prefix)]
    if not covered:
        return False
    for c in covered:
        if c in ENGINE_CODES:
            meta = ENGINE_CODES[c]
            if c != "BL001" and not settings.is_enabled(c, meta.default_enabled):
                return False
            continue
        r = get(c)
        if r is None or target not in r.meta.targets or not settings.is_enabled(c, r.meta.default_enabled):
            return False
    return True


def unused_noqa(raw: list[Diagnostic], source: str, filename: str, settings, target: str = "python") -> list[Diagnostic]:
    """BL002: the ``# noqa: BLxxx`` / ``# bertlint: ignore[BLxxx]`` codes of ``source`` that suppress no finding of
    ``raw`` (the diagnostics before suppression) although their rule ran, and codes no rule has. Codes of other
    tools (``E501``, ``F401``) and bare ``# noqa`` are left alone. Positions are in ``source``."""
    if "#" not in source:
        return []
    from bertlint.engine import _Comments
    from bertlint.registry import ENGINE_CODES

    comments = _Comments(source)
    used: dict[int, set[str]] = {}
    for d in raw:
        rows = {d.start.row, comments.first.get(d.start.row, d.start.row)}
        first = d.data.get("statement_row") if d.data else None
        if isinstance(first, int):
            rows.add(first)
        for r in rows:
            text = comments.comments.get(r)
            if not text:
                continue
            for tok in _listed(text):
                if d.code.startswith(tok):
                    used.setdefault(r, set()).add(tok)
    known = _known_codes()
    meta = ENGINE_CODES["BL002"]
    lines = source.splitlines()
    out: list[Diagnostic] = []
    for r, text in sorted(comments.comments.items()):
        listed = _listed(text)
        if not listed or any("BL002".startswith(t) for t in listed):
            continue  # `# noqa: BL002` (or a prefix of it) keeps this line's comment as it is
        unknown = [t for t in listed if not any(c.startswith(t) for c in known)]
        unused = [t for t in listed if t not in unknown and t not in used.get(r, set()) and _ran(t, known, settings, target)]
        if not unknown and not unused:
            continue
        line = lines[r - 1] if 1 <= r <= len(lines) else ""
        col = line.find("#") + 1 if "#" in line else 1
        parts = []
        if unused:
            parts.append(
                f"unused {', '.join(unused)} (no {'finding of these codes' if len(unused) > 1 else unused[0] + ' finding'} "
                "is reported on this line, so the comment suppresses nothing)"
            )
        if unknown:
            parts.append(f"unknown {', '.join(unknown)} (no bertlint rule has {'these codes' if len(unknown) > 1 else 'this code'})")
        fix = _removal_fix(line, r, set(unused) | set(unknown))
        out.append(
            Diagnostic(
                meta.code, meta.name, meta.severity,
                f"`# noqa` comment lists codes that suppress nothing here: {'; '.join(parts)}. Remove them; "
                "a stale suppression would hide the next real finding on this line.",
                filename, Position(r, col), Position(r, len(line) + 1), fix,
            )
        )
    return out


def _listed(comment: str) -> list[str]:
    """The bertlint codes a comment lists (``# noqa: BL101, E501`` -> [BL101]; bare ``# noqa`` -> [])."""
    out: list[str] = []
    m = BL_IGNORE.search(comment)
    if m:
        out.extend(c for c in _split(m.group("codes")) if c.startswith("BL"))
    m = NOQA.search(comment)
    if m and m.group("codes"):
        out.extend(c for c in _split(m.group("codes")) if c.startswith("BL"))
    seen: list[str] = []
    for c in out:
        if c not in seen:
            seen.append(c)
    return seen


def _removal_fix(line: str, row: int, drop: set[str]) -> Optional[Fix]:
    """Remove the dropped codes from the line's ``# noqa: ...`` (or ``ignore[...]``); the whole comment when none
    is left. Only when the directive is the line's last comment text (else: no fix)."""
    for pat in (NOQA, BL_IGNORE):
        m = pat.search(line)
        if not m or not m.group("codes") or line[m.end() :].strip():
            continue
        keep = [c for c in re.split(r"[\s,]+", m.group("codes")) if c and c.upper() not in drop]
        if keep:
            repl = ("# noqa: " + ", ".join(keep)) if pat is NOQA else ("# bertlint: ignore[" + ", ".join(keep) + "]")
            start = m.start()
        else:
            repl = ""
            start = len(line[: m.start()].rstrip())
            if start == 0:
                return None  # a comment-only line: leave the line to the user
        edit = Edit(repl, Position(row, start + 1), Position(row, m.end() + 1))
        return Fix("Remove the unused codes", Applicability.SAFE, (edit,))
    return None
