"""Command line. Minimal first version; the core issue completes it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bertlint import __version__
from bertlint.engine import lint_python


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bertlint")
    p.add_argument("paths", nargs="*")
    p.add_argument("--output-format", default="full")
    p.add_argument("--version", action="version", version=f"bertlint {__version__}")
    a = p.parse_args(argv)
    diags = []
    for path in a.paths:
        text = Path(path).read_text()
        diags += lint_python(text, path)
    if a.output_format == "json":
        print(json.dumps([d.to_json() for d in diags], indent=2))
    else:
        for d in diags:
            print(f"{d.filename}:{d.start.row}:{d.start.column}: {d.code} {d.message}")
    return 1 if diags else 0
