"""Target versions of the training frameworks a script will run on.

Order of precedence, per package:

1. ``[tool.bertlint] target-versions`` (``ctx.settings.target_versions``);
2. a pin near the script: ``requirements*.txt`` (or ``requirement*.txt``), ``pyproject.toml`` dependencies, ``setup.cfg`` ``install_requires``,
   ``setup.py`` requirement strings, ``environment.yml`` — searched from the script's folder upward to the repository root (the nearest file that
   names the package wins);
3. the installed distribution (``importlib.metadata``; never an import of the package);
4. the current release.

Every :class:`TargetVersion` carries ``source``: a short text that every version-dependent message repeats
("transformers 5.24.0 (pinned in requirements.txt:3)").

Specifiers: ``==X`` is exact; a range (``>=4.46,<4.48``, ``~=4.46.0``, ``>=4.30``) resolves to the newest release
it allows that bertlint knows of (what ``pip install`` would pick); the text says so ("newest allowed by
`transformers>=4.46,<4.48` in requirements.txt:3"), and ``exact`` is False. ``lowest`` keeps the range's lower
bound for messages.
"""

from __future__ import annotations

import os
import re
from bertlint._dataclass import dataclass, field
from functools import lru_cache
from typing import Callable, Iterable, Optional

CURRENT = {
    "transformers": "5.24.0",
    "accelerate": "1.15.0",
    "deepspeed": "0.19.8",
    "torch": "2.13.0",
    "lightning": "2.6.6",
    "peft": "0.21.2",
}

PACKAGES = tuple(CURRENT)

# Packages read only by the rules that need them (not listed by ``Versions.all`` / ``explain``).
CURRENT["diffusers"] = "0.42.1"

# Distribution names that stand for one of the packages above.
_ALIASES = {
    "pytorch-lightning": "lightning",
    "pytorch_lightning": "lightning",
    "lightning": "lightning",
    "transformers": "transformers",
    "accelerate": "accelerate",
    "deepspeed": "deepspeed",
    "torch": "torch",
    "pytorch": "torch",  # conda
    "peft": "peft",
    "diffusers": "diffusers",
}

# Releases bertlint knows of (used to pick the newest release a range allows). Not exhaustive: only what the
# version-dependent rules need to tell apart.
_KNOWN: dict[str, list[str]] = {
    "transformers": [
        *(f"4.{m}.0" for m in range(20, 58)),
        "4.44.2", "4.45.2", "4.46.1", "4.46.2", "4.46.3", "4.47.1", "4.48.1", "4.48.2", "4.48.3",
        "4.49.0", "4.50.3", "4.51.3", "4.52.4", "4.53.3", "4.54.1", "4.55.4", "4.56.2", "4.57.1",
        *(f"5.{m}.0" for m in range(0, 25)),
    ],
    "accelerate": [*(f"0.{m}.0" for m in range(20, 35)), *(f"1.{m}.0" for m in range(0, 16))],
    "deepspeed": [*(f"0.{m}.0" for m in range(10, 20)), "0.19.8"],
    "torch": [*(f"2.{m}.0" for m in range(0, 14))],
    "lightning": [*(f"2.{m}.0" for m in range(0, 7)), "2.6.6"],
    "peft": [*(f"0.{m}.0" for m in range(5, 22)), "0.21.2"],
    "diffusers": [*(f"0.{m}.0" for m in range(3, 43)), "0.42.1"],
}

_ROOT_MARKERS = (".git", ".hg")

def repo_root(d: str) -> Optional[str]:
    """The nearest folder at or above ``d`` holding a repository marker (``.git``/``.hg``), or None."""
    cur = d
    for _ in range(40):
        if any(os.path.exists(os.path.join(cur, m)) for m in _ROOT_MARKERS):
            return cur
        parent = os.path.dirname(cur)
        if parent == cur:
            return None
        cur = parent
    return None


INSTALLED = "installed"
ASSUMED = "assumed current release"


def severity_for(severity, *tvs):
    """A version-dependent finding's severity: an error (``Severity.ERROR`` or "E") that rests on a fallback
    version (:attr:`TargetVersion.assumed`) becomes a warning; anything else is unchanged."""
    if any(tv is not None and (tv.assumed or tv.disagrees is not None) for tv in tvs) and \
            str(getattr(severity, "value", severity)) == "E":
        from bertlint.types import Severity

        return Severity.WARNING
    return severity


def reaching(tv, pred):
    """The target version on which ``pred`` holds: ``tv`` itself, else the disagreeing pin of the same folder
    (:attr:`TargetVersion.disagrees`) when ``pred`` holds there; None when on neither."""
    if tv is None:
        return None
    if pred(tv):
        return tv
    other = tv.disagrees
    if other is not None and pred(other):
        return other
    return None


def describe_reaching(tv, hit, elsewhere: str) -> str:
    """``hit.describe()`` for a finding that holds on ``hit`` (from :func:`reaching`); when that is the disagreeing pin
    rather than ``tv``, the text names both and says what happens on ``tv`` (``elsewhere``)."""
    if hit is tv:
        return tv.describe()
    return (f"{hit.package} {hit.text} ({hit.source}; {tv.source.rpartition(' in ')[2]} pins {tv.text}, "
            f"{elsewhere}: the project's pin files disagree)")


def parse_version(text: str) -> Optional[tuple[int, ...]]:
    """``"4.46.0"`` -> (4, 46, 0); ``"5.0.0rc1"`` -> (5, 0, 0); ``"2.13.0+cpu"`` -> (2, 13, 0). None if unreadable."""
    m = re.match(r"\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        return None
    parts = tuple(int(p) for p in m.group(1).split("."))
    return (parts + (0, 0, 0))[:3] if len(parts) < 3 else parts[:3]


def vstr(v: tuple[int, ...]) -> str:
    return ".".join(str(p) for p in v)


@dataclass(frozen=True)
class TargetVersion:
    package: str
    version: tuple[int, ...]
    source: str  # "pinned in requirements.txt:3", "installed", "[tool.bertlint] target-versions", ...
    exact: bool = True
    spec: Optional[str] = None  # the specifier as written, for ranges
    lowest: Optional[tuple[int, ...]] = None  # lower bound of a range, if any
    # False when the project pins the package to something whose release cannot be read (a source install at a
    # commit or branch: ``git+https://github.com/huggingface/transformers@a6e6b1c``). ``version`` is then only the
    # fallback (installed / current); no comparison is decided on it: :meth:`at_least` and :meth:`below` are both
    # False, so a version-gated finding stays silent rather than resting on a version the project does not run.
    known: bool = True
    # another pin file of the same folder whose specifier excludes ``version`` (``requirements.txt`` pins 4.45.1,
    # ``pyproject.toml`` asks for >=4.57.1): the project does not say which of the two it runs. ``version`` stays the
    # first file's; a finding that holds on only one of them names both (:func:`reaching`), and an error resting on
    # such a version is a warning (:func:`severity_for`).
    disagrees: Optional["TargetVersion"] = None

    @property
    def text(self) -> str:
        return vstr(self.version)

    def at_least(self, v: str) -> bool:
        if not self.known:
            return False
        return self.version >= (parse_version(v) or (0,))

    def below(self, v: str) -> bool:
        if not self.known:
            return False
        return not self.at_least(v)

    def between(self, lo: str, hi_exclusive: str) -> bool:
        return self.at_least(lo) and self.below(hi_exclusive)

    @property
    def assumed(self) -> bool:
        """No ``target-versions`` and no pin near the script: the version is the one installed beside bertlint, or
        bertlint's current release, not evidence about the script. Version-dependent findings resting on it say so
        and are never errors (:func:`severity_for`)."""
        return self.source in (INSTALLED, ASSUMED) or not self.known

    def describe(self) -> str:
        """``transformers 5.24.0 (pinned in requirements.txt:3)``; for a fallback version the text says that it is
        bertlint's own environment, not the script's."""
        if not self.known:
            return f"{self.package} at an unknown release ({self.source})"
        if self.assumed:
            what = "installed beside bertlint" if self.source == INSTALLED else "bertlint's current release"
            return (f"{self.package} {self.text} ({what}: no pin near the script and no `[tool.bertlint] "
                    f"target-versions`, so the version the script runs with is not known)")
        if self.disagrees is not None:
            o = self.disagrees
            return (f"{self.package} {self.text} ({self.source}; but {o.source.rpartition(' in ')[2]} asks for "
                    f"`{self.package}{o.spec or '==' + o.text}`, which excludes it: the project's pin files disagree)")
        return f"{self.package} {self.text} ({self.source})"

    @property
    def major(self) -> int:
        return self.version[0]


@dataclass
class Versions:
    """Target version per package; ``versions["transformers"]`` or ``versions.transformers``."""

    by_package: dict[str, TargetVersion] = field(default_factory=dict)
    resolver: Optional[Callable[[str], TargetVersion]] = field(default=None, repr=False, compare=False)
    packages: tuple = PACKAGES

    def __getitem__(self, package: str) -> TargetVersion:
        return self.get(package)

    def get(self, package: str) -> TargetVersion:
        package = _ALIASES.get(package, package)
        tv = self.by_package.get(package)
        if tv is None:
            if self.resolver is not None:
                tv = self.resolver(package)
            else:
                tv = TargetVersion(package, parse_version(CURRENT.get(package, "0")) or (0,), "assumed current release")
            self.by_package[package] = tv
        return tv

    def all(self) -> dict[str, TargetVersion]:
        """Every package, resolved."""
        for p in self.packages:
            self.get(p)
        return dict(self.by_package)

    @property
    def transformers(self) -> TargetVersion:
        return self.get("transformers")

    @property
    def accelerate(self) -> TargetVersion:
        return self.get("accelerate")

    @property
    def deepspeed(self) -> TargetVersion:
        return self.get("deepspeed")

    @property
    def torch(self) -> TargetVersion:
        return self.get("torch")

    @property
    def lightning(self) -> TargetVersion:
        return self.get("lightning")

    @property
    def peft(self) -> TargetVersion:
        return self.get("peft")


# ---------------------------------------------------------------------------------------------------------------
# specifiers

_SPEC_RE = re.compile(r"(===|==|~=|!=|<=|>=|<|>|=)\s*([0-9][0-9A-Za-z.*+!-]*)")


def _clauses(spec: str) -> list[tuple[str, str]]:
    return [(op, v) for op, v in _SPEC_RE.findall(spec)]


def _matches(v: tuple[int, ...], clauses: list[tuple[str, str]]) -> bool:
    for op, text in clauses:
        wildcard = text.endswith(".*")
        pv = parse_version(text.rstrip(".*"))
        if pv is None:
            return False
        if op in ("==", "===", "=") and wildcard:
            n = len(text.rstrip(".*").split("."))
            if v[:n] != pv[:n]:
                return False
        elif op in ("==", "===", "="):
            if v != pv:
                return False
        elif op == "!=":
            if wildcard:
                n = len(text.rstrip(".*").split("."))
                if v[:n] == pv[:n]:
                    return False
            elif v == pv:
                return False
        elif op == ">=" and not v >= pv:
            return False
        elif op == ">" and not v > pv:
            return False
        elif op == "<=" and not v <= pv:
            return False
        elif op == "<" and not v < pv:
            return False
        elif op == "~=":
            n = len(text.split("."))
            upper = list(pv[: max(n - 1, 1)])
            upper[-1] += 1
            if not (v >= pv and v < tuple(upper)):
                return False
    return True


def resolve_spec(package: str, spec: str, where: str) -> Optional[TargetVersion]:
    """A TargetVersion for ``spec`` (``"==4.46.3"``, ``">=4.46,<4.48"``, ``"4.46.3"``) read at ``where``."""
    spec = spec.strip()
    if not spec or spec == "*":
        return None
    if re.match(r"^\d", spec):  # bare version (conda "transformers=4.46.3" already split, settings "4.46.3")
        spec = "==" + spec
    clauses = _clauses(spec)
    if not clauses:
        return None
    exact = [c for c in clauses if c[0] in ("==", "===", "=") and not c[1].endswith(".*")]
    if len(exact) == 1 and len(clauses) == 1:
        v = parse_version(exact[0][1])
        return TargetVersion(package, v, f"pinned in {where}") if v else None
    lows = [parse_version(t.rstrip(".*")) for op, t in clauses if op in (">=", ">", "~=", "==", "===", "=")]
    lowest = max((lw for lw in lows if lw), default=None)
    candidates = set(parse_version(v) for v in _KNOWN.get(package, []))
    cur = parse_version(CURRENT.get(package, "0"))
    if cur:
        candidates.add(cur)
    if lowest:
        candidates.add(lowest)
    ok = sorted(c for c in candidates if c and c <= (cur or c) and _matches(c, clauses))
    text = f"`{package}{spec}`"
    if ok:
        return TargetVersion(package, ok[-1], f"newest release allowed by {text} in {where}", exact=False,
                             spec=spec, lowest=lowest)
    if lowest:
        return TargetVersion(package, lowest, f"lowest release allowed by {text} in {where}", exact=False,
                             spec=spec, lowest=lowest)
    return None


# ---------------------------------------------------------------------------------------------------------------
# pins near the script

_REQ_LINE = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*(.*)$")


_VCS = re.compile(r"(?:^|@\s*)git\+https?://[^@\s]*?/(?P<repo>[A-Za-z0-9_.\-]+?)(?:\.git)?@(?P<ref>[^\s#@]+)")
_TAG = re.compile(r"^v?(\d+\.\d+(?:\.\d+)?)$")


_UNKNOWN_REF = "@"  # the spec _vcs_pin gives a source install at a commit or branch: a pin whose release is unknown


def _vcs_pin(line: str) -> Optional[tuple[str, str]]:
    """``git+https://github.com/huggingface/transformers@v4.30.0`` (or ``transformers @ git+...@v4.30.0``): a source
    install at a release tag pins that release. A branch or commit pins the package too, but does not say which
    release it is: ``(package, "@<ref>")``, read as a pin of unknown release (:func:`_unknown_pin`)."""
    m = _VCS.search(line)
    if not m:
        return None
    pkg = _ALIASES.get(m.group("repo").lower().replace("_", "-"))
    if pkg is None:
        return None
    t = _TAG.match(m.group("ref"))
    if not t:
        return pkg, _UNKNOWN_REF + m.group("ref")
    return pkg, "==" + t.group(1)


def _unknown_pin(package: str, spec: str, where: str) -> TargetVersion:
    """A pin whose release cannot be read (a commit or branch of a source install). Its ``version`` is only the
    fallback bertlint would otherwise assume; ``known`` is False so nothing is decided on it."""
    ref = spec[len(_UNKNOWN_REF):]
    fallback = installed(package)
    v = fallback.version if fallback is not None else (parse_version(CURRENT.get(package, "0")) or (0,))
    return TargetVersion(package, v, f"{where} installs it from source at `{ref[:12]}`, which does not name a release",
                         exact=False, spec=spec, known=False)


def _requirement(line: str) -> Optional[tuple[str, str]]:
    """``"transformers[torch]>=4.46,<4.48 ; python_version>'3'  # c"`` -> ("transformers", ">=4.46,<4.48")."""
    line = line.split("#", 1)[0].split(";", 1)[0].strip().strip("\"'").strip()
    vcs = _vcs_pin(line)
    if vcs is not None:
        return vcs
    if not line or line.startswith(("-", "git+", "http")):
        return None
    m = _REQ_LINE.match(line)
    if not m:
        return None
    name = m.group(1).lower().replace("_", "-")
    pkg = _ALIASES.get(name)
    if pkg is None:
        return None
    rest = m.group(2).strip()
    if rest.startswith("@"):
        return None
    if rest.startswith("=") and not rest.startswith("=="):  # conda: transformers=4.46.3
        rest = "==" + rest[1:].split("=")[0]
    return pkg, rest


def _scan_requirements(path: str, rel: str) -> dict[str, TargetVersion]:
    out: dict[str, TargetVersion] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for i, line in enumerate(lines, 1):
        r = _requirement(line)
        if r and r[0] not in out:
            tv = _resolve_pin(r[0], r[1], f"{rel}:{i}")
            if tv:
                out[r[0]] = tv
    return out


def _resolve_pin(package: str, spec: str, where: str) -> Optional[TargetVersion]:
    if spec.startswith(_UNKNOWN_REF):
        return _unknown_pin(package, spec, where)
    return resolve_spec(package, spec, where)


def _scan_quoted(path: str, rel: str) -> dict[str, TargetVersion]:
    """pyproject.toml / setup.cfg / setup.py: any quoted requirement string or ``name = "spec"`` (poetry) line."""
    is_setup_py = path.endswith("setup.py")
    out: dict[str, TargetVersion] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    section = ""
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if is_setup_py and s.startswith("#"):
            continue
        if s.startswith("[") and not is_setup_py:
            section = s
            continue
        if "tool.bertlint" in section:
            continue
        found: list[tuple[str, str]] = []
        for q in re.findall(r"[\"']([^\"']+)[\"']", s):
            r = _requirement(q)
            if r:
                found.append(r)
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*=\s*[\"']([^\"']*)[\"']", s)  # poetry: transformers = "^4.46"
        if m and _ALIASES.get(m.group(1).lower()) and "dependencies" in section:
            spec = m.group(2).strip()
            if spec.startswith("^"):
                base = parse_version(spec[1:])
                if base:
                    nxt = (base[0] + 1, 0, 0) if base[0] > 0 else (0, base[1] + 1, 0)
                    spec = f">={spec[1:]},<{vstr(nxt)}"
            found.append((_ALIASES[m.group(1).lower()], spec))
        if path.endswith("setup.cfg") and not found:
            r = _requirement(s)
            if r and ("install_requires" in s or line.startswith((" ", "\t"))):
                found.append(r)
        for pkg, spec in found:
            if pkg not in out:
                tv = _resolve_pin(pkg, spec, f"{rel}:{i}")
                if tv:
                    out[pkg] = tv
    return out


def _scan_environment(path: str, rel: str) -> dict[str, TargetVersion]:
    out: dict[str, TargetVersion] = {}
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for i, line in enumerate(lines, 1):
        s = line.strip()
        if not s.startswith("- "):
            continue
        s = s[2:].strip().strip("\"'")
        if ":" in s:
            continue
        s = s.split("::")[-1]
        r = _requirement(s)
        if r and r[0] not in out:
            tv = _resolve_pin(r[0], r[1], f"{rel}:{i}")
            if tv:
                out[r[0]] = tv
    return out


def _pins_in_dir(directory: str) -> dict[str, TargetVersion]:
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    out: dict[str, TargetVersion] = {}

    def merge(found: dict[str, TargetVersion]) -> None:
        for k, v in found.items():
            first = out.get(k)
            if first is None:
                out[k] = v
            elif first.disagrees is None and first.known and v.known and not _allows(v, first.version):
                out[k] = _replace(first, disagrees=v)

    for n in names:
        p = os.path.join(directory, n)
        if n.startswith("requirement") and n.endswith((".txt", ".in")) and os.path.isfile(p):
            merge(_scan_requirements(p, n))
    for n in ("pyproject.toml", "setup.cfg", "setup.py"):
        p = os.path.join(directory, n)
        if os.path.isfile(p):
            merge(_scan_quoted(p, n))
    for n in ("environment.yml", "environment.yaml"):
        p = os.path.join(directory, n)
        if os.path.isfile(p):
            merge(_scan_environment(p, n))
    for k, v in _scan_self(directory).items():
        out[k] = v  # the project is the package (a fork): its own version, whatever else the folder asks for
    return out


_SETUP_NAME = re.compile(r"""^\s*name\s*=\s*["']([A-Za-z0-9_.\-]+)["']\s*,?\s*(?:#.*)?$""", re.M)
_SETUP_VERSION = re.compile(r"""^\s*version\s*=\s*["']([0-9][0-9A-Za-z.+!_-]*)["']\s*,?\s*(?:#.*)?$""", re.M)


def _scan_self(directory: str) -> dict[str, TargetVersion]:
    """A folder whose own ``setup.py`` / ``pyproject.toml`` builds one of the packages (``setup(name="transformers",
    version="4.9.0.dev0", package_dir={"": "src"})``: a research fork of transformers with its scripts beside it):
    the scripts of that project run against the fork (installed from it), so its version is theirs. The version is
    the one the file states (a literal ``version=`` in ``setup()`` or ``[project]``); a name without a literal
    version (read from a file at build time) gives nothing."""
    out: dict[str, TargetVersion] = {}
    for n in ("setup.py", "pyproject.toml"):
        path = os.path.join(directory, n)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        if n == "pyproject.toml":
            m = re.search(r"^\[project\]\s*$(.*?)(?=^\[|\Z)", text, re.M | re.S)
            if m is None:
                continue
            body, offset = m.group(1), m.start(1)
        else:
            body, offset = text, 0
        names = _SETUP_NAME.findall(body)
        if len(set(names)) != 1:
            continue  # no name, or several (a setup.py building more than one thing): not read
        pkg = _ALIASES.get(names[0].lower())
        if pkg is None or pkg in out:
            continue
        vm = _SETUP_VERSION.search(body)
        version = parse_version(vm.group(1)) if vm is not None else None
        if version:
            where = f"{n}:{text.count(chr(10), 0, offset + vm.start(1)) + 1}"
            out[pkg] = TargetVersion(pkg, version, f"the project builds {names[0]} itself: {where}")
    return out


def _allows(tv: TargetVersion, version: tuple) -> bool:
    """Does the pin ``tv`` (its specifier, or its exact version) admit ``version``?"""
    clauses = _clauses(tv.spec) if tv.spec else [("==", tv.text)]
    return not clauses or _matches(version, clauses)


def _replace(tv: TargetVersion, **changes) -> TargetVersion:
    import dataclasses

    return dataclasses.replace(tv, **changes)


def _is_pin_file(name: str) -> bool:
    return (name.startswith("requirement") and name.endswith((".txt", ".in"))) or name in (
        "pyproject.toml", "setup.cfg", "setup.py", "environment.yml", "environment.yaml")


def _chain(directory: str) -> list[str]:
    """``directory`` and its parents up to the repository root."""
    out = []
    d = os.path.abspath(directory or ".")
    for _ in range(40):
        out.append(d)
        if any(os.path.exists(os.path.join(d, m)) for m in _ROOT_MARKERS):
            break
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    return out


def _signature(directory: str) -> tuple:
    """The pin files above ``directory`` with their modification times: the cache key (an edited requirements file
    is read again, e.g. by the language server)."""
    sig = []
    for d in _chain(directory):
        try:
            names = os.listdir(d)
        except OSError:
            continue
        for n in sorted(names):
            if _is_pin_file(n):
                try:
                    sig.append((d, n, os.stat(os.path.join(d, n)).st_mtime_ns))
                except OSError:
                    pass
    return tuple(sig)


@lru_cache(maxsize=256)
def _pins_for(directory: str, signature: tuple) -> tuple[tuple[str, TargetVersion], ...]:
    found: dict[str, TargetVersion] = {}
    for d in _chain(directory):
        for k, v in _pins_in_dir(d).items():
            found.setdefault(k, v)
    return tuple(found.items())


def pins_near(directory: str) -> tuple[tuple[str, TargetVersion], ...]:
    """Pins from ``directory`` upward to the repository root (nearest wins), re-read when a pin file changes."""
    return _pins_for(os.path.abspath(directory or "."), _signature(directory))


pins_near.cache_clear = _pins_for.cache_clear  # type: ignore[attr-defined]


_UNDECIDED = object()
_PLAIN_VERSION = re.compile(r"[0-9A-Za-z.+!_-]+")
_HEADER_LINE = re.compile(r"[\x21-\x39\x3b-\x7e]+:")


def _dist_version_fast(name: str):
    """What ``importlib.metadata.version(name)`` answers, read the way it searches (the ``*.dist-info`` /
    ``*.egg-info`` folders of the ``sys.path`` directories, first match wins) without importing it (tens of
    milliseconds): the version string, None when no distribution of that name is installed, or ``_UNDECIDED``
    whenever the layout is anything but the plain case (another distribution finder, a zip or ``.egg`` on the path,
    two matches in one folder, a metadata file that is not a plain ``Version:`` header), where the caller asks
    ``importlib.metadata`` itself."""
    import sys
    from importlib.machinery import PathFinder

    for f in sys.meta_path:
        if f is not PathFinder and getattr(f, "find_distributions", None) is not None:
            return _UNDECIDED
    want = re.sub(r"[-_.]+", "-", name).lower().replace("-", "_")
    for entry in sys.path:
        root = entry or "."
        if os.path.basename(root).lower().endswith(".egg"):
            return _UNDECIDED
        try:
            children = os.listdir(root)
        except OSError:
            if os.path.isfile(root):
                return _UNDECIDED  # a zip archive: importlib.metadata reads its entries
            continue
        hits = []
        for child in children:
            low = child.lower()
            if low.endswith((".dist-info", ".egg-info")):
                n = low.rpartition(".")[0].partition("-")[0]
                if re.sub(r"[-_.]+", "-", n).lower().replace("-", "_") == want:
                    hits.append(child)
        if not hits:
            continue
        if len(hits) > 1:
            return _UNDECIDED
        meta = os.path.join(root, hits[0], "METADATA" if hits[0].lower().endswith(".dist-info") else "PKG-INFO")
        try:
            with open(meta, encoding="utf-8") as fh:
                for line in fh:
                    if line in ("\n", "\r\n"):
                        break  # end of the headers: no Version header
                    if not _HEADER_LINE.match(line):
                        return _UNDECIDED  # a continuation or malformed line: the email parser's rules
                    if line[:8].lower() == "version:":
                        value = line[8:].strip()
                        nxt = next(fh, "")
                        if line.startswith("Version:") and _PLAIN_VERSION.fullmatch(value) \
                                and not nxt.startswith((" ", "\t")):
                            return value
                        return _UNDECIDED
        except (OSError, UnicodeDecodeError):
            pass
        return _UNDECIDED
    return None


@lru_cache(maxsize=None)
def installed(package: str) -> Optional[TargetVersion]:
    names = {"lightning": ("lightning", "pytorch-lightning")}.get(package, (package,))
    for n in names:
        fast = _dist_version_fast(n)
        if fast is None:
            continue
        if fast is not _UNDECIDED:
            v = parse_version(fast)
        else:
            try:
                from importlib import metadata
            except ImportError:  # pragma: no cover
                return None
            try:
                v = parse_version(metadata.version(n))
            except Exception:
                continue
        if v:
            return TargetVersion(package, v, INSTALLED)
    return None


def resolve(filename: Optional[str], settings=None, packages: Iterable[str] = PACKAGES,
            use_installed: bool = True) -> Versions:
    """The target versions for the script ``filename``. Each package is resolved when first asked for (reading
    the installed distributions costs tens of milliseconds); ``by_package`` holds those resolved so far, and
    :meth:`Versions.all` resolves every package."""
    configured = dict(getattr(settings, "target_versions", None) or {})
    directory = os.path.dirname(os.path.abspath(filename)) if filename and filename not in ("-", "<stdin>") else None
    pins_cache: list = []

    def one(pkg: str) -> TargetVersion:
        tv = None
        raw = configured.get(pkg)
        if raw is None and pkg == "lightning":
            raw = configured.get("pytorch-lightning") or configured.get("pytorch_lightning")
        if raw is not None:
            tv = resolve_spec(pkg, str(raw), "[tool.bertlint] target-versions")
            if tv is not None and tv.exact:
                tv = TargetVersion(pkg, tv.version, "[tool.bertlint] target-versions")
        if tv is None:
            if not pins_cache:
                pins_cache.append(dict(pins_near(directory)) if directory and os.path.isdir(directory) else {})
            tv = pins_cache[0].get(pkg)
        if tv is None and use_installed:
            tv = installed(pkg)
        if tv is None:
            tv = TargetVersion(pkg, parse_version(CURRENT.get(pkg, "0")) or (0,), ASSUMED)
        return tv

    return Versions(resolver=one, packages=tuple(packages))
