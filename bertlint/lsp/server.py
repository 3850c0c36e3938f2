"""The bertlint language server (pygls 2).

- Diagnostics on open, on change (on the unsaved buffer; changes made while a lint runs are coalesced) and on save; same codes, messages,
  severities and ranges as the command line; settings from the nearest pyproject.toml.
- Code actions: a quick fix per diagnostic with a fix, ``# noqa: CODE`` suppression, and
  ``source.fixAll.bertlint`` (every safe fix).
- Hover on a flagged range: the rule's summary and the start of its page.
- Notebooks: with notebook document sync, the code cells are linted as one notebook and the
  diagnostics go back to their cells; without it, ``.ipynb`` files are linted on open and save.
- A rule that raises, a file that does not parse, a broken configuration: logged to the client
  (window/logMessage); the server keeps running and publishes every other diagnostic.

Linting runs on one worker thread so that the event loop keeps reading messages; a result computed
for a document version that has since changed is dropped (the newer change has its own lint queued).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import traceback
from concurrent.futures import ThreadPoolExecutor
from bertlint._dataclass import dataclass, field
from typing import Any, Optional
from urllib.parse import unquote, urlparse

# Imported once, when the server starts: no request pays for libcst or the rules again.
import libcst  # noqa: F401
from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from bertlint import __version__
from bertlint.lsp import DEFAULT_DEBOUNCE_MS, convert
from bertlint.sources import NotebookJsonMap
from bertlint.types import Applicability, Diagnostic, Position, Severity

logger = logging.getLogger("bertlint.lsp")

FIX_ALL_KIND = "source.fixAll.bertlint"
SOURCE = "bertlint"
CONFIG_NAMES = ("pyproject.toml", "bertlint.toml")

# Rules about deprecated, renamed or removed framework APIs: editors strike the flagged code through.
_DEPRECATED_API_RULES = {"BL206", "BL305", "BL407"}

_SEVERITY = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
}

# ---------------------------------------------------------------------------------------------------
# Per-rule isolation: a rule that raises loses its own diagnostics, never the others'.

_tls = threading.local()
_guard_lock = threading.Lock()
_guarded = False


def _record_rule_error(code: str, filename: str, exc: BaseException) -> None:
    """The engine's ``on_internal_error`` hook in the server process: remember the error for the
    client's log instead of writing to stderr."""
    sink = getattr(_tls, "rule_errors", None)
    if sink is None:
        logger.warning("rule %s raised %s: %s on %s", code, type(exc).__name__, exc, filename)
        return
    sink.append((code, exc, "".join(traceback.format_exception(type(exc), exc, exc.__traceback__, limit=8))))


def guard_rules() -> None:
    """Make a rule that raises lose only its own diagnostics, and send its error to the client.

    The engine isolates rules itself and reports through ``bertlint.engine.on_internal_error``; the
    server points that hook at the client's log (process-local: only the server process does this)."""
    global _guarded
    if _guarded:
        return
    with _guard_lock:
        if _guarded:
            return
        from bertlint import engine, registry

        registry.all_rules()  # import every rule now, once
        engine.on_internal_error = _record_rule_error
        _guarded = True


@dataclass
class LintOutcome:
    diagnostics: Optional[list[Diagnostic]]  # None: the lint itself failed
    rule_errors: list[tuple[str, BaseException, str]] = field(default_factory=list)
    config_error: Optional[str] = None
    crash: Optional[str] = None


# The last results per file name: an undo, or typing a character and deleting it, gives back a text that
# was linted a moment ago; with the same settings its diagnostics are the same.
_recent: dict[str, list[tuple[str, Any, list[Diagnostic]]]] = {}
_RECENT_PER_FILE = 4


def run_lint(text: str, filename: str, settings_path: str) -> LintOutcome:
    """Runs on the worker thread."""
    global _reparser, _stmt_cache, _dry_memo
    guard_rules()
    if _reparser is None:
        from bertlint.dryreuse import Memo
        from bertlint.incremental import Reparser
        from bertlint.stmtcache import StatementCache

        _reparser = Reparser()
        _stmt_cache = StatementCache()
        _dry_memo = Memo()
    out = LintOutcome(None)
    settings = None
    try:
        settings = convert.load_settings(settings_path)
    except Exception as e:  # ConfigError or a broken toml: lint with the defaults, say why
        out.config_error = f"{type(e).__name__}: {e}"
    if settings is not None and convert.is_excluded(settings, filename):
        out.diagnostics = []
        return out
    recent = _recent.setdefault(filename, [])
    for old_text, old_settings, old_diags in recent:
        if old_text == text and old_settings == settings:
            out.diagnostics = list(old_diags)
            return out
    _tls.rule_errors = out.rule_errors
    try:
        if filename.endswith(".py"):
            from bertlint import dryreuse, stmtcache

            with stmtcache.using(_stmt_cache, filename, text), dryreuse.using(_dry_memo, _reparser, filename, text):
                out.diagnostics = convert.lint(text, filename, settings, functools.partial(_reparser.parse, filename))
        else:
            out.diagnostics = convert.lint(text, filename, settings)
    except Exception:  # RecursionError on absurd nesting, an engine bug: keep the server alive
        out.crash = traceback.format_exc(limit=12)
    finally:
        _tls.rule_errors = None
    if out.diagnostics is not None and not out.rule_errors:
        recent.insert(0, (text, settings, list(out.diagnostics)))
        del recent[_RECENT_PER_FILE:]
    return out


# The last module of each open Python file: a change re-parses only the top-level statements it touched
# (``bertlint/incremental.py``; the result is the module a full parse gives). Used on the worker thread only.
_reparser = None
# What the analyses computed from each top-level statement of the last module of each open Python file that is still
# valid for the same statement object (``bertlint/stmtcache.py``: structural tables only). Worker thread only.
_stmt_cache = None
# The dry runs of the last lint of each open Python file, taken again when an edit changed nothing they read
# (``bertlint/dryreuse.py``). Worker thread only.
_dry_memo = None


def forget(filename: str) -> None:
    _recent.pop(filename, None)
    if _reparser is not None:
        _reparser.forget(filename)
    if _stmt_cache is not None:
        _stmt_cache.forget(filename)
    if _dry_memo is not None:
        _dry_memo.forget(filename)


# ---------------------------------------------------------------------------------------------------
# What the server remembers per document (per cell for notebooks).


@dataclass
class Linted:
    uri: str
    version: Optional[int]  # the text document's version (the notebook's for cells)
    text: str  # the text the positions refer to (the cell's text for cells)
    items: list[tuple[Diagnostic, types.Diagnostic]]
    fixable: bool = True  # False where edits cannot be mapped (a notebook read as JSON)
    notebook_uri: Optional[str] = None
    comments: bool = True  # the language has `#` comments the engine reads for `# noqa` (not JSON)
    fix_all: Optional[tuple[str, list[Diagnostic]]] = None  # the fix-all text of this version, once computed
    filename: Optional[str] = None  # the name it was linted as (picks the reader and the configuration)

    @functools.cached_property
    def lines(self) -> list[str]:
        return convert.split_lines(self.text)


class LspLinesDocument(TextDocument):
    """pygls's text document with lines ended only by ``\n``, ``\r\n`` or ``\r``, as LSP counts them.
    pygls splits with ``str.splitlines``, which also breaks at a form feed or U+2028: an incremental
    edit after such a character would land on the wrong line and the server's copy of the buffer
    would drift from the editor's."""

    @property
    def lines(self):
        return tuple(convert.split_lines(self.source))


def _use_lsp_lines(workspace) -> None:
    create = workspace._create_text_document

    def create_document(*args, **kwargs):
        doc = create(*args, **kwargs)
        if type(doc) is TextDocument:
            doc.__class__ = LspLinesDocument
        return doc

    workspace._create_text_document = create_document


def _lsp_position(lines: list[str], codec, pos: Position) -> types.Position:
    line = max(pos.row - 1, 0)
    ch = max(pos.column - 1, 0)
    if line >= len(lines):
        if lines and not lines[-1].endswith(("\n", "\r")):
            last = lines[-1]
            return types.Position(line=len(lines) - 1, character=codec.client_num_units(last))
        return types.Position(line=len(lines), character=0)
    text = lines[line].rstrip("\r\n")
    ch = min(ch, len(text))
    return types.Position(line=line, character=codec.client_num_units(text[:ch]))


def _lsp_range(lines: list[str], codec, start: Position, end: Position) -> types.Range:
    return types.Range(start=_lsp_position(lines, codec, start), end=_lsp_position(lines, codec, end))


def _pos_key(p: types.Position) -> tuple[int, int]:
    return (p.line, p.character)


def _touches(a: types.Range, b: types.Range) -> bool:
    """Ranges overlap or touch (an empty range at a diagnostic's edge counts: the cursor is there)."""
    return _pos_key(a.start) <= _pos_key(b.end) and _pos_key(b.start) <= _pos_key(a.end)


class BertlintServer(LanguageServer):
    def __init__(self, debounce_ms: Optional[int] = None) -> None:
        super().__init__(
            "bertlint",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[
                    types.NotebookDocumentFilterWithCells(
                        notebook="*", cells=[types.NotebookCellLanguage(language="python")]
                    )
                ],
                save=True,
            ),
        )
        self.debounce_s = (DEFAULT_DEBOUNCE_MS if debounce_ms is None else debounce_ms) / 1000.0
        self._debounce_fixed = debounce_ms is not None
        self.results: dict[str, Linted] = {}
        self.notebook_cells: dict[str, list[str]] = {}  # notebook uri -> cell uris last published
        self.pending: dict[str, asyncio.Task] = {}
        self.open_uris: set[str] = set()  # text documents (not cells) as the client names them
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="bertlint-lint")
        self._logged: set[tuple] = set()
        self.markdown_hover = True

    # ---- logging to the client
    def log(self, message: str, kind: types.MessageType = types.MessageType.Info, *, once_key=None) -> None:
        if once_key is not None:
            if once_key in self._logged:
                return
            if len(self._logged) > 2000:  # parse errors while typing: keep the memory bounded
                self._logged.clear()
            self._logged.add(once_key)
        logger.log(
            {types.MessageType.Error: logging.ERROR, types.MessageType.Warning: logging.WARNING}.get(
                kind, logging.INFO
            ),
            message,
        )
        try:
            self.window_log_message(types.LogMessageParams(type=kind, message=f"bertlint: {message}"))
        except Exception:  # the client is gone: nothing to tell
            logger.debug("could not send window/logMessage", exc_info=True)

    def _report(self, uri: str, outcome: LintOutcome) -> None:
        if outcome.config_error and ("config", outcome.config_error) not in self._logged:
            message = f"configuration error for {uri}: {outcome.config_error}; linting with the default settings"
            self.log(message, types.MessageType.Warning, once_key=("config", outcome.config_error))
            try:  # a broken pyproject.toml deserves more than a log line: the CLI exits 2 on it
                self.window_show_message(types.ShowMessageParams(type=types.MessageType.Warning, message=f"bertlint: {message}"))
            except Exception:
                logger.debug("could not send window/showMessage", exc_info=True)
        for code, exc, tb in outcome.rule_errors:
            self.log(
                f"rule {code} raised {type(exc).__name__}: {exc} while linting {uri}; its diagnostics are "
                f"missing, the other rules' are published. Please report this.\n{tb}",
                types.MessageType.Error,
                once_key=("rule", code, type(exc).__name__, str(exc)),
            )
        if outcome.crash:
            self.log(
                f"linting {uri} failed; the previous diagnostics are kept.\n{outcome.crash}",
                types.MessageType.Error,
                once_key=("crash", uri, outcome.crash),
            )
        for d in outcome.diagnostics or []:
            if d.code == "BL001":
                self.log(
                    f"{uri} does not parse ({d.message} at {d.start.row}:{d.start.column}); "
                    "bertlint checks it again when it does",
                    types.MessageType.Log,
                    once_key=("parse", uri, d.message, d.start),
                )

    # ---- locations
    def settings_path(self, path: Optional[str]) -> str:
        if path:
            return path
        root = self.workspace.root_path if self.workspace else None
        return os.path.join(root or os.getcwd(), "untitled.py")

    @staticmethod
    def fs_path(uri: str) -> Optional[str]:
        if urlparse(uri).scheme not in ("file", ""):
            return None
        return to_fs_path(uri)

    def doc(self, uri: str):
        """The open text document (None once closed)."""
        return self.workspace.text_documents.get(unquote(uri))

    def is_cell(self, uri: str) -> bool:
        return self.workspace.get_notebook_document(cell_uri=uri) is not None

    def to_lsp(self, d: Diagnostic, lines: list[str], *, rows=None) -> types.Diagnostic:
        codec = self.workspace.position_codec
        if rows is None:
            rng = _lsp_range(lines, codec, d.start, d.end)
        else:  # a notebook read as JSON: cell positions map to lines and columns of the JSON text
            s = rows.locate(d.cell, d.start.row, d.start.column)
            e = rows.locate(d.cell, d.end.row, d.end.column) or s
            if s is None:
                rng = types.Range(types.Position(0, 0), types.Position(0, 0))
            else:
                rng = _lsp_range(lines, codec, Position(*s), Position(*e))  # type: ignore[misc]
        page = convert.page_path(d.code)
        data: dict[str, Any] = {"name": d.name}
        if d.fix is not None:
            data["fix"] = {"message": d.fix.message, "applicability": d.fix.applicability.value}
        return types.Diagnostic(
            range=rng,
            message=d.message,
            severity=_SEVERITY.get(d.severity, types.DiagnosticSeverity.Warning),
            code=d.code,
            code_description=types.CodeDescription(href=page.as_uri()) if page else None,
            source=SOURCE,
            tags=[types.DiagnosticTag.Deprecated] if d.code in _DEPRECATED_API_RULES else None,
            data=data,
        )

    # ---- linting
    async def _in_worker(self, text: str, filename: str, settings_path: str) -> LintOutcome:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.executor, run_lint, text, filename, settings_path)

    def schedule(self, uri: str, *, delay: float) -> None:
        """(Re)start the debounce timer of a text document or notebook."""
        old = self.pending.pop(uri, None)
        if old is not None and not old.done():
            old.cancel()
        self.pending[uri] = asyncio.get_running_loop().create_task(self._later(uri, delay))

    async def _later(self, uri: str, delay: float) -> None:
        try:
            if delay > 0:
                await asyncio.sleep(delay)
            if self.workspace.get_notebook_document(notebook_uri=uri) is not None:
                await self.lint_notebook(uri)
            else:
                await self.lint_document(uri)
        except asyncio.CancelledError:
            raise
        except Exception:
            self.log(f"internal error while linting {uri}\n{traceback.format_exc()}", types.MessageType.Error)
        finally:
            if self.pending.get(uri) is asyncio.current_task():
                self.pending.pop(uri, None)

    async def lint_document(self, uri: str) -> Optional[Linted]:
        doc = self.doc(uri)
        if doc is None:
            return None
        version, text = doc.version, doc.source
        path = self.fs_path(uri)
        filename = path or os.path.join(
            os.path.dirname(self.settings_path(None)), doc.filename or "untitled.py"
        )
        if not filename.endswith(convert.LINTABLE_SUFFIXES):
            if (doc.language_id or "") == "python":
                filename += ".py"
            else:
                return None
        outcome = await self._in_worker(text, filename, self.settings_path(path))
        self._report(uri, outcome)
        if outcome.diagnostics is None:
            return self.results.get(uri)
        current = self.doc(uri)
        if current is None or current.version != version:
            return None  # closed or changed meanwhile: the newer change is linted on its own
        if filename.endswith(".ipynb"):
            rows = NotebookJsonMap(text)
            lines = convert.split_lines(text)
            items = [(d, self.to_lsp(d, lines, rows=rows if d.cell is not None else None)) for d in outcome.diagnostics]
            res = Linted(uri, version, text, items, fixable=False)
        else:
            lines = convert.split_lines(text)
            res = Linted(
                uri,
                version,
                text,
                [(d, self.to_lsp(d, lines)) for d in outcome.diagnostics],
                comments=not filename.endswith(".json"),
                filename=filename,
            )
        self.results[uri] = res
        self.text_document_publish_diagnostics(
            types.PublishDiagnosticsParams(uri=uri, version=version, diagnostics=[ld for _, ld in res.items])
        )
        return res

    def _code_cells(self, nb: types.NotebookDocument) -> list[tuple[str, str, Optional[int]]]:
        cells = []
        for cell in nb.cells:
            if cell.kind != types.NotebookCellKind.Code:
                continue
            doc = self.doc(cell.document)
            if doc is None:
                continue
            if doc.language_id and doc.language_id != "python":
                continue
            cells.append((cell.document, doc.source, doc.version))
        return cells

    async def lint_notebook(self, nb_uri: str) -> None:
        nb = self.workspace.get_notebook_document(notebook_uri=nb_uri)
        if nb is None:
            return
        version = nb.version
        cells = self._code_cells(nb)
        path = self.fs_path(nb_uri)
        filename = path if path and path.endswith(".ipynb") else os.path.join(
            os.path.dirname(self.settings_path(None)), "untitled.ipynb"
        )
        texts = [t for _, t, _ in cells]
        # the cells as a notebook: the library joins them into one module (magics neutralised) and maps
        # every diagnostic, and every fix, back to its code cell
        outcome = await self._in_worker(convert.notebook_json(texts), filename, self.settings_path(path))
        self._report(nb_uri, outcome)
        if outcome.diagnostics is None:
            return
        nb_now = self.workspace.get_notebook_document(notebook_uri=nb_uri)
        if nb_now is None or nb_now.version != version:
            return
        per_cell: dict[int, list[Diagnostic]] = {i: [] for i in range(len(cells))}
        for d in outcome.diagnostics:
            idx = (d.cell or 1) - 1
            if 0 <= idx < len(cells):
                per_cell[idx].append(d)
        published = []
        for idx, (cell_uri, text, _cver) in enumerate(cells):
            lines = convert.split_lines(text)
            items = [(d, self.to_lsp(d, lines)) for d in per_cell[idx]]
            self.results[cell_uri] = Linted(cell_uri, version, text, items, notebook_uri=nb_uri)
            published.append(cell_uri)
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(uri=cell_uri, diagnostics=[ld for _, ld in items])
            )
        for gone in set(self.notebook_cells.get(nb_uri, [])) - set(published):
            self.results.pop(gone, None)
            self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=gone, diagnostics=[]))
        self.notebook_cells[nb_uri] = published

    async def fresh(self, uri: str) -> Optional[Linted]:
        """The diagnostics of the document as it is now (lints it first when they are stale)."""
        nb = self.workspace.get_notebook_document(cell_uri=uri)
        res = self.results.get(uri)
        if nb is not None:
            if res is None or res.version != nb.version:
                await self.lint_notebook(nb.uri)
                res = self.results.get(uri)
                nb = self.workspace.get_notebook_document(cell_uri=uri)
            if res is None or nb is None or res.version != nb.version:
                return None
            return res
        doc = self.doc(uri)
        if doc is None:
            return res
        if res is None or res.version != doc.version:
            path = self.fs_path(uri) or ""
            if path.endswith(".ipynb"):
                return res  # notebooks read as JSON are linted on save only (their actions never edit)
            res = await self.lint_document(uri)
        doc = self.doc(uri)
        if res is None or doc is None or res.version != doc.version:
            return None  # the text moved on while linting: edits computed for the old text would corrupt it
        return res

    async def relint_all(self) -> None:
        _recent.clear()
        for nb in list(self.workspace.notebook_documents.values()):
            await self.lint_notebook(nb.uri)
        for uri in sorted(self.open_uris):
            if (self.fs_path(uri) or "").endswith(".ipynb"):
                continue
            await self.lint_document(uri)

    def clear(self, uri: str) -> None:
        task = self.pending.pop(uri, None)
        if task is not None and not task.done():
            task.cancel()
        self.results.pop(uri, None)
        forget(self.fs_path(uri) or "")
        self.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    # ---- code actions
    def code_actions(self, res: Linted, params: types.CodeActionParams) -> list[types.CodeAction]:
        only = params.context.only or []

        def wanted(kind: str) -> bool:
            return not only or any(kind == k or kind.startswith(k + ".") for k in only)

        codec = self.workspace.position_codec
        uri = res.uri
        lines = res.lines
        actions: list[types.CodeAction] = []
        for d, ld in res.items:
            if not _touches(ld.range, params.range):
                continue
            if d.fix is not None and res.fixable and wanted(types.CodeActionKind.QuickFix):
                safe = d.fix.applicability is Applicability.SAFE
                edits = [
                    types.TextEdit(range=_lsp_range(lines, codec, e.start, e.end), new_text=e.content)
                    for e in d.fix.edits
                ]
                actions.append(
                    types.CodeAction(
                        title=f"Fix {d.code}: {d.fix.message}" + ("" if safe else " (unsafe)"),
                        kind=types.CodeActionKind.QuickFix,
                        diagnostics=[ld],
                        is_preferred=safe,
                        edit=types.WorkspaceEdit(changes={uri: edits}),
                    )
                )
            if d.code != "BL001" and res.fixable and res.comments and wanted(types.CodeActionKind.QuickFix):
                row = d.start.row - 1
                if 0 <= row < len(lines):
                    line = lines[row].rstrip("\r\n")
                    e = convert.noqa_edit(line, d.code)
                    if e is not None:
                        s, t, new = e
                        rng = types.Range(
                            start=types.Position(line=row, character=codec.client_num_units(line[:s])),
                            end=types.Position(line=row, character=codec.client_num_units(line[:t])),
                        )
                        actions.append(
                            types.CodeAction(
                                title=f"Suppress with `# noqa: {d.code}`",
                                kind=types.CodeActionKind.QuickFix,
                                diagnostics=[ld],
                                edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(range=rng, new_text=new)]}),
                            )
                        )
        if res.fixable and res.notebook_uri is None and wanted(FIX_ALL_KIND):
            fixable = [d for d, _ in res.items if d.fix is not None and d.fix.applicability is Applicability.SAFE]
            if fixable:
                fixed_text, applied = self.fix_all(res)
                block = convert.changed_block(res.text, fixed_text)
                if block is not None:
                    first, end, new = block
                    rng = types.Range(
                        start=types.Position(line=first, character=0),
                        end=_line_start(lines, end, codec),
                    )
                    actions.append(
                        types.CodeAction(
                            title="Fix all safe bertlint problems",
                            kind=FIX_ALL_KIND,
                            diagnostics=[ld for d, ld in res.items if d in applied],
                            edit=types.WorkspaceEdit(changes={uri: [types.TextEdit(range=rng, new_text=new)]}),
                        )
                    )
        return actions

    def fix_all(self, res: Linted) -> tuple[str, list[Diagnostic]]:
        """Every safe fix, re-linted and re-applied until nothing changes (as ``bertlint --fix``); computed once
        per document version (editors ask for code actions at every cursor move)."""
        if res.fix_all is None:
            path = self.fs_path(res.uri)
            filename = res.filename or path or os.path.join(os.path.dirname(self.settings_path(None)), "untitled.py")
            try:
                settings = convert.load_settings(self.settings_path(path))
            except Exception:
                settings = None
            res.fix_all = convert.fix_all(res.text, [d for d, _ in res.items], filename, settings)
        return res.fix_all

    def hover(self, res: Linted, pos: types.Position) -> Optional[types.Hover]:
        hits = [(d, ld) for d, ld in res.items if _pos_key(ld.range.start) <= _pos_key(pos) <= _pos_key(ld.range.end)]
        if not hits:
            return None
        seen: list[str] = []
        for d, _ in hits:
            if d.code not in seen:
                seen.append(d.code)
        if self.markdown_hover:
            content = types.MarkupContent(
                kind=types.MarkupKind.Markdown, value="\n\n---\n\n".join(convert.hover_markdown(c) for c in seen)
            )
        else:
            content = types.MarkupContent(
                kind=types.MarkupKind.PlainText, value="\n\n".join(convert.hover_plain(c) for c in seen)
            )
        return types.Hover(contents=content, range=hits[0][1].range)


def _line_start(lines: list[str], line: int, codec) -> types.Position:
    """The position of the start of 0-based ``line``; the end of the text when it is past the end."""
    if line < len(lines):
        return types.Position(line=line, character=0)
    if lines and not lines[-1].endswith(("\n", "\r")):
        return types.Position(line=len(lines) - 1, character=codec.client_num_units(lines[-1]))
    return types.Position(line=len(lines), character=0)


def _relint_readers(ls: "BertlintServer", path: Optional[str], uri: str) -> None:
    """A saved / changed ``.py`` file may be a sibling module another open file's analysis read
    (``bertlint/analysis/project.py``): re-lint those files."""
    if not path or not path.endswith(".py"):
        return
    from bertlint.analysis import project

    for other in list(ls.open_uris):
        if other != uri and project.reads(ls.fs_path(other) or "", path):
            ls.schedule(other, delay=0)


def create_server(debounce_ms: Optional[int] = None) -> BertlintServer:
    server = BertlintServer(debounce_ms)

    @server.feature(types.INITIALIZE)
    def initialize(ls: BertlintServer, params: types.InitializeParams) -> None:
        _use_lsp_lines(ls.workspace)  # pygls made the workspace just before this handler
        opts = params.initialization_options
        if isinstance(opts, dict) and not ls._debounce_fixed:
            ms = opts.get("debounceMs", opts.get("debounce_ms"))
            if isinstance(ms, (int, float)) and ms >= 0:
                ls.debounce_s = ms / 1000.0
        hover = params.capabilities.text_document and params.capabilities.text_document.hover
        formats = hover.content_format if hover else None
        ls.markdown_hover = not formats or types.MarkupKind.Markdown in formats

    @server.feature(types.INITIALIZED)
    async def initialized(ls: BertlintServer, params: types.InitializedParams) -> None:
        loop = asyncio.get_running_loop()
        warm = loop.run_in_executor(ls.executor, _warm_up)  # rules loaded, caches a first lint needs
        caps = ls.client_capabilities.workspace
        watched = caps.did_change_watched_files if caps else None
        if watched is not None and watched.dynamic_registration:
            # re-lint the open files when a configuration changes on disk, even if none of them is edited
            options = types.DidChangeWatchedFilesRegistrationOptions(
                watchers=[types.FileSystemWatcher(glob_pattern=f"**/{name}") for name in CONFIG_NAMES]
            )
            try:
                register = ls.client_register_capability_async(
                    types.RegistrationParams(
                        registrations=[
                            types.Registration(
                                id="bertlint-config-watcher",
                                method=types.WORKSPACE_DID_CHANGE_WATCHED_FILES,
                                register_options=options,
                            )
                        ]
                    )
                )
                await asyncio.wait_for(register, 10)
            except Exception as e:  # the client said no: configuration changes apply at the next edit
                logger.info("file watcher registration refused: %s", e)
        await warm

    @server.feature(types.TEXT_DOCUMENT_DID_OPEN)
    async def did_open(ls: BertlintServer, params: types.DidOpenTextDocumentParams) -> None:
        if ls.is_cell(params.text_document.uri):
            return
        ls.open_uris.add(params.text_document.uri)
        ls.schedule(params.text_document.uri, delay=0)

    @server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(ls: BertlintServer, params: types.DidChangeTextDocumentParams) -> None:
        uri = params.text_document.uri
        if ls.is_cell(uri):
            return
        if (ls.fs_path(uri) or "").endswith(".ipynb"):
            return  # a notebook read as JSON: half-typed JSON says nothing; lint on save
        ls.schedule(uri, delay=ls.debounce_s)

    @server.feature(types.TEXT_DOCUMENT_DID_SAVE, types.SaveOptions(include_text=False))
    async def did_save(ls: BertlintServer, params: types.DidSaveTextDocumentParams) -> None:
        uri = params.text_document.uri
        _recent.clear()  # a saved file may be one a script reads (a DeepSpeed JSON): lint afresh
        if os.path.basename(ls.fs_path(uri) or "") in CONFIG_NAMES:
            await ls.relint_all()
            return
        if ls.is_cell(uri):
            return
        ls.schedule(uri, delay=0)
        _relint_readers(ls, ls.fs_path(uri), uri)

    @server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: BertlintServer, params: types.DidCloseTextDocumentParams) -> None:
        ls.open_uris.discard(params.text_document.uri)
        ls.clear(params.text_document.uri)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
    async def nb_open(ls: BertlintServer, params: types.DidOpenNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, delay=0)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
    async def nb_change(ls: BertlintServer, params: types.DidChangeNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, delay=ls.debounce_s)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
    async def nb_save(ls: BertlintServer, params: types.DidSaveNotebookDocumentParams) -> None:
        ls.schedule(params.notebook_document.uri, delay=0)

    @server.feature(types.NOTEBOOK_DOCUMENT_DID_CLOSE)
    def nb_close(ls: BertlintServer, params: types.DidCloseNotebookDocumentParams) -> None:
        uri = params.notebook_document.uri
        task = ls.pending.pop(uri, None)
        if task is not None and not task.done():
            task.cancel()
        for cell_uri in ls.notebook_cells.pop(uri, []):
            ls.clear(cell_uri)

    @server.feature(types.WORKSPACE_DID_CHANGE_WATCHED_FILES)
    async def watched(ls: BertlintServer, params: types.DidChangeWatchedFilesParams) -> None:
        if any(os.path.basename(ls.fs_path(c.uri) or "") in CONFIG_NAMES for c in params.changes):
            await ls.relint_all()
            return
        for c in params.changes:
            _relint_readers(ls, ls.fs_path(c.uri), c.uri)

    @server.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
    async def configuration(ls: BertlintServer, params: types.DidChangeConfigurationParams) -> None:
        await ls.relint_all()

    @server.feature(
        types.TEXT_DOCUMENT_CODE_ACTION,
        types.CodeActionOptions(code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND]),
    )
    async def code_action(ls: BertlintServer, params: types.CodeActionParams):
        res = await ls.fresh(params.text_document.uri)
        if res is None:
            return None
        return ls.code_actions(res, params) or None

    @server.feature(types.TEXT_DOCUMENT_HOVER)
    async def hover(ls: BertlintServer, params: types.HoverParams):
        res = await ls.fresh(params.text_document.uri)
        if res is None:
            return None
        return ls.hover(res, params.position)

    return server


_WARM_SOURCE = """import torch
for i, batch in enumerate(loader):
    loss = model(**batch).loss / accum_steps
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def _warm_up() -> None:
    guard_rules()
    try:
        convert.lint(_WARM_SOURCE, "warm_up.py", None)
        convert.rule_meta("BL101")
    except Exception:
        logger.debug("warm-up lint failed", exc_info=True)


def serve(*, debounce_ms: Optional[int] = None, log_file: Optional[str] = None) -> int:
    if log_file:
        logging.basicConfig(filename=log_file, level=logging.DEBUG, format="%(asctime)s %(name)s %(message)s")
    else:
        logging.basicConfig(level=logging.WARNING, format="bertlint lsp: %(message)s")
    import warnings

    warnings.filterwarnings("ignore", module="<bertlint>")  # compile()'s SyntaxWarnings on a buffer's syntax error
    guard_rules()
    server = create_server(debounce_ms)
    server.start_io()
    return 0
