"""--verify has no side effects on the user's files (ISSUE 15 part 1): what the script saves goes to a temporary
folder that is removed afterwards, the script's interpreter shuts down normally (atexit handlers run, buffered files
are flushed), and the import environment is `python script.py`'s. Real transformers Trainer on a tiny BERT."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
os.environ["HF_HUB_OFFLINE"] = "1"

from bertlint.verify import verify_script  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
V = ROOT / "fixtures" / "verify"


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(folder.rglob("*"))}


def test_existing_checkpoints_are_byte_identical_and_the_script_shuts_down_normally(tmp_path):
    out = tmp_path / "out"
    for name, data in (("checkpoint-1/model.safetensors", b"user checkpoint 1"),
                       ("checkpoint-2/model.safetensors", b"user checkpoint 2"),
                       ("checkpoint-2/trainer_state.json", b'{"global_step": 2}'),
                       ("initial.pt", b"the user's own initial.pt"), ("initial/config.json", b"{}")):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(data)
    before = tree(out)
    marker = tmp_path / "marker"
    res = verify_script(str(V / "saves_everything.py"), ["--out", str(out), "--marker", str(marker)], [],
                        timeout=120)
    assert res.outcome == "verified", res.report_text
    # the Trainer saved checkpoint-1..3 with save_total_limit=1 (rotation), save_pretrained and torch.save ran
    # (and torch.load read its own file back): nothing of it reached --out
    assert tree(out) == before
    what = {e["what"] for e in res.report_json["redirected"]}
    assert {"Trainer output_dir (checkpoints, logs)", "torch.save", "PreTrainedModel.save_pretrained"} <= what
    assert "side effects redirected to a temporary folder (removed after the run)" in res.report_text
    # normal interpreter shutdown: the atexit handler ran and the never-closed log was flushed
    assert marker.read_text() == "atexit ran\n"
    assert (tmp_path / "marker.log").read_text() == "started\n"


def test_import_environment_is_the_one_of_python_script(tmp_path):
    script = V / "env_probe.py"
    plain, verified = tmp_path / "plain.json", tmp_path / "verified.json"
    subprocess.run([sys.executable, str(script), str(plain)], check=True, cwd=ROOT, timeout=60)
    res = verify_script(str(script), [str(verified)], [], timeout=60)
    a, b = json.loads(plain.read_text()), json.loads(verified.read_text())
    assert b == a
    assert a["path"][0] == str(V)  # python puts the script's folder first, not the working directory
    # bertlint's own root is not added (it is there only when the environment's PYTHONPATH names it)
    in_env = str(ROOT) in (os.environ.get("PYTHONPATH") or "").split(os.pathsep)
    assert (str(ROOT) in b["path"]) == in_env and b["pythonpath"] == os.environ.get("PYTHONPATH")
    assert res.outcome == "no-training" and res.exit_code == 3


def test_lightning_defaults_write_nothing_where_the_script_runs(tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    (tmp_path / "ckpts").mkdir()
    (tmp_path / "ckpts" / "epoch=0-step=1.ckpt").write_bytes(b"the user's checkpoint")
    before = tree(tmp_path)
    monkeypatch.chdir(tmp_path)
    res = verify_script(str(V / "lightning_defaults.py"), [], [], timeout=180)
    assert res.outcome == "verified", res.report_text
    assert tree(tmp_path) == before  # no lightning_logs/, no checkpoint, the user's checkpoint untouched
    what = {e["what"] for e in res.report_json["redirected"]}
    assert {"Lightning default_root_dir (lightning_logs, checkpoints)", "Lightning ModelCheckpoint dirpath"} <= what


def test_loads_from_a_redirected_output_folder_read_the_run_s_copy_not_the_user_s_stale_files(tmp_path):
    """AutoConfig / AutoModel / torch.load of what the run just saved read the sandbox copy; an older out/model the
    user keeps (another architecture, a stale sub-folder) is neither read nor changed."""
    import shutil

    script = tmp_path / "reload_output.py"
    shutil.copy(V / "reload_output.py", script)
    stale = tmp_path / "out" / "model"
    (stale / "old-run").mkdir(parents=True)
    cfg = {"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 48, "num_hidden_layers": 3,
           "num_attention_heads": 3, "intermediate_size": 96, "vocab_size": 100, "max_position_embeddings": 32}
    (stale / "config.json").write_text(json.dumps(cfg))
    (stale / "old-run" / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "out" / "state.pt").write_bytes(b"not a torch file")
    before = tree(tmp_path / "out")
    res = verify_script(str(script), [], [], timeout=120, report_dir=str(tmp_path / "report"))
    log = (tmp_path / "report" / "script_output.log").read_text()
    assert res.outcome == "verified", res.report_text + log
    assert "reloaded: hidden_size=32 layers=1 same_weights=True state={'step': 2}" in log, log
    assert "old-run: not found" in log, log
    assert tree(tmp_path / "out") == before
    what = {e["what"] for e in res.report_json["redirected"]}
    assert "AutoConfig.from_pretrained: read the run's copy" in what, what
    assert "AutoConfig.from_pretrained: not written by the run (the user's files are not read)" in what, what
