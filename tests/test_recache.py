"""bertlint/_recache.py: patterns built from the kept compiler output are the patterns ``re`` makes."""

import os
import re
import subprocess
import sys

PATTERNS = [
    (r"^(ALL|BL[0-9]{0,3})$", 0),
    (r"(?P<name>[A-Za-z_]\w*)\s*=\s*(?P<value>.+)", 0),
    (r"^((opt|optim|optimi[sz]er)_?\d*|[a-z0-9]+_(opt|optim|optimi[sz]er))$", int(re.I)),
    (r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[\s,]+[A-Z]+[0-9]+)*))?", int(re.IGNORECASE)),
    (r"(?x) a  b # verbose\n c", 0),
    (r"(?s).*?end", int(re.M)),
    (rb"\x00row:([0-9]+)\x00", 0),
    (r"ß|straße", int(re.I | re.U)),
]

RUN = """
import re._compiler as C
from bertlint import _pycache_table, _recache
_pycache_table.path = lambda stem: {table!r}
original = C.compile
_recache.install()
pats = {pats!r}
for p, f in pats:
    a, b = C.compile(p, f), original(p, f)
    assert a == b and a.groupindex == b.groupindex and a.groups == b.groups and a.flags == b.flags, p
    s = b"\\x00row:12\\x00 abc" if isinstance(p, bytes) else "x = 1 BL101 a b c end ALL straße # noqa: BL101"
    assert [m.span() for m in a.finditer(s)] == [m.span() for m in b.finditer(s)], p
print(len(_recache._NEW))
_recache._save()
"""


def _run(table, pats=PATTERNS) -> int:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}  # (the table is not written then)
    out = subprocess.run([sys.executable, "-c", RUN.format(table=str(table), pats=pats)], capture_output=True,
                         text=True, env=env)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.split()[-1])


def test_patterns_from_the_table_equal_re_s(tmp_path):
    table = tmp_path / "table.marshal"
    assert _run(table) == len(PATTERNS)  # compiled by re, checked, kept
    assert table.is_file()
    assert _run(table) == 0  # every one built from the table, equal to re's


def test_a_broken_table_is_ignored(tmp_path):
    table = tmp_path / "table.marshal"
    table.write_bytes(b"not marshal data")
    assert _run(table) == len(PATTERNS)
    assert _run(table) == 0
