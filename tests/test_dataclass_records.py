"""bertlint/_dataclass.py: records processed on first instance behave exactly as the standard dataclasses."""

from __future__ import annotations

import copy
import dataclasses
import pickle
import subprocess
import sys
import threading
from typing import ClassVar, Optional

from bertlint import _dataclass as lazy
from bertlint._dataclass import dataclass, field, replace


def _pair(**params):
    def body():
        return {"__annotations__": {"a": "int", "b": "str", "c": "list"}, "b": "x",
                "c": field(default_factory=list), "__module__": __name__}

    std = dataclasses.dataclass(**params)(type("S", (), body()))
    mine = dataclass(**params)(type("S", (), body()))
    return std, mine


def test_same_methods_and_behaviour_as_the_standard_decorator():
    for params in ({}, {"frozen": True}, {"order": True}, {"eq": False}, {"unsafe_hash": True},
                   {"frozen": True, "order": True}):
        std, mine = _pair(**params)
        assert lazy._PENDING in mine.__dict__  # nothing generated before the first instance
        a, m = std(1, "y", [3]), mine(1, "y", [3])
        assert lazy._PENDING not in mine.__dict__
        assert repr(a) == repr(m)
        assert (a == std(1, "y", [3])) == (m == mine(1, "y", [3])), params
        assert (std.__hash__ is None) == (mine.__hash__ is None), params
        # the one addition: a plain __new__ (object's, without the constructor's arguments), which stood in front of
        # the class while another thread processed it (see test_first_instances_from_several_threads)
        assert set(std.__dict__) | {"__new__"} == set(mine.__dict__), (params, set(std.__dict__) ^ set(mine.__dict__))
        assert mine.__new__(mine).__class__ is mine
        assert [(f.name, f.default, f.compare) for f in dataclasses.fields(std)] == \
               [(f.name, f.default, f.compare) for f in dataclasses.fields(mine)]
        assert std.__init__.__annotations__.keys() == mine.__init__.__annotations__.keys()
        if params.get("order"):
            assert (m < mine(2, "y", [3])) and not (m > mine(2, "y", [3]))
        if params.get("frozen"):
            try:
                m.a = 2
            except dataclasses.FrozenInstanceError:
                pass
            else:
                raise AssertionError("not frozen")


@dataclass
class _Base:
    a: int
    b: list = field(default_factory=list)
    k: ClassVar[int] = 3

    def __post_init__(self):
        self.doubled = self.a * 2


@dataclass
class _Derived(_Base):
    d: Optional[str] = None


class _Plain(_Base):
    def __init__(self, x):
        super().__init__(x, [x])
        self.own = True


def test_inheritance_post_init_replace_copy_and_pickle():
    c = _Derived(1, [2], "x")
    assert c.doubled == 2 and [f.name for f in dataclasses.fields(c)] == ["a", "b", "d"]
    assert replace(c, d="y").d == "y" and dataclasses.asdict(c) == {"a": 1, "b": [2], "d": "x"}
    assert _Derived.__hash__ is None and _Base.k == 3
    p = _Plain(4)
    assert p.own and p.b == [4] and p.doubled == 8
    assert copy.deepcopy(c) == c and pickle.loads(pickle.dumps(c)) == c


def test_unpickling_in_a_process_that_made_no_instance():
    # the worker processes of a parallel lint pickle Diagnostics; the parent may never have made one
    from bertlint.types import Diagnostic, Position, Severity

    d = Diagnostic("BL101", "n", Severity.ERROR, "m", "f.py", Position(1, 2), Position(1, 5))
    code = (
        "import pickle, sys\n"
        "from bertlint import _dataclass as lazy\n"
        "from bertlint.types import Diagnostic, Position\n"
        "assert lazy._PENDING in Diagnostic.__dict__\n"
        "d = pickle.loads(sys.stdin.buffer.read())\n"
        "assert lazy._PENDING not in Diagnostic.__dict__ and '__setstate__' not in Diagnostic.__dict__\n"
        "assert d.start == Position(1, 2) and d.start < Position(1, 3) and hash(d.start) == hash(Position(1, 2))\n"
        "print(repr(d))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(d), capture_output=True, check=True)
    assert out.stdout.decode().strip() == repr(d)


def test_first_instances_from_several_threads():
    @dataclass
    class T:
        a: int

    made = []
    threads = [threading.Thread(target=lambda: made.append(T(1))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 8 and all(x == T(1) for x in made)
