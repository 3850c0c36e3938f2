"""The test suite runs the command line without its result cache (``.bertlint_cache``): tests monkeypatch rules and
analyses that the cache key cannot see. The cache's own tests (tests/test_cache.py) turn it back on."""

import os

os.environ.setdefault("BERTLINT_NO_CACHE", "1")
