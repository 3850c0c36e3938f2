"""The test suite runs the command line without its result cache (``.bertlint_cache``): tests monkeypatch rules and
analyses that the cache key cannot see. The cache's own tests (tests/test_cache.py) turn it back on."""

import os

os.environ.setdefault("BERTLINT_NO_CACHE", "1")

import pytest


@pytest.fixture(autouse=True)
def _engine_hooks_restored():
    """A test that runs the language server's lint in-process (``server.run_lint``) points the engine's
    process-wide hooks at the server's log; put them back after every test, so that a later test of the command
    line sees its own messages whatever the order the tests run in."""
    from bertlint import engine

    saved = (engine.on_internal_error, engine.on_warning)
    yield
    engine.on_internal_error, engine.on_warning = saved
    try:
        from bertlint.lsp import server
    except Exception:  # the lsp extra is not installed
        return
    server._guarded = False
