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


# ------------------------------------------------------------------------------------------------ Neovim

NVIM_PROBE = r"""
local out = {}
local function say(s) table.insert(out, s) end
local ok = vim.wait(60000, function() return #vim.diagnostic.get(0) >= 2 end, 100)
say("WAITED " .. tostring(ok))
for _, d in ipairs(vim.diagnostic.get(0)) do
  local code = d.code or (d.user_data and d.user_data.lsp and d.user_data.lsp.code) or "?"
  say(string.format("DIAG %d %s", d.lnum + 1, tostring(code)))
end
local params = {
  textDocument = vim.lsp.util.make_text_document_params(),
  range = { start = { line = 0, character = 0 }, ["end"] = { line = 0, character = 0 } },
  context = { diagnostics = {}, only = { "source.fixAll.bertlint" } },
}
local res = vim.lsp.buf_request_sync(0, "textDocument/codeAction", params, 20000) or {}
for _, r in pairs(res) do
  for _, a in ipairs(r.result or {}) do
    say("ACTION " .. a.title)
    if a.edit then vim.lsp.util.apply_workspace_edit(a.edit, "utf-16") end
  end
end
vim.cmd("silent write")
vim.fn.writefile(out, os.getenv("BERTLINT_E2E_OUT"))
vim.cmd("qall!")
"""


def _nvim_version(nvim: str) -> tuple[int, int] | None:
    import re

    r = subprocess.run([nvim, "--version"], capture_output=True, text=True, timeout=30)
    m = re.search(r"NVIM v(\d+)\.(\d+)", r.stdout)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _readme_lua(heading: str) -> str:
    """The README's Lua block under ``heading`` (the snippet tested is the one users copy)."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    at = text.index(heading)
    start = text.index("```lua\n", at) + len("```lua\n")
    return text[start : text.index("```", start)]


@pytest.mark.timeout(150)
def test_neovim_snippet_headless(tmp_path):
    nvim = shutil.which("nvim")
    if nvim is None:
        pytest.skip("neovim is not installed (CI installs it with apt where it can)")
    version = _nvim_version(nvim)
    if version is None or version < (0, 7):
        pytest.skip(f"neovim {version} is older than the README's recipes (0.7)")
    bindir = Path(sys.executable).parent
    if not (bindir / "bertlint").exists():
        pytest.skip("the bertlint console script is not installed next to this interpreter")
    heading = "**Neovim 0.11 and later**" if version >= (0, 11) else "**Neovim 0.7 to 0.10**"
    snippet = _readme_lua(heading)
    init = tmp_path / "init.lua"
    init.write_text("vim.cmd('filetype on')\n" + snippet)
    probe = tmp_path / "probe.lua"
    probe.write_text(NVIM_PROBE)
    path = tmp_path / "train.py"
    path.write_text(SCRIPT)
    out_file = tmp_path / "out.txt"
    env = dict(os.environ, BERTLINT_E2E_OUT=str(out_file), PATH=f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}",
               HF_HUB_OFFLINE="1", XDG_STATE_HOME=str(tmp_path / "state"), XDG_DATA_HOME=str(tmp_path / "data"))
    r = subprocess.run(
        [nvim, "--headless", "-n", "-i", "NONE", "-u", str(init), str(path), "-c", f"luafile {probe}"],
        capture_output=True, text=True, timeout=140, env=env, cwd=tmp_path, stdin=subprocess.DEVNULL,
    )
    assert out_file.exists(), f"neovim did not finish the probe: {r.stdout[-2000:]} {r.stderr[-2000:]}"
    lines = out_file.read_text().splitlines()
    log = "\n".join(lines) + r.stderr[-2000:]
    assert "WAITED true" in lines, log
    assert "DIAG 6 BL206" in lines and "DIAG 11 BL101" in lines, log
    assert "ACTION Fix all safe bertlint problems" in lines, log
    fixed = path.read_text()
    assert 'scaler = torch.amp.GradScaler("cuda")' in fixed and "torch.cuda.amp" not in fixed, fixed
    assert "        optimizer.step()\n" in fixed  # the unsafe BL101 fix is not part of fix-all
