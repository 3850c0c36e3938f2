"""Per-rule precision and recall over every fixture (``fixtures/**/NAME.expect.json``).

    python benchmarks/precision_recall.py [--codes BL1,BL2] [--json]

A reported (code, line) pair listed in the expectation is a true positive, an unlisted one a false positive,
a listed pair not reported a false negative. "clean FP" counts false positives on correct fixtures (those whose
expectation lists no finding) — the number that must stay 0."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from fixture_support import ROOT, expectation_files, expected_pairs, load, lint, reported_pairs, script_for  # noqa


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--codes", default="", help="comma-separated code prefixes to show (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    prefixes = [c.strip() for c in args.codes.split(",") if c.strip()]
    tp, fp, fn, clean_fp = defaultdict(int), defaultdict(int), defaultdict(int), defaultdict(int)
    files = 0
    t0 = time.perf_counter()
    problems = []
    for exp in expectation_files():
        script = script_for(exp)
        if script is None:
            continue
        files += 1
        data = load(exp)
        want = expected_pairs(data)
        got = reported_pairs(lint(script))
        for code, line in got & want:
            tp[code] += 1
        for code, line in got - want:
            fp[code] += 1
            if not want:
                clean_fp[code] += 1
            problems.append(f"FP {code} {os.path.relpath(script, ROOT)}:{line}")
        for code, line in want - got:
            fn[code] += 1
            problems.append(f"FN {code} {os.path.relpath(script, ROOT)}:{line}")
    elapsed = time.perf_counter() - t0
    codes = sorted(set(tp) | set(fp) | set(fn))
    if prefixes:
        codes = [c for c in codes if any(c.startswith(p) for p in prefixes)]
    rows = []
    for c in codes:
        p = tp[c] / (tp[c] + fp[c]) if tp[c] + fp[c] else None
        r = tp[c] / (tp[c] + fn[c]) if tp[c] + fn[c] else None
        rows.append({"code": c, "tp": tp[c], "fp": fp[c], "fn": fn[c], "clean_fp": clean_fp[c], "precision": p, "recall": r})
    if args.json:
        print(json.dumps({"files": files, "seconds": elapsed, "rules": rows, "problems": problems}, indent=1))
        return 0
    fmt = lambda v: "  -  " if v is None else f"{v:5.2f}"  # noqa: E731
    print(f"{'code':6} {'TP':>4} {'FP':>4} {'FN':>4} {'cleanFP':>7} {'precision':>9} {'recall':>7}")
    for r in rows:
        print(f"{r['code']:6} {r['tp']:4d} {r['fp']:4d} {r['fn']:4d} {r['clean_fp']:7d} {fmt(r['precision']):>9} {fmt(r['recall']):>7}")
    T = sum(r["tp"] for r in rows)
    F = sum(r["fp"] for r in rows)
    N = sum(r["fn"] for r in rows)
    print(f"{'all':6} {T:4d} {F:4d} {N:4d} {sum(r['clean_fp'] for r in rows):7d} "
          f"{fmt(T / (T + F) if T + F else None):>9} {fmt(T / (T + N) if T + N else None):>7}")
    print(f"{files} fixtures linted in {elapsed:.2f} s")
    for p in problems:
        if not prefixes or any(p.split()[1].startswith(x) for x in prefixes):
            print(p)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
