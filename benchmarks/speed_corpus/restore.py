"""Restore the speed corpus (issue 12): the example training code of accelerate, diffusers and pytorch/examples
at fixed commits, 429 Python files, 279,652 lines, byte-exact, into the git-ignored ``files/`` folder next to
this script. Only the manifest (repository, commit, paths, sha256) is in git; the files are third-party code.

    python benchmarks/speed_corpus/restore.py                     # from local git mirrors, else raw.githubusercontent.com
    python benchmarks/speed_corpus/restore.py --mirror-root DIR   # mirrors at DIR/<owner>+<name>/repo (bare git dirs)
    python benchmarks/speed_corpus/restore.py --check             # verify the restored files against the manifest
    python benchmarks/speed_corpus/restore.py --make-manifest     # (maintainers) rebuild the manifest from the mirrors

Each file lands at ``files/<owner>__<name>/<path>``. A local mirror (any git directory that holds the commit:
a bare clone, or the ``.git`` of a checkout) is read with ``git --git-dir=... show <commit>:<path>``; without
one, each file is downloaded from ``https://raw.githubusercontent.com/<repo>/<commit>/<path>``. Every file is
checked against its sha256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.path.join(HERE, "manifest.json")
FILES = os.path.join(HERE, "files")
DEFAULT_MIRRORS = os.environ.get("BERTLINT_MIRROR_ROOT", "/work/.mirror")

# what the corpus is: every example .py of accelerate and diffusers, every .py of pytorch/examples
SOURCES = [
    ("huggingface/accelerate", "examples/"),
    ("huggingface/diffusers", "examples/"),
    ("pytorch/examples", ""),
]


def _git_dir(root: str, repo: str) -> str | None:
    for cand in (os.path.join(root, repo.replace("/", "+"), "repo"), os.path.join(root, repo.replace("/", "+"))):
        if os.path.isdir(cand):
            return cand
    return None


def _git_show(git_dir: str, commit: str, path: str) -> bytes | None:
    p = subprocess.run(["git", "--git-dir", git_dir, "show", f"{commit}:{path}"], capture_output=True)
    return p.stdout if p.returncode == 0 else None


def _download(repo: str, commit: str, path: str) -> bytes:
    url = f"https://raw.githubusercontent.com/{repo}/{commit}/{path}"
    with urllib.request.urlopen(url, timeout=60) as r:
        return r.read()


def local_path(repo: str, path: str) -> str:
    return os.path.join(FILES, repo.replace("/", "__"), path)


def make_manifest(mirror_root: str) -> int:
    out = []
    for repo, prefix in SOURCES:
        gd = _git_dir(mirror_root, repo)
        if gd is None:
            print(f"{repo}: no mirror under {mirror_root}", file=sys.stderr)
            return 2
        commit = subprocess.run(["git", "--git-dir", gd, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()
        names = subprocess.run(["git", "--git-dir", gd, "ls-tree", "-r", "--name-only", commit], capture_output=True, text=True, check=True).stdout.splitlines()
        files = []
        for n in sorted(n for n in names if n.startswith(prefix) and n.endswith(".py")):
            data = _git_show(gd, commit, n)
            files.append({"path": n, "sha256": hashlib.sha256(data).hexdigest(), "lines": data.count(b"\n")})
        out.append({"repo": repo, "commit": commit, "selection": f"{prefix or ''}**/*.py", "files": files})
    with open(MANIFEST, "w") as f:  # one line per file, so that a diff of two manifests reads
        f.write("[\n")
        for i, e in enumerate(out):
            head = json.dumps({k: v for k, v in e.items() if k != "files"})[:-1]
            rows = ",\n".join("  " + json.dumps(x) for x in e["files"])
            f.write(f'{head}, "files": [\n{rows}\n]}}{"," if i < len(out) - 1 else ""}\n')
        f.write("]\n")
    n = sum(len(e["files"]) for e in out)
    print(f"manifest: {n} files, {sum(x['lines'] for e in out for x in e['files'])} lines")
    return 0


def load() -> list[dict]:
    with open(MANIFEST) as f:
        return json.load(f)


def restore(mirror_root: str, allow_download: bool) -> int:
    bad = 0
    n = 0
    for entry in load():
        repo, commit = entry["repo"], entry["commit"]
        gd = _git_dir(mirror_root, repo)
        for f in entry["files"]:
            dest = local_path(repo, f["path"])
            if os.path.exists(dest):
                with open(dest, "rb") as fh:
                    if hashlib.sha256(fh.read()).hexdigest() == f["sha256"]:
                        n += 1
                        continue
            data = _git_show(gd, commit, f["path"]) if gd else None
            if data is None and allow_download:
                data = _download(repo, commit, f["path"])
            if data is None or hashlib.sha256(data).hexdigest() != f["sha256"]:
                print(f"{repo}@{commit[:12]}:{f['path']}: {'missing' if data is None else 'sha256 differs'}", file=sys.stderr)
                bad += 1
                continue
            os.makedirs(os.path.dirname(dest), exist_ok=True)
            with open(dest, "wb") as fh:
                fh.write(data)
            n += 1
    print(f"{n} files in {FILES}, {bad} not restored")
    return 1 if bad else 0


def check() -> int:
    bad = 0
    n = 0
    for entry in load():
        for f in entry["files"]:
            dest = local_path(entry["repo"], f["path"])
            try:
                with open(dest, "rb") as fh:
                    ok = hashlib.sha256(fh.read()).hexdigest() == f["sha256"]
            except OSError:
                ok = False
            n += ok
            bad += not ok
    print(f"{n} files match the manifest, {bad} missing or different")
    return 1 if bad else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirror-root", default=DEFAULT_MIRRORS)
    ap.add_argument("--no-download", action="store_true", help="only local mirrors")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--make-manifest", action="store_true")
    a = ap.parse_args()
    if a.make_manifest:
        return make_manifest(a.mirror_root)
    if a.check:
        return check()
    return restore(a.mirror_root, not a.no_download)


if __name__ == "__main__":
    sys.exit(main())
