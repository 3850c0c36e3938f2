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
import pkgutil
from dataclasses import dataclass
from typing import Callable, Optional

from bertlint.types import Applicability, RuleMeta, Severity


@dataclass(frozen=True)
class Rule:
    meta: RuleMeta
    check: Callable


_RULES: dict[str, Rule] = {}
_LOADED = False


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


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    import bertlint.checks as pkg

    for mod in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not mod.name.startswith("_"):
            importlib.import_module(f"bertlint.checks.{mod.name}")
    _LOADED = True


def all_rules() -> list[Rule]:
    _load()
    return [_RULES[c] for c in sorted(_RULES)]


def get(code: str) -> Optional[Rule]:
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
