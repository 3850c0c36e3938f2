"""Reading inputs: bytes -> text (PEP 263, BOM, binary detection), notebooks (code cells -> one module with a
row map back to cell and line; IPython magics and ``!shell`` lines neutralised), and file discovery with the
default excludes and a cheap content check for JSON/YAML configuration files."""

from __future__ import annotations

import os
import re
from bertlint._dataclass import dataclass, field
from typing import Iterator, Optional

PY_SUFFIXES = (".py", ".pyi")
NOTEBOOK_SUFFIXES = (".ipynb",)
CONFIG_SUFFIXES = (".json", ".yaml", ".yml")

DEFAULT_EXCLUDES = frozenset(
    {
        ".git",
        ".hg",
        ".svn",
        ".venv",
        "venv",
        ".env",
        "env",
        ".tox",
        ".nox",
        ".mypy_cache",
        ".pytest_cache",
        ".ruff_cache",
        ".ipynb_checkpoints",
        "__pycache__",
        "__pypackages__",
        "build",
        "dist",
        "node_modules",
        "site-packages",
        ".eggs",
    }
)


def kind_of(filename: str) -> str:
    """"python" | "notebook" | "config" | "other" by suffix (unknown suffixes are read as Python)."""
    low = filename.lower()
    if low.endswith(NOTEBOOK_SUFFIXES):
        return "notebook"
    if low.endswith(CONFIG_SUFFIXES):
        return "config"
    if low.endswith(PY_SUFFIXES):
        return "python"
    return "other"


# ------------------------------------------------------------------------------------------------ decoding


class DecodeError(Exception):
    def __init__(self, message: str, row: int = 1, column: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.row = row
        self.column = column


class BinaryFile(Exception):
    pass


_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
_BLANK = re.compile(rb"^[ \t\f]*(?:[#\r\n]|$)")


def _declared_encoding(data: bytes) -> Optional[str]:
    """The PEP 263 encoding declared on line 1 or 2, if any."""
    lines = data.split(b"\n", 2)
    for i, line in enumerate(lines[:2]):
        m = _CODING.match(line)
        if m:
            return m.group(1).decode("ascii", "replace")
        if i == 0 and not _BLANK.match(line):
            break
    return None


def _wide_encoding(data: bytes) -> Optional[str]:
    """"utf-16" / "utf-32" (with a BOM, kept when written back) or the BOM-less "utf-16-le" ... of a text file."""
    if data.startswith((b"\xff\xfe\x00\x00", b"\x00\x00\xfe\xff")):
        return "utf-32"
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return "utf-16"
    head = data[:4]
    if len(head) == 4 and head[0] and not any(head[1:]):
        return "utf-32-le"
    if len(head) == 4 and head[3] and not any(head[:3]):
        return "utf-32-be"
    if len(head) >= 2 and head[0] and not head[1] and (len(head) < 4 or not head[3]):
        return "utf-16-le"
    if len(head) >= 2 and head[1] and not head[0] and (len(head) < 4 or not head[2]):
        return "utf-16-be"
    return None


def is_binary(data: bytes) -> bool:
    return b"\x00" in data[:8192]


def decode(data: bytes, python: bool = True) -> tuple[str, str]:
    """(text, encoding). Raises ``BinaryFile`` or ``DecodeError`` (with the position of the bad byte).

    Notebooks and configuration files (``python=False``) may also be UTF-16 or UTF-32 (JSON allows them;
    Windows editors write them): told by their byte-order mark, or for JSON without one by the zero bytes
    around the first ASCII character (RFC 4627)."""
    if not python:
        enc = _wide_encoding(data)
        if enc is not None:
            try:
                return data.decode(enc), enc
            except UnicodeDecodeError as e:
                raise DecodeError(f"the file is not valid {enc} text: byte offset {e.start}", 1, 1) from None
    if is_binary(data):
        raise BinaryFile()
    if data.startswith(b"\xef\xbb\xbf"):
        enc = "utf-8-sig"
    else:
        enc = (_declared_encoding(data) if python else None) or "utf-8"
    import codecs

    try:
        codecs.lookup(enc)
    except LookupError:
        # a codec a package registers at start-up (``# -*- coding: future_fstrings -*-``): the file itself is UTF-8
        # source for Pythons that parse it natively; read it so, or say what is unknown
        try:
            return data.decode("utf-8"), "utf-8"
        except UnicodeDecodeError:
            pass
        raise DecodeError(f"unknown encoding {enc!r} in the coding line (PEP 263), and the file is not UTF-8 "
                          f"text", 1, 1) from None
    try:
        return data.decode(enc), enc
    except UnicodeDecodeError as e:
        row = data.count(b"\n", 0, e.start) + 1
        col = e.start - (data.rfind(b"\n", 0, e.start) + 1) + 1
        bad = data[e.start : e.start + 1].hex()
        if enc in ("utf-8", "utf-8-sig"):
            hint = "; add a PEP 263 coding line (# -*- coding: latin-1 -*-) or convert the file to UTF-8"
        else:
            hint = f" (declared encoding {enc})"
        raise DecodeError(f"the file is not valid {enc} text: byte 0x{bad} at line {row}{hint}", row, col) from None


def encode(text: str, encoding: str) -> bytes:
    return text.encode(encoding)


# ----------------------------------------------------------------------------------------------- notebooks


@dataclass
class NotebookSource:
    """Code cells joined into one module. ``rows[i]`` = (cell number, row in cell) for combined row i + 1.

    Cell numbers are the ones Jupyter shows: every cell (markdown and raw ones too) counts, from 1; ``cells``
    holds the code cells only, in order, and ``cell_index[k]`` is the position of ``cells[k]`` in nb["cells"]
    (so code cell ``cells[k]`` is cell number ``cell_index[k] + 1``)."""

    source: str
    rows: list[tuple[int, int]]
    cells: list[list[str]]  # original lines (with ends) of each code cell
    cell_index: list[int]  # position of each code cell in nb["cells"]
    nb: dict = field(default_factory=dict)
    blanked: dict[int, tuple[int, int, str]] = field(default_factory=dict)  # cell -> syntax error (row, col, msg)
    # cells that could not be read (not an object, a "source" that is not text): (cell, row, col, message)
    problems: list[tuple[int, int, int, str]] = field(default_factory=list)

    def map_row(self, row: int) -> tuple[int, int]:
        if 1 <= row <= len(self.rows):
            return self.rows[row - 1]
        if self.rows:
            cell, r = self.rows[-1]
            return cell, r + (row - len(self.rows))
        return 1, row

    def cell_start(self, cell: int) -> int:
        """Combined row of the first line of ``cell``."""
        for i, (c, r) in enumerate(self.rows):
            if c == cell:
                return i + 1
        return len(self.rows) + 1

    def lines_of(self, cell: int) -> Optional[list[str]]:
        """The original lines of the code cell numbered ``cell`` (None: no such code cell)."""
        try:
            return self.cells[self.cell_index.index(cell - 1)]
        except ValueError:
            return None


# Cell magics whose body is Python; any other %% magic (bash, html, writefile ...) makes the cell non-Python.
_PY_CELL_MAGICS = {"time", "timeit", "capture", "prun", "debug", "pypy", "python", "python3", "memit", "mprun"}
_LINE_MAGIC = re.compile(r"^(?P<indent>[ \t]*)(?P<lhs>[A-Za-z_][\w, \t]*=[ \t]*)?(?:[!%]|\?\??[A-Za-z_*]|[A-Za-z_*][\w.*]*\?\??[ \t]*$)")


# IPython's automagic (on by default): a line magic called without its ``%`` (``pip install diffusers``, ``cd data``)
# when the word is followed by an argument that cannot continue a Python statement
_AUTOMAGIC = re.compile(
    r"^(?P<indent>[ \t]*)(?:pip|conda|mamba|cd|load_ext|reload_ext|matplotlib|env|set_env|autoreload|aimport|"
    r"tensorboard|pdb|xmode|store|bookmark)[ \t]+(?![ \t]*(?:[=(\[.,:;+*/%<>!&|^@)\]}]|$|(?:if|else|for|in|and|or|is|not)\b))"
)


# IPython's default shell aliases on POSIX (``%alias`` lists them), which automagic runs without ``!``:
# ``ls /content/out``, ``cat metrics.json``, ``rm -rf runs``. Only a line that is no Python statement on its own and
# whose argument cannot continue an expression, or an argument that starts like a path or an option (``/``, ``-``,
# ``~``, ``./``), is taken as one.
_SHELL_ALIAS = re.compile(
    r"^(?P<indent>[ \t]*)(?:ls|ll|lf|lk|ldir|lx|cat|cp|mv|rm|rmdir|mkdir|less|more|man|clear)[ \t]+"
    r"(?![ \t]*(?:[=(\[,:;+*%<>!&|^@)\]}]|\.(?!\.?/)|$|(?:if|else|for|in|and|or|is|not)\b))"
)


def _shell_alias(body: str):
    a = _SHELL_ALIAS.match(body)
    if a is None:
        return None
    import ast

    try:
        tree = ast.parse(body.strip())
    except SyntaxError:
        return a  # no Python statement: IPython runs it as the shell command
    # it parses: only an expression statement (no effect as Python: `cat / content / m.json`, `ls - la`) whose
    # argument starts like a path or an option is the alias; `cat -= 1`, `rm /= 2` are Python
    if len(tree.body) == 1 and isinstance(tree.body[0], ast.Expr) and \
            re.match(r"[ \t]*(?:/|-|~|\.\.?/)", body[a.end():]):
        return a
    return None


def _neutralise(line: str) -> str:
    """A magic / shell / help line becomes ``pass`` (or ``x = None``) with the same indentation."""
    body = line.rstrip("\r\n")
    end = line[len(body) :]
    m = _LINE_MAGIC.match(body)
    if not m:
        a = _AUTOMAGIC.match(body) or _shell_alias(body)
        if a is not None:
            return f"{a.group('indent')}pass{end}"
        return line
    indent = m.group("indent")
    lhs = m.group("lhs")
    if lhs:
        return f"{indent}{lhs.strip()} None{end}"
    return f"{indent}pass{end}"


def cell_to_python(lines: list[str]) -> list[str]:
    """The cell's lines with IPython syntax neutralised (same number of lines)."""
    if not lines:
        return []
    first = lines[0].strip()
    if first.startswith("%%"):
        name = first[2:].split(None, 1)[0] if len(first) > 2 else ""
        if name not in _PY_CELL_MAGICS:
            return ["\n" for _ in lines]
        out = ["pass\n"]
        rest = lines[1:]
    else:
        out = []
        rest = lines
    continued = False
    for line in rest:
        if continued:
            out.append("\n" if line.endswith("\n") else "")
            continued = line.rstrip("\r\n").endswith("\\")
            continue
        new = _neutralise(line)
        if new is not line:
            continued = line.rstrip("\r\n").endswith("\\")
        out.append(new)
    return out


def _cell_lines(cell: dict) -> list[str]:
    src = cell.get("source", "")
    if isinstance(src, list):
        text = "".join(s for s in src if isinstance(s, str))
    elif isinstance(src, str):
        text = src
    else:
        text = ""
    return text.splitlines(keepends=True)


def read_notebook(text: str) -> NotebookSource:
    """Parse the notebook JSON (raises ``DecodeError`` with the position) and join its code cells."""
    import json

    try:
        nb = json.loads(text)
    except json.JSONDecodeError as e:
        raise DecodeError(f"invalid notebook JSON: {e.msg}", e.lineno, e.colno) from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise DecodeError("not a Jupyter notebook: no \"cells\" list", 1, 1)
    meta = nb.get("metadata")
    info = meta.get("language_info") if isinstance(meta, dict) else None
    lang = info.get("name") if isinstance(info, dict) else None
    if isinstance(lang, str) and lang and lang.lower() != "python":
        return NotebookSource("", [], [], [], nb)
    cells: list[list[str]] = []
    index: list[int] = []
    problems: list[tuple[int, int, int, str]] = []
    for i, cell in enumerate(nb["cells"]):
        why = _unreadable_cell(cell)
        if why is not None:
            problems.append((i + 1, 1, 1, f"cell {i + 1} {why}; the cell was not checked"))
            continue
        if cell.get("cell_type") == "code":
            cells.append(_cell_lines(cell))
            index.append(i)
    out = join_cells(cells, index, nb)
    out.problems = problems
    return out


def _json_type(v) -> str:
    if v is None:
        return "null"
    return {bool: "a boolean", int: "a number", float: "a number", str: "a string", list: "an array", dict: "an object"}.get(
        type(v), type(v).__name__
    )


def _unreadable_cell(cell) -> Optional[str]:
    """Why a cell cannot be read as nbformat says (None: it can). Only code cells' sources matter."""
    if not isinstance(cell, dict):
        return f"is not a JSON object (got {_json_type(cell)})"
    if cell.get("cell_type") != "code":
        return None
    if "source" not in cell:
        return 'is a code cell without "source"'
    src = cell["source"]
    if isinstance(src, str):
        return None
    if isinstance(src, list):
        for j, item in enumerate(src):
            if not isinstance(item, str):
                return f'has a "source" whose item {j} is not a string (got {_json_type(item)})'
        return None
    return f'has a "source" that is neither a string nor a list of strings (got {_json_type(src)})'


def join_cells(
    cells: list[list[str]], index: list[int], nb: dict, blank: frozenset = frozenset(), raw: frozenset = frozenset()
) -> NotebookSource:
    """Join code cells (``index[k]``: the position of ``cells[k]`` among all the notebook's cells; the cell's
    number is ``index[k] + 1``); cells whose number is in ``blank`` become empty lines (syntax errors), cells in
    ``raw`` are taken as they are (a line such as ``% b`` continuing an expression is Python, not a magic)."""
    parts: list[str] = []
    rows: list[tuple[int, int]] = []
    for k, lines in enumerate(cells):
        n = index[k] + 1 if k < len(index) else k + 1
        py = ["\n" for _ in lines] if n in blank else list(lines) if n in raw else cell_to_python(lines)
        for r, line in enumerate(py, start=1):
            if not line.endswith("\n"):
                line += "\n"
            parts.append(line)
            rows.append((n, r))
    return NotebookSource("".join(parts), rows, cells, list(index), nb)


class NotebookJsonMap:
    """Where a cell-relative position lies in the notebook's own JSON text (what GitHub, SARIF viewers and an
    editor that opens the ``.ipynb`` as text show). Exact: each cell's ``source`` string(s) are located by a
    JSON scan and their escapes (``\\n``, ``\\"``, ``\\uXXXX``, surrogate pairs) are counted character by character.

        m = NotebookJsonMap(text)
        m.locate(cell, row, column) -> (line, column) in the JSON text (1-based, code points), or None
    """

    def __init__(self, text: str) -> None:
        import json

        self.text = text
        self.cells: dict[int, list[tuple[int, str]]] = {}  # cell number -> [(offset of the opening quote, str)]
        self._starts: Optional[list[int]] = None
        self.cell_at: dict[int, int] = {}  # cell number -> offset of the cell's "{" (cells without source text)
        self._lines: dict[int, tuple[str, list[int], list[tuple[int, int]]]] = {}
        try:
            nb = json.loads(text)
        except (ValueError, RecursionError):
            return
        cells = nb.get("cells") if isinstance(nb, dict) else None
        if not isinstance(cells, list):
            return
        values: dict = {}

        def want(path: tuple) -> bool:
            if len(path) == 2:
                return path[0] == "cells"
            return len(path) >= 3 and path[0] == "cells" and path[2] == "source" and len(path) <= 4

        try:
            _json_positions(text, {}, values, want)
        except Exception:  # a JSON text json.loads accepts but the scan does not follow: no positions
            return
        for i, cell in enumerate(cells):
            if ("cells", i) in values:
                self.cell_at[i + 1] = values[("cells", i)]
            src = cell.get("source") if isinstance(cell, dict) else None
            if isinstance(src, str) and ("cells", i, "source") in values:
                self.cells[i + 1] = [(values[("cells", i, "source")], src)]
            elif isinstance(src, list):
                segs = [(values[("cells", i, "source", j)], t) for j, t in enumerate(src) if isinstance(t, str)]
                self.cells[i + 1] = [(o, t) for o, t in segs if text[o : o + 1] == '"']

    def _cell(self, cell: int):
        hit = self._lines.get(cell)
        if hit is None:
            segs = self.cells.get(cell) or []
            joined = "".join(t for _, t in segs)
            line_starts = [0]
            for ln in joined.splitlines(keepends=True):  # the rows of ``_cell_lines``
                line_starts.append(line_starts[-1] + len(ln))
            bounds = []
            acc = 0
            for o, t in segs:
                bounds.append((acc, o))
                acc += len(t)
            hit = self._lines[cell] = (joined, line_starts, bounds)
        return hit

    def offset(self, cell: int, row: int, column: int) -> Optional[int]:
        """Offset in the JSON text of the character at (row, column) of ``cell`` (1-based)."""
        if not self.cells.get(cell):  # no source text (an unreadable or empty cell): the cell itself
            return self.cell_at.get(cell)
        joined, line_starts, bounds = self._cell(cell)
        if row < 1:
            row, column = 1, 1
        if row > len(line_starts) - 1:  # past the last line: the end of the cell
            k = len(joined)
        else:
            line_len = line_starts[row] - line_starts[row - 1]
            k = line_starts[row - 1] + min(max(column, 1) - 1, line_len)
        from bisect import bisect_right

        seg = max(bisect_right([b for b, _ in bounds], k) - 1, 0)
        base, quote = bounds[seg]
        return _json_string_offset(self.text, quote, k - base)

    def locate(self, cell: int, row: int, column: int) -> Optional[tuple[int, int]]:
        off = self.offset(cell, row, column)
        if off is None:
            return None
        if self._starts is None:
            self._starts = [0] + [m.end() for m in re.finditer("\n", self.text)]
        from bisect import bisect_right

        line = bisect_right(self._starts, off)
        return line, off - self._starts[line - 1] + 1


def _json_string_offset(text: str, quote: int, k: int) -> int:
    """Offset of the ``k``-th decoded character of the JSON string whose opening quote is at ``quote`` (``k`` = its
    length: the closing quote)."""
    i = quote + 1
    n = 0
    end = len(text)
    while n < k and i < end:
        c = text[i]
        if c == '"':
            break
        if c == "\\":
            if text[i + 1 : i + 2] == "u":
                cp = int(text[i + 2 : i + 6], 16)
                i += 12 if 0xD800 <= cp < 0xDC00 and text[i + 6 : i + 8] == "\\u" else 6
            else:
                i += 2
        else:
            i += 1
        n += 1
    return i


# ---------------------------------------------------------------------------------------------- discovery

# Cheap content check for JSON/YAML found in folders: only DeepSpeed and accelerate configurations are linted. The
# word must be a key (followed by ':', quoted or not), not a value: a VS Code launch.json (JSON with comments) passing
# "--gradient_accumulation_steps", "4" to a script is no configuration of ours.
_CONFIG_HINT = re.compile(
    r"(?<![\w-])(zero_optimization|train_micro_batch_size_per_gpu|train_batch_size|gradient_accumulation_steps"
    r"|distributed_type|compute_environment|deepspeed_config|mixed_precision|fsdp_config)[\"']?\s*:"
)


# A JSON template that a launcher script fills in before the run (``"train_batch_size": CONFIG_BATCH_SIZE`` replaced
# by ``sed``, ``{{ micro_batch }}`` by a template engine): a value that is a bare name (not true / false / null /
# NaN / Infinity) or a ``{{ }}`` placeholder. No JSON parser reads it as it is, and it is no configuration yet.
_JSON_PLACEHOLDER = re.compile(r"\"\s*:\s*(?:(?!(?:true|false|null|NaN|Infinity)\b)[A-Za-z_][A-Za-z0-9_]*\s*[,}\]\n]"
                               r"|\{\{)")


def looks_like_training_config(path: str) -> bool:
    """A JSON / YAML file found in a folder is linted when it names a DeepSpeed or accelerate key (as a key), unless
    it is a JSON template with placeholder values (``_JSON_PLACEHOLDER``: the script that fills it in is linted)."""
    try:
        with open(path, "rb") as f:
            head = f.read(65536)
    except OSError:
        return False
    text = head.decode("utf-8", "replace")
    if not _CONFIG_HINT.search(text) or '"log_history"' in text:
        return False
    if path.lower().endswith(".json") and _JSON_PLACEHOLDER.search(text):
        return False
    return True


def discover(
    paths: list[str], is_excluded=None
) -> Iterator[tuple[str, bool]]:
    """Yield (path, explicit) for every file to lint. Folders are walked recursively (sorted) skipping the
    default excludes and ``is_excluded(path)``; files named on the command line are always yielded."""
    for p in paths:
        if os.path.isdir(p):
            yield from ((f, False) for f in _walk(p, is_excluded))
        else:
            yield p, True


def _walk(root: str, is_excluded) -> Iterator[str]:
    for dirpath, dirnames, filenames in os.walk(root):
        keep = []
        for d in sorted(dirnames):
            if d in DEFAULT_EXCLUDES or d.endswith(".egg-info"):
                continue
            full = os.path.join(dirpath, d)
            if is_excluded is not None and is_excluded(full):
                continue
            keep.append(d)
        dirnames[:] = keep
        for name in sorted(filenames):
            k = kind_of(name)
            if k == "other":
                continue
            full = os.path.join(dirpath, name)
            if is_excluded is not None and is_excluded(full):
                continue
            if k == "config" and not looks_like_training_config(full):
                continue
            yield full


# ------------------------------------------------------------------------------------------ config files

_DEEPSPEED_KEYS = {
    "zero_optimization",
    "train_micro_batch_size_per_gpu",
    "train_batch_size",
    "zero_allow_untested_optimizer",
    "gradient_clipping",
    "steps_per_print",
    "wall_clock_breakdown",
    "activation_checkpointing",
}
_ACCELERATE_KEYS = {
    "compute_environment",
    "distributed_type",
    "num_processes",
    "machine_rank",
    "num_machines",
    "deepspeed_config",
    "fsdp_config",
    "main_training_function",
    "downcast_bf16",
    "use_cpu",
}


# Files that carry DeepSpeed-like keys but are not configurations (transformers' trainer_state.json).
_NOT_CONFIG_KEYS = {"log_history", "global_step", "best_model_checkpoint", "trial_name", "is_world_process_zero"}
# DeepSpeed keys that appear in other files too: they count only next to a second DeepSpeed key.
_DEEPSPEED_WEAK = {"train_batch_size", "gradient_accumulation_steps", "fp16", "bf16", "optimizer", "scheduler"}


def config_kind(data) -> str:
    """"deepspeed" | "accelerate" | "unknown", guessed from the top-level keys."""
    if not isinstance(data, dict):
        return "unknown"
    keys = set(k for k in data if isinstance(k, str))
    if keys & _NOT_CONFIG_KEYS:
        return "unknown"
    acc = len(keys & _ACCELERATE_KEYS)
    ds = len(keys & _DEEPSPEED_KEYS)
    weak = len(keys & _DEEPSPEED_WEAK)
    if acc and acc >= ds:
        return "accelerate"
    if ds and (ds + weak >= 2 or keys & (_DEEPSPEED_KEYS - {"train_batch_size", "gradient_clipping"})):
        return "deepspeed"
    return "unknown"


def parse_config_text(text: str, filename: str):
    """(data, fmt). Raises ``DecodeError`` with the position of a JSON/YAML syntax error."""
    low = filename.lower()
    if low.endswith(".json"):
        import json

        try:
            return json.loads(text), "json"
        except json.JSONDecodeError as e:
            raise DecodeError(f"invalid JSON: {e.msg}", e.lineno, e.colno) from None
        except RecursionError:
            raise DecodeError("invalid JSON: nested too deeply", 1, 1) from None
    try:
        import yaml
    except ImportError:  # pragma: no cover - pyyaml ships with transformers/accelerate
        raise DecodeError("cannot read YAML: PyYAML is not installed (pip install pyyaml)", 1, 1) from None
    try:
        docs = [d for d in yaml.safe_load_all(text) if d is not None]
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        row, col = (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)
        problem = e.problem or e.context or "syntax error"
        raise DecodeError(f"invalid YAML: {problem}", row, col) from None
    except yaml.YAMLError as e:
        raise DecodeError(f"invalid YAML: {e}", 1, 1) from None
    except RecursionError:
        raise DecodeError("invalid YAML: nested too deeply", 1, 1) from None
    data = next((d for d in docs if isinstance(d, dict)), docs[0] if docs else None)
    return data, "yaml"


def key_positions(text: str, fmt: str) -> dict:
    """{path tuple: (row, col)} for every key (and list item) of a JSON or YAML document; best effort."""
    out: dict = {}
    try:
        if fmt == "yaml":
            _yaml_positions(text, out)
        else:
            _json_positions(text, out)
    except Exception:  # best effort: keep what was found
        pass
    return out


def _yaml_positions(text: str, out: dict) -> None:
    import yaml

    for node in yaml.compose_all(text):
        if isinstance(node, yaml.MappingNode):
            _yaml_walk(node, (), out)
            return


def _yaml_walk(node, path: tuple, out: dict) -> None:
    import yaml

    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else None
            if key is None:
                continue
            p = path + (key,)
            out.setdefault(p, (k.start_mark.line + 1, k.start_mark.column + 1))
            _yaml_walk(v, p, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            p = path + (i,)
            out.setdefault(p, (v.start_mark.line + 1, v.start_mark.column + 1))
            _yaml_walk(v, p, out)


_JSON_WS = re.compile(r"[ \t\n\r]*")
_JSON_ATOM = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][-+]?\d+)?|true|false|null|NaN|-?Infinity")


def _json_positions(text: str, out: dict, values: Optional[dict] = None, want=None) -> None:
    """Fill ``out`` with {path: (row, col)} of every key and list item; with ``values``, also {path: offset of
    the value's first character} for the paths ``want(path)`` accepts."""
    from bisect import bisect_right
    from json.decoder import scanstring

    starts = [0] + [m.end() for m in re.finditer("\n", text)]

    def rc(off: int) -> tuple[int, int]:
        r = bisect_right(starts, off)
        return r, off - starts[r - 1] + 1

    def ws(i: int) -> int:
        return _JSON_WS.match(text, i).end()

    def value(i: int, path: tuple, depth: int) -> int:
        if depth > 200:
            raise ValueError("too deep")
        i = ws(i)
        if values is not None and want(path):
            values[path] = i
        c = text[i]
        if c == "{":
            i = ws(i + 1)
            if text[i] == "}":
                return i + 1
            while True:
                i = ws(i)
                key_off = i
                key, i = scanstring(text, i + 1)
                p = path + (key,)
                out.setdefault(p, rc(key_off))
                i = ws(i)
                i = value(i + 1, p, depth + 1)  # skip ':'
                i = ws(i)
                if text[i] == ",":
                    i += 1
                    continue
                return i + 1
        if c == "[":
            i = ws(i + 1)
            if text[i] == "]":
                return i + 1
            n = 0
            while True:
                i = ws(i)
                p = path + (n,)
                out.setdefault(p, rc(i))
                i = value(i, p, depth + 1)
                i = ws(i)
                n += 1
                if text[i] == ",":
                    i += 1
                    continue
                return i + 1
        if c == '"':
            return scanstring(text, i + 1)[1]
        m = _JSON_ATOM.match(text, i)
        if not m:
            raise ValueError("bad json")
        return m.end()

    value(0, (), 0)
