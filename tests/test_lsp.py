"""The language server, driven over stdio by a real LSP client (pytest-lsp's, on pygls).

Every test starts `python -m bertlint lsp` in a subprocess, initializes it, and talks LSP to it: open a
document, wait for textDocument/publishDiagnostics, ask for code actions and hovers, apply the returned
edits to the text the way an editor would, send the edited text back and watch the diagnostics follow.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pygls")
pytest_asyncio = pytest.importorskip("pytest_asyncio")
pytest.importorskip("pytest_lsp")

from lsprotocol import types  # noqa: E402
from pytest_lsp import LanguageClient  # noqa: E402
from pytest_lsp.client import DEFAULT_CLIENT_FEATURES, register_lsp_features  # noqa: E402
from pygls.protocol import default_converter  # noqa: E402

from bertlint import api  # noqa: E402

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(60)]

ROOT = Path(__file__).resolve().parent.parent

BUGGY = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def train(model, dataset, optimizer, accum_steps=8):
        dl = DataLoader(dataset, batch_size=2)
        model.train()
        for i, batch in enumerate(dl):
            loss = model(**batch).loss / accum_steps
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
)

GATED = BUGGY.replace(
    "        optimizer.step()\n        optimizer.zero_grad()\n",
    "        if (i + 1) % accum_steps == 0:\n            optimizer.step()\n            optimizer.zero_grad()\n",
)

STEP_LINE = BUGGY.splitlines().index("        optimizer.step()")  # 0-based, as LSP counts

# Rules that exist only inside the test server process: one that always raises (the server must log it
# and still publish the other rules' diagnostics) and two with fixes (safe and unsafe), so that the
# quick-fix plumbing is tested whatever the real rules' fixes are at the moment.
TEST_SERVER = textwrap.dedent(
    '''\
    import sys

    import libcst as cst

    from bertlint.registry import rule
    from bertlint.types import Applicability, Severity


    @rule("BL998", "test-rule-that-raises", Severity.WARNING, "always raises (test only)")
    def boom(ctx):
        raise RuntimeError("boom from a test rule")


    class _Calls(cst.CSTVisitor):
        def __init__(self):
            self.calls = []

        def visit_Call(self, node):
            self.calls.append(node)


    def _calls(ctx, dotted):
        v = _Calls()
        ctx.module.visit(v)
        return [c for c in v.calls if ctx.module.code_for_node(c.func) == dotted]


    @rule("BL997", "test-safe-fix", Severity.INFO, "torch.cuda.amp.GradScaler() (test only)", fix=Applicability.SAFE)
    def safe_fix(ctx):
        for call in _calls(ctx, "torch.cuda.amp.GradScaler"):
            edit = ctx.edit_replace(call, 'torch.amp.GradScaler("cuda")')
            ctx.report(call, "test: deprecated GradScaler", fix=ctx.fix('use torch.amp.GradScaler("cuda")', [edit]))


    @rule("BL996", "test-unsafe-fix", Severity.WARNING, "torch.cuda.empty_cache() (test only)", fix=Applicability.UNSAFE)
    def unsafe_fix(ctx):
        for call in _calls(ctx, "torch.cuda.empty_cache"):
            edit = ctx.edit_replace(call, "None")
            ctx.report(call, "test: empty_cache", fix=ctx.fix("drop the call", [edit], Applicability.UNSAFE))


    from bertlint.lsp import main

    sys.exit(main(sys.argv[1:]))
    '''
)


# ------------------------------------------------------------------------------------------------ client


def _client() -> LanguageClient:
    client = LanguageClient(converter_factory=default_converter)
    client.published = []  # every PublishDiagnosticsParams, in order

    features = dict(DEFAULT_CLIENT_FEATURES)

    def publish(c: LanguageClient, params: types.PublishDiagnosticsParams) -> None:
        c.diagnostics[params.uri] = params.diagnostics
        c.published.append(params)

    features[types.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS] = publish

    client.registrations = []

    def register(c: LanguageClient, params: types.RegistrationParams) -> None:
        c.registrations.extend(params.registrations)

    features[types.CLIENT_REGISTER_CAPABILITY] = register
    register_lsp_features(client, features)
    return client


@contextlib.asynccontextmanager
async def session(
    root: Path,
    *,
    server: list[str] | None = None,
    notebooks: bool = False,
    debounce_ms: int = 10,
    capabilities: types.ClientCapabilities | None = None,
):
    client = _client()
    cmd = server or [sys.executable, "-m", "bertlint", "lsp"]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    await client.start_io(*cmd, "--debounce-ms", str(debounce_ms), env=env, cwd=str(root))
    caps = capabilities or types.ClientCapabilities(
        text_document=types.TextDocumentClientCapabilities(
            hover=types.HoverClientCapabilities(content_format=[types.MarkupKind.Markdown]),
            code_action=types.CodeActionClientCapabilities(
                code_action_literal_support=types.ClientCodeActionLiteralOptions(
                    code_action_kind=types.ClientCodeActionKindOptions(
                        value_set=[types.CodeActionKind.QuickFix, types.CodeActionKind.SourceFixAll]
                    )
                )
            ),
            publish_diagnostics=types.PublishDiagnosticsClientCapabilities(version_support=True),
        ),
        workspace=types.WorkspaceClientCapabilities(
            did_change_watched_files=types.DidChangeWatchedFilesClientCapabilities(dynamic_registration=True)
        ),
        notebook_document=(
            types.NotebookDocumentClientCapabilities(
                synchronization=types.NotebookDocumentSyncClientCapabilities()
            )
            if notebooks
            else None
        ),
    )
    try:
        result = await client.initialize_session(
            types.InitializeParams(
                capabilities=caps,
                root_uri=root.as_uri(),
                workspace_folders=[types.WorkspaceFolder(uri=root.as_uri(), name=root.name)],
            )
        )
        client.server_capabilities = result.capabilities
        yield client
        await asyncio.wait_for(client.shutdown_session(), 20)
    finally:
        server_proc = getattr(client, "_server", None)
        if server_proc is not None and server_proc.returncode is None:
            server_proc.kill()  # a failed test skipped the shutdown: do not wait for an exit that never comes
        await client.stop()


async def wait_for(client: LanguageClient, uri: str, pred=lambda ds: True, *, version=None, timeout: float = 20.0):
    """The latest diagnostics published for ``uri`` once they satisfy ``pred`` (and are for ``version``)."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while True:
        latest = [p for p in client.published if p.uri == uri]
        if latest and pred(latest[-1].diagnostics) and (version is None or latest[-1].version == version):
            return list(latest[-1].diagnostics)
        if loop.time() > end:
            got = [[(d.code, d.range.start.line) for d in p.diagnostics] for p in latest]
            raise AssertionError(f"no matching diagnostics for {uri} (version {version}); published: {got}")
        await asyncio.sleep(0.01)


def latest(client: LanguageClient, uri: str) -> types.PublishDiagnosticsParams:
    return [p for p in client.published if p.uri == uri][-1]


def codes(diags) -> list[str]:
    return [d.code for d in diags]


def open_doc(client: LanguageClient, path: Path, text: str, version: int = 1, language: str = "python") -> str:
    uri = path.as_uri()
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(
            text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)
        )
    )
    return uri


def change_doc(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)],
        )
    )


def apply_edits(text: str, edits) -> str:
    """Apply LSP TextEdits as an editor does (all positions refer to the original text)."""
    lines = text.splitlines(keepends=True)
    starts = [0]
    for ln in lines:
        starts.append(starts[-1] + len(ln))

    def off(p: types.Position) -> int:
        if p.line >= len(lines):
            return len(text)
        return starts[p.line] + min(p.character, len(lines[p.line].rstrip("\r\n")))

    spans = sorted(((off(e.range.start), off(e.range.end), e.new_text) for e in edits), reverse=True)
    for a, b, new in spans:
        text = text[:a] + new + text[b:]
    return text


async def code_actions(client: LanguageClient, uri: str, rng: types.Range, only=None):
    result = await client.text_document_code_action_async(
        types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=uri),
            range=rng,
            context=types.CodeActionContext(diagnostics=[], only=only),
        )
    )
    return list(result or [])


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def shared(tmp_path_factory):
    """One server for the tests that need no special server or client capabilities (each opens its own
    files): starting a server costs seconds (lsprotocol's import alone is most of it)."""
    async with session(tmp_path_factory.mktemp("workspace")) as client:
        yield client


# ------------------------------------------------------------------------------------------------- tests


async def test_diagnostics_match_the_command_line_and_follow_changes(tmp_path, shared):
    path = tmp_path / "train.py"
    path.write_text(BUGGY)
    client = shared
    caps = client.server_capabilities
    assert types.CodeActionKind.QuickFix in caps.code_action_provider.code_action_kinds
    assert "source.fixAll.bertlint" in caps.code_action_provider.code_action_kinds
    assert caps.hover_provider

    uri = open_doc(client, path, BUGGY)
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))

    # same codes, messages, severities and ranges as the library the CLI uses
    expected = api.lint_text(BUGGY, str(path), api.load_settings(str(path)))
    assert sorted(codes(diags)) == sorted(d.code for d in expected)
    sev = {"E": types.DiagnosticSeverity.Error, "W": types.DiagnosticSeverity.Warning,
           "I": types.DiagnosticSeverity.Information}
    for want, got in zip(expected, sorted(diags, key=lambda d: (d.range.start.line, d.range.start.character, d.code))):
        assert got.code == want.code
        assert got.message == want.message
        assert got.source == "bertlint"
        assert got.severity == sev[want.severity.value]
        assert (got.range.start.line, got.range.start.character) == (want.start.row - 1, want.start.column - 1)
        assert (got.range.end.line, got.range.end.character) == (want.end.row - 1, want.end.column - 1)
    bl101 = next(d for d in diags if d.code == "BL101")
    assert bl101.range.start.line == STEP_LINE
    page = ROOT / "rules" / "BL101.md"
    if page.exists():
        assert bl101.code_description.href == page.as_uri()

    # the unsaved buffer is linted: gate the step -> BL101 goes away without saving
    change_doc(client, uri, GATED, 2)
    diags = await wait_for(client, uri, lambda ds: "BL101" not in codes(ds))
    assert latest(client, uri).version == 2

    # and back (two quick edits: only the last text counts)
    change_doc(client, uri, GATED + "\n", 3)
    change_doc(client, uri, BUGGY, 4)
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
    assert latest(client, uri).version == 4
    assert next(d for d in diags if d.code == "BL101").range.start.line == STEP_LINE

    # closing clears the file's diagnostics
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    await wait_for(client, uri, lambda ds: ds == [] or ds == ())


async def test_incremental_edits_after_a_form_feed(tmp_path, shared):
    """Editors send incremental changes in LSP lines (ended by \\n, \\r\\n or \\r only): a form feed
    (old GNU-style section break) must not shift the server's copy of the buffer."""
    src = BUGGY.replace("import torch\n", "import torch\n\x0c\n")
    row = src.split("\n").index("        optimizer.step()")
    path = tmp_path / "train.py"
    client = shared
    uri = open_doc(client, path, src)
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
    assert next(d for d in diags if d.code == "BL101").range.start.line == row

    def insert(version: int, line: int, character: int, text: str) -> None:
        at = types.Position(line=line, character=character)
        client.text_document_did_change(
            types.DidChangeTextDocumentParams(
                text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
                content_changes=[types.TextDocumentContentChangePartial(range=types.Range(start=at, end=at), text=text)],
            )
        )

    # a stray parenthesis typed before the call: the syntax error is on the call's line, not two above
    insert(2, row, 8, ")")
    diags = await wait_for(client, uri, version=2)
    assert codes(diags) == ["BL001"] and diags[0].range.start.line == row
    # deleted again: the buffer is the original text
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=3),
            content_changes=[
                types.TextDocumentContentChangePartial(
                    range=types.Range(start=types.Position(line=row, character=8), end=types.Position(line=row, character=9)),
                    text="",
                )
            ],
        )
    )
    diags = await wait_for(client, uri, version=3)
    assert next(d for d in diags if d.code == "BL101").range.start.line == row
    end = len("        optimizer.step()")
    insert(4, row, end, "  # noqa: BL101")
    diags = await wait_for(client, uri, version=4)
    assert "BL101" not in codes(diags) and "BL001" not in codes(diags)


async def test_hover_and_noqa_action(tmp_path, shared):
    path = tmp_path / "train.py"
    client = shared
    uri = open_doc(client, path, BUGGY)
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
    bl101 = next(d for d in diags if d.code == "BL101")

    # hover on the flagged range: the rule's summary and the start of its page
    hover = await client.text_document_hover_async(
        types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=bl101.range.start)
    )
    assert hover is not None and hover.contents.kind == types.MarkupKind.Markdown
    text = hover.contents.value
    from bertlint.registry import get

    meta = get("BL101").meta
    assert text.startswith(f"**BL101** `{meta.name}`") and meta.summary in text
    page = ROOT / "rules" / "BL101.md"
    if page.exists():
        assert "What it finds" in text and page.as_uri() in text
    # nothing flagged at line 0
    none = await client.text_document_hover_async(
        types.HoverParams(
            text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=0, character=0)
        )
    )
    assert none is None

    # the noqa quick fix
    cursor = types.Range(start=bl101.range.start, end=bl101.range.start)
    actions = await code_actions(client, uri, cursor)
    noqa = [a for a in actions if a.title == "Suppress with `# noqa: BL101`"]
    assert len(noqa) == 1 and noqa[0].kind == types.CodeActionKind.QuickFix
    assert noqa[0].diagnostics[0].code == "BL101"
    new = apply_edits(BUGGY, noqa[0].edit.changes[uri])
    assert new.splitlines()[STEP_LINE] == "        optimizer.step()  # noqa: BL101"
    assert new.replace("  # noqa: BL101", "") == BUGGY

    change_doc(client, uri, new, 2)
    await wait_for(client, uri, lambda ds: "BL101" not in codes(ds))
    assert latest(client, uri).version == 2

    # an existing noqa for another code is extended, not duplicated
    other = BUGGY.replace("        optimizer.step()\n", "        optimizer.step()  # noqa: BL105\n")
    change_doc(client, uri, other, 3)
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
    bl101 = next(d for d in diags if d.code == "BL101")
    actions = await code_actions(client, uri, bl101.range, only=[types.CodeActionKind.QuickFix])
    noqa = next(a for a in actions if a.title == "Suppress with `# noqa: BL101`")
    fixed = apply_edits(other, noqa.edit.changes[uri])
    assert fixed.splitlines()[STEP_LINE] == "        optimizer.step()  # noqa: BL105, BL101"
    change_doc(client, uri, fixed, 4)
    await wait_for(client, uri, lambda ds: "BL101" not in codes(ds))


async def test_quick_fixes_fix_all_and_a_rule_that_raises(tmp_path):
    server = tmp_path / "server_with_test_rules.py"
    server.write_text(TEST_SERVER)
    src = BUGGY.replace(
        "    model.train()\n",
        "    model.train()\n    scaler = torch.cuda.amp.GradScaler()\n    torch.cuda.empty_cache()\n",
    )
    path = tmp_path / "train.py"
    async with session(tmp_path, server=[sys.executable, str(server)]) as client:
        uri = open_doc(client, path, src)
        diags = await wait_for(client, uri, lambda ds: {"BL101", "BL997", "BL996"} <= set(codes(ds)))

        # the raising rule is logged to the client and costs only its own diagnostics
        assert "BL998" not in codes(diags)
        logs = [m for m in client.log_messages if "BL998" in m.message]
        assert logs and logs[0].type == types.MessageType.Error
        assert "boom from a test rule" in logs[0].message

        # a quick fix per fixable diagnostic: safe ones preferred, unsafe ones labelled
        safe = next(d for d in diags if d.code == "BL997")
        actions = await code_actions(client, uri, safe.range)
        fix = next(a for a in actions if a.title.startswith("Fix BL997"))
        assert fix.is_preferred and "(unsafe)" not in fix.title
        fixed = apply_edits(src, fix.edit.changes[uri])
        assert 'scaler = torch.amp.GradScaler("cuda")' in fixed and "torch.cuda.amp" not in fixed

        unsafe = next(d for d in diags if d.code == "BL996")
        actions = await code_actions(client, uri, unsafe.range)
        ufix = next(a for a in actions if a.title.startswith("Fix BL996"))
        assert ufix.title.endswith("(unsafe)") and not ufix.is_preferred

        # the source action applies every safe fix and nothing unsafe
        whole = types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0))
        actions = await code_actions(client, uri, whole, only=["source.fixAll"])
        assert [a.kind for a in actions] == ["source.fixAll.bertlint"]
        assert actions[0].title == "Fix all safe bertlint problems"
        after = apply_edits(src, actions[0].edit.changes[uri])
        assert after == src.replace("torch.cuda.amp.GradScaler()", 'torch.amp.GradScaler("cuda")')

        change_doc(client, uri, after, 2)
        diags = await wait_for(client, uri, lambda ds: "BL997" not in codes(ds) and "BL101" in codes(ds))
        assert "BL996" in codes(diags)

        # columns are UTF-16 code units on the wire (the LSP default): an emoji counts twice
        emoji = after + '    note = "\U0001F600"; scaler = torch.cuda.amp.GradScaler()\n'
        change_doc(client, uri, emoji, 3)
        diags = await wait_for(client, uri, lambda ds: "BL997" in codes(ds))
        d = next(d for d in diags if d.code == "BL997")
        line = emoji.splitlines()[d.range.start.line]
        col = line.index("torch.cuda.amp")
        assert d.range.start.character == col + 1  # one code point, two UTF-16 units
        actions = await code_actions(client, uri, d.range)
        fix = next(a for a in actions if a.title.startswith("Fix BL997"))
        (edit,) = fix.edit.changes[uri]
        assert edit.range.start.character == col + 1
        assert edit.range.end.character == col + 1 + len("torch.cuda.amp.GradScaler()")


AMP = textwrap.dedent(
    """\
    import torch

    scaler = torch.cuda.amp.GradScaler()


    def train(model, dl, optimizer, accum_steps=8):
        for i, batch in enumerate(dl):
            with torch.cuda.amp.autocast():
                loss = model(**batch).loss / accum_steps
            scaler.scale(loss).backward()
            if (i + 1) % accum_steps == 0:
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
    """
)


async def test_real_rule_fixes_bl206(tmp_path, shared):
    """BL206 (deprecated torch.cuda.amp) carries a safe fix: its quick fix and the fix-all action, applied the
    way an editor applies them, give the library's fixed text, and the diagnostics follow."""
    from bertlint.registry import get

    if get("BL206") is None or get("BL206").meta.fix is None:
        pytest.skip("BL206 has no fix in this tree")
    path = tmp_path / "train.py"
    expected = api.apply_fixes(AMP, api.lint_text(AMP, str(path))).text
    client = shared
    uri = open_doc(client, path, AMP)
    diags = await wait_for(client, uri, lambda ds: codes(ds).count("BL206") == 2)
    first = min((d for d in diags if d.code == "BL206"), key=lambda d: d.range.start.line)
    assert list(first.tags) == [types.DiagnosticTag.Deprecated]  # editors strike deprecated APIs through
    actions = await code_actions(client, uri, first.range, only=[types.CodeActionKind.QuickFix])
    fix = next(a for a in actions if a.title.startswith("Fix BL206"))
    assert fix.is_preferred
    one = apply_edits(AMP, fix.edit.changes[uri])
    assert 'scaler = torch.amp.GradScaler("cuda")' in one and "torch.cuda.amp.autocast()" in one

    actions = await code_actions(client, uri, first.range, only=["source.fixAll.bertlint"])
    (fix_all,) = actions
    assert apply_edits(AMP, fix_all.edit.changes[uri]) == expected != AMP

    change_doc(client, uri, expected, 2)
    await wait_for(client, uri, lambda ds: "BL206" not in codes(ds), version=2)


async def test_broken_file_is_reported_and_the_server_recovers(tmp_path, shared):
    path = tmp_path / "train.py"
    broken = BUGGY.replace("for i, batch in enumerate(dl):", "for i, batch in enumerate(dl)")
    client = shared
    uri = open_doc(client, path, broken)
    diags = await wait_for(client, uri)
    assert codes(diags) == ["BL001"]
    assert diags[0].severity == types.DiagnosticSeverity.Error
    assert "SyntaxError" in diags[0].message
    assert any("does not parse" in m.message and uri in m.message for m in client.log_messages)

    change_doc(client, uri, BUGGY, 2)
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
    assert "BL001" not in codes(diags)


async def test_pyproject_configuration_is_honoured(tmp_path, shared):
    (tmp_path / "pyproject.toml").write_text('[tool.bertlint]\nper-file-ignores = {"legacy_*.py" = ["BL101"]}\n')
    sub = tmp_path / "scripts"
    sub.mkdir()
    (sub / "pyproject.toml").write_text('[tool.bertlint]\nignore = ["BL101"]\n')
    client = shared
    # the nearest configuration above each file applies: ignore, per-file-ignores
    ignored = open_doc(client, sub / "train.py", BUGGY)
    legacy = open_doc(client, tmp_path / "legacy_train.py", BUGGY)
    plain = open_doc(client, tmp_path / "train.py", BUGGY)
    await wait_for(client, plain, lambda ds: "BL101" in codes(ds))
    assert "BL101" not in codes(await wait_for(client, ignored))
    assert "BL101" not in codes(await wait_for(client, legacy))

    # a broken configuration is reported to the user; the file is linted with the defaults
    (sub / "pyproject.toml").write_text('[tool.bertlint]\nignore = "BL101\n')
    change_doc(client, ignored, BUGGY + "\n", 2)
    await wait_for(client, ignored, lambda ds: "BL101" in codes(ds))
    assert any("configuration" in m.message and ignored in m.message for m in client.messages + client.log_messages)

    # editing the configuration takes effect at the next lint
    (sub / "pyproject.toml").write_text('[tool.bertlint]\nignore = ["BL1"]\n')
    change_doc(client, ignored, BUGGY, 3)
    await wait_for(client, ignored, lambda ds: "BL101" not in codes(ds), version=3)

    # or at once, for every open file, when the editor reports the configuration file changed (the server
    # asked the editor to watch configuration files)
    (watch,) = [r for r in client.registrations if r.method == types.WORKSPACE_DID_CHANGE_WATCHED_FILES]
    assert "**/pyproject.toml" in json.dumps(watch.register_options)
    (sub / "pyproject.toml").write_text("[tool.bertlint]\n")
    client.workspace_did_change_watched_files(
        types.DidChangeWatchedFilesParams(
            changes=[types.FileEvent(uri=(sub / "pyproject.toml").as_uri(), type=types.FileChangeType.Changed)]
        )
    )
    await wait_for(client, ignored, lambda ds: "BL101" in codes(ds))


async def test_deepspeed_config_files(tmp_path, shared):
    """Configuration files go through the same library path (BL402 on a DeepSpeed JSON); JSON has no
    comments, so no `# noqa` action is offered there, while YAML gets one the engine honours."""
    client = shared
    ds = {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 3}
    text = json.dumps(ds, indent=2) + "\n"
    path = tmp_path / "ds_config.json"
    uri = open_doc(client, path, text, language="json")
    diags = await wait_for(client, uri, lambda ds: "BL402" in codes(ds))
    expected = [(d.code, d.start.row - 1) for d in api.lint_text(text, str(path), api.load_settings(str(path)))]
    assert sorted((d.code, d.range.start.line) for d in diags) == sorted(expected)
    d = next(d for d in diags if d.code == "BL402")
    assert not any("noqa" in a.title for a in await code_actions(client, uri, d.range))

    yaml_text = "train_batch_size: 64\ntrain_micro_batch_size_per_gpu: 8\ngradient_accumulation_steps: 3\n"
    yuri = open_doc(client, tmp_path / "ds_config.yaml", yaml_text, language="yaml")
    diags = await wait_for(client, yuri, lambda ds: "BL402" in codes(ds))
    d = next(d for d in diags if d.code == "BL402")
    noqa = next(a for a in await code_actions(client, yuri, d.range) if a.title == "Suppress with `# noqa: BL402`")
    change_doc(client, yuri, apply_edits(yaml_text, noqa.edit.changes[yuri]), 2)
    diags = await wait_for(client, yuri, version=2)
    assert [x for x in diags if x.code == "BL402" and x.range.start.line == d.range.start.line] == []


def _cells():
    return [
        "import torch\n%matplotlib inline\naccum_steps = 8",
        "for i, batch in enumerate(dl):\n"
        "    loss = model(**batch).loss / accum_steps\n"
        "    loss.backward()\n"
        "    optimizer.step()\n"
        "    optimizer.zero_grad()",
    ]


async def test_notebook_cells_are_linted_as_one_document(tmp_path):
    nb_uri = (tmp_path / "train.ipynb").as_uri()
    cell_uris = [f"vscode-notebook-cell:{tmp_path / 'train.ipynb'}#cell{i}" for i in range(2)]
    async with session(tmp_path, notebooks=True) as client:
        assert client.server_capabilities.notebook_document_sync is not None
        client.notebook_document_did_open(
            types.DidOpenNotebookDocumentParams(
                notebook_document=types.NotebookDocument(
                    uri=nb_uri,
                    notebook_type="jupyter-notebook",
                    version=1,
                    cells=[types.NotebookCell(kind=types.NotebookCellKind.Code, document=u) for u in cell_uris],
                ),
                cell_text_documents=[
                    types.TextDocumentItem(uri=u, language_id="python", version=1, text=t)
                    for u, t in zip(cell_uris, _cells())
                ],
            )
        )
        diags = await wait_for(client, cell_uris[1], lambda ds: "BL101" in codes(ds))
        assert next(d for d in diags if d.code == "BL101").range.start.line == 3  # cell-relative
        assert await wait_for(client, cell_uris[0]) == []

        # noqa inside a cell
        bl101 = next(d for d in diags if d.code == "BL101")
        actions = await code_actions(client, cell_uris[1], bl101.range)
        noqa = next(a for a in actions if "noqa" in a.title)
        new = apply_edits(_cells()[1], noqa.edit.changes[cell_uris[1]])
        assert new.splitlines()[3] == "    optimizer.step()  # noqa: BL101"

        # editing the cell: the diagnostics follow
        client.notebook_document_did_change(
            types.DidChangeNotebookDocumentParams(
                notebook_document=types.VersionedNotebookDocumentIdentifier(uri=nb_uri, version=2),
                change=types.NotebookDocumentChangeEvent(
                    cells=types.NotebookDocumentCellChanges(
                        text_content=[
                            types.NotebookDocumentCellContentChanges(
                                document=types.VersionedTextDocumentIdentifier(uri=cell_uris[1], version=2),
                                changes=[types.TextDocumentContentChangeWholeDocument(text=new)],
                            )
                        ]
                    )
                ),
            )
        )
        await wait_for(client, cell_uris[1], lambda ds: "BL101" not in codes(ds))


async def test_ipynb_without_notebook_sync_is_linted_as_a_file(tmp_path, shared):
    path = tmp_path / "train.ipynb"
    nb = {
        "cells": [
            {"cell_type": "markdown", "metadata": {}, "source": ["# Training\n", "optimizer.step() explained\n"]},
            *[
                {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                 "source": c.splitlines(keepends=True)}
                for c in _cells()
            ],
        ],
        "metadata": {"language_info": {"name": "python"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    text = json.dumps(nb, indent=1)
    path.write_text(text)
    client = shared
    uri = open_doc(client, path, text, language="json")
    diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
    d = next(d for d in diags if d.code == "BL101")
    line = text.splitlines()[d.range.start.line]
    assert '"    optimizer.step()' in line
    assert line[d.range.start.character :].startswith("optimizer.step()")
    published = len([p for p in client.published if p.uri == uri])

    # edits to the JSON are not linted (half-typed JSON); saving is
    gated = text.replace('"    optimizer.step()\\n"', '"    if (i + 1) % accum_steps == 0: optimizer.step()\\n"')
    assert gated != text
    change_doc(client, uri, gated, 2)
    await asyncio.sleep(1.0)
    assert len([p for p in client.published if p.uri == uri]) == published
    path.write_text(gated)
    client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))
    await wait_for(client, uri, lambda ds: "BL101" not in codes(ds))
    assert latest(client, uri).version == 2


@pytest.mark.parametrize("editor", ["visual-studio-code", "neovim@v0.11.0", "emacs"])
async def test_real_editor_capabilities(tmp_path, editor):
    """The capabilities real editors send (recorded by pytest-lsp): diagnostics, the noqa action, a hover
    in a format the editor renders."""
    from pytest_lsp import client_capabilities

    caps = client_capabilities(editor)
    path = tmp_path / "train.py"
    async with session(tmp_path, capabilities=caps) as client:
        uri = open_doc(client, path, BUGGY)
        diags = await wait_for(client, uri, lambda ds: "BL101" in codes(ds))
        bl101 = next(d for d in diags if d.code == "BL101")
        actions = await code_actions(client, uri, bl101.range)
        assert any(a.title == "Suppress with `# noqa: BL101`" for a in actions)
        hover = await client.text_document_hover_async(
            types.HoverParams(text_document=types.TextDocumentIdentifier(uri=uri), position=bl101.range.start)
        )
        formats = caps.text_document.hover.content_format if caps.text_document and caps.text_document.hover else None
        want = types.MarkupKind.Markdown if not formats or types.MarkupKind.Markdown in formats else types.MarkupKind.PlainText
        assert hover.contents.kind == want and "BL101" in hover.contents.value


CHAIN_SERVER = textwrap.dedent(
    '''\
    import sys

    import libcst as cst

    from bertlint.registry import rule
    from bertlint.types import Applicability, Severity


    class _Calls(cst.CSTVisitor):
        def __init__(self):
            self.calls = []

        def visit_Call(self, node):
            self.calls.append(node)


    def _calls(ctx, name):
        v = _Calls()
        ctx.module.visit(v)
        return [c for c in v.calls if ctx.module.code_for_node(c.func) == name]


    @rule("BL995", "test-chain-a", Severity.INFO, "old_api() (test only)", fix=Applicability.SAFE)
    def chain_a(ctx):
        for c in _calls(ctx, "old_api"):
            ctx.report(c, "old_api", fix=ctx.fix("use mid_api()", [ctx.edit_replace(c.func, "mid_api")]))


    @rule("BL994", "test-chain-b", Severity.INFO, "mid_api() (test only)", fix=Applicability.SAFE)
    def chain_b(ctx):
        for c in _calls(ctx, "mid_api"):
            ctx.report(c, "mid_api", fix=ctx.fix("use new_api()", [ctx.edit_replace(c.func, "new_api")]))


    from bertlint.lsp import main

    sys.exit(main(sys.argv[1:]))
    '''
)


async def test_fix_all_reaches_a_fixed_point(tmp_path):
    """A fix that exposes another fixable finding: the fix-all action re-lints and re-applies until nothing
    changes, as `bertlint --fix` does, so one action leaves nothing for the next."""
    server = tmp_path / "server_with_chained_fixes.py"
    server.write_text(CHAIN_SERVER)
    src = "import torch\n\nold_api()\nx = 1\n"
    path = tmp_path / "train.py"
    async with session(tmp_path, server=[sys.executable, str(server)]) as client:
        uri = open_doc(client, path, src)
        diags = await wait_for(client, uri, lambda ds: "BL995" in codes(ds))
        assert "BL994" not in codes(diags)
        whole = types.Range(start=types.Position(line=0, character=0), end=types.Position(line=0, character=0))
        actions = await code_actions(client, uri, whole, only=["source.fixAll"])
        assert [a.kind for a in actions] == ["source.fixAll.bertlint"]
        after = apply_edits(src, actions[0].edit.changes[uri])
        assert after == "import torch\n\nnew_api()\nx = 1\n"
        assert [d.code for d in actions[0].diagnostics] == ["BL995"]  # the published finding it fixes
        change_doc(client, uri, after, 2)
        await wait_for(client, uri, lambda ds: len(ds) == 0)
        again = await code_actions(client, uri, whole, only=["source.fixAll"])
        assert again == []  # nothing left to fix


async def test_saving_a_sibling_module_relints_the_files_that_read_it(tmp_path, shared):
    """The analysis reads the project's own imported modules (bertlint/analysis/project.py): when one of them is
    saved, an open file whose last lint read it is linted again."""
    client = shared
    (tmp_path / "pyproject.toml").write_text("")
    helper = tmp_path / "step_helpers.py"
    helper.write_text("def backward_micro_batch(loss):\n    loss.backward()\n")
    train = tmp_path / "train.py"
    text = textwrap.dedent("""\
        import torch
        from step_helpers import backward_micro_batch

        GRAD_ACCUM = 4


        def train(model, loader, optimizer):
            for step, (x, y) in enumerate(loader):
                loss = torch.nn.functional.cross_entropy(model(x), y)
                backward_micro_batch(loss)
                if (step + 1) % GRAD_ACCUM == 0 or step + 1 == len(loader):
                    optimizer.step()
                    optimizer.zero_grad()
        """)
    train.write_text(text)
    uri = open_doc(client, train, text)
    await wait_for(client, uri, lambda ds: "BL103" in codes(ds))
    helper.write_text("def backward_micro_batch(loss):\n    (loss / 4).backward()\n")
    client.text_document_did_save(types.DidSaveTextDocumentParams(types.TextDocumentIdentifier(uri=helper.as_uri())))
    await wait_for(client, uri, lambda ds: "BL103" not in codes(ds))
