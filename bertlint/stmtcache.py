"""Reuse, between two lints of one document, what was computed from a top-level statement that did not change
(the language server's didChange path).

The server's incremental parse (``bertlint/incremental.py``) gives the new module with every top-level statement
an edit did not touch as the very node object of the last module (libcst nodes are immutable). A table that is
a function of one statement's subtree only is then the table computed last time for that object: the cache
keeps, per file, ``id(statement) -> (statement, table)`` for the statements of the last module linted (holding
the statement keeps its id from being reused), and after each lint only the current module's statements.

What is cached here is structural only, never a conclusion: the ``NodeIndex`` pieces (nodes by type in source
pre-order, parents, children lists) and the evaluation flow's walk tables (pre-order numbers counted from the
statement, parents, scopes, calls / loops / assignments / names by scope) of each statement, merged in statement
order into the tables one walk of the whole module gives (same lists in the same order, same numbers;
``tests/test_lsp_reuse.py`` compares them, and the diagnostics after edit sequences with a fresh lint). Every
analysis and rule still runs on the whole module.

Active only while the server lints (``using``): the command line, the API and the verifier never see it.
"""

from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Optional

_local = threading.local()


class StatementCache:
    def __init__(self, keep: int = 8) -> None:
        self.keep = keep  # files kept (the most recently linted last)
        # filename -> kind of table -> id(statement) -> (statement, table)
        self._files: dict[str, dict[str, dict[int, tuple[Any, Any]]]] = {}
        self.last_reused: dict[str, tuple[int, int]] = {}  # kind -> (statements reused, of) in the last build

    def forget(self, filename: str) -> None:
        self._files.pop(filename, None)

    def pieces(self, kind: str, filename: str, body, build) -> list:
        """``build(stmt)`` for each statement of ``body``, taken from the last lint of ``filename`` where the
        statement is the same object; afterwards only ``body``'s statements are kept (for this ``kind``)."""
        kinds = self._files.pop(filename, None) or {}
        self._files[filename] = kinds  # the most recent last
        while len(self._files) > self.keep:
            del self._files[next(iter(self._files))]
        old = kinds.get(kind) or {}
        new: dict[int, tuple[Any, Any]] = {}
        out = []
        reused = 0
        for st in body:
            hit = old.get(id(st))
            if hit is not None and hit[0] is st:
                piece = hit[1]
                reused += 1
            else:
                piece = build(st)
            new[id(st)] = (st, piece)
            out.append(piece)
        kinds[kind] = new
        self.last_reused[kind] = (reused, len(out))
        return out


def for_context(filename: str, source: str) -> Optional[StatementCache]:
    """The cache of the lint running on this thread under ``using``, if the context (``filename``, ``source``) is
    that lint's file: the very text object given to ``using`` (a sibling module the dry run reads, or a text the
    engine rewrote, never uses it)."""
    active = getattr(_local, "active", None)
    if active is None or active[1] != filename or active[2] is not source:
        return None
    return active[0]


@contextmanager
def using(cache: StatementCache, filename: str, text: str):
    """Let the lint of ``text`` as ``filename`` on this thread reuse ``cache``."""
    prev = getattr(_local, "active", None)
    _local.active = (cache, filename, text)
    try:
        yield cache
    finally:
        _local.active = prev
