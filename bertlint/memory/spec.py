"""What the simulator needs to know about a training set-up, and the errors it raises when it cannot know it."""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Optional

PRECISIONS = ("fp32", "bf16", "fp16", "bf16-pure", "fp16-pure")
OPTIMIZERS = ("adamw", "adam", "sgd", "adam8bit", "adafactor")
PRECISION_TEXT = {
    "fp32": "fp32",
    "bf16": "bf16 autocast (fp32 weights)",
    "fp16": "fp16 autocast (fp32 weights)",
    "bf16-pure": "pure bf16 weights",
    "fp16-pure": "pure fp16 weights",
}
# heads the simulator knows how to feed (inputs and labels)
HEADS = (
    "AutoModel",
    "AutoModelForSequenceClassification",
    "AutoModelForTokenClassification",
    "AutoModelForMaskedLM",
    "AutoModelForQuestionAnswering",
    "AutoModelForPreTraining",
    "AutoModelForCausalLM",
    "AutoModelForMultipleChoice",
)


class MemoryInputError(Exception):
    """Something the simulation needs is missing or cannot be built; the message says which option supplies it."""


@dataclass
class MemorySpec:
    config: dict  # architecture: a transformers config dict with "model_type"
    head: str = "AutoModelForSequenceClassification"  # an Auto class or a concrete class name (BertForMaskedLM)
    model_name: Optional[str] = None  # the checkpoint name, for the report
    micro_batch: int = 8
    seq_len: int = 128
    precision: str = "fp32"
    checkpointing: bool = False
    reentrant: bool = False
    optimizer: str = "adamw"
    sgd_momentum: float = 0.0
    lora_rank: Optional[int] = None
    lora_targets: tuple = ("query", "value")
    lora_dropout: float = 0.0  # LoraConfig(lora_dropout=...): a dropout on the adapter's input (keeps a mask)
    lora_alpha: Optional[float] = None  # None: 2 x rank (only the scaling; no memory effect)
    fused: Optional[bool] = None  # torch.optim AdamW/Adam/SGD fused=True (no multi-tensor temporaries)
    frozen_modules: tuple = ()  # parameter-name prefixes that do not train (e.g. "bert.embeddings")
    zero_stage: int = 0
    world_size: int = 1
    accumulation: int = 1
    num_labels: int = 2
    assumptions: list = field(default_factory=list)  # where each value came from

    def with_(self, **kw) -> "MemorySpec":
        return replace(self, assumptions=list(self.assumptions), **kw)

    def validate(self) -> None:
        if self.precision not in PRECISIONS:
            raise MemoryInputError(f"unknown precision {self.precision!r}; --precision takes one of {', '.join(PRECISIONS)}")
        if self.optimizer not in OPTIMIZERS:
            raise MemoryInputError(f"unknown optimizer {self.optimizer!r}; --optimizer takes one of {', '.join(OPTIMIZERS)}")
        if not isinstance(self.config, dict) or "model_type" not in self.config:
            raise MemoryInputError("the model configuration has no model_type; pass --model-config PATH to a config.json")
        if self.micro_batch < 1 or self.seq_len < 1:
            raise MemoryInputError("micro-batch and sequence length must be positive (--micro-batch, --seq-len)")
        max_pos = self.config.get("max_position_embeddings")
        if isinstance(max_pos, int) and self.seq_len > max_pos:
            raise MemoryInputError(
                f"sequence length {self.seq_len} exceeds the model's max_position_embeddings {max_pos}; "
                "pass a shorter --seq-len")


# ---- architectures: the shared table (bertlint/data/architectures.json), a config.json, or --model-config

_TABLE_KEYS_DROP = {"aliases", "parameters", "_comment"}


def _table() -> dict:
    path = Path(__file__).resolve().parent.parent / "data" / "architectures.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    archs = data.get("architectures", data) if isinstance(data, dict) else {}
    return archs if isinstance(archs, dict) else {}


def lookup_architecture(name: str) -> Optional[dict]:
    """The config dict for a checkpoint name (``bert-base-uncased``, ``google-bert/bert-base-uncased``)."""
    table = _table()
    key = name.strip()
    cands = [key, key.split("/")[-1]]
    for cand in cands:
        for k, v in table.items():
            if not isinstance(v, dict):
                continue
            if cand == k or cand in (v.get("aliases") or []):
                out = {kk: vv for kk, vv in v.items() if kk not in _TABLE_KEYS_DROP and kk != "config"}
                if isinstance(v.get("config"), dict):  # every published hyper-parameter (relative attention ...)
                    out = dict(v["config"], model_type=v["model_type"])
                return out
    return None


def known_architectures() -> list[str]:
    return sorted(k for k, v in _table().items() if isinstance(v, dict))


def load_config_file(path: str) -> dict:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as e:
        raise MemoryInputError(f"cannot read the model configuration {path}: {e.strerror}") from None
    except ValueError as e:
        raise MemoryInputError(f"{path} is not valid JSON: {e}") from None
    if not isinstance(data, dict) or "model_type" not in data:
        raise MemoryInputError(f"{path} has no \"model_type\": a transformers config.json is expected")
    return data


def resolve_model(name: Optional[str], base_dir: Optional[str] = None) -> Optional[dict]:
    """A checkpoint name or a local directory holding config.json -> config dict, or None."""
    if not name:
        return None
    for d in filter(None, [base_dir, "."]):
        p = Path(d) / name / "config.json"
        if p.is_file():
            return load_config_file(str(p))
    return lookup_architecture(name)


def model_config_suffix(cfg: dict) -> str:
    return ", ".join(f"{k}={cfg[k]}" for k in ("hidden_size", "num_hidden_layers", "num_attention_heads") if k in cfg)

