"""Regressions from a false-positive hunt on public Trainer / DeepSpeed / accelerate / Lightning scripts.

Every example is written for this file (not copied); each reproduces the shape of a real script that a rule of
the framework family (BL203-205, BL301-305, BL401-411, BL503-505) reported although it was correct."""

from __future__ import annotations

from bertlint.config import Settings
from bertlint.engine import lint_python


def _codes(src: str, code: str, transformers: str = "5.24.0", filename: str = "/nonexistent/train.py") -> list:
    s = Settings(target_versions={"transformers": transformers}, select=["ALL"])
    return [d.start.row for d in lint_python(src, filename, s) if d.code == code]


# --- BL503: static padding is a training cost only ------------------------------------------------------------

_PAD_EVAL_FN = '''
from transformers import AutoTokenizer, Trainer
tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

def encode_for_training(batch):
    return tokenizer(batch["text"], truncation=True)

def encode_for_eval(batch):
    return tokenizer(batch["text"], padding="max_length", max_length=256, truncation=True)

train_ds = raw["train"].map(encode_for_training, batched=True)
eval_ds = raw["validation"].map(encode_for_eval, batched=True)
Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds).train()
'''


def test_bl503_silent_for_a_function_named_for_evaluation():
    assert _codes(_PAD_EVAL_FN, "BL503") == []


_PAD_USED_ON_TEST_ONLY = '''
from transformers import AutoTokenizer, Trainer
tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

def dynamic(batch):
    return tokenizer(batch["text"], truncation=True)

def fixed(batch):
    return tokenizer(batch["text"], padding="max_length", max_length=256, truncation=True)

train_ds = raw["train"].map(dynamic, batched=True)
test_ds = raw["test"].map(fixed, batched=True)
trainer = Trainer(model=model, args=args, train_dataset=train_ds)
trainer.train()
trainer.predict(test_ds)
'''


def test_bl503_silent_when_every_use_of_the_function_maps_test_data():
    assert _codes(_PAD_USED_ON_TEST_ONLY, "BL503") == []


_PAD_TEST_TEXTS = '''
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")
train_enc = tokenizer(train_texts, truncation=True)
test_enc = tokenizer(test_texts, padding="max_length", max_length=128, truncation=True)
for batch in loader:
    model(**batch).loss.backward()
'''


def test_bl503_silent_for_test_texts_at_module_level():
    assert _codes(_PAD_TEST_TEXTS, "BL503") == []


_PAD_NO_TRAINING = '''
from transformers import AutoTokenizer, Trainer
tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

def encode(batch):
    return tokenizer(batch["text"], padding="max_length", max_length=128, truncation=True)

ds = raw.map(encode, batched=True)
print(Trainer(model=model, args=args).predict(ds))
'''


def test_bl503_silent_when_nothing_trains():
    assert _codes(_PAD_NO_TRAINING, "BL503") == []


_PAD_SHARED = '''
from transformers import AutoTokenizer, Trainer
tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

def encode(batch):
    return tokenizer(batch["text"], padding="max_length", max_length=128, truncation=True)

train_ds = raw["train"].map(encode, batched=True)
eval_ds = raw["test"].map(encode, batched=True)
Trainer(model=model, args=args, train_dataset=train_ds, eval_dataset=eval_ds).train()
'''


def test_bl503_still_reports_padding_that_reaches_training_data():
    assert _codes(_PAD_SHARED, "BL503") == [6]


# --- BL204: PEFT adapters on a float16 base are float32 -------------------------------------------------------

_LORA_ON_FP16_BASE = '''
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

base = AutoModelForCausalLM.from_pretrained("facebook/opt-350m", dtype=torch.float16)
model = get_peft_model(base, LoraConfig(r=16, lora_alpha=32, task_type="CAUSAL_LM"))
args = TrainingArguments(output_dir="out", per_device_train_batch_size=8, fp16=True, learning_rate=2e-4)
Trainer(model=model, args=args, train_dataset=train_ds).train()
'''


def test_bl204_silent_for_lora_adapters_on_a_float16_base():
    assert _codes(_LORA_ON_FP16_BASE, "BL204") == []


def test_bl204_still_reports_when_adapters_are_kept_in_float16():
    src = _LORA_ON_FP16_BASE.replace('task_type="CAUSAL_LM"))', 'task_type="CAUSAL_LM"), autocast_adapter_dtype=False)')
    assert _codes(src, "BL204") == [6]


def test_bl204_still_reports_a_half_cast_after_wrapping():
    src = _LORA_ON_FP16_BASE.replace("args = TrainingArguments", "model.half()\nargs = TrainingArguments")
    assert _codes(src, "BL204") == [8]


# --- BL411: a config that already asks for norm 1.0 ----------------------------------------------------------

def _lint_config(tmp_path, name: str, text: str, code: str) -> list:
    from bertlint.api import lint_path
    from bertlint.config import clear_caches

    p = tmp_path / name
    p.write_text(text)
    (tmp_path / "pyproject.toml").write_text('[tool.bertlint]\ntarget-versions = { deepspeed = "0.19.8" }\n')
    clear_caches()
    return [d.start.row for d in lint_path(str(p)) if d.code == code]


def test_bl411_silent_when_the_optimizer_asks_for_max_grad_norm_one(tmp_path):
    cfg = ('{"train_batch_size": 48, "train_micro_batch_size_per_gpu": 12,\n'
           ' "optimizer": {"type": "Adam", "params": {"lr": 5e-5, "max_grad_norm": 1.0}},\n'
           ' "fp16": {"enabled": true}}\n')
    assert _lint_config(tmp_path, "ds_config.json", cfg, "BL411") == []


def test_bl411_still_reports_another_optimizer_norm(tmp_path):
    cfg = ('{"train_batch_size": 48, "train_micro_batch_size_per_gpu": 12,\n'
           ' "optimizer": {"type": "Adam", "params": {"lr": 5e-5, "max_grad_norm": 5.0}},\n'
           ' "fp16": {"enabled": true}}\n')
    assert _lint_config(tmp_path, "ds_config.json", cfg, "BL411") == [1]


# --- BL410: the accumulation factor hidden in a named divisor --------------------------------------------------

_STEPS_NAMED_DIVISOR = '''
from transformers import Trainer, TrainingArguments
MICRO = 16
ACC_STEPS = 8
UPDATE_BATCH = MICRO * ACC_STEPS
updates_per_epoch = len(train_set) // UPDATE_BATCH
args = TrainingArguments(output_dir="out", per_device_train_batch_size=MICRO, gradient_accumulation_steps=ACC_STEPS,
                         eval_steps=updates_per_epoch, save_steps=updates_per_epoch, num_train_epochs=2)
Trainer(model=model, args=args, train_dataset=train_set).train()
'''


def test_bl410_silent_when_a_named_divisor_includes_the_accumulation():
    assert _codes(_STEPS_NAMED_DIVISOR, "BL410") == []


def test_bl410_still_reports_a_micro_batch_count():
    src = _STEPS_NAMED_DIVISOR.replace("UPDATE_BATCH = MICRO * ACC_STEPS", "UPDATE_BATCH = MICRO")
    assert _codes(src, "BL410") == [8, 8]


_STEPS_GLOBAL_BATCH = '''
from transformers import Trainer, TrainingArguments
GLOBAL_BATCH = 64
PER_GPU = 8
ACCUM = GLOBAL_BATCH // PER_GPU
args = TrainingArguments(output_dir="out", per_device_train_batch_size=PER_GPU, gradient_accumulation_steps=ACCUM,
                         max_steps=len(train_set) // GLOBAL_BATCH * 3)
Trainer(model=model, args=args, train_dataset=train_set).train()
'''


def test_bl410_silent_when_divided_by_the_batch_the_accumulation_is_derived_from():
    assert _codes(_STEPS_GLOBAL_BATCH, "BL410") == []


def test_bl410_still_reports_division_by_the_per_device_batch():
    src = _STEPS_GLOBAL_BATCH.replace("len(train_set) // GLOBAL_BATCH", "len(train_set) // PER_GPU")
    assert _codes(src, "BL410") == [7]


# --- explain: checkpointing switched on by prepare_model_for_kbit_training -------------------------------------

_KBIT = '''
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer, TrainingArguments

model = AutoModelForCausalLM.from_pretrained("facebook/opt-350m", quantization_config=BitsAndBytesConfig(load_in_4bit=True))
model = prepare_model_for_kbit_training(model)
model = get_peft_model(model, LoraConfig(r=8, task_type="CAUSAL_LM"))
args = TrainingArguments(output_dir="out", per_device_train_batch_size=4)
Trainer(model=model, args=args, train_dataset=train_ds).train()
'''


def _explain_checkpointing(tmp_path, src: str) -> str:
    import json
    import subprocess
    import sys

    p = tmp_path / "train.py"
    p.write_text(src)
    out = subprocess.run([sys.executable, "-m", "bertlint", "explain", "--output-format", "json", str(p)],
                         capture_output=True, text=True)
    data = json.loads(out.stdout)
    files = data if isinstance(data, list) else [data]
    setups = files[0].get("setups", files) if isinstance(files[0], dict) else files
    return json.dumps(setups)


def test_explain_does_not_say_off_after_kbit_preparation(tmp_path):
    text = _explain_checkpointing(tmp_path, _KBIT)
    assert "prepare_model_for_kbit_training" in text


def test_explain_says_off_when_kbit_preparation_opts_out(tmp_path):
    src = _KBIT.replace("prepare_model_for_kbit_training(model)",
                        "prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)")
    text = _explain_checkpointing(tmp_path, src)
    assert '"text": "off"' in text


def test_bl503_eval_words_are_whole_word_starts():
    from bertlint.checks.bl503 import _eval_only_text

    assert _eval_only_text("prepare_validation_features")
    assert _eval_only_text("X_test")
    assert not _eval_only_text("retrieval_pairs")  # "eval" inside a word
    assert not _eval_only_text("latest_dump")  # "test" inside a word
    assert not _eval_only_text("generate_and_tokenize_prompt")  # builds training prompts
