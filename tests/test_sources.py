"""Reading inputs: encodings (PEP 263, BOM), binary files, notebooks (cells, magics), config files, discovery."""

from __future__ import annotations

import json
import os

import pytest

from bertlint.api import check_file, lint_text
from bertlint.config import Settings, clear_caches
from bertlint.context import ConfigContext
from bertlint.sources import (
    DecodeError,
    cell_to_python,
    config_kind,
    decode,
    discover,
    key_positions,
    parse_config_text,
    read_notebook,
)

S = Settings(select=["BL001"])


@pytest.fixture(autouse=True)
def _fresh():
    clear_caches()
    yield


def test_pep263_coding_line_is_honoured():
    data = "# -*- coding: latin-1 -*-\nimport torch\nname = 'café'\n".encode("latin-1")
    text, enc = decode(data)
    assert enc == "latin-1" and "café" in text


def test_coding_line_on_second_line_and_bom():
    data = b"#!/usr/bin/env python\n# vim: set fileencoding=cp1252 :\nx = '\x80'\n"
    text, enc = decode(data)
    assert enc == "cp1252" and "\u20ac" in text
    text, enc = decode(b"\xef\xbb\xbfimport torch\n")
    assert enc == "utf-8-sig" and text == "import torch\n"


def test_invalid_utf8_is_reported_at_the_byte(tmp_path):
    p = tmp_path / "train.py"
    p.write_bytes(b"import torch\nx = 1\ny = '\xff'\n")
    r = check_file(str(p), S)
    assert [(d.code, d.start.row, d.start.column) for d in r.diagnostics] == [("BL001", 3, 6)]
    assert "byte 0xff at line 3" in r.diagnostics[0].message
    assert "PEP 263" in r.diagnostics[0].message


def test_unknown_declared_encoding(tmp_path):
    with pytest.raises(DecodeError, match="unknown encoding 'klingon'"):
        decode(b"# coding: klingon\nimport torch\nx = '\xff'\n")


def test_codec_registered_by_a_package_reads_as_utf8(tmp_path):
    # future-fstrings registers its codec from a .pth file; the source is UTF-8 that Python 3.6+ parses natively
    text, enc = decode("# -*- coding: future_fstrings -*-\nname = 'é'\nprint(f'{name}')\n".encode())
    assert enc == "utf-8" and "f'{name}'" in text
    p = tmp_path / "train.py"
    p.write_bytes(b"# -*- coding: future_fstrings -*-\nimport torch\nprint(f'{torch.__name__}')\n")
    assert [d.code for d in check_file(str(p), S).diagnostics] == []


def test_binary_file_is_skipped_with_a_warning(tmp_path):
    p = tmp_path / "model.py"
    p.write_bytes(b"\x00\x01torch\x00")
    r = check_file(str(p), S)
    assert r.diagnostics == []
    assert r.warnings == [f"{p}: skipped: binary file"]


def test_syntax_error_position(tmp_path):
    d = lint_text("import torch\n\ndef f(:\n    pass\n", "t.py", S)
    assert [(x.code, x.start.row) for x in d] == [("BL001", 3)]
    assert d[0].message.startswith("SyntaxError")


def test_files_without_training_machinery_are_not_parsed():
    assert lint_text("def f(:\n", "plain.py", S) == []


# ------------------------------------------------------------------------------------------- notebooks


def nb(*cells, lang="python"):
    return json.dumps(
        {
            "cells": [
                {"cell_type": kind, "source": src, "metadata": {}, "outputs": [], "execution_count": None}
                if kind == "code"
                else {"cell_type": kind, "source": src, "metadata": {}}
                for kind, src in cells
            ],
            "metadata": {"language_info": {"name": lang}},
            "nbformat": 4,
            "nbformat_minor": 5,
        }
    )


def test_magics_are_neutralised_line_for_line():
    lines = ["%matplotlib inline\n", "!pip install torch\n", "files = !ls\n", "for i in x:\n", "    %time f(i)\n", "model?\n", "x = 1\n"]
    out = cell_to_python(lines)
    assert out == ["pass\n", "pass\n", "files = None\n", "for i in x:\n", "    pass\n", "pass\n", "x = 1\n"]
    assert cell_to_python(["%%bash\n", "echo hi\n"]) == ["\n", "\n"]
    # a wildcard search (``%psearch`` through ``?``): ``torch.*Tensor?``; a product stays Python
    assert cell_to_python(["torch.*Tensor?\n", "y = a*b\n"]) == ["pass\n", "y = a*b\n"]
    assert cell_to_python(["%%time\n", "y = 2\n"]) == ["pass\n", "y = 2\n"]


def test_automagic_lines_are_neutralised_and_python_lines_kept():
    """IPython runs ``pip install x`` / ``cd data`` as the %pip / %cd magics (automagic, on by default); a line that
    can continue as Python (``cd = 3``, ``pip.main(...)``, ``env["X"]``, a bare ``pip``) is Python."""
    lines = ["pip install diffusers transformers\n", "pip -q install -U accelerate\n", "  cd data\n", "cd = 3\n",
             "pip.main(['install'])\n", "env['X']\n", "pip\n", "conda install -y faiss\n", "x = 1\n"]
    assert cell_to_python(lines) == ["pass\n", "pass\n", "  pass\n", "cd = 3\n", "pip.main(['install'])\n",
                                     "env['X']\n", "pip\n", "pass\n", "x = 1\n"]
    text = nb(("code", "pip install diffusers\n"), ("code", "import torch\nx = torch.ones(2)\n"))
    assert lint_text(text, "nb.ipynb", S) == []


def test_shell_alias_lines_are_neutralised_and_python_lines_kept():
    """IPython's default POSIX aliases (``ls``, ``cat``, ``rm``, ``mkdir`` ...) run as shell commands through
    automagic: a line that is no Python statement, or a no-effect expression whose argument starts like a path or an
    option (``cat /content/m.json``), is the alias; an assignment, a call or an attribute is Python."""
    lines = ["ls /content/checkpoints/\n", "cat /content/metrics.json\n", "rm -rf runs\n", "  mkdir -p a/b\n",
             "cp a.txt b.txt\n", "ls ./out\n", "cat = 3\n", "cat -= 1\n", "rm /= 2\n", "ls(x)\n", "ls.append(1)\n",
             "clear\n", "x = 1\n"]
    assert cell_to_python(lines) == ["pass\n", "pass\n", "pass\n", "  pass\n", "pass\n", "pass\n", "cat = 3\n",
                                     "cat -= 1\n", "rm /= 2\n", "ls(x)\n", "ls.append(1)\n", "clear\n", "x = 1\n"]
    text = nb(("code", "ls /content/checkpoints/\n"), ("code", "cat /content/checkpoints/metrics.json\n"),
              ("code", "import torch\nx = torch.ones(2)\n"))
    assert lint_text(text, "nb.ipynb", S) == []


def test_notebook_cells_are_joined_with_a_row_map():
    text = nb(("markdown", "# title"), ("code", "import torch\n!nvidia-smi"), ("code", ["x = 1\n", "y = 2"]))
    n = read_notebook(text)
    assert n.source == "import torch\npass\nx = 1\ny = 2\n"
    # cells are numbered as Jupyter shows them: the markdown cell is cell 1
    assert n.rows == [(2, 1), (2, 2), (3, 1), (3, 2)]
    assert n.map_row(4) == (3, 2)
    assert n.lines_of(3) == ["x = 1\n", "y = 2"] and n.lines_of(1) is None


def test_notebook_syntax_error_is_reported_by_cell_and_the_rest_still_parsed():
    text = nb(("code", "import torch\n"), ("code", "def broken(:\n    pass\n"), ("code", "x = (1,\n"))
    d = lint_text(text, "nb.ipynb", S)
    assert [(x.code, x.cell, x.start.row) for x in d] == [("BL001", 2, 1), ("BL001", 3, 1)]


def test_notebook_in_other_language_and_bad_json():
    assert lint_text(nb(("code", "import torch\nx = (\n"), lang="R"), "nb.ipynb", S) == []
    d = lint_text('{"cells": [', "nb.ipynb", S)
    assert d[0].code == "BL001" and d[0].start.row == 1 and "invalid notebook JSON" in d[0].message
    d = lint_text("[]", "nb.ipynb", S)
    assert d[0].code == "BL001" and "not a Jupyter notebook" in d[0].message


# --------------------------------------------------------------------------------------- config files


def test_broken_json_config_is_reported_at_its_position():
    d = lint_text('{\n  "train_batch_size": 8,\n  "zero_optimization": {"stage": 2,}\n}\n', "ds.json", S)
    assert [(x.code, x.start.row, x.start.column) for x in d] == [("BL001", 3, 36)]
    assert d[0].message.startswith("invalid JSON")


def test_broken_yaml_config_is_reported_at_its_position():
    d = lint_text("compute_environment: LOCAL_MACHINE\ndistributed_type: [MULTI_GPU\nnum_processes: 2\n", "acc.yaml", S)
    assert d[0].code == "BL001" and d[0].start.row == 3 and d[0].message.startswith("invalid YAML")


def test_config_kind_and_key_positions():
    text = '{\n  "train_micro_batch_size_per_gpu": 4,\n  "zero_optimization": {\n    "stage": 3\n  },\n  "x": [1, {"y": 2}]\n}\n'
    data, fmt = parse_config_text(text, "ds.json")
    assert fmt == "json" and config_kind(data) == "deepspeed"
    pos = key_positions(text, fmt)
    assert pos[("zero_optimization", "stage")] == (4, 5)
    assert pos[("x", 1, "y")] == (6, 13)
    ctx = ConfigContext("ds.json", text, data, Settings(), fmt)
    assert ctx.kind == "deepspeed"
    assert (ctx.key_position(("zero_optimization", "stage")).row, ctx.key_position(("zero_optimization", "nope")).row) == (4, 3)
    y = "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  zero_stage: 2\n"
    data, fmt = parse_config_text(y, "acc.yaml")
    assert config_kind(data) == "accelerate"
    assert key_positions(y, fmt)[("deepspeed_config", "zero_stage")] == (4, 3)
    assert config_kind({"foo": 1}) == "unknown" and config_kind([1]) == "unknown"


# ------------------------------------------------------------------------------------------ discovery


def test_discovery_skips_default_excludes_and_unrelated_json(tmp_path):
    for rel, text in {
        "train.py": "import torch\n",
        "nb.ipynb": "{}",
        "ds_config.json": '{"zero_optimization": {"stage": 2}}',
        "package.json": '{"name": "web"}',
        "accelerate.yaml": "distributed_type: MULTI_GPU\n",
        ".github/workflows/ci.yml": "on: push\n",
        "README.md": "torch",
        ".venv/lib/x.py": "import torch\n",
        "build/lib/x.py": "import torch\n",
        "node_modules/a/b.py": "import torch\n",
        "sub/__pycache__/x.py": "import torch\n",
        "sub/model.py": "import torch\n",
        "pkg.egg-info/x.py": "import torch\n",
    }.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    found = [os.path.relpath(p, tmp_path) for p, _ in discover([str(tmp_path)])]
    assert found == ["accelerate.yaml", "ds_config.json", "nb.ipynb", "train.py", os.path.join("sub", "model.py")]
    # a file named explicitly is always read
    assert list(discover([str(tmp_path / "package.json")])) == [(str(tmp_path / "package.json"), True)]
    excluded = [os.path.relpath(p, tmp_path) for p, _ in discover([str(tmp_path)], lambda p: p.endswith("sub"))]
    assert os.path.join("sub", "model.py") not in excluded


def test_shared_node_index():
    import libcst as cst

    from bertlint.context import FileContext

    src = "import torch\n\n@deco\ndef f(x):\n    return g(h(x))\n\nfor b in loader:\n    opt.step()\n"
    ctx = FileContext("t.py", src, cst.parse_module(src), Settings())
    calls = ctx.index.of(cst.Call)
    assert [cst.Module([]).code_for_node(c.func) for c in calls] == ["g", "h", "opt.step"]
    step = calls[2]
    assert [type(a).__name__ for a in ctx.index.ancestors(step)][:4] == ["Expr", "SimpleStatementLine", "IndentedBlock", "For"]
    assert len(ctx.index.of(cst.BaseCompoundStatement)) == 2  # FunctionDef and For (subclasses)
    assert ctx.index.parent(ctx.module) is None


def test_trainer_state_is_not_a_deepspeed_config(tmp_path):
    state = {"best_metric": None, "epoch": 3.0, "global_step": 30, "log_history": [], "train_batch_size": 8}
    assert config_kind(state) == "unknown"
    (tmp_path / "trainer_state.json").write_text(json.dumps(state))
    assert list(discover([str(tmp_path)])) == []
    assert config_kind({"train_batch_size": 32, "fp16": {"enabled": True}}) == "deepspeed"
    assert config_kind({"train_batch_size": 32}) == "deepspeed"
    assert config_kind({"gradient_accumulation_steps": 4}) == "unknown"


def test_launch_json_passing_training_flags_is_not_a_config(tmp_path):
    """A VS Code launch.json (JSON with comments) whose "args" pass --gradient_accumulation_steps to a script names the
    setting as a value, not a key: not discovered in a folder, so no BL001 for its comments; a DeepSpeed or accelerate
    file beside it still is."""
    (tmp_path / ".vscode").mkdir()
    (tmp_path / ".vscode" / "launch.json").write_text(
        '{\n    // Use IntelliSense to learn about possible attributes.\n    "version": "0.2.0",\n'
        '    "configurations": [{"name": "train", "type": "python", "program": "train.py",\n'
        '        "args": ["--gradient_accumulation_steps", "4", "--deepspeed_config", "ds.json", "--mixed_precision=bf16"]}]\n}\n')
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}')
    (tmp_path / "accelerate.yaml").write_text("compute_environment: LOCAL_MACHINE\nmixed_precision: bf16\n")
    found = [os.path.relpath(p, tmp_path) for p, _ in discover([str(tmp_path)])]
    assert found == ["accelerate.yaml", "ds.json"]


def test_json_template_filled_in_by_a_launcher_is_not_a_config(tmp_path):
    """A DeepSpeed JSON template whose values are placeholders a launcher script substitutes (``sed
    s/CONFIG_BATCH_SIZE/...``, ``{{ micro }}``) is not JSON yet: not discovered in a folder (no BL001 error for it),
    while the real config beside it is, and a template named on the command line is still read (and reported)."""
    (tmp_path / "ds_config_TEMPLATE.json").write_text(
        '{\n  "train_batch_size" : CONFIG_BATCH_SIZE,\n  "train_micro_batch_size_per_gpu": CONFIG_MBSIZE,\n'
        '  "zero_optimization": {\n    "stage": ZERO_STAGE\n  },\n  "fp16": {"enabled": true}\n}\n')
    (tmp_path / "ds_jinja.json").write_text('{"train_micro_batch_size_per_gpu": {{ micro }}, "steps_per_print": 10}\n')
    (tmp_path / "ds.json").write_text(
        '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "wall_clock_breakdown": false,\n'
        ' "fp16": {"enabled": true, "loss_scale": 0}, "zero_optimization": {"stage": null}}\n')
    (tmp_path / "broken.json").write_text('{"train_batch_size": 32,, "gradient_clipping": 1.0}\n')
    found = [os.path.relpath(p, tmp_path) for p, _ in discover([str(tmp_path)])]
    assert found == ["broken.json", "ds.json"]  # a plain syntax error is still reported: only placeholders skip
    named = [p for p, _ in discover([str(tmp_path / "ds_config_TEMPLATE.json")])]
    assert named == [str(tmp_path / "ds_config_TEMPLATE.json")]


def test_notebook_line_that_only_looks_like_a_magic():
    text = nb(("code", "import torch\ntotal = (a\n         % b)\n!ls\n"), ("code", "y = (\n"))
    d = lint_text(text, "nb.ipynb", S)
    # cell 1 parses neither way (magics neutralised or as written): reported where the first attempt failed
    assert [(x.cell, x.start.row) for x in d] == [(1, 3), (2, 1)]
    ok = nb(("code", "import torch\ntotal = (a\n         % b)\n"))
    assert lint_text(ok, "nb.ipynb", S) == []


def test_pathological_nesting_is_reported_not_crashed(tmp_path):
    """libcst's native parser crashes the interpreter on thousands of nested brackets: CPython is asked first."""
    import subprocess
    import sys

    deep = tmp_path / "deep.py"
    deep.write_text("import torch\nx = " + "(" * 3000 + "1" + ")" * 3000 + "\n")
    p = subprocess.run(
        [sys.executable, "-m", "bertlint", "--output-format", "concise", str(deep)], capture_output=True, text=True
    )
    assert p.returncode == 1, p.stderr
    assert p.stdout.startswith(f"{deep}:2:") and "BL001 SyntaxError: too many nested parentheses" in p.stdout


def test_a_rule_hitting_the_recursion_limit_is_skipped_with_one_warning():
    from bertlint import engine, registry
    from bertlint.types import Severity

    def endless(ctx):
        def f(n):
            return f(n + 1)

        f(0)

    registry.all_rules()
    registry.rule("BL996", "demo-deep", Severity.ERROR, "recursion")(endless)
    warnings, errors = [], []
    old = engine.on_warning, engine.on_internal_error
    engine.on_warning = lambda f, m: warnings.append((f, m))
    engine.on_internal_error = lambda c, f, e: errors.append(c)
    try:
        assert lint_text("import torch\nx = 1\n", "deep.py", Settings(select=["BL996"])) == []
    finally:
        engine.on_warning, engine.on_internal_error = old
        registry._RULES.pop("BL996", None)
    assert warnings == [("deep.py", "nested too deeply to analyse; skipped BL996")] and errors == []


def test_fast_positions_equal_libcst_position_provider():
    """bertlint.positions must give exactly libcst's PositionProvider ranges, node for node."""
    from pathlib import Path

    import libcst as cst
    from libcst.metadata import MetadataWrapper, PositionProvider

    from bertlint.positions import Positions

    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "benchmarks" / "data").glob("*.py")) + sorted((root / "fixtures").rglob("*.py"))[:60]
    texts = [p.read_text(encoding="utf-8") for p in files] + [
        "import torch\r\nx = (1,\r\n     2)\r\nif x:\r\n\ty = 3  # c\r\n",
        "import torch\rx = 1\r",
        "@deco\nasync def f(a, *b, c=1, **d) -> int:\n    '''doc'''\n    return [i async for i in g() if i]\n",
        "x = f'{a!r:>{w}}' + b'\\x00'\nwith (open(a) as f, open(b) as g):\n    pass\n",
    ]
    checked = 0
    for text in texts:
        module = cst.parse_module(text)
        ref = MetadataWrapper(module, unsafe_skip_copy=True).resolve(PositionProvider)
        mine = Positions(module)
        assert len(mine) == len(ref)
        for node, rng in ref.items():
            assert mine[node] == rng, (type(node).__name__, rng, mine[node])
            checked += 1
    assert checked > 10000


def test_statement_positions_equal_whole_module_positions():
    """bertlint.positions.StatementPositions (one top-level statement's code generated, placed by its unique
    occurrence at a line start) must give exactly Positions' ranges, node for node, and fall back to them where
    a statement cannot be placed (code that occurs twice, the last statement of a text without a final newline,
    whitespace left after the last newline)."""
    from pathlib import Path

    import libcst as cst

    from bertlint.context import NodeIndex
    from bertlint.positions import Positions, StatementPositions

    root = Path(__file__).resolve().parent.parent
    files = sorted((root / "benchmarks" / "data").glob("*.py")) + sorted((root / "fixtures").rglob("*.py"))[:80]
    texts = [p.read_text(encoding="utf-8") for p in files] + [
        "import torch\r\nx = (1,\r\n     2)\r\nif x:\r\n\ty = 3  # c\r\n",
        "import torch\rx = 1\r",
        "x = 1\n\nx = 1\n\nx = 1",  # the same statement three times, no final newline
        "def f():\n    pass\n# c\n\ndef f():\n    pass\n",
        "s = '''\nx = 1\n'''\nx = 1\n",  # the statement's code also at a line start inside a string
        "import os\nx = 1\n   \n   ",  # whitespace after the last newline: libcst drops it
        "@deco\nclass A:\n    # c\n    def f(self):\n        return 1\n\n\nA()\n",
    ]
    placed = fell_back = 0
    for text in texts:
        module = cst.parse_module(text)
        assert text.startswith(module.code)
        ref = Positions(module)
        index = NodeIndex(module)
        mine = StatementPositions(module, text, index.parent)
        nodes = [n for t, ns in index._by_type.items() if t is not cst.Module for n in ns]
        for node in nodes:
            assert mine[node] == ref[node], (type(node).__name__, ref[node], mine[node])
            assert node in mine and mine.get(node) == ref[node]
        placed += sum(v is not None for v in mine._stmts.values())
        fell_back += sum(v is None for v in mine._stmts.values())
        assert mine[module] == ref[module]  # not a statement: the whole-module positions
    assert placed > 500 and fell_back >= 3
