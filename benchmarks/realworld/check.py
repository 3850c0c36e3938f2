"""Check (and restore) the real-world corpus files.

    python benchmarks/realworld/check.py                      # list entries whose file / companion is missing or differs
    python benchmarks/realworld/check.py --restore            # re-create them from local mirrors with git show
    python benchmarks/realworld/check.py --restore --mirrors DIR
    python benchmarks/realworld/check.py --restore --manifest benchmarks/realworld/fresh2.json   # one split only

A mirror of ``owner/name`` is the folder ``DIR/owner+name`` (default DIR: /work/.mirror); its git directory is
found inside it (``repo/.git``, ``repo``, ``.git`` or the folder itself). A file is restored with
``git --git-dir <git dir> show <commit>:<path>`` and kept only when its sha256 is the recorded one.
Repositories without a mirror (or without the commit) are listed at the end: fetch them, then run again.
Exit status: 0 when every file is present and matches, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from score import FILES, load_entries, sha256  # noqa: E402


def git_dir(mirrors: str, repo: str):
    base = os.path.join(mirrors, repo.replace("/", "+"))
    for cand in (os.path.join(base, "repo", ".git"), os.path.join(base, "repo"), os.path.join(base, ".git"), base):
        if os.path.isfile(os.path.join(cand, "HEAD")) and os.path.isdir(os.path.join(cand, "objects")):
            return cand
    return None


def items(entries):
    """(entry local, role, repo, path, commit, local, sha256) for every file of every entry."""
    for e in entries:
        yield e["local"], "entry", e.get("repo"), e.get("path"), e.get("commit"), e["local"], e.get("sha256")
        for c in e.get("companions") or []:
            yield (e["local"], "companion", c.get("repo") or e.get("repo"), c.get("path"),
                   c.get("commit") or e.get("commit"), c.get("local"), c.get("sha256"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--restore", action="store_true", help="re-create missing / differing files from mirrors")
    ap.add_argument("--mirrors", default="/work/.mirror", help="folder of repository mirrors (owner+name)")
    ap.add_argument("--files", default=FILES, help="corpus files folder (default files/)")
    ap.add_argument("--manifest", metavar="PATH", help="check only the entries of this JSON file (e.g. fresh2.json) "
                    "instead of manifest.json + parts/*.json")
    o = ap.parse_args(argv)

    entries, warnings = load_entries(manifest=o.manifest)
    for w in warnings:
        print(f"warning: {w}")
    os.makedirs(o.files, exist_ok=True)
    bad = 0
    ok = 0
    need_fetch: dict[str, list[str]] = {}
    done: set[str] = set()
    for owner_local, role, repo, path, commit, local, sha in items(entries):
        if not local or local in done:
            continue
        done.add(local)
        p = os.path.join(o.files, local)
        state = "ok"
        if not os.path.isfile(p):
            state = "missing"
        elif sha and sha256(p) != sha:
            state = "differs"
        elif not sha:
            state = "no-sha"
        if state == "ok":
            ok += 1
            continue
        if state == "no-sha":
            print(f"NO-SHA   {local} ({owner_local}): the entry records no sha256")
            bad += 1
            continue
        if not o.restore:
            print(f"{state.upper():<8} {local}  ({role} of {owner_local}; {repo} {path} @ {commit})")
            bad += 1
            continue
        gd = git_dir(o.mirrors, repo or "")
        if gd is None:
            need_fetch.setdefault(repo, []).append(local)
            print(f"NO-MIRROR {local}: {repo} has no mirror in {o.mirrors}")
            bad += 1
            continue
        r = subprocess.run(["git", "--git-dir", gd, "show", f"{commit}:{path}"], capture_output=True)
        if r.returncode != 0:
            need_fetch.setdefault(repo, []).append(local)
            print(f"FAILED   {local}: git show {commit}:{path}: {r.stderr.decode(errors='replace').strip()[:200]}")
            bad += 1
            continue
        import hashlib

        got = hashlib.sha256(r.stdout).hexdigest()
        if sha and got != sha:
            print(f"SHA-DIFF {local}: git show gives sha256 {got[:12]}…, the entry records {sha[:12]}…; not written")
            bad += 1
            continue
        with open(p, "wb") as f:
            f.write(r.stdout)
        print(f"RESTORED {local}  ({repo} {path} @ {commit[:10]})")
        ok += 1
    print(f"{ok} files present and matching, {bad} missing or differing ({len(entries)} entries)")
    if need_fetch:
        print("repositories to fetch (then run check.py --restore again):")
        for repo in sorted(need_fetch, key=str):
            print(f"  github:{repo}  ({len(need_fetch[repo])} files)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
