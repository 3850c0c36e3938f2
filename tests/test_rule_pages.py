"""Rule pages are tests: every fenced ``bad`` example of ``rules/BLxxx.md`` must report exactly the marked
(code, line) pairs for the page's code, every ``good`` example nothing (format in docs/CONTRIBUTING.md).
Also: every registered code has a page, every page a registered code, and the sections are the same on every
page. Pages land over time: a page whose rule is not registered yet has its examples skipped (and fails
``test_every_page_has_a_rule``)."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bertlint.api import lint_path
from bertlint.config import clear_caches, load_settings
from bertlint.registry import ENGINE_CODES, all_rules

ROOT = Path(__file__).resolve().parent.parent
RULES_DIR = ROOT / "rules"
SECTIONS = [
    "What it finds",
    "Why it matters",
    "Example",
    "Use instead",
    "Fix and its safety",
    "How --verify confirms it",
    "References",
]
_DEFAULT_NAME = {"python": "example.py", "py": "example.py", "json": "example.json", "yaml": "example.yaml", "yml": "example.yaml"}
_EXPECT_COMMENT = re.compile(r"#\s*expect:\s*(?P<codes>BL\d{3}(?:\s*,\s*BL\d{3})*)")


@dataclass
class Block:
    page: str  # code, e.g. BL101
    section: str
    lang: str
    kind: str  # "bad" | "good" | "aux" | "other"
    attrs: dict
    text: str
    line: int  # line of the opening fence in the page
    aux: list = field(default_factory=list)  # (name, text) files written beside this example

    @property
    def filename(self) -> str:
        return self.attrs.get("filename") or _DEFAULT_NAME.get(self.lang, "example.py")

    def expected(self, code: str) -> set[tuple[str, int]]:
        out: set[tuple[str, int]] = set()
        if "expect" in self.attrs:
            for item in self.attrs["expect"].split(","):
                c, _, ln = item.strip().partition(":")
                if c and ln.isdigit():
                    out.add((c.strip(), int(ln)))
        for i, line in enumerate(self.text.splitlines(), start=1):
            m = _EXPECT_COMMENT.search(line)
            if m:
                for c in re.split(r"\s*,\s*", m.group("codes")):
                    out.add((c, i))
        return {(c, ln) for c, ln in out if c == code}


def parse_page(path: Path) -> list[Block]:
    code = path.stem
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    section = ""
    pending_aux: list = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("## "):
            section = line[3:].strip()
            pending_aux = []
        m = re.match(r"^(?P<fence>`{3,}|~{3,})(?P<info>.*)$", line)
        if not m:
            i += 1
            continue
        fence, info = m.group("fence"), m.group("info").strip()
        body = []
        j = i + 1
        while j < len(lines) and not (lines[j].startswith(fence) and lines[j].strip() == fence[0] * len(lines[j].strip())):
            body.append(lines[j])
            j += 1
        words = info.split()
        lang = words[0].lower() if words else ""
        attrs = {}
        flags = set()
        for w in words[1:]:
            if "=" in w:
                k, _, v = w.partition("=")
                attrs[k] = v
            else:
                flags.add(w)
        text = "\n".join(body) + "\n"
        if "bad" in flags:
            kind = "bad"
        elif "good" in flags:
            kind = "good"
        elif "file" in attrs:
            kind = "aux"
        else:
            kind = "other"
        b = Block(code, section, lang, kind, attrs, text, i + 1)
        if kind == "aux":
            pending_aux.append((attrs["file"], text))
        elif kind in ("bad", "good"):
            b.aux = pending_aux
            pending_aux = []
            blocks.append(b)
        i = j + 1
    return blocks


def _pages() -> list[Path]:
    return sorted(RULES_DIR.glob("BL*.md")) if RULES_DIR.is_dir() else []


def _registered() -> dict:
    metas = {c: m for c, m in ENGINE_CODES.items()}
    metas.update({r.meta.code: r.meta for r in all_rules()})
    return metas


def _examples():
    out = []
    for page in _pages():
        for n, b in enumerate(parse_page(page), start=1):
            out.append(pytest.param(b, id=f"{b.page}-{b.kind}-{n}-line{b.line}"))
    return out


def run_example(b: Block, tmp: Path):
    for name, text in b.aux:
        p = tmp / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    path = tmp / b.filename
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(b.text, encoding="utf-8")
    clear_caches()
    settings = load_settings(str(path)).with_cli(select=[b.page, "BL001"])
    return lint_path(str(path), settings)


@pytest.mark.parametrize("block", _examples())
def test_rule_page_example(block: Block, tmp_path: Path):
    registered = _registered()
    if block.page not in registered:
        pytest.skip(f"{block.page}: page present, rule not registered yet")
    diags = run_example(block, tmp_path)
    if block.page != "BL001":
        broken = [d for d in diags if d.code == "BL001"]
        assert not broken, f"rules/{block.page}.md:{block.line}: example does not parse: {broken[0].message}"
    got = {(d.code, d.start.row) for d in diags if d.code == block.page}
    where = f"rules/{block.page}.md:{block.line} ({block.kind} example in '{block.section}')"
    if block.kind == "bad":
        want = block.expected(block.page)
        assert want, f"{where}: a bad example must mark the reported line (# expect: {block.page} or expect=)"
        assert got == want, f"{where}: expected {sorted(want)}, got {sorted(got)}: " + "; ".join(
            f"{d.start.row}: {d.message}" for d in diags if d.code == block.page
        )
    else:
        assert not got, f"{where}: a good example must report nothing, got: " + "; ".join(
            f"{d.start.row}: {d.message}" for d in diags if d.code == block.page
        )


def test_every_rule_has_a_page():
    pages = {p.stem for p in _pages()}
    missing = sorted(c for c in _registered() if c not in pages)
    assert not missing, f"registered codes without a page in rules/: {missing}"


def test_every_page_has_a_rule():
    registered = _registered()
    orphans = sorted(p.stem for p in _pages() if p.stem not in registered)
    assert not orphans, f"pages in rules/ without a registered rule: {orphans}"


@pytest.mark.parametrize("page", [pytest.param(p, id=p.stem) for p in _pages()])
def test_page_structure(page: Path):
    text = page.read_text(encoding="utf-8")
    first = text.splitlines()[0] if text else ""
    assert re.match(rf"^# {page.stem} [a-z0-9-]+", first), f"{page.name}: first line must be '# {page.stem} <name>'"
    registered = _registered()
    if page.stem in registered:
        name = registered[page.stem].name
        assert first.split()[2] == name, f"{page.name}: title name {first.split()[2]!r} != rule name {name!r}"
    heads = [ln[3:].strip() for ln in text.splitlines() if ln.startswith("## ")]
    assert heads == SECTIONS, f"{page.name}: sections must be exactly {SECTIONS}, got {heads}"
    blocks = parse_page(page)
    assert any(b.kind == "bad" for b in blocks), f"{page.name}: needs at least one bad example"
    assert any(b.kind == "good" for b in blocks), f"{page.name}: needs at least one good example"


def test_harness_parses_attributes(tmp_path: Path):
    page = tmp_path / "BL999.md"
    page.write_text(
        "# BL999 demo\n\n## Example\n\n```toml file=pyproject.toml\n[tool.bertlint]\nworld-size = 2\n```\n\n"
        "```python bad filename=train.py\nx = 1  # expect: BL999, BL101\n```\n\n"
        "```json bad expect=BL999:2,BL402:3\n{}\n```\n\n```python good\npass\n```\n",
        encoding="utf-8",
    )
    blocks = parse_page(page)
    assert [b.kind for b in blocks] == ["bad", "bad", "good"]
    assert blocks[0].filename == "train.py" and blocks[0].aux == [("pyproject.toml", "[tool.bertlint]\nworld-size = 2\n")]
    assert blocks[0].expected("BL999") == {("BL999", 1)}
    assert blocks[1].filename == "example.json" and blocks[1].aux == []
    assert blocks[1].expected("BL999") == {("BL999", 2)}


def test_installed_package_carries_the_pages():
    """`bertlint rule CODE` reads bertlint/pages (a link to rules/ in the checkout, package data in a wheel)."""
    from bertlint.cli import rule_page

    for page in _pages():
        assert rule_page(page.stem) == page.read_text(encoding="utf-8")
    assert os.path.isdir(ROOT / "bertlint" / "pages")


def test_wheel_ships_every_page(tmp_path):
    """`bertlint rule CODE` from an installed (non-editable) wheel: the pages are package data."""
    import subprocess
    import sys
    import zipfile

    pytest.importorskip("setuptools")
    # build from a copy: the working tree stays free of build/ and egg-info changes
    import shutil

    src = tmp_path / "src"
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".venv", ".ci-venv", "build", "dist", "*.egg-info", "__pycache__", "fixtures", "tests", "bench_out",
        "node_modules", ".pytest_cache",
    ))
    p = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path / "w"), str(src)],
        capture_output=True, text=True, timeout=300,
    )
    if p.returncode != 0 and "No module named" in p.stderr:
        pytest.skip(f"cannot build a wheel here: {p.stderr[-300:]}")
    assert p.returncode == 0, p.stderr[-2000:]
    wheel = next((tmp_path / "w").glob("bertlint-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = [pg.name for pg in _pages() if f"bertlint/pages/{pg.name}" not in names]
    assert not missing, f"pages missing from the wheel: {missing}"
