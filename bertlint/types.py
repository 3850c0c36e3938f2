"""All the plain data types of bertlint in one place (as Fixit's ftypes.py).

Positions: ``row`` is 1-based, ``column`` is 1-based (as ruff's JSON output); ``end`` is exclusive.
"""

from __future__ import annotations

from bertlint._dataclass import dataclass, field
from enum import Enum
from typing import Any, Callable, Optional


class Severity(str, Enum):
    ERROR = "E"
    WARNING = "W"
    INFO = "I"

    @property
    def label(self) -> str:
        return {"E": "error", "W": "warning", "I": "info"}[self.value]


class Applicability(str, Enum):
    SAFE = "safe"
    UNSAFE = "unsafe"


@dataclass(frozen=True, order=True)
class Position:
    row: int  # 1-based
    column: int  # 1-based

    def to_json(self) -> dict:
        return {"row": self.row, "column": self.column}


@dataclass(frozen=True)
class Edit:
    """Replace the text between ``start`` and ``end`` (exclusive) with ``content``."""

    content: str
    start: Position
    end: Position

    def to_json(self) -> dict:
        return {"content": self.content, "location": self.start.to_json(), "end_location": self.end.to_json()}


@dataclass(frozen=True)
class Fix:
    message: str
    applicability: Applicability
    edits: tuple[Edit, ...]

    def to_json(self) -> dict:
        return {
            "message": self.message,
            "applicability": self.applicability.value,
            "edits": [e.to_json() for e in self.edits],
        }


@dataclass(frozen=True)
class RuleMeta:
    code: str  # "BL101"
    name: str  # "optimizer-step-not-delayed"
    severity: Severity  # default severity; a report may override it (W/E rules)
    summary: str  # one line
    fix: Optional[Applicability] = None  # the best applicability the rule's fixes have, None = no fix
    default_enabled: bool = True
    # which inputs the rule reads: "python" (scripts and notebooks) and/or "config" (JSON/YAML files)
    targets: tuple[str, ...] = ("python",)

    @property
    def url(self) -> str:
        return f"rules/{self.code}.md"


@dataclass
class Verification:
    status: str  # confirmed | refuted | inconclusive | not-run
    evidence: str

    def to_json(self) -> dict:
        return {"status": self.status, "evidence": self.evidence}


@dataclass
class Diagnostic:
    code: str
    name: str
    severity: Severity
    message: str
    filename: str
    start: Position
    end: Position
    fix: Optional[Fix] = None
    cell: Optional[int] = None  # notebooks: 1-based code-cell number; start/end are then cell-relative
    verification: Optional[Verification] = None
    # free-form data a rule attaches for the verifier / explain (never printed by reporters)
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"rules/{self.code}.md"

    def sort_key(self) -> tuple:
        return (self.filename, self.cell or 0, self.start.row, self.start.column, self.code, self.message)

    def to_json(self) -> dict:
        d = {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "message": self.message,
            "filename": self.filename,
            "location": self.start.to_json(),
            "end_location": self.end.to_json(),
            "fix": self.fix.to_json() if self.fix else None,
            "url": self.url,
            "cell": self.cell,
        }
        if self.verification is not None:
            d["verification"] = self.verification.to_json()
        return d


CheckFn = Callable[[Any], None]
