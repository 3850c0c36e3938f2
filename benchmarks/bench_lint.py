"""Lint-path benchmark (issue 2).

1. Whole-process latency of ``bertlint FILE`` on a ~200-line and a ~1,200-line training script
   (benchmarks/data/train_small.py, train_large.py) against the floor
   ``python -c "import libcst; libcst.parse_module(src)"``; median of several runs.
   Targets (issue 12): each script <= 1.2x the floor (stretch: <= 1.1x); median and spread reported.
2. The installed transformers, accelerate and torch source trees as a large body of real code: files/s,
   crashes (internal errors, tracebacks, exit status), unparsable files reported (BL001) compared with what
   CPython's own parser rejects.

    python benchmarks/bench_lint.py                       # everything
    python benchmarks/bench_lint.py --runs 11 --no-trees  # latency only
    python benchmarks/bench_lint.py --trees accelerate --limit 200 --json out.json
    python benchmarks/bench_lint.py --profile             # where one lint spends its time (per analysis / rule)
    python benchmarks/bench_lint.py --no-trees --others /work/benchvenv/bin   # side by side with TorchFix, Fixit, ruff
    python benchmarks/bench_lint.py --no-trees --no-latency --corpus         # the speed corpus, cold and warm

3. ``--corpus [DIR]``: the speed corpus (``benchmarks/speed_corpus/``, restored by its ``restore.py``: 429 example
   files of accelerate, diffusers and pytorch/examples) as one ``bertlint DIR`` run on 2 worker processes,
   cold (``--no-cache``) and warm (result cache filled by an earlier run); targets: <= 12 s cold, <= 1 s warm.

The other linters (TorchFix, Fixit, ruff) are never dependencies of bertlint: install them into a separate
virtual environment and pass their executables (``--torchfix PATH``, ``--fixit PATH``, ``--ruff PATH``, or
``--others BINDIR`` for all three); a tool that is not given or not found is skipped with a note.

Nothing here imports torch / transformers / accelerate: the trees are located with importlib.util.find_spec.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")


def _bertlint_cmd() -> list[str]:
    exe = os.path.join(os.path.dirname(sys.executable), "bertlint")
    if os.path.exists(exe):
        return [exe]
    found = shutil.which("bertlint")
    return [found] if found else [sys.executable, "-m", "bertlint"]


def _time_interleaved(cmds: dict[str, list[str]], runs: int, env: dict) -> dict[str, tuple]:
    """``_time`` for several commands, one run of each per round (warm-up round first)."""
    import resource

    res: dict[str, tuple[list, list, int]] = {k: ([], [], 0) for k in cmds}
    for k, cmd in cmds.items():
        subprocess.run(cmd, capture_output=True, env=env)  # page cache and .pyc files
    for _ in range(runs):
        for k, cmd in cmds.items():
            r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            t = time.perf_counter()
            p = subprocess.run(cmd, capture_output=True, env=env)
            dt = time.perf_counter() - t
            r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            walls, cpus, _ = res[k]
            walls.append(dt)
            cpus.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
            res[k] = (walls, cpus, p.returncode)
    return {k: (statistics.median(w), w, rc, statistics.median(c)) for k, (w, c, rc) in res.items()}


CORPUS = os.path.join(HERE, "speed_corpus", "files")


def corpus(root: str, runs: int, jobs: int, tools: dict[str, str], tool_timeout: float) -> dict:
    """Whole ``bertlint DIR`` runs over the speed corpus: cold (no cache) and warm (result cache filled first)."""
    import resource

    if not os.path.isdir(root):
        print(f"speed corpus: {root} missing; restore it: python benchmarks/speed_corpus/restore.py", flush=True)
        return {"skipped": f"{root} missing"}
    files = [p for p, _ in (_discover(root))]
    n_py = sum(1 for f in files if f.endswith(".py"))
    lines = 0
    for f in files:
        with open(f, "rb") as fh:
            lines += fh.read().count(b"\n")
    env = _env()
    base = [*_bertlint_cmd(), "--exit-zero", "--jobs", str(jobs), "--output-format", "json-lines"]

    def run(cmd, env_, timeout=None):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        try:
            p = subprocess.run(cmd, capture_output=True, text=True, env=env_, timeout=timeout)
            rc, stdout = p.returncode, p.stdout
        except subprocess.TimeoutExpired:
            rc, stdout = None, ""
        dt = time.perf_counter() - t
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        return dt, (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime), rc, stdout

    out: dict = {"root": os.path.relpath(root), "files": len(files), "python_files": n_py, "lines": lines, "jobs": jobs}
    cold, cold_cpu, outputs = [], [], set()
    for _ in range(runs):
        dt, cpu, rc, so = run([*base, "--no-cache", root], env)
        cold.append(dt)
        cold_cpu.append(cpu)
        outputs.add(so)
    with tempfile.TemporaryDirectory() as cache_dir:
        wenv = {k: v for k, v in env.items() if k != "BERTLINT_NO_CACHE"}
        fill = run([*base, "--cache-dir", cache_dir, root], wenv)
        warm, warm_cpu = [], []
        for _ in range(runs):
            dt, cpu, rc_w, so = run([*base, "--cache-dir", cache_dir, root], wenv)
            warm.append(dt)
            warm_cpu.append(cpu)
            outputs.add(so)
    n_diag = len(next(iter(outputs)).splitlines()) if outputs else 0
    out["bertlint"] = {
        "cold_median_s": round(statistics.median(cold), 3),
        "cold_all_s": [round(x, 3) for x in cold],
        "cold_cpu_median_s": round(statistics.median(cold_cpu), 3),
        "cache_fill_s": round(fill[0], 3),
        "warm_median_s": round(statistics.median(warm), 3),
        "warm_all_s": [round(x, 3) for x in warm],
        "warm_cpu_median_s": round(statistics.median(warm_cpu), 3),
        "diagnostics": n_diag,
        "identical_output_cold_warm": len(outputs) == 1,
        "exit": rc,
    }
    b = out["bertlint"]
    print(
        f"speed corpus {out['root']}: {len(files)} files ({n_py} .py), {lines} lines, --jobs {jobs}\n"
        f"    bertlint cold (--no-cache) {b['cold_median_s']:.2f} s (spread {_spread(cold)} s, CPU {b['cold_cpu_median_s']:.2f} s)"
        f"  target <= 12 s: {'met' if b['cold_median_s'] <= 12 else 'NOT met'}\n"
        f"    bertlint warm (cache)      {b['warm_median_s']:.3f} s (spread {_spread(warm)} s, CPU {b['warm_cpu_median_s']:.3f} s)"
        f"  target <= 1 s: {'met' if b['warm_median_s'] <= 1 else 'NOT met'}  (fill run {b['cache_fill_s']:.2f} s)\n"
        f"    {n_diag} diagnostics; output identical cold / warm: {b['identical_output_cold_warm']}",
        flush=True,
    )
    # the other linters read a copy outside the repository: the corpus folder is git-ignored, and Fixit skips
    # git-ignored files even when they are named on its command line
    copy_dir = tempfile.mkdtemp(prefix="bertlint-speed-corpus-") if tools else None
    if copy_dir:
        shutil.copytree(root, os.path.join(copy_dir, "files"))
    for t, exe in tools.items():  # one run each, with a timeout: they take minutes
        dt, cpu, rc_t, _ = run(OTHER_TOOLS[t](exe, os.path.join(copy_dir, "files"), jobs), env, timeout=tool_timeout)
        out[t] = {"version": _tool_version(exe), "wall_s": round(dt, 2), "cpu_s": round(cpu, 2), "exit": rc_t,
                  "timed_out": rc_t is None}
        note = f"timed out after {tool_timeout:.0f} s" if rc_t is None else f"exit {rc_t}"
        print(f"    {TOOL_LABEL[t]:<9} {out[t]['version']:<28} {dt:.2f} s wall, {cpu:.2f} s CPU (one run; {note})", flush=True)
    if copy_dir:
        shutil.rmtree(copy_dir, ignore_errors=True)
    return out


def _discover(root: str):
    sys.path.insert(0, os.path.dirname(HERE))
    from bertlint.sources import discover

    return discover([root])


def _env() -> dict:
    # Bytecode caching on, as for any installed package (a PYTHONDONTWRITEBYTECODE=1 environment would make
    # every run compile bertlint's modules from source; the warm-up run writes the .pyc files).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["NO_COLOR"] = "1"
    env["BERTLINT_NO_CACHE"] = "1"  # measure the lint, not the result cache (cli.py; README "Cache")
    return env


# the command line of each other linter on one path (a file or a folder); cache off where a tool has one
# (``path``: one path, or a list of paths)
def _paths(path) -> list[str]:
    return list(path) if isinstance(path, (list, tuple)) else [path]


OTHER_TOOLS = {
    "torchfix": lambda exe, path, jobs: [exe, "--jobs", str(jobs), *_paths(path)] if jobs else [exe, *_paths(path)],
    "fixit": lambda exe, path, jobs: [exe, "lint", *_paths(path)],
    "ruff": lambda exe, path, jobs: [exe, "check", "--no-cache", "--isolated", "--exit-zero", *_paths(path)],
}
TOOL_LABEL = {"torchfix": "TorchFix", "fixit": "Fixit", "ruff": "ruff"}


def _tool_version(exe: str) -> str:
    try:
        p = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=60, env=_env())
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    return (p.stdout or p.stderr).strip().splitlines()[0] if (p.stdout or p.stderr).strip() else "?"


def other_tools(a) -> dict[str, str]:
    """{tool: executable} of the other linters that were given and exist; a note for each one skipped."""
    found = {}
    for tool in OTHER_TOOLS:
        exe = getattr(a, tool) or (os.path.join(a.others, tool) if a.others else None)
        if exe and os.path.isfile(exe) and os.access(exe, os.X_OK):
            found[tool] = exe
        elif exe:
            print(f"note: {TOOL_LABEL[tool]}: {exe} not found, skipped", flush=True)
        else:
            print(f"note: {TOOL_LABEL[tool]}: not given (--{tool} PATH or --others BINDIR), skipped", flush=True)
    return found


def _spread(xs: list[float]) -> str:
    return f"{min(xs):.3f}-{max(xs):.3f}"


def latency(runs: int, extra: list[str], tools: dict[str, str] | None = None) -> list[dict]:
    env = _env()
    tools = tools or {}
    out = []
    for name in ("train_small.py", "train_large.py"):
        path = os.path.join(DATA, name)
        with open(path) as f:
            lines = len(f.read().splitlines())
        floor_cmd = [sys.executable, "-c", f"import libcst; libcst.parse_module(open({path!r}).read())"]
        lint_cmd = [*_bertlint_cmd(), *extra, path]
        # interleaved: one run of each command per round, so that a change of the machine's load hits all alike
        cmds = {"floor": floor_cmd, "bertlint": lint_cmd}
        cmds.update({t: OTHER_TOOLS[t](exe, path, 0) for t, exe in tools.items()})
        timed = _time_interleaved(cmds, runs, env)
        floor, floor_all, _, floor_cpu = timed["floor"]
        lint, lint_all, rc, lint_cpu = timed["bertlint"]
        row = {
            "file": f"benchmarks/data/{name}",
            "lines": lines,
            "runs": runs,
            "floor_median_s": round(floor, 4),
            "bertlint_median_s": round(lint, 4),
            "ratio": round(lint / floor, 3),
            "floor_cpu_median_s": round(floor_cpu, 4),
            "bertlint_cpu_median_s": round(lint_cpu, 4),
            "cpu_ratio": round(lint_cpu / floor_cpu, 3) if floor_cpu else None,
            "bertlint_exit": rc,
            "floor_all_s": [round(t, 4) for t in floor_all],
            "bertlint_all_s": [round(t, 4) for t in lint_all],
        }
        for t in tools:
            med, all_, trc, cpu = timed[t]
            row[t] = {
                "version": _tool_version(tools[t]),
                "median_s": round(med, 4),
                "all_s": [round(x, 4) for x in all_],
                "cpu_median_s": round(cpu, 4),
                "vs_floor": round(med / floor, 3),
                "vs_bertlint": round(med / lint, 3),
                "exit": trc,
            }
        out.append(row)
        print(
            f"{row['file']:<32} {lines:>5} lines  floor {floor:.3f} s  bertlint {lint:.3f} s  "
            f"ratio {lint / floor:.2f}x  (exit {rc}); CPU: floor {floor_cpu:.3f} s  bertlint {lint_cpu:.3f} s  "
            f"ratio {lint_cpu / max(floor_cpu, 1e-9):.2f}x; spread: floor {_spread(floor_all)} s  "
            f"bertlint {_spread(lint_all)} s",
            flush=True,
        )
        for t in tools:
            r = row[t]
            print(
                f"    {TOOL_LABEL[t]:<9} {r['version']:<28} {r['median_s']:.3f} s (spread {_spread(r['all_s'])} s, "
                f"CPU {r['cpu_median_s']:.3f} s)  {r['vs_floor']:.2f}x the floor, {r['vs_bertlint']:.2f}x bertlint  (exit {r['exit']})",
                flush=True,
            )
    for r in out:
        print(
            f"target {r['file']}: <= 1.2x the floor: {'met' if r['ratio'] <= 1.2 else 'NOT met'} "
            f"(stretch <= 1.1x: {'met' if r['ratio'] <= 1.1 else 'NOT met'})",
            flush=True,
        )
    return out


def _tree(pkg: str):
    spec = importlib.util.find_spec(pkg)
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def _py_files(root: str) -> list[str]:
    sys.path.insert(0, os.path.dirname(HERE))
    from bertlint.sources import discover

    return [p for p, _ in discover([root]) if p.endswith(".py")]


def trees(names: list[str], limit: int, jobs: int) -> list[dict]:
    out = []
    for pkg in names:
        root = _tree(pkg)
        if root is None:
            print(f"{pkg}: not installed, skipped", flush=True)
            continue
        files = _py_files(root)
        if limit and len(files) > limit:  # an even sample across the tree
            files = files[:: len(files) // limit][:limit]
        total_lines = 0
        cpython_rejects = set()
        for f in files:
            try:
                with open(f, "rb") as fh:
                    src = fh.read()
                total_lines += src.count(b"\n")
                ast.parse(src)
            except (SyntaxError, ValueError):
                cpython_rejects.add(f)
        with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as lst:
            lst.write("\n".join(files))
        # pass the files explicitly (in chunks) so --limit is honoured; all rules on
        reported: dict[str, list[str]] = {}
        crashes = []
        n_diags = 0
        t = time.perf_counter()
        chunk = 4000
        for i in range(0, len(files), chunk):
            cmd = [*_bertlint_cmd(), "--select", "ALL", "--output-format", "json-lines", "--exit-zero", "-q", "--jobs", str(jobs), *files[i : i + chunk]]
            p = subprocess.run(cmd, capture_output=True, text=True, env=_env())
            if p.returncode != 0:
                crashes.append(f"exit {p.returncode}: {p.stderr[-500:]}")
            for line in p.stderr.splitlines():
                if "internal error" in line or line.startswith("Traceback"):
                    crashes.append(line)
            for line in p.stdout.splitlines():
                try:
                    d = json.loads(line)
                except ValueError:
                    crashes.append(f"bad output line: {line[:200]}")
                    continue
                n_diags += 1
                if d["code"] == "BL001":
                    reported.setdefault(d["filename"], []).append(d["message"])
        dt = time.perf_counter() - t
        os.unlink(lst.name)
        not_reported = sorted(cpython_rejects - set(reported))
        # why: libcst's grammar is newer than this CPython (e.g. 3.12 syntax on 3.11), or the prefilter skipped it
        from bertlint.engine import _PREFILTER, parse_python

        why = {}
        for f in not_reported:
            with open(f, encoding="utf-8", errors="replace") as fh:
                src = fh.read()
            if not _PREFILTER.search(src):
                why[f] = "not parsed (prefilter: no training machinery)"
            elif not isinstance(parse_python(src), tuple):
                why[f] = "libcst parses it (syntax newer than this CPython); linted"
            else:
                why[f] = "NOT REPORTED although unparsable"
        row = {
            "package": pkg,
            "root": root,
            "files": len(files),
            "lines": total_lines,
            "seconds": round(dt, 2),
            "files_per_s": round(len(files) / dt, 1) if dt else None,
            "lines_per_s": round(total_lines / dt) if dt else None,
            "diagnostics": n_diags,
            "crashes": crashes,
            "unparsable_reported": {os.path.relpath(k, root): v for k, v in sorted(reported.items())},
            "cpython_rejects": len(cpython_rejects),
            "cpython_rejects_not_reported": {os.path.relpath(f, root): why[f] for f in not_reported},
        }
        out.append(row)
        print(
            f"{pkg:<13} {len(files):>5} files {total_lines:>8} lines  {dt:7.1f} s  {row['files_per_s']} files/s  "
            f"{len(crashes)} crashes  {len(reported)} BL001 files  (CPython {sys.version.split()[0]} rejects "
            f"{len(cpython_rejects)})",
            flush=True,
        )
        for f in not_reported:
            print(f"    CPython rejects {os.path.relpath(f, root)}: {why[f]}", flush=True)
        for k, v in row["unparsable_reported"].items():
            print(f"    BL001 {k}: {v[0][:140]}", flush=True)
        for c in crashes[:10]:
            print(f"    CRASH {c[:300]}", flush=True)
    return out


def profile(files: list[str]) -> list[dict]:
    """In-process CPU time of each stage for each file: parse, each shared analysis, each rule, positions."""
    sys.path.insert(0, os.path.dirname(HERE))
    import libcst as cst

    from bertlint import registry
    from bertlint.config import Settings
    from bertlint.context import FileContext

    pt = time.process_time
    rules = registry.all_rules()
    out = []
    for path in files:
        with open(path, encoding="utf-8") as f:
            src = f.read()
        t = pt()
        module = cst.parse_module(src)
        row = {"file": os.path.relpath(path), "parse": pt() - t}
        ctx = FileContext(path, src, module, Settings())
        for name in ("index", "symbols", "resolver", "versions", "setup", "loops", "evalflow"):
            t = pt()
            try:
                getattr(ctx, name)
            except Exception as e:  # an analysis that is not there (yet) or fails
                row[f"analysis:{name}"] = f"error: {type(e).__name__}"
                continue
            row[f"analysis:{name}"] = pt() - t
        for r in rules:
            ctx.current = r.meta
            t = pt()
            try:
                r.check(ctx)
            except Exception as e:
                row[r.meta.code] = f"error: {type(e).__name__}"
                continue
            row[r.meta.code] = pt() - t
        t = pt()
        ctx.positions
        row["positions (only with findings)"] = pt() - t
        out.append(row)
        print(f"{row['file']}: parse {row['parse']:.3f} s CPU", flush=True)
        timed = sorted(((k, v) for k, v in row.items() if isinstance(v, float) and k != "parse"), key=lambda kv: -kv[1])
        for k, v in timed[:12]:
            print(f"    {k:<32} {v:.3f} s", flush=True)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=7)
    ap.add_argument("--trees", default="transformers,accelerate,torch")
    ap.add_argument("--no-trees", action="store_true")
    ap.add_argument("--no-latency", action="store_true")
    ap.add_argument("--limit", type=int, default=0, help="lint an even sample of N files of each tree")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", help="write the figures to this file")
    ap.add_argument("--profile", action="store_true", help="CPU time per stage, analysis and rule (in-process)")
    ap.add_argument("--bertlint-args", default="", help="extra options for the latency runs (e.g. '--select BL001')")
    ap.add_argument("--corpus", nargs="?", const=CORPUS, default=None, help="time the speed corpus (default folder: %(const)s)")
    ap.add_argument("--corpus-runs", type=int, default=3)
    ap.add_argument("--corpus-jobs", type=int, default=2, help="worker processes for the corpus runs (the targets are for 2 cores)")
    ap.add_argument("--tool-timeout", type=float, default=600, help="seconds for one run of another linter on the corpus")
    for t in OTHER_TOOLS:
        ap.add_argument(f"--{t}", metavar="PATH", help=f"the {TOOL_LABEL[t]} executable (a separate virtual environment)")
    ap.add_argument("--others", metavar="BINDIR", help="folder holding the torchfix / fixit / ruff executables")
    a = ap.parse_args()
    result: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if a.profile:
        result["profile"] = profile([os.path.join(DATA, n) for n in ("train_small.py", "train_large.py")])
        return 0
    tools = other_tools(a) if (not a.no_latency or a.corpus) else {}
    if not a.no_latency:
        result["latency"] = latency(a.runs, a.bertlint_args.split(), tools)
    if a.corpus:
        result["corpus"] = corpus(a.corpus, a.corpus_runs, a.corpus_jobs, tools, a.tool_timeout)
    if not a.no_trees:
        result["trees"] = trees([t for t in a.trees.split(",") if t], a.limit, a.jobs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    crashed = any(r["crashes"] for r in result.get("trees", []))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
