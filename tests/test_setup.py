"""ctx.setup: TrainingArguments, Trainer and model resolution."""

from __future__ import annotations

import json
from pathlib import Path

import libcst as cst

from bertlint.analysis.setup import architecture_for, bert_like_parameters, checkpoint_family, split_class
from bertlint.analysis.symbols import UNKNOWN
from bertlint.config import Settings
from bertlint.context import FileContext


def setup_of(src: str, path: str = "train.py", **tv):
    ctx = FileContext(path, src, cst.parse_module(src), Settings(target_versions=tv))
    return ctx.setup


HEAD = "from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments\n"


def test_keyword_literals_variables_constants_and_splat():
    fs = setup_of(HEAD + """
BATCH = 4
extra = {"num_train_epochs": 2, "fp16": True}
def main():
    accum = BATCH * 2
    args = TrainingArguments("out", per_device_train_batch_size=BATCH, gradient_accumulation_steps=accum, **extra)
    model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
    trainer = Trainer(model=model, args=args)
""")
    (s,) = fs.setups
    assert (s.micro_batch, s.accumulation) == (4, 8)
    assert s.args.get("num_train_epochs") == 2 and s.args.get("fp16") is True
    assert s.args.get("bf16") is False  # the TrainingArguments default
    assert s.precision == "fp16 mixed precision"
    assert s.trainer.var == "trainer"
    assert s.model.class_name == "BertForSequenceClassification"


def test_unresolved_splat_makes_unlisted_fields_unknown():
    fs = setup_of(HEAD + "cfg = load()\nargs = TrainingArguments(output_dir='o', gradient_accumulation_steps=4, **cfg)\n")
    (ta,) = fs.training_args
    assert ta.get("gradient_accumulation_steps") == 4
    assert ta.get("per_device_train_batch_size") is UNKNOWN
    assert "not resolved" in ta.origin("fp16")


def test_argparse_defaults_and_attribute_assignment():
    fs = setup_of(HEAD + """
import argparse
p = argparse.ArgumentParser()
p.add_argument("--accum", type=int, default=4)
p.add_argument("--bs", type=int, default=16)
a = p.parse_args()
targs = TrainingArguments(output_dir="o", per_device_train_batch_size=a.bs, gradient_accumulation_steps=a.accum)
targs.per_device_train_batch_size = 2
""")
    (ta,) = fs.training_args
    assert ta.get("gradient_accumulation_steps") == 4
    assert ta.origin("gradient_accumulation_steps") == "argparse default of --accum"
    assert ta.get("per_device_train_batch_size") == 2
    assert ta.origin("per_device_train_batch_size") == "attribute assignment"


def test_hfargumentparser_cli_is_unknown_but_subclass_defaults_are_read():
    fs = setup_of("""
from dataclasses import dataclass, field
from transformers import HfArgumentParser, TrainingArguments
@dataclass
class Mine(TrainingArguments):
    gradient_accumulation_steps: int = field(default=8)
parser = HfArgumentParser((Mine,))
(args,) = parser.parse_args_into_dataclasses()
parser2 = HfArgumentParser(TrainingArguments)
(args2,) = parser2.parse_args_into_dataclasses()
""")
    a1, a2 = fs.training_args
    assert a1.var == "args" and a1.get("gradient_accumulation_steps") == 8
    assert a1.get("fp16") is UNKNOWN  # from the command line
    assert a2.var == "args2" and a2.get("gradient_accumulation_steps") is UNKNOWN
    assert a2.default("gradient_accumulation_steps") == 1


def test_json_and_yaml_argument_files(tmp_path: Path):
    (tmp_path / "args.json").write_text(json.dumps({"gradient_accumulation_steps": 4, "output_dir": "o"}))
    (tmp_path / "args.yaml").write_text("gradient_accumulation_steps: 2\nbf16: true\n")
    fs = setup_of("""
from transformers import HfArgumentParser, TrainingArguments
parser = HfArgumentParser(TrainingArguments)
(a,) = parser.parse_json_file("args.json")
(b,) = parser.parse_yaml_file(yaml_file="args.yaml")
(c,) = parser.parse_json_file(json_file=sys.argv[1])
(d,) = parser.parse_dict({"gradient_accumulation_steps": 16})
""", str(tmp_path / "train.py"))
    a, b, c, d = fs.training_args
    assert a.get("gradient_accumulation_steps") == 4 and a.source_file == "args.json"
    assert a.get("per_device_train_batch_size") == 8
    assert b.get("gradient_accumulation_steps") == 2 and b.get("bf16") is True
    assert c.get("gradient_accumulation_steps") is UNKNOWN
    assert d.get("gradient_accumulation_steps") == 16


def test_model_resolution_peft_cast_checkpointing_freezing():
    fs = setup_of("""
import torch
from peft import get_peft_model, LoraConfig
from transformers import AutoModelForMaskedLM, Trainer, TrainingArguments
model = AutoModelForMaskedLM.from_pretrained("FacebookAI/roberta-base", torch_dtype=torch.bfloat16)
for p in model.roberta.embeddings.parameters():
    p.requires_grad = False
model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
model = get_peft_model(model, LoraConfig())
model.half()
trainer = Trainer(model=model, args=TrainingArguments("o"))
""")
    m = fs.trainers[0].model
    assert m.class_name == "RobertaForMaskedLM" and (m.family, m.head) == ("roberta", "ForMaskedLM")
    assert m.dtype == "bfloat16" and m.cast == "float16" and m.weights_dtype == "float16"
    assert m.peft and m.frozen_inputs and m.frozen_any
    (c,) = m.checkpointing
    assert c.method == "gradient_checkpointing_enable" and c.kwargs == {"use_reentrant": True}
    assert m.parameters == 124645632 and "roberta-base" in m.architecture_source


def test_direct_class_with_config_counts_parameters():
    fs = setup_of("""
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
config = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=100)
model = BertForSequenceClassification(config)
trainer = Trainer(model, TrainingArguments("o", gradient_accumulation_steps=4))
""")
    (s,) = fs.setups
    assert s.model.class_name == "BertForSequenceClassification"
    assert s.model.parameters == bert_like_parameters(
        dict(hidden_size=32, num_hidden_layers=2, intermediate_size=37, vocab_size=100, max_position_embeddings=512))
    assert s.accumulation == 4  # positional args


def test_formula_matches_the_table_for_bert_base():
    arch = architecture_for("google-bert/bert-base-uncased")
    assert arch["parameters"] == bert_like_parameters(arch) == 109482240


def test_local_config_json(tmp_path: Path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "config.json").write_text(json.dumps({
        "model_type": "bert", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 128, "vocab_size": 1000, "max_position_embeddings": 128, "type_vocab_size": 2}))
    fs = setup_of(HEAD + "m = AutoModelForSequenceClassification.from_pretrained('./ckpt')\nt = Trainer(model=m)\n",
                  str(tmp_path / "train.py"))
    m = fs.trainers[0].model
    assert m.class_name == "BertForSequenceClassification"
    assert m.parameters == bert_like_parameters(dict(hidden_size=64, num_hidden_layers=2, intermediate_size=128,
                                                     vocab_size=1000, max_position_embeddings=128))
    assert "config.json" in m.architecture_source


def test_trainer_subclass_methods_switches_and_model_init():
    fs = setup_of(HEAD + """
class Base(Trainer):
    loss_is_scaled_for_ga = False
class Mine(Base):
    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
def model_init():
    return AutoModelForSequenceClassification.from_pretrained("roberta-large")
opt, sched = make()
t = Mine(model_init=model_init, args=TrainingArguments("o"), optimizers=(opt, sched), compute_loss_func=f,
         compute_metrics=cm, preprocess_logits_for_metrics=pp, callbacks=[cb])
t.model_accepts_loss_kwargs = False
""")
    (t,) = fs.trainers
    assert t.class_name == "Mine" and t.subclass is not None
    assert "compute_loss" in t.methods and t.compute_loss is not None
    assert t.loss_scaling_override == "loss_is_scaled_for_ga = False"
    assert t.model.class_name == "RobertaForSequenceClassification"
    assert all(x is not None for x in (t.optimizers, t.compute_loss_func, t.compute_metrics,
                                       t.preprocess_logits_for_metrics, t.callbacks))
    assert fs.disables_loss_kwargs is not None
    assert set(fs.trainer_classes) == {"Base", "Mine"}


def test_checkpoint_names_and_class_names():
    assert checkpoint_family("bert-base-uncased") == "bert"
    assert checkpoint_family("microsoft/deberta-v3-large") == "deberta-v2"
    assert checkpoint_family("distilroberta-base") == "roberta"
    assert checkpoint_family("answerdotai/ModernBERT-base") == "modernbert"
    for name in ("camembert-base", "dbmdz/bert-base-german-cased-finetuned", "gpt2", "my-org/finetuned-model",
                 "microsoft/deberta-base", "google/mobilebert-uncased", None, ""):
        assert checkpoint_family(name) in (None, "bert"), name
    assert checkpoint_family("camembert-base") is None
    assert checkpoint_family("google/bert_uncased_L-4_H-256_A-4") == "bert"
    assert checkpoint_family("prajjwal1/bert-tiny") == "bert"
    assert checkpoint_family("vinai/bertweet-base") is None
    assert checkpoint_family("bert-basement") is None
    assert checkpoint_family("microsoft/deberta-base") is None
    assert split_class("XLMRobertaForTokenClassification") == ("xlm-roberta", "ForTokenClassification")
    assert split_class("CamembertForSequenceClassification") == (None, None)
    assert split_class("BertLMHeadModel") == ("bert", "LMHeadModel")


def test_unknown_structures_yield_no_setup_and_no_error():
    fs = setup_of("""
from transformers import Trainer, TrainingArguments
Trainer(**kw)
TrainingArguments(*a)
x = Trainer
trainer = x(model=get())
class T(Trainer(1)): pass
""")
    assert all(t.model is None for t in fs.trainers)
    assert fs.training_args[0].open_ended


def test_parameters_stand_for_what_the_one_caller_passes():
    fs = setup_of(HEAD + """
model = AutoModelForSequenceClassification.from_pretrained("gpt2")
def build(model, args):
    return Trainer(model=model, args=args)
def main():
    m = AutoModelForSequenceClassification.from_pretrained("roberta-base")
    a = TrainingArguments("o", gradient_accumulation_steps=4)
    t = build(m, args=a)
""")
    (t,) = fs.trainers
    assert t.model.class_name == "RobertaForSequenceClassification"
    assert t.args.get("gradient_accumulation_steps") == 4
    fs2 = setup_of(HEAD + """
model = AutoModelForSequenceClassification.from_pretrained("roberta-base")
def build(model):
    return Trainer(model=model, args=TrainingArguments("o", gradient_accumulation_steps=4))
build(x)
build(y)
""")
    assert fs2.trainers[0].model is None  # two callers: unknown, not the module-level `model`


def test_default_keyword_values_count_as_absent():
    fs = setup_of(HEAD + "t = Trainer(model=m, compute_loss_func=None, optimizers=(None, None), compute_metrics=None)\n")
    (t,) = fs.trainers
    assert t.compute_loss_func is None and t.optimizers is None and t.compute_metrics is None


def test_self_attribute_model():
    fs = setup_of(HEAD + """
class Pipeline:
    def __init__(self, name):
        self.model = AutoModelForSequenceClassification.from_pretrained("roberta-base")
    def train(self):
        args = TrainingArguments("o", gradient_accumulation_steps=2)
        self.trainer = Trainer(model=self.model, args=args)
""")
    (t,) = fs.trainers
    assert t.model.class_name == "RobertaForSequenceClassification"
    assert t.args.get("gradient_accumulation_steps") == 2
    fs2 = setup_of(HEAD + """
class Pipeline:
    def __init__(self):
        self.model = AutoModelForSequenceClassification.from_pretrained("roberta-base")
    def wrap(self):
        self.model = Wrapper(self.model)
    def train(self):
        Trainer(model=self.model, args=TrainingArguments("o", gradient_accumulation_steps=2))
""")
    assert fs2.trainers[0].model is None


def test_self_attribute_model_outside_a_trainer_reads_its_class_methods():
    """A LightningModule's ``self.model``: built, PEFT-wrapped, compiled and checkpointed in the methods of its class
    (collected although no HF Trainer trains it); another class's ``self.model`` calls are not its own."""
    fs = setup_of("""
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM
class Module:
    def __init__(self, name, compile_model=False):
        self.model = AutoModelForCausalLM.from_pretrained(name)
        self.model = get_peft_model(self.model, LoraConfig(r=8))
        if compile_model:
            self.model = torch.compile(self.model)
    def configure_model(self):
        self.model.gradient_checkpointing_enable()
class Other:
    def setup(self):
        self.model.enable_input_require_grads()
""")
    (m,) = fs.models
    assert m.var == "self.model" and m.peft and m.from_pretrained
    assert [c.method for c in m.checkpointing] == ["gradient_checkpointing_enable"]
    assert not m.input_require_grads  # Other.setup's self.model is another object
    # an unknown wrapper still makes the model unknown; torch.compile does not
    fs2 = setup_of("""
from transformers import AutoModelForCausalLM
class Module:
    def __init__(self, name):
        self.model = AutoModelForCausalLM.from_pretrained(name)
        self.model = Wrapper(self.model)
        self.model.gradient_checkpointing_enable()
""")
    assert fs2.models == []


def test_freezing_the_backbone_freezes_the_inputs():
    base = HEAD + "model = AutoModelForSequenceClassification.from_pretrained('bert-base-uncased')\n{loop}\nt = Trainer(model=model)\n"
    def frozen(loop):
        m = setup_of(base.format(loop=loop)).trainers[0].model
        return bool(m.frozen_inputs), m.frozen_any
    assert frozen("for p in model.base_model.parameters():\n    p.requires_grad = False") == (True, True)
    assert frozen("for p in model.bert.embeddings.parameters():\n    p.requires_grad = False") == (True, True)
    assert frozen("for n, p in model.named_parameters():\n    if 'layer.0.' in n:\n        p.requires_grad = False") == (False, True)
    assert frozen("for p in model.classifier.parameters():\n    p.requires_grad = False") == (False, True)


def test_requires_grad_false_on_the_backbone():
    src = HEAD + "model = AutoModelForSequenceClassification.from_pretrained('bert-base-uncased')\n" \
                 "model.bert.requires_grad_(False)\nt = Trainer(model=model)\n"
    assert setup_of(src).trainers[0].model.frozen_inputs


# ------------------------------------------------------------------- classes imported from the project (issue 14)
def _ctx_at(path: Path, src: str) -> FileContext:
    path.write_text(src)
    return FileContext(str(path), src, cst.parse_module(src), Settings(target_versions={"transformers": "5.24.0"}))


def test_trainer_and_arguments_classes_imported_from_the_project(tmp_path):
    (tmp_path / ".git").mkdir()
    pkg = tmp_path / "proj"
    (pkg / "train").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "train" / "__init__.py").write_text("from .trainers import MyTrainer\n")
    (pkg / "train" / "trainers.py").write_text(
        "import transformers\nfrom .base import Base\n\n"
        "class MyTrainer(Base):\n    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):\n"
        "        return model(**inputs).loss\n")
    (pkg / "train" / "base.py").write_text("from transformers import Trainer\n\nclass Base(Trainer):\n    pass\n")
    (pkg / "args.py").write_text(
        "from dataclasses import dataclass\nimport transformers\n\n"
        "@dataclass\nclass Args(transformers.TrainingArguments):\n    extra: int = 1\n")
    (pkg / "other.py").write_text("class NotATrainer:\n    pass\n")
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    fs = _ctx_at(scripts / "train.py",
                 "from proj.train import MyTrainer\nfrom proj.args import Args\nfrom proj.other import NotATrainer\n"
                 "args = Args(output_dir='o', gradient_accumulation_steps=4)\n"
                 "t = MyTrainer(model=None, args=args)\nu = NotATrainer()\n").setup
    assert [t.class_name for t in fs.trainers] == ["MyTrainer"]  # re-exported by the package, base in base.py
    assert "compute_loss" in fs.trainers[0].methods  # the project class's methods come along
    assert fs.trainers[0].args is not None and fs.trainers[0].args.get("gradient_accumulation_steps") == 4


def test_keywords_through_the_shared_evaluator_and_keyword_dicts(tmp_path):
    src = ("import argparse\nfrom transformers import TrainingArguments\n"
           "p = argparse.ArgumentParser()\np.add_argument('--no_ckpt', action='store_true')\na = p.parse_args()\n"
           "args = TrainingArguments(output_dir='o', gradient_checkpointing=not a.no_ckpt)\n"
           "def launch(build):\n"
           "    kw = {'output_dir': 'o', 'per_device_train_batch_size': 4, 'gradient_accumulation_steps': 2,\n"
           "          'learning_rate': 1e-4, 'logging_steps': 5, 'save_strategy': 'no', 'auto_find_batch_size': True}\n"
           "    return build(kw)\n")
    fs = _ctx_at(tmp_path / "t.py", src).setup
    cli, kw = fs.training_args
    assert cli.get("gradient_checkpointing") is True and "argparse" in cli.origin("gradient_checkpointing")
    assert kw.class_name.startswith("TrainingArguments keywords") and kw.open_ended
    assert kw.get("auto_find_batch_size") is True and kw.get("fp16") is UNKNOWN  # only what the dict says
