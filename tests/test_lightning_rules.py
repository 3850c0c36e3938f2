"""BL408 on the Lightning fixtures and focused cases: manual optimization vs accumulate_grad_batches /
gradient_clip_val, module/Trainer linking through fit(), command-line values, DeepSpeedStrategy config."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bertlint.api import lint_path
from bertlint.config import Settings, clear_caches, load_settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("path", [pytest.param(p, id=p.name) for p in sorted((ROOT / "fixtures" / "lightning").glob("*.py"))])
def test_fixture(path: Path):
    exp = json.loads(path.with_name(path.stem + ".expect.json").read_text())
    clear_caches()
    diags = lint_path(str(path), load_settings(str(path)))
    got = sorted((d.code, d.start.row) for d in diags if d.code == "BL408")
    want = sorted((f["code"], f["line"]) for f in exp["findings"] if f["code"] == "BL408")
    assert got == want, "\n".join(f"{d.code}:{d.start.row}: {d.message}" for d in diags)


def _lint(tmp_path: Path, src: str, settings: Settings | None = None, name: str = "train.py", extra: dict = None):
    for n, text in (extra or {}).items():
        (tmp_path / n).write_text(text)
    p = tmp_path / name
    p.write_text(src)
    clear_caches()
    return [d for d in lint_path(str(p), settings or Settings(select=["BL408"])) if d.code == "BL408"]


MANUAL = '''
import lightning as L
import torch


class Base(L.LightningModule):
    pass


class M(Base):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False

    def training_step(self, batch, batch_idx):
        opt = self.optimizers()
        self.manual_backward(batch.sum())
        opt.step()
        opt.zero_grad()


class Auto(L.LightningModule):
    def training_step(self, batch, batch_idx):
        return batch.sum()
'''


def test_manual_accumulate_linked_through_fit(tmp_path):
    src = MANUAL + "\nm = M()\ntrainer = L.Trainer(accumulate_grad_batches=2)\ntrainer.fit(m)\n"
    (d,) = _lint(tmp_path, src)
    assert d.severity.value == "E"
    assert "accumulate_grad_batches=2" in d.message and "MisconfigurationException" in d.message
    assert "`M`" in d.message and "lightning 2.6.6" in d.message
    assert src.splitlines()[d.start.row - 1].startswith("trainer = L.Trainer(")


def test_automatic_module_with_accumulate_is_fine(tmp_path):
    src = MANUAL + "\ntrainer = L.Trainer(accumulate_grad_batches=2, gradient_clip_val=0.5)\ntrainer.fit(Auto())\n"
    assert _lint(tmp_path, src) == []


def test_trainer_fitting_another_module_is_not_linked(tmp_path):
    src = MANUAL + ("\nt1 = L.Trainer(accumulate_grad_batches=4)\nt1.fit(Auto())\n"
                    "t2 = L.Trainer()\nt2.fit(M.load_from_checkpoint('x.ckpt'))\n")
    assert _lint(tmp_path, src) == []


def test_clip_zero_or_none_is_fine(tmp_path):
    for val in ("0", "0.0", "None"):
        src = MANUAL + f"\ntrainer = L.Trainer(gradient_clip_val={val})\ntrainer.fit(M())\n"
        assert _lint(tmp_path, src) == [], val


def test_property_switch_and_pytorch_lightning_import(tmp_path):
    src = '''
import pytorch_lightning as pl


class P(pl.LightningModule):
    @property
    def automatic_optimization(self) -> bool:
        return False


trainer = pl.Trainer(gradient_clip_val=1.0)
trainer.fit(P())
'''
    (d,) = _lint(tmp_path, src)
    assert "gradient_clip_val=1.0" in d.message and "clip_gradients" in d.message


def test_lightning_version_in_message(tmp_path):
    src = MANUAL + "\ntrainer = L.Trainer(accumulate_grad_batches=2)\ntrainer.fit(M())\n"
    (d,) = _lint(tmp_path, src, Settings(select=["BL408"], target_versions={"lightning": "2.4.0"}))
    assert "lightning 2.4.0 ([tool.bertlint] target-versions)" in d.message


def test_non_lightning_trainer_is_ignored(tmp_path):
    src = '''
from transformers import Trainer
import lightning as L


class M(L.LightningModule):
    automatic_optimization = False


trainer = Trainer(model=None, accumulate_grad_batches=4)
trainer.fit(M())
'''
    assert _lint(tmp_path, src) == []


def test_deepspeed_strategy_config_file(tmp_path):
    src = ("import lightning as L\nfrom lightning.pytorch.strategies import DeepSpeedStrategy\n"
           "trainer = L.Trainer(strategy=DeepSpeedStrategy(config='ds.json'), accumulate_grad_batches=2)\n")
    ds = '{\n  "zero_optimization": {"stage": 2},\n  "gradient_accumulation_steps": "auto"\n}\n'
    (d,) = _lint(tmp_path, src, extra={"ds.json": ds})
    assert d.start.row == 3 and "ds.json:3" in d.message and "Do not set" in d.message
    ok = '{\n  "zero_optimization": {"stage": 2}\n}\n'
    assert _lint(tmp_path, src, extra={"ds.json": ok}) == []


def test_deepspeed_config_for_other_frameworks_not_bl408(tmp_path):
    src = ("import deepspeed\n"
           "cfg = {'gradient_accumulation_steps': 4, 'train_micro_batch_size_per_gpu': 2, 'gradient_clipping': 1.0}\n"
           "engine, *_ = deepspeed.initialize(model=m, config=cfg)\n")
    assert _lint(tmp_path, src) == []


def test_fit_with_unresolved_model_is_not_guessed(tmp_path):
    src = MANUAL.replace("class Auto(L.LightningModule):\n    def training_step(self, batch, batch_idx):\n"
                         "        return batch.sum()\n", "")
    src = src.replace("class Base(L.LightningModule):\n    pass\n\n\nclass M(Base):", "class M(L.LightningModule):")
    bad = src + "\ntrainer = L.Trainer(accumulate_grad_batches=4)\ntrainer.fit(build_model())\n"
    assert _lint(tmp_path, bad) == []
    # no fit() in the file: the one module and the one Trainer are taken together
    alone = src + "\ndef make_trainer():\n    return L.Trainer(accumulate_grad_batches=4)\n"
    assert len(_lint(tmp_path, alone)) == 1


def test_fabric_deepspeed_strategy_not_reported(tmp_path):
    src = ("from lightning.fabric import Fabric\nfrom lightning.fabric.strategies import DeepSpeedStrategy\n"
           "fabric = Fabric(strategy=DeepSpeedStrategy(config={'gradient_accumulation_steps': 4,"
           " 'zero_optimization': {'stage': 2}}))\n")
    assert _lint(tmp_path, src) == []


def test_conditional_manual_optimization_is_not_certain(tmp_path):
    src = '''
import lightning as L


class M(L.LightningModule):
    def __init__(self, sam=False):
        super().__init__()
        if sam:
            self.automatic_optimization = False


class N(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.automatic_optimization = True


t = L.Trainer(accumulate_grad_batches=4)
t.fit(M(sam=True))
t.fit(N())
'''
    assert _lint(tmp_path, src) == []
