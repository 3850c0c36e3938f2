"""Per-file context handed to every rule: the parsed module, settings, lazily built shared analyses,
positions, and ``report``. Analyses are ``cached_property``: built at most once per file, and only when
a rule asks for them."""

from __future__ import annotations

import re
from functools import cached_property
from typing import Any, Optional

import libcst as cst
from libcst.metadata import MetadataWrapper, PositionProvider

from bertlint.types import Applicability, Diagnostic, Edit, Fix, Position, RuleMeta, Severity

_DEFERRED_ROW = re.compile("\x00row:([0-9]+)\x00")


class FileContext:
    def __init__(self, filename: str, source: str, module: cst.Module, settings: Any) -> None:
        self.filename = filename
        self.source = source
        self.module = module
        self.settings = settings
        self.diagnostics: list[Diagnostic] = []
        self.current: Optional[RuleMeta] = None
        self._lines: Optional[list[str]] = None

    # ---- shared analyses (import lazily: a rule that needs none costs nothing)
    @cached_property
    def symbols(self):
        from bertlint.analysis import symbols

        from bertlint import stmtcache

        self.index  # one walk of the tree first: the later walks read its children lists
        return symbols.build(self.module, stmtcache.for_context(self.filename, self.source), self.filename)

    @cached_property
    def resolver(self):
        from bertlint.analysis.symbols import Resolver

        return Resolver(self.symbols)

    @cached_property
    def roles(self):
        """Who is the optimizer / scheduler / model ... from usage, with evidence (``bertlint/analysis/roles.py``)."""
        from bertlint.analysis import roles

        return roles.build(self)

    @cached_property
    def versions(self):
        """Target versions (transformers, accelerate, deepspeed, torch, lightning, peft), each with ``.source``."""
        from bertlint.analysis import versions

        return versions.resolve(self.filename, self.settings)

    @cached_property
    def setup(self):
        """The resolved HF Trainer training set-ups of this file (``bertlint.analysis.setup.FileSetup``)."""
        from bertlint.analysis import setup

        return setup.build(self)

    @cached_property
    def loops(self):
        """Training-loop model (``bertlint/analysis/loops.py``): iterate for the loops; file-level facts too."""
        from bertlint.analysis import loops

        return loops.build(self)

    @cached_property
    def evalflow(self):
        """Grad mode, model forwards, backward reachability and loop data flow (``bertlint/analysis/evalflow.py``)."""
        from bertlint.analysis import evalflow

        from bertlint import stmtcache

        index = self.index
        tables, index.flow_tables = index.flow_tables, None  # made by the index's walk (taken once)
        reuse = stmtcache.for_context(self.filename, self.source)
        flow = evalflow.EvalFlow(self.module, self.symbols, self.filename, reuse, tables)
        flow.roles_getter = lambda: self.roles  # asked lazily (a model class whose base is in a sibling module)
        return flow

    @cached_property
    def index(self) -> "NodeIndex":
        """One fast walk of the whole tree (plain field access, no visitor dispatch, whitespace skipped: ~5-10x
        cheaper than a ``CSTVisitor`` pass): ``ctx.index.of(cst.Call)`` lists every Call, ``ctx.index.parent(n)``."""
        from bertlint import stmtcache

        return NodeIndex(self.module, stmtcache.for_context(self.filename, self.source), self.filename)

    @cached_property
    def positions(self):
        # libcst's PositionProvider semantics, ~4x cheaper (bertlint/positions.py; falls back to libcst's)
        from bertlint.positions import StatementPositions, positions_of

        if self.source.startswith("\ufeff"):  # the module's code may not be the text, character for character
            return positions_of(self.module)
        # only the top-level statements holding the nodes asked for (a finding's few nodes)
        return StatementPositions(self.module, self.source, self.index.parent)

    @property
    def lines(self) -> list[str]:
        if self._lines is None:
            self._lines = self.source.splitlines(keepends=True)
        return self._lines

    # ---- positions
    def span(self, node: cst.CSTNode) -> tuple[Position, Position]:
        r = self.positions[node]
        return Position(r.start.line, r.start.column + 1), Position(r.end.line, r.end.column + 1)

    def deferred_row(self, node: cst.CSTNode) -> str:
        """The 1-based line of ``node`` for a message text, as a placeholder resolved when a diagnostic is made
        (``_emit``): positions cost a code generation of the whole module, and a reason computed for a rule's
        decision (``configfiles.deepspeed_enabled_for``) is shown only if there is a finding."""
        rows = self.__dict__.setdefault("_deferred_rows", {})
        rows[id(node)] = node
        return f"\x00row:{id(node)}\x00"

    def resolve_rows(self, text: str) -> str:
        """``text`` with every ``deferred_row`` placeholder replaced by the line number ("?" if unknown)."""
        if "\x00row:" not in text:
            return text
        rows = self.__dict__.get("_deferred_rows", {})

        def row(m) -> str:
            node = rows.get(int(m.group(1)))
            try:
                return str(self.span(node)[0].row) if node is not None else "?"
            except Exception:
                return "?"

        return _DEFERRED_ROW.sub(row, text)

    def indent_of(self, node: cst.CSTNode) -> str:
        start, _ = self.span(node)
        line = self.lines[start.row - 1] if start.row - 1 < len(self.lines) else ""
        return line[: len(line) - len(line.lstrip(" \t"))]

    # ---- fixes
    def edit_replace(self, node: cst.CSTNode, content: str) -> Edit:
        start, end = self.span(node)
        return Edit(content, start, end)

    def edit_insert_line_before(self, stmt: cst.CSTNode, text: str) -> Edit:
        """Insert ``text`` as a new line above the statement ``stmt``, with the statement's indentation."""
        start, _ = self.span(stmt)
        indent = self.indent_of(stmt)
        pos = Position(start.row, 1)
        return Edit(f"{indent}{text}\n", pos, pos)

    def edit_insert_line_after(self, stmt: cst.CSTNode, text: str) -> Edit:
        _, end = self.span(stmt)
        indent = self.indent_of(stmt)
        pos = Position(end.row + 1, 1)
        return Edit(f"{indent}{text}\n", pos, pos)

    def fix(self, message: str, edits: list[Edit], applicability: Applicability = Applicability.SAFE) -> Fix:
        return Fix(message, Applicability(applicability), tuple(edits))

    # ---- reporting
    def report(
        self,
        node: cst.CSTNode,
        message: str,
        *,
        fix: Optional[Fix] = None,
        severity: Optional[Severity] = None,
        data: Optional[dict] = None,
        code: Optional[str] = None,
    ) -> Diagnostic:
        sites = self.__dict__.get("foreign_sites")
        hit = sites.get(id(node)) if sites else None
        if hit is not None and hit[0] is node:
            # a node of a sibling module the dry run inlined (bertlint/analysis/project.py): anchored at the call
            # of this file that leads there, the message names the other file and line
            from bertlint.analysis.project import where as _where

            where = _where(node, hit[2])
            node = hit[1]
            if where and where not in message:
                message = f"{message.rstrip()} (in {where}, reached from the call on this line)"
            fix = None
        start, end = self.span(node)
        return _emit(self, start, end, message, fix, severity, data, code)


def _emit(ctx, start: Position, end: Position, message: str, fix, severity, data, code) -> Diagnostic:
    """Build the diagnostic of the running rule (or of ``code``, a sibling code the rule reports) and record it."""
    meta = ctx.current
    assert meta is not None, "report() called outside a rule"
    if "_deferred_rows" in ctx.__dict__:  # line numbers in the texts, now that they are shown
        message = ctx.resolve_rows(message)
        if fix is not None and "\x00row:" in fix.message:
            fix = Fix(ctx.resolve_rows(fix.message), fix.applicability, fix.edits)
        if data:
            data = {k: ctx.resolve_rows(v) if type(v) is str else v for k, v in data.items()}
    if code is not None and code != meta.code:
        from bertlint.registry import get

        other = get(code)
        meta = other.meta if other else meta
    d = Diagnostic(
        code=meta.code,
        name=meta.name,
        severity=Severity(severity) if severity else meta.severity,
        message=message,
        filename=ctx.filename,
        start=start,
        end=end,
        fix=fix,
        data=dict(data or {}),
    )
    ctx.diagnostics.append(d)
    return d


class ConfigContext:
    """Context handed to config-file rules (``targets=("config",)``): a parsed DeepSpeed / accelerate JSON or
    YAML file. ``data`` is the parsed object; ``kind`` is "deepspeed" | "accelerate" | "unknown" (from keys)."""

    def __init__(self, filename: str, source: str, data: Any, settings: Any, fmt: str = "json") -> None:
        self.filename = filename
        self.source = source
        self.data = data
        self.settings = settings
        self.format = fmt  # "json" | "yaml"
        self.diagnostics: list[Diagnostic] = []
        self.current: Optional[RuleMeta] = None
        self._positions: Optional[dict] = None

    @cached_property
    def kind(self) -> str:
        from bertlint.sources import config_kind

        return config_kind(self.data)

    @cached_property
    def lines(self) -> list[str]:
        return self.source.splitlines(keepends=True)

    def key_position(self, path: tuple) -> Position:
        """Best-effort position of the key ``path`` (e.g. ("zero_optimization", "stage")); falls back to the
        deepest enclosing key found, then to 1:1."""
        if self._positions is None:
            from bertlint.sources import key_positions

            self._positions = key_positions(self.source, self.format)
        path = tuple(path)
        while path:
            if path in self._positions:
                row, col = self._positions[path]
                return Position(row, col)
            path = path[:-1]
        return Position(1, 1)

    def report_at(
        self,
        row: int,
        col: int,
        message: str,
        *,
        end: Optional[Position] = None,
        fix: Optional[Fix] = None,
        severity: Optional[Severity] = None,
        data: Optional[dict] = None,
        code: Optional[str] = None,
    ) -> Diagnostic:
        start = Position(max(int(row), 1), max(int(col), 1))
        if end is None:
            line = self.lines[start.row - 1] if start.row - 1 < len(self.lines) else ""
            end = Position(start.row, max(len(line.rstrip("\r\n")) + 1, start.column))
        return _emit(self, start, end, message, fix, severity, data, code)

    def report_key(self, path: tuple, message: str, **kw: Any) -> Diagnostic:
        """``report_at`` the position of the key ``path``."""
        p = self.key_position(path)
        return self.report_at(p.row, p.column, message, **kw)


class NodeIndex:
    """Every semantic node of a module by type, plus parents, from one iterative walk (``FileContext.index``;
    ~5x cheaper than one ``CSTVisitor`` pass). Whitespace, comments and punctuation nodes are not indexed.

    ``of(*types)`` returns the nodes in source pre-order (``bertlint.analysis.walk.children``);
    ``parent(node)`` / ``ancestors(node)``."""

    def __init__(self, module: cst.CSTNode, reuse=None, filename: str = "") -> None:
        """``reuse``: the language server's ``bertlint.stmtcache.StatementCache``: the pieces of the top-level
        statements the last lint of ``filename`` had are taken from there (same tables, merged in order)."""
        from bertlint.analysis import walk

        self.flow_tables = None  # the evaluation flow's walk tables, made by the same walk (``FileContext.evalflow``)
        if reuse is not None and type(module) is cst.Module:
            by_type, parents, kids_of = _merged(module, reuse.pieces("index", filename, module.body, _walk_from))
        else:
            from bertlint.analysis.evalflow import walk_with_index

            by_type, parents, kids_of, self.flow_tables = walk_with_index(module)
        self._by_type = by_type
        self._parents = parents
        # every later walk of this module (symbols, evaluation flow, rules) reads these children lists
        walk.cache_children(module, kids_of)
        t = self.flow_tables
        if t is not None:  # ``walk.scope_calls`` from the walk's numbers
            walk.cache_calls(module, t.order.d, t.end.d, t.calls, parents)
            walk.cache_tables(module, t.order.d, t.end.d, by_type)

    def of(self, *types: type) -> list:
        if len(types) == 1 and types[0] in self._by_type:
            return list(self._by_type[types[0]])
        out = []
        for t, nodes in self._by_type.items():
            if issubclass(t, types):
                out.extend(nodes)
        return out

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self._parents.get(id(node))

    def ancestors(self, node: cst.CSTNode):
        p = self._parents.get(id(node))
        while p is not None:
            yield p
            p = self._parents.get(id(p))


def _walk_from(root: cst.CSTNode) -> tuple[dict, dict, dict]:
    """(nodes by type in pre-order, ``id(node)`` -> parent, ``id(node)`` -> children) of ``root``'s subtree; the
    parent of ``root`` itself is not in it."""
    from bertlint.analysis import walk

    children = walk._children
    by_type: dict[type, list[cst.CSTNode]] = {}
    parents: dict[int, cst.CSTNode] = {}
    kids_of: dict[int, list] = {}
    stack: list[cst.CSTNode] = [root]
    while stack:
        n = stack.pop()
        by_type.setdefault(type(n), []).append(n)
        kids = children(n)
        kids_of[id(n)] = kids
        for k in kids:
            parents[id(k)] = n
        stack.extend(reversed(kids))
    return by_type, parents, kids_of


def _merged(module: cst.Module, pieces: list) -> tuple[dict, dict, dict]:
    """The tables of one walk of ``module`` from those of its top-level statements (in order): the module first,
    then each statement's pre-order, so every by-type list, and the order types first appear in, is the walk's."""
    from bertlint.analysis import walk

    kids = walk._children(module)
    if len(kids) != len(pieces) or any(a is not b for a, b in zip(kids, module.body)):
        return _walk_from(module)  # the module's children are not its statements (never, with libcst's Module)
    by_type: dict[type, list[cst.CSTNode]] = {type(module): [module]}
    parents: dict[int, cst.CSTNode] = {}
    kids_of: dict[int, list] = {id(module): kids}
    for st, (bt, par, ko) in zip(kids, pieces):
        for tp, nodes in bt.items():
            have = by_type.get(tp)
            if have is None:
                by_type[tp] = list(nodes)
            else:
                have.extend(nodes)
        parents[id(st)] = module
        parents.update(par)
        kids_of.update(ko)
    return by_type, parents, kids_of
