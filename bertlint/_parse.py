"""``parse_module``: libcst's parse without the per-node validation.

libcst checks every node it constructs (``CSTNode.__post_init__`` calls ``_validate``: a parenthesis that opens and
closes, a keyword's whitespace ...). That protects trees built by hand; a tree the native parser builds from source
text is valid by construction, and checking its few hundred thousand nodes again was 15-20 % of the parse (libcst's
own comment on ``__post_init__`` says the same: "It might make more sense to move validation work into the
visitor, which would allow us to avoid validating the tree when parsing a file"). While ``parse_module`` runs, the
check is a no-op; it is restored afterwards, always to libcst's own function (another thread's parse that overlaps
cannot leave the no-op in place), and a node built by hand is checked as before (unless another thread is
parsing at that moment: then it is not checked, which changes nothing for a valid node). ``_validate`` has no
side effect (it only raises), so the trees are the same objects with the same fields either way
(tests/test_parse.py).
"""

from __future__ import annotations

import threading

import libcst as cst
from libcst._nodes.base import CSTNode

_VALIDATE = CSTNode.__dict__["__post_init__"]
_lock = threading.Lock()
_active = 0


def _no_validation(self) -> None:
    return None


def parse_module(source: str) -> cst.Module:
    """``libcst.parse_module(source)`` (same tree, same errors) without validating each parsed node."""
    global _active
    with _lock:
        _active += 1
        CSTNode.__post_init__ = _no_validation
    try:
        return cst.parse_module(source)
    finally:
        with _lock:
            _active -= 1
            if not _active:
                CSTNode.__post_init__ = _VALIDATE
