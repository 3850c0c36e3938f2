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
        # key -> id(block) -> (block, code length of each of its statements): the indented blocks an edit went into
        self._inner: dict[str, dict[int, tuple]] = {}
        # key -> the last splice: what the new module shares with the one before (``Edit``); None after a full parse
        self.edits: dict[str, Optional["Edit"]] = {}

    def forget(self, key: str) -> None:
        self._docs.pop(key, None)
        self._inner.pop(key, None)
        self.edits.pop(key, None)

    def parse(self, key: str, text: str) -> Union[cst.Module, tuple]:
        from bertlint.engine import parse_python

        old = self._docs.get(key)
        self.last_reparsed = None
        if old is not None:
            if old[0] == text:
                return old[1]
            inner = self._inner.setdefault(key, {})
            try:
                got = _splice(old, text, inner)
            except Exception:  # a libcst internals change or an edge case: the full parse decides
                got = None
            if got is not None:
                module, header, lens, reparsed, edit = got
                self._put(key, (text, module, header, lens))
                self.last_reparsed = (reparsed, len(module.body))
                self.edits[key] = edit
                return module
        self._inner.pop(key, None)
        self.edits[key] = None
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
            gone = next(iter(self._docs))
            del self._docs[gone]
            self._inner.pop(gone, None)
            self.edits.pop(gone, None)


class Edit:
    """What a splice changed: the new module is the old one with the compound statements and indented blocks in
    ``replaced`` (old node -> new node: the statements and blocks an edit went into, outermost first, and their
    statement sequences) rebuilt around new statements, ``old_stmts`` (statements of the old module, top-level or
    inside those blocks) replaced by ``new_stmts``; every other node of the new module is the old module's object.
    Statements a fragment parsed again whose text did not change are the old objects (in neither list)."""

    __slots__ = ("old_module", "new_module", "replaced", "old_stmts", "new_stmts", "start", "old_end", "new_end")

    def __init__(self, old_module, new_module, replaced: dict, old_stmts: list, new_stmts: list, start: int,
                 old_end: int, new_end: int) -> None:
        self.old_module = old_module
        self.new_module = new_module
        self.replaced = replaced  # id(old) -> (old, new)
        self.old_stmts = old_stmts
        self.new_stmts = new_stmts
        self.start, self.old_end, self.new_end = start, old_end, new_end  # old text [start, old_end) became new
        # [start, new_end)


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


def _touched(starts: list, p: int, changed_end: int) -> tuple:
    """(first, last) index of the statements starting at ``starts`` that the change from ``p`` to ``changed_end``
    touches (an insertion at a boundary touches both neighbours)."""
    n = len(starts)
    a = 0
    while a + 1 < n and starts[a + 1] <= p:
        a += 1
    b = a
    last = max(changed_end - 1, p)
    while b + 1 < n and starts[b + 1] <= last:
        b += 1
    return a, b


def _splice(old: _State, new: str, inner: Optional[dict] = None):
    text, module, header, lens = old
    n = len(lens)
    if n == 0:
        return None
    if inner is None:
        inner = {}
    p = _common_prefix(text, new)
    s = _common_suffix(text, new, min(len(text), len(new)) - p)
    changed_end = len(text) - s  # old text [p, changed_end) became new [p, len(new) - s)
    new_changed_end = len(new) - s
    # statement offsets in the old text
    starts = []
    off = header
    for ln in lens:
        starts.append(off)
        off += ln
    body_end = off
    # the statements the change touches (an insertion at a boundary touches both neighbours: the padding)
    a, b = _touched(starts, p, changed_end)
    if a == b and a + 1 < n and p >= header and changed_end <= starts[a] + lens[a]:
        # inside one statement that has one after it: into its indented block when the edit lies there
        got = _nested(module, text, new, p, changed_end, new_changed_end, module.body[a], starts[a], lens[a], inner)
        if got is not None:
            stmt, replaced, old_stmts, new_stmts = got
            out = module.with_changes(body=[*module.body[:a], stmt, *module.body[a + 1 :]])
            replaced[id(module)] = (module, out)
            new_lens = list(lens)
            new_lens[a] += len(new) - len(text)
            return out, header, new_lens, 1, Edit(module, out, replaced, old_stmts, new_stmts, p, changed_end,
                                                  new_changed_end)
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
    new_header_len = sum(_code_len(module, line) for line in new_header) if from_start else header
    footer_len = sum(_code_len(module, line) for line in (part.footer if to_end else module.footer))
    mid = _fragment_lens(module, body, frag, part, lens[a : b + 1], new_header_len if from_start else 0,
                         footer_len if to_end else 0, [])
    if mid is None:
        return None
    body, old_stmts, new_stmts = _same_text(body, mid, module.body[a : b + 1], lens[a : b + 1],
                                            (new_header_len if from_start else frag_start), p, new_changed_end)
    changes = {"header": new_header, "body": [*module.body[:a], *body, *module.body[b + 1 :]]}
    if to_end:
        changes["footer"] = part.footer
        changes["has_trailing_newline"] = part.has_trailing_newline
    out = module.with_changes(**changes)
    new_lens = [*lens[:a], *mid, *lens[b + 1 :]]
    total = new_header_len + sum(new_lens) + footer_len
    if not out.has_trailing_newline and total and (out.footer or out.body):
        total -= len(out.default_newline)
    if total != len(new):
        return None
    replaced = {id(module): (module, out)}
    return out, new_header_len, new_lens, len(body), Edit(module, out, replaced, old_stmts, new_stmts, p,
                                                           changed_end, new_changed_end)


def _same_text(body: list, new_lens: list, old_body, old_lens: list, first: int, p: int, new_changed_end: int):
    """``body`` (statements a fragment parsed again, the first at offset ``first`` of the new text) with each
    statement whose text did not change (it lies in the part before the edit or after it, and is as long as the
    old statement in its place) replaced by the old statement object: the parse of a statement's text in the same
    place is that node. Returns (body, old statements replaced, their new statements)."""
    body = list(body)
    k, m = len(body), len(old_lens)
    lo = 0
    off = first
    while lo < k and lo < m and off + new_lens[lo] <= p and new_lens[lo] == old_lens[lo]:
        body[lo] = old_body[lo]
        off += new_lens[lo]
        lo += 1
    hi = 0  # statements kept from the end
    end = first + sum(new_lens)
    while hi < k - lo and hi < m - lo:
        i, j = k - 1 - hi, m - 1 - hi
        if end - new_lens[i] < new_changed_end or new_lens[i] != old_lens[j]:
            break
        body[i] = old_body[j]
        end -= new_lens[i]
        hi += 1
    return body, list(old_body[lo : m - hi]), body[lo : k - hi]


_DESCEND = (cst.FunctionDef, cst.ClassDef, cst.For, cst.While, cst.With, cst.If)


def _block_of(node) -> Optional[cst.IndentedBlock]:
    """The indented block of a compound statement with one block (no ``else`` / ``finally``), else None."""
    if type(node) not in _DESCEND or getattr(node, "orelse", None) is not None:
        return None
    body = node.body
    return body if type(body) is cst.IndentedBlock and body.body else None


def _code_len_in(module: cst.Module, node: cst.CSTNode, stack: list) -> int:
    """The code length of ``node`` printed inside indented blocks of ``stack`` (their indentations)."""
    state = CodegenState(default_indent=module.default_indent, default_newline=module.default_newline)
    state.indent_tokens = list(stack)
    node._codegen(state)
    return sum(len(t) for t in state.tokens)


def _inner_lens(module, block, stack: list, inner: dict) -> list:
    hit = inner.get(id(block))
    if hit is not None and hit[0] is block:
        return hit[1]
    lens = [_code_len_in(module, st, stack) for st in block.body]
    inner[id(block)] = (block, lens)
    return lens


def _nested(module, text: str, new: str, p: int, changed_end: int, new_changed_end: int, stmt, start: int,
            length: int, inner: dict):
    """An edit inside the indented block of ``stmt`` (at ``start`` in the old text, ``length`` long): the
    statements of the innermost block it lies in that it touches, padded by one unchanged statement on each side
    (as at the top level: so that the lines between two statements are placed by the same code in both parses),
    are parsed again, inside ``if 1:`` lines indented as the blocks around them (the same indentation context, so
    the same parse), and put into that block; the statements and blocks around it are rebuilt with it. Only a
    statement with one after it is gone into (what follows its block is then placed as before), and the
    innermost block must have a statement after the touched ones. None: not such an edit (the caller parses the
    top-level statements). Returns (new ``stmt``, replaced, old statements, new statements)."""
    delta = len(new) - len(text)
    levels = []  # (node, block, stack, starts, lens, a, b)
    node, node_start, node_len, stack = stmt, start, length, []
    while True:
        block = _block_of(node)
        if block is None:
            break
        bstack = [*stack, block.indent if block.indent is not None else module.default_indent]
        lens = _inner_lens(module, block, bstack, inner)
        footer = sum(_code_len_in(module, ln, bstack) for ln in block.footer)
        first = node_start + node_len - footer - sum(lens)
        if first <= node_start or p < first or changed_end > first + sum(lens):
            break  # the statement's first lines or its block's footer changed
        starts = []
        off = first
        for ln in lens:
            starts.append(off)
            off += ln
        n = len(lens)
        a, b = _touched(starts, p, changed_end)
        levels.append((node, block, bstack, starts, lens, a, b))
        if a != b or a + 1 >= n or p < _first_code_line_end(text, starts[a], starts[a] + lens[a]):
            break
        node, node_start, node_len, stack = block.body[a], starts[a], lens[a], bstack
    while levels:
        got = _reparse_in(module, text, new, p, changed_end, new_changed_end, levels[-1], delta)
        if got is not None:
            break
        levels.pop()
    else:
        return None
    new_body, new_lens, a, b, old_stmts, new_stmts = got
    replaced: dict = {}
    new_child = None
    for depth in range(len(levels) - 1, -1, -1):
        node, block, bstack, starts, lens, la, lb = levels[depth]
        if new_child is None:
            body = [*block.body[:a], *new_body, *block.body[b + 1 :]]
            blens = [*lens[:a], *new_lens, *lens[b + 1 :]]
        else:
            body = [*block.body[:la], new_child, *block.body[la + 1 :]]
            blens = list(lens)
            blens[la] += delta
        nb = block.with_changes(body=body)
        nn = node.with_changes(body=nb)
        replaced[id(node)] = (node, nn)
        replaced[id(block)] = (block, nb)
        replaced[id(block.body)] = (block.body, nb.body)
        inner.pop(id(block), None)
        inner[id(nb)] = (nb, blens)
        new_child = nn
    return new_child, replaced, old_stmts, new_stmts


def _reparse_in(module, text: str, new: str, p: int, changed_end: int, new_changed_end: int, level, delta: int):
    """The statements of one block an edit touches, parsed again: (new statements, their lengths, first and last
    old index replaced, old statements replaced, new ones), or None."""
    _node, block, bstack, starts, lens, a, b = level
    n = len(lens)
    if p < _first_code_line_end(text, starts[a], starts[a] + lens[a]) and a:
        a -= 1
    if b + 1 >= n:
        return None  # nothing after the touched statements in this block
    b += 1
    frag_start = starts[a]
    frag_end_old = starts[b] + lens[b]
    if p < frag_start or changed_end > frag_end_old:
        return None
    frag = new[frag_start : frag_end_old + delta]
    if not frag.endswith(module.default_newline):
        return None
    wrap = "".join("".join(bstack[:i]) + "if 1:" + module.default_newline for i in range(len(bstack)))
    try:
        part = _parse.parse_module(wrap + frag)
    except Exception:
        return None
    if part.default_indent != module.default_indent or part.default_newline != module.default_newline \
            or part.header or part.footer or len(part.body) != 1:
        return None
    node = part.body[0]
    for i in range(len(bstack)):
        blk = node.body
        if type(node) is not cst.If or type(blk) is not cst.IndentedBlock or blk.footer or node.orelse is not None:
            return None
        if i + 1 < len(bstack):
            if len(blk.body) != 1:
                return None
            node = blk.body[0]
    if blk.indent != block.indent:
        return None  # the edit changed the block's indentation (its first statement's)
    body = list(blk.body)
    if not body:
        return None
    mid = _fragment_lens(module, body, frag, None, lens[a : b + 1], 0, 0, bstack)
    if mid is None:
        return None
    body, old_stmts, new_stmts = _same_text(body, mid, block.body[a : b + 1], lens[a : b + 1], frag_start, p,
                                            new_changed_end)
    return body, mid, a, b, old_stmts, new_stmts


def _fragment_lens(out: cst.Module, body: list, frag: str, part, old_lens: list, head: int, foot: int,
                   stack: list):
    """The code length of each statement of ``body`` (the re-parsed fragment's, printed in ``out`` inside blocks
    indented by ``stack``). libcst prints a parsed module back as its text (``part.code == frag``), so the
    statements' lengths add up to the fragment's length less its header (``head``, when the header is the
    module's) and footer (``foot``, when it is the module's), plus the final newline the module does not print:
    every statement but the longest is printed to be measured (the printing, not the parse, was most of a
    keystroke's re-parse of a long function), and that one is what is left. The longest is the old one in the
    same place when the fragment has as many statements as it replaced; otherwise every statement is printed.
    None if what is left is not a length (``part`` None: a fragment inside a block, which ends with a newline)."""
    if len(body) != len(old_lens) or len(body) < 2:
        return [_code_len_in(out, st, stack) for st in body]
    skip = max(range(len(body)), key=old_lens.__getitem__)
    lens = [0 if i == skip else _code_len_in(out, st, stack) for i, st in enumerate(body)]
    total = len(frag) - head - foot
    if part is not None and not part.has_trailing_newline and (part.footer or part.body):
        total += len(part.default_newline)
    rest = total - sum(lens)
    if rest <= 0:
        return None
    lens[skip] = rest
    return lens
