"""BL407 on the project's own classes: a TrainingArguments subclass that declares the field itself, and a Trainer
subclass whose ``__init__`` takes the keyword itself, accept it on every transformers version (no TypeError), so
they are silent; subclasses that only pass the keyword on are still reported."""

from __future__ import annotations

import textwrap

from bertlint.api import lint_path
from bertlint.config import Settings, clear_caches
from bertlint.engine import lint_python


def lint(src: str, transformers: str = "5.2.0") -> list:
    s = Settings(target_versions={"transformers": transformers}, select=["BL407"])
    return [(d.code, d.start.row) for d in lint_python(textwrap.dedent(src), "/nonexistent/train.py", s)]


ARGS_DECLARED = """\
from dataclasses import dataclass, field
from transformers import Trainer, TrainingArguments


@dataclass
class MyArgs(TrainingArguments):
    evaluation_strategy: str = field(default="no")
    overwrite_output_dir: bool = False


args = MyArgs(output_dir="out", evaluation_strategy="steps", overwrite_output_dir=True)
Trainer(model=model, args=args, train_dataset=ds).train()
"""

ARGS_NOT_DECLARED = """\
from dataclasses import dataclass, field
from transformers import Trainer, TrainingArguments


@dataclass
class MyArgs(TrainingArguments):
    lora_r: int = 8


args = MyArgs(output_dir="out", evaluation_strategy="steps")
Trainer(model=model, args=args, train_dataset=ds).train()
"""


def test_training_arguments_subclass_that_declares_the_field_is_silent():
    assert lint(ARGS_DECLARED) == []


def test_training_arguments_subclass_without_the_field_is_reported():
    assert lint(ARGS_NOT_DECLARED) == [("BL407", 10)]
    assert lint(ARGS_NOT_DECLARED.replace("MyArgs(output_dir", "TrainingArguments(output_dir")) == [("BL407", 10)]


def test_field_declared_by_a_base_in_a_sibling_module_is_silent(tmp_path):
    (tmp_path / ".git").mkdir()
    (tmp_path / "requirements.txt").write_text("transformers==5.2.0\n")
    (tmp_path / "my_args.py").write_text(textwrap.dedent("""\
        from dataclasses import dataclass
        from transformers import TrainingArguments


        @dataclass
        class BaseArgs(TrainingArguments):
            evaluation_strategy: str = "no"
        """))
    train = tmp_path / "train.py"
    train.write_text(textwrap.dedent("""\
        from dataclasses import dataclass
        from transformers import Trainer
        from my_args import BaseArgs


        @dataclass
        class MyArgs(BaseArgs):
            lora_r: int = 8


        args = MyArgs(output_dir="out", evaluation_strategy="steps")
        plain = BaseArgs(output_dir="out", evaluation_strategy="steps")
        Trainer(model=model, args=args, train_dataset=ds).train()
        """))
    clear_caches()
    assert [d for d in lint_path(str(train)) if d.code == "BL407"] == []
    # the same base without the field: both constructors are reported
    (tmp_path / "my_args.py").write_text((tmp_path / "my_args.py").read_text().replace(
        "evaluation_strategy: str", "lora_alpha: int").replace('"no"', "16"))
    clear_caches()
    assert sorted(d.start.row for d in lint_path(str(train)) if d.code == "BL407") == [11, 12]


TRAINER_TAKES = """\
from transformers import Trainer, TrainingArguments


class MyTrainer(Trainer):
    def __init__(self, *args, tokenizer=None, **kwargs):
        super().__init__(*args, processing_class=tokenizer, **kwargs)


class PopTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        tok = kwargs.pop("tokenizer", None)
        super().__init__(*args, processing_class=tok, **kwargs)


args = TrainingArguments(output_dir="out")
MyTrainer(model=model, args=args, train_dataset=ds, tokenizer=tok).train()
PopTrainer(model=model, args=args, train_dataset=ds, tokenizer=tok).train()
"""

TRAINER_PASSES_ON = """\
from transformers import Trainer, TrainingArguments


class MyTrainer(Trainer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.extra = 1


class NoInit(Trainer):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


args = TrainingArguments(output_dir="out")
MyTrainer(model=model, args=args, train_dataset=ds, tokenizer=tok).train()
NoInit(model=model, args=args, train_dataset=ds, tokenizer=tok).train()
"""


def test_trainer_subclass_whose_init_takes_tokenizer_is_silent():
    assert lint(TRAINER_TAKES) == []


def test_trainer_subclass_that_passes_tokenizer_on_is_reported():
    assert lint(TRAINER_PASSES_ON) == [("BL407", 16), ("BL407", 17)]
    assert lint(TRAINER_PASSES_ON, "4.57.1") == []  # still accepted there
