"""Latency of the training-loop analysis and the loop rules on a ~1,200-line script.

    python benchmarks/bench_loops.py [--lines 1200] [--repeat 5]

Builds one script from the fixtures under ``fixtures/loops`` (each wrapped in a function) and reports the median
time of: parse, the shared symbol walk, ``ctx.loops``, the loop rules (BL101–BL115, BL201, BL202), and the whole
``lint_python`` (every rule). Also compare with ``time bertlint FILE`` (process start included)."""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LOOP_CODES = {f"BL1{n:02d}" for n in range(1, 16)} | {"BL201", "BL202"}


def build_script(lines: int) -> str:
    parts = ["import torch\n"]
    n = 1
    for i, p in enumerate(sorted(glob.glob(os.path.join(ROOT, "fixtures", "loops", "*.py")))):
        body = open(p, encoding="utf-8").read().splitlines()
        block = [f"def script_{i}():"] + [("    " + ln) if ln.strip() else "" for ln in body] + [""]
        if n + len(block) > lines:
            break
        parts.append("\n".join(block))
        n += len(block)
    return "\n".join(parts) + "\n"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lines", type=int, default=1200)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)

    import libcst as cst

    from bertlint.config import Settings
    from bertlint.context import FileContext
    from bertlint.engine import lint_python
    from bertlint.registry import all_rules

    src = build_script(args.lines)
    rules = [r for r in all_rules() if r.meta.code in LOOP_CODES]
    t = {"parse": [], "symbols": [], "loops": [], "positions (first report)": [], "loop rules": [],
         "lint_python (all rules)": []}
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        m = cst.parse_module(src)
        t1 = time.perf_counter()
        ctx = FileContext("bench.py", src, m, Settings())
        ctx.symbols
        t2 = time.perf_counter()
        loops = ctx.loops
        t3 = time.perf_counter()
        ctx.positions  # paid once by whichever rule reports first
        t3b = time.perf_counter()
        t3, t3b = t3b, t3
        for r in rules:
            ctx.current = r.meta
            r.check(ctx)
        t4 = time.perf_counter()
        lint_python(src, "bench.py")
        t5 = time.perf_counter()
        for k, v in zip(t, (t1 - t0, t2 - t1, t3b - t2, t3 - t3b, t4 - t3, t5 - t4)):
            t[k].append(v)
    print(f"script: {len(src.splitlines())} lines, {len(loops)} training loops, {len(ctx.diagnostics)} loop findings")
    for k, v in t.items():
        print(f"{k:26} median {statistics.median(v) * 1000:8.1f} ms   min {min(v) * 1000:8.1f} ms")
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as fh:
        fh.write(src)
    print(f"(script written to {fh.name}; try `time bertlint {fh.name}`)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
