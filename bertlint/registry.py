"""The rule registry. A rule is one module under ``bertlint/checks/`` that calls ``@rule(...)`` on its check.

    from bertlint.registry import rule
    from bertlint.types import Severity, Applicability

    @rule("BL101", "optimizer-step-not-delayed", Severity.ERROR,
          "optimizer.step() runs on every micro-batch of a loop that accumulates", fix=Applicability.UNSAFE)
    def check(ctx):            # ctx: bertlint.context.FileContext (or ConfigContext for targets=("config",))
        for ... in ctx.loops:  # read the shared analyses; never re-walk the tree
            ctx.report(node, "message with the arithmetic and the fix", fix=...)
"""

from __future__ import annotations

import importlib
import os
import re
from bertlint._dataclass import dataclass
from typing import Callable, Optional

from bertlint.types import Applicability, RuleMeta, Severity


@dataclass(frozen=True)
class Rule:
    meta: RuleMeta
    check: Callable


_RULES: dict[str, Rule] = {}
_LOADED = False
_NAMES: Optional[list[str]] = None
_IMPORTED: set[str] = set()
_CODE_MODULE = re.compile(r"bl[0-9]+")  # bertlint/checks/bl101.py defines BL101 (tests/test_registry.py)


def rule(
    code: str,
    name: str,
    severity: Severity,
    summary: str,
    *,
    fix: Optional[Applicability] = None,
    default_enabled: bool = True,
    targets: tuple[str, ...] = ("python",),
):
    meta = RuleMeta(code, name, Severity(severity), summary, fix, default_enabled, targets)

    def deco(fn: Callable) -> Callable:
        if code in _RULES and _RULES[code].check is not fn:
            raise RuntimeError(f"duplicate rule code {code}")
        _RULES[code] = Rule(meta, fn)
        fn.meta = meta  # type: ignore[attr-defined]
        return fn

    return deco


def _module_names() -> list[str]:
    global _NAMES
    if _NAMES is None:
        import bertlint.checks as pkg

        names = None
        paths = list(pkg.__path__)
        if len(paths) == 1 and os.path.isdir(paths[0]):  # the usual case: one folder of .py files (no pkgutil)
            try:
                names = {e.name[:-3] for e in os.scandir(paths[0]) if e.name.endswith(".py") and e.is_file()}
                names |= {e.name for e in os.scandir(paths[0])
                          if e.is_dir() and os.path.isfile(os.path.join(e.path, "__init__.py"))}
                names = [n for n in names if n.isidentifier()]
            except OSError:
                names = None
        if names is None:  # a zip, a namespace package ...
            import pkgutil

            names = [m.name for m in pkgutil.iter_modules(pkg.__path__)]
        _NAMES = sorted(n for n in names if not n.startswith("_"))
    return _NAMES


def _import(name: str) -> None:
    if name not in _IMPORTED:
        importlib.import_module(f"bertlint.checks.{name}")
        _IMPORTED.add(name)


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    for name in _module_names():
        _import(name)
    _LOADED = True


def enabled(settings, target: str) -> list[Rule]:
    """The rules ``settings`` enables for ``target`` ("python" | "config"), in code order. With an explicit
    selection (``--select BL101``) only the modules that can define a selected code are imported: a module named
    after a code (``bl101.py``) defines that code only; any other module is always imported."""
    if not _LOADED:
        if getattr(settings, "select", None) is None:
            _load()
        else:
            for name in _module_names():
                if _CODE_MODULE.fullmatch(name) and not settings.is_enabled(name.upper(), True):
                    continue  # not selected, whatever its default (is_enabled(code, True) covers both)
                _import(name)
    return [
        r
        for c, r in sorted(_RULES.items())
        if target in r.meta.targets and settings.is_enabled(c, r.meta.default_enabled)
    ]


def all_rules() -> list[Rule]:
    _load()
    return [_RULES[c] for c in sorted(_RULES)]


def get(code: str) -> Optional[Rule]:
    if code not in _RULES:
        _load()
    return _RULES.get(code)


# Codes that are not rules but diagnostics of the engine itself (they have pages too).
ENGINE_CODES = {
    "BL001": RuleMeta("BL001", "parse-error", Severity.ERROR, "the file could not be read or parsed", None),
    # off by default (enable with --extend-select BL002); computed by the engine after suppression (bertlint.noqa)
    "BL002": RuleMeta(
        "BL002", "unused-noqa", Severity.WARNING, "a `# noqa: BLxxx` code suppresses nothing (unused or unknown code)",
        Applicability.SAFE, default_enabled=False,
    ),
}
