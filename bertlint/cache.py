"""The command line's result cache (as ruff's): ``.bertlint_cache/`` in the working folder (``--cache-dir``,
``BERTLINT_CACHE_DIR``), git-ignored by a ``.gitignore`` inside it; ``--no-cache`` or ``BERTLINT_NO_CACHE=1``
skips it.

One entry per linted file, in one bucket file per source folder (``bertlint FILE`` reads one small file; a run over
a repository reads one per folder). An entry is used when its key matches and the files the lint read besides the
file itself (a DeepSpeed JSON it names, a local ``config.json``, a launcher configuration) are unchanged. The key
hashes:

- the file's content (BLAKE2b of its bytes);
- bertlint: its version, the Python version, the size and modification time of every module and data file of
  the package, and each enabled rule's code object (a rule edited in a checkout or registered by a test);
- the effective settings for the file (selection, ignores, per-file ignores, target versions, world size, the
  configuration file);
- what the version discovery reads: the pin files above the file (``requirements*.txt``, ``pyproject.toml`` ...;
  their modification times, from ``bertlint.analysis.versions``) and the pins it resolved from them, and the
  installed distributions (the names of the training frameworks' ``*.dist-info`` folders on ``sys.path``, which
  carry their versions);
- the launcher and configuration files beside the file (``*.json``, ``*.yaml``, ``*.sh`` ... in its folder and in
  ``configs/``, ``config/``, ``accelerate_configs/``: names, sizes, modification times).

Files that mention no training machinery are not cached: they are not parsed, so looking them up would cost more.
Only plain linting is cached (``--fix`` / ``--diff`` use an entry only when it has nothing to fix); ``--verify``,
standard input and the language server never use the cache.
"""

from __future__ import annotations

import json
import os
import re
import sys
from typing import Any, Optional

try:  # hashlib's blake2b is this one; importing hashlib also loads OpenSSL's _hashlib (~6 ms), which the cache never uses
    from _blake2 import blake2b
except ImportError:  # an interpreter built without it
    from hashlib import blake2b

from bertlint.types import Applicability, Diagnostic, Edit, Fix, Position, Severity, Verification

CACHE_DIR = ".bertlint_cache"
FORMAT = 1


def disabled_by_env() -> bool:
    return os.environ.get("BERTLINT_NO_CACHE", "") not in ("", "0")


# ------------------------------------------------------------------------------------------- (de)serialise


def _pos(p: Position) -> list[int]:
    return [p.row, p.column]


def diag_to_obj(d: Diagnostic) -> dict:
    o: dict[str, Any] = {
        "c": d.code, "n": d.name, "s": d.severity.value, "m": d.message, "f": d.filename,
        "a": _pos(d.start), "b": _pos(d.end),
    }
    if d.cell is not None:
        o["cell"] = d.cell
    if d.fix is not None:
        o["fix"] = [d.fix.message, d.fix.applicability.value, [[e.content, _pos(e.start), _pos(e.end)] for e in d.fix.edits]]
    if d.verification is not None:
        o["v"] = [d.verification.status, d.verification.evidence]
    data = _json_data(d.data)
    if data:
        o["d"] = data
    return o


def _json_data(data: dict) -> Optional[dict]:
    """The JSON-safe part of ``Diagnostic.data`` (what a rule attaches for explain / the verifier)."""
    if not data:
        return None
    try:
        json.dumps(data)
        return data
    except (TypeError, ValueError):
        out = {}
        for k, v in data.items():
            try:
                json.dumps(v)
            except (TypeError, ValueError):
                continue
            out[k] = v
        return out


def diag_from_obj(o: dict, filename: str) -> Diagnostic:
    fix = None
    if "fix" in o:
        msg, app, edits = o["fix"]
        fix = Fix(msg, Applicability(app), tuple(Edit(c, Position(*a), Position(*b)) for c, a, b in edits))
    return Diagnostic(
        o["c"], o["n"], Severity(o["s"]), o["m"], filename, Position(*o["a"]), Position(*o["b"]), fix,
        o.get("cell"), Verification(*o["v"]) if "v" in o else None, dict(o.get("d") or {}),
    )


# ------------------------------------------------------------------------------------------------- keys




def _package_stamp() -> list:
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    for dirpath, dirnames, filenames in os.walk(here):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for n in sorted(filenames):
            if n.endswith((".py", ".json", ".md", ".toml")):
                try:
                    st = os.stat(os.path.join(dirpath, n))
                except OSError:
                    continue
                out.append([os.path.relpath(os.path.join(dirpath, n), here), st.st_size, st.st_mtime_ns])
    return out


def _rules_stamp() -> list:
    from bertlint.registry import ENGINE_CODES, all_rules

    out: list = sorted(ENGINE_CODES)
    for r in all_rules():
        fn = r.check
        code = getattr(fn, "__code__", None)
        body = _code_digest(code) if code is not None else ""
        out.append([r.meta.code, getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""), body,
                    r.meta.default_enabled, list(r.meta.targets)])
    return out


def _code_digest(code) -> str:
    """A code object's bytecode and constants (nested functions' too), without memory addresses."""
    h = blake2b(digest_size=8)

    def feed(c, depth=0):
        h.update(c.co_code)
        h.update(repr(c.co_names).encode())
        for k in c.co_consts:
            if hasattr(k, "co_code"):
                if depth < 20:
                    feed(k, depth + 1)
            else:
                h.update(repr(k).encode())

    feed(code)
    return h.hexdigest()


def global_key() -> str:
    """bertlint itself: version, Python, the package's files, the registered rules (once per run)."""
    from bertlint import __version__

    blob = json.dumps([FORMAT, __version__, sys.version, _package_stamp(), _rules_stamp(),
                       bool(os.environ.get("BERTLINT_NO_PROJECT"))])  # (the project's modules not read: other results)
    return blake2b(blob.encode(), digest_size=16).hexdigest()


def settings_key(settings) -> str:
    from bertlint.config import settings_table

    return json.dumps([settings_table(settings), settings.config_path], sort_keys=True)


_INSTALLED: Optional[list] = None
_DIST = re.compile(
    r"^(torch|transformers|accelerate|deepspeed|lightning|pytorch_lightning|peft|trl)-[^-]+\.(dist|egg)-info$", re.I
)


def _installed_stamp() -> list:
    """The installed distributions the version discovery reads (``importlib.metadata``), cheaply: the names of
    their ``*.dist-info`` folders on ``sys.path`` (the name carries the version). Reading the versions through
    ``importlib.metadata`` costs tens of milliseconds."""
    global _INSTALLED
    if _INSTALLED is None:
        out = []
        for p in sys.path:
            try:
                names = os.listdir(p or ".")
            except OSError:
                continue
            out.extend(sorted(n for n in names if _DIST.match(n)))
        _INSTALLED = out
    return _INSTALLED


_CONFIG_SUFFIXES = (".json", ".yaml", ".yml", ".sh", ".bash", ".slurm", ".toml", ".cfg", ".txt", ".in")
_CONFIG_SUBDIRS = ("", "configs", "config", "accelerate_configs")


def _folder_stamp(directory: str) -> list:
    out = []
    for sub in _CONFIG_SUBDIRS:
        d = os.path.join(directory, sub) if sub else directory
        try:
            with os.scandir(d) as it:
                entries = sorted((e for e in it if e.name.endswith(_CONFIG_SUFFIXES)), key=lambda e: e.name)
                for e in entries:
                    try:
                        st = e.stat()
                    except OSError:
                        continue
                    out.append([sub, e.name, st.st_size, st.st_mtime_ns])
        except OSError:
            continue
    return out


class Cache:
    def __init__(self, root: str) -> None:
        self.root = root
        self.dir = os.path.join(root, f"v{FORMAT}")
        self.buckets: dict[str, dict] = {}
        self.dirty: set[str] = set()
        self.folder_keys: dict[str, str] = {}
        self.global_key: Optional[str] = None
        self.dir_pins: dict[str, tuple] = {}
        self.chains: dict[str, tuple] = {}
        self.resolved: dict[tuple, list] = {}
        self.hits = 0
        self.misses = 0
        self.usable = True

    # ---- keys
    def _dir_pins(self, d: str) -> tuple:
        """(pin files of ``d`` with size and mtime, whether ``d`` is a repository root), one listing per folder."""
        hit = self.dir_pins.get(d)
        if hit is None:
            from bertlint.analysis import versions

            try:
                names = os.listdir(d)
            except OSError:
                names = []
            pins = []
            for n in sorted(names):
                if versions._is_pin_file(n):
                    try:
                        st = os.stat(os.path.join(d, n))
                    except OSError:
                        continue
                    pins.append((d, n, st.st_size, st.st_mtime_ns))
            root = any(m in names for m in versions._ROOT_MARKERS)
            hit = self.dir_pins[d] = (tuple(pins), root)
        return hit

    def _chain(self, d: str) -> tuple:
        """The pin files from ``d`` up to the repository root, as ``versions._signature`` walks them."""
        hit = self.chains.get(d)
        if hit is None:
            pins, root = self._dir_pins(d)
            parent = os.path.dirname(d)
            hit = pins if root or parent == d else pins + self._chain(parent)
            self.chains[d] = hit
        return hit

    def versions_key(self, directory: str) -> list:
        """What ``bertlint.analysis.versions`` reads for a script in ``directory``: the pin files above it (names,
        sizes, modification times), the pins it resolves from them (asked once per distinct set of pin files), and
        the installed frameworks."""
        try:
            chain = self._chain(directory)
            pins = self.resolved.get(chain)
            if pins is None:
                from bertlint.analysis import versions

                pins = self.resolved[chain] = [[k, v.text, v.source, v.exact] for k, v in versions.pins_near(directory)]
        except Exception as e:  # the analysis is being changed under us: do not cache rather than guess
            return [f"unavailable: {type(e).__name__}: {e}", os.urandom(8).hex()]
        return [[list(p) for p in chain], pins, _installed_stamp()]

    def key(self, path: str, data: bytes, settings) -> str:
        directory = os.path.dirname(os.path.abspath(path))
        fk = self.folder_keys.get(directory)
        if fk is None:
            blob = json.dumps([_folder_stamp(directory), self.versions_key(directory)])
            fk = self.folder_keys[directory] = blake2b(blob.encode(), digest_size=16).hexdigest()
        if self.global_key is None:
            self.global_key = global_key()
        h = blake2b(digest_size=20)
        h.update(self.global_key.encode())
        h.update(fk.encode())
        h.update(settings_key(settings).encode())
        h.update(os.path.abspath(path).encode())
        h.update(b"\0")
        h.update(data)
        return h.hexdigest()

    # ---- buckets: one JSON file per source folder
    def _bucket_name(self, path: str) -> str:
        d = os.path.dirname(os.path.abspath(path))
        return blake2b(d.encode(), digest_size=10).hexdigest() + ".json"

    def _bucket(self, name: str) -> dict:
        b = self.buckets.get(name)
        if b is None:
            try:
                with open(os.path.join(self.dir, name), encoding="utf-8") as f:
                    b = json.load(f)
                if not isinstance(b, dict):
                    b = {}
            except (OSError, ValueError):
                b = {}
            self.buckets[name] = b
        return b

    def get(self, path: str, key: str) -> Optional[dict]:
        entry = self._bucket(self._bucket_name(path)).get(os.path.abspath(path))
        if not isinstance(entry, dict) or entry.get("k") != key:
            self.misses += 1
            return None
        for dep in entry.get("deps", ()):
            if _stat(dep[0]) != dep[1:]:
                self.misses += 1
                return None
        self.hits += 1
        return entry

    def put(self, path: str, key: str, diagnostics: list, warnings: list, deps: list) -> None:
        name = self._bucket_name(path)
        self._bucket(name)[os.path.abspath(path)] = {
            "k": key,
            "deps": deps,
            "diags": [diag_to_obj(d) for d in diagnostics],
            "warnings": list(warnings),
        }
        self.dirty.add(name)

    def save(self) -> None:
        if not self.dirty or not self.usable:
            return
        try:
            os.makedirs(self.dir, exist_ok=True)
            ignore = os.path.join(self.root, ".gitignore")
            if not os.path.exists(ignore):
                with open(ignore, "w", encoding="utf-8") as f:
                    f.write("# Automatically created by bertlint.\n*\n")
            tag = os.path.join(self.root, "CACHEDIR.TAG")
            if not os.path.exists(tag):
                with open(tag, "w", encoding="utf-8") as f:
                    f.write("Signature: 8a477f597d28d172789f06886806bc55\n# bertlint's result cache\n")
            for name in sorted(self.dirty):
                _write(os.path.join(self.dir, name), json.dumps(self.buckets[name], separators=(",", ":")).encode())
        except OSError:
            self.usable = False  # a read-only folder: run without the cache, as if --no-cache
        self.dirty.clear()


def _write(path: str, data: bytes) -> None:
    """Temporary file + rename (a reader never sees half a bucket); no fsync: a lost entry is only a miss."""
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def _stat(path: str) -> list:
    try:
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns]
    except OSError:
        return [None, None]


# ------------------------------------------------------------------------- what a lint read (dependencies)

_RECORD: Optional[set] = None
_HOOKED = False
_SKIP_PREFIXES: tuple = ((), ())


def _hook(event: str, args: tuple) -> None:
    if _RECORD is None or event != "open":
        return
    path = args[0]
    if not isinstance(path, str):
        return
    mode = args[1] if len(args) > 1 else "r"
    if isinstance(mode, str) and any(c in mode for c in "wax+"):
        return
    if path.startswith(_SKIP_PREFIXES[0]) or "__path_hook__" in path:
        return  # the Python installation and its packages (an install changes the sys.path stamp), bertlint itself
    if path.endswith((".pyc", ".py", ".so", ".zip")) and path.startswith(_SKIP_PREFIXES[1]):
        return  # an import
    _RECORD.add(path)


def start_recording() -> None:
    """Record the files opened for reading until ``stop_recording`` (an audit hook; cheap when idle)."""
    global _RECORD, _HOOKED, _SKIP_PREFIXES
    if not _HOOKED:
        here = os.path.dirname(os.path.abspath(__file__))
        installation = tuple({here, sys.prefix, sys.base_prefix, sys.exec_prefix})
        _SKIP_PREFIXES = (installation, tuple(p for p in sys.path if p))
        sys.addaudithook(_hook)
        _HOOKED = True
    _RECORD = set()


def stop_recording(target: str) -> list:
    """[[path, size, mtime_ns], ...] of the files read since ``start_recording`` (the target itself and
    bertlint's own data files excluded)."""
    global _RECORD
    seen = _RECORD or set()
    _RECORD = None
    here = os.path.dirname(os.path.abspath(__file__))
    me = os.path.abspath(target)
    out = []
    for p in sorted(seen):
        ap = os.path.abspath(p)
        if ap == me or ap.startswith(here + os.sep):
            continue
        out.append([ap, *_stat(ap)])
    return out


def note_dependency(path: str) -> None:
    """A file the analysis read on purpose (a sibling module of the project, ``bertlint.analysis.project``):
    recorded while a lint is recorded, whether or not this process had it parsed already (then no ``open`` is
    seen) and whatever folder it lies in (the audit hook skips ``.py`` files on ``sys.path``)."""
    if _RECORD is not None:
        _RECORD.add(path)
