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
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import libcst as cst
from libcst._nodes.internal import CodegenState
from libcst._position import CodePosition, CodeRange

_NEWLINE = re.compile(r"\r\n?|\n")


class _OffsetState(CodegenState):
    """Code generation that records (start, end) character offsets per node."""

    def __init__(self, default_indent: str, default_newline: str) -> None:
        super().__init__(default_indent=default_indent, default_newline=default_newline)
        self.offset = 0
        self.popped = ""
        self.stack: list[int] = []
        self.computed: dict[cst.CSTNode, tuple[int, int]] = {}

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
        if node not in self.computed:  # a syntactic position recorded inside wins (as in libcst)
            self.computed[node] = (start, self.offset)

    @contextmanager
    def record_syntactic_position(
        self, node: cst.CSTNode, *, start_node: Optional[cst.CSTNode] = None, end_node: Optional[cst.CSTNode] = None
    ) -> Iterator[None]:
        start = self.offset
        try:
            yield
        finally:
            end = self.offset
            if start_node is not None:
                start = self.computed[start_node][0]
            if end_node is not None:
                end = self.computed[end_node][1]
            self.computed[node] = (start, end)


class Positions:
    """``positions[node]`` -> ``CodeRange`` (1-based lines, 0-based columns, as libcst's provider)."""

    def __init__(self, module: cst.Module) -> None:
        state = _OffsetState(module.default_indent, module.default_newline)
        module._codegen(state)
        code = "".join(state.tokens) + state.popped
        self._computed = state.computed
        self._starts = [0] + [m.end() for m in _NEWLINE.finditer(code)]

    def _pos(self, offset: int) -> CodePosition:
        i = bisect_right(self._starts, offset) - 1
        return CodePosition(i + 1, offset - self._starts[i])

    def __getitem__(self, node: cst.CSTNode) -> CodeRange:
        s, e = self._computed[node]
        return CodeRange(self._pos(s), self._pos(e))

    def __contains__(self, node: object) -> bool:
        return node in self._computed

    def __len__(self) -> int:
        return len(self._computed)

    def get(self, node: cst.CSTNode, default: Any = None) -> Any:
        return self[node] if node in self._computed else default


def positions_of(module: cst.Module):
    """Positions of every node of ``module`` (libcst's provider if the fast path fails)."""
    try:
        return Positions(module)
    except Exception:  # a libcst internals change: the slow, official provider
        from libcst.metadata import MetadataWrapper, PositionProvider

        return MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
