"""Command line (ruff's habits): ``bertlint [OPTIONS] PATH...``, ``bertlint rule CODE``, ``bertlint rules``,
and the lazily imported subcommands ``explain``, ``memory`` and ``lsp``.

The option parser is hand-written: ``bertlint FILE`` must start fast (no argparse, no pkg_resources), and the
error messages are ours. Exit codes: 0 nothing reported, 1 findings, 2 usage or configuration error.
"""

from __future__ import annotations

import os
import re
import sys
from typing import Optional

USAGE = """\
usage: bertlint [OPTIONS] [PATH ...]
       bertlint rule CODE            print a rule's page
       bertlint rules                list the rules (code, name, severity, fix)
       bertlint explain ...          explain a finding (see `bertlint explain --help`)
       bertlint memory ...           simulate a training step's memory (see `bertlint memory --help`)
       bertlint lsp                  language server over stdio
       bertlint --verify SCRIPT [--verify-steps N] [--verify-timeout S] [--report DIR] [-- SCRIPT ARGS ...]
"""

HELP = (
    USAGE
    + """
Lint transformer training scripts (.py, .ipynb) and DeepSpeed / accelerate configuration files (.json, .yaml)
for gradient-accumulation, mixed-precision, checkpointing and memory mistakes.

PATH: files or folders (recursive); `-` reads standard input (name it with --stdin-filename). Default: `.`.

options:
  --select CODES          enable only these codes or prefixes (comma-separated: BL101,BL2; ALL)
  --extend-select CODES   enable these in addition to the configured selection
  --ignore CODES          disable these codes or prefixes
  --output-format FORMAT  full (default), concise, json, json-lines, sarif, github, junit
  -o, --output-file PATH  write the report to PATH instead of standard output
  --statistics            print the number of findings per code instead of the findings
  --exit-zero             exit 0 even when there are findings
  --exit-non-zero-on-fix  exit 1 when --fix changed a file, even if nothing is left
  --fix                   apply safe fixes (and unsafe ones with --unsafe-fixes), writing the files
  --unsafe-fixes          also apply (with --fix / --diff) fixes that may change behaviour
  --diff                  print the fixes as a unified diff; write nothing (exit 1 when there is a diff)
  --add-noqa              add `# noqa: CODES` to every reported line (adopting bertlint on existing code)
  --stdin-filename NAME   the name of the file read from `-` (picks the reader and the configuration)
  --config FILE           use this pyproject.toml / bertlint.toml instead of the nearest one
  --config KEY=VALUE      override one setting, as TOML: --config "world-size = 8" (repeatable)
  --isolated              ignore every configuration file
  --exclude PATTERNS      extra glob patterns to skip while walking folders (comma-separated)
  --extend-exclude PATTERNS  the same, added to the configured `exclude`
  -j, --jobs N            worker processes for many files (default: CPU count; 1 = no processes)
  --no-cache              neither read nor write the result cache (.bertlint_cache/)
  --cache-dir DIR         the cache folder (default: .bertlint_cache in the current folder)
  --show-settings         print the settings used for the first file, then exit
  --show-files            print the files that would be checked, then exit
  -v, --verbose           say which configuration is used, how many files, how long, cache hits
  -q, --quiet             no summary line
  --generate-shell-completion SHELL  print a completion script for bash, zsh or fish
  --verify                run the script (one path) with runtime checks that confirm or refute the findings
  --verify-steps N        optimizer steps to run under --verify
  --verify-timeout S      seconds before the verified script is stopped (default 300)
  --report DIR            with --verify: write report.json and plots to DIR
  -V, --version           print the version
  -h, --help              this help

Exit status: 0 nothing reported, 1 findings, 2 usage or configuration error.
Suppress a finding with `# noqa: BL101` or `# bertlint: ignore[BL101]` on the reported line (or the first line of
its statement); configure with [tool.bertlint] in pyproject.toml (select, ignore, extend-select, per-file-ignores,
exclude, target-versions, world-size).
"""
)

FORMATS = ("full", "concise", "json", "json-lines", "sarif", "github", "junit")  # = reporters.FORMATS

# Files at or above this count are linted in worker processes (one file never pays process start-up).
PARALLEL_MIN_FILES = 16

_CODE = re.compile(r"^(ALL|BL[0-9]{0,3})$")
_SUBCOMMANDS = {
    "explain": ("bertlint.explain", "main", "explain"),
    "memory": ("bertlint.memory.cli", "main", "the memory simulator"),
    "lsp": ("bertlint.lsp", "main", "the language server"),
}


class UsageError(Exception):
    pass


class Options:
    def __init__(self) -> None:
        self.paths: list[str] = []
        self.select: Optional[list[str]] = None
        self.extend_select: list[str] = []
        self.ignore: list[str] = []
        self.output_format = "full"
        self.statistics = False
        self.exit_zero = False
        self.fix = False
        self.unsafe_fixes = False
        self.diff = False
        self.stdin_filename: Optional[str] = None
        self.config: Optional[str] = None
        self.isolated = False
        self.exclude: list[str] = []
        self.jobs: Optional[int] = None
        self.quiet = False
        self.verify = False
        self.verify_steps: Optional[int] = None
        self.verify_timeout = 300.0
        self.report_dir: Optional[str] = None
        self.script_args: list[str] = []
        self.no_cache = False
        self.output_file: Optional[str] = None
        self.show_settings = False
        self.show_files = False
        self.add_noqa = False
        self.exit_non_zero_on_fix = False
        self.overrides: list[dict] = []  # --config KEY=VALUE
        self.extend_exclude: list[str] = []
        self.verbose = False
        self.cache_dir: Optional[str] = None


_FLAGS = {
    "--statistics": "statistics",
    "--exit-zero": "exit_zero",
    "--fix": "fix",
    "--unsafe-fixes": "unsafe_fixes",
    "--diff": "diff",
    "--isolated": "isolated",
    "--quiet": "quiet",
    "-q": "quiet",
    "--verify": "verify",
    "--no-cache": "no_cache",
    "--show-settings": "show_settings",
    "--show-files": "show_files",
    "--add-noqa": "add_noqa",
    "--exit-non-zero-on-fix": "exit_non_zero_on_fix",
    "--verbose": "verbose",
    "-v": "verbose",
}
_VALUED = {
    "--select",
    "--extend-select",
    "--ignore",
    "--output-format",
    "--stdin-filename",
    "--config",
    "--exclude",
    "--jobs",
    "-j",
    "--verify-steps",
    "--verify-timeout",
    "--report",
    "--output-file",
    "-o",
    "--extend-exclude",
    "--generate-shell-completion",
    "--cache-dir",
}


def _codes(opt: str, value: str) -> list[str]:
    out = []
    for c in value.split(","):
        c = c.strip().upper()
        if not c:
            continue
        if not _CODE.match(c):
            raise UsageError(f"{opt}: {c!r} is not a rule code or prefix (expected ALL, BL, BL1, BL10, BL101 ...)")
        out.append(c)
    return out


def parse_args(argv: list[str]) -> Options:
    o = Options()
    i = 0
    n = len(argv)
    while i < n:
        a = argv[i]
        i += 1
        if a == "--":
            rest = argv[i:]
            if o.verify:
                o.script_args = rest
            else:
                o.paths.extend(rest)
            break
        if a in ("-h", "--help"):
            raise _Help()
        if a in ("-V", "--version"):
            raise _Version()
        if a in _FLAGS:
            setattr(o, _FLAGS[a], True)
            continue
        if a == "--no-fix":
            o.fix = False
            continue
        name, eq, value = a.partition("=")
        if name in _VALUED:
            if not eq:
                if i >= n:
                    raise UsageError(f"{name} needs a value")
                value = argv[i]
                i += 1
            if name == "--select":
                o.select = [*(o.select or []), *_codes(name, value)]
            elif name == "--extend-select":
                o.extend_select += _codes(name, value)
            elif name == "--ignore":
                o.ignore += _codes(name, value)
            elif name == "--output-format":
                if value not in FORMATS:
                    raise UsageError(f"--output-format: unknown format {value!r}; choose one of {', '.join(FORMATS)}")
                o.output_format = value
            elif name == "--stdin-filename":
                o.stdin_filename = value
            elif name == "--config":
                # ruff's rule: an existing file is a configuration file; anything else a KEY = VALUE override
                if os.path.isfile(value) or "=" not in value:
                    if o.config is not None:
                        raise UsageError("--config FILE given twice")
                    o.config = value
                else:
                    from bertlint.config import ConfigError, parse_override

                    try:
                        o.overrides.append(parse_override(value))
                    except ConfigError as e:
                        raise UsageError(str(e)) from None
            elif name == "--exclude":
                o.exclude += [p.strip() for p in value.split(",") if p.strip()]
            elif name == "--extend-exclude":
                o.extend_exclude += [p.strip() for p in value.split(",") if p.strip()]
            elif name in ("--output-file", "-o"):
                o.output_file = value
            elif name == "--cache-dir":
                o.cache_dir = value
            elif name == "--generate-shell-completion":
                raise _Completion(value)
            elif name in ("--jobs", "-j"):
                o.jobs = _int(name, value, 1)
            elif name == "--verify-steps":
                o.verify_steps = _int(name, value, 1)
            elif name == "--verify-timeout":
                try:
                    o.verify_timeout = float(value)
                except ValueError:
                    raise UsageError(f"--verify-timeout: expected seconds, got {value!r}") from None
                if o.verify_timeout <= 0:
                    raise UsageError("--verify-timeout must be > 0")
            elif name == "--report":
                o.report_dir = value
            continue
        if a.startswith("-") and a != "-":
            raise UsageError(f"unknown option {a!r}")
        o.paths.append(a)
    if o.add_noqa and (o.fix or o.diff):
        raise UsageError("--add-noqa cannot be combined with --fix or --diff")
    if (o.verify_steps is not None or o.report_dir is not None) and not o.verify:
        raise UsageError("--verify-steps, --verify-timeout and --report need --verify")
    if o.verify:
        if len(o.paths) != 1 or o.paths[0] == "-":
            raise UsageError("--verify takes exactly one script path (script arguments go after `--`)")
        if o.fix or o.diff:
            raise UsageError("--verify cannot be combined with --fix or --diff")
    return o


def _int(name: str, value: str, minimum: int) -> int:
    try:
        v = int(value)
    except ValueError:
        raise UsageError(f"{name}: expected an integer, got {value!r}") from None
    if v < minimum:
        raise UsageError(f"{name} must be >= {minimum}")
    return v


class _Help(Exception):
    pass


class _Version(Exception):
    pass


class _Completion(Exception):
    pass


def _err(msg: str) -> int:
    sys.stderr.write(f"bertlint: error: {msg}\n")
    return 2


# True while main() runs as the process's entry point (``bertlint ...``, ``python -m bertlint``: argv from the
# command line), not called from other code (tests, a library user): only then is the garbage collector tuned.
_ENTRY_POINT = False
# A lint run from the entry point ends the process once its output is written (``_fast_exit``).
_FAST_EXIT = False


def _fast_exit(rc: int) -> None:
    """End the process with ``rc`` without the interpreter's teardown (freeing every module, class and the last
    file's tree one object at a time; mypy's --fast-exit does the same): the exit handlers run first (the
    pattern and dataclass tables are saved there), then the standard streams are flushed. A stream that cannot be
    flushed (a closed pipe) leaves the exit to the ordinary path."""
    import atexit

    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        return
    atexit._run_exitfuncs()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except Exception:
        pass
    os._exit(rc)


def main(argv: Optional[list[str]] = None) -> int:
    global _ENTRY_POINT
    if argv is None:
        argv = sys.argv[1:]
        _ENTRY_POINT = True
        from bertlint import _recache

        _recache.install()  # the compiled patterns of earlier runs (bertlint/_recache.py)
    import gc

    gc_was = gc.isenabled()
    try:
        rc = _main(list(argv))
        if _FAST_EXIT:
            _fast_exit(rc)
        return rc
    except KeyboardInterrupt:
        sys.stderr.write("bertlint: interrupted\n")
        return 130
    except BrokenPipeError:  # `bertlint . | head`: stop quietly (no "Exception ignored" at exit)
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 1
    finally:
        if gc_was:
            gc.enable()


def _main(argv: list[str]) -> int:
    if argv:
        head = argv[0]
        if head in _SUBCOMMANDS:
            return _dispatch(head, argv[1:])
    if _ENTRY_POINT:
        # A lint run is a short process: no cyclic garbage collection while the modules are imported (each
        # collection would walk every object imported so far); `run` freezes what was imported and turns
        # collection back on (main turns it back on in any case).
        import gc

        gc.disable()
    if argv:
        if head == "rule":
            return _rule_cmd(argv[1:])
        if head == "rules":
            return _rules_cmd(argv[1:])
        if head == "check":
            argv = argv[1:]
    try:
        o = parse_args(argv)
    except _Help:
        sys.stdout.write(HELP)
        return 0
    except _Version:
        from bertlint import __version__

        sys.stdout.write(f"bertlint {__version__}\n")
        return 0
    except _Completion as c:
        return _completion(str(c))
    except UsageError as e:
        sys.stderr.write(f"bertlint: error: {e}\n{USAGE}Try 'bertlint --help' for more.\n")
        return 2
    from bertlint.config import ConfigError

    try:
        return run(o)
    except ConfigError as e:
        return _err(str(e))


def _dispatch(name: str, argv: list[str]) -> int:
    import importlib

    modname, fn, what = _SUBCOMMANDS[name]
    try:
        mod = importlib.import_module(modname)
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing == modname or modname.startswith(missing + ".") or missing.startswith("bertlint"):
            return _err(f"`bertlint {name}`: {what} is not part of this installation ({modname} is missing)")
        extra = "lsp" if name == "lsp" else "verify"
        return _err(f"`bertlint {name}` needs {missing}: pip install 'bertlint[{extra}]'")
    rc = getattr(mod, fn)(argv)
    return int(rc or 0)


# ------------------------------------------------------------------------------------- shell completion

# (option names, what its value is: None (a flag) | file | dir | codes | format | shell | number, help)
_OPTION_SPECS = [
    (("--select",), "codes", "enable only these codes or prefixes"),
    (("--extend-select",), "codes", "enable these codes in addition"),
    (("--ignore",), "codes", "disable these codes or prefixes"),
    (("--output-format",), "format", "output format"),
    (("--output-file", "-o"), "file", "write the report to this file"),
    (("--statistics",), None, "count findings per code"),
    (("--exit-zero",), None, "exit 0 even with findings"),
    (("--exit-non-zero-on-fix",), None, "exit 1 when --fix changed a file"),
    (("--fix",), None, "apply safe fixes"),
    (("--no-fix",), None, "do not apply fixes"),
    (("--unsafe-fixes",), None, "also apply unsafe fixes"),
    (("--diff",), None, "print the fixes as a diff"),
    (("--add-noqa",), None, "add # noqa comments on every reported line"),
    (("--stdin-filename",), "file", "name of the text read from -"),
    (("--config",), "file", "configuration file or KEY=VALUE"),
    (("--isolated",), None, "ignore configuration files"),
    (("--exclude",), "file", "glob patterns to skip"),
    (("--extend-exclude",), "file", "more glob patterns to skip"),
    (("--jobs", "-j"), "number", "worker processes"),
    (("--no-cache",), None, "do not read or write the cache"),
    (("--cache-dir",), "dir", "cache folder"),
    (("--show-settings",), None, "print the settings for a file"),
    (("--show-files",), None, "print the files that would be checked"),
    (("--verbose", "-v"), None, "say what bertlint does"),
    (("--quiet", "-q"), None, "no summary line"),
    (("--verify",), None, "run the script with runtime checks"),
    (("--verify-steps",), "number", "optimizer steps under --verify"),
    (("--verify-timeout",), "number", "seconds before the script is stopped"),
    (("--report",), "dir", "with --verify: write the report here"),
    (("--generate-shell-completion",), "shell", "print a completion script"),
    (("--version", "-V"), None, "print the version"),
    (("--help", "-h"), None, "print the help"),
]
_SUBCOMMAND_NAMES = ("rule", "rules", "explain", "memory", "lsp", "check")


def _completion(shell: str) -> int:
    """``--generate-shell-completion bash|zsh|fish``: a completion script on standard output."""
    from bertlint.registry import ENGINE_CODES, all_rules

    codes = " ".join(["ALL", "BL", *sorted(ENGINE_CODES), *(r.meta.code for r in all_rules())])
    formats = " ".join(FORMATS)
    names = [n for names, _, _ in _OPTION_SPECS for n in names]
    if shell == "bash":
        cases = []
        for kind, words in (("codes", codes), ("format", formats), ("shell", "bash zsh fish")):
            opts = "|".join(n for names, k, _ in _OPTION_SPECS if k == kind for n in names)
            cases.append(f'        {opts}) COMPREPLY=($(compgen -W "{words}" -- "$cur")); return 0;;')
        files = "|".join(n for names, k, _ in _OPTION_SPECS if k in ("file", "dir") for n in names)
        cases.append(f'        {files}) COMPREPLY=($(compgen -f -- "$cur")); return 0;;')
        nums = "|".join(n for names, k, _ in _OPTION_SPECS if k == "number" for n in names)
        cases.append(f"        {nums}) return 0;;")
        script = (
            "# bash completion for bertlint (bertlint --generate-shell-completion bash)\n"
            "_bertlint() {\n"
            '    local cur="${COMP_WORDS[COMP_CWORD]}" prev="${COMP_WORDS[COMP_CWORD-1]}"\n'
            '    case "$prev" in\n' + "\n".join(cases) + "\n    esac\n"
            '    if [[ "$cur" == -* ]]; then\n'
            f'        COMPREPLY=($(compgen -W "{" ".join(names)}" -- "$cur"))\n'
            "    elif [[ $COMP_CWORD -eq 1 ]]; then\n"
            f'        COMPREPLY=($(compgen -W "{" ".join(_SUBCOMMAND_NAMES)}" -- "$cur") $(compgen -f -- "$cur"))\n'
            "    else\n"
            '        COMPREPLY=($(compgen -f -- "$cur"))\n'
            "    fi\n"
            "}\n"
            "complete -o filenames -o bashdefault -F _bertlint bertlint\n"
        )
    elif shell == "zsh":
        specs = []
        for names, kind, help_ in _OPTION_SPECS:
            action = {
                None: "",
                "file": ":file:_files",
                "dir": ":folder:_files -/",
                "codes": f":codes:({codes})",
                "format": f":format:({formats})",
                "shell": ":shell:(bash zsh fish)",
                "number": ":number: ",
            }[kind]
            group = "{" + ",".join(names) + "}" if len(names) > 1 else names[0]
            excl = "(" + " ".join(names) + ")" if len(names) > 1 else ""
            specs.append(f"    '{excl}{group}[{help_}]{action}'")
        script = (
            "#compdef bertlint\n# zsh completion for bertlint (bertlint --generate-shell-completion zsh)\n"
            "_bertlint() {\n  _arguments -s \\\n"
            + " \\\n".join(specs)
            + f" \\\n    '1::command or path:(({' '.join(n + chr(92) + ':' + n for n in _SUBCOMMAND_NAMES)}) _files)' \\\n"
            "    '*:path:_files'\n}\n"
            'if [[ "$funcstack[1]" == "_bertlint" ]]; then _bertlint "$@"; else compdef _bertlint bertlint; fi\n'
        )
    elif shell == "fish":
        out = ["# fish completion for bertlint (bertlint --generate-shell-completion fish)"]
        out.append(
            f"complete -c bertlint -n '__fish_use_subcommand' -a '{' '.join(_SUBCOMMAND_NAMES)}' -d 'subcommand'"
        )
        for names, kind, help_ in _OPTION_SPECS:
            flags = " ".join(f"-l {n[2:]}" if n.startswith("--") else f"-s {n[1:]}" for n in names)
            arg = {
                None: "",
                "file": " -r -F",
                "dir": " -r -F",
                "codes": f" -x -a '{codes}'",
                "format": f" -x -a '{formats}'",
                "shell": " -x -a 'bash zsh fish'",
                "number": " -x",
            }[kind]
            out.append(f"complete -c bertlint {flags}{arg} -d '{help_}'")
        script = "\n".join(out) + "\n"
    else:
        return _err(f"--generate-shell-completion: unknown shell {shell!r}; choose bash, zsh or fish")
    sys.stdout.write(script)
    return 0


# ------------------------------------------------------------------------------------------ rule / rules


def rule_page(code: str) -> Optional[str]:
    """The text of ``rules/CODE.md``: from the installed package data, else the source checkout."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in (os.path.join(here, "pages"), os.path.join(os.path.dirname(here), "rules")):
        p = os.path.join(d, f"{code}.md")
        if os.path.isfile(p):
            with open(p, encoding="utf-8") as f:
                return f.read()
    return None


def _rule_meta(code: str):
    from bertlint.registry import ENGINE_CODES, get

    if code in ENGINE_CODES:
        return ENGINE_CODES[code]
    r = get(code)
    return r.meta if r else None


def _meta_json(m) -> dict:
    return {
        "code": m.code,
        "name": m.name,
        "severity": m.severity.value,
        "summary": m.summary,
        "fix": m.fix.value if m.fix else None,
        "default_enabled": m.default_enabled,
        "targets": list(m.targets),
        "url": m.url,
    }


def _rule_cmd(argv: list[str]) -> int:
    fmt = "text"
    codes = []
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            sys.stdout.write("usage: bertlint rule CODE [--output-format text|json]\n")
            return 0
        if a.startswith("--output-format"):
            _, eq, v = a.partition("=")
            if not eq:
                i += 1
                v = argv[i] if i < len(argv) else ""
            if v not in ("text", "json", "full"):
                return _err(f"bertlint rule: --output-format must be text or json, got {v!r}")
            fmt = "json" if v == "json" else "text"
        elif a.startswith("-"):
            return _err(f"bertlint rule: unknown option {a!r}")
        else:
            codes.append(a.upper())
        i += 1
    if len(codes) != 1:
        return _err("usage: bertlint rule CODE (for example: bertlint rule BL101)")
    code = codes[0]
    meta = _rule_meta(code)
    page = rule_page(code)
    if meta is None and page is None:
        return _err(f"unknown rule code {code!r}; `bertlint rules` lists them")
    if fmt == "json":
        import json

        d = _meta_json(meta) if meta else {"code": code}
        d["explanation"] = page
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return 0
    if page is None:
        sys.stdout.write(
            f"# {meta.code} {meta.name}\n\n{meta.summary}\n\nSeverity: {meta.severity.label}. "
            f"Fix: {meta.fix.value if meta.fix else 'none'}.\n"
        )
    else:
        sys.stdout.write(page if page.endswith("\n") else page + "\n")
    return 0


def _rules_cmd(argv: list[str]) -> int:
    from bertlint.registry import ENGINE_CODES, all_rules

    fmt = "text"
    for i, a in enumerate(argv):
        if a in ("-h", "--help"):
            sys.stdout.write("usage: bertlint rules [--output-format text|json]\n")
            return 0
        if a == "--output-format=json" or (a == "--output-format" and argv[i + 1 : i + 2] == ["json"]):
            fmt = "json"
        elif a.startswith("-") and a not in ("--output-format", "--output-format=text"):
            return _err(f"bertlint rules: unknown option {a!r}")
    metas = [ENGINE_CODES[c] for c in sorted(ENGINE_CODES)] + [r.meta for r in all_rules()]
    if fmt == "json":
        import json

        sys.stdout.write(json.dumps([_meta_json(m) for m in metas], indent=2) + "\n")
        return 0
    width = max((len(m.name) for m in metas), default=4)
    lines = [f"{'code':<6} {'name':<{width}} sev  fix     default  summary"]
    for m in metas:
        fix = m.fix.value if m.fix else "-"
        lines.append(
            f"{m.code:<6} {m.name:<{width}} {m.severity.value:<4} {fix:<7} {'on' if m.default_enabled else 'off':<8} {m.summary}"
        )
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


# ------------------------------------------------------------------------------------------------ linting


def _color(stream) -> bool:
    if os.environ.get("NO_COLOR"):
        return False
    if os.environ.get("FORCE_COLOR"):
        return True
    try:
        return stream.isatty()
    except Exception:
        return False


def _settings_for(o: Options, path: str, cache: dict):
    from bertlint.config import Settings, load_settings, read_config_file

    if o.isolated:
        key = "<isolated>"
    elif o.config:
        key = os.path.abspath(o.config)
    else:
        key = None
    if key is None:
        base = load_settings(path)
        key = base.config_path or "<default>"
    else:
        base = None
    if key not in cache:
        if base is None:
            if o.isolated:
                base = Settings()
            else:
                if not os.path.isfile(o.config):  # type: ignore[arg-type]
                    from bertlint.config import ConfigError

                    raise ConfigError(f"{o.config}: configuration file not found")
                base = read_config_file(o.config) or Settings(config_path=os.path.abspath(o.config))  # type: ignore[arg-type]
        from bertlint.config import apply_overrides

        s = apply_overrides(base, o.overrides).with_cli(o.select, o.ignore, o.extend_select)
        if o.exclude or o.extend_exclude:
            s.exclude = [*s.exclude, *o.exclude, *o.extend_exclude]
        cache[key] = s
    return cache[key]


def _work(task):
    from bertlint.api import FileResult, check_file

    path, settings, fix, unsafe, write = task[:5]
    record = len(task) > 5 and task[5]
    if not record:
        try:
            return check_file(path, settings, fix=fix, unsafe=unsafe, write=write)
        except Exception as e:  # never a traceback: the file is reported as not checked, the others go on
            if os.environ.get("BERTLINT_DEBUG"):
                raise
            r = FileResult(path)
            r.warnings.append(f"{path}: internal error, file not checked: {type(e).__name__}: {e} (please report it)")
            return r
    # for the cache: what the lint read besides the file, and whether a rule crashed (then nothing is cached)
    from bertlint import cache, engine

    crashed: list = []
    previous = engine.on_internal_error

    def on_error(code, filename, exc, _prev=previous):
        crashed.append(code)
        _prev(code, filename, exc)

    engine.on_internal_error = on_error
    cache.start_recording()
    try:
        r = _work(task[:5])
    finally:
        deps = cache.stop_recording(path)
        engine.on_internal_error = previous
    r.deps = deps  # type: ignore[attr-defined]
    r.cacheable = not crashed and not any("internal error" in w for w in r.warnings)  # type: ignore[attr-defined]
    return r


def _unknown_selector(o: Options) -> Optional[str]:
    """The error for a --select / --extend-select / --ignore value that matches no rule (ruff: exit 2)."""
    if not (o.select or o.extend_select or o.ignore):
        return None
    from bertlint.registry import ENGINE_CODES, all_rules

    codes = set(ENGINE_CODES) | {r.meta.code for r in all_rules()}
    for opt, values in (("--select", o.select or []), ("--extend-select", o.extend_select), ("--ignore", o.ignore)):
        for v in values:
            if v != "ALL" and not any(c.startswith(v) for c in codes):
                return f"{opt}: unknown rule selector {v!r} (no rule code starts with it; `bertlint rules` lists them)"
    return None


def run(o: Options) -> int:
    from bertlint.api import FileResult, check_file

    if _ENTRY_POINT and not o.verify:
        from bertlint import engine

        global _FAST_EXIT
        _FAST_EXIT = engine.keep_last = True

    import warnings

    # compile() is asked for the message of a syntax error: its SyntaxWarnings (invalid escapes ...) are not ours
    warnings.filterwarnings("ignore", module="<bertlint>")
    bad = _unknown_selector(o)
    if bad:
        return _err(bad)

    for stream in (sys.stdout, sys.stderr):  # messages carry "×" and "—": never die on a narrow locale
        try:
            if (getattr(stream, "encoding", "") or "").lower().replace("-", "") not in ("utf8", "utf8sig"):
                stream.reconfigure(errors="replace")  # type: ignore[union-attr]
        except Exception:
            pass

    paths = o.paths or (["-"] if o.stdin_filename else ["."])  # as ruff: --stdin-filename alone reads stdin
    for p in paths:
        if p != "-" and not os.path.exists(p):
            return _err(f"{p}: no such file or directory")
    if paths.count("-") > 1:
        return _err("`-` (standard input) can be given only once")
    cache: dict = {}
    fixing = o.fix or o.diff
    write = o.fix and not o.diff
    results: list[FileResult] = []

    # discovery (settings are resolved here, in this process, so config errors surface before any work)
    from bertlint.sources import discover

    def excluded(path: str) -> bool:
        return _settings_for(o, path, cache).is_excluded(path)

    tasks = []
    stdin_task = None
    seen: set = set()
    for path, explicit in discover([p for p in paths], excluded):
        if path != "-":
            key = os.path.realpath(path)
            if key in seen:  # named twice (or a file and its folder): lint (and fix) it once
                continue
            seen.add(key)
        if path == "-":
            name = o.stdin_filename or "-"
            stdin_task = (name, _settings_for(o, o.stdin_filename or os.path.join(os.getcwd(), "stdin.py"), cache))
            tasks.append(None)
            continue
        tasks.append((path, _settings_for(o, path, cache), fixing, o.unsafe_fixes, write))

    file_tasks = [t for t in tasks if t is not None]
    if o.show_files:
        sys.stdout.write("".join(f"{t[0]}\n" for t in file_tasks) + ("-\n" if stdin_task is not None else ""))
        return 0
    if o.show_settings:
        first = file_tasks[0][0] if file_tasks else (o.stdin_filename or paths[0])
        return _show_settings(first, file_tasks[0][1] if file_tasks else _settings_for(o, first, cache))
    if o.add_noqa and stdin_task is not None:
        return _err("--add-noqa writes files: it cannot read standard input")
    if o.verbose:
        for key, st in sorted(cache.items(), key=lambda kv: str(kv[0])):
            sys.stderr.write(f"bertlint: configuration: {st.config_path or 'none (defaults)'}\n")
        sys.stderr.write(f"bertlint: {len(file_tasks)} file{'s' if len(file_tasks) != 1 else ''} to check\n")
    import time

    t0 = time.perf_counter()
    _freeze_imports()
    results.extend(_lint_files(o, file_tasks))
    stdin_out: Optional[str] = None
    if stdin_task is not None:
        name, settings = stdin_task
        data = sys.stdin.buffer.read()
        r = check_file(name, settings, fix=fixing, unsafe=o.unsafe_fixes, write=False, data=data, display_name=name)
        results.append(r)
        if o.fix and not o.diff:
            stdin_out = r.source if r.source is not None else data.decode("utf-8", "replace")
    if o.verbose:
        sys.stderr.write(f"bertlint: checked {len(results)} file{'s' if len(results) != 1 else ''} in "
                         f"{time.perf_counter() - t0:.2f} s\n")
    if o.add_noqa:
        return _add_noqa(o, results)
    if o.output_file:
        try:
            stream = open(o.output_file, "w", encoding="utf-8")
        except OSError as e:
            return _err(f"--output-file {o.output_file}: {e.strerror or e}")
        with stream:
            return _report(o, results, stdin_out, stream)
    return _report(o, results, stdin_out)


def _freeze_imports() -> None:
    """Import what a lint needs, move everything alive now (modules, classes, tables) out of the garbage
    collector's sight (``gc.freeze``: never scanned again, also not at exit), and turn collection back on for
    the objects the lint creates (the engine pauses it while a file is parsed and analysed)."""
    import gc

    from bertlint import engine  # noqa: F401  (libcst and the engine)

    if _ENTRY_POINT:
        gc.freeze()
        gc.enable()


def _cache_root(o: Options) -> Optional[str]:
    if o.no_cache or o.verify:
        return None
    from bertlint.cache import CACHE_DIR, disabled_by_env

    if disabled_by_env():
        return None
    return o.cache_dir or os.environ.get("BERTLINT_CACHE_DIR") or CACHE_DIR


def _lint_files(o: Options, file_tasks: list) -> list:
    """Lint the files (in worker processes when there are many), answering unchanged ones from the cache."""
    jobs = o.jobs if o.jobs is not None else (os.cpu_count() or 1)
    root = _cache_root(o)
    if root is None:
        if len(file_tasks) >= PARALLEL_MIN_FILES and jobs > 1:
            return _parallel(file_tasks, jobs)
        return [_work(t) for t in file_tasks]
    from bertlint.cache import Cache

    cache = Cache(root)
    slots: list = [None] * len(file_tasks)
    todo: list = []  # (slot, task, key)
    for i, t in enumerate(file_tasks):
        hit, key = _from_cache(cache, t)
        if hit is not None:
            slots[i] = hit
        else:
            todo.append((i, t, key))
    tasks = [(*t[:5], key is not None) for _, t, key in todo]
    if len(tasks) >= PARALLEL_MIN_FILES and jobs > 1:
        done = _parallel(tasks, jobs)
    else:
        done = [_work(t) for t in tasks]
    for (i, t, key), r in zip(todo, done):
        slots[i] = r
        if key is not None and getattr(r, "cacheable", False) and r.fixed_text is None:
            cache.put(t[0], key, r.diagnostics, r.warnings, getattr(r, "deps", []))
    cache.save()
    if o.verbose:
        sys.stderr.write(f"bertlint: cache {os.path.abspath(root)}: {cache.hits} hit{'s' if cache.hits != 1 else ''}, "
                         f"{cache.misses} miss{'es' if cache.misses != 1 else ''}\n")
    return slots


_PREFILTER_BYTES = None


def _from_cache(cache, task):
    """(cached FileResult or None, key or None: None = do not cache this file)."""
    global _PREFILTER_BYTES
    from bertlint.api import FileResult
    from bertlint.sources import kind_of

    path, settings, fixing, unsafe = task[0], task[1], task[2], task[3]
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None, None
    if kind_of(path) in ("python", "other"):
        if _PREFILTER_BYTES is None:
            from bertlint.engine import _PREFILTER

            _PREFILTER_BYTES = re.compile(_PREFILTER.pattern.encode())
        if not _PREFILTER_BYTES.search(data):
            return None, None  # not parsed at all: linting it is cheaper than a lookup
    key = cache.key(path, data, settings.for_file(path))
    entry = cache.get(path, key)
    if entry is None:
        return None, key
    from bertlint.cache import diag_from_obj

    diags = [diag_from_obj(x, path) for x in entry["diags"]]
    if fixing:
        from bertlint.fixes import wanted

        if any(wanted(d, unsafe) for d in diags):
            return None, None  # something to fix: the normal path (the entry stays for the next lint)
    r = FileResult(path, diagnostics=diags, warnings=list(entry.get("warnings", ())))
    if diags:  # the reporters show the source lines (and map notebook cells)
        try:
            from bertlint.api import read_source

            r.source, r.encoding = read_source(path, data)
        except Exception:
            pass
    return r, key


def _add_noqa(o: Options, results: list) -> int:
    """``--add-noqa``: a ``# noqa: CODES`` comment on every reported line, files written in their encoding."""
    from bertlint.fixes import atomic_write
    from bertlint.noqa import add_noqa_text
    from bertlint.sources import encode, kind_of

    added = 0
    for r in results:
        for w in r.warnings:
            sys.stderr.write(f"warning: {w}\n")
        if not r.diagnostics or r.source is None:
            continue
        new, n = add_noqa_text(r.source, r.diagnostics, kind_of(r.filename))
        if not n or new == r.source:
            continue
        try:
            atomic_write(r.filename, encode(new, r.encoding))
        except (OSError, UnicodeEncodeError) as e:
            sys.stderr.write(f"warning: {r.filename}: cannot write the noqa comments: {e}\n")
            continue
        added += n
        if o.verbose:
            sys.stderr.write(f"bertlint: {r.filename}: {n} noqa comment{'s' if n != 1 else ''}\n")
    if not o.quiet:
        sys.stderr.write(f"Added {added} noqa directive{'s' if added != 1 else ''}.\n")
    return 0


def _show_settings(path: str, settings) -> int:
    """``--show-settings``: what bertlint will use for ``path`` (ruff's habit)."""
    import json

    from bertlint.config import settings_table
    from bertlint.registry import ENGINE_CODES, all_rules

    s = settings.for_file(path)
    lines = [f"Settings for: {os.path.abspath(path) if path != '-' else '-'}",
             f"Configuration file: {s.config_path or 'none (defaults)'}"]
    for k, v in settings_table(s).items():
        if k == "select" and v is None:
            lines.append("select = (default: every rule that is on by default)")
        elif k == "world-size" and v is None:
            lines.append("world-size = (unknown: per process)")
        else:
            lines.append(f"{k} = {json.dumps(v)}")
    metas = [ENGINE_CODES[c] for c in sorted(ENGINE_CODES)] + [r.meta for r in all_rules()]
    on = [m.code for m in metas if s.is_enabled(m.code, m.default_enabled)]
    lines.append(f"enabled rules ({len(on)}): {', '.join(on)}")
    try:
        from bertlint.analysis import versions

        tvs = versions.resolve(path if path != "-" else None, s).all()
        lines.append("target versions:")
        for pkg, tv in sorted(tvs.items()):
            lines.append(f"  {pkg} = {tv.text if hasattr(tv, 'text') else tv}  ({tv.source})")
    except Exception as e:  # the analysis package is being changed: the settings above stay useful
        lines.append(f"target versions: unavailable ({type(e).__name__}: {e})")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _parallel(tasks: list, jobs: int) -> list:
    from bertlint.registry import all_rules

    all_rules()  # import the rules once, before the workers fork
    from bertlint._dataclass import materialise_all

    materialise_all()  # and build the records' classes once (bertlint/_dataclass.py), not in every worker
    try:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        ctx = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
        chunk = max(1, min(32, len(tasks) // (jobs * 4) or 1))
        with ProcessPoolExecutor(max_workers=min(jobs, len(tasks)), mp_context=ctx) as ex:
            return list(ex.map(_work, tasks, chunksize=chunk))
    except (OSError, ImportError, PermissionError):  # no processes available (sandbox): lint serially
        return [_work(t) for t in tasks]
    except Exception as e:  # a worker died (BrokenProcessPool): redo the work here (fixes are idempotent)
        sys.stderr.write(f"warning: parallel linting failed ({type(e).__name__}); linting serially\n")
        return [_work(t) for t in tasks]


def _report(o: Options, results: list, stdin_out: Optional[str], stream=None) -> int:
    from bertlint.types import Diagnostic

    out = stream if stream is not None else sys.stdout
    err = sys.stderr
    diags: list[Diagnostic] = []
    sources: dict[str, Optional[str]] = {}
    fixed = 0
    diffs = []
    for r in results:
        for w in r.warnings:
            err.write(f"warning: {w}\n")
        for d, why in r.failed:
            err.write(f"warning: {r.filename}: failed to apply the fix for {d.code} at {_loc(d)}: {why}\n")
        diags.extend(r.diagnostics)
        sources[r.filename] = r.source
        fixed += len(r.applied)
        if o.diff and r.fixed_text is not None and r.original is not None:
            from bertlint.fixes import unified_diff

            diffs.append(unified_diff(r.original, r.fixed_text, r.filename))
    diags.sort(key=Diagnostic.sort_key)

    if o.verify:
        res = _verify(o, diags)
        if isinstance(res, int):
            return res
        diags, report_text, verify_exit = res
    else:
        report_text = verify_exit = None

    if o.diff:
        text = "".join(diffs)
        out.write(text)
        if not o.quiet:
            from bertlint.reporters import fixable

            n = sum(len(r.applied) for r in results if r.fixed_text is not None)
            # what --unsafe-fixes would add: the findings left whose (unsafe) fix is not applied without it
            hidden = 0 if o.unsafe_fixes else sum(1 for d in diags if fixable(d, True) and not fixable(d, False))
            more = (
                f" ({hidden} more fix{'es' if hidden != 1 else ''} available with `--unsafe-fixes`)" if hidden else ""
            )
            if n:
                err.write(f"Would fix {n} problem{'s' if n != 1 else ''}{more}.\n")
            elif hidden:
                err.write(
                    f"No safe fixes available ({hidden} fix{'es' if hidden != 1 else ''} available with "
                    f"`--diff --unsafe-fixes`).\n"
                )
            else:
                err.write("No fixes available.\n")
        return 0 if o.exit_zero or not text else 1

    if stdin_out is not None:
        sys.stdout.write(stdin_out)
        if stream is None:
            out = err  # the remaining findings go to stderr when the fixed source goes to stdout

    from bertlint import reporters

    color = _color(out) and o.output_format in ("full", "concise")
    if o.statistics:
        out.write(reporters.statistics(diags, o.output_format, unsafe=o.unsafe_fixes))
        if o.output_format not in ("json", "json-lines", "sarif") and not o.quiet:
            out.write(reporters.summary(diags, fixed=fixed, unsafe=o.unsafe_fixes, color=color))
    else:
        kw = {"sources": sources, "color": color, "unsafe": o.unsafe_fixes}
        if o.output_format == "sarif":
            from bertlint.registry import ENGINE_CODES, all_rules

            kw["rules"] = list(ENGINE_CODES.values()) + [r.meta for r in all_rules()]
        out.write(reporters.render(o.output_format, diags, **kw))
        if o.output_format in ("full", "concise"):
            if report_text:
                out.write(report_text if report_text.endswith("\n") else report_text + "\n")
            # a verify run that failed or verified nothing says so in its outcome line, never "All checks passed!"
            if not o.quiet and not (verify_exit == 3 and not diags):
                out.write(reporters.summary(diags, fixed=fixed, unsafe=o.unsafe_fixes, color=color))
    out.flush()
    if o.exit_zero:
        return 0
    if verify_exit == 3:  # --verify: the script failed or nothing could be verified (README "Verifier")
        return 3
    if o.exit_non_zero_on_fix and fixed:
        return 1
    return 1 if diags else 0


def _loc(d) -> str:
    return (f"cell {d.cell}:" if d.cell is not None else "") + f"{d.start.row}:{d.start.column}"


def _verify(o: Options, diags: list):
    try:
        from bertlint.verify import verify_script
    except ModuleNotFoundError as e:
        missing = e.name or ""
        if missing.startswith("bertlint"):
            return _err("--verify: the verifier is not part of this installation (bertlint.verify is missing)")
        return _err(f"--verify needs {missing}: pip install 'bertlint[verify]'")
    settings = _settings_for(o, o.paths[0], {})  # the file's configuration with the command-line selection
    result = verify_script(
        o.paths[0],
        o.script_args,
        diags,
        steps=o.verify_steps,
        timeout=o.verify_timeout,
        report_dir=o.report_dir,
        settings=settings,
    )
    from bertlint.types import Diagnostic

    return (sorted(result.diagnostics, key=Diagnostic.sort_key), getattr(result, "report_text", None),
            getattr(result, "exit_code", None))
