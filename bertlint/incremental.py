"""Re-parse only the top-level statements an edit touched (the language server's didChange path).

The server keeps, per document, the last text, its libcst module and the length of the code of every
top-level statement. For a new text, the changed character range is the part between the longest common
prefix and suffix of the two texts; the top-level statements it overlaps, padded by one unchanged statement on
each side (on the left only when the edit may be in the first statement's leading lines or first line of code),
are parsed again on their own and spliced into the old module's body. Every other statement is the
old node (libcst nodes are immutable), so the new module is the one a full parse gives: the same code text,
statement for statement (``tests/test_incremental.py`` compares it with a full parse, ``deep_equals``, on
every single-character edit of several scripts).

The padding is what keeps the splice exact: blank and comment lines between two statements belong either to
the end of the one before (an indented block's trailing comments) or to the start of the next, depending on
the code around them; with an unchanged statement on each side of the re-parsed region, that code is the
same in both parses. Anything unusual falls back to a full parse: an edit in a file that does not parse, a
fragment that does not parse on its own (an unclosed bracket or string swallowing what follows), a fragment
whose detected indentation or newline differs from the file's, lengths that do not add up to the text.
"""

from __future__ import annotations

from typing import Optional, Union

import libcst as cst
from libcst._nodes.internal import CodegenState

from bertlint import _parse

# a document's state: (text, module, header length, statement lengths) or None when not usable incrementally
_State = tuple


def _common_prefix(a: str, b: str) -> int:
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # slice comparisons run in C: log2(n) of them
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _common_suffix(a: str, b: str, limit: int) -> int:
    lo, hi = 0, limit
    la, lb = len(a), len(b)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[la - mid :] == b[lb - mid :]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _code_len(module: cst.Module, node: cst.CSTNode) -> int:
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    node._codegen(state)
    return sum(len(t) for t in state.tokens)


def _lengths(module: cst.Module, text: str) -> Optional[tuple[int, list[int]]]:
    """(header length, [code length of each top-level statement]), checked against ``text``; None if the
    pieces do not add up (then the document is parsed in full every time)."""
    header = sum(_code_len(module, line) for line in module.header)
    lens = [_code_len(module, s) for s in module.body]
    footer = sum(_code_len(module, line) for line in module.footer)
    total = header + sum(lens) + footer
    if not module.has_trailing_newline and total and (module.footer or module.body):
        total -= len(module.default_newline)  # the module drops the last newline it would print
    if total != len(text):
        return None
    return header, lens


class Reparser:
    """``parse(key, text)``: the module of ``text``, re-using the unchanged top-level statements of the last
    text parsed under ``key``. Returns what ``engine.parse_python`` returns (a module, or the syntax error)."""

    def __init__(self, keep: int = 8) -> None:
        self._docs: dict[str, _State] = {}  # the most recently parsed last
        self.keep = keep  # documents kept (a module of a 1,200-line script holds a few hundred thousand objects)
        self.last_reparsed: Optional[tuple[int, int]] = None  # (statements re-parsed, of) for the last call

    def forget(self, key: str) -> None:
        self._docs.pop(key, None)

    def parse(self, key: str, text: str) -> Union[cst.Module, tuple]:
        from bertlint.engine import parse_python

        old = self._docs.get(key)
        self.last_reparsed = None
        if old is not None:
            if old[0] == text:
                return old[1]
            try:
                got = _splice(old, text)
            except Exception:  # a libcst internals change or an edge case: the full parse decides
                got = None
            if got is not None:
                module, header, lens, reparsed = got
                self._put(key, (text, module, header, lens))
                self.last_reparsed = (reparsed, len(module.body))
                return module
        module = parse_python(text)
        if isinstance(module, tuple):
            self._docs.pop(key, None)
            return module
        try:
            pieces = _lengths(module, text)
        except Exception:
            pieces = None
        if pieces is None:
            self._docs.pop(key, None)
        else:
            self._put(key, (text, module, pieces[0], pieces[1]))
        return module

    def _put(self, key: str, state: _State) -> None:
        self._docs.pop(key, None)
        self._docs[key] = state
        while len(self._docs) > self.keep:
            del self._docs[next(iter(self._docs))]


def _first_code_line_end(text: str, start: int, end: int) -> int:
    """The offset just past the first line of ``text[start:end]`` (a statement's code: its leading blank and
    comment lines, then its first line of code) that is not blank or a comment; ``end`` if none.

    An edit after that point leaves the statement's leading lines and first line as they were: which of the lines
    between the statement before and this one belong to that statement's block and which to this one is decided
    by those lines and the indentation of this first line, so the statement before needs no new parse."""
    i = start
    while i < end:
        j = text.find("\n", i, end)
        line_end = end if j < 0 else j + 1
        stripped = text[i:line_end].strip(" \t\f\r\n")
        if stripped and not stripped.startswith("#"):
            return line_end
        i = line_end
    return end


def _splice(old: _State, new: str):
    text, module, header, lens = old
    n = len(lens)
    if n == 0:
        return None
    p = _common_prefix(text, new)
    s = _common_suffix(text, new, min(len(text), len(new)) - p)
    changed_end = len(text) - s  # old text [p, changed_end) became new [p, len(new) - s)
    # statement offsets in the old text
    starts = []
    off = header
    for ln in lens:
        starts.append(off)
        off += ln
    body_end = off
    # the statements the change touches (an insertion at a boundary touches both neighbours: the padding)
    a = 0
    while a + 1 < n and starts[a + 1] <= p:
        a += 1
    b = a
    last = max(changed_end - 1, p)
    while b + 1 < n and starts[b + 1] <= last:
        b += 1
    if a == 0 or p < _first_code_line_end(text, starts[a], starts[a] + lens[a]):
        # the edit may be in the blank / comment lines before statement a (or its first line): they may move to
        # the block of the statement before, so that one is parsed again too
        a -= 1 if a else 0
    b = min(b + 1, n - 1)
    from_start = a == 0  # the header (comment lines at the top) is parsed again with the first statement
    to_end = b == n - 1
    frag_start = 0 if from_start else starts[a]
    if p < frag_start:
        return None
    if not to_end:
        frag_end_old = starts[b] + lens[b]
        if changed_end > frag_end_old:
            return None
        frag = new[frag_start : frag_end_old + (len(new) - len(text))]
    else:
        frag = new[frag_start:]
    if not frag:
        return None
    try:
        part = _parse.parse_module(frag)
    except Exception:
        return None
    if part.default_indent != module.default_indent or part.default_newline != module.default_newline:
        return None
    body = list(part.body)
    if not body:
        return None
    if not to_end and (part.footer or not part.has_trailing_newline):
        return None
    new_header = module.header
    if from_start:
        new_header = part.header
    elif part.header:
        body[0] = body[0].with_changes(leading_lines=[*part.header, *body[0].leading_lines])
    changes = {"header": new_header, "body": [*module.body[:a], *body, *module.body[b + 1 :]]}
    if to_end:
        changes["footer"] = part.footer
        changes["has_trailing_newline"] = part.has_trailing_newline
    out = module.with_changes(**changes)
    new_header_len = sum(_code_len(out, line) for line in out.header) if from_start else header
    footer_len = sum(_code_len(out, line) for line in out.footer)
    mid = _fragment_lens(out, body, frag, part, lens[a : b + 1], new_header_len if from_start else 0,
                         footer_len if to_end else 0)
    if mid is None:
        return None
    new_lens = [*lens[:a], *mid, *lens[b + 1 :]]
    total = new_header_len + sum(new_lens) + footer_len
    if not out.has_trailing_newline and total and (out.footer or out.body):
        total -= len(out.default_newline)
    if total != len(new):
        return None
    return out, new_header_len, new_lens, len(body)


def _fragment_lens(out: cst.Module, body: list, frag: str, part: cst.Module, old_lens: list, head: int, foot: int):
    """The code length of each statement of ``body`` (the re-parsed fragment's, in ``out``). libcst prints a parsed
    module back as its text (``part.code == frag``), so the statements' lengths add up to the fragment's length less
    its header (``head``, when the header is the module's) and footer (``foot``, when it is the module's), plus the
    final newline the module does not print: every statement but the longest is printed to be measured (the
    printing, not the parse, was most of a keystroke's re-parse of a long function), and that one is what is left.
    The longest is the old one in the same place when the fragment has as many statements as it replaced; otherwise
    every statement is printed. None if what is left is not a length."""
    if len(body) != len(old_lens) or len(body) < 2:
        return [_code_len(out, st) for st in body]
    skip = max(range(len(body)), key=old_lens.__getitem__)
    lens = [0 if i == skip else _code_len(out, st) for i, st in enumerate(body)]
    total = len(frag) - head - foot
    if not part.has_trailing_newline and (part.footer or part.body):
        total += len(part.default_newline)
    rest = total - sum(lens)
    if rest <= 0:
        return None
    lens[skip] = rest
    return lens
