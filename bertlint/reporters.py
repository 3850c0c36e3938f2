"""Output formats: full (default), concise, json, json-lines, sarif (2.1.0), github, junit.

Every reporter gets the diagnostics already sorted (file, cell, row, column, code) and returns text; the CLI
writes it. Colour only when asked (the CLI asks on a terminal without NO_COLOR)."""

from __future__ import annotations

import functools
import json
import re
from typing import Callable, Optional

from bertlint.types import Applicability, Diagnostic, Severity

FORMATS = ("full", "concise", "json", "json-lines", "sarif", "github", "junit")


class _Style:
    def __init__(self, color: bool) -> None:
        self.color = color

    def __call__(self, text: str, *codes: str) -> str:
        if not self.color or not codes:
            return text
        return "\x1b[" + ";".join(codes) + "m" + text + "\x1b[0m"


_SEV_COLOR = {Severity.ERROR: "31", Severity.WARNING: "33", Severity.INFO: "34"}


def location(d: Diagnostic) -> str:
    if d.cell is not None:
        return f"{d.filename}:cell {d.cell}:{d.start.row}:{d.start.column}"
    return f"{d.filename}:{d.start.row}:{d.start.column}"


def fix_marker(d: Diagnostic, unsafe: bool = False) -> str:
    if d.fix is None:
        return ""
    if d.fix.applicability == Applicability.SAFE or unsafe:
        return "[*] "
    return "[-] "


# ----------------------------------------------------------------------------------------------- concise


def concise(diags: list[Diagnostic], *, color: bool = False, unsafe: bool = False, **_) -> str:
    st = _Style(color)
    out = []
    for d in diags:
        out.append(
            f"{st(location(d), '1')}: {st(d.code, '1', _SEV_COLOR[d.severity])} {fix_marker(d, unsafe)}{d.message}"
            + _verification_suffix(d)
        )
    return "\n".join(out) + ("\n" if out else "")


def _verification_suffix(d: Diagnostic) -> str:
    v = d.verification
    if v is None:
        return ""
    return f" [verify: {v.status}{': ' + v.evidence if v.evidence else ''}]"


# -------------------------------------------------------------------------------------------------- full


def full(
    diags: list[Diagnostic],
    *,
    sources: Optional[dict[str, Optional[str]]] = None,
    color: bool = False,
    unsafe: bool = False,
    **_,
) -> str:
    st = _Style(color)
    line_cache: dict[tuple[str, Optional[int]], list[str]] = {}
    out: list[str] = []
    for d in diags:
        sev = d.severity
        head = (
            f"{st(location(d), '1')}: {st(d.code, '1', _SEV_COLOR[sev])} {fix_marker(d, unsafe)}"
            f"{st(d.name, '1')} ({sev.label})"
        )
        out.append(head)
        out.append(f"  {d.message}")
        lines = _lines_for(d, sources or {}, line_cache)
        if lines and 1 <= d.start.row <= len(lines):
            text = lines[d.start.row - 1].rstrip("\r\n").replace("\t", " ")
            width = len(str(d.start.row))
            gutter = " " * (width + 1) + "|"
            start = max(d.start.column - 1, 0)
            if d.end.row == d.start.row and d.end.column > d.start.column:
                stop = d.end.column - 1
            else:
                stop = len(text)
            stop = min(max(stop, start + 1), max(len(text), start + 1))
            marker = " " * start + "^" * (stop - start)
            out.append(st(gutter, "34"))
            out.append(f"{st(str(d.start.row).rjust(width) + ' |', '34')} {text}")
            out.append(f"{st(gutter, '34')} {st(marker, '1', _SEV_COLOR[sev])} {st(d.code, _SEV_COLOR[sev])}")
            out.append(st(gutter, "34"))
        if d.fix is not None:
            if d.fix.applicability == Applicability.SAFE:
                how = "safe fix, applied with --fix"
            else:
                how = "unsafe fix, applied with --fix --unsafe-fixes"
            out.append(f"  {st('= fix', '32')} ({how}): {d.fix.message}")
        if d.verification is not None:
            v = d.verification
            out.append(f"  {st('= verify', '35')}: {v.status}" + (f": {v.evidence}" if v.evidence else ""))
        out.append("")
    return "\n".join(out) + ("\n" if out and out[-1] != "" else "")


def _lines_for(d: Diagnostic, sources: dict, cache: dict) -> Optional[list[str]]:
    key = (d.filename, d.cell)
    if key in cache:
        return cache[key]
    text = sources.get(d.filename)
    lines: Optional[list[str]] = None
    if text is not None:
        if d.cell is not None:
            try:
                from bertlint.sources import read_notebook

                nb = read_notebook(text)
                lines = nb.lines_of(d.cell)
            except Exception:
                lines = None
        else:
            lines = text.splitlines()
    cache[key] = lines
    return lines


# ---------------------------------------------------------------------------------------------- json-ish


def json_array(diags: list[Diagnostic], **_) -> str:
    return json.dumps([d.to_json() for d in diags], indent=2, ensure_ascii=False) + "\n"


def json_lines(diags: list[Diagnostic], **_) -> str:
    return "".join(json.dumps(d.to_json(), ensure_ascii=False) + "\n" for d in diags)


# ------------------------------------------------------------------------------------------------ github


def _gh_data(s: str) -> str:
    return s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(s: str) -> str:
    return _gh_data(s).replace(":", "%3A").replace(",", "%2C")


class _FileRegions:
    """Regions in the file as stored: for a notebook, a cell-relative position becomes the line and column of
    the ``.ipynb`` JSON text (what GitHub and SARIF viewers show); other files keep their positions."""

    def __init__(self, sources: Optional[dict[str, Optional[str]]]) -> None:
        self.sources = sources or {}
        self.maps: dict = {}

    def region(self, d: Diagnostic) -> Optional[tuple[int, int, int, int]]:
        """(start line, start column, end line, end column); None when a notebook's text is not at hand."""
        if d.cell is None:
            return d.start.row, d.start.column, d.end.row, d.end.column
        m = self.maps.get(d.filename)
        if m is None:
            text = self.sources.get(d.filename)
            if text is None:
                return None
            from bertlint.sources import NotebookJsonMap

            m = self.maps[d.filename] = NotebookJsonMap(text)
        s = m.locate(d.cell, d.start.row, d.start.column)
        if s is None:
            return None
        e = m.locate(d.cell, d.end.row, d.end.column) or s
        if e < s:
            e = s
        return s[0], s[1], e[0], e[1]


def _cell_where(d: Diagnostic) -> str:
    return f"cell {d.cell}, line {d.start.row}, column {d.start.column}: " if d.cell is not None else ""


def github(diags: list[Diagnostic], *, sources: Optional[dict[str, Optional[str]]] = None, **_) -> str:
    level = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "notice"}
    regions = _FileRegions(sources)
    out = []
    for d in diags:
        where = _cell_where(d)
        reg = regions.region(d)
        props = f"title={_gh_prop(f'bertlint ({d.code})')},file={_gh_prop(d.filename)}"
        if reg is not None:
            props += f",line={reg[0]},col={reg[1]},endLine={reg[2]},endColumn={reg[3]}"
        out.append(f"::{level[d.severity]} {props}::{_gh_data(f'{where}{d.code} {d.name}: {d.message}')}")
    return "\n".join(out) + ("\n" if out else "")


# ------------------------------------------------------------------------------------------------- junit


# Characters XML 1.0 does not allow, even escaped (C0 controls but tab/newline/CR, surrogates, U+FFFE/U+FFFF).
_XML_BAD = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def _xml_text(s: str) -> str:
    """``s`` with the characters XML cannot carry written as ``\\xNN`` / ``\\uNNNN`` (a path or message keeps
    its other characters)."""
    return _XML_BAD.sub(lambda m: f"\\x{ord(m.group()):02x}" if ord(m.group()) < 0x100 else f"\\u{ord(m.group()):04x}", s)


def junit(diags: list[Diagnostic], **_) -> str:
    from xml.sax.saxutils import escape as _escape
    from xml.sax.saxutils import quoteattr as _quoteattr

    def quoteattr(s: str) -> str:
        return _quoteattr(_xml_text(s), {"\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})

    def escape(s: str) -> str:
        return _escape(_xml_text(s))

    by_file: dict[str, list[Diagnostic]] = {}
    for d in diags:
        by_file.setdefault(d.filename, []).append(d)
    n = len(diags)
    out = ['<?xml version="1.0" encoding="UTF-8"?>', f'<testsuites name="bertlint" tests="{max(n, 1)}" failures="{n}" errors="0">']
    if not diags:
        out.append('  <testsuite name="bertlint" tests="1" failures="0" errors="0">')
        out.append('    <testcase name="bertlint" classname="bertlint"/>')
        out.append("  </testsuite>")
    for fname, ds in by_file.items():
        out.append(f'  <testsuite name={quoteattr(fname)} tests="{len(ds)}" failures="{len(ds)}" errors="0">')
        for d in ds:
            where = f"cell {d.cell}, " if d.cell is not None else ""
            out.append(
                f"    <testcase name={quoteattr(f'org.bertlint.{d.code}')} classname={quoteattr(fname)} "
                f'line="{d.start.row}" column="{d.start.column}">'
            )
            out.append(
                f"      <failure message={quoteattr(d.message)} type={quoteattr(d.code)}>"
                f"{escape(f'{where}line {d.start.row}, col {d.start.column}, {d.code} {d.name}: {d.message}')}</failure>"
            )
            out.append("    </testcase>")
        out.append("  </testsuite>")
    out.append("</testsuites>")
    return "\n".join(out) + "\n"


# ------------------------------------------------------------------------------------------------- sarif


def _uri(filename: str) -> str:
    import os
    from urllib.parse import quote

    p = filename.replace(os.sep, "/")
    if os.path.isabs(filename):
        return "file://" + quote(p if p.startswith("/") else "/" + p)
    return quote(p)


def _region(start, end) -> dict:
    return {"startLine": start.row, "startColumn": start.column, "endLine": end.row, "endColumn": end.column}


def sarif(
    diags: list[Diagnostic],
    *,
    rules: Optional[list] = None,
    sources: Optional[dict[str, Optional[str]]] = None,
    **_,
) -> str:
    from bertlint import __version__

    level = {Severity.ERROR: "error", Severity.WARNING: "warning", Severity.INFO: "note"}
    metas = {m.code: m for m in (rules or [])}
    for d in diags:  # a reported code always has its rule entry
        if d.code not in metas:
            from bertlint.types import RuleMeta

            metas[d.code] = RuleMeta(d.code, d.name, d.severity, d.name)
    codes = sorted(metas)
    index = {c: i for i, c in enumerate(codes)}
    rule_objs = []
    for c in codes:
        m = metas[c]
        obj: dict = {"id": m.code, "name": m.name, "shortDescription": {"text": m.summary}}
        page = _rule_help(m.code)
        if page is not None:  # the rule page: GitHub's alert panel shows help.markdown
            obj["fullDescription"] = {"text": page[0]}
            obj["help"] = {"text": page[1], "markdown": page[2]}
        else:
            obj["fullDescription"] = {"text": m.summary}
        rule_objs.append(
            {
                **obj,
                "defaultConfiguration": {"level": level[m.severity], "enabled": bool(m.default_enabled)},
                "properties": {
                    "severity": m.severity.label,
                    "fix": m.fix.value if m.fix else "none",
                    "docs": m.url,
                },
            }
        )
    results = []
    regions = _FileRegions(sources)
    for d in diags:
        uri = _uri(d.filename)
        phys: dict = {"artifactLocation": {"uri": uri}}
        reg = regions.region(d)
        if reg is not None:
            phys["region"] = {"startLine": reg[0], "startColumn": reg[1], "endLine": reg[2], "endColumn": reg[3]}
        loc: dict = {"physicalLocation": phys}
        if d.cell is not None:  # the region is in the .ipynb JSON text; the cell-relative position is kept here
            loc["properties"] = {"cell": d.cell, "cellRegion": _region(d.start, d.end)}
        r: dict = {
            "ruleId": d.code,
            "ruleIndex": index[d.code],
            "level": level[d.severity],
            "message": {"text": _cell_where(d) + d.message},
            "locations": [loc],
        }
        if d.fix is not None and d.cell is None:  # a notebook's edits are cell-relative: no JSON-text replacement
            r["fixes"] = [
                {
                    "description": {"text": f"{d.fix.message} ({d.fix.applicability.value})"},
                    "artifactChanges": [
                        {
                            "artifactLocation": {"uri": uri},
                            "replacements": [
                                {"deletedRegion": _region(e.start, e.end), "insertedContent": {"text": e.content}}
                                for e in d.fix.edits
                            ],
                        }
                    ],
                }
            ]
        props = {}
        if d.cell is not None:
            props["cell"] = d.cell
        if d.verification is not None:
            props["verification"] = d.verification.to_json()
        if props:
            r["properties"] = props
        results.append(r)
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "bertlint",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "informationUri": "https://pypi.org/project/bertlint/",
                        "rules": rule_objs,
                    }
                },
                "columnKind": "unicodeCodePoints",
                "results": results,
            }
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


_FENCE_INFO = re.compile(r"^(```+|~~~+)[ \t]*([\w+-]+)[^\n]*$", re.MULTILINE)
_EXPECT = re.compile(r"[ \t]*#\s*expect:\s*BL\d{3}(?:\s*,\s*BL\d{3})*")


@functools.lru_cache(maxsize=None)
def _rule_help(code: str) -> Optional[tuple[str, str, str]]:
    """(full description, help text, help markdown) from the rule's page ``rules/CODE.md``; None without a page.
    The page's test annotations (fence attributes such as ``bad``, ``# expect:`` comments) are dropped."""
    from bertlint.cli import rule_page

    page = rule_page(code)
    if page is None:
        return None
    md = _EXPECT.sub("", _FENCE_INFO.sub(lambda m: m.group(1) + m.group(2), page)).strip() + "\n"
    paras = [p.strip() for p in re.split(r"\n\s*\n", md) if p.strip()]
    body = [p for p in paras if not p.startswith("#")]
    full = " ".join((body[0] if body else code).split())
    return full, md, md  # the page's Markdown reads as plain text too


REPORTERS: dict[str, Callable[..., str]] = {
    "full": full,
    "concise": concise,
    "json": json_array,
    "json-lines": json_lines,
    "sarif": sarif,
    "github": github,
    "junit": junit,
}


def render(fmt: str, diags: list[Diagnostic], **kw) -> str:
    return REPORTERS[fmt](diags, **kw)


# ------------------------------------------------------------------------------------------ summaries


def summary(diags: list[Diagnostic], *, fixed: int = 0, unsafe: bool = False, color: bool = False) -> str:
    st = _Style(color)
    n = len(diags)
    if n == 0 and fixed == 0:
        return st("All checks passed!", "32") + "\n"
    counts = {s: 0 for s in Severity}
    for d in diags:
        counts[d.severity] += 1
    parts = [f"{counts[s]} {s.label}{'s' if counts[s] != 1 else ''}" for s in Severity if counts[s]]
    noun = "problem" if n == 1 else "problems"
    lines = []
    if fixed:
        lines.append(f"Found {n + fixed} problem{'s' if n + fixed != 1 else ''} ({fixed} fixed, {n} remaining).")
    else:
        lines.append(f"Found {n} {noun} ({', '.join(parts)}).")
    safe = sum(1 for d in diags if d.fix is not None and d.fix.applicability == Applicability.SAFE)
    uns = sum(1 for d in diags if d.fix is not None and d.fix.applicability != Applicability.SAFE)
    if unsafe and safe + uns:
        lines.append(f"[*] {safe + uns} fixable with `--fix --unsafe-fixes`.")
    else:
        if safe:
            lines.append(f"[*] {safe} fixable with `--fix`.")
        if uns:
            lines.append(f"{uns} more fix{'es' if uns != 1 else ''} available with `--fix --unsafe-fixes`.")
    return "\n".join(lines) + "\n"


def fixable(d: Diagnostic, unsafe: bool = False) -> bool:
    """Whether ``--fix`` (with ``unsafe``: ``--fix --unsafe-fixes``) would apply the diagnostic's fix."""
    return d.fix is not None and bool(d.fix.edits) and (unsafe or d.fix.applicability == Applicability.SAFE)


def statistics(diags: list[Diagnostic], fmt: str = "full", *, unsafe: bool = False) -> str:
    """Findings per code. A code is ``[*]`` / ``"fixable"`` when ``--fix`` (``--fix --unsafe-fixes`` with
    ``unsafe``) would fix at least one of its findings: an unsafe fix alone does not make it fixable."""
    rows: dict[str, list] = {}
    for d in diags:
        r = rows.setdefault(d.code, [0, d.name, False])
        r[0] += 1
        r[2] = r[2] or fixable(d, unsafe)
    order = sorted(rows.items(), key=lambda kv: (-kv[1][0], kv[0]))
    if fmt in ("json", "json-lines", "sarif"):
        return json.dumps(
            [{"code": c, "name": name, "count": n, "fixable": fx} for c, (n, name, fx) in order], indent=2
        ) + "\n"
    return "".join(f"{n:>5}\t{c}\t{'[*] ' if fx else ''}{name}\n" for c, (n, name, fx) in order)
