"""Node positions, exactly as libcst's ``PositionProvider`` computes them, ~4x cheaper.

libcst's provider tracks line and column for every token (a regular-expression split per token) and builds two
``CodePosition`` objects per node. Here the code generation only counts characters; offsets become lines and
columns when a rule asks for a node's range. Same semantics (syntactic positions, start/end hoisting), checked
node for node against libcst on the fixtures and on the transformers / accelerate / torch sources
(tests/test_sources.py). Any failure of this fast path falls back to libcst's provider.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from typing import Any, Optional

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodePosition, CodeRange

_NEWLINE = re.compile(r"\r\n?|\n")


class _Record:
    """``with state.record_syntactic_position(...)`` without a generator (a plain object is ~3x cheaper than
    ``contextlib.contextmanager``; it runs for about half of the nodes)."""

    __slots__ = ("state", "key", "start_node", "end_node", "start")

    def __init__(self, state: "_OffsetState", node: cst.CSTNode, start_node, end_node) -> None:
        self.state = state
        self.key = id(node)
        self.start_node = start_node
        self.end_node = end_node

    def __enter__(self) -> None:
        self.start = self.state.offset

    def __exit__(self, *exc: Any) -> None:
        state = self.state
        start, end = self.start, state.offset
        if self.start_node is not None:
            start = state.computed[id(self.start_node)][0]
        if self.end_node is not None:
            end = state.computed[id(self.end_node)][1]
        state.computed[self.key] = (start, end)


class _OffsetState(CodegenState):
    """Code generation that records (start, end) character offsets per node, keyed by ``id(node)`` (an int
    hash instead of ``CSTNode.__hash__``; ``Positions`` keeps the module, so every id stays its node's)."""

    def __init__(self, default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.offset = 0
        self.popped = ""
        self.stack: list[int] = []
        self.computed: dict[int, tuple[int, int]] = {}

    def add_indent_tokens(self) -> None:
        for t in self.indent_tokens:
            self.tokens.append(t)
            self.offset += len(t)

    def add_token(self, value: str) -> None:
        self.tokens.append(value)
        self.offset += len(value)

    def pop_trailing_newline(self) -> None:
        # the module drops its last newline from the text, but positions were counted with it
        if self.tokens:
            self.popped = self.tokens[-1]
        super().pop_trailing_newline()

    def before_codegen(self, node: cst.CSTNode) -> None:
        self.stack.append(self.offset)

    def after_codegen(self, node: cst.CSTNode) -> None:
        start = self.stack.pop()
        k = id(node)
        if k not in self.computed:  # a syntactic position recorded inside wins (as in libcst)
            self.computed[k] = (start, self.offset)

    def record_syntactic_position(  # type: ignore[override]
        self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None, end_node: Optional[cst.CSTNode] = None
    ) -> _Record:
        return _Record(self, node, start_node, end_node)


class Positions:
    """``positions[node]`` -> ``CodeRange`` (1-based lines, 0-based columns, as libcst's provider)."""

    def __init__(self, module: cst.Module) -> None:
        state = _OffsetState(module.default_indent, module.default_newline)
        module._codegen(state)
        code = "".join(state.tokens) + state.popped
        self._module = module  # keeps every node (and so its id) alive
        self._computed = state.computed
        self._starts = [0] + [m.end() for m in _NEWLINE.finditer(code)]

    def _pos(self, offset: int) -> CodePosition:
        i = bisect_right(self._starts, offset) - 1
        return CodePosition(i + 1, offset - self._starts[i])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        s, e = self._computed[id(node)]
        return CodeRange(self._pos(s), self._pos(e))

    def __contains__(self, node: object) -> bool:
        return id(node) in self._computed

    def __len__(self) -> int:
        return len(self._computed)

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        return self[node] if id(node) in self._computed else default


def positions_of(module: cst.Module):
    """Positions of every node of ``module`` (libcst's provider if the fast path fails)."""
    try:
        return Positions(module)
    except Exception:  # a libcst internals change: the slow, official provider
        from libcst.metadata import MetadataWrapper, PositionProvider

        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)


class StatementPositions:
    """``positions[node]`` as ``Positions`` gives it, computed for the top-level statement that holds ``node`` only.

    A finding needs the ranges of a few nodes; ``Positions`` generates the code of the whole module for them (a
    third of a parse on a 1,200-line script). Here the code of the one top-level statement holding the node is
    generated (its offsets counted as ``Positions`` counts them, from the statement's first character) and placed
    in the text by looking it up there: the module's code is the text it was parsed from (libcst keeps every
    character; the one loss seen, on fixtures/, the speed corpus and transformers' ``models/b*``, is whitespace
    after the last newline of a file, so the code is then a prefix of the text), so the statement's code occurs at
    its own offset, at the start of a line; when it occurs exactly once at the start of a line, that occurrence is
    it, and every offset inside is its offset in the module.
    Anything else (a statement whose code occurs twice, the last statement of a text without a final newline, a
    node outside the statements' tree: whitespace, the module itself, another module's node) is answered by the
    whole-module ``Positions``, so every answer is the one ``Positions`` gives."""

    def __init__(self, module: cst.Module, source: str, parent) -> None:
        self._module = module
        self._source = source
        self._parent = parent  # node -> parent node (``FileContext.index.parent``)
        self._body = {id(s): i for i, s in enumerate(module.body)}
        self._stmts: dict[int, Optional[dict]] = {}  # id(statement) -> its computed offsets, None: not placeable
        self._starts: Optional[list[int]] = None
        self._full = None

    def full(self):
        if self._full is None:
            self._full = positions_of(self._module)
        return self._full

    def _top(self, node) -> Optional[cst.CSTNode]:
        module, parent = self._module, self._parent
        n = node
        for _ in range(10000):
            p = parent(n)
            if p is module:
                return n if id(n) in self._body else None
            if p is None:
                return None
            n = p
        return None

    def _offsets(self, top) -> Optional[dict]:
        k = id(top)
        if k in self._stmts:
            return self._stmts[k]
        got = None
        module = self._module
        if self._body[k] != len(module.body) - 1 or module.has_trailing_newline:
            state = _OffsetState(module.default_indent, module.default_newline)
            top._codegen(state)
            code = "".join(state.tokens)
            src = self._source
            at = _line_start_occurrences(src, code)
            if at is not None:
                got = {n: (s + at, e + at) for n, (s, e) in state.computed.items()}
        self._stmts[k] = got
        return got

    def _pos(self, offset: int) -> CodePosition:
        if self._starts is None:
            self._starts = [0] + [m.end() for m in _NEWLINE.finditer(self._source)]
        i = bisect_right(self._starts, offset) - 1
        return CodePosition(i + 1, offset - self._starts[i])

    def _range(self, node) -> Optional[CodeRange]:
        if self._full is None:
            top = self._top(node)
            if top is not None:
                offs = self._offsets(top)
                if offs is not None:
                    se = offs.get(id(node))
                    if se is not None:
                        return CodeRange(self._pos(se[0]), self._pos(se[1]))
        return None

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        r = self._range(node)
        return r if r is not None else self.full()[node]

    def __contains__(self, node: object) -> bool:
        return self._range(node) is not None or node in self.full()

    def __len__(self) -> int:
        return len(self.full())

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        r = self._range(node)
        return r if r is not None else self.full().get(node, default)


def _line_start_occurrences(src: str, code: str) -> Optional[int]:
    """The offset of the one occurrence of ``code`` in ``src`` that starts a line; None if there is none or more."""
    if not code:
        return None
    found = None
    i = src.find(code)
    while i >= 0:
        if i == 0 or src[i - 1] == "\n" or (src[i - 1] == "\r" and src[i] != "\n"):
            if found is not None:
                return None
            found = i
        i = src.find(code, i + 1)
    return found
