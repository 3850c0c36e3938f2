"""The resolved Hugging Face Trainer training set-up(s) of one file: ``ctx.setup`` (a :class:`FileSetup`).

What is resolved, statically and without importing anything:

* ``TrainingArguments(...)`` / ``Seq2SeqTrainingArguments(...)``: keyword literals, variables and module constants,
  ``**dict`` of a literal dict, argparse defaults (``args.x``), dataclass field defaults (``HfArgumentParser``
  dataclasses, including subclasses of ``TrainingArguments`` that change a default), attribute assignments after
  construction (``training_args.gradient_accumulation_steps = 4``), and a JSON/YAML arguments file given as a literal
  path (``parser.parse_json_file("args.json")``, ``parse_yaml_file``, ``parse_dict({...})``).
* ``Trainer(...)`` and its subclasses: model (or ``model_init``), ``compute_loss`` override, ``compute_loss_func``,
  ``compute_metrics``, ``preprocess_logits_for_metrics``, ``optimizers=(opt, sched)``, ``callbacks``, and the loss
  scaling switches ``trainer.model_accepts_loss_kwargs = False`` / class attribute ``loss_is_scaled_for_ga``.
* The model: its class (``AutoModelFor*.from_pretrained(name)`` mapped through the checkpoint name, a local
  ``config.json``, or a direct ``BertForMaskedLM(config)``), ``dtype``/``torch_dtype``, ``.half()``/``.to(dtype)``
  casts, PEFT wrapping, frozen parameters, checkpointing calls and their kwargs, ``enable_input_require_grads()``.

Everything uncertain is ``UNKNOWN`` (from ``bertlint.analysis.symbols``); rules stay silent on it.

The data classes here are plain and documented: ``explain`` and the memory simulator (``bertlint/memory``) read
them. The main entry is ``FileSetup.setups`` — a list of :class:`TrainingSetup`.
"""

from __future__ import annotations

import json
import os
import re
from bertlint._dataclass import dataclass, field
from functools import lru_cache
from typing import Any, Optional

import libcst as cst

from bertlint import _parse
from bertlint.analysis.walk import walk

from bertlint.analysis.symbols import UNKNOWN, call_name, code_of, dotted, kwarg, literal, positional
from bertlint.analysis.versions import repo_root as _repo_root

# ---------------------------------------------------------------------------------------------------------------
# known names

TRAINER_QUALNAMES = {
    "transformers.Trainer",
    "transformers.trainer.Trainer",
    "transformers.Seq2SeqTrainer",
    "transformers.trainer_seq2seq.Seq2SeqTrainer",
}
ARGS_QUALNAMES = {
    "transformers.TrainingArguments",
    "transformers.training_args.TrainingArguments",
    "transformers.Seq2SeqTrainingArguments",
    "transformers.training_args_seq2seq.Seq2SeqTrainingArguments",
}

# TrainingArguments defaults (5.24.0; unchanged for these fields since 4.45 unless noted) of the fields bertlint reads.
ARG_DEFAULTS: dict[str, Any] = {
    "per_device_train_batch_size": 8,
    "per_device_eval_batch_size": 8,
    "gradient_accumulation_steps": 1,
    "num_train_epochs": 3.0,
    "max_steps": -1,
    "learning_rate": 5e-05,
    "warmup_steps": 0,
    "max_grad_norm": 1.0,
    "fp16": False,
    "bf16": False,
    "gradient_checkpointing": False,
    "gradient_checkpointing_kwargs": None,
    "activation_checkpointing": False,
    "activation_checkpointing_kwargs": None,
    "auto_find_batch_size": False,
    "eval_strategy": "no",
    "eval_accumulation_steps": None,
    "prediction_loss_only": False,
    "batch_eval_metrics": False,
    "torch_empty_cache_steps": None,
    "logging_steps": 500,
    "save_steps": 500,
    "eval_steps": None,
    "ddp_find_unused_parameters": None,
    "deepspeed": None,
    "use_cpu": False,
    "dataloader_drop_last": False,
    "average_tokens_across_devices": True,
    "use_cache": False,
}

# TrainingArguments fields (a subset that dict-of-keywords detection reads; all exist in 4.30-5.24) and those specific
# to it (not common words of other configs)
_TA_SPECIFIC = {
    "output_dir", "per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps",
    "num_train_epochs", "max_steps", "warmup_steps", "warmup_ratio", "logging_steps", "save_steps", "eval_steps",
    "save_strategy", "eval_strategy", "evaluation_strategy", "logging_strategy", "save_total_limit",
    "gradient_checkpointing", "auto_find_batch_size", "dataloader_pin_memory", "dataloader_num_workers",
    "remove_unused_columns", "load_best_model_at_end", "metric_for_best_model", "report_to", "push_to_hub",
    "lr_scheduler_type", "max_grad_norm", "full_determinism", "do_train", "do_eval", "do_predict", "use_cpu",
    "dataloader_drop_last", "eval_accumulation_steps", "ddp_find_unused_parameters", "deepspeed", "fsdp",
    "fsdp_config", "overwrite_output_dir", "logging_dir", "bf16", "fp16", "optim", "group_by_length", "run_name",
}
_TA_FIELDS = _TA_SPECIFIC | {
    "learning_rate", "weight_decay", "seed", "adam_beta1", "adam_beta2", "adam_epsilon", "no_cuda", "local_rank",
    "label_names", "torch_compile", "tf32", "hub_model_id", "hub_token", "resume_from_checkpoint", "data_seed",
    "include_inputs_for_metrics", "prediction_loss_only", "disable_tqdm", "save_safetensors", "gradient_checkpointing_kwargs",
    "activation_checkpointing", "activation_checkpointing_kwargs", "torch_empty_cache_steps", "batch_eval_metrics",
    "average_tokens_across_devices", "use_cache", "accelerator_config", "neftune_noise_alpha", "label_smoothing_factor",
}

# BERT-family model types: class-name prefix and checkpoint-name patterns.
FAMILY_PREFIX = {
    "bert": "Bert",
    "roberta": "Roberta",
    "xlm-roberta": "XLMRoberta",
    "electra": "Electra",
    "deberta-v2": "DebertaV2",
    "albert": "Albert",
    "distilbert": "DistilBert",
    "modernbert": "ModernBert",
}
PREFIX_FAMILY = {v: k for k, v in FAMILY_PREFIX.items()}

HEADS = (
    "ForSequenceClassification",
    "ForTokenClassification",
    "ForMaskedLM",
    "ForQuestionAnswering",
    "ForMultipleChoice",
    "ForCausalLM",
    "ForPreTraining",
    "ForNextSentencePrediction",
    "LMHeadModel",
    "Model",
)

# AutoModelFor* -> head suffix
AUTO_HEADS = {
    "AutoModelForSequenceClassification": "ForSequenceClassification",
    "AutoModelForTokenClassification": "ForTokenClassification",
    "AutoModelForMaskedLM": "ForMaskedLM",
    "AutoModelForQuestionAnswering": "ForQuestionAnswering",
    "AutoModelForMultipleChoice": "ForMultipleChoice",
    "AutoModelForCausalLM": "ForCausalLM",
    "AutoModelForPreTraining": "ForPreTraining",
    "AutoModel": "Model",
}

TOKEN_LEVEL_HEADS = {"ForTokenClassification", "ForMaskedLM", "ForCausalLM", "LMHeadModel", "ForPreTraining"}


def checkpoint_family(name: str) -> Optional[str]:
    """Model type of a hub checkpoint name when the name says it unambiguously ("bert-base-uncased" -> "bert").
    None for anything else (a fine-tuned name that hides its architecture stays unknown)."""
    if not isinstance(name, str) or not name:
        return None
    last = name.rstrip("/").split("/")[-1].lower()
    org = name.split("/")[0].lower() if "/" in name else ""
    if re.match(r"^modernbert", last):
        return "modernbert"
    if re.match(r"^(mdeberta-v3|deberta-v3|deberta-v2)", last):
        return "deberta-v2"
    if re.match(r"^distilroberta", last):
        return "roberta"
    if re.match(r"^distilbert", last):
        return "distilbert"
    if re.match(r"^xlm-roberta", last):
        return "xlm-roberta"
    if re.match(r"^roberta-(base|large)", last):
        return "roberta"
    if re.match(r"^electra-(small|base|large)", last):
        return "electra"
    if re.match(r"^albert-(base|large|xlarge|xxlarge)", last):
        return "albert"
    if re.match(r"^bert-(base|large|tiny|mini|small|medium)\b", last) or re.match(r"^bert_(uncased|cased)_l-\d", last) \
            or org == "google-bert":
        return "bert"
    return None


def split_class(class_name: Optional[str]) -> tuple[Optional[str], Optional[str]]:
    """"BertForSequenceClassification" -> ("bert", "ForSequenceClassification"); unknown -> (None, None)."""
    if not class_name:
        return None, None
    for prefix in sorted(PREFIX_FAMILY, key=len, reverse=True):
        if class_name.startswith(prefix):
            head = class_name[len(prefix):]
            if head in HEADS:
                return PREFIX_FAMILY[prefix], head
    return None, None


def concrete_class(family: Optional[str], head: Optional[str]) -> Optional[str]:
    if not family or not head:
        return None
    prefix = FAMILY_PREFIX[family]
    if head == "ForCausalLM" and family == "bert":
        return "BertLMHeadModel"
    return prefix + head


# ---------------------------------------------------------------------------------------------------------------
# architectures


@lru_cache(maxsize=1)
def architectures() -> dict[str, dict]:
    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "architectures.json")
    try:
        with open(path, encoding="utf-8") as f:
            return dict(json.load(f).get("architectures", {}))
    except (OSError, ValueError):
        return {}


def architecture_for(checkpoint: Optional[str]) -> Optional[dict]:
    if not isinstance(checkpoint, str):
        return None
    key = checkpoint.rstrip("/").split("/")[-1].lower()
    table = architectures()
    for name, arch in table.items():
        if key == name or checkpoint in arch.get("aliases", []) or key in [a.split("/")[-1].lower() for a in arch.get("aliases", [])]:
            return dict(arch, name=name)
    return None


_BERT_DEFAULTS = {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "intermediate_size": 3072,
    "vocab_size": 30522, "max_position_embeddings": 512, "type_vocab_size": 2,
}


def bert_like_parameters(a: dict) -> Optional[int]:
    """Parameter count of a BERT/RoBERTa/ELECTRA-style encoder (embeddings + layers + pooler) from its config."""
    try:
        h = int(a["hidden_size"]); L = int(a["num_hidden_layers"]); i = int(a["intermediate_size"])
        v = int(a["vocab_size"]); p = int(a["max_position_embeddings"]); t = int(a.get("type_vocab_size", 2))
    except (KeyError, TypeError, ValueError):
        return None
    emb = (v + p + t) * h + 2 * h
    layer = 4 * (h * h + h) + 2 * h + (h * i + i) + (i * h + h) + 2 * h
    pooler = h * h + h
    return emb + L * layer + pooler


def read_local_config(directory: str) -> Optional[dict]:
    """A local model folder's ``config.json`` (never a download)."""
    path = os.path.join(directory, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def normalize_dtype(v: Any, qual: Optional[str] = None) -> Optional[str]:
    """torch.float16 / "float16" / torch.half -> "float16"; "auto" -> "auto"; unknown -> None."""
    text = qual or (v if isinstance(v, str) else None)
    if not text:
        return None
    t = text.split(".")[-1].lower()
    return {
        "float16": "float16", "half": "float16", "fp16": "float16",
        "bfloat16": "bfloat16", "bf16": "bfloat16",
        "float32": "float32", "float": "float32", "fp32": "float32",
        "auto": "auto",
    }.get(t)


# ---------------------------------------------------------------------------------------------------------------
# classes imported from the project: their bases, read from the project's own files (never executed)

TRAINER_BASE_RE = re.compile(r"^(transformers|trl)(\.[\w.]*)?\.\w*Trainer$")
ARGS_BASE_RE = re.compile(r"^(transformers(\.[\w.]*)?\.(Seq2Seq)?TrainingArguments|trl(\.[\w.]*)?\.\w*Config)$")
_FRAMEWORK_HEADS = ("transformers", "trl", "torch", "lightning", "pytorch_lightning", "accelerate", "deepspeed",
                    "peft", "diffusers", "datasets", "numpy", "sentence_transformers")
_MAX_PROJECT_FILE = 1_500_000




@lru_cache(maxsize=128)
def _parsed(path: str, mtime: float):
    """(module, SymbolTable, {local: (module, name, level)}) of a project file; None when unreadable."""
    try:
        if os.path.getsize(path) > _MAX_PROJECT_FILE:
            return None
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        module = _parse.parse_module(text)
    except Exception:
        return None
    from bertlint.analysis import symbols as _symbols

    return module, _symbols.build(module), _import_map(module)


def _import_map(module: cst.Module) -> dict:
    """``from a.b import C as D`` / ``from .x import C``: {"D": ("a.b", "C", 0)}, {"C": ("x", "C", 1)} (top level and
    one level of ``try`` / ``if``)."""
    out: dict = {}

    def scan(stmts) -> None:
        for st in stmts:
            if isinstance(st, cst.SimpleStatementLine):
                for small in st.body:
                    if isinstance(small, cst.ImportFrom) and not isinstance(small.names, cst.ImportStar):
                        mod = dotted(small.module) if small.module is not None else ""
                        level = len(small.relative)
                        for a in small.names:
                            name = dotted(a.name) or ""
                            local = a.asname.name.value if a.asname is not None and isinstance(
                                a.asname.name, cst.Name) else name
                            out[local] = (mod or "", name, level)
            elif isinstance(st, (cst.Try, cst.If)) and isinstance(st.body, cst.IndentedBlock):
                scan(st.body.body)

    scan(module.body)
    return out


def _module_file(base_dir: str, module: str, level: int) -> Optional[str]:
    """The project file of ``module`` imported from a file in ``base_dir`` (``level`` dots for a relative import):
    searched from ``base_dir`` up to the repository root; None for anything that is not a project file."""
    parts = [p for p in module.split(".") if p]
    if level == 0 and (not parts or parts[0] in _FRAMEWORK_HEADS):
        return None
    if level > 0:
        d = base_dir
        for _ in range(level - 1):
            d = os.path.dirname(d)
        dirs = [d]
    else:
        dirs, cur = [], base_dir
        root = _repo_root(base_dir)
        for _ in range(12):
            dirs.append(cur)
            if root is None or cur == root:
                break
            parent = os.path.dirname(cur)
            if parent == cur:
                break
            cur = parent
        for sub in ("src",):
            if root is not None:
                dirs.append(os.path.join(root, sub))
    for d in dirs:
        base = os.path.join(d, *parts) if parts else d
        for cand in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(cand):
                return cand
    return None


def project_class(base_dir: str, module: str, name: str, level: int = 0, depth: int = 0):
    """(ClassDef, SymbolTable, import map, folder) of class ``name`` defined in the project module ``module``
    (following one re-export such as ``from .trainer import MyTrainer`` in a package ``__init__``)."""
    if depth > 4:
        return None
    path = _module_file(base_dir, module, level)
    if path is None:
        return None
    from bertlint.analysis.project import _note

    _note(os.path.abspath(path))  # a dependency of the cached result (read now or parsed earlier in the process)
    try:
        got = _parsed(os.path.abspath(path), os.stat(path).st_mtime)
    except OSError:
        return None
    if got is None:
        return None
    _mod, table, imap = got
    cls = table.classes.get(name)
    folder = os.path.dirname(os.path.abspath(path))
    if cls is not None:
        return cls, table, imap, folder
    if name in imap:
        m, n, lv = imap[name]
        return project_class(folder, m, n, lv, depth + 1)
    return None


def project_chain(base_dir: str, table, imap: dict, cls: cst.ClassDef, depth: int = 0) -> list:
    """``cls`` and the classes it derives from in this file and in the project's files, nearest first."""
    out = [cls]
    if depth > 8:
        return out
    for b in cls.bases:
        if b.keyword is not None:
            continue
        d = dotted(b.value) or ""
        q = table.qualname(b.value)
        if q is None and d in table.classes and table.classes[d] is not cls:
            out.extend(project_chain(base_dir, table, imap, table.classes[d], depth + 1))
            continue
        head = d.split(".")[0]
        found = None
        if head in imap and "." not in d:
            m, n, lv = imap[head]
            found = project_class(base_dir, m, n, lv)
        elif q and "." in q and q.split(".")[0] not in _FRAMEWORK_HEADS:
            mod, _, n = q.rpartition(".")
            found = project_class(base_dir, mod, n, 0)
        if found is not None:
            pcls, ptable, pimap, pdir = found
            out.extend(project_chain(pdir, ptable, pimap, pcls, depth + 1))
    return out


def framework_base(base_dir: str, table, imap: dict, cls: cst.ClassDef, pattern, depth: int = 0) -> Optional[str]:
    """The framework class (its qualified name) that ``cls``'s bases reach and that ``pattern`` matches, through the
    file's own classes and classes imported from the project's files; None when none does (or it cannot be read)."""
    if depth > 8:
        return None
    for b in cls.bases:
        if b.keyword is not None:
            continue
        q = table.qualname(b.value)
        d = dotted(b.value) or ""
        if q and pattern.match(q):
            return q
        head = d.split(".")[0]
        if q is None and d in table.classes and table.classes[d] is not cls:
            got = framework_base(base_dir, table, imap, table.classes[d], pattern, depth + 1)
            if got:
                return got
            continue
        if head in imap and "." not in d:
            m, n, lv = imap[head]
            found = project_class(base_dir, m, n, lv)
        elif q and "." in q and q.split(".")[0] not in _FRAMEWORK_HEADS:
            mod, _, n = q.rpartition(".")
            found = project_class(base_dir, mod, n, 0)
        else:
            found = None
        if found is not None:
            pcls, ptable, pimap, pdir = found
            got = framework_base(pdir, ptable, pimap, pcls, pattern, depth + 1)
            if got:
                return got
    return None


# ---------------------------------------------------------------------------------------------------------------
# data classes


@dataclass
class Setting:
    """One resolved TrainingArguments field."""

    value: Any  # UNKNOWN when not statically known
    origin: str  # "keyword", "argparse default of --x", "dataclass default", "args.json", "attribute assignment"
    node: Optional[cst.CSTNode] = None  # where it is written (the keyword Arg), for reports


@dataclass
class TrainingArgs:
    """A ``TrainingArguments`` object of the script."""

    node: Optional[cst.CSTNode]  # the constructor call, or the parse call
    var: Optional[str] = None
    func: Any = None
    class_name: str = "TrainingArguments"
    explicit: dict[str, Setting] = field(default_factory=dict)
    open_ended: bool = False  # an unresolved **splat: fields not in ``explicit`` are unknown
    runtime_cli: bool = False  # values parsed from the command line at run time (defaults apply if not given)
    source_file: Optional[str] = None  # JSON/YAML file the values came from
    reads: dict = field(default_factory=dict)  # field -> first node reading `<var>.<field>` (the script uses it)
    # the fields the project's own classes between the constructor and transformers' class declare themselves
    # (``class MyArgs(TrainingArguments): use_cache: bool = False``): such a keyword is the subclass's, whatever the
    # transformers version; None when the class is the project's but its definition could not be read
    declared: Optional[frozenset] = frozenset()

    def setting(self, name: str) -> Optional[Setting]:
        return self.explicit.get(name)

    def get(self, name: str) -> Any:
        """The value the Trainer will see: explicit, else the TrainingArguments default; UNKNOWN when it depends on
        something not visible (an unresolved ``**splat`` or command-line parsing)."""
        s = self.explicit.get(name)
        if s is not None:
            return s.value
        if self.open_ended or self.runtime_cli:
            return UNKNOWN
        return ARG_DEFAULTS.get(name, UNKNOWN)

    def default(self, name: str) -> Any:
        return ARG_DEFAULTS.get(name, UNKNOWN)

    def int(self, name: str) -> Optional[int]:
        v = self.get(name)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, float) and not v.is_integer():
            return None
        return int(v)

    def keyword_node(self, name: str) -> Optional[cst.CSTNode]:
        s = self.explicit.get(name)
        return s.node if s is not None and s.node is not None else None

    def origin(self, name: str) -> str:
        s = self.explicit.get(name)
        if s is not None:
            return s.origin
        if self.open_ended:
            return "unknown (**kwargs not resolved)"
        if self.runtime_cli:
            return f"command line (default {ARG_DEFAULTS.get(name)!r})"
        return "TrainingArguments default"


@dataclass
class CheckpointCall:
    """``model.gradient_checkpointing_enable(...)`` / ``activation_checkpointing_enable(...)``."""

    node: cst.Call
    method: str
    kwargs: Any  # dict, None (not given) or UNKNOWN
    kwargs_node: Optional[cst.CSTNode]
    row: int  # position in source order (comparable with FileSetup.order_of), not a line number


@dataclass
class ModelInfo:
    """The model a Trainer trains (or any model object the script builds)."""

    node: Optional[cst.CSTNode]  # the creating call
    var: Optional[str] = None
    declared_class: Optional[str] = None  # as written: "AutoModelForSequenceClassification", "BertForMaskedLM"
    class_name: Optional[str] = None  # the concrete class when known: "BertForSequenceClassification"
    family: Optional[str] = None  # "bert", "roberta", ...
    head: Optional[str] = None  # "ForSequenceClassification"
    checkpoint: Optional[str] = None
    architecture: Optional[dict] = None  # hidden_size, num_hidden_layers, ..., parameters
    architecture_source: Optional[str] = None  # "table: bert-base-uncased", "local config.json", "BertConfig(...)"
    dtype: Optional[str] = None  # load dtype: float16 | bfloat16 | float32 | auto | None (not given)
    dtype_node: Optional[cst.CSTNode] = None
    cast: Optional[str] = None  # later cast: float16 | bfloat16 | float32
    cast_node: Optional[cst.CSTNode] = None
    peft: bool = False
    peft_node: Optional[cst.CSTNode] = None
    kbit: bool = False
    kbit_prep: Optional[cst.Call] = None  # prepare_model_for_kbit_training(...) / prepare_model_for_int8_training(...)
    frozen_inputs: list = field(default_factory=list)  # nodes that freeze embeddings / input-side parameters
    frozen_any: bool = False
    checkpointing: list = field(default_factory=list)  # CheckpointCall
    input_require_grads: bool = False
    use_cache_true: Optional[cst.CSTNode] = None
    is_decoder: Optional[bool] = None
    from_pretrained: bool = False
    local_class: Optional[cst.ClassDef] = None  # a model class defined in the script

    @property
    def forward(self) -> Optional[cst.FunctionDef]:
        """``forward`` of a model class of the script (None for library classes)."""
        if self.local_class is None or not isinstance(self.local_class.body, cst.IndentedBlock):
            return None
        for stmt in self.local_class.body.body:
            if isinstance(stmt, cst.FunctionDef) and stmt.name.value == "forward":
                return stmt
        return None

    @property
    def weights_dtype(self) -> Optional[str]:
        return self.cast or (self.dtype if self.dtype != "auto" else None)

    @property
    def parameters(self) -> Optional[int]:
        a = self.architecture or {}
        n = a.get("parameters")
        return int(n) if isinstance(n, (int, float)) else None


@dataclass
class TrainerInfo:
    """One ``Trainer(...)`` construction."""

    node: cst.Call
    stmt: Optional[cst.SimpleStatementLine] = None
    var: Optional[str] = None
    func: Any = None
    class_name: str = "Trainer"
    subclass: Optional[cst.ClassDef] = None  # the user's subclass, if any
    methods: dict = field(default_factory=dict)  # overridden method name -> FunctionDef (whole subclass chain)
    args: Optional[TrainingArgs] = None
    args_expr: Optional[cst.BaseExpression] = None
    model: Optional[ModelInfo] = None
    model_expr: Optional[cst.BaseExpression] = None
    compute_loss_func: Optional[cst.BaseExpression] = None
    compute_metrics: Optional[cst.BaseExpression] = None
    preprocess_logits_for_metrics: Optional[cst.BaseExpression] = None
    optimizers: Optional[cst.BaseExpression] = None
    callbacks: Optional[cst.BaseExpression] = None
    loss_scaling_override: Optional[str] = None  # text of the switch that makes the Trainer divide, if any

    @property
    def compute_loss(self) -> Optional[cst.FunctionDef]:
        return self.methods.get("compute_loss")


@dataclass
class TrainingSetup:
    """A training set-up for ``explain`` and the memory simulator."""

    framework: str  # "transformers.Trainer"
    node: cst.CSTNode
    trainer: Optional[TrainerInfo]
    args: Optional[TrainingArgs]
    model: Optional[ModelInfo]

    @property
    def micro_batch(self) -> Any:
        return self.args.get("per_device_train_batch_size") if self.args else UNKNOWN

    @property
    def accumulation(self) -> Any:
        return self.args.get("gradient_accumulation_steps") if self.args else UNKNOWN

    @property
    def precision(self) -> str:
        a = self.args
        if a is None:
            return "unknown"
        fp16, bf16 = a.get("fp16"), a.get("bf16")
        wd = self.model.weights_dtype if self.model else None
        if fp16 is True and bf16 is True:
            return "conflicting (fp16 and bf16)"
        if fp16 is True:
            return "fp16 mixed precision" + (f" on {wd} weights" if wd in ("float16", "bfloat16") else "")
        if bf16 is True:
            return "bf16 mixed precision" + (f" on {wd} weights" if wd in ("float16", "bfloat16") else "")
        if fp16 is UNKNOWN or bf16 is UNKNOWN:
            return "unknown"
        return f"{wd or 'float32'} (no mixed precision)"

    @property
    def checkpointing(self) -> Any:
        """True / False / UNKNOWN."""
        a = self.args
        vals = []
        if a is not None:
            vals = [a.get("gradient_checkpointing"), a.get("activation_checkpointing")]
        if self.model is not None and self.model.checkpointing:
            return True
        if any(v is True for v in vals):
            return True
        if any(v is UNKNOWN for v in vals):
            return UNKNOWN
        return False

    @property
    def checkpointing_kwargs(self) -> Any:
        if self.model is not None and self.model.checkpointing:
            return self.model.checkpointing[-1].kwargs
        a = self.args
        if a is None:
            return None
        for name in ("activation_checkpointing_kwargs", "gradient_checkpointing_kwargs"):
            s = a.setting(name)
            if s is not None:
                return s.value
        return a.get("gradient_checkpointing_kwargs")


@dataclass
class FileSetup:
    trainers: list = field(default_factory=list)  # TrainerInfo
    training_args: list = field(default_factory=list)  # TrainingArgs
    models: list = field(default_factory=list)  # ModelInfo (every model object found)
    disables_loss_kwargs: Optional[str] = None  # the first text that switches the Trainer's own division on
    trainer_classes: dict = field(default_factory=dict)  # user subclass name -> {method name: FunctionDef}
    order: dict = field(default_factory=dict)  # id(node) -> source order of calls and small statements

    def order_of(self, node) -> int:
        """Source order of a call or small statement (cheaper than positions); -1 if unknown."""
        return self.order.get(id(node), -1)

    @property
    def setups(self) -> list:
        out = [TrainingSetup("transformers.Trainer", t.node, t, t.args, t.model) for t in self.trainers]
        used = {id(t.args) for t in self.trainers if t.args is not None}
        for a in self.training_args:  # TrainingArguments without a visible Trainer
            if id(a) not in used and a.node is not None:
                out.append(TrainingSetup("transformers.Trainer", a.node, None, a, None))
        return out


# ---------------------------------------------------------------------------------------------------------------
# the walk


@dataclass
class CallSite:
    call: cst.Call
    func: Any
    stmt: Optional[cst.SimpleStatementLine]
    targets: list  # assignment targets when the call is the whole value of an assignment: ["x"] / ["a", "b"]
    is_expr: bool  # an expression statement `x.half()`


class _Collector(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list[CallSite] = []
        self.fors: list[tuple[cst.For, Any]] = []
        self._func: list = []
        self._stmt: list = []
        self._targets: dict[int, list] = {}
        self._exprs: set[int] = set()
        self.order: dict[int, int] = {}  # id(node) -> position in source order (calls and small statements)

    def visit_FunctionDef(self, node):
        self._func.append(node)

    def leave_FunctionDef(self, node):
        self._func.pop()

    def visit_SimpleStatementLine(self, node):
        self._stmt.append(node)
        for small in node.body:
            self.order[id(small)] = len(self.order)
            if isinstance(small, (cst.Assign, cst.AnnAssign)) and isinstance(small.value, cst.Call):
                targets = []
                tlist = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                for t in tlist:
                    if isinstance(t, (cst.Tuple, cst.List)):
                        targets.extend(dotted(e.value) or "" for e in t.elements)
                    else:
                        targets.append(dotted(t) or "")
                self._targets[id(small.value)] = targets
            elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                self._exprs.add(id(small.value))

    def leave_SimpleStatementLine(self, node):
        self._stmt.pop()

    def visit_For(self, node):
        self.fors.append((node, self._func[-1] if self._func else None))

    def visit_Call(self, node):
        self.order[id(node)] = len(self.order)
        self.calls.append(
            CallSite(
                node,
                self._func[-1] if self._func else None,
                self._stmt[-1] if self._stmt else None,
                self._targets.get(id(node), []),
                id(node) in self._exprs,
            )
        )


class _SharedCollector:
    """What ``_Collector`` finds, read from the walks every lint makes anyway (``ctx.evalflow``: calls and
    ``for`` loops in pre-order, their enclosing function, parents, pre-order numbers; ``ctx.index``: the
    statement lines) instead of a third walk of the whole tree. Same calls, loops, targets and ``order``
    numbering: the statement lines and calls merged in pre-order, a line numbering its small statements."""

    def __init__(self, ctx) -> None:
        flow = ctx.evalflow
        parent, pre, scope = flow.parent.d, flow.order.d, flow.scope.d
        Line = cst.SimpleStatementLine
        self.fors = [(n, scope.get(id(n))) for n in flow.loops if type(n) is cst.For]
        targets: dict[int, list] = {}
        exprs: set[int] = set()
        items = []
        for line in ctx.index.of(Line):
            items.append((pre[id(line)], line))
            for small in line.body:
                if isinstance(small, (cst.Assign, cst.AnnAssign)) and isinstance(small.value, cst.Call):
                    tg = []
                    tlist = [t.target for t in small.targets] if isinstance(small, cst.Assign) else [small.target]
                    for t in tlist:
                        if isinstance(t, (cst.Tuple, cst.List)):
                            tg.extend(dotted(e.value) or "" for e in t.elements)
                        else:
                            tg.append(dotted(t) or "")
                    targets[id(small.value)] = tg
                elif isinstance(small, cst.Expr) and isinstance(small.value, cst.Call):
                    exprs.add(id(small.value))
        for c in flow.calls:
            items.append((pre[id(c)], c))
        items.sort(key=lambda it: it[0])
        order: dict[int, int] = {}
        calls: list[CallSite] = []
        for _, node in items:
            if type(node) is Line:
                for small in node.body:
                    order[id(small)] = len(order)
                continue
            order[id(node)] = len(order)
            stmt = parent.get(id(node))
            while stmt is not None and type(stmt) is not Line:
                stmt = parent.get(id(stmt))
            calls.append(CallSite(node, scope.get(id(node)), stmt, targets.get(id(node), []), id(node) in exprs))
        self.calls = calls
        self.order = order


_FREEZE_RE = re.compile(r"requires_grad\s*=\s*False|requires_grad_\(\s*False\s*\)")


class _Builder:
    def __init__(self, ctx) -> None:
        self.ctx = ctx
        self.t = ctx.symbols
        self.r = ctx.resolver
        self.col = _SharedCollector(ctx)
        self.dir = os.path.dirname(os.path.abspath(ctx.filename)) if ctx.filename not in ("-", "<stdin>") else "."
        self.by_call: dict[int, CallSite] = {id(c.call): c for c in self.col.calls}
        self._resolving: set[str] = set()
        self._trainer_memo: dict[str, Optional[tuple]] = {}  # dotted name -> trainer_class
        self._args_class_memo: dict[str, bool] = {}  # dotted name -> is_args_class

    # ---- naming
    def qual(self, expr: cst.BaseExpression) -> Optional[str]:
        q = self.t.qualname(expr)
        if q:
            return q
        return None

    def is_transformers_name(self, expr: cst.BaseExpression, qualnames: set, bare: set) -> bool:
        q = self.qual(expr)
        if q in qualnames:
            return True
        d = dotted(expr)
        return q is None and d in bare and self.t.uses("transformers") and d not in self.t.classes

    def trainer_class(self, expr: cst.BaseExpression) -> Optional[tuple[str, Optional[cst.ClassDef]]]:
        """(class name, user subclass or None) when ``expr`` names transformers' Trainer or a subclass of it (a trl
        trainer, a class of this file, or a class imported from the project whose bases reach one). A function of
        ``dotted(expr)`` alone (None when it is None), so asked once per name (``build`` asks it of every call)."""
        d = dotted(expr)
        if d is None:
            return None
        memo = self._trainer_memo
        if d in memo:
            return memo[d]
        got = memo[d] = self._trainer_class(expr)
        return got

    def _trainer_class(self, expr: cst.BaseExpression) -> Optional[tuple[str, Optional[cst.ClassDef]]]:
        if self.is_transformers_name(expr, TRAINER_QUALNAMES, {"Trainer", "Seq2SeqTrainer"}):
            return dotted(expr) or "Trainer", None
        d = dotted(expr)
        if d and d in self.t.classes and self._subclasses_trainer(d, 0):
            return d, self.t.classes[d]
        q = self.qual(expr)
        if q and TRAINER_BASE_RE.match(q):
            return d or q.split(".")[-1], None
        if d and d not in self.t.classes and d.split(".")[-1][:1].isupper():
            memo = self.__dict__.setdefault("_args_memo", {})
            key = ("trainer", d)
            if key not in memo:
                memo[key] = self._project_base(expr, TRAINER_BASE_RE) is not None
            if memo[key]:
                return d, None
        return None

    def _imports_map(self) -> dict:
        got = self.__dict__.get("_imap")
        if got is None:
            got = _import_map(self.ctx.module)
            self.__dict__["_imap"] = got
        return got

    def _project_base(self, expr: cst.BaseExpression, pattern) -> Optional[str]:
        """The framework class an imported project class (``expr``) derives from, read from its file."""
        d = dotted(expr) or ""
        imap = self._imports_map()
        head = d.split(".")[0]
        found = None
        if head in imap and "." not in d:
            m, n, lv = imap[head]
            found = project_class(self.dir, m, n, lv)
        else:
            q = self.qual(expr)
            if q and "." in q and q.split(".")[0] not in _FRAMEWORK_HEADS:
                mod, _, n = q.rpartition(".")
                found = project_class(self.dir, mod, n, 0)
        if found is None:
            return None
        pcls, ptable, pimap, pdir = found
        return framework_base(pdir, ptable, pimap, pcls, pattern)

    def project_class_of(self, expr: cst.BaseExpression):
        """(ClassDef, table, import map, folder) of a class imported from the project (``expr`` names it)."""
        d = dotted(expr) or ""
        imap = self._imports_map()
        head = d.split(".")[0]
        if head in imap and "." not in d:
            m, n, lv = imap[head]
            return project_class(self.dir, m, n, lv)
        q = self.qual(expr)
        if q and "." in q and q.split(".")[0] not in _FRAMEWORK_HEADS:
            mod, _, n = q.rpartition(".")
            return project_class(self.dir, mod, n, 0)
        return None

    def base_reaches(self, cls: cst.ClassDef, pattern) -> Optional[str]:
        """The framework class ``cls`` (a class of this file) derives from, through this file and the project."""
        return framework_base(self.dir, self.t, self._imports_map(), cls, pattern)

    def _subclasses_trainer(self, name: str, depth: int) -> bool:
        if depth > 8:
            return False
        cls = self.t.classes.get(name)
        if cls is None:
            return False
        for b in cls.bases:
            if self.is_transformers_name(b.value, TRAINER_QUALNAMES, {"Trainer", "Seq2SeqTrainer"}):
                return True
            bd = dotted(b.value)
            if bd and bd in self.t.classes and bd != name and self._subclasses_trainer(bd, depth + 1):
                return True
        return depth == 0 and self.base_reaches(cls, TRAINER_BASE_RE) is not None

    def _class_chain(self, name: str) -> list[cst.ClassDef]:
        out, seen = [], set()
        while name and name in self.t.classes and name not in seen:
            seen.add(name)
            cls = self.t.classes[name]
            out.append(cls)
            nxt = None
            for b in cls.bases:
                bd = dotted(b.value)
                if bd and bd in self.t.classes:
                    nxt = bd
                    break
            name = nxt
        return out

    def is_args_class(self, expr: cst.BaseExpression) -> bool:
        """``expr`` names TrainingArguments or a subclass (of this file, trl's, the project's). A function of
        ``dotted(expr)`` alone (False when it is None), so asked once per name (``build`` asks it of every call)."""
        d = dotted(expr)
        if d is None:
            return False
        memo = self._args_class_memo
        got = memo.get(d)
        if got is None:
            got = memo[d] = self._is_args_class(expr)
        return got

    def _is_args_class(self, expr: cst.BaseExpression) -> bool:
        if self.is_transformers_name(expr, ARGS_QUALNAMES, {"TrainingArguments", "Seq2SeqTrainingArguments"}):
            return True
        d = dotted(expr)
        if d and d in self.t.classes:
            for cls in self._class_chain(d):
                for b in cls.bases:
                    if self.is_transformers_name(b.value, ARGS_QUALNAMES, {"TrainingArguments", "Seq2SeqTrainingArguments"}):
                        return True
            return self.base_reaches(self.t.classes[d], ARGS_BASE_RE) is not None
        q = self.qual(expr)
        if q and ARGS_BASE_RE.match(q):
            return True  # trl's SFTConfig / DPOConfig ... are TrainingArguments
        if d and isinstance(expr, (cst.Name, cst.Attribute)) and d.split(".")[-1][:1].isupper():
            key = ("args", d)
            memo = self.__dict__.setdefault("_args_memo", {})
            if key not in memo:
                memo[key] = self._project_base(expr, ARGS_BASE_RE) is not None
            return memo[key]
        return False

    # ---- TrainingArguments
    def args_from_call(self, site: CallSite) -> TrainingArgs:
        call = site.call
        name = dotted(call.func) or "TrainingArguments"
        ta = TrainingArgs(call, site.targets[0] if len(site.targets) == 1 and site.targets[0] else None, site.func,
                          class_name=name.split(".")[-1])
        # defaults of a user subclass of TrainingArguments
        if name in self.t.classes:
            self._subclass_defaults(name, ta)
        ta.declared = self._declared_fields(call.func)
        for a in call.args:
            if a.keyword is not None:
                v = self.r.value(a.value, site.func)
                origin = self._origin(a.value)
                if v is UNKNOWN:  # `not args.x`, `a or b`, ...: the shared value evaluator, with its source
                    f = self._fact(a.value, site.func)
                    if f is not None and f.known:
                        v = f.value
                        origin = f.source if f.kind != "literal" else f"keyword (`{code_of(a.value)}`)"
                ta.explicit[a.keyword.value] = Setting(v, origin, a)
            elif a.star == "**":
                d = self.r.value(a.value, site.func)
                if isinstance(d, dict):
                    for k, v in d.items():
                        if isinstance(k, str):
                            ta.explicit[k] = Setting(v, f"**{code_of(a.value)}", a)
                else:
                    items = self._fact_items(a.value, site.func, partial=True)
                    if items is None:
                        ta.open_ended = True
                    else:
                        if "**" in items:  # `{**other, "k": v}`: the keys it names are read, the rest is unknown
                            ta.open_ended = True
                        for k, f in items.items():
                            if k == "**":
                                continue
                            # the key's own expression when it is in this file (rules read what it is made of)
                            node = f.node if isinstance(f.node, cst.BaseExpression) and \
                                self.ctx.index.parent(f.node) is not None else a
                            ta.explicit[k] = Setting(f.value, f"**{code_of(a.value)} key {k!r} ({f.source})"
                                                     if f.kind != "literal" else f"**{code_of(a.value)}", node)
            elif a.star == "*":
                ta.open_ended = True
        return ta

    def _fact(self, expr, func):
        """``Resolver.fact`` (the shared evaluator: `not`, `and`/`or`, argparse store_true, dataclass fields, each
        with its source); None when it is not available or fails."""
        fact = getattr(self.r, "fact", None)
        if fact is None:
            return None
        try:
            return fact(expr, func)
        except Exception:
            return None

    def _fact_items(self, expr, func, partial: bool = False):
        """Per-key facts of a ``**dict`` argument; None when not readable (or a key is not statically known). With
        ``partial``, a dict that also spreads something unreadable gives its readable keys plus a ``"**"`` entry."""
        ck = getattr(self.r, "call_kwargs", None)
        if ck is None:
            return None
        try:
            items = ck(cst.Call(func=cst.Name("f"), args=[cst.Arg(value=expr, star="**")]), func)
        except Exception:
            return None
        if "**" in items and not (partial and len(items) > 1):
            return None
        return items

    def _declared_fields(self, func: cst.BaseExpression) -> Optional[frozenset]:
        """The field names the project's classes in the constructor's class chain declare (annotated class-body
        names, with or without a default), through this file and the project's modules; empty for transformers' (or
        another framework's) own class; None for a class of the project whose definition is not readable."""
        d = dotted(func) or ""
        chain = None
        if d in self.t.classes:
            chain = project_chain(self.dir, self.t, self._imports_map(), self.t.classes[d])
        elif not self.is_transformers_name(func, ARGS_QUALNAMES, {"TrainingArguments", "Seq2SeqTrainingArguments"}):
            found = self.project_class_of(func)
            if found is not None:
                chain = project_chain(found[3], found[1], found[2], found[0])
            else:
                q = self.qual(func)
                if not (q and q.split(".")[0] in _FRAMEWORK_HEADS):
                    return None
        if chain is None:
            return frozenset()
        names = set()
        for cls in chain:
            body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
            for stmt in body:
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name):
                            names.add(small.target.value)
        return frozenset(names)

    def _subclass_defaults(self, name: str, ta: TrainingArgs) -> None:
        for cls in reversed(self._class_chain(name)):
            body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
            for stmt in body:
                if not isinstance(stmt, cst.SimpleStatementLine):
                    continue
                for small in stmt.body:
                    if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value:
                        val = small.value
                        if isinstance(val, cst.Call) and (call_name(val) or "").split(".")[-1] == "field":
                            val = kwarg(val, "default")
                            if val is None:
                                continue
                        ta.explicit[small.target.value] = Setting(
                            self.r.value(val, None), f"default of the `{cls.name.value}` dataclass field", small)

    def _origin(self, expr: cst.BaseExpression) -> str:
        if literal(expr) is not UNKNOWN:
            return "keyword"
        if isinstance(expr, cst.Attribute) and expr.attr.value in self.t.argparse:
            return f"argparse default of {self._option(expr.attr.value)}"
        if isinstance(expr, cst.Attribute) and expr.attr.value in self.t.dataclass_fields:
            return f"dataclass default of `{expr.attr.value}`"
        d = dotted(expr)
        if d:
            return f"keyword (`{d}`)"
        return "keyword"

    def _option(self, dest: str) -> str:
        """The command-line option as written (``--grad-acc``) for an argparse destination (``grad_acc``)."""
        opt = self.t.argparse.get(dest)
        if opt is not None:
            for a in opt.call.args:
                v = literal(a.value) if a.keyword is None else None
                if isinstance(v, str) and v.startswith("--"):
                    return v
        return f"--{dest}"

    def _parser_args_class(self, call: cst.Call) -> Optional[tuple[int, list]]:
        """(index of the TrainingArguments class, the dataclass types) of an ``HfArgumentParser(...)`` call."""
        first = positional(call, 0) or kwarg(call, "dataclass_types")
        if first is None:
            return None
        elems = [e.value for e in first.elements] if isinstance(first, (cst.Tuple, cst.List)) else [first]
        for i, e in enumerate(elems):
            if self.is_args_class(e):
                return i, elems
        return None

    def hf_parser_args(self) -> list[TrainingArgs]:
        """``HfArgumentParser((ModelArguments, TrainingArguments))`` + ``parse_*`` calls."""
        out = []
        parsers: dict[str, int] = {}  # parser var -> index of the TrainingArguments class in its tuple
        classes_of: dict[str, list] = {}
        for site in self.col.calls:
            n = call_name(site.call) or ""
            if n.split(".")[-1] != "HfArgumentParser" or len(site.targets) != 1:
                continue
            found = self._parser_args_class(site.call)
            if found is not None:
                parsers[site.targets[0]], classes_of[site.targets[0]] = found
        inline: dict[int, tuple[int, list]] = {}  # HfArgumentParser(X).parse_...(): the parser is never named
        for site in self.col.calls:
            f = site.call.func
            if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Call) and \
                    (call_name(f.value) or "").split(".")[-1] == "HfArgumentParser":
                found = self._parser_args_class(f.value)
                if found is not None:
                    inline[id(site.call)] = found
        if not parsers and not inline:
            return out
        for site in self.col.calls:
            f = site.call.func
            if not isinstance(f, cst.Attribute):
                continue
            if id(site.call) in inline:
                idx, elems = inline[id(site.call)]
            elif dotted(f.value) in parsers:
                idx, elems = parsers[dotted(f.value)], classes_of[dotted(f.value)]
            else:
                continue
            method = f.attr.value
            if not method.startswith("parse_"):
                continue
            targets = site.targets
            var = None
            remaining = literal(kwarg(site.call, "return_remaining_strings")) is True
            if len(targets) == len(elems) or (remaining and len(targets) == len(elems) + 1):
                var = targets[idx] or None  # (return_remaining_strings=True adds the leftover strings last)
            elif len(targets) == 1 and len(elems) == 1:
                var = targets[0] or None
            cls_expr = elems[idx]
            ta = TrainingArgs(site.call, var, site.func, class_name=dotted(cls_expr) or "TrainingArguments")
            cname = dotted(cls_expr)
            if cname and cname in self.t.classes:
                self._subclass_defaults(cname, ta)
            ta.declared = self._declared_fields(cls_expr)
            if method in ("parse_json_file", "parse_yaml_file"):
                arg = positional(site.call, 0) or kwarg(site.call, "json_file") or kwarg(site.call, "yaml_file")
                path = self.r.value(arg, site.func)
                if isinstance(path, str):
                    data = self._load_args_file(path)
                    if isinstance(data, dict):
                        ta.source_file = path
                        for k, v in data.items():
                            ta.explicit[str(k)] = Setting(v, os.path.basename(path), site.call)
                    else:
                        ta.open_ended = True
                else:
                    ta.open_ended = True
            elif method == "parse_dict":
                d = self.r.value(positional(site.call, 0) or kwarg(site.call, "args"), site.func)
                if isinstance(d, dict):
                    for k, v in d.items():
                        ta.explicit[str(k)] = Setting(v, "parse_dict", site.call)
                else:
                    ta.open_ended = True
            else:  # parse_args_into_dataclasses / parse_args: values from the command line
                ta.runtime_cli = True
            out.append(ta)
        return out

    def _load_args_file(self, path: str) -> Any:
        full = path if os.path.isabs(path) else os.path.join(self.dir, path)
        try:
            with open(full, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            return None
        if full.endswith((".yaml", ".yml")):
            try:
                import yaml  # optional; only for YAML arguments files

                return yaml.safe_load(text)
            except Exception:
                return None
        try:
            return json.loads(text)
        except ValueError:
            return None

    def apply_attribute_assignments(self, ta: TrainingArgs) -> None:
        if not ta.var:
            return
        prefix = ta.var + "."
        for target, assigns in self.t.assignments.items():
            if target.startswith(prefix) and target.count(".") == ta.var.count(".") + 1:
                name = target[len(prefix):]
                vals = [self.r.value(a.value, a.func) for a in assigns]
                v = vals[0] if all(x == vals[0] and x is not UNKNOWN for x in vals) else UNKNOWN
                ta.explicit[name] = Setting(v, "attribute assignment", assigns[-1].node)

    # ---- models
    def model_from_expr(self, expr: Optional[cst.BaseExpression], func: Any, depth: int = 0,
                        before_row: Optional[int] = None) -> Optional[ModelInfo]:
        """The model ``expr`` evaluates to. A name must be bound only by calls bertlint understands (a model
        constructor, ``from_pretrained``, a cast, PEFT wrapping) before ``before_row``; anything else (a custom
        wrapper, ``torch.compile``, a value from elsewhere) makes the model unknown."""
        if expr is None or depth > 6:
            return None
        if isinstance(expr, cst.Name):
            if expr.value in self._resolving:
                return None
            assigns = self.t.assignments_of(expr.value, func)
            if before_row is not None:
                assigns = [a for a in assigns if a.func is not func or self.col.order.get(id(a.node), -1) < before_row]
            if not assigns:
                return self._model_from_unpack(expr.value, func, depth)
            info = ModelInfo(None, var=expr.value)
            classes = set()
            self._resolving.add(expr.value)
            try:
                for a in assigns:
                    if not isinstance(a.value, cst.Call):
                        return None
                    sub = ModelInfo(None, var=expr.value)
                    if not self._model_from_call(a.value, a.func, depth + 1, sub):
                        return None
                    if sub.class_name or sub.declared_class:
                        classes.add((sub.class_name, sub.declared_class, sub.checkpoint))
                    self._merge(info, sub)
            finally:
                self._resolving.discard(expr.value)
            if len(classes) > 1:  # different models on different paths: the class is not known
                info.class_name = info.family = info.head = info.architecture = info.local_class = None
            self._scan_model_var(info, expr.value, func)
            return info
        if isinstance(expr, cst.Call):
            info = ModelInfo(None)
            if self._model_from_call(expr, func, depth + 1, info):
                return info
        if isinstance(expr, cst.Attribute) and dotted(expr) and dotted(expr).startswith("self."):
            # `self.model`: every binding of the attribute in the file must be a model bertlint understands
            target = dotted(expr)
            assigns = self.t.assignments.get(target, [])
            if not assigns or target in self._resolving:
                return None
            info = ModelInfo(None, var=target)
            classes = set()
            self._resolving.add(target)
            try:
                for a in assigns:
                    if not isinstance(a.value, cst.Call):
                        return None
                    sub = ModelInfo(None, var=target)
                    if not self._model_from_call(a.value, a.func, depth + 1, sub):
                        return None
                    if sub.class_name or sub.declared_class:
                        classes.add((sub.class_name, sub.declared_class, sub.checkpoint))
                    self._merge(info, sub)
            finally:
                self._resolving.discard(target)
            if len(classes) > 1:
                info.class_name = info.family = info.head = info.architecture = info.local_class = None
            methods = self._methods_of_one_class([a.func for a in assigns])
            if methods is not None:
                # `self.model.gradient_checkpointing_enable()` and the like in the methods of the class that binds
                # `self.model` (a LightningModule's __init__, setup, configure_model)
                self._scan_model_var(info, target, None, only=methods)
            return info
        return None

    def _methods_of_one_class(self, funcs: list) -> Optional[set]:
        """ids of the methods of the one class whose methods hold every function in ``funcs``; None when they are not
        all methods of one class (a module-level binding, two classes)."""
        cls = None
        for f in funcs:
            if not isinstance(f, cst.FunctionDef):
                return None
            owner = next((a for a in self.ctx.index.ancestors(f) if isinstance(a, (cst.ClassDef, cst.FunctionDef))), None)
            if not isinstance(owner, cst.ClassDef) or (cls is not None and owner is not cls):
                return None
            cls = owner
        if cls is None or not isinstance(cls.body, cst.IndentedBlock):
            return None
        return {id(st) for st in cls.body.body if isinstance(st, cst.FunctionDef)}

    def _model_from_unpack(self, name: str, func: Any, depth: int) -> Optional[ModelInfo]:
        """``model, tokenizer = load(args)`` where ``load`` is the one function of this file by that name and every
        ``return`` of it is a tuple whose element at ``model``'s position is a name: the model that name is in
        ``load`` (PEFT wrapping, checkpointing and freezing inside it included). None otherwise."""
        sites = [(names, c) for names, c, f in self.t.unpacks if f is func and name in names]
        if len(sites) != 1:
            return None
        names, call = sites[0]
        if not isinstance(call.func, cst.Name) or call.func.value in self._resolving:
            return None
        defs = self.t.functions.get(call.func.value, [])
        if len(defs) != 1:
            return None
        fn, idx = defs[0], names.index(name)
        rets = [r for r in self.ctx.index.of(cst.Return)
                if r.value is not None and next((a for a in self.ctx.index.ancestors(r)
                                                 if isinstance(a, (cst.FunctionDef, cst.Lambda))), None) is fn]
        if not rets:
            return None
        found = None
        self._resolving.add(call.func.value)
        try:
            for r in rets:
                v = r.value
                if not isinstance(v, cst.Tuple) or len(v.elements) != len(names) or \
                        not isinstance(v.elements[idx].value, cst.Name):
                    return None
                info = self.model_from_expr(v.elements[idx].value, fn, depth + 1)
                if info is None:
                    return None
                found = found or info
        finally:
            self._resolving.discard(call.func.value)
        return found

    def _model_from_call(self, call: cst.Call, func: Any, depth: int, info: ModelInfo) -> bool:
        """Fold what ``call`` says about the model into ``info``; True if it produced or wrapped a model."""
        name = call_name(call) or ""
        last = name.split(".")[-1]
        if isinstance(call.func, cst.Attribute) and last in ("half", "bfloat16", "float", "to", "cuda", "train", "cpu"):
            inner = call.func.value
            cast = None
            if last == "half":
                cast = "float16"
            elif last == "bfloat16":
                cast = "bfloat16"
            elif last == "float":
                cast = "float32"
            elif last == "to":
                cast = self._dtype_in_to(call, func)
            if cast:
                info.cast, info.cast_node = cast, call
            if isinstance(inner, cst.Call):
                return self._model_from_call(inner, func, depth + 1, info)
            if isinstance(inner, cst.Name):
                if inner.value in self._resolving:
                    return True  # `model = model.half()`: the other bindings of the name say what it is
                sub = self.model_from_expr(inner, func, depth + 1)
                if sub:
                    self._merge(info, sub)
                    return True
            return False
        if last == "compile" and (name == "torch.compile" or self.t.qualname(call.func) == "torch.compile"):
            # `torch.compile(model)` wraps the same module: same parameters, dtype, PEFT adapters, checkpointing
            # (the OptimizedModule forwards attribute access to it)
            inner = positional(call, 0) or kwarg(call, "model")
            if isinstance(inner, cst.Call):
                return self._model_from_call(inner, func, depth + 1, info)
            if isinstance(inner, (cst.Name, cst.Attribute)) and dotted(inner):
                if dotted(inner) in self._resolving:
                    return True  # `m = torch.compile(m)`: the other bindings of the name say what it is
                sub = self.model_from_expr(inner, func, depth + 1)
                if sub:
                    self._merge(info, sub)
                    return True
            return False
        if last in ("get_peft_model", "prepare_model_for_kbit_training", "prepare_model_for_int8_training") \
                or name.endswith("PeftModel.from_pretrained"):
            if last in ("prepare_model_for_kbit_training", "prepare_model_for_int8_training"):
                info.kbit = True
                info.kbit_prep = info.kbit_prep or call
            else:
                info.peft = True
            info.peft_node = info.peft_node or call
            inner = positional(call, 0) or kwarg(call, "model")
            if isinstance(inner, cst.Call):
                self._model_from_call(inner, func, depth + 1, info)
            elif isinstance(inner, cst.Name):
                sub = self.model_from_expr(inner, func, depth + 1)
                if sub:
                    self._merge(info, sub)
            return True
        if last == "from_pretrained" and isinstance(call.func, cst.Attribute):
            cls_expr = call.func.value
            cls = dotted(cls_expr) or ""
            cls_last = cls.split(".")[-1]
            if not (cls_last.startswith("AutoModel") or split_class(cls_last)[0] or self._is_transformers_class(cls_expr)):
                return False
            info.node = info.node or call
            info.from_pretrained = True
            info.declared_class = cls_last
            ckpt = self.r.value(positional(call, 0) or kwarg(call, "pretrained_model_name_or_path"), func)
            info.checkpoint = ckpt if isinstance(ckpt, str) else None
            fam, head = split_class(cls_last)
            if fam is None and cls_last in AUTO_HEADS:
                head = AUTO_HEADS[cls_last]
                fam, arch, src = self._family_of_checkpoint(info.checkpoint)
                info.architecture, info.architecture_source = arch, src
            else:
                _, arch, src = self._family_of_checkpoint(info.checkpoint)
                info.architecture, info.architecture_source = arch, src
            info.family, info.head = fam, head
            info.class_name = concrete_class(fam, head) if cls_last in AUTO_HEADS else (cls_last if fam else cls_last)
            for kw in ("dtype", "torch_dtype"):
                e = kwarg(call, kw)
                if e is not None:
                    info.dtype = normalize_dtype(self.r.value(e, func), self.qual(e) or dotted(e))
                    info.dtype_node = e
                    if info.dtype is None:
                        info.dtype = "unknown"
            for kw in ("load_in_8bit", "load_in_4bit", "quantization_config"):
                e = kwarg(call, kw)
                if e is None or (isinstance(e, cst.Name) and e.value in ("False", "None")):
                    continue  # ``load_in_8bit=False`` loads a plain model
                try:
                    off = self.r.value(e, func) is False
                except Exception:
                    off = False
                if not off:
                    info.kbit = True  # set, or not known to be off
            return True
        fam, head = split_class(last)
        if fam is not None or self._is_transformers_class(call.func):
            info.node = info.node or call
            info.declared_class = last
            info.class_name = last
            info.family, info.head = fam, head
            cfg = positional(call, 0) or kwarg(call, "config")
            arch = self._arch_from_config_expr(cfg, func)
            if arch:
                info.architecture, info.architecture_source = arch
            return True
        if isinstance(call.func, cst.Name) and last in self.t.classes and self._is_module_class(last):
            # a model class of this script (an nn.Module / PreTrainedModel subclass)
            info.node = info.node or call
            info.declared_class = info.class_name = last
            info.local_class = self.t.classes[last]
            return True
        return False

    def _is_module_class(self, name: str) -> bool:
        for cls in self._class_chain(name):
            for b in cls.bases:
                q = self.qual(b.value) or dotted(b.value) or ""
                if q.endswith(("nn.Module", "PreTrainedModel", "torch.nn.Module")) or q == "Module":
                    return True
        return False

    def _is_transformers_class(self, expr: cst.BaseExpression) -> bool:
        q = self.qual(expr) or ""
        last = q.split(".")[-1]
        return q.startswith("transformers.") and (last.endswith(HEADS) and last[:1].isupper())

    def _dtype_in_to(self, call: cst.Call, func: Any) -> Optional[str]:
        for a in call.args:
            if a.keyword is None or a.keyword.value == "dtype":
                q = self.qual(a.value) or dotted(a.value)
                if q and q.startswith("torch."):
                    d = normalize_dtype(None, q)
                    if d:
                        return d
        return None

    def _family_of_checkpoint(self, ckpt: Optional[str]) -> tuple[Optional[str], Optional[dict], Optional[str]]:
        if not isinstance(ckpt, str):
            return None, None, None
        local = os.path.join(self.dir, ckpt) if not os.path.isabs(ckpt) else ckpt
        if (ckpt.startswith((".", "/")) or os.path.isdir(local)) and os.path.isdir(local):
            data = read_local_config(local)
            if data:
                mt = str(data.get("model_type", "")).lower()
                fam = mt if mt in FAMILY_PREFIX else None
                arch = {k: data.get(k) for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                   "intermediate_size", "vocab_size", "max_position_embeddings",
                                                   "type_vocab_size")}
                if fam in ("bert", "roberta", "xlm-roberta", "electra") and data.get("embedding_size", arch["hidden_size"]) == arch["hidden_size"]:
                    n = bert_like_parameters({k: v for k, v in arch.items() if v is not None})
                    if n:
                        arch["parameters"] = n
                arch["is_decoder"] = bool(data.get("is_decoder", False))
                return fam, arch, f"local {os.path.join(ckpt, 'config.json')}"
            return None, None, None
        fam = checkpoint_family(ckpt)
        arch = architecture_for(ckpt)
        if arch is not None:
            fam = fam or arch.get("model_type")
            return fam, arch, f"built-in table ({arch['name']})"
        return fam, None, None

    def _arch_from_config_expr(self, cfg: Optional[cst.BaseExpression], func: Any) -> Optional[tuple[dict, str]]:
        if isinstance(cfg, cst.Name):
            for a in self.t.assignments_of(cfg.value, func):
                if isinstance(a.value, cst.Call):
                    return self._arch_from_config_expr(a.value, a.func)
            return None
        if not isinstance(cfg, cst.Call):
            return None
        name = (call_name(cfg) or "").split(".")[-1]
        if name == "from_pretrained" and isinstance(cfg.func, cst.Attribute):
            ckpt = self.r.value(positional(cfg, 0), func)
            fam, arch, src = self._family_of_checkpoint(ckpt if isinstance(ckpt, str) else None)
            return (arch, src) if arch else None
        if name in ("BertConfig", "RobertaConfig", "ElectraConfig", "XLMRobertaConfig"):
            arch = dict(_BERT_DEFAULTS)
            if name in ("RobertaConfig", "XLMRobertaConfig"):
                arch.update(vocab_size=50265 if name == "RobertaConfig" else 250002, max_position_embeddings=514, type_vocab_size=1)
            if name == "ElectraConfig":
                arch.update(hidden_size=256, num_hidden_layers=12, num_attention_heads=4, intermediate_size=1024)
            if any(a.star for a in cfg.args):  # BertConfig(**cfg): the shared set-up fact reads the dict
                f = config_fact(self.ctx, cfg, func)
                if not f.known or f.value.get("embedding_size") is not None:
                    return None
                arch.update({k: v for k, v in f.value.items()
                             if k in arch and isinstance(v, int) and not isinstance(v, bool)})
                if f.value.get("is_decoder") is True:
                    arch["is_decoder"] = True
            for a in (() if any(a.star for a in cfg.args) else cfg.args):
                if a.keyword is not None and a.keyword.value in arch:
                    v = self.r.value(a.value, func)
                    if isinstance(v, int) and not isinstance(v, bool):
                        arch[a.keyword.value] = v
                    else:
                        return None
                if a.keyword is not None and a.keyword.value == "is_decoder":
                    arch["is_decoder"] = self.r.value(a.value, func) is True
                if a.keyword is not None and a.keyword.value == "embedding_size":
                    return None
            n = bert_like_parameters(arch)
            if n:
                arch["parameters"] = n
            return arch, f"{name}(...) in the script"
        return None

    def _merge(self, info: ModelInfo, sub: ModelInfo) -> None:
        for f in ("node", "declared_class", "class_name", "family", "head", "checkpoint", "architecture",
                  "architecture_source", "dtype", "dtype_node", "cast", "cast_node", "peft_node", "kbit_prep", "use_cache_true",
                  "is_decoder", "local_class"):
            if getattr(info, f) is None and getattr(sub, f) is not None:
                setattr(info, f, getattr(sub, f))
        info.peft = info.peft or sub.peft
        info.kbit = info.kbit or sub.kbit
        info.from_pretrained = info.from_pretrained or sub.from_pretrained
        info.frozen_any = info.frozen_any or sub.frozen_any
        info.input_require_grads = info.input_require_grads or sub.input_require_grads
        for lst in ("frozen_inputs", "checkpointing"):
            have = {id(x) for x in getattr(info, lst)}
            getattr(info, lst).extend(x for x in getattr(sub, lst) if id(x) not in have)

    def _scan_model_var(self, info: ModelInfo, var: str, func: Any, only: Optional[set] = None) -> None:
        """Method calls and loops on the model variable: casts, checkpointing, freezing, input-grad hooks. ``only``: the
        ids of the functions to read (the methods of the class binding ``self.<name>``) instead of ``func``."""
        for site in self.col.calls:
            if only is not None:
                if id(site.func) not in only:
                    continue
            elif func is not None and site.func is not func and site.func is not None:
                continue
            f = site.call.func
            if not isinstance(f, cst.Attribute):
                continue
            base = dotted(f.value) or ""
            if base != var and not base.startswith(var + "."):
                continue
            m = f.attr.value
            if m in ("gradient_checkpointing_enable", "activation_checkpointing_enable"):
                e = kwarg(site.call, "gradient_checkpointing_kwargs") or kwarg(site.call, "activation_checkpointing_kwargs") \
                    or positional(site.call, 0)
                kw = None if e is None else self.r.value(e, site.func)
                if isinstance(kw, dict) and any(v is UNKNOWN for v in kw.values()) and "use_reentrant" not in kw:
                    kw = UNKNOWN
                row = self.col.order.get(id(site.call), 0)
                if not any(c.node is site.call for c in info.checkpointing):
                    info.checkpointing.append(CheckpointCall(site.call, m, kw, e, row))
            elif m == "enable_input_require_grads":
                info.input_require_grads = True
            elif m == "requires_grad_" and base != var:
                arg = positional(site.call, 0)
                if arg is not None and literal(arg) is False:
                    info.frozen_any = True
                    backbone = base[len(var) + 1:] in ("base_model", "bert", "roberta", "distilbert", "deberta",
                                                       "electra", "albert", "model")
                    if "embed" in base.lower() or backbone:
                        info.frozen_inputs.append(site.call)
            elif site.is_expr and m in ("half", "bfloat16", "to") and base == var:
                cast = "float16" if m == "half" else "bfloat16" if m == "bfloat16" else self._dtype_in_to(site.call, site.func)
                if cast:
                    info.cast, info.cast_node = cast, site.call
        for target, assigns in self.t.assignments.items():
            if target in (f"{var}.config.use_cache",) and assigns and all(literal(a.value) is True for a in assigns):
                # only a flag the file never sets otherwise: `use_cache = False` in the checkpointing arm and True in
                # the other, or True restored after training, is managed per configuration, not left on
                info.use_cache_true = assigns[0].node
            if target == f"{var}.config.is_decoder" and any(literal(a.value) is True for a in assigns):
                info.is_decoder = True
        for loop, lfunc in self.col.fors:
            if only is not None and id(lfunc) not in only:
                continue
            if var not in code_of(loop.iter):  # before the loop's whole text (a training loop is long)
                continue
            text = code_of(loop)
            if not _FREEZE_RE.search(text):
                continue
            info.frozen_any = True
            if "embed" in text.lower():
                info.frozen_inputs.append(loop)
                continue
            # the whole model or its backbone frozen without a selection: the embeddings are frozen too
            it = code_of(loop.iter).replace(" ", "")
            whole = re.fullmatch(
                rf"{re.escape(var)}(\.(base_model|bert|roberta|distilbert|deberta|electra|albert|model|encoder_model))?"
                r"\.(named_)?parameters\(\)", it)
            has_if = any(isinstance(st, cst.If) for st in (loop.body.body if isinstance(loop.body, cst.IndentedBlock) else []))
            if whole and not has_if:
                info.frozen_inputs.append(loop)

    # ---- trainers
    def trainer_from_site(self, site: CallSite, all_args: list[TrainingArgs]) -> Optional[TrainerInfo]:
        tc = self.trainer_class(site.call.func)
        if tc is None:
            return None
        name, sub = tc
        ti = TrainerInfo(site.call, site.stmt, site.targets[0] if len(site.targets) == 1 and site.targets[0] else None,
                         site.func, class_name=name, subclass=sub)
        chain = []
        if sub is not None:
            chain = project_chain(self.dir, self.t, self._imports_map(), sub)
        else:
            found = self.project_class_of(site.call.func)
            if found is not None:
                chain = project_chain(found[3], found[1], found[2], found[0])
        if chain:
            for cls in reversed(chain):
                body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
                for stmt in body:
                    if isinstance(stmt, cst.FunctionDef):
                        ti.methods[stmt.name.value] = stmt
                    elif isinstance(stmt, cst.SimpleStatementLine):
                        for small in stmt.body:
                            if isinstance(small, cst.Assign) and any(
                                dotted(t.target) in ("loss_is_scaled_for_ga", "model_accepts_loss_kwargs") for t in small.targets
                            ):
                                ti.loss_scaling_override = code_of(small)
        call = site.call
        ti.model_expr = kwarg(call, "model") or positional(call, 0)
        ti.args_expr = kwarg(call, "args") or positional(call, 1)
        ti.compute_loss_func = _not_none(kwarg(call, "compute_loss_func"))
        ti.compute_metrics = _not_none(kwarg(call, "compute_metrics"))
        ti.preprocess_logits_for_metrics = _not_none(kwarg(call, "preprocess_logits_for_metrics"))
        ti.optimizers = _not_none(kwarg(call, "optimizers"))
        ti.callbacks = _not_none(kwarg(call, "callbacks"))
        if ti.model_expr is not None:
            mexpr, mfunc, morder = self.through_param(ti.model_expr, site.func, self.col.order.get(id(site.call), 0))
            ti.model = self.model_from_expr(mexpr, mfunc, before_row=morder) if mexpr is not None else None
        else:
            mi = kwarg(call, "model_init")
            fname = dotted(mi) if mi is not None else None
            if fname and fname in self.t.functions:
                fdef = self.t.functions[fname][0]
                ret = _single_return(fdef)
                if ret is not None:
                    ti.model = self.model_from_expr(ret, fdef)
        aexpr, afunc, _ = self.through_param(ti.args_expr, site.func, 0)
        ti.args = self._args_for(aexpr, afunc, all_args) if aexpr is not None else None
        return ti

    def through_param(self, expr, func, order: int):
        """A name that is a parameter of the enclosing function stands for what its one caller passes:
        (argument expression, caller's function, order of the call). (None, None, 0) when that is not one known
        call site; ``expr`` unchanged when it is not a parameter."""
        if not isinstance(expr, cst.Name) or func is None:
            return expr, func, order
        p = func.params
        params = [x.name.value for x in (*p.posonly_params, *p.params)]
        kwonly = [x.name.value for x in p.kwonly_params]
        if expr.value not in params and expr.value not in kwonly:
            return expr, func, order
        if params and params[0] in ("self", "cls"):
            return None, None, 0
        fname = func.name.value
        sites = [c for c in self.col.calls if call_name(c.call) == fname]
        if len(sites) != 1:
            return None, None, 0
        call = sites[0].call
        arg = kwarg(call, expr.value)
        if arg is None and expr.value in params:
            arg = positional(call, params.index(expr.value))
        if arg is None or any(a.star for a in call.args):
            return None, None, 0
        return arg, sites[0].func, self.col.order.get(id(call), 0)

    def _args_for(self, expr, func, all_args: list[TrainingArgs]) -> Optional[TrainingArgs]:
        if expr is None:
            return None
        if isinstance(expr, cst.Call):
            for a in all_args:
                if a.node is expr:
                    return a
            return None
        d = dotted(expr)
        if not d:
            return None
        cands = [a for a in all_args if a.var == d]
        local = [a for a in cands if a.func is func]
        if local:
            cands = local
        elif func is not None:
            cands = [a for a in cands if a.func is None] or cands
        if len(cands) == 1:
            return cands[0]
        if len(cands) > 1:  # several constructions (if/else): keep what they agree on
            merged = TrainingArgs(cands[0].node, d, func, cands[0].class_name)
            keys = set().union(*(c.explicit for c in cands))
            for k in keys:
                vals = [c.get(k) for c in cands]
                if all(v is not UNKNOWN and v == vals[0] for v in vals):
                    merged.explicit[k] = Setting(vals[0], cands[0].origin(k), cands[0].keyword_node(k))
                else:
                    merged.explicit[k] = Setting(UNKNOWN, "differs between constructions", None)
            merged.open_ended = any(c.open_ended for c in cands)
            merged.runtime_cli = any(c.runtime_cli for c in cands)
            return merged
        return None

    def kwargs_dicts(self, known: list) -> list[TrainingArgs]:
        """Dict literals that are TrainingArguments keywords handed on elsewhere (``training_args = {"output_dir":
        ..., "gradient_accumulation_steps": ..., ...}`` given to a helper that builds ``TrainingArguments(**d)`` in
        another module): at least six keys, all of them TrainingArguments fields and four of them specific to it.
        Open-ended (other keys may be added) and never a default: only what the dict says."""
        out = []
        used = {id(a.node) for a in known}
        for d in self.ctx.index.of(cst.Dict):
            if id(d) in used or len(d.elements) < 6:
                continue
            keys = []
            for el in d.elements:
                if isinstance(el, cst.DictElement):
                    k = literal(el.key)
                    if not isinstance(k, str):
                        keys = []
                        break
                    keys.append((k, el))
            names = [k for k, _ in keys]
            if len(names) < 6 or not set(names) <= _TA_FIELDS or len(set(names) & _TA_SPECIFIC) < 4:
                continue
            parent = self.ctx.index.parent(d)
            var = None
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                var = dotted(parent.targets[0].target)
            func = next((a for a in self.ctx.index.ancestors(d) if isinstance(a, cst.FunctionDef)), None)
            ta = TrainingArgs(d, var, func, class_name="TrainingArguments keywords (dict)", open_ended=True)
            for k, el in keys:
                v = self.r.value(el.value, func)
                origin = "dict literal key" if literal(el.value) is not UNKNOWN else f"dict literal key (`{code_of(el.value)}`)"
                if v is UNKNOWN:
                    f = self._fact(el.value, func)
                    if f is not None and f.known:
                        v, origin = f.value, f"dict literal key ({f.source})"
                ta.explicit[k] = Setting(v, origin if literal(el.value) is UNKNOWN else "keyword", el)
            out.append(ta)
        return out

    def _collect_reads(self, args_list: list) -> None:
        """``training_args.gradient_checkpointing`` read somewhere in the file (``if training_args.x:``): the script
        expects the field to be set at launch (from the shared index, no walk of its own)."""
        names = {a.var: a for a in args_list if a.var and "." not in a.var}
        if not names:
            return
        for node in self.ctx.index.of(cst.Attribute):
            if isinstance(node.value, cst.Name) and node.value.value in names:
                ta = names[node.value.value]
                ta.reads.setdefault(node.attr.value, node)

    def disables_loss_kwargs(self) -> Optional[str]:
        for target, assigns in self.t.assignments.items():
            last = target.split(".")[-1]
            if last in ("model_accepts_loss_kwargs", "loss_is_scaled_for_ga"):
                return f"{target} = {code_of(assigns[0].value)}"
        for site in self.col.calls:
            if (call_name(site.call) or "") == "setattr":
                a1 = literal(positional(site.call, 1))
                if a1 in ("model_accepts_loss_kwargs", "loss_is_scaled_for_ga"):
                    return code_of(site.call)
        return None

    def build(self) -> FileSetup:
        fs = FileSetup(order=self.col.order)
        args_list: list[TrainingArgs] = []
        for site in self.col.calls:
            if self.is_args_class(site.call.func):
                args_list.append(self.args_from_call(site))
        args_list.extend(self.hf_parser_args())
        args_list.extend(self.kwargs_dicts(args_list))
        for a in args_list:
            self.apply_attribute_assignments(a)
        fs.training_args = args_list
        self._collect_reads(args_list)
        for site in self.col.calls:
            ti = self.trainer_from_site(site, args_list)
            if ti is not None:
                fs.trainers.append(ti)
        fs.disables_loss_kwargs = self.disables_loss_kwargs()
        for name in self.t.classes:
            if self._subclasses_trainer(name, 0):
                methods: dict = {}
                for cls in reversed(self._class_chain(name)):
                    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
                    for stmt in body:
                        if isinstance(stmt, cst.FunctionDef):
                            methods[stmt.name.value] = stmt
                fs.trainer_classes[name] = methods
        for ti in fs.trainers:
            if ti.model is not None:
                fs.models.append(ti.model)
        # models built outside any Trainer (hand-written loops, accelerate scripts): ``explain`` and the memory
        # simulator read them; rules about Trainers never do
        seen = {(m.var, id(m.node)) for m in fs.models}
        for site in self.col.calls:
            if len(site.targets) != 1 or not site.targets[0]:
                continue
            target = site.targets[0]
            attr = target.startswith("self.") and target.count(".") == 1  # `self.model = ...` in a LightningModule
            if "." in target and not attr:
                continue
            last = (call_name(site.call) or "").split(".")[-1]
            head = (dotted(site.call.func.value) or "") if isinstance(site.call.func, cst.Attribute) else ""
            if not (last == "from_pretrained" and (head.split(".")[-1].startswith("AutoModel") or split_class(head.split(".")[-1])[0])) \
                    and not split_class(last)[0]:
                continue
            expr = cst.Attribute(value=cst.Name("self"), attr=cst.Name(target[5:])) if attr else cst.Name(target)
            m = self.model_from_expr(expr, site.func)
            if m is not None and m.node is not None and (m.var, id(m.node)) not in seen \
                    and all(x.node is not m.node for x in fs.models):
                fs.models.append(m)
                seen.add((m.var, id(m.node)))
        return fs


def _not_none(expr: Optional[cst.BaseExpression]) -> Optional[cst.BaseExpression]:
    """``None`` for an absent keyword, a literal ``None`` and ``(None, None)`` (the defaults)."""
    if expr is None or literal(expr) is None:
        return None
    if isinstance(expr, (cst.Tuple, cst.List)) and expr.elements and all(literal(e.value) is None for e in expr.elements):
        return None
    return expr


def _single_return(fdef: cst.FunctionDef) -> Optional[cst.BaseExpression]:
    rets: list = []

    class V(cst.CSTVisitor):
        def visit_Return(self, node):
            if node.value is not None:
                rets.append(node.value)

        def visit_FunctionDef(self, node):
            return node is fdef

    walk(fdef, V())
    return rets[0] if len(rets) == 1 else None


def build(ctx) -> FileSetup:
    """``ctx.setup``. Never raises: bad input yields an empty set-up."""
    src = ctx.source
    if not any(k in src for k in ("Trainer", "TrainingArguments", "HfArgumentParser", "from_pretrained", "For")):
        return FileSetup()  # nothing this analysis could find: skip the walk
    try:
        return _Builder(ctx).build()
    except RecursionError:
        return FileSetup()
    except Exception:  # an unforeseen structure: no set-up rather than a traceback (rules then stay silent)
        if os.environ.get("BERTLINT_DEBUG"):
            raise
        return FileSetup()


# ===============================================================================================================
# Set-up facts (issue 14: one set-up model for lint, ``explain``, ``bertlint memory`` and the verifier).
#
# Each function returns a ``symbols.Fact``: the value or UNKNOWN, with where it came from. Nothing here turns a
# missing fact into a default: a keyword the script does not pass is the library's own default (stated as such),
# anything the analysis cannot read is UNKNOWN with the reason as its source.
#
#   config_fact(ctx, expr, func)      the transformers configuration ``expr`` builds: {"model_type": ..., **kw}
#   checkpoint_config(ctx, name)      a checkpoint's configuration: local ``name/config.json`` or the built-in table
#   model_fact(ctx, expr, func)       {"class", "config" (Fact), "peft", "node"} of the model ``expr`` evaluates to
#   training_model_fact(ctx, ...)     the model a Trainer / hand-written loop trains
#   loop_micro_batch(ctx, lp)         the batch size of the loader the training loop iterates
#   optimizer_fact(ctx, setup)        {"kind", "fused", "foreach", "momentum", "class"} (the Trainer default by version)
#   lora_fact(ctx)                    {"r", "targets", "dropout", "alpha"} of the script's LoraConfig

CONFIG_CLASS_MODEL_TYPES = {
    "BertConfig": "bert", "RobertaConfig": "roberta", "XLMRobertaConfig": "xlm-roberta", "ElectraConfig": "electra",
    "DistilBertConfig": "distilbert", "AlbertConfig": "albert", "DebertaConfig": "deberta",
    "DebertaV2Config": "deberta-v2", "GPT2Config": "gpt2", "LlamaConfig": "llama", "MistralConfig": "mistral",
    "Qwen2Config": "qwen2", "GPTNeoXConfig": "gpt_neox", "OPTConfig": "opt", "T5Config": "t5",
    "ModernBertConfig": "modernbert", "CamembertConfig": "camembert", "MPNetConfig": "mpnet",
    "XLNetConfig": "xlnet", "BartConfig": "bart", "GemmaConfig": "gemma", "PhiConfig": "phi",
}
_MODEL_WRAPPERS = {"get_peft_model": True, "prepare_model_for_kbit_training": False,
                   "prepare_model_for_int8_training": False}
_NOT_MODEL_CLASS = ("Tokenizer", "TokenizerFast", "Config", "Processor", "FeatureExtractor", "ImageProcessor",
                    "Pipeline", "PeftModel", "Dataset")
# keywords of from_pretrained / from_dict that are not configuration values
_LOAD_KEYWORDS = {"pretrained_model_name_or_path", "cache_dir", "revision", "token", "use_auth_token",
                  "trust_remote_code", "local_files_only", "force_download", "proxies", "return_unused_kwargs",
                  "subfolder", "config", "dtype", "torch_dtype", "device_map", "low_cpu_mem_usage",
                  "attn_implementation", "quantization_config", "load_in_8bit", "load_in_4bit", "ignore_mismatched_sizes",
                  "from_tf", "from_flax", "use_safetensors", "state_dict", "output_loading_info", "variant"}


def _F(value: Any, source: str, node: Any = None, kind: str = "literal"):
    from bertlint.analysis.symbols import Fact

    return Fact(value, source, node, kind)


def _unknown(source: str, node: Any = None):
    return _F(UNKNOWN, source if source.startswith("unknown") else f"unknown: {source}", node, "unknown")


def _weakest_kind(kinds) -> str:
    order = {"literal": 0, "default": 1, "environment": 2, "unset": 3, "unknown": 3}
    return max(kinds, key=lambda k: order.get(k, 3)) if kinds else "literal"


def _script_dir(ctx) -> str:
    return os.path.dirname(os.path.abspath(getattr(ctx, "filename", "") or "."))


def checkpoint_config(ctx, ckpt: Any, node: Any = None):
    """The configuration of checkpoint ``ckpt``: a local ``ckpt/config.json`` (relative to the script, then the
    working directory), else the built-in table (``bertlint/data/architectures.json``), else UNKNOWN."""
    if not isinstance(ckpt, str):
        return _unknown("the checkpoint name is not statically known", node)
    for base in (_script_dir(ctx), os.getcwd()):
        local = ckpt if os.path.isabs(ckpt) else os.path.join(base, ckpt)
        path = os.path.join(local, "config.json")
        if os.path.isfile(path):
            try:
                with open(path, encoding="utf-8") as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                return _unknown(f"{path} cannot be read ({e})", node)
            if isinstance(data, dict) and data.get("model_type"):
                return _F(data, f"local {os.path.join(ckpt, 'config.json')}", node)
            return _unknown(f"{path} has no model_type", node)
    arch = architecture_for(ckpt)
    if arch is not None and arch.get("model_type"):
        cfg = dict(arch.get("config") or {k: v for k, v in arch.items()
                                          if k not in ("aliases", "parameters", "name", "model_type", "config")})
        cfg["model_type"] = arch["model_type"]
        return _F(cfg, f"built-in table ({arch['name']})", node)
    return _unknown(f"the architecture of checkpoint {ckpt!r} is not in bertlint's table and no local "
                    f"{ckpt}/config.json exists", node)


def _with_kwargs(ctx, call, func, base: dict, source: str, base_kind: str = "literal", skip=()):
    kw = ctx.resolver.call_kwargs(call, func)
    if "**" in kw:
        return _unknown(kw["**"].source, call)
    out, kinds, extra = dict(base), [base_kind], []
    for k, f in kw.items():
        if k in skip or k in _LOAD_KEYWORDS:
            continue
        if not f.known:
            return _unknown(f"{k}= of `{code_of(call)[:60]}` is not statically known ({f.source})", call)
        out[k] = f.value
        kinds.append(f.kind)
        if f.kind != "literal":
            extra.append(f"{k}: {f.source}")
    return _F(out, source + (f" ({'; '.join(extra)})" if extra else ""), call, _weakest_kind(kinds))


def config_fact(ctx, expr, func=None, depth: int = 0):
    """The transformers configuration ``expr`` evaluates to, as a dict with ``model_type`` and every keyword the
    script passes (the class's own defaults apply to the others), or UNKNOWN with the reason.

    Read: ``BertConfig(**cfg)`` / ``GPT2Config(n_layer=2)`` (any ``*Config`` of a known model type),
    ``XConfig.from_dict(d)``, ``AutoConfig.for_model("bert", ...)``, ``AutoConfig.from_pretrained("./dir")`` /
    ``XConfig.from_pretrained(name, num_labels=3)`` (local config.json or the built-in table), a name bound once
    to one of these, and later ``config.x = v`` assignments."""
    r = ctx.resolver
    if expr is None:
        return _unknown("no configuration passed")
    if depth > 6:
        return _unknown("configuration too deeply aliased", expr)
    if isinstance(expr, cst.Name):
        assigns = ctx.symbols.assignments_of(expr.value, func)
        if len(assigns) != 1:
            return _unknown(f"`{expr.value}` is bound {len(assigns)} times" if assigns else
                            f"`{expr.value}` is not bound in this file", expr)
        a = assigns[0]
        base = config_fact(ctx, a.value, a.func, depth + 1)
        if not base.known:
            return base
        cfg, src, kinds = dict(base.value), [base.source], [base.kind]
        prefix = expr.value + "."
        for key, lst in ctx.symbols.assignments.items():
            if not key.startswith(prefix) or "." in key[len(prefix):]:
                continue
            if len(lst) != 1:
                return _unknown(f"`{key}` is assigned {len(lst)} times", lst[0].node)
            f = r.fact(lst[0].value, lst[0].func)
            if not f.known:
                return _unknown(f"`{key} = {code_of(lst[0].value)[:40]}` is not statically known ({f.source})", lst[0].node)
            cfg[key[len(prefix):]] = f.value
            kinds.append(f.kind)
            src.append(f"`{key} = {f.value!r}`")
        return _F(cfg, "; ".join(src), base.node, _weakest_kind(kinds))
    if not isinstance(expr, cst.Call):
        return _unknown(f"`{code_of(expr)[:60]}` is not a configuration bertlint reads", expr)
    name = call_name(expr) or ""
    parts = name.split(".")
    last = parts[-1]
    owner = parts[-2] if len(parts) > 1 else None
    if last in CONFIG_CLASS_MODEL_TYPES or (last.endswith("Config") and last[:1].isupper() and owner is None
                                            and last not in ("AutoConfig",)):
        mt = CONFIG_CLASS_MODEL_TYPES.get(last)
        if mt is None:
            return _unknown(f"the model_type of {last} is not known to bertlint", expr)
        if any(a.keyword is None and not a.star for a in expr.args):
            return _unknown(f"positional arguments of {last}(...) are not read", expr)
        return _with_kwargs(ctx, expr, func, {"model_type": mt}, f"{last}(...) in the script")
    if last == "from_dict" and owner in CONFIG_CLASS_MODEL_TYPES:
        d = r.fact(positional(expr, 0) or kwarg(expr, "config_dict"), func)
        if not d.known or not isinstance(d.value, dict):
            return _unknown(f"the dict given to {owner}.from_dict is not statically known ({d.source})", expr)
        base = dict(d.value)
        base["model_type"] = CONFIG_CLASS_MODEL_TYPES[owner]
        return _with_kwargs(ctx, expr, func, base, f"{owner}.from_dict(...) in the script", d.kind,
                            skip=("config_dict",))
    if last == "for_model" and owner == "AutoConfig":
        mt = r.fact(positional(expr, 0) or kwarg(expr, "model_type"), func)
        if not isinstance(mt.value, str):
            return _unknown(f"the model_type given to AutoConfig.for_model is not statically known ({mt.source})", expr)
        return _with_kwargs(ctx, expr, func, {"model_type": mt.value}, "AutoConfig.for_model(...) in the script",
                            mt.kind, skip=("model_type",))
    if last == "from_pretrained" and (owner == "AutoConfig" or owner in CONFIG_CLASS_MODEL_TYPES):
        ck = r.fact(positional(expr, 0) or kwarg(expr, "pretrained_model_name_or_path"), func)
        base = checkpoint_config(ctx, ck.value, expr)
        if not base.known:
            return base
        return _with_kwargs(ctx, expr, func, dict(base.value), f"{owner}.from_pretrained({ck.value!r}): {base.source}",
                            ck.kind)
    return _unknown(f"`{code_of(expr)[:60]}` is not a configuration bertlint reads", expr)


def _is_model_class_name(last: str) -> bool:
    return bool(last[:1].isupper()) and not last.endswith(_NOT_MODEL_CLASS) and (
        last.startswith("AutoModel") or split_class(last)[0] is not None or "For" in last or last.endswith("Model"))


def model_fact(ctx, expr, func=None, depth: int = 0) -> Optional[dict]:
    """What ``expr`` (a model expression) is built from: ``{"class": str, "config": Fact, "peft": bool,
    "node": the constructor call}``, or None when it is not a transformers model bertlint reads. Followed through
    ``get_peft_model`` / ``prepare_model_for_kbit_training`` wrappers and casts (``.to()``, ``.half()``,
    ``.cuda()``); a name bound to two different constructors is None."""
    if expr is None or depth > 8:
        return None
    if isinstance(expr, cst.Name):
        found, peft = None, False
        for a in ctx.symbols.assignments_of(expr.value, func):
            sub = model_fact(ctx, a.value, a.func, depth + 1) if not (
                isinstance(a.value, cst.Call) and _mentions(a.value, expr.value)) else None
            if sub is None and isinstance(a.value, cst.Call):
                w = _wrapper_of(a.value)
                if w is not None:
                    peft = peft or w
                    continue
            if sub is None:
                continue
            if found is not None and (found["class"], found["node"]) != (sub["class"], sub["node"]):
                return None
            found = sub
        if found is not None:
            found = dict(found, peft=found["peft"] or peft)
        return found
    if not isinstance(expr, cst.Call):
        return None
    name = call_name(expr) or ""
    parts = name.split(".")
    last = parts[-1]
    if isinstance(expr.func, cst.Attribute) and last in ("to", "half", "bfloat16", "float", "cuda", "cpu", "train"):
        return model_fact(ctx, expr.func.value, func, depth + 1)
    w = _wrapper_of(expr)
    if w is not None:
        inner = model_fact(ctx, positional(expr, 0) or kwarg(expr, "model"), func, depth + 1)
        return dict(inner, peft=inner["peft"] or w) if inner else None
    if last in ("from_pretrained", "from_config") and len(parts) >= 2:
        cls = parts[-2]
        if not _is_model_class_name(cls):
            return None
        if last == "from_config":
            cfg = config_fact(ctx, positional(expr, 0) or kwarg(expr, "config"), func)
        else:
            ce = kwarg(expr, "config")
            if ce is not None:
                cfg = config_fact(ctx, ce, func)
            else:
                ck = ctx.resolver.fact(positional(expr, 0) or kwarg(expr, "pretrained_model_name_or_path"), func)
                base = checkpoint_config(ctx, ck.value, expr)
                cfg = base if not base.known else _with_kwargs(
                    ctx, expr, func, dict(base.value), f"{cls}.from_pretrained({ck.value!r}): {base.source}", ck.kind)
        return {"class": cls, "config": cfg, "peft": False, "node": expr}
    if len(parts) == 1 or (ctx.symbols.qualname(expr.func) or "").startswith("transformers."):
        if _is_model_class_name(last) and not last.startswith("Auto") and last not in ctx.symbols.classes:
            cfg = config_fact(ctx, positional(expr, 0) or kwarg(expr, "config"), func)
            return {"class": last, "config": cfg, "peft": False, "node": expr}
    return None


def _wrapper_of(call) -> Optional[bool]:
    """True for PEFT wrapping, False for another model wrapper bertlint sees through, None otherwise."""
    name = call_name(call) or ""
    if name.endswith("PeftModel.from_pretrained"):
        return True
    return _MODEL_WRAPPERS.get(name.split(".")[-1])


def _mentions(call, name: str) -> bool:
    """``call`` reads ``name`` (``model = get_peft_model(model, c)``: a rebinding, not a second constructor)."""
    inner = positional(call, 0) or kwarg(call, "model")
    if isinstance(call.func, cst.Attribute) and isinstance(call.func.value, cst.Name):
        return call.func.value.value == name
    return isinstance(inner, cst.Name) and inner.value == name and _wrapper_of(call) is not None


def training_model_fact(ctx, setup=None, loop=None) -> Optional[dict]:
    """The model a set-up trains: the Trainer's ``model=`` argument, else the one model of the file (every
    model role that bertlint reads naming the same constructor), else None."""
    t = getattr(setup, "trainer", None)
    if t is not None and getattr(t, "model_expr", None) is not None:
        m = model_fact(ctx, t.model_expr, t.func)
        if m is not None:
            return m
    cands = {}
    try:
        roles = ctx.roles.all("model")
    except Exception:  # noqa: BLE001 - roles are optional here
        roles = []
    for scope, path, role in roles:
        fn = scope if isinstance(scope, cst.FunctionDef) else None
        m = None
        if "." not in path:
            m = model_fact(ctx, cst.Name(path), fn)
        if m is None and role.origin is not None:
            m = model_fact(ctx, role.origin, fn)
        if m is not None:
            key = id(m["node"])
            if key in cands:
                m = dict(m, peft=m["peft"] or cands[key]["peft"])
            cands[key] = m
    if len(cands) == 1:
        return next(iter(cands.values()))
    return None


_BATCH_NAME_RE = re.compile(r"(micro_?|per_device_)?(train_)?batch(_size)?", re.IGNORECASE)


def _loader_batch(ctx, call, func):
    bs = kwarg(call, "batch_size") or positional(call, 1)
    if kwarg(call, "batch_sampler") is not None:
        return _unknown("the DataLoader uses a batch_sampler", call)
    if bs is None:
        return _F(1, f"DataLoader default batch_size=1 (`{code_of(call)[:50]}`)", call)
    f = ctx.resolver.fact(bs, func)
    if isinstance(f.value, int) and not isinstance(f.value, bool) and f.value > 0:
        return _F(f.value, f"DataLoader batch_size ({f.source})", f.node or bs, f.kind)
    return _unknown(f"batch_size of the training DataLoader ({f.source})", bs)


def _loader_call(ctx, expr, func, depth: int = 0):
    """(DataLoader call, its function) that ``expr`` (a loop's iterable) is, or (None, None)."""
    if depth > 6 or expr is None:
        return None, None
    if isinstance(expr, cst.Call):
        last = (call_name(expr) or "").split(".")[-1]
        if last.endswith("DataLoader"):
            return expr, func
        if last in ("enumerate", "tqdm", "iter", "islice", "trange") or last.endswith("tqdm"):
            return _loader_call(ctx, positional(expr, 0) or kwarg(expr, "iterable"), func, depth + 1)
        return None, None
    if isinstance(expr, cst.Name):
        assigns = ctx.symbols.assignments_of(expr.value, func)
        if len(assigns) == 1 and isinstance(assigns[0].value, cst.Call):
            c, f = _loader_call(ctx, assigns[0].value, assigns[0].func, depth + 1)
            if c is not None:
                return c, f
    try:
        role = ctx.roles.of(expr, func)
    except Exception:  # noqa: BLE001
        role = None
    if role is not None and role.role == "dataloader" and role.origin is not None:
        last = (call_name(role.origin) or "").split(".")[-1]
        if last.endswith("DataLoader"):
            return role.origin, None
    return None, None


def loop_micro_batch(ctx, lp):
    """The micro-batch of a hand-written training loop: the batch size of the DataLoader the loop (or a loop
    inside it) iterates. Without a DataLoader in the file, a single batch-size constant (``MICRO_BATCH = 8``);
    with several DataLoaders and none iterated by the loop, UNKNOWN (an evaluation loader is not the training
    micro-batch)."""
    node = getattr(lp, "node", None)
    func = getattr(lp, "func", None)
    fors = []
    if isinstance(node, (cst.For,)):
        fors.append(node)

    class V(cst.CSTVisitor):
        def visit_For(self, n):
            if n is not node:
                fors.append(n)

    if node is not None:
        walk(node, V())
    for f in fors:
        call, cf = _loader_call(ctx, f.iter, func)
        if call is not None:
            return _loader_batch(ctx, call, cf if cf is not None else func)
    loaders = _calls_named(ctx, "DataLoader")
    if not loaders:
        named = {}
        for name, assigns in ctx.symbols.assignments.items():
            if _BATCH_NAME_RE.fullmatch(name) and len(assigns) == 1:
                f = ctx.resolver.fact(assigns[0].value, assigns[0].func)
                if isinstance(f.value, int) and not isinstance(f.value, bool) and f.value > 0:
                    named[name] = (f, assigns[0].node)
        if len({f.value for f, _ in named.values()}) == 1:
            name = sorted(named)[0]
            f, n = named[name]
            return _F(f.value, f"`{name}` in the script", n, f.kind)
        return _unknown("no DataLoader and no single batch-size constant in the script")
    facts = [_loader_batch(ctx, c, None) for c in loaders]
    vals = {f.value for f in facts if f.known}
    if len(loaders) == 1 or (len(vals) == 1 and all(f.known for f in facts)):
        return facts[0]
    return _unknown(f"{len(loaders)} DataLoaders with batch sizes {sorted(vals)} and none iterated by the training "
                    "loop")


def default_trainer_optim(versions) -> tuple[str, str]:
    """(optim, source) of ``TrainingArguments.optim``'s default: transformers 5.x defaults to
    ``adamw_torch_fused`` when torch >= 2.8 (training_args.py: ``default_optim``), else ``adamw_torch``."""
    try:
        tf, th = versions.transformers, versions.torch
        fused = tf.at_least("5.0.0") and th.at_least("2.8.0")
        src = f"TrainingArguments default for {tf.describe()} with torch {th.text}"
    except Exception:  # noqa: BLE001
        return "adamw_torch", "TrainingArguments default (versions unknown)"
    return ("adamw_torch_fused" if fused else "adamw_torch"), src


def _optim_from_name(optim: str) -> dict:
    o = optim.lower()
    kind = ("adam8bit" if "8bit" in o else "adafactor" if "adafactor" in o else "sgd" if o.startswith("sgd")
            else "adamw")
    return {"kind": kind, "fused": "fused" in o, "foreach": None, "momentum": 0.0, "class": optim}


_OPTIM_CLASSES = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "Adafactor": "adafactor", "AdamW8bit": "adam8bit",
                  "Adam8bit": "adam8bit", "PagedAdamW8bit": "adam8bit", "PagedAdamW": "adamw", "AdamW32bit": "adamw"}


def optimizer_fact(ctx, setup=None):
    """The optimizer of a set-up: ``{"kind": adamw|adam|sgd|adam8bit|adafactor, "fused": bool | None,
    "foreach": bool | None, "momentum": float, "class": str}``. A Trainer without ``optimizers=``: its ``optim``
    (explicit, or the default of the target transformers/torch versions); a hand-written loop: the one
    optimizer constructor of the file (``fused=`` / ``foreach=`` / ``momentum=`` read)."""
    args = getattr(setup, "args", None)
    t = getattr(setup, "trainer", None)
    if args is not None and (t is None or getattr(t, "optimizers", None) is None):
        s = args.setting("optim") if hasattr(args, "setting") else None
        if s is not None:
            if isinstance(s.value, str):
                return _F(_optim_from_name(s.value), f"TrainingArguments optim={s.value!r} ({args.origin('optim')})",
                          s.node)
            return _unknown(f"TrainingArguments optim ({args.origin('optim')})")
        if getattr(args, "open_ended", False):
            return _unknown("TrainingArguments **kwargs not resolved: optim may be set")
        name, src = default_trainer_optim(ctx.versions)
        kind = "default" if getattr(args, "runtime_cli", False) else "literal"
        return _F(_optim_from_name(name), f"{src}: optim={name!r}", None, kind)
    calls = {}
    try:
        roles = ctx.roles.all("optimizer")
    except Exception:  # noqa: BLE001
        roles = []
    for scope, path, role in roles:
        c = role.origin
        if c is not None and (call_name(c) or "").split(".")[-1] in _OPTIM_CLASSES:
            calls[id(c)] = (c, scope if isinstance(scope, cst.FunctionDef) else None)
    if len(calls) != 1:
        return _unknown("no optimizer constructor bertlint reads" if not calls else
                        f"{len(calls)} optimizer constructors in the script")
    c, fn = next(iter(calls.values()))
    last = (call_name(c) or "").split(".")[-1]
    kw = ctx.resolver.call_kwargs(c, fn)
    out = {"kind": _OPTIM_CLASSES[last], "fused": None, "foreach": None, "momentum": 0.0, "class": last}
    src = [f"{last}(...) in the script"]
    kinds = ["literal"]
    for k in ("fused", "foreach", "momentum"):
        f = kw.get(k)
        if f is None:
            continue
        if not f.known:
            return _unknown(f"{k}= of {last}(...) is not statically known ({f.source})", c)
        out[k] = f.value if k != "momentum" else float(f.value or 0.0)
        kinds.append(f.kind)
        src.append(f"{k}={f.value!r}")
    if "**" in kw:
        return _unknown(kw["**"].source, c)
    return _F(out, ", ".join(src), c, _weakest_kind(kinds))


PEFT_LORA_DEFAULTS = {"r": 8, "lora_alpha": 8, "lora_dropout": 0.0}  # peft.LoraConfig field defaults


def lora_fact(ctx):
    """The script's one ``LoraConfig(...)``: ``{"r", "alpha", "dropout", "targets" (tuple or None: PEFT's
    per-model default)}``; None as value when there is none; UNKNOWN when a field cannot be read."""
    calls = _calls_named(ctx, "LoraConfig")
    if not calls:
        return _F(None, "no LoraConfig in the script")
    if len(calls) > 1:
        return _unknown(f"{len(calls)} LoraConfig calls in the script")
    c = calls[0]
    fn = _enclosing_function(ctx, c)
    kw = ctx.resolver.call_kwargs(c, fn)
    if "**" in kw:
        return _unknown(kw["**"].source, c)
    out = {"r": PEFT_LORA_DEFAULTS["r"], "alpha": PEFT_LORA_DEFAULTS["lora_alpha"],
           "dropout": PEFT_LORA_DEFAULTS["lora_dropout"], "targets": None}
    src, kinds = [], ["literal"]
    for k, dest in (("r", "r"), ("lora_alpha", "alpha"), ("lora_dropout", "dropout"), ("target_modules", "targets")):
        f = kw.get(k)
        if f is None:
            src.append(f"{k} PEFT default" if dest != "targets" else "target_modules PEFT's default for the model type")
            continue
        if not f.known:
            return _unknown(f"{k}= of LoraConfig is not statically known ({f.source})", c)
        v = f.value
        if dest == "targets":
            if isinstance(v, str):
                v = (v,)
            elif isinstance(v, (list, tuple)) and all(isinstance(x, str) for x in v):
                v = tuple(v)
            else:
                return _unknown("target_modules of LoraConfig is not a list of names", c)
        out[dest] = v
        kinds.append(f.kind)
        src.append(f"{k}={f.value!r}")
    return _F(out, "LoraConfig(" + ", ".join(src) + ")", c, _weakest_kind(kinds))


def _calls_named(ctx, last: str) -> list:
    """The module's calls whose callee's last dotted part is ``last`` (``DataLoader``), in source order."""
    return [n for n in ctx.index.of(cst.Call) if (call_name(n) or "").split(".")[-1] == last]


def _enclosing_function(ctx, node) -> Optional[cst.FunctionDef]:
    for a in ctx.index.ancestors(node):
        if isinstance(a, cst.FunctionDef):
            return a
    return None
