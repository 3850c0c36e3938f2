"""Applying fixes: non-overlapping edits applied from the end of the file backwards, the result parsed again,
a fix that breaks parsing reverted and reported with its rule code; atomic writes (temporary file + rename)."""

from __future__ import annotations

import os
from bertlint._dataclass import dataclass, field
from typing import Callable, Optional

from bertlint.types import Applicability, Diagnostic, Edit, Position


@dataclass
class FixResult:
    text: str
    applied: list[Diagnostic] = field(default_factory=list)
    failed: list[tuple[Diagnostic, str]] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.applied)


def _offsets(text: str) -> list[int]:
    """Offset of the start of every row (1-based rows -> index row-1), plus one past the end."""
    starts = [0]
    i = 0
    n = len(text)
    while True:
        j = text.find("\n", i)
        if j < 0:
            break
        starts.append(j + 1)
        i = j + 1
    if starts[-1] != n:
        starts.append(n)
    return starts


def _offset(starts: list[int], text: str, p: Position) -> Optional[int]:
    if p.row < 1:
        return None
    if p.row > len(starts):
        return len(text) if p.column == 1 else None
    base = starts[p.row - 1]
    off = base + p.column - 1
    if off > len(text):
        return len(text) if p.column == 1 else None
    return off


def wanted(d: Diagnostic, unsafe: bool) -> bool:
    if d.fix is None or not d.fix.edits:
        return False
    return d.fix.applicability == Applicability.SAFE or unsafe


def _spans(text: str, d: Diagnostic) -> Optional[list[tuple[int, int, str]]]:
    starts = _offsets(text)
    out = []
    for e in d.fix.edits:  # type: ignore[union-attr]
        a, b = _offset(starts, text, e.start), _offset(starts, text, e.end)
        if a is None or b is None or b < a:
            return None
        out.append((a, b, e.content))
    out.sort()
    for (a1, b1, _), (a2, b2, _) in zip(out, out[1:]):
        if a2 < b1 or a1 == b1 == a2 == b2:  # overlapping edits (or two insertions at one point) in one fix
            return None
    return out


def _apply_spans(text: str, spans: list[tuple[int, int, str]]) -> str:
    for a, b, content in sorted(spans, reverse=True):
        text = text[:a] + content + text[b:]
    return text


def apply_fixes(
    text: str,
    diagnostics: list[Diagnostic],
    *,
    unsafe: bool = False,
    parses: Optional[Callable[[str], Optional[str]]] = None,
) -> FixResult:
    """Apply the fixes of ``diagnostics`` (safe ones; unsafe ones too with ``unsafe=True``) to ``text``.

    Fixes whose edits overlap an already chosen fix are left for the next round (``failed`` is not used for
    them). ``parses(text)`` returns None when the text parses, else an error message; by default Python is
    parsed with libcst. When the combined result does not parse, fixes are applied one by one and each one that
    breaks parsing is reverted and reported in ``failed``.
    """
    if parses is None:
        parses = python_parse_error
    chosen: list[tuple[Diagnostic, list[tuple[int, int, str]]]] = []
    failed: list[tuple[Diagnostic, str]] = []
    taken: list[tuple[int, int]] = []
    for d in sorted((d for d in diagnostics if wanted(d, unsafe)), key=lambda d: d.sort_key()):
        spans = _spans(text, d)
        if spans is None:
            failed.append((d, f"{d.code}: the fix's edits are outside the file or overlap each other"))
            continue
        if any(_overlaps(a, b, x, y) for a, b, _ in spans for x, y in taken):
            continue  # applied on a later round, against the fixed text
        chosen.append((d, spans))
        taken.extend((a, b) for a, b, _ in spans)
    if not chosen:
        return FixResult(text, [], failed)
    new = _apply_spans(text, [s for _, spans in chosen for s in spans])
    if parses(new) is None:
        return FixResult(new, [d for d, _ in chosen], failed)
    # One by one, from the end backwards (earlier offsets stay valid); revert the ones that break parsing.
    applied = []
    cur = text
    for d, spans in sorted(chosen, key=lambda c: c[1][0][0], reverse=True):
        cand = _apply_spans(cur, spans)
        err = parses(cand)
        if err is None:
            cur = cand
            applied.append(d)
        else:
            failed.append((d, f"{d.code}: the fix was reverted because the result does not parse ({err})"))
    applied.sort(key=lambda d: d.sort_key())
    return FixResult(cur, applied, failed)


def _overlaps(a: int, b: int, x: int, y: int) -> bool:
    if a == b or x == y:  # insertions conflict only when strictly inside the other span or at the same point
        return (x < a < y) or (a < x < b) or (a == b == x == y)
    return a < y and x < b


def python_parse_error(text: str) -> Optional[str]:
    from bertlint.engine import parse_python

    r = parse_python(text)
    if isinstance(r, tuple):
        msg, row, col = r
        return f"{msg} at {row}:{col}"
    return None


def unified_diff(old: str, new: str, filename: str) -> str:
    import difflib

    return "".join(
        difflib.unified_diff(
            old.splitlines(keepends=True), new.splitlines(keepends=True), fromfile=filename, tofile=filename
        )
    )


def atomic_write(path: str, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary file in the same folder and an atomic rename; keeps the mode."""
    import tempfile

    d = os.path.dirname(os.path.abspath(path))
    try:
        mode = os.stat(path).st_mode & 0o7777
    except OSError:
        mode = None
    fd, tmp = tempfile.mkstemp(prefix=".bertlint-", suffix=".tmp", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --------------------------------------------------------------------------------------------- notebooks


def apply_notebook_fixes(text: str, diagnostics: list[Diagnostic], *, unsafe: bool = False) -> FixResult:
    """Fixes of a notebook: edits are cell-relative (``Diagnostic.cell``); applied to each cell's source and the
    notebook JSON written back (nbformat layout: indent 1, source as a list of lines)."""
    import json

    from bertlint.sources import cell_to_python, join_cells

    try:
        nb = json.loads(text)
        # cell numbers count every cell (as Jupyter shows them); fixes go to code cells only
        numbers = [i + 1 for i, c in enumerate(nb["cells"]) if isinstance(c, dict) and c.get("cell_type") == "code"]
        cells = [nb["cells"][n - 1] for n in numbers]
    except Exception:
        return FixResult(text, [], [(d, f"{d.code}: the notebook could not be read") for d in diagnostics if wanted(d, unsafe)])
    from bertlint.sources import _cell_lines

    position = {n: k for k, n in enumerate(numbers)}  # cell number -> index into ``cells``
    sources = ["".join(_cell_lines(c)) for c in cells]
    by_cell: dict[int, list[Diagnostic]] = {}
    failed: list[tuple[Diagnostic, str]] = []
    for d in diagnostics:
        if wanted(d, unsafe):
            if d.cell is None or d.cell not in position:
                failed.append((d, f"{d.code}: the fix is not inside one code cell"))
            else:
                by_cell.setdefault(position[d.cell], []).append(d)
    applied: list[Diagnostic] = []

    def joined_error(srcs: list[str]) -> Optional[str]:
        lines = [s.splitlines(keepends=True) for s in srcs]
        return python_parse_error(join_cells(lines, list(range(len(lines))), {}).source)

    for k, ds in sorted(by_cell.items()):
        n = k + 1  # index into ``sources`` + 1
        src = sources[n - 1]
        lines = src.splitlines(keepends=True)
        py = cell_to_python(lines)
        # an edit touching a neutralised magic line cannot be applied to the original text
        ok = []
        for d in ds:
            rows = {r for e in d.fix.edits for r in range(e.start.row, e.end.row + 1)}  # type: ignore[union-attr]
            if any(1 <= r <= len(lines) and py[r - 1] != lines[r - 1] for r in rows):
                failed.append((d, f"{d.code}: the fix touches an IPython magic line"))
            else:
                ok.append(d)

        def cell_parses(new_src: str, n=n) -> Optional[str]:
            trial = list(sources)
            trial[n - 1] = new_src
            return joined_error(trial)

        r = apply_fixes(src, ok, unsafe=unsafe, parses=cell_parses)
        sources[n - 1] = r.text
        applied.extend(r.applied)
        failed.extend(r.failed)
    if not applied:
        return FixResult(text, [], failed)
    for c, s in zip(cells, sources):
        c["source"] = s.splitlines(keepends=True)
    # keep the file's own layout: indentation, ASCII escapes, final newline (nbformat writes indent=1)
    import re

    m = re.search(r'\n([ \t]+)"', text)
    indent = len(m.group(1).expandtabs(8)) if m else 1
    ascii_only = text.isascii() and "\\u" in text
    out = json.dumps(nb, indent=indent, ensure_ascii=ascii_only)
    if text.endswith("\n"):
        out += "\n"
    return FixResult(out, sorted(applied, key=lambda d: d.sort_key()), failed)
