"""bertlint.analysis.configfiles: reading DeepSpeed JSON / accelerate YAML, classification, key positions, the
DeepSpeed batch rule, accelerate launcher configs, and locating the configs a script hands to a framework."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import libcst as cst
import pytest

from bertlint.analysis import configfiles as cf
from bertlint.config import Settings
from bertlint.context import FileContext

os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _ctx(tmp_path: Path, source: str, name: str = "train.py", settings=None) -> FileContext:
    p = tmp_path / name
    p.write_text(source, encoding="utf-8")
    return FileContext(str(p), source, cst.parse_module(source), settings or Settings())


# ------------------------------------------------------------------------------------------------ reading


def test_load_config_json_and_error(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text('{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}')
    data, err = cf.load_config(str(good))
    assert err is None and data["zero_optimization"]["stage"] == 2
    bad = tmp_path / "bad.json"
    bad.write_text('{"a": 1,, }')
    data, err = cf.load_config(str(bad))
    assert data is None and "invalid JSON" in err
    data, err = cf.load_config(str(tmp_path / "missing.json"))
    assert data is None and "cannot read" in err


def test_json_comments_and_trailing_commas_like_hjson(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text('{\n  // micro-batch\n  "train_micro_batch_size_per_gpu": 4, /* four */\n  "a": [1, 2,],\n}\n')
    data, err = cf.load_config(str(p))
    assert err is None
    assert data == {"train_micro_batch_size_per_gpu": 4, "a": [1, 2]}
    # a "//" inside a string is not a comment
    data, _, _ = cf.parse_text('{"path": "http://x//y", "b": 1 // c\n}', "x.json")
    assert data == {"path": "http://x//y", "b": 1}


def test_load_yaml_accelerate(tmp_path):
    p = tmp_path / "default_config.yaml"
    p.write_text("compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                 "  gradient_accumulation_steps: 4\n  zero_stage: 2\nnum_processes: 8\nmixed_precision: bf16\n")
    data, err = cf.load_config(str(p))
    assert err is None and cf.classify(data) == "accelerate"
    acc = cf.AccelerateConfig.from_data(data, str(p))
    assert acc.uses_deepspeed and acc.num_processes == 8 and acc.world_size == 8
    assert acc.gradient_accumulation_steps == 4 and acc.mixed_precision == "bf16" and acc.zero_stage == 2
    bad = tmp_path / "broken.yaml"
    bad.write_text("a: [1, 2\nb: 3\n")
    data, err = cf.load_config(str(bad))
    assert data is None and err.startswith("invalid YAML")


def test_load_document_sees_edits(tmp_path):
    p = tmp_path / "ds.json"
    p.write_text('{"train_batch_size": 8}')
    assert cf.load_document(str(p)).data == {"train_batch_size": 8}
    p.write_text('{"train_batch_size": 16, "x": 1}')  # different size -> new cache key
    assert cf.load_document(str(p)).data["train_batch_size"] == 16


def test_key_positions_json_and_yaml():
    text = '{\n  "train_batch_size": 30,\n  "zero_optimization": {\n    "stage": 2\n  }\n}\n'
    doc = cf.ConfigDoc(None, text, json.loads(text), "json")
    assert doc.key_position(("train_batch_size",)) == (2, 3)
    assert doc.key_position(("zero_optimization", "stage")) == (4, 5)
    assert doc.key_position(("zero_optimization", "missing")) == (3, 3)  # deepest enclosing key
    assert doc.key_position(("nothing",)) == (1, 1)
    ytext = "distributed_type: DEEPSPEED\ndeepspeed_config:\n  gradient_clipping: 0.0\n"
    ydoc = cf.ConfigDoc(None, ytext, None, "yaml")
    assert ydoc.key_position(("deepspeed_config", "gradient_clipping")) == (3, 3)


# --------------------------------------------------------------------------------------------- classify


@pytest.mark.parametrize(
    "data, kind",
    [
        ({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}}, "deepspeed"),
        ({"fp16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {}}, "gradient_clipping": 1.0},
         "deepspeed"),
        ({"compute_environment": "LOCAL_MACHINE", "distributed_type": "MULTI_GPU", "num_processes": 2},
         "accelerate"),
        # a project's own training config / TrainingArguments JSON is not a DeepSpeed config
        ({"train_batch_size": 32, "learning_rate": 3e-5, "epochs": 3, "model": "bert"}, "unknown"),
        ({"output_dir": "out", "per_device_train_batch_size": 8, "gradient_accumulation_steps": 4,
          "deepspeed": "ds.json", "fp16": True}, "unknown"),
        ([1, 2], "unknown"),
        (None, "unknown"),
        ({}, "unknown"),
    ],
)
def test_classify(data, kind):
    assert cf.classify(data) == kind


def test_deepspeed_model():
    ds = cf.DeepSpeedConfig.from_data({
        "train_batch_size": "auto", "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 8,
        "zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "nvme"}},
        "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 10}},
    })
    assert (ds.train_batch_size, ds.micro_batch, ds.gradient_accumulation_steps) == ("auto", 4, 8)
    assert ds.zero_stage == 3 and ds.offload_optimizer == "cpu" and ds.offload_param == "nvme"
    assert ds.bf16 is True and ds.fp16 is None and not ds.has_gradient_clipping
    assert ds.optimizer_type == "AdamW" and ds.scheduler_params == {"warmup_num_steps": 10}
    assert set(ds.auto_keys()) == {("train_batch_size",), ("optimizer", "params", "lr")}
    assert cf.DeepSpeedConfig.from_data("not a dict") is None


# ----------------------------------------------------------------------------------- batch arithmetic


def test_batch_rule_never_consistent():
    bc = cf.check_batch(30, 4, 8)
    assert bc.status == "never" and bc.consistent_world_sizes == []
    assert "4 × 8 = 32" in bc.message
    # one value derived by DeepSpeed (floor division): tb must be a multiple of the given one
    assert cf.check_batch(30, 4, None).status == "never"
    assert cf.check_batch(30, "auto", 4).status == "never"


def test_batch_rule_world_size():
    assert cf.check_batch(32, 4, 8).status == "ok"  # consistent at world size 1: no claim without a world size
    assert cf.check_batch(32, 4, 8).consistent_world_sizes == [1]
    bc = cf.check_batch(32, 4, 8, world_size=2, world_source="num_processes in x.yaml")
    assert bc.status == "mismatch" and "4 × 8 × 2 = 64" in bc.message and "world size 1" in bc.message
    assert cf.check_batch(64, 4, 8, world_size=2).status == "ok"
    bc = cf.check_batch(32, 4, None, world_size=3)
    assert bc.status == "mismatch" and bc.consistent_world_sizes == [1, 2, 4, 8]
    assert cf.check_batch(32, 4, None, world_size=4).status == "ok"


def test_batch_rule_auto_and_invalid():
    assert cf.check_batch("auto", 4, 8).status == "skip"
    assert cf.check_batch(None, 4, 8).status == "skip"
    assert cf.check_batch(32, "auto", "auto").status == "ok"
    assert cf.check_batch(0, 4, 8).status == "invalid"
    assert cf.check_batch(32, 4, -1).status == "invalid"
    assert cf.check_batch(32, 4.5, 8).status == "skip"  # not an int: say nothing


# ------------------------------------------------------------------------------------ accelerate / world


def test_accelerate_configs_near_and_world_size(tmp_path):
    (tmp_path / "accelerate_config.yaml").write_text(
        "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\nnum_processes: 4\n"
        "deepspeed_config:\n  deepspeed_config_file: ds.json\n")
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}')
    (tmp_path / "other.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")  # not a launcher name
    ctx = _ctx(tmp_path, "from accelerate import Accelerator\naccelerator = Accelerator()\n")
    cfgs = cf.accelerate_configs_for(ctx)
    assert [os.path.basename(c.path) for c in cfgs] == ["accelerate_config.yaml"]
    assert cf.accelerate_config_for(ctx) is cfgs[0]
    assert cf.launcher_world_size(ctx) == (4, "num_processes in accelerate_config.yaml")
    assert cf.deepspeed_enabled_for(ctx)[0] is True
    assert [c.path for c in cf.accelerate_configs_referencing(str(tmp_path / "ds.json"))] == [cfgs[0].path]
    # [tool.bertlint] world-size wins
    assert cf.world_size_for(Settings(world_size=16), cfgs) == (16, "[tool.bertlint] world-size")


def test_accelerate_disagreeing_configs_give_no_world_size(tmp_path):
    (tmp_path / "accelerate_ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (tmp_path / "accelerate_ds.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\n")
    ctx = _ctx(tmp_path, "import accelerate\n")
    assert cf.launcher_world_size(ctx) == (None, "")
    assert cf.accelerate_config_for(ctx) is None
    assert cf.deepspeed_enabled_for(ctx) == (None, "")  # one DDP, one DeepSpeed: the launch decides


def test_no_accelerate_config_outside_script_folder(tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".cache" / "huggingface" / "accelerate").mkdir(parents=True)
    (home / ".cache" / "huggingface" / "accelerate" / "default_config.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 8\n")
    monkeypatch.setenv("HOME", str(home))
    proj = tmp_path / "proj"
    proj.mkdir()
    ctx = _ctx(proj, "import accelerate\n")
    assert cf.accelerate_configs_for(ctx) == []
    assert cf.deepspeed_enabled_for(ctx) == (None, "")


# ------------------------------------------------------------------------------------------- versions


def test_deepspeed_version_sources(tmp_path):
    v, src = cf.deepspeed_version(None, str(tmp_path / "x.json"), Settings(target_versions={"deepspeed": "0.18.9"}))
    assert v == (0, 18, 9) and "target-versions" in src
    v, src = cf.deepspeed_version(None, str(tmp_path / "x.json"), Settings())
    assert v >= (0, 1, 0) and src  # installed or assumed; always says which


# ---------------------------------------------------------------------------------------- script side


def test_deepspeed_uses_literal_path_and_frameworks(tmp_path):
    (tmp_path / "ds.json").write_text('{"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2,'
                                      ' "zero_optimization": {"stage": 2}}')
    src = (
        "import deepspeed\n"
        "from transformers import TrainingArguments\n"
        "from accelerate import DeepSpeedPlugin\n"
        "from lightning.pytorch.strategies import DeepSpeedStrategy\n"
        "cfg = {'train_batch_size': 16, 'gradient_accumulation_steps': 4}\n"
        "args = TrainingArguments(output_dir='o', deepspeed='ds.json')\n"
        "engine, *_ = deepspeed.initialize(model=m, config=cfg)\n"
        "plugin = DeepSpeedPlugin(hf_ds_config=cfg, gradient_accumulation_steps=4)\n"
        "strategy = DeepSpeedStrategy(config={'zero_optimization': {'stage': 3}})\n"
    )
    ctx = _ctx(tmp_path, src)
    uses = cf.deepspeed_uses(ctx)
    assert [u.framework for u in uses] == ["trainer", "engine", "accelerate", "lightning"]
    tr, eng, acc, lt = uses
    assert tr.doc is not None and tr.data["gradient_accumulation_steps"] == 2 and tr.dict_node is None
    assert eng.dict_node is not None and eng.data == {"train_batch_size": 16, "gradient_accumulation_steps": 4}
    assert ("train_batch_size",) in eng.key_nodes
    assert acc.plugin_kwargs == {"gradient_accumulation_steps": 4}
    assert lt.data == {"zero_optimization": {"stage": 3}}
    assert cf.deepspeed_gas_for(ctx, "engine") == (4, "gradient_accumulation_steps in the dict literal")
    assert cf.deepspeed_gas_for(ctx, "accelerate")[0] == 4
    assert cf.deepspeed_enabled_for(ctx)[0] is True  # a DeepSpeedPlugin in the code


def test_mutated_dict_is_marked(tmp_path):
    src = ("import deepspeed\ncfg = {'train_batch_size': 30, 'train_micro_batch_size_per_gpu': 4}\n"
           "cfg['train_batch_size'] = compute()\nengine, *_ = deepspeed.initialize(model=m, config=cfg)\n")
    (u,) = cf.deepspeed_uses(_ctx(tmp_path, src))
    assert u.mutated


def test_unknown_inputs_do_not_raise(tmp_path):
    src = ("import deepspeed\nfrom transformers import TrainingArguments\n"
           "a = TrainingArguments(deepspeed=args.ds)\n"
           "b = TrainingArguments(deepspeed='missing.json')\n"
           "deepspeed.initialize(model=m, config=make())\n")
    uses = cf.deepspeed_uses(_ctx(tmp_path, src))
    assert all(u.data is None for u in uses)


def test_lint_path_never_imports_frameworks(tmp_path):
    """The lint path reads configs without importing torch / transformers / accelerate / deepspeed."""
    import subprocess

    (tmp_path / "ds.json").write_text('{"train_batch_size": 30, "train_micro_batch_size_per_gpu": 4, '
                                      '"gradient_accumulation_steps": 8, "zero_optimization": {"stage": 2}}')
    (tmp_path / "t.py").write_text("from transformers import TrainingArguments\n"
                                   "a = TrainingArguments(output_dir='o', deepspeed='ds.json')\n")
    code = ("import sys\nfrom bertlint.api import lint_path\n"
            f"lint_path({str(tmp_path / 'ds.json')!r}); lint_path({str(tmp_path / 't.py')!r})\n"
            "bad = [m for m in ('torch', 'transformers', 'accelerate', 'deepspeed', 'lightning') if m in sys.modules]\n"
            "print(bad)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


ODD_CONFIGS = [
    "{}", "[]", "null", "3", '"text"', '{"train_batch_size": null}', '{"train_batch_size": "30"}',
    '{"train_batch_size": true, "train_micro_batch_size_per_gpu": 4, "zero_optimization": 2}',
    '{"zero_optimization": [], "fp16": "yes", "optimizer": 1, "scheduler": {"params": 3}}',
    '{"train_batch_size": 1e400, "train_micro_batch_size_per_gpu": 4, "zero_optimization": {}}',
    '{"train_batch_size": 99999999999999999999, "train_micro_batch_size_per_gpu": 7, "zero_optimization": {}}',
]
ODD_YAML = ["", "- a\n- b\n", "distributed_type: [1, 2]\ndeepspeed_config: 3\n",
            "{1: 2, distributed_type: DEEPSPEED, deepspeed_config: {gradient_clipping: .nan}}\n",
            "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n  gradient_clipping: '0'\n"]
ODD_SCRIPTS = [
    "import deepspeed\ndeepspeed.initialize(config=None)\n",
    "import deepspeed\ndeepspeed.initialize(model=m, config={**base, 'train_batch_size': 3})\n",
    "import deepspeed\ndeepspeed.initialize(model=m, config={k: 1 for k in ks})\n",
    "from transformers import TrainingArguments\nTrainingArguments(deepspeed=True)\n",
    "from transformers import TrainingArguments\nTrainingArguments(deepspeed={1: 2, 'train_batch_size': 'x'})\n",
    "from accelerate import DeepSpeedPlugin\nDeepSpeedPlugin('nope.json', gradient_clipping=0)\n",
    "import lightning as L\nclass M(L.LightningModule):\n    automatic_optimization = False\nL.Trainer(accumulate_grad_batches={0: 8, 4: 2}).fit(M())\n",
    "import lightning as L\nfrom lightning.pytorch.strategies import DeepSpeedStrategy\n"
    "L.Trainer(strategy=DeepSpeedStrategy(config='/nonexistent/ds.json'))\n",
]


def test_odd_inputs_never_raise(tmp_path, monkeypatch):
    from bertlint import engine
    from bertlint.api import lint_path as lp

    def boom(code, filename, exc):
        raise exc

    monkeypatch.setattr(engine, "on_internal_error", boom)
    sel = Settings(select=["BL402", "BL403", "BL408", "BL411"])
    for i, text in enumerate(ODD_CONFIGS):
        p = tmp_path / f"c{i}.json"
        p.write_text(text)
        lp(str(p), sel)
    for i, text in enumerate(ODD_YAML):
        p = tmp_path / f"accelerate_c{i}.yaml"
        p.write_text(text)
        lp(str(p), sel)
    for i, text in enumerate(ODD_SCRIPTS):
        p = tmp_path / f"s{i}.py"
        p.write_text(text)
        lp(str(p), sel)


def test_launcher_accumulation_for(tmp_path):
    (tmp_path / "accelerate_config.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 2\ndeepspeed_config:\n  gradient_accumulation_steps: 4\n")
    ctx = _ctx(tmp_path, "from accelerate import Accelerator\naccelerator = Accelerator()\n")
    n, src = cf.launcher_accumulation_for(ctx)
    assert n == 4 and "accelerate_config.yaml" in src
    # a config file named by the YAML
    d2 = tmp_path / "b"
    d2.mkdir()
    (d2 / "default_config.yaml").write_text(
        "distributed_type: DEEPSPEED\ndeepspeed_config:\n  deepspeed_config_file: ds.json\n")
    (d2 / "ds.json").write_text('{"gradient_accumulation_steps": 8, "zero_optimization": {"stage": 2}}')
    assert cf.launcher_accumulation_for(_ctx(d2, "import accelerate\n"))[0] == 8
    # DDP launcher configs inject nothing; mixed configs: unknown
    d3 = tmp_path / "c"
    d3.mkdir()
    (d3 / "accelerate_ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    assert cf.launcher_accumulation_for(_ctx(d3, "import accelerate\n")) == (None, "")


# ------------------------------------------------------------------- which launcher config launches a script


def test_several_launcher_configs_only_the_named_one_counts(tmp_path):
    (tmp_path / "accelerate_ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (tmp_path / "accelerate_ds.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  gradient_accumulation_steps: 4\n")
    (tmp_path / "accelerate_ds2.yaml").write_text(
        "distributed_type: DEEPSPEED\nnum_processes: 8\ndeepspeed_config:\n  gradient_accumulation_steps: 4\n")
    # the two DeepSpeed configs agree, but nothing says either launches this script
    plain = _ctx(tmp_path, "import accelerate\n")
    assert cf.accelerate_configs_for(plain) == []
    assert cf.deepspeed_enabled_for(plain) == (None, "")
    assert cf.launcher_accumulation_for(plain) == (None, "")
    named = _ctx(tmp_path, "# accelerate launch --config_file accelerate_ds.yaml train.py\nimport accelerate\n")
    assert [os.path.basename(c.path) for c in cf.accelerate_configs_for(named)] == ["accelerate_ds.yaml"]
    assert cf.launcher_world_size(named) == (8, "num_processes in accelerate_ds.yaml")
    assert cf.launcher_accumulation_for(named)[0] == 4


def test_a_shell_script_that_launches_the_script_names_its_config(tmp_path):
    (tmp_path / "accelerate_ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    (tmp_path / "accelerate_ds.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 8\n")
    (tmp_path / "run_other.sh").write_text("accelerate launch --config_file accelerate_ds.yaml other.py\n")
    ctx = _ctx(tmp_path, "import accelerate\n")
    assert cf.accelerate_configs_for(ctx) == []  # the shell script launches another script
    (tmp_path / "run.sh").write_text("accelerate launch --config_file accelerate_ddp.yaml train.py --lr 1e-5\n")
    ctx = _ctx(tmp_path, "import accelerate\n")
    assert [os.path.basename(c.path) for c in cf.accelerate_configs_for(ctx)] == ["accelerate_ddp.yaml"]
    assert cf.deepspeed_enabled_for(ctx)[0] is False


def test_the_repository_single_launcher_config_counts_for_a_script_in_a_subfolder(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "accelerate_ds.yaml").write_text("distributed_type: DEEPSPEED\nnum_processes: 4\n")
    sub = tmp_path / "scripts"
    sub.mkdir()
    ctx = _ctx(sub, "import accelerate\n")
    assert cf.launcher_world_size(ctx) == (4, "num_processes in accelerate_ds.yaml")
    (tmp_path / "configs" / "accelerate_fsdp.yaml").write_text("distributed_type: FSDP\nnum_processes: 2\n")
    ctx = _ctx(sub, "import accelerate\n")
    assert cf.accelerate_configs_for(ctx) == []  # two at the root, none named: unknown


def test_a_script_that_expects_deepspeed_is_judged_when_launched_with_it(tmp_path):
    src = ("from accelerate import Accelerator\nfrom accelerate.utils import DummyOptim\n"
           "accelerator = Accelerator()\nopt = DummyOptim(model.parameters(), lr=1e-4)\n")
    ctx = _ctx(tmp_path, src)
    on, why = cf.deepspeed_enabled_for(ctx)
    # the line number is resolved when a diagnostic shows the text (no positions for a file without findings)
    why = ctx.resolve_rows(why)
    assert on is True and why.startswith("when launched with DeepSpeed") and "DummyOptim" in why and "line 4" in why
    src = ("from accelerate import Accelerator\naccelerator = Accelerator()\n"
           "if accelerator.state.deepspeed_plugin is not None:\n    pass\n")
    on, why = cf.deepspeed_enabled_for(_ctx(tmp_path, src))
    assert on is True and "accelerator.state.deepspeed_plugin" in why
    plain = _ctx(tmp_path, "from accelerate import Accelerator\naccelerator = Accelerator()\n")
    assert cf.deepspeed_enabled_for(plain) == (None, "")
    # a launcher config that says otherwise wins
    (tmp_path / "accelerate_ddp.yaml").write_text("distributed_type: MULTI_GPU\nnum_processes: 2\n")
    ctx = _ctx(tmp_path, "from accelerate import Accelerator\nfrom accelerate.utils import DummyOptim\nDummyOptim([])\n")
    assert cf.deepspeed_enabled_for(ctx)[0] is False
