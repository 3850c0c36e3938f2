"""``bertlint lsp``: a Language Server (LSP 3.17, stdio) publishing bertlint diagnostics, quick fixes,
``# noqa`` suppressions, a fix-all source action and rule documentation on hover.

Needs the ``lsp`` extra (pygls). The heavy imports (pygls, libcst, the rules) happen once, when the
server starts; every request then reuses them.
"""

from __future__ import annotations

import argparse
import sys
from typing import Optional

# 0: a change is linted at once when no lint of the document is running. Changes that arrive while one runs are
# coalesced (the server's worker is one thread; a queued lint of an older version is cancelled before it starts, and
# a result for a version that has since changed is dropped), so at most one lint of an outdated text is in flight.
# A debounce would only add its own delay to every publish (issue 12 measures didChange -> publishDiagnostics).
DEFAULT_DEBOUNCE_MS = 0


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="bertlint lsp",
        description="Run the bertlint language server (LSP over stdio).",
    )
    # Editors (vscode-languageclient, some Neovim set-ups) pass --stdio; stdio is the only transport.
    p.add_argument("--stdio", action="store_true", help="speak LSP over stdin/stdout (the default)")
    p.add_argument(
        "--debounce-ms",
        type=int,
        default=None,
        help=f"wait this long after the last edit before linting the unsaved buffer (default {DEFAULT_DEBOUNCE_MS}: at once; changes made while a lint runs are linted together when it ends)",
    )
    p.add_argument("--log-file", default=None, help="write the server's own debug log to this file")
    args = p.parse_args(sys.argv[1:] if argv is None else argv)
    try:
        from bertlint.lsp.server import serve
    except ImportError as e:  # pygls missing
        print(
            f"bertlint lsp: {e}. Install the language-server extra: pip install 'bertlint[lsp]'",
            file=sys.stderr,
        )
        return 2
    return serve(debounce_ms=args.debounce_ms, log_file=args.log_file)
