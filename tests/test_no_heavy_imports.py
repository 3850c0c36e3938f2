"""The lint path never imports torch, transformers, accelerate (or deepspeed / lightning): `bertlint FILE` runs
in a fresh interpreter over scripts, notebooks and configuration files that use all of them, with every rule
enabled and every output format, and sys.modules is inspected at the end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "accelerate", "deepspeed", "lightning", "pytorch_lightning", "numpy", "pygls")

SCRIPT = '''
import torch
import transformers
from accelerate import Accelerator
from transformers import Trainer, TrainingArguments, AutoModelForSequenceClassification
import deepspeed

accelerator = Accelerator(gradient_accumulation_steps=4)
model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
args = TrainingArguments("out", per_device_train_batch_size=8, gradient_accumulation_steps=4, fp16=True, bf16=True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
scaler = torch.cuda.amp.GradScaler()
accum = 4
for i, batch in enumerate(loader):
    with torch.cuda.amp.autocast():
        loss = model(**batch).loss / accum
    scaler.scale(loss).backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    total = total + loss
'''

CHECK = """
import json, sys
from bertlint.cli import main
paths = sys.argv[1:]
# --jobs 1: everything in this interpreter (worker processes would hide their imports from this check)
main(["--select", "ALL", "--jobs", "1", "--output-format", "json", *paths])
for fmt in ("full", "sarif", "github", "junit"):
    main(["--select", "ALL", "--jobs", "1", "--output-format", fmt, "-q", paths[0]])
main(["rules"])
main(["rule", "BL001"])
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
sys.stdout = sys.__stdout__
print("HEAVY=" + json.dumps(heavy))
"""


def test_lint_path_imports_no_heavy_framework(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    nb = {"cells": [{"cell_type": "code", "source": SCRIPT.splitlines(keepends=True)}], "metadata": {}}
    (tmp_path / "nb.ipynb").write_text(json.dumps(nb))
    (tmp_path / "ds_config.json").write_text(
        json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 4,
                    "fp16": {"enabled": True}, "bf16": {"enabled": True}, "zero_optimization": {"stage": 3}})
    )
    (tmp_path / "accelerate.yaml").write_text("distributed_type: DEEPSPEED\nmixed_precision: fp16\nnum_processes: 2\n")
    paths = [str(tmp_path)]
    for extra in ("fixtures", "benchmarks/data"):
        if (ROOT / extra).is_dir():
            paths.append(str(ROOT / extra))
    env = {**os.environ, "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"}
    p = subprocess.run(
        [sys.executable, "-c", CHECK % (HEAVY,), *paths], capture_output=True, text=True, env=env, timeout=300
    )
    assert "Traceback" not in p.stderr, p.stderr[-3000:]
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("HEAVY=")]
    assert line, p.stdout[-2000:] + p.stderr[-2000:]
    assert json.loads(line[-1][len("HEAVY="):]) == []
    assert "BL001" in p.stdout  # the run really linted (rule page printed / parse errors in fixtures)
