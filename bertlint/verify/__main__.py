"""``python -m bertlint.verify SCRIPT [--steps N] [--timeout S] [--report DIR] [--nproc N] [--json] [-- ARGS]``:
lint SCRIPT and verify its findings at runtime (the same as ``bertlint --verify``; handy under ``torchrun``).

Exit status: 0 verified, nothing found; 1 verified, findings; 3 the script failed or nothing could be verified.
Under torchrun every rank exits 0 (a non-zero rank makes torchrun print a ChildFailedError traceback); rank 0
prints the outcome and the status it would have returned."""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    script_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, script_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python -m bertlint.verify")
    p.add_argument("script")
    p.add_argument("--steps", type=int, default=None, help="optimizer steps to observe (default 3)")
    p.add_argument("--timeout", type=float, default=300.0)
    p.add_argument("--report", default=None, help="folder for verify.json and memory_timeline.png")
    p.add_argument("--nproc", type=int, default=None, help="run the script under torchrun with N processes")
    p.add_argument("--memory-limit", type=int, default=None, help="simulate an out-of-memory error past N bytes")
    p.add_argument("--json", action="store_true", help="print the diagnostics as a JSON array")
    a = p.parse_args(argv)
    from bertlint.verify import verify_script

    try:
        from bertlint.api import lint_path

        diags = lint_path(a.script)
    except Exception:
        from bertlint.engine import lint_python

        with open(a.script, encoding="utf-8", errors="replace") as f:
            diags = lint_python(f.read(), a.script)
    res = verify_script(a.script, script_args, diags, steps=a.steps, timeout=a.timeout, report_dir=a.report,
                        nproc=a.nproc, memory_limit=a.memory_limit)
    from bertlint.verify import _under_torchrun

    torchrun = _under_torchrun()
    rank = os.environ.get("RANK", "0")
    if torchrun and rank != "0":
        return 0  # rank 0 reports
    if a.json:
        print(json.dumps([d.to_json() for d in res.diagnostics], indent=2))
    else:
        for d in res.diagnostics:
            v = d.verification
            print(f"{d.filename}:{d.start.row}:{d.start.column}: {d.code} {d.message}")
            if v is not None:
                print(f"    verification: {v.status}: {v.evidence}")
        print(res.report_text)
    code = res.exit_code
    if torchrun:
        # a non-zero exit of a rank makes torchrun print a ChildFailedError traceback: the status is in the
        # outcome line (and --json), the rank exits 0
        if code:
            print(f"  (under torchrun every rank exits 0; without torchrun the exit status would be {code})")
        return 0
    return code


if __name__ == "__main__":
    sys.exit(main())
