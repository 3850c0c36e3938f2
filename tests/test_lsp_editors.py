"""The README's editor snippets against real editors, where one is installed (skipped otherwise).

Emacs + eglot: the README's `eglot-server-programs` entry, a buggy script, the diagnostics eglot hands to
flymake, the code actions, and the BL206 quick fix applied by eglot's own workspace-edit code.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("pygls")

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    """\
    import torch
    from torch.utils.data import DataLoader


    def train(model, dataset, optimizer, accum_steps=8):
        scaler = torch.cuda.amp.GradScaler()
        dl = DataLoader(dataset, batch_size=2)
        for i, batch in enumerate(dl):
            loss = model(**batch).loss / accum_steps
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    """
)

EMACS_SCRIPT = r"""
(dolist (d (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*")) (add-to-list 'load-path d))
(require 'eglot)
(require 'flymake)
;; the README's snippet
(with-eval-after-load 'eglot
  (add-to-list 'eglot-server-programs
               '((python-mode python-ts-mode) . ("bertlint" "lsp"))))
(setq eglot-sync-connect 30)
(find-file (getenv "BERTLINT_E2E_FILE"))
(python-mode)
(apply #'eglot (eglot--guess-contact))
(flymake-mode 1)
(let ((i 0))
  (while (and (< i 200) (< (length (flymake-diagnostics)) 2))
    (flymake-start)
    (accept-process-output nil 0.2)
    (setq i (1+ i))))
(dolist (d (flymake-diagnostics))
  (princ (format "DIAG %d %s\n" (line-number-at-pos (flymake-diagnostic-beg d)) (flymake-diagnostic-text d))))
(goto-char (point-min))
(search-forward "torch.cuda.amp.GradScaler()")
(let* ((beg (match-beginning 0)) (end (match-end 0))
       (actions (jsonrpc-request (eglot-current-server) :textDocument/codeAction
                                 (list :textDocument (eglot--TextDocumentIdentifier)
                                       :range (list :start (eglot--pos-to-lsp-position beg)
                                                    :end (eglot--pos-to-lsp-position end))
                                       :context (list :diagnostics [])))))
  (seq-doseq (a actions) (princ (format "ACTION %s\n" (plist-get a :title))))
  (let ((fix (seq-find (lambda (a) (string-prefix-p "Fix BL206" (plist-get a :title))) actions)))
    (eglot--apply-workspace-edit (plist-get fix :edit))
    (princ (format "LINE %s\n" (string-trim (thing-at-point 'line t))))))
(eglot-shutdown (eglot-current-server))
"""


def _emacs_with_eglot() -> str | None:
    emacs = shutil.which("emacs")
    if not emacs:
        return None
    probe = subprocess.run(
        [emacs, "--batch", "-Q", "--eval",
         '(progn (dolist (d (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*")) '
         "(add-to-list 'load-path d)) (require 'eglot))"],
        capture_output=True,
        timeout=60,
    )
    return emacs if probe.returncode == 0 else None


@pytest.mark.timeout(120)
def test_emacs_eglot_snippet(tmp_path):
    emacs = _emacs_with_eglot()
    if emacs is None:
        pytest.skip("emacs with eglot is not installed")
    bindir = Path(sys.executable).parent
    if not (bindir / "bertlint").exists():
        pytest.skip("the bertlint console script is not installed next to this interpreter")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)  # a project root for eglot
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    el = tmp_path / "e2e.el"
    el.write_text(EMACS_SCRIPT)
    env = dict(os.environ, BERTLINT_E2E_FILE=str(path), PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               HF_HUB_OFFLINE="1")
    out = subprocess.run([emacs, "--batch", "-Q", "-l", str(el)], capture_output=True, text=True, timeout=110,
                         env=env, cwd=tmp_path)
    lines = out.stdout.splitlines()
    diags = [ln for ln in lines if ln.startswith("DIAG ")]
    assert any(ln.startswith("DIAG 6 ") and "BL206" in ln for ln in diags), out.stdout + out.stderr[-2000:]
    assert any(ln.startswith("DIAG 11 ") and "BL101" in ln for ln in diags), out.stdout + out.stderr[-2000:]
    actions = [ln[len("ACTION "):] for ln in lines if ln.startswith("ACTION ")]
    assert any(a.startswith("Fix BL206") for a in actions) and "Suppress with `# noqa: BL206`" in actions
    assert 'LINE scaler = torch.amp.GradScaler("cuda")' in lines
