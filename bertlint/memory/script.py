"""From a training script to :class:`MemorySpec` values: the resolved set-up (``ctx.setup``, the Trainer
analysis, with ``bertlint.analysis.configfiles`` for DeepSpeed files) plus what only the memory simulator needs
(sequence length, autocast). Static: nothing is imported or run.

The model and its configuration, a hand-written loop's micro-batch (the loader the training loop iterates), the
optimizer (``fused=``; the Trainer's default ``optim`` for the target versions) and the LoRA set-up
(``lora_dropout`` included) are the shared set-up facts of ``bertlint.analysis.setup`` (``training_model_fact``,
``loop_micro_batch``, ``optimizer_fact``, ``lora_fact``) that ``explain`` prints too: one set-up model.

Every value carries its origin in ``MemorySpec.assumptions``. What cannot be found is an error that names the
option that supplies it; nothing is guessed silently."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

from bertlint.memory.spec import MemoryInputError, MemorySpec, load_config_file, lookup_architecture

HEAD_SUFFIXES = {
    "ForSequenceClassification": "AutoModelForSequenceClassification",
    "ForTokenClassification": "AutoModelForTokenClassification",
    "ForMaskedLM": "AutoModelForMaskedLM",
    "ForQuestionAnswering": "AutoModelForQuestionAnswering",
    "ForMultipleChoice": "AutoModelForMultipleChoice",
    "ForCausalLM": "AutoModelForCausalLM",
    "ForPreTraining": "AutoModelForPreTraining",
    "Model": "AutoModel",
}
TOKENIZER_MAX_LENGTH = 512  # model_max_length of the BERT-family tokenizers (padding="max_length" without max_length)


@dataclass
class Overrides:
    """Command-line values; each replaces what the script says."""

    seq_len: Optional[int] = None
    model_config: Optional[str] = None
    head: Optional[str] = None
    micro_batch: Optional[int] = None
    precision: Optional[str] = None
    checkpointing: Optional[bool] = None
    optimizer: Optional[str] = None
    zero_stage: Optional[int] = None
    world_size: Optional[int] = None
    lora_rank: Optional[int] = None
    lora_targets: Optional[tuple] = None


@dataclass
class _Found:
    """What the memory scan of the script found (besides ``ctx.setup``)."""

    seq_lens: list = field(default_factory=list)  # (value, row, how)
    padding_max_length: Optional[int] = None  # row of padding="max_length" without max_length
    loader_batch: list = field(default_factory=list)  # (value, row)
    autocast: Optional[tuple] = None  # (precision, row)
    accelerate_precision: Optional[tuple] = None
    optimizers: list = field(default_factory=list)  # (name, momentum, row)
    lora: Optional[tuple] = None  # (rank, targets, row)
    models: list = field(default_factory=list)  # (class name, checkpoint or None, row)
    custom_models: list = field(default_factory=list)  # (class name, row)
    half_cast: Optional[tuple] = None
    accumulation: Optional[tuple] = None
    ckpt_call: Optional[tuple] = None  # (kwargs dict or None, row) of gradient_checkpointing_enable(...)


def _walk(ctx, found: _Found) -> None:
    import libcst as cst

    from bertlint.analysis.symbols import UNKNOWN, call_name, kwarg, positional

    r = ctx.resolver
    user_classes = {}
    for node in ctx.module.body:
        if isinstance(node, cst.ClassDef):
            bases = {getattr(b.value, "attr", getattr(b.value, "value", None)) for b in node.bases}
            bases = {getattr(b, "value", b) for b in bases}
            user_classes[node.name.value] = bases

    def row(node) -> int:
        try:
            return ctx.span(node)[0].row
        except Exception:  # noqa: BLE001
            return 0

    class V(cst.CSTVisitor):
        def __init__(self) -> None:
            self.func = None

        def visit_FunctionDef(self, node):
            self._outer = getattr(self, "_outer", [])
            self._outer.append(self.func)
            self.func = node

        def leave_FunctionDef(self, node):
            self.func = self._outer.pop()

        def val(self, expr):
            return r.value(expr, self.func) if expr is not None else UNKNOWN

        def visit_Call(self, node):
            name = call_name(node) or ""
            last = name.split(".")[-1]
            ml = kwarg(node, "max_length")
            pad = kwarg(node, "padding")
            padv = self.val(pad) if pad is not None else None
            if ml is not None and (pad is not None or kwarg(node, "truncation") is not None or "token" in name.lower()):
                v = self.val(ml)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    how = f"padding={padv!r}" if pad is not None else "truncation"
                    found.seq_lens.append((v, row(node), how))
            elif padv == "max_length" and found.padding_max_length is None:
                found.padding_max_length = row(node)
            if last == "DataLoader":
                bs = kwarg(node, "batch_size") or positional(node, 1)
                v = self.val(bs)
                if isinstance(v, int) and not isinstance(v, bool) and v > 0:
                    ds = positional(node, 0) or kwarg(node, "dataset")
                    dtext = cst.Module([]).code_for_node(ds).lower() if ds is not None else ""
                    is_eval = any(w in dtext for w in ("eval", "val", "test"))
                    if not is_eval:
                        found.loader_batch.append((v, row(node)))
            if last in ("autocast",) and found.autocast is None:
                dt = kwarg(node, "dtype")
                dtxt = cst.Module([]).code_for_node(dt) if dt is not None else ""
                if "bfloat16" in dtxt:
                    found.autocast = ("bf16", row(node))
                elif "float16" in dtxt or "half" in dtxt:
                    found.autocast = ("fp16", row(node))
                elif dt is None:
                    dev = self.val(kwarg(node, "device_type") or positional(node, 0))
                    if "cuda.amp" in name or dev == "cuda":
                        found.autocast = ("fp16", row(node))  # CUDA autocast's default dtype is float16
            if last == "Accelerator":
                mp = self.val(kwarg(node, "mixed_precision"))
                if mp in ("bf16", "fp16"):
                    found.accelerate_precision = (mp, row(node))
                ga = self.val(kwarg(node, "gradient_accumulation_steps"))
                if isinstance(ga, int) and ga > 1:
                    found.accumulation = (ga, row(node))
            if last in ("AdamW", "Adam", "SGD", "AdamW8bit", "Adam8bit", "PagedAdamW8bit", "PagedAdamW", "Adafactor", "AdamW32bit"):
                kind = {"AdamW": "adamw", "Adam": "adam", "SGD": "sgd", "Adafactor": "adafactor", "PagedAdamW": "adamw",
                        "AdamW32bit": "adamw"}.get(last, "adam8bit")
                mom = self.val(kwarg(node, "momentum")) if kind == "sgd" else 0.0
                found.optimizers.append((kind, mom if isinstance(mom, (int, float)) else 0.0, row(node)))
            if last == "gradient_checkpointing_enable" and found.ckpt_call is None:
                k = self.val(kwarg(node, "gradient_checkpointing_kwargs"))
                found.ckpt_call = (k if isinstance(k, dict) else None, row(node))
            if last == "LoraConfig":
                rk = self.val(kwarg(node, "r"))
                tg = self.val(kwarg(node, "target_modules"))
                found.lora = (rk if isinstance(rk, int) else 8,
                              tuple(tg) if isinstance(tg, (list, tuple)) and all(isinstance(t, str) for t in tg) else None,
                              row(node))
            if last in ("half",) or (last == "to" and "float16" in cst.Module([]).code_for_node(node)):
                found.half_cast = found.half_cast or ("fp16-pure", row(node))
            if last == "to" and "bfloat16" in cst.Module([]).code_for_node(node):
                found.half_cast = found.half_cast or ("bf16-pure", row(node))
            if last == "from_pretrained" and isinstance(node.func, cst.Attribute):
                target = node.func.value
                cls = target.attr.value if isinstance(target, cst.Attribute) else getattr(target, "value", None)
                if isinstance(cls, str) and "Model" in cls:
                    ck = self.val(positional(node, 0) or kwarg(node, "pretrained_model_name_or_path"))
                    found.models.append((cls, ck if isinstance(ck, str) else None, row(node)))
            if last in user_classes:
                bases = user_classes[last]
                if bases & {"Module", "PreTrainedModel", "LightningModule"}:
                    found.custom_models.append((last, row(node)))

    ctx.module.visit(V())


def _context(path: str, text: str):
    import libcst as cst

    from bertlint.context import FileContext

    try:
        module = cst.parse_module(text)
    except Exception as e:  # noqa: BLE001
        raise MemoryInputError(f"cannot parse {path}: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}") from None
    settings = None
    try:
        from bertlint.api import load_settings

        settings = load_settings(path)
    except Exception:  # noqa: BLE001 - settings are optional here
        settings = None
    if settings is None:
        from bertlint.config import Settings

        settings = Settings()
    return FileContext(path, text, module, settings)


def _setups(ctx) -> list:
    try:
        return list(ctx.setup.setups)
    except Exception:  # noqa: BLE001 - the Trainer analysis is optional; the memory scan still runs
        return []


def _model_spec(model_info, found: _Found, ov: Overrides, base_dir: str, notes: list,
                trainer_model: bool = False) -> tuple[dict, str, Optional[str]]:
    """(config dict, head class, model name)."""
    head = ov.head
    if found.custom_models and not ov.head and not trainer_model:
        # a custom nn.Module is what trains (a transformers model inside it is only a part): never guess
        cls, row = found.custom_models[0]
        raise MemoryInputError(
            f"the model is a custom class `{cls}` (line {row}) that bertlint memory cannot build: pass "
            "--model-config PATH (a transformers config.json) and --head CLASS (a transformers class such as "
            "AutoModelForSequenceClassification) for the transformers model it wraps")
    name = None
    config = None
    if ov.model_config:
        config = load_config_file(ov.model_config)
        notes.append(f"architecture from --model-config {ov.model_config}")
    if model_info is not None:
        name = getattr(model_info, "checkpoint", None)
        if head is None:
            cls = getattr(model_info, "class_name", None) or getattr(model_info, "declared_class", None)
            hd = getattr(model_info, "head", None)
            if cls and cls.startswith("Auto"):
                head = cls
            elif hd and hd in HEAD_SUFFIXES:
                head = HEAD_SUFFIXES[hd]
            elif cls:
                head = cls
        if config is None:
            arch = getattr(model_info, "architecture", None)
            if isinstance(arch, dict) and arch.get("hidden_size"):
                config = {k: v for k, v in arch.items() if k not in ("aliases", "parameters", "name", "config")}
                if isinstance(arch.get("config"), dict):  # the table's full hyper-parameters
                    config = dict(arch["config"], model_type=arch.get("model_type") or config.get("model_type"))
                if "model_type" not in config and getattr(model_info, "family", None):
                    config["model_type"] = model_info.family
                notes.append(f"architecture: {getattr(model_info, 'architecture_source', None) or 'resolved set-up'}")
    if (config is None or head is None) and found.models:
        cls, ck, row = found.models[0]
        name = name or ck
        if head is None:
            if cls.startswith("Auto"):
                head = cls
            else:
                for suf, auto in HEAD_SUFFIXES.items():
                    if cls.endswith(suf):
                        head = cls
                        break
        if config is None and ck:
            local = os.path.join(base_dir, ck, "config.json")
            if os.path.isfile(local):
                config = load_config_file(local)
                notes.append(f"architecture from {local}")
            else:
                config = lookup_architecture(ck)
                if config is not None:
                    notes.append(f"architecture: built-in table ({ck}, line {row})")
    if config is None:
        if found.custom_models:
            cls, row = found.custom_models[0]
            raise MemoryInputError(
                f"the model is a custom class `{cls}` (line {row}) that bertlint memory cannot build: pass "
                "--model-config PATH (a transformers config.json) and --head CLASS (a transformers class such as "
                "AutoModelForSequenceClassification) for the transformers model it wraps")
        if name:
            raise MemoryInputError(
                f"the architecture of checkpoint {name!r} is not in bertlint's table and no local {name}/config.json "
                "exists: pass --model-config PATH to its config.json (nothing is downloaded)")
        raise MemoryInputError(
            "no transformers model found in the script: pass --model-config PATH (a config.json) and --head CLASS")
    if head is None:
        head = "AutoModelForSequenceClassification"
        notes.append("head: AutoModelForSequenceClassification assumed (the script's model class is not resolved; --head)")
    return config, head, name


def _seq_len(found: _Found, ov: Overrides, notes: list) -> int:
    if ov.seq_len:
        notes.append(f"sequence length {ov.seq_len} from --seq-len")
        return ov.seq_len
    if found.seq_lens:
        vals = sorted({v for v, _, _ in found.seq_lens})
        v, row, how = max(found.seq_lens, key=lambda t: t[0])
        if "max_length" in how:
            notes.append(f"sequence length {v}: tokenizer max_length with padding=\"max_length\" (line {row})")
        else:
            notes.append(f"sequence length {v}: tokenizer max_length (line {row}), {how}; batches padded to the "
                         "longest are at most this long, so the peak is an upper bound")
        if len(vals) > 1:
            notes.append(f"several max_length values in the script ({', '.join(map(str, vals))}): the largest is used")
        return v
    if found.padding_max_length is not None:
        notes.append(f"sequence length {TOKENIZER_MAX_LENGTH}: padding=\"max_length\" without max_length (line "
                     f"{found.padding_max_length}) pads to the tokenizer's model_max_length, 512 for BERT-family checkpoints")
        return TOKENIZER_MAX_LENGTH
    raise MemoryInputError(
        "the sequence length is not in the script (no tokenizer max_length, no padding=\"max_length\"): "
        "pass --seq-len N")


def specs_from_script(path: str, text: Optional[str] = None, overrides: Optional[Overrides] = None) -> list[MemorySpec]:
    """One MemorySpec per training set-up of the script (a Trainer, or a hand-written loop)."""
    ov = overrides or Overrides()
    if text is None:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as e:
            raise MemoryInputError(f"cannot read {path}: {e.strerror}") from None
    ctx = _context(path, text)
    found = _Found()
    _walk(ctx, found)
    setups = [s for s in _setups(ctx) if getattr(s, "trainer", None) is not None or getattr(s, "model", None) is not None]
    base_dir = os.path.dirname(os.path.abspath(path))
    if not setups:
        models = []
        try:
            models = list(ctx.setup.models)
        except Exception:  # noqa: BLE001
            models = []
        setups = [_LoopSetup(models[0] if models else None)]
    return [spec_from_setup(s, ctx=ctx, found=found, overrides=ov, base_dir=base_dir) for s in setups]


def spec_for_context(setup, ctx, overrides: Optional[Overrides] = None) -> MemorySpec:
    """The :class:`MemorySpec` of one set-up of the file behind ``ctx``, built as :func:`specs_from_script` builds
    it (the shared set-up model plus the memory scan of the same tree, base directory beside the file). Without a
    ``ctx`` only the set-up object is read."""
    if ctx is None:
        return spec_from_setup(setup, overrides=overrides)
    found = getattr(ctx, "_memory_found", None)
    if found is None:
        found = _Found()
        _walk(ctx, found)
        try:
            ctx._memory_found = found
        except AttributeError:
            pass
    base_dir = os.path.dirname(os.path.abspath(ctx.filename))
    return spec_from_setup(setup, ctx=ctx, found=found, overrides=overrides, base_dir=base_dir)


# PEFT's default LoRA target modules per model type (peft.utils.constants
# TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING)
PEFT_TARGETS = {
    "bert": ("query", "value"), "roberta": ("query", "value"), "xlm-roberta": ("query", "value"),
    "electra": ("query", "value"), "camembert": ("query", "value"), "deberta": ("in_proj",),
    "deberta-v2": ("query_proj", "value_proj"), "distilbert": ("q_lin", "v_lin"), "albert": ("query", "value"),
    "gpt2": ("c_attn",), "llama": ("q_proj", "v_proj"), "mistral": ("q_proj", "v_proj"),
    "qwen2": ("q_proj", "v_proj"), "opt": ("q_proj", "v_proj"), "gpt_neox": ("query_key_value",),
    "t5": ("q", "v"), "modernbert": ("Wqkv",),
}


def _facts():
    from bertlint.analysis import setup as S

    return S


def _model_fact(ctx, setup, found, ov, trainer_model):
    """The training model from the shared set-up facts, or None (then the older scan applies)."""
    if ctx is None or ov.model_config or (found.custom_models and not trainer_model):
        return None
    try:
        m = _facts().training_model_fact(ctx, setup)
    except Exception:  # noqa: BLE001 - the older scan still runs
        return None
    if m is None:
        return None
    node = m.get("node")
    import libcst as cst

    from bertlint.analysis.symbols import call_name, kwarg, positional

    if isinstance(node, cst.Call) and (call_name(node) or "").endswith("from_pretrained"):
        ck = ctx.resolver.fact(positional(node, 0) or kwarg(node, "pretrained_model_name_or_path"),
                               _facts()._enclosing_function(ctx, node))
        if isinstance(ck.value, str):
            m = dict(m, checkpoint=ck.value)
    return m


def _loop_micro_batch(ctx):
    """The micro-batch fact of the file's training loop(s): they must agree; None without a loop."""
    try:
        loops = [lp for lp in ctx.loops if getattr(lp, "backwards", None) is None or lp.backwards]
    except Exception:  # noqa: BLE001
        loops = []
    S = _facts()
    facts = [S.loop_micro_batch(ctx, lp) for lp in loops]
    if not facts:  # no training loop seen: the file's loaders (one batch size, or unknown), never the first one
        return S.loop_micro_batch(ctx, None)
    vals = {f.value for f in facts if f.known}
    if len(vals) == 1:  # an outer (epoch) loop that iterates no loader itself does not make the batch unknown
        return next(f for f in facts if f.known)
    if len(vals) > 1:
        return S._unknown(f"{len(facts)} training loops with micro-batches {sorted(vals)}")
    return next(f for f in facts if not f.known)


def _optimizer_fact(ctx, setup):
    try:
        return _facts().optimizer_fact(ctx, setup)
    except Exception:  # noqa: BLE001
        return None


def _lora_fact(ctx):
    try:
        return _facts().lora_fact(ctx)
    except Exception:  # noqa: BLE001
        return None


@dataclass
class _LoopSetup:
    """A hand-written loop: only the model is known from ``ctx.setup``; the rest comes from the memory scan."""

    model: Any
    args: Any = None
    trainer: Any = None
    framework: str = "loop"


def _int(v: Any) -> Optional[int]:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    if isinstance(v, float) and not v.is_integer():
        return None
    return int(v)


def spec_from_setup(setup, *, ctx=None, found: Optional[_Found] = None, overrides: Optional[Overrides] = None,
                    base_dir: str = ".") -> MemorySpec:
    """A :class:`MemorySpec` from one ``ctx.setup`` training set-up (``bertlint.analysis.setup.TrainingSetup``),
    completed by the memory scan of the script (``found``) and the command-line ``overrides``."""
    ov = overrides or Overrides()
    if found is None:
        found = _Found()
        if ctx is not None:
            _walk(ctx, found)
    notes: list[str] = []
    model_info = getattr(setup, "model", None)
    args = getattr(setup, "args", None)
    trainer_model = getattr(setup, "trainer", None) is not None and model_info is not None
    mf = _model_fact(ctx, setup, found, ov, trainer_model)
    num_labels = 2
    if mf is not None:
        cf = mf["config"]
        if not cf.known:
            raise MemoryInputError(f"the model's configuration is not statically known ({cf.source}): pass "
                                   "--model-config PATH (a transformers config.json)")
        config = {k: v for k, v in cf.value.items() if k not in ("architectures", "_name_or_path", "transformers_version")}
        head = ov.head or mf["class"]
        name = mf.get("checkpoint") or getattr(model_info, "checkpoint", None)
        notes.append(f"architecture: {cf.describe(ctx)}")
        if isinstance(config.get("num_labels"), int) and config["num_labels"] > 0:
            num_labels = config["num_labels"]
        elif isinstance(config.get("id2label"), dict) and config["id2label"]:
            num_labels = len(config["id2label"])
    else:
        config, head, name = _model_spec(model_info, found, ov, base_dir, notes, trainer_model)
    seq = _seq_len(found, ov, notes)

    # micro-batch: the same set-up facts ``explain`` prints (bertlint.analysis.setup)
    mb = ov.micro_batch
    if mb:
        notes.append(f"micro-batch {mb} from --micro-batch")
    elif args is not None:
        mb = _int(getattr(setup, "micro_batch", None))
        if mb is None:
            raise MemoryInputError(
                "per_device_train_batch_size is not statically known (set at run time?): pass --micro-batch N")
        notes.append(f"micro-batch {mb}: per_device_train_batch_size ({args.origin('per_device_train_batch_size')})")
    else:
        f = _loop_micro_batch(ctx) if ctx is not None else None
        if f is not None and f.known:
            mb = f.value
            notes.append(f"micro-batch {mb}: {f.describe(ctx)}")
        elif f is not None:
            raise MemoryInputError(f"the micro-batch size is not statically known ({f.source}): pass --micro-batch N")
        elif found.loader_batch:
            mb, row = found.loader_batch[0]
            notes.append(f"micro-batch {mb}: DataLoader batch_size (line {row})")
        else:
            raise MemoryInputError("the micro-batch size is not in the script (no TrainingArguments, no DataLoader "
                                   "batch_size): pass --micro-batch N")

    # accumulation
    acc = 1
    if args is not None:
        acc = _int(getattr(setup, "accumulation", None)) or 1
    elif found.accumulation:
        acc = found.accumulation[0]

    # precision
    precision = ov.precision
    if precision is None:
        weights = getattr(model_info, "weights_dtype", None) if model_info is not None else None
        amp = None
        if args is not None:
            if args.get("bf16") is True:
                amp = "bf16"
            elif args.get("fp16") is True:
                amp = "fp16"
        amp = amp or (found.accelerate_precision or (None,))[0] or (found.autocast or (None,))[0]
        if weights in ("bfloat16", "float16"):
            precision = "bf16-pure" if weights == "bfloat16" else "fp16-pure"
            notes.append(f"weights loaded or cast to {weights}" + (f" ({amp} autocast on top changes little)" if amp else ""))
        elif found.half_cast and not amp:
            precision = found.half_cast[0]
            notes.append(f"model cast to half precision (line {found.half_cast[1]})")
        else:
            precision = amp or "fp32"
            if amp:
                notes.append(f"{amp} mixed precision (autocast) on fp32 weights")

    # checkpointing
    ckpt, reentrant = False, False
    if ov.checkpointing is not None:
        ckpt = ov.checkpointing
    else:
        c = getattr(setup, "checkpointing", None)
        if c is None and model_info is not None and getattr(model_info, "checkpointing", None):
            c = True  # a hand-written loop: model.gradient_checkpointing_enable(...) was called
        if c is None and found.ckpt_call is not None:
            c = True
        ckpt = c is True
        if c is not True and c is not False and c is not None:
            notes.append("whether checkpointing is on is not statically known: simulated off (--checkpointing)")
    if ckpt:
        kw = getattr(setup, "checkpointing_kwargs", None)
        calls = getattr(model_info, "checkpointing", None) if model_info is not None else None
        if not hasattr(setup, "checkpointing_kwargs") and calls:
            kw = getattr(calls[-1], "kwargs", None)
        elif not hasattr(setup, "checkpointing_kwargs") and found.ckpt_call is not None:
            kw = found.ckpt_call[0]
        if isinstance(kw, dict) and isinstance(kw.get("use_reentrant"), bool):
            reentrant = kw["use_reentrant"]
        elif kw is None:
            reentrant = False
            notes.append("checkpointing kwargs not given: transformers 5.x uses use_reentrant=False (4.x: True; the "
                         "memory is the same)")
        else:
            reentrant = True
            notes.append("checkpointing kwargs without use_reentrant: torch's default, reentrant")

    # optimizer: the set-up fact (a Trainer's optim or its default for the target versions; a loop's constructor)
    opt, mom, fused = "adamw", 0.0, None
    of = _optimizer_fact(ctx, setup) if ctx is not None else None
    if ov.optimizer:
        opt = ov.optimizer
        notes.append(f"optimizer {opt} from --optimizer")
    elif of is not None and of.known:
        opt, mom, fused = of.value["kind"], of.value.get("momentum") or 0.0, of.value.get("fused")
        notes.append(f"optimizer {opt}{' (fused)' if fused else ''}: {of.describe(ctx)}")
    elif of is not None and args is None and "no optimizer constructor" not in of.source:
        raise MemoryInputError(f"the optimizer is not statically known ({of.source}): pass --optimizer NAME")
    elif found.optimizers:
        opt, mom, row = found.optimizers[0]
        notes.append(f"optimizer {opt} (line {row})")
    else:
        notes.append("optimizer: none found in the script; AdamW assumed (pass --optimizer)")

    # PEFT / frozen parameters
    lora_rank, targets, dropout, alpha = ov.lora_rank, None, 0.0, None
    lf = _lora_fact(ctx) if ctx is not None else None
    peft = bool(mf is not None and mf["peft"]) or bool(model_info is not None and getattr(model_info, "peft", False))
    if lora_rank is None and (peft or (lf is not None and lf.value is not None)):
        if lf is None or not lf.known:
            raise MemoryInputError(f"the LoRA set-up is not statically known ({lf.source if lf else 'no LoraConfig'}): "
                                   "pass --lora-rank R and --lora-targets NAMES")
        if lf.value is None:
            raise MemoryInputError("a PEFT model without a LoraConfig in the script: pass --lora-rank R and "
                                   "--lora-targets NAMES")
        lora_rank, targets = lf.value["r"], lf.value["targets"]
        dropout, alpha = float(lf.value["dropout"] or 0.0), lf.value["alpha"]
        notes.append(f"LoRA: {lf.describe(ctx)}")
    if ov.lora_targets:
        targets = tuple(ov.lora_targets)
    if lora_rank and targets is None:
        targets = PEFT_TARGETS.get(str(config.get("model_type")))
        if targets is None:
            raise MemoryInputError(f"PEFT's default LoRA targets for model_type {config.get('model_type')!r} are not "
                                   "known to bertlint: pass --lora-targets NAMES")
        notes.append(f"LoRA targets {', '.join(targets)}: PEFT's default for model_type {config.get('model_type')!r}")
    frozen: tuple = ()
    if model_info is not None and getattr(model_info, "frozen_inputs", None):
        frozen = ("embeddings",)
        notes.append("the embeddings are frozen")

    # ZeRO
    zero, world = 0, 1
    ds = args.get("deepspeed") if args is not None else None
    if isinstance(ds, str) and ctx is not None:
        try:
            from bertlint.analysis.configfiles import load_config

            data, err = load_config(os.path.join(base_dir, ds))
        except Exception as e:  # noqa: BLE001
            data, err = None, str(e)
        if isinstance(data, dict):
            st = (data.get("zero_optimization") or {}).get("stage") if isinstance(data.get("zero_optimization"), dict) else None
            if isinstance(st, int):
                zero = st
                notes.append(f"ZeRO stage {st} from {ds}")
        elif err:
            notes.append(f"DeepSpeed config {ds} not read ({err}): ZeRO not applied (--zero-stage)")
    elif isinstance(ds, dict):
        zo = ds.get("zero_optimization")
        if isinstance(zo, dict) and isinstance(zo.get("stage"), int):
            zero = zo["stage"]
            notes.append(f"ZeRO stage {zero} from the inline DeepSpeed config")
    if ov.zero_stage is not None:
        zero = ov.zero_stage
    if ov.world_size:
        world = ov.world_size
    else:
        ws = getattr(getattr(ctx, "settings", None), "world_size", None) if ctx is not None else None
        if isinstance(ws, int) and ws > 0:
            world = ws
            notes.append(f"world size {ws} from [tool.bertlint] world-size")
    if zero and world == 1:
        notes.append(f"ZeRO stage {zero} over 1 device shards nothing: pass --world-size W")

    spec = MemorySpec(config=config, head=head, model_name=name, micro_batch=mb, seq_len=seq, precision=precision,
                      checkpointing=ckpt, reentrant=reentrant, optimizer=opt, sgd_momentum=float(mom or 0.0),
                      lora_rank=lora_rank, lora_targets=tuple(targets or ("query", "value")), frozen_modules=frozen,
                      zero_stage=zero, world_size=world, accumulation=acc, assumptions=notes, fused=fused,
                      lora_dropout=dropout, lora_alpha=alpha, num_labels=num_labels)
    if ov.lora_rank:
        notes.append(f"LoRA rank {ov.lora_rank} from --lora-rank")
    spec.validate()
    return spec
