"""Configuration: ``[tool.bertlint]`` in the nearest pyproject.toml (or bertlint.toml) above each file."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional


class ConfigError(Exception):
    """A configuration problem: exit 2 with the file and key named."""


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

    def is_enabled(self, code: str, default_enabled: bool = True) -> bool:
        def match(sel: list[str]) -> int:
            best = -1
            for s in sel:
                if s == "ALL" or code.startswith(s):
                    best = max(best, 0 if s == "ALL" else len(s))
            return best

        if self.select is None:
            sel_len = 0 if default_enabled else -1
        else:
            sel_len = match(self.select)
        sel_len = max(sel_len, match(self.extend_select))
        ign_len = match(self.ignore)
        return sel_len >= 0 and sel_len > ign_len if ign_len >= 0 else sel_len >= 0
