"""bertlint explain: the article's configuration gives effective batch 16 (2 × 8 × 1) and the BL405 finding."""

from __future__ import annotations

import json
from pathlib import Path

from bertlint.config import Settings
from bertlint.explain import explain_source, main, register_memory_estimator, render_text

ROOT = Path(__file__).resolve().parent.parent
ARTICLE = ROOT / "fixtures" / "trainer" / "article_bad.py"


def test_article_text_output(capsys):
    assert main([str(ARTICLE)]) == 0
    out = capsys.readouterr().out
    assert "effective batch:  16 = 2 (per device) × 8 (accumulation) × 1 (world size: per process)" in out
    assert "BertForSequenceClassification from 'bert-base-uncased', 109.5M parameters" in out
    assert "micro-batch:      2 per device" in out and "accumulation:     8" in out
    assert "precision:        fp16 mixed precision" in out
    assert "checkpointing:    on, non-reentrant" in out
    assert "loss ÷ N by:      nobody" in out and "×8" in out
    assert "BL405" in out and "Findings:" in out


def test_article_json_output(capsys):
    assert main([str(ARTICLE), "--output-format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    (s,) = rep["setups"]
    assert s["effective_batch"]["value"] == 16 and s["effective_batch"]["formula"] == "2 × 8 × 1 = 16"
    assert s["model"]["parameters"] == 109482240
    assert s["loss_division"]["inflated"] is True
    assert any(f["code"] == "BL405" for f in s["findings"])
    mem = s["memory"]
    for k in ("parameters", "gradients", "optimizer_states", "activations"):
        assert isinstance(mem[k], int) and mem[k] >= 0
    assert mem["parameters"] == 109482240 * 4 and mem["optimizer_states"] == 109482240 * 8
    assert mem["seq_len"] == 256 and "max_length" in mem["seq_len_source"]
    assert mem["assumptions"]


def test_world_size_and_seq_len_options(capsys):
    main([str(ARTICLE), "--output-format", "json", "--world-size", "4", "--seq-len", "128"])
    (s,) = json.loads(capsys.readouterr().out)["setups"]
    assert s["effective_batch"]["formula"] == "2 × 8 × 4 = 64"
    assert s["world_size"] == {"value": 4, "source": "from --world-size"}
    assert s["memory"]["seq_len"] == 128


def test_world_size_from_settings():
    rep = explain_source(ARTICLE.read_text(), str(ARTICLE), Settings(world_size=2))
    assert rep["setups"][0]["effective_batch"]["value"] == 32


def test_who_divides_on_other_versions():
    src = ARTICLE.read_text()
    rep = explain_source(src, "t.py", Settings(target_versions={"transformers": "4.57.1"}))
    ld = rep["setups"][0]["loss_division"]
    assert ld["who"] == "the Trainer" and ld["inflated"] is False
    assert not any(f["code"] == "BL405" for f in rep["findings"])
    rep = explain_source(src + "trainer.model_accepts_loss_kwargs = False\n", "t.py",
                         Settings(target_versions={"transformers": "5.24.0"}))
    assert rep["setups"][0]["loss_division"]["who"] == "the Trainer"
    rep = explain_source(src, "t.py", Settings(target_versions={"transformers": "4.44.2"}))
    assert rep["setups"][0]["checkpointing"]["reentrant"] is True


def test_memory_hook_replaces_first_order_estimate():
    register_memory_estimator(lambda setup, seq, world, versions: {"parameters": 1, "assumptions": ["plugged"]})
    try:
        rep = explain_source(ARTICLE.read_text(), str(ARTICLE))
        assert rep["setups"][0]["memory"]["parameters"] == 1
    finally:
        register_memory_estimator(None)


def test_unknown_values_and_bad_input():
    rep = explain_source("from transformers import Trainer\nTrainer(model=m, args=a)\n", "t.py")
    (s,) = rep["setups"]
    assert s["effective_batch"]["value"] is None and s["model"] is None
    text = render_text(rep)
    assert "unknown" in text
    bad = explain_source("def (:\n", "t.py")
    assert "error" in bad and "could not parse" in render_text(bad)


def test_no_setup_is_said(tmp_path, capsys):
    p = tmp_path / "x.py"
    p.write_text("print('hello')\n")
    assert main([str(p)]) == 0
    assert "no training set-up found" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.py")]) == 2


def test_hand_written_loop_is_reported_when_the_loop_analysis_exists():
    import pytest

    pytest.importorskip("bertlint.analysis.loops")
    src = '''import torch
from torch.utils.data import DataLoader
from transformers import BertConfig, BertForSequenceClassification

model = BertForSequenceClassification(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=37, vocab_size=100))
loader = DataLoader(data, batch_size=4)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
N = 4
for step, batch in enumerate(loader):
    loss = model(**batch).loss / N
    loss.backward()
    if (step + 1) % N == 0:
        optimizer.step()
        optimizer.zero_grad()
'''
    rep = explain_source(src, "loop.py", Settings())
    (lp,) = rep["loops"]
    assert lp["micro_batch"]["value"] == 4 and lp["accumulation"] == 4
    assert lp["effective_batch"]["formula"] == "4 × 4 × 1 = 16"
    assert lp["model"]["class"] == "BertForSequenceClassification"
    assert lp["memory"]["parameters"] > 0
    assert "effective batch:  4 × 4 × 1 = 16" in render_text(rep)


def test_world_size_from_the_one_launcher_config_beside_the_script(tmp_path):
    (tmp_path / "accelerate_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 4\n")
    p = tmp_path / "train.py"
    p.write_text(ARTICLE.read_text())
    (s,) = explain_source(p.read_text(), str(p), Settings())["setups"]
    assert s["effective_batch"]["formula"] == "2 × 8 × 4 = 64"
    assert "accelerate_config.yaml" in s["world_size"]["source"]
    (tmp_path / "other.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")  # ambiguous: ignored
    (s,) = explain_source(p.read_text(), str(p), Settings())["setups"]
    assert s["world_size"]["value"] is None


def test_scheduler_length_in_micro_batches_is_pointed_out():
    src = '''from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments
model = AutoModelForSequenceClassification.from_pretrained("roberta-base")
total = len(train_dataloader) * 3
sched = get_linear_schedule_with_warmup(opt, num_warmup_steps=100, num_training_steps=total)
args = TrainingArguments("o", per_device_train_batch_size=8, gradient_accumulation_steps=4)
trainer = Trainer(model=model, args=args, optimizers=(opt, sched))
'''
    (s,) = explain_source(src, "t.py", Settings())["setups"]
    assert "counts micro-batches" in s["scheduler"] and "1/4" in s["scheduler"]


def test_notebook(tmp_path, capsys):
    cells = [ARTICLE.read_text().split("args = TrainingArguments(")[0],
             "args = TrainingArguments(" + ARTICLE.read_text().split("args = TrainingArguments(")[1]]
    nb = {"cells": [{"cell_type": "code", "source": c, "metadata": {}, "outputs": [], "execution_count": None}
                    for c in cells], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    p = tmp_path / "train.ipynb"
    p.write_text(json.dumps(nb))
    assert main([str(p), "--output-format", "json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["setups"][0]["effective_batch"]["value"] == 16
    assert any(f["code"] == "BL405" for f in rep["findings"])


def test_checkpointing_from_the_command_line_is_stated_with_its_launch(capsys):
    """The flag arrives on the command line and the script checks it: explain says so (and what it would be)."""
    script = ROOT / "fixtures" / "trainer" / "v4_46" / "lora_cli_bad.py"
    assert main([str(script)]) == 0
    out = capsys.readouterr().out
    assert "checkpointing:    set on the command line (`--gradient_checkpointing`" in out
    assert "when on: reentrant" in out and "BL303" in out
