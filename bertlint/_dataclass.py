"""``dataclass`` for bertlint's own records, processed on first use instead of at import.

The standard decorator generates and compiles ``__init__`` / ``__repr__`` / ``__eq__`` (and the order, hash and
frozen methods) when the class statement runs: about 0.5-1 ms per class, and a lint imports some 45 of them, of which
a clean file instantiates about half (``Diagnostic``, ``Edit``, the configuration-file records ... only exist when
there is something to say). Here the class statement only records the decorator's arguments and installs a
``__init__`` (and a ``__setstate__``, for an instance unpickled in a process that made none) that, the first time an
instance is made, runs the standard ``dataclasses.dataclass`` on the class, in place, bases first, and removes itself.
From then on the class is exactly what ``@dataclasses.dataclass(...)`` makes (``fields``, ``replace``,
``asdict``, equality, hashing, ordering and frozenness included), plus a ``__new__`` that is ``object.__new__`` without
the constructor's arguments: until the generated ``__init__`` is in place, a first instance made by another thread
waits in it for the processing to end (a class with no ``__init__`` of its own for that moment would reject its
arguments).

Only for classes whose first use is an instance: ``dataclasses.fields(cls)`` / ``is_dataclass(cls)`` on a class that
has no instance yet see no fields (call :func:`materialise` first). ``slots=True`` makes a new class, so it is
processed at once.

The methods' source texts that ``dataclasses`` generates are compiled once and kept, as code objects, in
``bertlint/__pycache__/`` beside the ``.pyc`` files (keyed by the exact text, for this interpreter's bytecode
magic; not written when bytecode writing is off): the next process execs those instead of compiling again.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import field, replace  # noqa: F401  (re-exported: one import line for the records' modules)

__all__ = ["dataclass", "field", "replace", "materialise"]

_PENDING = "__bertlint_dataclass_pending__"
_STUBS = "__bertlint_dataclass_stubs__"
_LOCK = threading.RLock()


_CODE: "dict | None" = None  # generated method source -> its code object (from the file, then this process)
_NEW: dict = {}  # compiled in this process (written at exit)
_MISSING = object()


_STEM = "_dataclass_methods"


def _load_code() -> dict:
    from bertlint import _pycache_table

    d = _pycache_table.load(_STEM)
    code_t = type(_load_code.__code__)
    if type(d) is not dict or not all(type(k) is str and type(v) is code_t for k, v in d.items()):
        return {}
    return d


def _save_code() -> None:
    import sys

    from bertlint import _pycache_table

    if not _NEW or sys.dont_write_bytecode:
        return
    merged = {**(_CODE or {}), **_NEW}
    if len(merged) > 5000:  # edits accumulate texts no class generates any more: start over
        merged = dict(_NEW)
    _pycache_table.save(_STEM, merged)


def _exec(source, globals=None, locals=None):
    """``exec`` for ``dataclasses``' generated method texts, from compiled code kept between processes."""
    if type(source) is not str:
        return exec(source, globals, locals)
    code = _CODE.get(source) if _CODE is not None else None
    if code is None:
        # as exec(str) from dataclasses.py compiles it (no __future__ flags of this module)
        code = compile(source, "<string>", "exec", dont_inherit=True)
        if not _NEW:
            import atexit

            atexit.register(_save_code)
        _NEW[source] = code
    return exec(code, globals, locals)


def _process(k: type, params: dict) -> None:
    global _CODE
    if _CODE is None:
        _CODE = _load_code()
    previous = dataclasses.__dict__.get("exec", _MISSING)
    dataclasses.exec = _exec  # the module's global name shadows the builtin while this class is processed
    try:
        dataclasses.dataclass(k, **params)
    finally:
        if previous is _MISSING:
            del dataclasses.exec
        else:
            dataclasses.exec = previous


def materialise(cls: type) -> type:
    """Run the standard dataclass processing on ``cls`` and on its pending bases (bases first); idempotent."""
    for k in reversed(cls.__mro__):
        if _PENDING in k.__dict__:
            with _LOCK:
                params = k.__dict__.get(_PENDING)
                if params is None:
                    continue  # another thread got here first
                stubs = k.__dict__[_STUBS]
                for name, stub in stubs.items():
                    if name != "__new__" and k.__dict__.get(name) is stub:
                        delattr(k, name)
                _process(k, params)
                # only now: until the generated __init__ is in place, a first instance made by another thread goes
                # through the stub __new__, which waits here on the lock. It is then replaced, not deleted: CPython
                # keeps a class whose __new__ was assigned on its slot wrapper, and object.__new__ reached through it
                # rejects the constructor's arguments
                if k.__dict__.get("__new__") is stubs.get("__new__"):
                    k.__new__ = staticmethod(_plain_new)
                delattr(k, _STUBS)
                delattr(k, _PENDING)
    return cls


def materialise_all(module_names=None) -> None:
    """Process every pending class now (before worker processes fork, so that each does not do it again)."""
    import sys

    for name, mod in list(sys.modules.items()):
        if mod is None or not name.startswith("bertlint") or (module_names and name not in module_names):
            continue
        for v in list(vars(mod).values()):
            if isinstance(v, type) and _PENDING in v.__dict__:
                materialise(v)


def _plain_new(cls, *args, **kwargs):
    return object.__new__(cls)


_plain_new._bertlint_stub = True


def _stubs(c: type) -> dict:
    def __init__(self, *args, **kwargs):
        materialise(type(self))
        c.__init__(self, *args, **kwargs)  # the generated one now

    def __setstate__(self, state):  # unpickling or copying before any instance was made in this process
        materialise(type(self))
        slots = None
        if isinstance(state, tuple) and len(state) == 2:
            state, slots = state
        if state:
            self.__dict__.update(state)
        for k, v in (slots or {}).items():
            object.__setattr__(self, k, v)

    def __new__(cls, *args, **kwargs):  # waits for another thread's processing of the class (see materialise)
        materialise(cls)
        return object.__new__(cls)

    __init__.__qualname__ = f"{c.__qualname__}.__init__"
    __new__.__qualname__ = f"{c.__qualname__}.__new__"
    out = {"__init__": __init__, "__setstate__": __setstate__}
    __new__._bertlint_stub = True
    inherited = c.__new__  # object's, or a pending base's stub: safe to stand in front of
    if "__new__" not in c.__dict__ and (inherited is object.__new__ or getattr(inherited, "_bertlint_stub", False)):
        out["__new__"] = staticmethod(__new__)
    return out


def dataclass(cls=None, /, **params):
    """``dataclasses.dataclass`` (same arguments), processed when the first instance is made."""

    def wrap(c: type) -> type:
        if params.get("slots") or params.get("init") is False or "__init__" in c.__dict__ or "__setstate__" in c.__dict__:
            return dataclasses.dataclass(c, **params)
        stubs = _stubs(c)
        setattr(c, _PENDING, params)
        setattr(c, _STUBS, stubs)
        for name, fn in stubs.items():
            setattr(c, name, fn)
        return c

    return wrap if cls is None else wrap(cls)
