"""BL402, BL403, BL411 on the fixtures (fixtures/deepspeed, fixtures/accelerate_config) and on focused cases:
"auto" is never a mismatch, a world size unknown statically is never claimed, version gating, the fixes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bertlint.api import apply_fixes, lint_path, lint_text
from bertlint.config import Settings, clear_caches, load_settings

os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
MINE = {"BL402", "BL403", "BL411"}


def _fixtures(*areas):
    out = []
    for area in areas:
        for p in sorted((ROOT / "fixtures" / area).glob("*")):
            if p.name.endswith(".expect.json") or p.suffix not in (".py", ".json", ".yaml", ".yml"):
                continue
            out.append(pytest.param(p, id=f"{area}/{p.name}"))
    return out


def _expect_path(p: Path) -> Path:
    return p.with_name(p.name.rsplit(".", 1)[0] + ".expect.json")


@pytest.mark.parametrize("path", _fixtures("deepspeed", "accelerate_config"))
def test_fixture(path: Path):
    exp = json.loads(_expect_path(path).read_text())
    clear_caches()
    diags = lint_path(str(path), load_settings(str(path)))
    got = sorted((d.code, d.start.row) for d in diags if d.code in MINE)
    want = sorted((f["code"], f["line"]) for f in exp["findings"] if f["code"] in MINE)
    assert got == want, "\n".join(f"{d.code}:{d.start.row}: {d.message}" for d in diags)
    assert not [d for d in diags if d.code == "BL001"]


def _lint(tmp_path: Path, files: dict, target: str, settings: Settings | None = None):
    for name, text in files.items():
        p = tmp_path / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    clear_caches()
    path = tmp_path / target
    s = settings or load_settings(str(path))
    return [d for d in lint_path(str(path), s) if d.code in MINE]


TRIPLE = '{{"train_batch_size": {tb}, "train_micro_batch_size_per_gpu": {mb}, "gradient_accumulation_steps": {ga},' \
         ' "gradient_clipping": 1.0, "zero_optimization": {{"stage": 2}}}}'


# ------------------------------------------------------------------------------------------------ BL402


def test_bl402_message_has_arithmetic(tmp_path):
    (d,) = _lint(tmp_path, {"ds.json": TRIPLE.format(tb=30, mb=4, ga=8)}, "ds.json")
    assert d.code == "BL402" and d.severity.value == "E"
    assert "4 × 8 = 32" in d.message and "no world size" in d.message and "train_batch_size" in d.message


def test_bl402_world_size_from_settings_names_consistent_sizes(tmp_path):
    files = {"pyproject.toml": "[tool.bertlint]\nworld-size = 4\n", "ds.json": TRIPLE.format(tb=64, mb=4, ga=8)}
    (d,) = _lint(tmp_path, files, "ds.json")
    assert "4 × 8 × 4 = 128" in d.message and "world size 2" in d.message
    assert "[tool.bertlint] world-size" in d.message
    files["pyproject.toml"] = "[tool.bertlint]\nworld-size = 2\n"
    assert _lint(tmp_path, files, "ds.json") == []


def test_bl402_derived_value_lists_world_sizes(tmp_path):
    files = {"pyproject.toml": "[tool.bertlint]\nworld-size = 3\n",
             "ds.json": '{"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0,'
                        ' "zero_optimization": {"stage": 1}}'}
    (d,) = _lint(tmp_path, files, "ds.json")
    assert "Consistent world sizes: 1, 2, 4, 8" in d.message


@pytest.mark.parametrize("text", [
    TRIPLE.format(tb=32, mb=4, ga=8),  # consistent at world size 1
    TRIPLE.format(tb=64, mb=4, ga=8),  # consistent at world size 2 (unknown statically: no claim)
    TRIPLE.format(tb='"auto"', mb='"auto"', ga='"auto"'),
    TRIPLE.format(tb='"auto"', mb=4, ga=8),
    '{"train_micro_batch_size_per_gpu": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": 0}}',
])
def test_bl402_silent(tmp_path, text):
    assert _lint(tmp_path, {"ds.json": text}, "ds.json") == []


def test_bl402_not_on_a_non_deepspeed_json(tmp_path):
    text = '{"train_batch_size": 30, "learning_rate": 3e-5, "epochs": 3, "model_name": "bert-base-uncased"}'
    assert _lint(tmp_path, {"train_config.json": text}, "train_config.json") == []


def test_bl402_script_mutated_dict_is_silent(tmp_path):
    src = ("import deepspeed\nDS = {'train_batch_size': 30, 'train_micro_batch_size_per_gpu': 4,"
           " 'gradient_accumulation_steps': 8, 'gradient_clipping': 1.0}\n"
           "DS['train_batch_size'] = 4 * 8 * world\n"
           "engine, *_ = deepspeed.initialize(model=m, config=DS)\n")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []


def test_bl402_script_file_reference_reported_in_file_only(tmp_path):
    files = {"ds.json": TRIPLE.format(tb=30, mb=4, ga=8),
             "t.py": "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, config='ds.json')\n"}
    assert _lint(tmp_path, files, "t.py") == []
    assert [d.code for d in _lint(tmp_path, files, "ds.json")] == ["BL402"]


# ------------------------------------------------------------------------------------------------ BL403


def _args(extra: str, ds: str) -> str:
    return ("from transformers import TrainingArguments\n"
            f"args = TrainingArguments(output_dir='o', {extra}deepspeed={ds})\n")


def test_bl403_auto_is_never_a_mismatch(tmp_path):
    ds = ('{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",'
          ' "gradient_clipping": "auto", "fp16": {"enabled": "auto"}, "bf16": {"enabled": "auto"},'
          ' "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto",'
          ' "weight_decay": "auto"}}, "scheduler": {"type": "WarmupLR", "params": {"warmup_max_lr": "auto"}},'
          ' "zero_optimization": {"stage": 2}}')
    src = _args("per_device_train_batch_size=2, gradient_accumulation_steps=8, fp16=True, learning_rate=1e-4, ",
                "'ds.json'")
    assert _lint(tmp_path, {"ds.json": ds, "t.py": src}, "t.py") == []


def test_bl403_each_mismatch_named_with_both_values(tmp_path):
    ds = ('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2, "gradient_clipping": 0.5,'
          ' "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.98], "eps": 1e-6,'
          ' "weight_decay": 0.01}}, "fp16": {"enabled": true}, "zero_optimization": {"stage": 2}}')
    src = _args("per_device_train_batch_size=8, gradient_accumulation_steps=4, learning_rate=2e-5, ", "'ds.json'")
    diags = _lint(tmp_path, {"ds.json": ds, "t.py": src}, "t.py")
    keys = sorted(d.data["key"] for d in diags)
    assert keys == ["fp16.enabled", "gradient_accumulation_steps", "gradient_clipping", "optimizer.params.betas",
                    "optimizer.params.eps", "optimizer.params.lr", "optimizer.params.weight_decay",
                    "train_micro_batch_size_per_gpu"]
    micro = next(d for d in diags if d.data["key"] == "train_micro_batch_size_per_gpu")
    assert "=4" in micro.message and "per_device_train_batch_size`=8" in micro.message
    assert "ds.json:1" in micro.message and '"auto"' in micro.message
    assert all(d.start.row == 2 for d in diags)


def test_bl403_train_batch_size_needs_world_size(tmp_path):
    src = _args("per_device_train_batch_size=8, gradient_accumulation_steps=4, ",
                "{'train_batch_size': 64, 'gradient_clipping': 1.0}")
    # 64 = 2 × 8 × 4: right on exactly 2 GPUs, wrong on any other launch (one GPU included): fragile, a warning
    (d,) = _lint(tmp_path, {"t.py": src}, "t.py")
    assert d.severity.value == "W" and "only on exactly 2 GPUs" in d.message
    src = _args("per_device_train_batch_size=8, gradient_accumulation_steps=4, ",
                "{'train_batch_size': 48, 'gradient_clipping': 1.0}")
    (d,) = _lint(tmp_path, {"t.py": src}, "t.py")
    assert "8 × 4 = 32" in d.message and "every world size" in d.message
    files = {"pyproject.toml": "[tool.bertlint]\nworld-size = 4\n",
             "t.py": _args("per_device_train_batch_size=8, gradient_accumulation_steps=4, ",
                           "{'train_batch_size': 64, 'gradient_clipping': 1.0}")}
    (d,) = _lint(tmp_path, files, "t.py")
    assert d.data["hf_value"] == 128


def test_bl403_command_line_values_not_compared(tmp_path):
    src = ("import argparse\nfrom transformers import TrainingArguments\n"
           "p = argparse.ArgumentParser()\np.add_argument('--bs', type=int, default=16)\na = p.parse_args()\n"
           "bs = a.bs\n"
           "args = TrainingArguments(output_dir='o', per_device_train_batch_size=bs,"
           " deepspeed={'train_micro_batch_size_per_gpu': 4, 'gradient_clipping': 1.0})\n")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []


def test_bl403_auto_find_batch_size_skips_batch_values(tmp_path):
    src = _args("per_device_train_batch_size=8, auto_find_batch_size=True, ",
                "{'train_micro_batch_size_per_gpu': 4, 'gradient_clipping': 1.0}")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []


def test_bl403_open_ended_kwargs_use_no_defaults(tmp_path):
    src = ("from transformers import TrainingArguments\n"
           "args = TrainingArguments(output_dir='o', **load_cfg(), deepspeed={'gradient_accumulation_steps': 4, 'gradient_clipping': 1.0})\n")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []


def test_bl403_unsafe_fix_sets_auto(tmp_path):
    src = ("from transformers import TrainingArguments\n"
           "DS = {\n    'gradient_accumulation_steps': 2,\n    'gradient_clipping': 1.0,\n}\n"
           "args = TrainingArguments(output_dir='o', gradient_accumulation_steps=4, deepspeed=DS)\n")
    (d,) = _lint(tmp_path, {"t.py": src}, "t.py")
    assert d.start.row == 3 and d.fix is not None and d.fix.applicability.value == "unsafe"
    fixed = apply_fixes(src, [d], unsafe=True).text
    assert "'gradient_accumulation_steps': \"auto\"," in fixed
    assert _lint(tmp_path, {"t.py": fixed}, "t.py") == []


# ------------------------------------------------------------------------------------------------ BL411


def test_bl411_version_gating(tmp_path):
    ds = '{\n  "train_micro_batch_size_per_gpu": 8,\n  "zero_optimization": {"stage": 2}\n}\n'
    (d,) = _lint(tmp_path, {"ds.json": ds}, "ds.json",
                 Settings(target_versions={"deepspeed": "0.19.3"}))
    assert d.severity.value == "I" and "deepspeed 0.19.3 ([tool.bertlint] target-versions)" in d.message
    assert _lint(tmp_path, {"ds.json": ds}, "ds.json", Settings(target_versions={"deepspeed": "0.19.2"})) == []


def test_bl411_pin_near_file_is_used(tmp_path):
    ds = '{"train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": 2}}'
    files = {".git/HEAD": "ref: refs/heads/main\n", "requirements.txt": "deepspeed==0.18.9\n", "ds.json": ds}
    assert _lint(tmp_path / "old", files, "ds.json") == []
    files["requirements.txt"] = "deepspeed==0.19.8\n"
    (d,) = _lint(tmp_path / "new", files, "ds.json")
    assert "requirements.txt" in d.message


def test_bl411_safe_fix_keeps_valid_json(tmp_path):
    ds = '{\n    "train_micro_batch_size_per_gpu": 8,\n    "zero_optimization": {"stage": 2}\n}\n'
    (d,) = _lint(tmp_path, {"ds.json": ds}, "ds.json", Settings(target_versions={"deepspeed": "0.19.8"}))
    assert d.fix is not None and d.fix.applicability.value == "safe"
    fixed = apply_fixes(ds, [d]).text
    data = json.loads(fixed)
    assert data["gradient_clipping"] == 1.0 and data["train_micro_batch_size_per_gpu"] == 8
    assert '\n    "gradient_clipping": 1.0,\n' in fixed
    assert lint_text(fixed, str(tmp_path / "ds.json"), Settings(select=["BL411"])) == []


def test_bl411_not_for_lightning_strategy_dicts(tmp_path):
    src = ("from lightning.pytorch.strategies import DeepSpeedStrategy\n"
           "s = DeepSpeedStrategy(config={'zero_optimization': {'stage': 2}, 'train_micro_batch_size_per_gpu': 4})\n")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []
    src2 = "import deepspeed\ne, *_ = deepspeed.initialize(model=m, config={'train_micro_batch_size_per_gpu': 4})\n"
    (d,) = _lint(tmp_path, {"t.py": src2}, "t.py")
    assert d.code == "BL411" and d.start.row == 2


def test_bl411_accelerate_plugin_with_config_not_warned(tmp_path):
    src = ("from accelerate import DeepSpeedPlugin\n"
           "p = DeepSpeedPlugin(hf_ds_config='ds.json', gradient_clipping=0.0)\n")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []


def test_bl411_accelerate_yaml_with_config_file_not_warned(tmp_path):
    y = ("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
         "  deepspeed_config_file: ds.json\n  gradient_clipping: 0.0\nnum_processes: 2\n")
    assert _lint(tmp_path, {"accelerate_config.yaml": y}, "accelerate_config.yaml") == []


def test_bl402_engine_script_ignores_accelerate_launcher_config(tmp_path):
    files = {"accelerate_config.yaml": "distributed_type: DEEPSPEED\nnum_processes: 2\n",
             "t.py": "import deepspeed\nDS = {'train_batch_size': 32, 'train_micro_batch_size_per_gpu': 4,"
                     " 'gradient_accumulation_steps': 8, 'gradient_clipping': 1.0}\n"
                     "engine, *_ = deepspeed.initialize(model=m, config=DS)\n"}
    assert _lint(tmp_path, files, "t.py") == []  # consistent at world size 1; the `deepspeed` launcher decides
    files["t.py"] = files["t.py"].replace("deepspeed.initialize(model=m, config=DS)",
                                          "None\nfrom accelerate import DeepSpeedPlugin\n"
                                          "p = DeepSpeedPlugin(hf_ds_config=DS)")
    (d,) = _lint(tmp_path, files, "t.py")
    assert "4 × 8 × 2 = 64" in d.message


def test_bl402_model_parallel_drops_the_world_size(tmp_path):
    files = {"pyproject.toml": "[tool.bertlint]\nworld-size = 8\n",
             "ds.json": '{"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 4,'
                        ' "gradient_clipping": 1.0, "pipeline": {"stages": 2}, "zero_optimization": {"stage": 1}}'}
    assert _lint(tmp_path, files, "ds.json") == []  # 64 = 4 × 4 × 4 data-parallel ranks (8 GPUs / 2 stages)
    files["ds.json"] = files["ds.json"].replace('"train_batch_size": 64', '"train_batch_size": 30')
    assert [d.code for d in _lint(tmp_path, files, "ds.json")] == ["BL402"]  # no world size fits anyway


def test_command_line_values_in_ds_dict_are_not_used(tmp_path):
    src = ("import argparse\nimport deepspeed\nfrom transformers import TrainingArguments\n"
           "p = argparse.ArgumentParser()\np.add_argument('--tb', type=int, default=30)\n"
           "p.add_argument('--lr', type=float, default=1e-3)\nargs = p.parse_args()\n"
           "DS = {'train_batch_size': args.tb, 'train_micro_batch_size_per_gpu': 4, 'gradient_accumulation_steps': 8,"
           " 'gradient_clipping': 1.0, 'optimizer': {'type': 'AdamW', 'params': {'lr': args.lr}}}\n"
           "engine, *_ = deepspeed.initialize(model=m, config=DS)\n"
           "targs = TrainingArguments(output_dir='o', per_device_train_batch_size=4, gradient_accumulation_steps=8,"
           " learning_rate=2e-5, deepspeed=DS)\n")
    assert _lint(tmp_path, {"t.py": src}, "t.py") == []
    # module constants are fixed in the source: used
    src2 = ("import deepspeed\nTB = 30\nMB = 4\n"
            "DS = {'train_batch_size': TB, 'train_micro_batch_size_per_gpu': MB, 'gradient_accumulation_steps': TB // MB,"
            " 'gradient_clipping': 1.0}\nengine, *_ = deepspeed.initialize(model=m, config=DS)\n")
    (d,) = _lint(tmp_path, {"t.py": src2}, "t.py")
    assert d.code == "BL402" and "4 × 7 = 28" in d.message
