"""Reuse the last lint's dry run of a document when an edit changed nothing it could have read (the language
server's didChange path; ``bertlint/analysis/dryrun.py`` asks ``reuse`` before running the loops).

The incremental parse (``bertlint/incremental.py``) says what an edit changed: an ``Edit`` lists the compound
statements and blocks rebuilt around it (old node -> new node) and the statements replaced; every other node of
the new module is the old module's object. The dry run of the last lint is taken again, its traces' nodes moved
to the new module (the rebuilt statements and blocks, and the replaced statements node for node), when

- the settings, the file name and the project's sibling modules (none: a file that imports a module of its
  project re-runs every time) are as they were, and what the run asked of the launcher configs beside the
  script (DeepSpeed under accelerate) has the same answer now;
- every statement the edit replaced is a simple statement line (assignments, expression statements, ``pass``:
  no ``return`` / ``break`` / ``yield`` / ``lambda`` / walrus, no compound statement added, changed or removed),
  the old and the new statements are as many and of the same shape (the same nodes in the same order, the same
  names and attributes: literals' values and the layout alone differ), so that a run that executed one executes
  the other the same way, binding the same names;
- every name in the replaced statements (old and new, their strings' and comments' words included) occurs
  nowhere else in the file: nothing else refers to what they bind or use, so no look-up of the run (symbol
  tables, roles from usage, argparse / config values, the functions it inlines) can find them; and none is a
  word bertlint's analyses look for in names or text (an identifier-like string of theirs, a regular expression
  of theirs that matches it, a substring they test for); the same for the words of the changed lines (an edit of
  comments or of the module's header comments changes no statement);
- the training loops and the scripted steps found now are the ones of the last lint (the same nodes).

Anything else runs the dry run again (unknown stays unknown). ``tests/test_lsp_reuse.py`` checks, over edit
sequences, that every lint equals a fresh one and that the reuse happened where it may.
"""

from __future__ import annotations

import ast
import os
import re
import threading
from contextlib import contextmanager
from fractions import Fraction
from typing import Any, Optional

import libcst as cst

_local = threading.local()
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TRIVIA = (cst.SimpleWhitespace, cst.ParenthesizedWhitespace, cst.TrailingWhitespace, cst.EmptyLine, cst.Comment,
           cst.Newline)
_SMALL_OK = (cst.Assign, cst.AnnAssign, cst.Expr, cst.Pass)
_NOT_OK = (cst.Lambda, cst.Yield, cst.Await, cst.NamedExpr)
_LITERALS = (cst.SimpleString, cst.Integer, cst.Float, cst.Imaginary, cst.FormattedStringText)


class Memo:
    """The dry runs of the last lint of each open file (the language server keeps one)."""

    def __init__(self, keep: int = 8) -> None:
        self.keep = keep
        self._files: dict[str, dict] = {}
        self.last: Optional[str] = None  # "reused" or why not, for the last lint (tests, the benchmark)

    def forget(self, filename: str) -> None:
        self._files.pop(filename, None)

    def put(self, filename: str, entry: dict) -> None:
        self._files.pop(filename, None)
        self._files[filename] = entry
        while len(self._files) > self.keep:
            del self._files[next(iter(self._files))]


@contextmanager
def using(memo: Memo, reparser, filename: str, text: str):
    """Let the lint of ``text`` as ``filename`` on this thread reuse the dry runs of ``memo``."""
    prev = getattr(_local, "active", None)
    _local.active = (memo, reparser, filename, text)
    try:
        yield memo
    finally:
        _local.active = prev


def _active(ctx):
    active = getattr(_local, "active", None)
    if active is None or active[2] != ctx.filename or active[3] is not ctx.source:
        return None
    return active


# ------------------------------------------------------------------------------------------------ vocabulary

_VOCAB: Optional[tuple] = None
_PROBES = ("qzjxwk", "Qzjxwk_9", "q", "_")


def _vocabulary() -> tuple:
    """(identifier-like strings, regular expressions, substrings) of bertlint's analyses: what they can look for
    in a name or a text. Read once from their source (``bertlint/analysis``, ``trace.py``, ``context.py``)."""
    global _VOCAB
    if _VOCAB is not None:
        return _VOCAB
    here = os.path.dirname(os.path.abspath(__file__))
    files = [os.path.join(here, "trace.py"), os.path.join(here, "context.py")]
    adir = os.path.join(here, "analysis")
    files += [os.path.join(adir, f) for f in sorted(os.listdir(adir)) if f.endswith(".py")]
    exact: set = set()
    subs: set = set()
    rxs: list = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                v = node.value
                if re.fullmatch(r"[\w.]+", v):
                    exact.update(w.lower() for w in v.split(".") if w)
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                    isinstance(node.left.value, str) and any(isinstance(o, (ast.In, ast.NotIn)) for o in node.ops):
                subs.add(node.left.value.lower())
            elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                attr = node.func.attr
                consts = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
                for a in node.args:
                    if isinstance(a, ast.Tuple):
                        consts += [e.value for e in a.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if attr in ("startswith", "endswith", "find", "index", "count", "rfind"):
                    subs.update(c.lower() for c in consts)
                elif isinstance(node.func.value, ast.Name) and node.func.value.id == "re" and consts:
                    try:
                        rx = re.compile(consts[0], re.I)
                    except re.error:
                        continue
                    if not any(rx.search(p) for p in _PROBES):
                        rxs.append(rx)  # (one that matches any word splits text into words: not a test of one)
    subs.discard("")
    # a test for the character ``_`` itself (``name.endswith("_")``: an in-place tensor method such as ``add_``,
    # ``dryrun._inert_body``) reads the identifiers of calls, which the shape check compares one by one (``_key``: an
    # edit that changes one is never reused); as a substring it would match every snake_case word of every edit
    subs.discard("_")
    _VOCAB = (frozenset(exact), tuple(rxs), tuple(sorted(subs)))
    return _VOCAB


def _known_word(word: str, text_only: bool = False) -> bool:
    """Is ``word`` one the analyses look for: in a name or string of the code, or (``text_only``: a word of a
    comment, which only a search of the source text sees) in the text?"""
    exact, rxs, subs = _vocabulary()
    low = word.lower()
    if (not text_only and low in exact) or any(s in low for s in subs):
        return True
    return any(rx.search(word) for rx in rxs)


# ------------------------------------------------------------------------------------------------ checks


def _shape(stmt) -> Optional[list]:
    """The statement's nodes in pre-order without the layout ones, or None if it is not a statement line of
    plain assignments / expressions."""
    if type(stmt) is not cst.SimpleStatementLine:
        return None
    if not all(isinstance(s, _SMALL_OK) for s in stmt.body):
        return None
    out: list = []
    stack = [stmt]
    while stack:
        n = stack.pop()
        if isinstance(n, _TRIVIA):
            continue
        if isinstance(n, _NOT_OK):
            return None
        out.append(n)
        stack.extend(reversed(n.children))
    return out


def _key(n) -> tuple:
    """What two nodes of the same shape must share: the type, and the identifier of a name or attribute (only
    literals' values may differ)."""
    tp = type(n)
    if tp is cst.Name:
        return (tp, n.value)
    return (tp,)


def _words_elsewhere(words: set, source: str, own: str) -> bool:
    """Does one of ``words`` occur in ``source`` more often than in ``own`` (the replaced statements' code)?"""
    for w in words:
        rx = re.compile(r"(?<![A-Za-z0-9_])" + re.escape(w) + r"(?![A-Za-z0-9_])")
        if len(rx.findall(source)) != len(rx.findall(own)):
            return True
    return False


def _changed_lines(text: str, start: int, end: int) -> str:
    """The lines holding ``text[start:end]`` ("" when empty: the words an edit removed are in the other text's)."""
    if end <= start:
        return ""
    a = text.rfind("\n", 0, start) + 1
    b = text.find("\n", end - 1)
    return text[a : len(text) if b < 0 else b]


def _why_not(ctx, entry: dict, edit) -> tuple[Optional[str], dict]:
    """(None, node map) when the last dry run holds for ``ctx`` (see the module's docstring), else (why, {})."""
    if entry.get("settings") != getattr(ctx, "settings", None):
        return "settings", {}
    mapping = {k: v for k, v in edit.replaced.items()}
    old_src, new_src = entry["source"], ctx.source
    if len(edit.old_stmts) != len(edit.new_stmts):
        return "statements added or removed", {}
    old_code = "".join(edit.old_module.code_for_node(s) for s in edit.old_stmts)
    new_code = "".join(edit.new_module.code_for_node(s) for s in edit.new_stmts)
    for o, n in zip(edit.old_stmts, edit.new_stmts):
        so, sn = _shape(o), _shape(n)
        if so is None or sn is None or len(so) != len(sn):
            return "a statement that is not a plain assignment or expression, or of another shape", {}
        for x, y in zip(so, sn):
            if _key(x) != _key(y):
                return "a statement of another shape", {}
            mapping[id(x)] = (x, y)
    words = set(_WORD.findall(old_code)) | set(_WORD.findall(new_code))
    if _words_elsewhere(words, old_src, old_code) or _words_elsewhere(words, new_src, new_code):
        return "a name the rest of the file uses", {}
    if any(_known_word(w) for w in words):
        return "a word the analyses look for", {}
    # the changed lines outside those statements: comments (the module's header), seen only by text searches
    lines = set(_WORD.findall(_changed_lines(old_src, edit.start, edit.old_end)))
    lines |= set(_WORD.findall(_changed_lines(new_src, edit.start, edit.new_end)))
    if any(_known_word(w, text_only=True) for w in lines - words):
        return "a word the analyses look for in the text", {}
    return None, mapping


class _No(Exception):
    pass


_PLAIN = frozenset({str, int, float, bool, type(None), Fraction})
_NODE_TYPES: set = set()  # CSTNode subclasses seen (an exact-type test: isinstance through ABCMeta is slow)
_FIELDS: dict = {}  # type -> (its slot names, whether it is a trace / dry-run type the remap may move)
_KNOWN_MODULES = ("bertlint.trace", "bertlint.analysis.dryrun", "bertlint.analysis.accum")
_NOT_MOVED = ("FileDryRun", "LoopRun", "_Runner", "ManualStep")


def _fields(tp) -> tuple:
    got = _FIELDS.get(tp)
    if got is None:
        slots = []
        for c in tp.__mro__:
            sl = c.__dict__.get("__slots__", ())
            slots += [sl] if isinstance(sl, str) else list(sl)
        known = tp.__module__ in _KNOWN_MODULES and tp.__name__ not in _NOT_MOVED
        got = _FIELDS[tp] = (tuple(s for s in slots if s not in ("__dict__", "__weakref__")), known)
    return got


def _remap(o, mapping: dict, done: dict):
    """``o`` with every node of ``mapping`` (id -> (old, new)) replaced by its new node, objects changed in place
    (they are the last lint's, used by nobody else); lines looked up lazily are cleared. Raises ``_No`` on an
    object it does not know (an analysis of the old module)."""
    tp = type(o)
    if tp in _PLAIN:
        return o
    if tp in _NODE_TYPES:
        hit = mapping.get(id(o))
        return hit[1] if hit is not None and hit[0] is o else o
    k = id(o)
    if k in done:
        return done[k]
    if tp is list:
        done[k] = o
        hit = mapping.get(k)
        if hit is not None and hit[0] is o:
            done[k] = list(hit[1])
            return done[k]
        for i, v in enumerate(o):
            nv = _remap(v, mapping, done)
            if nv is not v:
                o[i] = nv
        return o
    if tp is tuple:
        hit = mapping.get(k)
        if hit is not None and hit[0] is o:
            done[k] = hit[1]
            return hit[1]
        vals = [_remap(v, mapping, done) for v in o]
        new = o if all(a is b for a, b in zip(vals, o)) else tuple(vals)
        done[k] = new
        return new
    if tp is dict:
        done[k] = o
        items = [(_remap(a, mapping, done), _remap(b, mapping, done)) for a, b in o.items()]
        o.clear()
        o.update(items)
        return o
    if tp is set or tp is frozenset:
        new = tp(_remap(v, mapping, done) for v in o)
        done[k] = new
        return new
    if isinstance(o, cst.CSTNode):
        _NODE_TYPES.add(tp)
        hit = mapping.get(id(o))
        return hit[1] if hit is not None and hit[0] is o else o
    slots, known = _fields(tp)
    if not known:
        raise _No(f"{tp.__module__}.{tp.__name__}")
    done[k] = o
    d = getattr(o, "__dict__", None)
    if d is not None:
        for name, v in list(d.items()):
            nv = _remap(v, mapping, done)
            if nv is not v:
                object.__setattr__(o, name, nv)
    for name in slots:
        try:
            v = getattr(o, name)
        except AttributeError:
            continue
        nv = _remap(v, mapping, done)
        if nv is not v:
            object.__setattr__(o, name, nv)
    if tp.__module__ == "bertlint.trace":
        if tp.__name__ == "Event":
            o.line = 0
            o.cond_line = 0
        elif tp.__name__ == "Trace":
            o.line = 0
    return o


# ------------------------------------------------------------------------------------------------ entry points


def reuse(ctx):
    """[(loop, traces, factor)] for the loops of ``ctx`` from the last dry run of its file, or None."""
    active = _active(ctx)
    if active is None:
        return None
    memo, reparser, filename, _text = active
    entry = memo._files.pop(filename, None)  # taken: a failed reuse leaves nothing half moved
    memo.last = "no earlier run"
    if entry is None:
        return None
    try:
        edit = reparser.edits.get(filename) if reparser is not None else None
        if ctx.module is entry["module"]:
            why, mapping = (None, {}) if entry.get("settings") == getattr(ctx, "settings", None) else ("settings", {})
        elif edit is None or edit.old_module is not entry["module"] or edit.new_module is not ctx.module:
            why, mapping = "not one incremental edit", {}
        else:
            why, mapping = _why_not(ctx, entry, edit)
        if why is None and not _no_siblings(ctx):
            why = "the file imports a module of its project"
        if why is None:
            for fn, old in entry["asked"]:
                if fn(ctx) != old:
                    why = "a launcher config beside the script changed"
                    break
        if why is not None:
            memo.last = why
            return None
        done: dict = {}
        runs = [(_remap(node, mapping, done), _remap(traces, mapping, done), _remap(factor, mapping, done))
                for node, traces, factor in entry["runs"]]
        memo.last = "reused"
        return runs  # the FileDryRun checks that its loops and scripted steps are these nodes
    except _No as e:
        memo.last = f"an object the reuse does not know: {e}"
        return None
    except Exception as e:  # an edge case: the run decides
        memo.last = f"{type(e).__name__}: {e}"
        return None


def not_reused(ctx, why: str) -> None:
    active = _active(ctx)
    if active is not None:
        active[0].last = why


def _no_siblings(ctx) -> bool:
    try:
        from bertlint.analysis import project

        p = project.of(ctx)
        return not p.has_siblings and not p.read
    except Exception:
        return False


def _asked_deepspeed(ctx):
    from bertlint.analysis.configfiles import deepspeed_enabled_for

    try:
        return deepspeed_enabled_for(ctx)[0] is True
    except Exception:
        return None


def remember(dr) -> None:
    """After a dry run of the file the server lints: keep what the next lint may take again."""
    ctx = dr.ctx
    active = _active(ctx)
    if active is None:
        return
    memo = active[0]
    if not _no_siblings(ctx) or ctx.__dict__.get("foreign_sites"):
        memo.forget(ctx.filename)
        return
    asked = []
    if "_acc_ds" in dr.__dict__:
        asked.append((_asked_deepspeed, _asked_deepspeed(ctx)))
    runs = [(r.loop.node, r.traces, r.factor) for r in dr.runs]
    memo.put(ctx.filename, {"module": ctx.module, "source": ctx.source, "settings": getattr(ctx, "settings", None),
                            "runs": runs, "asked": asked})
