"""Compiled regular expressions kept between ``bertlint`` processes (the command line's start-up).

A lint compiles about a hundred patterns (the roles' name hints, the version and configuration readers, the rules'
message checks, libcst's tokenizer): ``re`` parses and compiles each in Python, 10-25 ms of a one-file run, every
run. Once installed (``install()``, by ``bertlint.cli.main`` when it is the process's entry point), a pattern ``re``
has not compiled in this process is looked up, by its text and flags, in a table of the compiler's output kept in
``bertlint/__pycache__/`` beside the ``.pyc`` files (for this interpreter's version and regular-expression engine;
not written when bytecode writing is off), and built from it by ``_sre.compile``, the call ``re`` itself ends with.
A pattern not in the table is compiled as ``re`` compiles it, checked to equal what ``re``'s own compiler makes
(pattern, flags and engine code: ``Pattern.__eq__``), and added to the table at exit. Anything unexpected (another
``re`` layout, a table that does not load) leaves ``re`` as it was.
"""

from __future__ import annotations

import sys

_TABLE: "dict | None" = None  # (pattern, flags) -> _sre.compile's arguments after the pattern
_NEW: dict = {}
_INSTALLED = False
_LIMIT = 4000


_STEM = "_re_code"


def _stamp() -> tuple:
    import _sre

    return (sys.version, _sre.MAGIC, _sre.CODESIZE, getattr(_sre, "MAXGROUPS", 0))


def _load() -> dict:
    from bertlint import _pycache_table

    d = _pycache_table.load(_STEM)
    if type(d) is not dict or d.get("__stamp__") != _stamp():
        return {}
    d.pop("__stamp__", None)
    return d


def _save() -> None:
    from bertlint import _pycache_table

    if not _NEW or sys.dont_write_bytecode:
        return
    merged = {**(_TABLE or {}), **_NEW}
    if len(merged) > _LIMIT:  # patterns nobody compiles any more accumulate: start over
        merged = dict(_NEW)
    merged["__stamp__"] = _stamp()
    _pycache_table.save(_STEM, merged)


def install() -> None:
    """Serve ``re``'s compilations from the table (idempotent; a no-op where ``re`` is not laid out as expected)."""
    global _INSTALLED, _TABLE
    if _INSTALLED:
        return
    _INSTALLED = True
    try:
        import _sre
        import re._compiler as C

        original = C.compile
        parse, code_of, isstring, DEBUG = C._parser.parse, C._code, C.isstring, C.SRE_FLAG_DEBUG
        sre_compile = _sre.compile
    except Exception:
        return
    _TABLE = _load()
    table = _TABLE

    def compile(p, flags=0):
        tp = type(p)
        if (tp is not str and tp is not bytes) or type(flags) is not int or flags & DEBUG:
            return original(p, flags)
        key = (p, flags)
        args = table.get(key)
        if args is not None:
            try:
                return sre_compile(p, *args)
            except Exception:
                table.pop(key, None)
        made = original(p, flags)
        try:
            # what re._compiler.compile hands _sre.compile, kept only when it rebuilds the very same pattern
            parsed = parse(p, flags)
            code = code_of(parsed, flags)
            groupindex = dict(parsed.state.groupdict)
            indexgroup = [None] * parsed.state.groups
            for k, i in groupindex.items():
                indexgroup[i] = k
            args = (int(flags | parsed.state.flags), [int(c) for c in code], int(parsed.state.groups - 1), groupindex,
                    tuple(indexgroup))  # (the opcodes are int subclasses: plain ints for marshal)
            if isstring(p) and sre_compile(p, *args) == made and made.groupindex == groupindex:
                if not _NEW:
                    import atexit

                    atexit.register(_save)
                _NEW[key] = args
                table[key] = args
        except Exception:
            pass
        return made

    C.compile = compile
