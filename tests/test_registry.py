"""The registry imports only the selected rules' modules; that relies on each ``bertlint/checks/blNNN.py``
defining the rule BLNNN and no other code."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys

from bertlint import registry

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_each_code_module_defines_its_own_code_only():
    registry.all_rules()
    for name in registry._module_names():
        if not registry._CODE_MODULE.fullmatch(name):
            continue
        mod = importlib.import_module(f"bertlint.checks.{name}")
        codes = {v.meta.code for v in vars(mod).values() if callable(v) and hasattr(v, "meta")}
        assert codes == {name.upper()}, (name, codes)


def test_select_imports_only_the_selected_modules_and_finds_the_same():
    fixture = os.path.join(ROOT, "fixtures", "loops", "ga_step_every_batch_bad.py")
    code = (
        "import json, sys\n"
        "from bertlint import api\n"
        "from bertlint.config import Settings\n"
        f"ds = api.lint_path({fixture!r}, Settings(select=['BL101']))\n"
        "mods = sorted(m for m in sys.modules if m.startswith('bertlint.checks.bl'))\n"
        "print(json.dumps([mods, [(d.code, d.start.row) for d in ds]]))\n"
    )
    env = dict(os.environ, BERTLINT_NO_CACHE="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, check=True)
    mods, found = json.loads(out.stdout)
    assert mods == ["bertlint.checks.bl101"]
    from bertlint import api
    from bertlint.config import Settings

    full = [(d.code, d.start.row) for d in api.lint_path(fixture) if d.code == "BL101"]
    assert [tuple(x) for x in found] == full and full
