"""Score bertlint on the real-world corpus (issue 10).

    python benchmarks/realworld/score.py [--all-rules] [--only REGEX] [--family BL1] [--json OUT] [-j 2] [-q]

Entries come from ``manifest.json`` (if present) and every ``parts/*.json`` (a JSON list each; duplicates by
``local`` are skipped, the first one read wins: manifest, then parts in name order). Each entry is linted
alone in a fresh temporary folder (an empty ``.git`` folder marks its root, so settings / version-pin discovery
stop there) holding the entry at ``dest`` and its companions at theirs, with bertlint's in-process API and the
default rule selection (``--all-rules``: the off-by-default rules too).

Per entry: HIT / MISS (expected findings), FP (a finding on a correct file), EXTRA (a finding on a buggy file
that matches no expectation; its ``judged`` verdict is shown), DUP (the same code twice within +-2 lines),
CRASH (exception text; the run goes on), MISSING (file or companion absent: restore with check.py).
A finding HITs an expectation when its code is ``code`` or in ``alt_codes`` and its line is within +-2 of one
of ``lines``. EXTRA findings judged ``fp`` count as false positives; ``tp`` / ``acceptable`` do not. A finding on a
correct file counts as FP unless it was re-examined and judged ``tp`` / ``acceptable`` (shown, counted apart).
The last four lines printed are the overall summary.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import tempfile
import time
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FILES = os.path.join(HERE, "files")
NEAR = 2
ENTRY_TIMEOUT_S = 60

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


# ------------------------------------------------------------------------------------------------ loading


def load_entries(here: str = HERE, manifest: str | None = None) -> tuple[list[dict], list[str]]:
    """(entries, warnings). Each entry gets ``_source`` (the JSON file it came from).

    ``manifest``: read only that JSON file (e.g. the held-out ``fresh2.json``) instead of the default
    ``manifest.json`` plus every ``parts/*.json``."""
    sources = []
    if manifest is not None:
        sources.append(os.path.abspath(manifest))
        if not os.path.isfile(sources[0]):
            return [], [f"{manifest}: no such file"]
    else:
        m = os.path.join(here, "manifest.json")
        if os.path.isfile(m):
            sources.append(m)
        sources.extend(sorted(glob.glob(os.path.join(here, "parts", "*.json"))))
    entries: list[dict] = []
    seen: dict[str, dict] = {}
    warnings: list[str] = []
    for src in sources:
        try:
            with open(src, encoding="utf-8") as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            warnings.append(f"{os.path.relpath(src, here)}: unreadable: {e}")
            continue
        if isinstance(data, dict):
            data = data.get("entries", [])
        if not isinstance(data, list):
            warnings.append(f"{os.path.relpath(src, here)}: not a list of entries")
            continue
        for i, e in enumerate(data):
            if not isinstance(e, dict) or not e.get("local"):
                warnings.append(f"{os.path.relpath(src, here)}[{i}]: entry without 'local'")
                continue
            key = e["local"]
            if key in seen:
                other = seen[key]
                a = {k: v for k, v in e.items() if not k.startswith("_")}
                b = {k: v for k, v in other.items() if not k.startswith("_")}
                if a != b:
                    warnings.append(
                        f"{os.path.relpath(src, here)}: {key} also in {other['_source']} with other contents; "
                        "the first one is used"
                    )
                continue
            e = dict(e)
            e["_source"] = os.path.relpath(src, here)
            seen[key] = e
            entries.append(e)
    by_sha: dict[str, dict] = {}
    for e in entries:
        sha = e.get("sha256")
        if sha and sha in by_sha:
            o = by_sha[sha]
            warnings.append(
                f"{e['_source']}: {e['local']} has the same bytes as {o['local']} ({o['_source']}): "
                "one file counted twice"
            )
        elif sha:
            by_sha[sha] = e
    return entries, warnings


def sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 16), b""):
            h.update(chunk)
    return h.hexdigest()


def entry_files(e: dict) -> list[tuple[str, str, str, str]]:
    """(role, local, dest, sha256) of the entry and its companions."""
    out = [("entry", e["local"], e.get("dest") or os.path.basename(e.get("path", e["local"])), e.get("sha256", ""))]
    for c in e.get("companions") or []:
        local = c.get("local")
        if not local:
            continue
        out.append(("companion", local, c.get("dest") or os.path.basename(c.get("path", local)), c.get("sha256", "")))
    return out


# ------------------------------------------------------------------------------------------------ linting


class _Timeout(Exception):
    pass


def _alarm(signum, frame):  # pragma: no cover - only on a hang
    raise _Timeout(f"no result after {ENTRY_TIMEOUT_S} s")


def lint_entry(job: tuple) -> dict:
    """Lint one entry in its own temporary folder. Never raises: a crash is returned as text."""
    idx, e, all_rules, files_dir = job
    res: dict = {"idx": idx, "findings": [], "crash": None, "missing": [], "sha_differs": [], "seconds": 0.0}
    for role, local, dest, sha in entry_files(e):
        p = os.path.join(files_dir, local)
        if not os.path.isfile(p):
            res["missing"].append(f"{role} {local}")
        elif sha and sha256(p) != sha:
            res["sha_differs"].append(f"{role} {local}")
    if res["missing"]:
        return res
    tmp = tempfile.mkdtemp(prefix="bl-rw-")
    t0 = time.perf_counter()
    import signal

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(ENTRY_TIMEOUT_S)
    try:
        os.mkdir(os.path.join(tmp, ".git"))
        target = None
        for role, local, dest, _ in entry_files(e):
            d = os.path.normpath(os.path.join(tmp, dest))
            if not d.startswith(tmp + os.sep):
                raise ValueError(f"dest {dest!r} leaves the temporary folder")
            os.makedirs(os.path.dirname(d), exist_ok=True)
            shutil.copyfile(os.path.join(files_dir, local), d)
            if role == "entry":
                target = d
        from bertlint import api
        from bertlint.registry import all_rules as registry_rules

        settings = api.load_settings(target)
        if all_rules:
            off = [r.meta.code for r in registry_rules() if not r.meta.default_enabled]
            settings = settings.with_cli(extend_select=off)
        diags = api.lint_path(target, settings)
        entry_dest = os.path.relpath(target, tmp)
        for d in diags:
            fn = os.path.relpath(os.path.abspath(d.filename), tmp) if d.filename else entry_dest
            res["findings"].append(
                {
                    "code": d.code,
                    "line": d.start.row,
                    "severity": d.severity.value,
                    "message": d.message,
                    "file": fn.replace(os.sep, "/"),
                    "cell": d.cell,
                }
            )
        res["entry_dest"] = entry_dest.replace(os.sep, "/")
    except BaseException as ex:  # noqa: BLE001 - a crash must never stop the run
        import traceback

        tb = traceback.extract_tb(ex.__traceback__)
        where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
        res["crash"] = f"{type(ex).__name__}: {ex}{where}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
        res["seconds"] = time.perf_counter() - t0
        shutil.rmtree(tmp, ignore_errors=True)
    return res


def run_all(entries: list[dict], all_rules: bool, jobs: int, files_dir: str = FILES) -> list[dict]:
    jobs_list = [(i, e, all_rules, files_dir) for i, e in enumerate(entries)]
    from bertlint.registry import all_rules as registry_rules

    registry_rules()  # import the rules once, before the workers fork
    results: list[dict] = []
    if jobs > 1 and len(jobs_list) > 1:
        try:
            import multiprocessing

            ctx = multiprocessing.get_context("fork")
            with ctx.Pool(min(jobs, len(jobs_list)), maxtasksperchild=50) as pool:
                results = list(pool.imap_unordered(lint_entry, jobs_list, chunksize=1))
        except (OSError, ImportError, PermissionError) as ex:
            sys.stderr.write(f"warning: no worker processes ({ex}); linting serially\n")
            results = []
    if not results:
        results = [lint_entry(j) for j in jobs_list]
    results.sort(key=lambda r: r["idx"])
    return results


# ------------------------------------------------------------------------------------------------ scoring


def family(code: str) -> str:
    m = re.match(r"BL(\d)", code or "")
    return f"BL{m.group(1)}xx" if m else "other"


def _near(a: int, lines) -> bool:
    return any(abs(a - int(l)) <= NEAR for l in lines or [])


def _judgement(e: dict, f: dict):
    for j in e.get("judged") or []:
        if j.get("code") == f["code"] and isinstance(j.get("line"), int) and abs(j["line"] - f["line"]) <= NEAR:
            return j
    return None


def score_entry(e: dict, r: dict, fam: str | None) -> dict:
    """Classify findings and expectations of one entry."""
    entry_dest = r.get("entry_dest") or e.get("dest") or os.path.basename(e.get("path", e["local"]))
    findings = [f for f in r["findings"] if not fam or f["code"].startswith(fam)]
    expected = [x for x in (e.get("expected") or []) if not fam or x.get("code", "").startswith(fam)]
    kind = e.get("kind") or ("buggy" if e.get("expected") else "correct")
    out = {"hits": [], "misses": [], "fps": [], "extras": [], "dups": []}
    matched: set[int] = set()
    for x in expected:
        codes = {x.get("code"), *(x.get("alt_codes") or [])}
        xfile = x.get("file") or entry_dest
        best = None
        for i, f in enumerate(findings):
            if f["code"] in codes and f["file"] == xfile and _near(f["line"], x.get("lines")):
                if best is None:
                    best = (i, f)
                matched.add(i)
        if best:
            out["hits"].append((x, best[1]))
        else:
            out["misses"].append(x)
    for i, f in enumerate(findings):
        if i in matched:
            continue
        j = _judgement(e, f)
        if kind == "correct":
            out["fps"].append((f, j))
        else:
            near = [x for x in expected if _near(f["line"], x.get("lines"))]
            out["extras"].append((f, j, near))
    # duplicates: the same code twice within +-2 lines in the same file
    seen: list[dict] = []
    for f in sorted(findings, key=lambda f: (f["file"], f["code"], f["line"])):
        for g in seen:
            if g["code"] == f["code"] and g["file"] == f["file"] and abs(g["line"] - f["line"]) <= NEAR:
                out["dups"].append((g, f))
                break
        seen.append(f)
    out["kind"] = kind
    out["n_expected"] = len(expected)
    return out


def _short(msg: str, n: int = 110) -> str:
    msg = " ".join(msg.split())
    return msg if len(msg) <= n else msg[: n - 1] + "…"


def _fmt(f: dict, entry_dest: str) -> str:
    where = f"{f['line']}" if f["file"] == entry_dest else f"{f['file']}:{f['line']}"
    return f"{f['code']}[{f['severity']}] line {where}: {_short(f['message'])}"


def pct(a: int, b: int) -> str:
    return f"{100 * a / b:.0f}%" if b else "n/a"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--all-rules", action="store_true", help="also enable the off-by-default rules")
    ap.add_argument("--only", metavar="REGEX", help="only entries whose local / repo / path matches REGEX")
    ap.add_argument("--family", metavar="PREFIX", help="only expectations and findings whose code starts so (BL1)")
    ap.add_argument("--json", metavar="OUT", help="write the per-entry results as JSON")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="worker processes (default 2)")
    ap.add_argument("-q", "--quiet", action="store_true", help="print only entries with a MISS/FP/EXTRA/problem")
    ap.add_argument("--files", default=FILES, help="folder holding the corpus files (default files/)")
    ap.add_argument("--manifest", metavar="PATH", help="score only the entries of this JSON file (e.g. fresh2.json, "
                    "the held-out split) instead of manifest.json + parts/*.json")
    o = ap.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

    t0 = time.perf_counter()
    entries, warnings = load_entries(manifest=o.manifest)
    for w in warnings:
        print(f"warning: {w}")
    if o.only:
        rx = re.compile(o.only)
        entries = [e for e in entries if rx.search(e["local"]) or rx.search(e.get("repo", "")) or rx.search(e.get("path", ""))]
    fam = o.family.upper() if o.family else None
    results = run_all(entries, o.all_rules, o.jobs, o.files)

    tot = Counter()
    by_fam: dict[str, Counter] = defaultdict(Counter)
    by_fw: dict[str, Counter] = defaultdict(Counter)
    by_code: dict[str, Counter] = defaultdict(Counter)
    sev = {"hit": Counter(), "fp": Counter(), "extra": Counter()}
    per_entry_json = []
    repos = set()
    for e, r in zip(entries, results):
        fw = e.get("framework", "?")
        repos.add(e.get("repo"))
        entry_dest = r.get("entry_dest") or e.get("dest") or os.path.basename(e.get("path", e["local"]))
        head = f"== {e['local']}  [{e.get('kind', '?')}, {fw}, {e.get('author', '?')}]"
        j = {"local": e["local"], "repo": e.get("repo"), "kind": e.get("kind"), "framework": fw,
             "missing": r["missing"], "sha_differs": r["sha_differs"], "crash": r["crash"],
             "seconds": round(r["seconds"], 3), "findings": r["findings"]}
        if r["missing"]:
            tot["missing"] += 1
            print(head)
            for m in r["missing"]:
                print(f"  MISSING {m} (restore: python benchmarks/realworld/check.py --restore)")
            per_entry_json.append(j)
            continue
        if r["sha_differs"]:
            tot["sha"] += 1
        if r["crash"]:
            tot["crash"] += 1
        s = score_entry(e, r, fam)
        kind = s["kind"]
        tot["entries"] += 1
        tot[kind] += 1
        tot["expected"] += s["n_expected"]
        tot["hit"] += len(s["hits"])
        fps_counted = 0
        for x, f in s["hits"]:
            by_code[x.get("code", "")]["hit"] += 1
            by_fam[family(x.get("code", ""))]["hit"] += 1
            by_fw[fw]["hit"] += 1
            sev["hit"][f["severity"]] += 1
        for x in s["misses"]:
            by_code[x.get("code", "")]["miss"] += 1
            by_fam[family(x.get("code", ""))]["miss"] += 1
            by_fw[fw]["miss"] += 1
        for f, jd in s["fps"]:
            if jd and jd.get("verdict") in ("tp", "acceptable"):
                # re-examined and judged right: shown, not counted (the verdict and its reason are in the entry)
                tot["fp_judged_ok"] += 1
                continue
            tot["fp"] += 1
            fps_counted += 1
            by_fam[family(f["code"])]["fp"] += 1
            by_fw[fw]["fp"] += 1
            sev["fp"][f["severity"]] += 1
        for f, jd, near in s["extras"]:
            tot["extra"] += 1
            sev["extra"][f["severity"]] += 1
            v = (jd or {}).get("verdict")
            if v == "fp":
                tot["extra_fp"] += 1
                by_fam[family(f["code"])]["extra_fp"] += 1
                by_fw[fw]["extra_fp"] += 1
            elif v in ("tp", "acceptable"):
                tot["extra_ok"] += 1
            else:
                tot["extra_unjudged"] += 1
        by_fw[fw][kind] += 1
        if kind == "correct" and fps_counted:
            tot["correct_with_fp"] += 1
        tot["dups"] += len(s["dups"])
        problems = s["misses"] or s["fps"] or s["extras"] or s["dups"] or r["crash"] or r["sha_differs"]
        if not o.quiet or problems:
            print(head)
            if r["sha_differs"]:
                print(f"  SHA-DIFFERS {', '.join(r['sha_differs'])} (the bytes are not the recorded ones)")
            if r["crash"]:
                print(f"  CRASH {r['crash']}")
            for x, f in s["hits"]:
                print(f"  HIT   {x.get('code')} @ {x.get('lines')}: {_fmt(f, entry_dest)}")
            for x in s["misses"]:
                alt = f" (or {', '.join(x['alt_codes'])})" if x.get("alt_codes") else ""
                print(f"  MISS  {x.get('code')}{alt} @ {x.get('lines')}: {_short(x.get('why', ''))}")
            for f, jd in s["fps"]:
                note = f"  [judged {jd.get('verdict')}: {_short(jd.get('why', ''), 60)}]" if jd else ""
                print(f"  FP    {_fmt(f, entry_dest)}{note}")
            for f, jd, near in s["extras"]:
                note = f"  [judged {jd.get('verdict')}]" if jd else "  [unjudged]"
                if near:
                    note += f" (near expected {', '.join(sorted({x.get('code', '') for x in near}))})"
                print(f"  EXTRA {_fmt(f, entry_dest)}{note}")
            for g, f in s["dups"]:
                print(f"  DUP   {f['code']} lines {g['line']} and {f['line']}")
        j.update({
            "hits": [{"expected": x, "finding": f} for x, f in s["hits"]],
            "misses": s["misses"],
            "fps": [{"finding": f, "judged": jd} for f, jd in s["fps"]],
            "extras": [{"finding": f, "judged": jd} for f, jd, _ in s["extras"]],
            "duplicates": [[g, f] for g, f in s["dups"]],
        })
        per_entry_json.append(j)

    elapsed = time.perf_counter() - t0
    print()
    print(f"per family{' (' + fam + ')' if fam else ''}: expected hits / misses -> recall; FP on correct files; EXTRA judged fp")
    for k in sorted(by_fam):
        c = by_fam[k]
        n = c["hit"] + c["miss"]
        codes = " ".join(
            f"{code} {by_code[code]['hit']}/{by_code[code]['hit'] + by_code[code]['miss']}"
            for code in sorted(by_code) if family(code) == k
        )
        print(f"  {k:<6} recall {c['hit']}/{n} ({pct(c['hit'], n)})  FP {c['fp']}  EXTRA-fp {c['extra_fp']}"
              + (f"  [{codes}]" if codes else ""))
    print("per framework:")
    for k in sorted(by_fw):
        c = by_fw[k]
        n = c["hit"] + c["miss"]
        print(f"  {k:<11} files {c['buggy']} buggy / {c['correct']} correct  recall {c['hit']}/{n} ({pct(c['hit'], n)})"
              f"  FP {c['fp']}  EXTRA-fp {c['extra_fp']}")
    slow = sorted(((r["seconds"], e["local"]) for e, r in zip(entries, results)), reverse=True)[:3]
    if slow:
        cpu = sum(r["seconds"] for r in results)
        print(f"lint time: {cpu:.1f} s summed over entries; slowest: "
              + ", ".join(f"{name} {sec:.1f} s" for sec, name in slow))
    if o.json:
        with open(o.json, "w", encoding="utf-8") as f:
            json.dump({"entries": per_entry_json, "totals": dict(tot),
                       "by_code": {k: dict(v) for k, v in by_code.items()},
                       "by_family": {k: dict(v) for k, v in by_fam.items()},
                       "by_framework": {k: dict(v) for k, v in by_fw.items()}}, f, indent=1)
    fp_all = tot["fp"] + tot["extra_fp"]

    def sv(c: Counter) -> str:
        return " ".join(f"{k} {c[k]}" for k in ("E", "W", "I")) or "-"

    print(f"files {tot['entries']} scored ({tot['buggy']} buggy, {tot['correct']} correct) from {len(repos)} repos"
          f" · missing {tot['missing']} · sha differs {tot['sha']} · {o.jobs} workers · {elapsed:.1f} s"
          f"{' · all rules' if o.all_rules else ''}{' · family ' + fam if fam else ''}")
    print(f"EXTRA {tot['extra']} on buggy files: {tot['extra_fp']} judged fp, {tot['extra_ok']} judged tp/acceptable,"
          f" {tot['extra_unjudged']} unjudged · correct files with an FP {tot['correct_with_fp']}/{tot['correct']}"
          f" ({tot['fp_judged_ok']} findings on correct files judged tp/acceptable, not counted)")
    print(f"severity: hits {sv(sev['hit'])} · FP {sv(sev['fp'])} · EXTRA {sv(sev['extra'])}"
          f" · false positives in all {fp_all}")
    print(f"recall {tot['hit']}/{tot['expected']} ({pct(tot['hit'], tot['expected'])}) · FP {tot['fp']} on"
          f" {tot['correct']} correct files (+{tot['extra_fp']} EXTRA judged fp) · crashes {tot['crash']}"
          f" · duplicates {tot['dups']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
