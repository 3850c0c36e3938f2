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


def _time(cmd: list[str], runs: int, env: dict) -> tuple[float, list[float], int, float]:
    """(median wall s, all wall s, exit status, median CPU s of the child: user + sys, less sensitive to a
    loaded machine than wall time)."""
    import resource

    times = []
    cpu = []
    rc = 0
    subprocess.run(cmd, capture_output=True, env=env)  # warm the page cache and the .pyc files
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t = time.perf_counter()
        p = subprocess.run(cmd, capture_output=True, env=env)
        times.append(time.perf_counter() - t)
        r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append((r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime))
        rc = p.returncode
    return statistics.median(times), times, rc, statistics.median(cpu)


def _env() -> dict:
    # Bytecode caching on, as for any installed package (a PYTHONDONTWRITEBYTECODE=1 environment would make
    # every run compile bertlint's modules from source; the warm-up run writes the .pyc files).
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["NO_COLOR"] = "1"
    env["BERTLINT_NO_CACHE"] = "1"  # measure the lint, not the result cache (cli.py; README "Cache")
    return env


def latency(runs: int, extra: list[str]) -> list[dict]:
    env = _env()
    out = []
    for name in ("train_small.py", "train_large.py"):
        path = os.path.join(DATA, name)
        with open(path) as f:
            lines = len(f.read().splitlines())
        floor_cmd = [sys.executable, "-c", f"import libcst; libcst.parse_module(open({path!r}).read())"]
        lint_cmd = [*_bertlint_cmd(), *extra, path]
        floor, floor_all, _, floor_cpu = _time(floor_cmd, runs, env)
        lint, lint_all, rc, lint_cpu = _time(lint_cmd, runs, env)
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
        out.append(row)
        print(
            f"{row['file']:<32} {lines:>5} lines  floor {floor:.3f} s  bertlint {lint:.3f} s  "
            f"ratio {lint / floor:.2f}x  (exit {rc}); CPU: floor {floor_cpu:.3f} s  bertlint {lint_cpu:.3f} s  "
            f"ratio {lint_cpu / max(floor_cpu, 1e-9):.2f}x; spread: floor {min(floor_all):.3f}-{max(floor_all):.3f} s  "
            f"bertlint {min(lint_all):.3f}-{max(lint_all):.3f} s",
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
    a = ap.parse_args()
    result: dict = {"python": sys.version.split()[0], "cpus": os.cpu_count()}
    if a.profile:
        result["profile"] = profile([os.path.join(DATA, n) for n in ("train_small.py", "train_large.py")])
        return 0
    if not a.no_latency:
        result["latency"] = latency(a.runs, a.bertlint_args.split())
    if not a.no_trees:
        result["trees"] = trees([t for t in a.trees.split(",") if t], a.limit, a.jobs)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=2)
    crashed = any(r["crashes"] for r in result.get("trees", []))
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
