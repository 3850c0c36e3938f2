"""Configuration: ``[tool.bertlint]`` in the nearest pyproject.toml (or bertlint.toml) above each file.

A ``pyproject.toml`` without a ``[tool.bertlint]`` table is skipped (as ruff does); a ``bertlint.toml`` holds
the keys at its top level (or under ``[tool.bertlint]``). An unknown key or a wrong type raises ``ConfigError``
naming the file and the key; the CLI turns it into exit 2.
"""

from __future__ import annotations

import os
import re
from bertlint._dataclass import dataclass, field, replace
from typing import Any, Optional


class ConfigError(Exception):
    """A configuration problem: exit 2 with the file and key named."""


# The packages whose versions the analyses know about (``target-versions``).
KNOWN_PACKAGES = ("torch", "transformers", "accelerate", "deepspeed", "lightning", "pytorch-lightning", "peft", "trl", "diffusers")

_CODE = re.compile(r"^(ALL|BL[0-9]{0,3})$")
_VERSION = re.compile(r"^[0-9]+(\.[0-9]+)*([a-zA-Z0-9.+!-]*)$")

CONFIG_KEYS = (
    "select",
    "ignore",
    "extend-select",
    "per-file-ignores",
    "exclude",
    "extend-exclude",
    "target-versions",
    "world-size",
)


@dataclass
class Settings:
    select: Optional[list[str]] = None  # None = every rule enabled by default
    ignore: list[str] = field(default_factory=list)
    extend_select: list[str] = field(default_factory=list)
    per_file_ignores: dict[str, list[str]] = field(default_factory=dict)
    exclude: list[str] = field(default_factory=list)
    # analysis settings: target versions {"transformers": "5.24.0", ...}, world size
    target_versions: dict[str, str] = field(default_factory=dict)
    world_size: Optional[int] = None
    config_path: Optional[str] = None  # where these settings came from

    @property
    def root(self) -> Optional[str]:
        """The folder of the configuration file (patterns are relative to it)."""
        return os.path.dirname(self.config_path) if self.config_path else None

    def is_enabled(self, code: str, default_enabled: bool = True) -> bool:
        def match(sel: list[str]) -> int:
            best = -1
            for s in sel:
                if s == "ALL" or code.startswith(s):
                    best = max(best, 0 if s == "ALL" else len(s))
            return best

        if not default_enabled:
            # rules that are off by default are enabled only by their exact code (not by ALL or a prefix)
            if code not in (self.select or ()) and code not in self.extend_select:
                return False
            sel_len = len(code)
        elif self.select is None:
            sel_len = 0
        else:
            sel_len = max(match(self.select), match(self.extend_select))
        sel_len = max(sel_len, match(self.extend_select))
        ign_len = match(self.ignore)
        return sel_len >= 0 and sel_len > ign_len if ign_len >= 0 else sel_len >= 0

    def with_cli(
        self,
        select: Optional[list[str]] = None,
        ignore: Optional[list[str]] = None,
        extend_select: Optional[list[str]] = None,
    ) -> "Settings":
        """Command-line options over the file's settings: ``--select`` replaces, the others extend."""
        s = replace(self)
        if select is not None:
            s.select = list(select)
            s.extend_select = []
        if extend_select:
            s.extend_select = [*s.extend_select, *extend_select]
        if ignore:
            s.ignore = [*s.ignore, *ignore]
        return s

    def for_file(self, filename: str) -> "Settings":
        """These settings with the ``per-file-ignores`` that match ``filename`` added to ``ignore``."""
        if not self.per_file_ignores:
            return self
        extra: list[str] = []
        for pattern, codes in self.per_file_ignores.items():
            if path_matches(filename, pattern, self.root):
                extra.extend(codes)
        if not extra:
            return self
        return replace(self, ignore=[*self.ignore, *extra])

    def is_excluded(self, path: str) -> bool:
        return any(path_matches(path, p, self.root) for p in self.exclude)


def path_matches(path: str, pattern: str, root: Optional[str]) -> bool:
    """Glob ``pattern`` against ``path``: the whole path relative to ``root`` (or the cwd), or any tail of it
    (so ``train.py`` and ``scripts/*.py`` match wherever the file lies)."""
    from fnmatch import fnmatchcase

    pattern = pattern.replace("\\", "/").rstrip("/")
    if pattern.startswith("./"):
        pattern = pattern[2:]
    ap = os.path.abspath(path)
    rel = None
    for base in (root, os.getcwd()):
        if base:
            try:
                r = os.path.relpath(ap, base)
            except ValueError:
                continue
            if not r.startswith(".."):
                rel = r
                break
    candidate = (rel if rel is not None else ap).replace(os.sep, "/")
    if fnmatchcase(candidate, pattern):
        return True
    parts = candidate.split("/")
    # any tail (``*.py`` matches a file anywhere) and any leading folder prefix (``data`` excludes ``data/x.py``)
    for i in range(len(parts)):
        if fnmatchcase("/".join(parts[i:]), pattern):
            return True
    for i in range(1, len(parts)):
        if fnmatchcase("/".join(parts[:i]), pattern):
            return True
    if pattern.startswith("**/") and fnmatchcase(candidate, pattern[3:]):
        return True
    return False


# ---------------------------------------------------------------------------------------------- loading


def _load_toml(path: str) -> dict:
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror or e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: invalid TOML: not UTF-8 text (byte offset {e.start})") from None


def _type_name(v: Any) -> str:
    return {
        str: "a string",
        int: "an integer",
        float: "a float",
        bool: "a boolean",
        list: "an array",
        dict: "a table",
    }.get(type(v), type(v).__name__)


def _codes(path: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ConfigError(
            f'{path}: [tool.bertlint] "{key}" must be an array of rule codes (strings), got {_type_name(value)}'
        )
    out = []
    for c in value:
        c = c.strip().upper()
        if not _CODE.match(c):
            raise ConfigError(
                f'{path}: [tool.bertlint] "{key}": "{c}" is not a rule code or prefix (expected ALL, BL, BL1, BL10, BL101 ...)'
            )
        out.append(c)
    return out


def _strings(path: str, key: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(c, str) for c in value):
        raise ConfigError(f'{path}: [tool.bertlint] "{key}" must be an array of strings, got {_type_name(value)}')
    return list(value)


def settings_from_table(table: Any, path: str) -> Settings:
    """Validate a ``[tool.bertlint]`` table; ``ConfigError`` names ``path`` and the key."""
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.bertlint] must be a table, got {_type_name(table)}")
    s = Settings(config_path=os.path.abspath(path))
    for key, value in table.items():
        if key not in CONFIG_KEYS:
            import difflib

            close = difflib.get_close_matches(key.replace("_", "-"), CONFIG_KEYS, n=1)
            hint = f' (did you mean "{close[0]}"?)' if close else ""
            raise ConfigError(
                f'{path}: [tool.bertlint] unknown key "{key}"{hint}; known keys: {", ".join(CONFIG_KEYS)}'
            )
        if key == "select":
            s.select = _codes(path, key, value)
        elif key == "ignore":
            s.ignore = _codes(path, key, value)
        elif key == "extend-select":
            s.extend_select = _codes(path, key, value)
        elif key in ("exclude", "extend-exclude"):
            s.exclude = [*s.exclude, *_strings(path, key, value)]
        elif key == "per-file-ignores":
            if not isinstance(value, dict):
                raise ConfigError(
                    f'{path}: [tool.bertlint] "per-file-ignores" must be a table of glob = [codes], got {_type_name(value)}'
                )
            s.per_file_ignores = {str(g): _codes(path, f"per-file-ignores.{g}", v) for g, v in value.items()}
        elif key == "target-versions":
            if not isinstance(value, dict):
                raise ConfigError(
                    f'{path}: [tool.bertlint] "target-versions" must be a table such as '
                    f'{{transformers = "4.46.3"}}, got {_type_name(value)}'
                )
            tv = {}
            for pkg, ver in value.items():
                if pkg not in KNOWN_PACKAGES:
                    raise ConfigError(
                        f'{path}: [tool.bertlint] "target-versions": unknown package "{pkg}"; '
                        f"known packages: {', '.join(KNOWN_PACKAGES)}"
                    )
                if not isinstance(ver, str) or not _VERSION.match(ver.strip()):
                    raise ConfigError(
                        f'{path}: [tool.bertlint] "target-versions.{pkg}" must be a version string such as "4.46.3", '
                        f"got {ver!r}"
                    )
                tv[pkg] = ver.strip()
            s.target_versions = tv
        elif key == "world-size":
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f'{path}: [tool.bertlint] "world-size" must be an integer, got {_type_name(value)}')
            if value < 1:
                raise ConfigError(f'{path}: [tool.bertlint] "world-size" must be >= 1, got {value}')
            s.world_size = value
    return s


def read_config_file(path: str) -> Optional[Settings]:
    """Settings from ``path`` (pyproject.toml or bertlint.toml); None for a pyproject.toml without our table."""
    data = _load_toml(path)
    tool = data.get("tool")
    table = tool.get("bertlint") if isinstance(tool, dict) else None
    if os.path.basename(path) == "pyproject.toml":
        if table is None:
            return None
        return settings_from_table(table, path)
    # bertlint.toml (or any file given with --config): [tool.bertlint] or top-level keys
    if table is None:
        table = {k: v for k, v in data.items() if k != "tool"}
    return settings_from_table(table, path)


_DIR_CACHE: dict[str, Optional[str]] = {}


def find_config(start: str) -> Optional[str]:
    """The nearest bertlint.toml / pyproject.toml with [tool.bertlint] at or above ``start`` (file or folder)."""
    d = os.path.abspath(start)
    if not os.path.isdir(d):
        d = os.path.dirname(d)
    visited = []
    found: Optional[str] = None
    while True:
        if d in _DIR_CACHE:
            found = _DIR_CACHE[d]
            break
        visited.append(d)
        hit = None
        for name in ("bertlint.toml", "pyproject.toml"):
            p = os.path.join(d, name)
            if os.path.isfile(p):
                if name == "pyproject.toml" and not _mentions_bertlint(p):
                    continue
                hit = p
                break
        if hit:
            found = hit
            break
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    for v in visited:
        _DIR_CACHE[v] = found
    return found


def _mentions_bertlint(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return b"tool.bertlint" in f.read()
    except OSError:
        return False


_SETTINGS_CACHE: dict[str, tuple[tuple, Settings]] = {}


def load_settings(path: str) -> Settings:
    """Settings for the file or folder ``path``: the nearest configuration above it, else the defaults.
    Re-read when the configuration file changes (a long-running language server sees edits)."""
    cfg = find_config(path)
    if cfg is None:
        return Settings()
    try:
        st = os.stat(cfg)
        stamp: tuple = (st.st_mtime_ns, st.st_size)
    except OSError:
        stamp = ()
    hit = _SETTINGS_CACHE.get(cfg)
    if hit is None or hit[0] != stamp:
        hit = (stamp, read_config_file(cfg) or Settings(config_path=os.path.abspath(cfg)))
        _SETTINGS_CACHE[cfg] = hit
    return hit[1]


def clear_caches() -> None:
    _DIR_CACHE.clear()
    _SETTINGS_CACHE.clear()


# ------------------------------------------------------------------------------------ --config KEY=VALUE


def parse_override(text: str) -> dict:
    """``--config 'select = ["BL1"]'`` (ruff's inline form): one TOML ``KEY = VALUE`` pair, validated as a
    ``[tool.bertlint]`` key. Returns {key: value}; ``ConfigError`` with the reason otherwise."""
    try:
        import tomllib  # type: ignore[import-not-found]
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(
            f"--config {text!r}: not a configuration file and not a TOML KEY = VALUE pair ({e}); "
            'for example --config "world-size = 8" or --config "select = [\'BL1\']"'
        ) from None
    table = data.get("tool", {}).get("bertlint", data) if isinstance(data.get("tool"), dict) else data
    settings_from_table(table, "--config")  # validates keys and types (the error names the key)
    return dict(table)


def apply_overrides(settings: Settings, overrides: list[dict]) -> Settings:
    """``settings`` with the inline ``--config KEY=VALUE`` pairs set over them (a key replaces the file's value;
    ``extend-exclude`` adds)."""
    if not overrides:
        return settings
    s = replace(settings)
    for table in overrides:
        o = settings_from_table(table, "--config")
        for key in table:
            if key == "select":
                s.select = o.select
            elif key == "ignore":
                s.ignore = list(o.ignore)
            elif key == "extend-select":
                s.extend_select = list(o.extend_select)
            elif key == "per-file-ignores":
                s.per_file_ignores = dict(o.per_file_ignores)
            elif key == "exclude":
                s.exclude = list(table["exclude"])
            elif key == "extend-exclude":
                s.exclude = [*s.exclude, *table["extend-exclude"]]
            elif key == "target-versions":
                s.target_versions = {**s.target_versions, **o.target_versions}
            elif key == "world-size":
                s.world_size = o.world_size
    return s


def settings_table(settings: Settings) -> dict:
    """The effective settings as ``[tool.bertlint]`` keys (``--show-settings``)."""
    return {
        "select": settings.select,
        "extend-select": list(settings.extend_select),
        "ignore": list(settings.ignore),
        "per-file-ignores": dict(settings.per_file_ignores),
        "exclude": list(settings.exclude),
        "target-versions": dict(settings.target_versions),
        "world-size": settings.world_size,
    }
