"""Trainer rules: fixtures (complete expected findings), version matrices, don't-flag look-alikes, fixes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertlint.api import apply_fixes, lint_path
from bertlint.config import Settings, clear_caches
from bertlint.engine import lint_python

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures" / "trainer"


def _fixture_cases():
    return [pytest.param(p, id=str(p.relative_to(FIXTURES))) for p in sorted(FIXTURES.rglob("*.py"))]


@pytest.mark.parametrize("path", _fixture_cases())
def test_fixture_findings_are_exactly_the_expected_ones(path: Path):
    expect = json.loads(path.with_suffix(".expect.json").read_text())
    clear_caches()
    got = sorted((d.code, d.start.row) for d in lint_path(str(path)))
    want = sorted((f["code"], f["line"]) for f in expect["findings"])
    assert got == want, f"{path.name}: {expect['notes']}"
    for name in expect.get("files", []):
        assert (path.parent / name).is_file()


def lint(src: str, transformers: str | None = "5.24.0", select=None, **settings) -> list:
    tv = {"transformers": transformers} if transformers else {}
    s = Settings(target_versions=tv, select=select, **settings)
    return lint_python(src, "/nonexistent/train.py", s)


def codes(src: str, transformers: str | None = "5.24.0", code: str | None = None) -> list:
    return [(d.code, d.start.row) for d in lint(src, transformers) if code is None or d.code == code]


ARTICLE = (FIXTURES / "article_bad.py").read_text()


# ---------------------------------------------------------------------------------------------- BL405


@pytest.mark.parametrize("version,flagged", [
    ("4.45.2", False), ("4.46.0", True), ("4.46.3", True), ("4.47.1", True), ("4.48.0", False),
    ("4.55.0", False), ("4.57.1", False), ("5.0.0", True), ("5.12.0", True), ("5.19.0", True), ("5.24.0", True),
])
def test_bl405_version_matrix(version, flagged):
    ds = [d for d in lint(ARTICLE, version) if d.code == "BL405"]
    assert bool(ds) == flagged
    if flagged:
        (d,) = ds
        assert f"transformers {version} ([tool.bertlint] target-versions)" in d.message
        assert "gradient_accumulation_steps=8" in d.message and "8×" in d.message
        assert d.start.row == 19


def test_bl405_message_workarounds_depend_on_version():
    (m5,) = [d for d in lint(ARTICLE, "5.12.0") if d.code == "BL405"]
    assert "trainer.model_accepts_loss_kwargs = False" in m5.message and "loss_is_scaled_for_ga" not in m5.message
    assert "compute_loss_func" in m5.message
    (m519,) = [d for d in lint(ARTICLE, "5.19.0") if d.code == "BL405"]
    assert "loss_is_scaled_for_ga = False" in m519.message
    (m446,) = [d for d in lint(ARTICLE, "4.46.3") if d.code == "BL405"]
    assert "upgrade transformers to ≥ 4.48" in m446.message and "looks normal" in m446.message
    assert m446.fix is None
    (m447,) = [d for d in lint(ARTICLE, "4.47.1") if d.code == "BL405"]
    assert "looks normal" not in m447.message


def test_bl405_version_from_requirements_is_named(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text("transformers==4.46.1\n")
    p = tmp_path / "train.py"
    p.write_text(ARTICLE)
    from bertlint.analysis.versions import pins_near

    pins_near.cache_clear()
    clear_caches()
    (d,) = [d for d in lint_path(str(p)) if d.code == "BL405"]
    assert "transformers 4.46.1 (pinned in requirements.txt:1)" in d.message


def test_bl405_unsafe_fix_inserts_the_switch_and_silences_the_rule():
    ds = lint(ARTICLE)
    (d,) = [d for d in ds if d.code == "BL405"]
    assert d.fix.applicability.value == "unsafe"
    assert apply_fixes(ARTICLE, [d]).applied == []  # unsafe fixes need unsafe=True
    res = apply_fixes(ARTICLE, [d], unsafe=True)
    assert "trainer = Trainer(model=model, args=args, train_dataset=dataset[\"train\"], processing_class=tokenizer)\n" \
           "trainer.model_accepts_loss_kwargs = False\ntrainer.train()" in res.text
    assert not [x for x in lint(res.text) if x.code == "BL405"]


def test_bl405_fix_keeps_indentation_in_a_function():
    src = (
        "from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments\n"
        "def main():\n"
        "    model = AutoModelForMaskedLM.from_pretrained('bert-base-cased')\n"
        "    t = Trainer(\n"
        "        model=model,\n"
        "        args=TrainingArguments('o', gradient_accumulation_steps=2),\n"
        "    )\n"
        "    t.train()\n"
    )
    (d,) = [d for d in lint(src) if d.code == "BL405"]
    res = apply_fixes(src, [d], unsafe=True)
    assert "    )\n    t.model_accepts_loss_kwargs = False\n    t.train()\n" in res.text


BASE = """from transformers import {cls}, Trainer, TrainingArguments
model = {cls}.from_pretrained({ckpt!r})
args = TrainingArguments("o", per_device_train_batch_size=4, gradient_accumulation_steps={n})
trainer = {trainer}(model=model, args=args{extra})
{after}
"""


def _src(cls="AutoModelForSequenceClassification", ckpt="bert-base-uncased", n=4, trainer="Trainer", extra="",
         after="", pre=""):
    return pre + BASE.format(cls=cls, ckpt=ckpt, n=n, trainer=trainer, extra=extra, after=after)


@pytest.mark.parametrize("src", [
    _src(n=1),
    _src(extra=", compute_loss_func=token_loss"),
    _src(after="trainer.model_accepts_loss_kwargs = False"),
    _src(after="setattr(trainer, 'model_accepts_loss_kwargs', False)"),
    _src(trainer="MyTrainer", pre="from transformers import Trainer\nclass MyTrainer(Trainer):\n    loss_is_scaled_for_ga = False\n"),
    _src(cls="AutoModelForCausalLM"),
    _src(cls="BertLMHeadModel"),
    _src(cls="AutoModelForMaskedLM", ckpt="answerdotai/ModernBERT-base"),
    _src(cls="AutoModelForQuestionAnswering", ckpt="answerdotai/ModernBERT-base"),
    _src(ckpt="my-org/sentiment-model"),  # architecture not visible
    _src(ckpt="camembert-base"),
    _src(ckpt="microsoft/deberta-base"),  # DeBERTa v1: not measured
    _src(cls="AutoModel"),
    _src(trainer="MyTrainer", pre="from transformers import Trainer\nclass MyTrainer(Trainer):\n"
         "    def compute_loss(self, model, inputs, return_outputs=False, **kw):\n"
         "        return model(**inputs).loss / self.args.gradient_accumulation_steps\n"),
    _src(n="args_cli.accum"),
    "import torch\nfrom transformers import Trainer, TrainingArguments\nclass Net(torch.nn.Module):\n"
    "    def forward(self, x, labels=None):\n        return x\n"
    "trainer = Trainer(model=Net(), args=TrainingArguments('o', gradient_accumulation_steps=8))\n",
])
def test_bl405_does_not_flag_the_look_alikes(src):
    assert codes(src, code="BL405") == []


@pytest.mark.parametrize("cls,ckpt", [
    ("AutoModelForSequenceClassification", "roberta-base"),
    ("AutoModelForTokenClassification", "xlm-roberta-base"),
    ("AutoModelForMaskedLM", "distilbert-base-uncased"),
    ("AutoModelForQuestionAnswering", "microsoft/deberta-v3-base"),
    ("AutoModelForMultipleChoice", "albert-base-v2"),
    ("AutoModelForSequenceClassification", "google/electra-base-discriminator"),
    ("AutoModelForSequenceClassification", "answerdotai/ModernBERT-base"),
    ("ElectraForTokenClassification", "whatever/checkpoint"),
])
def test_bl405_flags_each_affected_family_on_5x(cls, ckpt):
    assert codes(_src(cls=cls, ckpt=ckpt), code="BL405") == [("BL405", 4)]


def test_bl405_peft_does_not_shield():
    src = _src(after="") .replace("args = ", "from peft import get_peft_model\nmodel = get_peft_model(model, cfg)\nargs = ")
    (d,) = [d for d in lint(src) if d.code == "BL405"]
    assert "PEFT" in d.message


# ---------------------------------------------------------------------------------------------- BL404


def test_bl404_old_signature_by_version_and_fix():
    src = (FIXTURES / "compute_loss_old_bad.py").read_text()
    assert codes(src, "4.45.2", "BL404") == []
    assert codes(src, "4.46.0", "BL404") == [("BL404", 7)]
    (d,) = [d for d in lint(src) if d.code == "BL404"]
    res = apply_fixes(src, [d])
    assert "def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):" in res.text
    assert [x for x in lint(res.text) if x.code == "BL404"] == []


def test_bl404_mean_override_only_on_5x_with_accumulation():
    src = (FIXTURES / "compute_loss_mean_bad.py").read_text()
    assert codes(src, "5.0.0", "BL404") == [("BL404", 8)]
    assert codes(src, "4.57.1", "BL404") == []
    assert codes(src.replace("gradient_accumulation_steps=4", "gradient_accumulation_steps=1"), code="BL404") == []
    assert codes(src.replace("class FocalTrainer(Trainer):", "class FocalTrainer(Trainer):\n    loss_is_scaled_for_ga = False"), code="BL404") == []


CONTRASTIVE = """import torch
from transformers import Trainer


class ContrastiveTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        q = model(input_ids=inputs["query_ids"], attention_mask=inputs["query_mask"]).last_hidden_state[:, 0]
        p = model(input_ids=inputs.get("pos_ids"), attention_mask=inputs.pop("pos_mask")).last_hidden_state[:, 0]
        scores = q @ p.T
        loss = torch.nn.functional.cross_entropy(scores, torch.arange(q.size(0), device=q.device))
        return (loss, scores) if return_outputs else loss
"""


def test_bl404_mean_override_whose_batch_has_no_labels_is_not_reported():
    # transformers 5.24 counts num_items_in_batch only when "labels" in the batch; without it the Trainer divides the
    # returned loss by N itself (seen on CPU: compute_loss 0.6948, training_step returned 0.1737 at N=4; with a
    # "labels" key in the same batches it returned 0.6947)
    assert codes(CONTRASTIVE, code="BL404") == []
    built = CONTRASTIVE.replace("from transformers import Trainer", "from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments") + (
        "\n\nmodel = AutoModelForSequenceClassification.from_pretrained('roberta-base')\n"
        "args = TrainingArguments(output_dir='out', gradient_accumulation_steps=4, remove_unused_columns=False)\n"
        "trainer = ContrastiveTrainer(model=model, args=args)\n")
    assert codes(built, "5.24.0", "BL404") == []
    # a collator of the file that puts `labels` in every batch decides (fixtures/trainer/compute_loss_collator_labels_bad.py)
    collated = built.replace("import torch\n", "import torch\n\n\ndef collate(features):\n"
                             "    return {'query_ids': None, 'labels': torch.ones(len(features))}\n\n", 1).replace(
        "args=args)", "args=args, data_collator=collate)")
    assert [c for c, _ in codes(collated, "5.24.0", "BL404")] == ["BL404"]


def test_bl404_mean_override_whose_batch_keys_are_not_all_known_still_warns():
    with_labels = CONTRASTIVE.replace('inputs["query_mask"]', 'inputs["labels"]')
    assert codes(with_labels, code="BL404") == [("BL404", 6)]
    whole = CONTRASTIVE.replace('input_ids=inputs["query_ids"], attention_mask=inputs["query_mask"]', "**inputs")
    assert codes(whole, code="BL404") == [("BL404", 6)]
    by_variable = CONTRASTIVE.replace('inputs["query_ids"]', "inputs[self.query_key]")
    assert codes(by_variable, code="BL404") == [("BL404", 6)]
    rebound = CONTRASTIVE.replace("        scores = q @ p.T\n", "        scores = q @ p.T\n        self.last = inputs\n")
    assert codes(rebound, code="BL404") == [("BL404", 6)]


# ---------------------------------------------------------------------------------------------- BL407 / BL305


def test_bl407_by_version():
    src = "from transformers import TrainingArguments\nTrainingArguments('o', evaluation_strategy='epoch', warmup_ratio=0.1, group_by_length=True)\n"
    def bl407(v):
        return sorted(d.message.split("(")[1].split("=")[0] for d in lint(src, v) if d.code == "BL407")
    assert bl407("4.50.0") == []
    assert bl407("4.51.0") == ["evaluation_strategy"]
    assert bl407("5.2.0") == ["evaluation_strategy", "group_by_length"]
    assert bl407("5.15.0") == ["evaluation_strategy", "group_by_length", "warmup_ratio"]


def test_bl407_message_names_replacement_and_safe_rename():
    src = "from transformers import TrainingArguments\nargs = TrainingArguments('o', no_cuda=True)\n"
    (d,) = [d for d in lint(src) if d.code == "BL407"]
    assert "`use_cpu`" in d.message and "removed in transformers 5.0.0" in d.message
    assert apply_fixes(src, [d]).text == src.replace("no_cuda", "use_cpu")


def test_bl407_keyword_introduced_after_the_pinned_version():
    # eval_strategy appeared in 4.41.0, Trainer(processing_class=) in 4.46.0, TrainingArguments(use_cache=) in 5.0.0
    src = ("from transformers import Trainer, TrainingArguments\n"
           "args = TrainingArguments('o', eval_strategy='steps', use_cache=False)\n"
           "trainer = Trainer(model=model, args=args, processing_class=tok)\n")
    def bl407(v):
        return sorted(d.message.split("(")[1].split("=")[0] for d in lint(src, v) if d.code == "BL407")
    assert bl407("4.38.0") == ["eval_strategy", "processing_class", "use_cache"]
    assert bl407("4.41.0") == ["processing_class", "use_cache"]
    assert bl407("4.46.0") == ["use_cache"]
    assert bl407("5.0.0") == []
    # a range is judged only when it excludes the introducing release
    assert bl407(">=4.30,<4.41") == ["eval_strategy", "processing_class", "use_cache"]
    assert bl407(">=4.30") == []
    (d,) = [d for d in lint(src, "4.38.0") if d.code == "BL407" and "eval_strategy" in d.message]
    assert "exists only from transformers 4.41.0" in d.message and "4.38.0" in d.message
    assert d.severity.value == "E"
    assert apply_fixes(src, [d]).text == src.replace("eval_strategy=", "evaluation_strategy=")


def test_bl407_introduced_keyword_not_judged_on_the_installed_version(tmp_path):
    # no pin near the script: the version is bertlint's own environment, which has every new name
    src = "from transformers import TrainingArguments\nargs = TrainingArguments('o', eval_strategy='steps')\n"
    assert codes(src, transformers=None, code="BL407") == []
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text("transformers==4.40.2\n")
    (tmp_path / "train.py").write_text(src)
    clear_caches()
    got = [(d.code, d.start.row) for d in lint_path(str(tmp_path / "train.py")) if d.code == "BL407"]
    assert got == [("BL407", 2)]


def test_bl407_introduced_keyword_look_alikes():
    # an attribute set after construction is not a keyword; trl's trainers take processing_class by trl's version
    src = ("from transformers import TrainingArguments\nfrom trl import SFTTrainer\n"
           "args = TrainingArguments('o', evaluation_strategy='steps')\nargs.eval_strategy = 'no'\n"
           "trainer = SFTTrainer(model=model, args=args, processing_class=tok)\n")
    assert codes(src, "4.38.0", code="BL407") == []


def test_bl407_introduced_keyword_declared_by_the_project_class():
    # the project's own dataclass declares the field, and the Trainer subclass takes processing_class itself
    src = ("from dataclasses import dataclass\nfrom transformers import Trainer, TrainingArguments\n"
           "@dataclass\nclass MyArgs(TrainingArguments):\n    eval_strategy: str = 'no'\n"
           "class MyTrainer(Trainer):\n    def __init__(self, *a, processing_class=None, **kw):\n"
           "        super().__init__(*a, tokenizer=processing_class, **kw)\n"
           "args = MyArgs('o', eval_strategy='steps')\ntrainer = MyTrainer(model=m, args=args, processing_class=tok)\n")
    assert codes(src, "4.38.0", code="BL407") == []
    assert [r for _, r in codes(src.replace("    eval_strategy: str = 'no'\n", "    pass\n"), "4.38.0",
                                code="BL407")] == [9]


def test_bl305_only_from_5_23():
    src = "from transformers import TrainingArguments\nTrainingArguments('o', gradient_checkpointing=True)\n"
    assert codes(src, "5.22.0", "BL305") == []
    (d,) = [d for d in lint(src, "5.23.0") if d.code == "BL305"]
    assert apply_fixes(src, [d]).text == src.replace("gradient_checkpointing", "activation_checkpointing")


# ---------------------------------------------------------------------------------------------- checkpointing


PEFT_CKPT = (FIXTURES / "v4_44" / "peft_ckpt_bad.py").read_text()


@pytest.mark.parametrize("version,flagged", [("4.44.2", True), ("4.57.1", True), ("5.0.0", False), ("5.24.0", False)])
def test_bl303_only_before_5(version, flagged):
    assert bool(codes(PEFT_CKPT, version, "BL303")) == flagged


def test_bl303_explicit_non_reentrant_and_hook_are_fine():
    assert codes(PEFT_CKPT.replace("gradient_checkpointing=True)", "gradient_checkpointing=True, gradient_checkpointing_kwargs={'use_reentrant': False})"), "4.44.2", "BL303") == []
    assert codes(PEFT_CKPT.replace("args = ", "model.enable_input_require_grads()\nargs = "), "4.44.2", "BL303") == []
    # a kwargs dict without use_reentrant is reentrant even on versions whose default is not
    assert codes(PEFT_CKPT.replace("gradient_checkpointing=True)", "gradient_checkpointing=True, gradient_checkpointing_kwargs={'preserve_rng_state': False})"), "4.57.1", "BL303")


def test_bl304_reentrant_with_find_unused():
    src = ("from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments\n"
           "model = AutoModelForSequenceClassification.from_pretrained('bert-base-cased')\n"
           "args = TrainingArguments('o', gradient_checkpointing=True, ddp_find_unused_parameters=True)\n"
           "trainer = Trainer(model=model, args=args)\n")
    assert codes(src, "4.57.1", "BL304") == [("BL304", 3)]
    assert codes(src, "5.24.0", "BL304") == []  # 5.x default is non-reentrant


def test_bl301_torch_checkpoint_call_and_kwargs_dict():
    src = ("import torch\nfrom torch.utils.checkpoint import checkpoint\n"
           "def f(layer, x):\n    a = checkpoint(layer, x)\n    b = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False)\n"
           "    return a + b\n")
    assert codes(src, code="BL301") == [("BL301", 4)]
    src2 = "from transformers import TrainingArguments\nTrainingArguments('o', gradient_checkpointing=True, gradient_checkpointing_kwargs={'every_n_layers': 2})\n"
    assert codes(src2, code="BL301") == []  # only Trainer keys: the default use_reentrant=False still applies


# ---------------------------------------------------------------------------------------------- precision


def test_bl203_bl204_bl205():
    assert codes((FIXTURES / "precision_bad.py").read_text()) == [("BL204", 5), ("BL203", 6)]
    half = _src().replace('args = TrainingArguments("o", ', 'model = model.half()\nargs = TrainingArguments("o", fp16=True, ')
    assert ("BL204", 3) in codes(half)
    bf = _src(n=1).replace("args = ", "model.to(torch.bfloat16)\nargs = ")
    assert codes(bf, code="BL205") == [("BL205", 3)]
    assert codes(bf.replace('per_device_train_batch_size=4', 'learning_rate=1e-3'), code="BL205") == []
    assert codes(bf.replace('per_device_train_batch_size=4', 'deepspeed="ds.json"'), code="BL205") == []


def test_bl204_fp16_checkpoint_loaded_with_auto_dtype(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text('{"model_type": "bert", "dtype": "float16"}')
    src = _src(ckpt="./ckpt", n=1).replace('per_device_train_batch_size=4', 'fp16=True')
    p = tmp_path / "train.py"
    def run(v):
        return [d.code for d in lint_python(src, str(p), Settings(target_versions={"transformers": v}))]
    assert "BL204" in run("5.0.0")
    assert "BL204" not in run("4.57.1")  # 4.x loads float32 by default


# ---------------------------------------------------------------------------------------------- others


def test_bl401_declared_batch():
    src = ("from transformers import TrainingArguments\nglobal_batch_size = 30\n"
           "args = TrainingArguments('o', per_device_train_batch_size=4, gradient_accumulation_steps=2)\n")
    assert codes(src, code="BL401") == [("BL401", 2)]
    assert codes(src.replace("30", "32"), code="BL401") == []  # 4 processes would make it
    ds = lint_python(src.replace("30", "32"), "t.py", Settings(world_size=2))
    assert [d.code for d in ds if d.code == "BL401"] == ["BL401"]


def test_bl406_not_for_sequence_classification():
    src = (FIXTURES / "eval_logits_bad.py").read_text()
    assert codes(src.replace("AutoModelForMaskedLM", "AutoModelForSequenceClassification"), code="BL406") == []
    assert codes(src.replace('eval_strategy="epoch"', 'eval_strategy="epoch", eval_accumulation_steps=8'), code="BL406") == []


def test_bl410_divided_by_accumulation_is_fine():
    src = (FIXTURES / "step_units_bad.py").read_text()
    assert codes(src.replace("len(train_dataloader) * 3", "len(train_dataloader) // 4 * 3"), code="BL410") == []


def test_bl505_gated_and_outside_loops_are_fine():
    src = "import torch\nfor i in range(9):\n    if i % 100 == 0:\n        torch.cuda.empty_cache()\ntorch.cuda.empty_cache()\n"
    assert codes(src, code="BL505") == []


def test_bl503_bl504_only_in_training_scripts():
    assert codes("from transformers import AutoTokenizer\ntok(x, padding='max_length')\n", code="BL503") == []
    assert codes("import torch_xla\nfrom transformers import Trainer\ntokenizer(x, padding='max_length')\n", code="BL503") == []


def test_bad_input_never_raises():
    for src in ["from transformers import Trainer\nTrainer(model=(lambda: 1)(), args=[*x])\n",
                "from transformers import TrainingArguments as TA\nTA(**{1: 2}, gradient_accumulation_steps=2**100)\n",
                "import transformers\nclass A(transformers.Trainer):\n    def compute_loss(self, *a): pass\n"
                "t = A(model=A, args=transformers.TrainingArguments(gradient_accumulation_steps='x'))\n"]:
        lint(src)


def test_bl505_between_runs_is_fine():
    src = ("import torch\nfor lr in (1e-5, 3e-5):\n    run(lr)\n    torch.cuda.empty_cache()\n"
           "for epoch in range(3):\n    trainer.train()\n    torch.cuda.empty_cache()\n")
    assert codes(src, code="BL505") == []


def test_bl505_per_epoch_after_an_inner_step_loop_is_fine():
    src = ("import torch\nfor epoch in range(3):\n    for batch in loader:\n        loss = model(**batch).loss\n"
           "        loss.backward()\n        optimizer.step()\n    torch.cuda.empty_cache()\n")
    assert codes(src, code="BL505") == []


def test_bl405_compute_loss_func_that_ignores_num_items():
    pre = ("import torch\n"
           "def my_loss(outputs, labels, num_items_in_batch=None):\n"
           "    return torch.nn.functional.cross_entropy(outputs.logits, labels)\n")
    src = pre + _src(extra=", compute_loss_func=my_loss")
    assert codes(src, code="BL405") == [("BL405", 7)]
    assert codes(src, "4.57.1", "BL405") == []
    good = src.replace("return torch.nn.functional.cross_entropy(outputs.logits, labels)",
                       "return torch.nn.functional.cross_entropy(outputs.logits, labels, reduction='sum') / num_items_in_batch")
    assert codes(good, code="BL405") == []
    assert codes(_src(extra=", compute_loss_func=make_loss()"), code="BL405") == []


def test_bl404_own_training_step_decides_the_call():
    src = (FIXTURES / "compute_loss_old_bad.py").read_text().replace(
        "class WeightedTrainer(Trainer):\n",
        "class WeightedTrainer(Trainer):\n    def training_step(self, model, inputs, num_items_in_batch=None):\n"
        "        return self.compute_loss(model, inputs)\n\n")
    assert codes(src, code="BL404") == []


CUSTOM = '''import torch
from transformers import AutoModel, Trainer, TrainingArguments


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = AutoModel.from_pretrained("bert-base-uncased")
        self.head = torch.nn.Linear(768, 2)

    def forward(self, input_ids, attention_mask=None, labels=None, **kwargs):
        logits = self.head(self.encoder(input_ids, attention_mask=attention_mask).last_hidden_state[:, 0])
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return {"loss": loss, "logits": logits}


model = Classifier()
args = TrainingArguments("out", per_device_train_batch_size=8, gradient_accumulation_steps=4)
trainer = Trainer(model=model, args=args)
'''


def test_bl405_custom_model_with_kwargs_that_ignores_num_items():
    assert codes(CUSTOM, "5.24.0", "BL405") == [("BL405", 19)]
    assert codes(CUSTOM, "4.57.1", "BL405") == [("BL405", 19)]
    assert codes(CUSTOM, "4.45.2", "BL405") == []
    (d,) = [d for d in lint(CUSTOM) if d.code == "BL405"]
    assert "Classifier.forward" in d.message and d.fix is not None
    assert codes(CUSTOM.replace(", **kwargs)", ")"), code="BL405") == []  # no **kwargs: the Trainer divides
    assert codes(CUSTOM.replace("labels=None, **kwargs", "targets=None, **kwargs").replace(", labels)", ", targets)"),
                 code="BL405") == []
    uses = CUSTOM.replace("loss = torch.nn.functional.cross_entropy(logits, labels)",
                          "loss = torch.nn.functional.cross_entropy(logits, labels, reduction='sum') / kwargs['num_items_in_batch']")
    assert codes(uses, code="BL405") == []
    assert codes(CUSTOM.replace("class Classifier(torch.nn.Module):\n", "class Classifier(torch.nn.Module):\n    accepts_loss_kwargs = False\n"), code="BL405") == []


def test_bl404_mean_override_with_a_script_model_taking_kwargs():
    src = CUSTOM.replace("model = Classifier()", '''class MyTrainer(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
        out = model(**inputs)
        return (out["loss"], out) if return_outputs else out["loss"]


model = Classifier()''').replace("trainer = Trainer(", "trainer = MyTrainer(")
    assert [c for c, _ in codes(src, code="BL404")] == ["BL404"]
    assert codes(src.replace(", **kwargs):\n        logits", "):\n        logits"), code="BL404") == []


def test_bl407_through_a_literal_dict():
    src = ("from transformers import TrainingArguments\nextra = {'evaluation_strategy': 'epoch'}\n"
           "args = TrainingArguments('o', **extra)\n")
    (d,) = [d for d in lint(src) if d.code == "BL407"]
    assert d.start.row == 3 and "`evaluation_strategy` (through `**`)" in d.message and d.fix is None


def test_bl303_without_a_pin_judges_the_era_the_script_was_written_for(tmp_path):
    """No pin and no target-versions: bertlint's own 5.x says nothing about the script, but `evaluation_strategy=`
    (removed in 4.51) shows it was written for 4.x, whose Trainer checkpointing is reentrant: a warning that says so."""
    from bertlint.analysis import versions as V

    (tmp_path / ".git").mkdir()
    src = ("from peft import LoraConfig, get_peft_model\n"
           "from transformers import AutoModelForCausalLM, Trainer, TrainingArguments\n"
           "model = get_peft_model(AutoModelForCausalLM.from_pretrained('./m'), LoraConfig(r=8))\n"
           "args = TrainingArguments(output_dir='o', evaluation_strategy='epoch', gradient_checkpointing=True)\n"
           "Trainer(model=model, args=args).train()\n")
    script = tmp_path / "train.py"
    script.write_text(src)
    V.pins_near.cache_clear()
    clear_caches()
    found = [d for d in lint_path(str(script)) if d.code == "BL303"]
    assert len(found) == 1 and found[0].severity.value == "W"
    assert "before 4.51.0" in found[0].message and "evaluation_strategy" in found[0].message
    script.write_text(src.replace("evaluation_strategy", "eval_strategy"))  # a 5.x-era script: silent
    clear_caches()
    assert [d for d in lint_path(str(script)) if d.code == "BL303"] == []
    (tmp_path / "requirements.txt").write_text("transformers==5.2.0\n")  # pinned 5.x: silent
    script.write_text(src)
    V.pins_near.cache_clear()
    clear_caches()
    assert [d for d in lint_path(str(script)) if d.code == "BL303"] == []
