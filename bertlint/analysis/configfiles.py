"""DeepSpeed JSON and accelerate YAML configuration: reading, key positions, a small model of what each
framework will do with the values, and locating the configurations a training script uses.

Used by BL402, BL403, BL408, BL411 and (through the helpers at the end: ``deepspeed_enabled_for``,
``accelerate_config_for``, ``deepspeed_gas_for``, ``launcher_world_size``) by the loop rules BL104, BL109, BL115.

Facts (REFERENCE.md §1.12, §2.1-2.2, §4, §5):

* DeepSpeed 0.19.x ``_set_batch_related_parameters`` derives a missing value of the batch triple with floor
  division, then asserts ``train_batch_size == micro * gas * world_size`` (all > 0). DeepSpeed reads its
  config with hjson, so comments are accepted.
* The HF Trainer fills every ``"auto"`` value from TrainingArguments and records every literal that differs
  (raised at ``train()``). accelerate's DeepSpeedPlugin adds ``gradient_accumulation_steps = 1`` when missing.
* ``GRADIENT_CLIPPING_DEFAULT`` is 1.0 from deepspeed 0.19.3 (PR #8068); 0.0 (off) before.

Never imports torch / transformers / accelerate / deepspeed. Bad input yields ``None`` / "unknown", never a
traceback.
"""

from __future__ import annotations

import json
import os
import re
from bertlint._dataclass import dataclass, field
from functools import lru_cache
from typing import Any, Iterator, Optional

try:  # libcst is only needed for the script side
    import libcst as cst
except Exception:  # pragma: no cover
    cst = None  # type: ignore

from bertlint.analysis.versions import repo_root as _repo_root

AUTO = "auto"

# First deepspeed release whose GRADIENT_CLIPPING_DEFAULT is 1.0 (read from the sdists: 0.19.2 has 0., 0.19.3 1.0).
DS_CLIP_DEFAULT_SINCE = (0, 19, 3)
DS_ASSUMED_VERSION = (0, 19, 8)

# ------------------------------------------------------------------------------------------------ reading


def _strip_json_comments(text: str) -> str:
    """Remove // and /* */ and # comments and trailing commas outside strings (hjson-ish leniency), keeping
    line/column positions (comments are replaced by spaces)."""
    out = []
    i, n = 0, len(text)
    in_str = False
    while i < n:
        c = text[i]
        if in_str:
            out.append(c)
            if c == "\\" and i + 1 < n:
                out.append(text[i + 1])
                i += 2
                continue
            if c == '"':
                in_str = False
            i += 1
            continue
        if c == '"':
            in_str = True
            out.append(c)
            i += 1
            continue
        if c == "#" or (c == "/" and i + 1 < n and text[i + 1] == "/"):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out.append(" " * (j - i))
            i = j
            continue
        if c == "/" and i + 1 < n and text[i + 1] == "*":
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append("".join(ch if ch == "\n" else " " for ch in text[i:j]))
            i = j
            continue
        out.append(c)
        i += 1
    s = "".join(out)
    # trailing commas: ",   }" -> "    }"
    return re.sub(r",(\s*[}\]])", lambda m: " " + m.group(1), s)


def parse_text(text: str, filename: str = "config.json") -> tuple[Any, Optional[str], str]:
    """(data, error, fmt) for JSON or YAML text. ``fmt`` is "json" or "yaml" (by suffix; a .json that is not
    JSON is not retried as YAML)."""
    low = (filename or "").lower()
    if low.endswith((".yaml", ".yml")):
        try:
            import yaml
        except Exception:
            return None, "PyYAML is not installed", "yaml"
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except Exception as e:  # yaml.YAMLError, RecursionError, ...
            return None, f"invalid YAML: {str(e).splitlines()[0] if str(e) else type(e).__name__}", "yaml"
        data = next((d for d in docs if isinstance(d, dict)), docs[0] if docs else None)
        return data, None, "yaml"
    try:
        return json.loads(text), None, "json"
    except (ValueError, RecursionError):
        pass
    try:
        return json.loads(_strip_json_comments(text)), None, "json"
    except json.JSONDecodeError as e:
        return None, f"invalid JSON: {e.msg} (line {e.lineno}, column {e.colno})", "json"
    except (ValueError, RecursionError) as e:
        return None, f"invalid JSON: {e}", "json"


@dataclass
class ConfigDoc:
    """One configuration file (or text) with its parsed data and key positions."""

    path: Optional[str]
    text: str
    data: Any
    fmt: str
    error: Optional[str] = None
    _positions: Optional[dict] = field(default=None, repr=False)

    @property
    def kind(self) -> str:
        return classify(self.data)

    def positions(self) -> dict:
        if self._positions is None:
            self._positions = key_positions(self.text, self.fmt)
        return self._positions

    def key_position(self, path: tuple) -> tuple[int, int]:
        """(row, col), 1-based, of the key ``path``; the deepest enclosing key found, else (1, 1)."""
        pos = self.positions()
        path = tuple(path)
        while path:
            if path in pos:
                return pos[path]
            path = path[:-1]
        return (1, 1)

    def has_key_position(self, path: tuple) -> bool:
        return tuple(path) in self.positions()


def key_positions(text: str, fmt: str) -> dict:
    """{path: (row, col)} for each key of a JSON/YAML document (best effort; comments tolerated in JSON)."""
    try:
        from bertlint.sources import key_positions as _kp  # core's implementation, shared with ConfigContext
    except Exception:  # pragma: no cover
        _kp = None
    if _kp is None:
        return {}
    if fmt == "json":
        out = _kp(text, "json")
        if not out and ("//" in text or "/*" in text or "#" in text):
            out = _kp(_strip_json_comments(text), "json")
        return out
    return _kp(text, fmt)


_MAX_BYTES = 2_000_000


@lru_cache(maxsize=256)
def _load_cached(path: str, mtime: float, size: int) -> ConfigDoc:
    try:
        with open(path, "rb") as f:
            raw = f.read(_MAX_BYTES + 1)
    except OSError as e:
        return ConfigDoc(path, "", None, "json", f"cannot read {path}: {e.strerror or e}")
    if len(raw) > _MAX_BYTES:
        return ConfigDoc(path, "", None, "json", f"{path} is too large to be a configuration file")
    text = raw.decode("utf-8-sig", errors="replace")
    data, err, fmt = parse_text(text, path)
    return ConfigDoc(path, text, data, fmt, err)


def load_document(path: str) -> ConfigDoc:
    try:
        st = os.stat(path)
    except OSError as e:
        return ConfigDoc(path, "", None, "json", f"cannot read {path}: {e.strerror or e}")
    if not os.path.isfile(path):
        return ConfigDoc(path, "", None, "json", f"{path} is not a file")
    return _load_cached(os.path.abspath(path), st.st_mtime, st.st_size)


def load_config(path: str) -> tuple[Any, Optional[str]]:
    """(data, error): a DeepSpeed JSON, accelerate YAML, or JSON/YAML arguments file. ``error`` is None on
    success; ``data`` is None on failure."""
    doc = load_document(path)
    return doc.data, doc.error


# --------------------------------------------------------------------------------------------- classify

_DS_STRONG = {"zero_optimization", "train_micro_batch_size_per_gpu"}
_DS_KEYS = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "gradient_clipping",
    "zero_optimization", "fp16", "bf16", "amp", "optimizer", "scheduler", "steps_per_print",
    "wall_clock_breakdown", "zero_allow_untested_optimizer", "zero_force_ds_cpu_optimizer",
    "activation_checkpointing", "flops_profiler", "communication_data_type", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "aio", "tensorboard", "wandb", "csv_monitor",
    "comms_logger", "checkpoint", "data_types", "compression_training", "elasticity", "dump_state",
    "memory_breakdown", "seq_parallel_communication_data_type", "torch_autocast", "nebula", "pipeline",
    "data_efficiency", "curriculum_learning", "autotuning", "compile", "zero_optimization_stage",
    "disable_allgather", "gradient_accumulation_dtype", "train_batch_size_per_gpu", "eigenvalue",
    "progressive_layer_drop", "quantize_training", "hybrid_engine", "weight_quantization", "steps_per_log",
}
_ARGS_KEYS = {"output_dir", "per_device_train_batch_size", "model_name_or_path", "num_train_epochs",
              "learning_rate", "do_train", "eval_strategy", "evaluation_strategy", "logging_steps"}
_ACC_STRONG = {"distributed_type", "compute_environment"}
_ACC_KEYS = {
    "compute_environment", "distributed_type", "num_processes", "machine_rank", "num_machines",
    "deepspeed_config", "fsdp_config", "main_training_function", "downcast_bf16", "use_cpu", "mixed_precision",
    "gpu_ids", "main_process_ip", "main_process_port", "rdzv_backend", "same_network", "tpu_env",
    "tpu_use_cluster", "tpu_use_sudo", "debug", "enable_cpu_affinity", "megatron_lm_config", "dynamo_config",
    "ipex_config", "mpirun_config", "fp8_config", "parallelism_config",
}


def _ds_structures(d: dict) -> int:
    n = 0
    for k in ("fp16", "bf16", "amp"):
        if isinstance(d.get(k), dict) and "enabled" in d[k]:
            n += 1
    for k in ("optimizer", "scheduler"):
        if isinstance(d.get(k), dict) and "type" in d[k]:
            n += 1
    for k in ("gradient_clipping", "steps_per_print", "wall_clock_breakdown", "zero_allow_untested_optimizer",
              "zero_force_ds_cpu_optimizer", "prescale_gradients", "communication_data_type"):
        if k in d:
            n += 1
    if isinstance(d.get("activation_checkpointing"), dict):
        n += 1
    return n


def classify(data: Any) -> str:
    """"deepspeed" | "accelerate" | "unknown", from the top-level keys. Conservative: a project's own JSON
    that happens to hold ``train_batch_size`` is "unknown"."""
    if not isinstance(data, dict) or not data:
        return "unknown"
    keys = {k for k in data if isinstance(k, str)}
    if keys & _ACC_STRONG and len(keys & _ACC_KEYS) >= max(2, len(keys) // 2):
        return "accelerate"
    if keys & _ACC_STRONG and not keys & _DS_STRONG:
        return "accelerate"
    if keys & _ARGS_KEYS and not keys & _DS_STRONG:
        return "unknown"
    known = len(keys & _DS_KEYS)
    if keys & _DS_STRONG and known * 2 >= len(keys):
        return "deepspeed"
    if _ds_structures(data) >= 2 and known * 2 >= len(keys):
        return "deepspeed"
    return "unknown"


# ------------------------------------------------------------------------------------ DeepSpeed model


def _get(data: Any, path: tuple) -> Any:
    cur = data
    for p in path:
        if isinstance(cur, dict) and p in cur:
            cur = cur[p]
        else:
            return None
    return cur


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _as_bool(v: Any) -> Optional[bool]:
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.lower() in ("true", "false"):
        return v.lower() == "true"
    return None


@dataclass
class DeepSpeedConfig:
    """What a DeepSpeed config states. Values are as written: an int/float/bool, ``"auto"``, or None when the
    key is absent. ``present`` holds the top-level keys."""

    data: dict
    train_batch_size: Any = None
    micro_batch: Any = None
    gradient_accumulation_steps: Any = None
    gradient_clipping: Any = None
    has_gradient_clipping: bool = False
    zero_stage: Any = None
    offload_optimizer: Optional[str] = None
    offload_param: Optional[str] = None
    fp16: Any = None  # fp16.enabled as written (None: no fp16 block / no enabled key)
    bf16: Any = None
    optimizer_type: Optional[str] = None
    optimizer_params: dict = field(default_factory=dict)
    scheduler_type: Optional[str] = None
    scheduler_params: dict = field(default_factory=dict)

    @classmethod
    def from_data(cls, data: Any) -> Optional["DeepSpeedConfig"]:
        if not isinstance(data, dict):
            return None
        z = data.get("zero_optimization") if isinstance(data.get("zero_optimization"), dict) else {}

        def dev(block: Any) -> Optional[str]:
            if isinstance(block, dict):
                d = block.get("device")
                return d if isinstance(d, str) else None
            return None

        def enabled(key: str) -> Any:
            b = data.get(key)
            if isinstance(b, dict):
                return b.get("enabled")
            return None

        opt = data.get("optimizer") if isinstance(data.get("optimizer"), dict) else {}
        sch = data.get("scheduler") if isinstance(data.get("scheduler"), dict) else {}
        bf = enabled("bf16")
        if bf is None and isinstance(data.get("bfloat16"), dict):  # old spelling
            bf = data["bfloat16"].get("enabled")
        return cls(
            data=data,
            train_batch_size=data.get("train_batch_size"),
            micro_batch=data.get("train_micro_batch_size_per_gpu"),
            gradient_accumulation_steps=data.get("gradient_accumulation_steps"),
            gradient_clipping=data.get("gradient_clipping"),
            has_gradient_clipping="gradient_clipping" in data,
            zero_stage=z.get("stage") if isinstance(z, dict) else None,
            offload_optimizer=dev(z.get("offload_optimizer")) if isinstance(z, dict) else None,
            offload_param=dev(z.get("offload_param")) if isinstance(z, dict) else None,
            fp16=enabled("fp16"),
            bf16=bf,
            optimizer_type=opt.get("type") if isinstance(opt.get("type"), str) else None,
            optimizer_params=opt.get("params") if isinstance(opt.get("params"), dict) else {},
            scheduler_type=sch.get("type") if isinstance(sch.get("type"), str) else None,
            scheduler_params=sch.get("params") if isinstance(sch.get("params"), dict) else {},
        )

    def auto_keys(self) -> list[tuple]:
        """Key paths whose value is ``"auto"`` (filled by the HF Trainer / accelerate)."""
        out: list[tuple] = []

        def walk(d: Any, path: tuple) -> None:
            if isinstance(d, dict):
                for k, v in d.items():
                    walk(v, path + (k,))
            elif d == AUTO:
                out.append(path)

        walk(self.data, ())
        return out


# ----------------------------------------------------------------------------------- batch arithmetic


@dataclass
class BatchCheck:
    """The DeepSpeed batch rule for one config: ``train_batch_size == micro * gas * world_size``.

    ``status``: "ok" (consistent at the given world size, or consistent world sizes exist and none is given),
    "never" (no world size can satisfy it), "mismatch" (inconsistent at the given world size),
    "invalid" (a literal <= 0), "skip" (not enough literal values to say anything)."""

    status: str
    message: str = ""
    consistent_world_sizes: Optional[list[int]] = None  # None: any world size; [] none
    divisor: Optional[int] = None  # world sizes that divide this are consistent (when one value is derived)
    key: tuple = ()


def _divisors(n: int, limit: int = 12) -> tuple[list[int], bool]:
    out = [d for d in range(1, min(n, 100000) + 1) if n % d == 0] if n <= 100000 else []
    return out[:limit], len(out) > limit


def _fmt_sizes(sizes: list[int], more: bool, of: Optional[int] = None) -> str:
    if not sizes:
        return "none"
    s = ", ".join(str(x) for x in sizes)
    if more:
        s += f", … (the divisors of {of})" if of else ", …"
    return s


def check_batch(tb: Any, mb: Any, gas: Any, world_size: Optional[int] = None,
                world_source: str = "") -> BatchCheck:
    """Apply DeepSpeed 0.19's batch rule to the values as written (``"auto"`` or None = filled/derived)."""
    lits = {"train_batch_size": tb, "train_micro_batch_size_per_gpu": mb, "gradient_accumulation_steps": gas}
    for k, v in lits.items():
        if _is_int(v) and v <= 0:
            return BatchCheck("invalid", f"`{k}` is {v}; DeepSpeed asserts it is greater than 0.", key=(k,))
        if v is not None and v != AUTO and not _is_int(v):
            return BatchCheck("skip")
    if not _is_int(tb):
        return BatchCheck("skip")  # train_batch_size is derived (or auto-filled): always consistent
    ws_txt = f"world size {world_size}" + (f" ({world_source})" if world_source else "")
    factors = [v for v in (mb, gas) if _is_int(v)]
    prod = 1
    for f in factors:
        prod *= f
    names = " × ".join(
        f"{n}={v}" for n, v in (("train_micro_batch_size_per_gpu", mb), ("gradient_accumulation_steps", gas))
        if _is_int(v))
    if _is_int(mb) and _is_int(gas):
        # all three literal: exactly one world size works, if any
        if tb % prod != 0 or tb < prod:
            return BatchCheck(
                "never",
                f"`train_batch_size`={tb} is not a multiple of micro × accumulation = {mb} × {gas} = {prod}: "
                f"DeepSpeed asserts `train_batch_size == micro × accumulation × world_size`, which no world "
                f"size satisfies ({tb} / {prod} = {tb / prod:g}).",
                consistent_world_sizes=[], key=("train_batch_size",))
        k = tb // prod
        if world_size is not None and world_size != k:
            return BatchCheck(
                "mismatch",
                f"`train_batch_size`={tb} but micro × accumulation × data-parallel world size = {mb} × {gas} × {world_size} = "
                f"{prod * world_size} at {ws_txt}: DeepSpeed raises \"Check batch related parameters\". "
                f"These values are consistent only with world size {k}.",
                consistent_world_sizes=[k], key=("train_batch_size",))
        return BatchCheck("ok", consistent_world_sizes=[k])
    # one of micro / accumulation is derived by floor division (or filled by a framework)
    if tb % prod != 0 or tb < prod:
        return BatchCheck(
            "never",
            f"`train_batch_size`={tb} is not a multiple of {names}: DeepSpeed derives the missing value by floor "
            f"division and then asserts `train_batch_size == micro × accumulation × world_size`, which fails for "
            f"every world size.",
            consistent_world_sizes=[], key=("train_batch_size",))
    q = tb // prod
    if world_size is not None and q % world_size != 0:
        sizes, more = _divisors(q)
        return BatchCheck(
            "mismatch",
            f"`train_batch_size`={tb} with {names or 'no micro-batch or accumulation given'} at {ws_txt}: "
            f"{q} is not divisible by {world_size}, so the derived value is floored and DeepSpeed raises "
            f"\"Check batch related parameters\". Consistent world sizes: {_fmt_sizes(sizes, more, q)}.",
            consistent_world_sizes=sizes, divisor=q, key=("train_batch_size",))
    return BatchCheck("ok", divisor=q)


# ------------------------------------------------------------------------------------ accelerate model


@dataclass
class AccelerateConfig:
    """The parts of an accelerate launcher config (``accelerate config`` YAML) that bertlint reads."""

    data: dict
    path: Optional[str] = None
    distributed_type: Optional[str] = None
    mixed_precision: Optional[str] = None
    num_processes: Optional[int] = None
    num_machines: Optional[int] = None
    deepspeed_config: dict = field(default_factory=dict)
    deepspeed_config_file: Optional[str] = None
    gradient_accumulation_steps: Any = None  # deepspeed_config.gradient_accumulation_steps (DeepSpeed only)
    gradient_clipping: Any = None
    has_gradient_clipping: bool = False
    zero_stage: Any = None

    @classmethod
    def from_data(cls, data: Any, path: Optional[str] = None) -> Optional["AccelerateConfig"]:
        if not isinstance(data, dict):
            return None
        ds = data.get("deepspeed_config") if isinstance(data.get("deepspeed_config"), dict) else {}
        dt = data.get("distributed_type")
        np_ = data.get("num_processes")
        nm = data.get("num_machines")
        mp = data.get("mixed_precision")
        dsf = ds.get("deepspeed_config_file")
        return cls(
            data=data,
            path=path,
            distributed_type=str(dt).upper() if isinstance(dt, str) else None,
            mixed_precision=str(mp).lower() if isinstance(mp, str) else None,
            num_processes=np_ if _is_int(np_) else None,
            num_machines=nm if _is_int(nm) else None,
            deepspeed_config=ds,
            deepspeed_config_file=dsf if isinstance(dsf, str) and dsf and dsf.lower() != "none" else None,
            gradient_accumulation_steps=ds.get("gradient_accumulation_steps"),
            gradient_clipping=ds.get("gradient_clipping"),
            has_gradient_clipping="gradient_clipping" in ds,
            zero_stage=ds.get("zero_stage"),
        )

    @property
    def uses_deepspeed(self) -> bool:
        return self.distributed_type == "DEEPSPEED"

    @property
    def world_size(self) -> Optional[int]:
        """``num_processes`` is the total over all machines in accelerate's config."""
        if self.distributed_type in ("NO",) or self.data.get("use_cpu") is True and not self.num_processes:
            return 1
        return self.num_processes

    def deepspeed_file(self) -> Optional[str]:
        """Absolute path of ``deepspeed_config_file``, relative to the YAML's folder when not absolute and not
        found relative to the working directory."""
        f = self.deepspeed_config_file
        if not f:
            return None
        if os.path.isabs(f):
            return f
        base = os.path.dirname(self.path) if self.path else "."
        cand = os.path.normpath(os.path.join(base, f))
        if os.path.isfile(cand):
            return cand
        return os.path.abspath(f) if os.path.isfile(f) else cand


_ACC_NAME = re.compile(r"^(default_config|accelerate[\w.-]*)\.ya?ml$", re.IGNORECASE)


def accelerate_configs_near(script_path: Optional[str], source: Optional[str] = None) -> list[AccelerateConfig]:
    """The accelerate launcher configs (``default_config.yaml``, ``accelerate*.yaml``) that launch this script.

    A launcher config beside several scripts is not every script's launch configuration, so one is used only when
    it is the single launcher config of the script's folder (with its ``configs/`` / ``config/`` /
    ``accelerate_configs/`` subfolders), or, when that folder has none, the single one of the repository root;
    or when the script (``source``) or a shell script beside it that names the script names the config file.
    Several configs that nothing names: none (the launch command decides). Never the user's home
    (``~/.cache/huggingface/accelerate``)."""
    if not script_path or script_path in ("-", "<stdin>"):
        return []
    d = os.path.dirname(os.path.abspath(script_path))
    levels = [d]
    root = _repo_root(d)
    if root and root != d:
        levels.append(root)
    script = os.path.basename(script_path)
    for level in levels:
        cfgs = list(_acc_configs_in(level))
        if not cfgs:
            continue
        named = [c for c in cfgs if _named_by(c, source, d, script)]
        if named:
            return named
        if len(cfgs) == 1:
            return cfgs
        return []  # several launcher configs, none named by the script: unknown which one launches it
    return []




def _named_by(cfg: AccelerateConfig, source: Optional[str], script_dir: str, script: str) -> bool:
    """The script's text names the config file, or a shell script in the script's folder names both."""
    name = os.path.basename(cfg.path or "")
    if not name:
        return False
    if source and name in source:
        return True
    for text in _shell_texts(script_dir):
        if name in text and script in text:
            return True
    return False


def _shell_texts(d: str) -> list[str]:
    out = []
    try:
        names = sorted(os.listdir(d))
    except OSError:
        return out
    for n in names:
        if n.endswith((".sh", ".bash", ".slurm")):
            p = os.path.join(d, n)
            try:
                st = os.stat(p)
            except OSError:
                continue
            out.append(_read_small(p, st.st_mtime, st.st_size))
    return out


@lru_cache(maxsize=256)
def _read_small(path: str, mtime: float, size: int) -> str:
    if size > 200_000:
        return ""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _acc_configs_in(d: str) -> tuple[AccelerateConfig, ...]:
    """Not cached itself (edits must be seen by the LSP); each file's parse is cached by mtime."""
    out: list[AccelerateConfig] = []
    for sub in ("", "configs", "config", "accelerate_configs"):
        folder = os.path.join(d, sub) if sub else d
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for n in names:
            if not _ACC_NAME.match(n):
                continue
            p = os.path.join(folder, n)
            doc = load_document(p)
            if doc.error or classify(doc.data) != "accelerate":
                continue
            cfg = AccelerateConfig.from_data(doc.data, p)
            if cfg is not None:
                out.append(cfg)
    return tuple(out)


def deepspeed_configs_near(script_path: Optional[str], source: Optional[str] = None) -> list[ConfigDoc]:
    """The DeepSpeed JSON configs a launch of this script would name (``--deepspeed ds_config.json``): those the
    script (or a shell script beside it that runs it) names, else the single DeepSpeed config of the script's folder
    (with its ``configs/`` / ``config/`` / ``ds_configs/`` subfolders); none when there are several and nothing
    names one."""
    if not script_path or script_path in ("-", "<stdin>"):
        return []
    d = os.path.dirname(os.path.abspath(script_path))
    script = os.path.basename(script_path)
    found: list[ConfigDoc] = []
    for sub in ("", "configs", "config", "ds_configs", "deepspeed_configs"):
        folder = os.path.join(d, sub) if sub else d
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        for n in names:
            if not n.lower().endswith(".json"):
                continue
            doc = load_document(os.path.join(folder, n))
            if doc.error is None and classify(doc.data) == "deepspeed":
                found.append(doc)
    if not found:
        return []
    shells = _shell_texts(d)
    named = [doc for doc in found if (source and os.path.basename(doc.path or "") in source)
             or any(os.path.basename(doc.path or "") in t and script in t for t in shells)]
    if named:
        return named
    return found if len(found) == 1 else []


def accelerate_configs_referencing(config_path: str) -> list[AccelerateConfig]:
    """accelerate YAMLs beside ``config_path`` whose ``deepspeed_config_file`` names it."""
    target = os.path.abspath(config_path)
    out = []
    for cfg in _acc_configs_in(os.path.dirname(target)):
        f = cfg.deepspeed_file()
        if f and os.path.abspath(f) == target:
            out.append(cfg)
    return out


# ---------------------------------------------------------------------------------------- world size


def world_size_for(settings: Any, accelerate_cfgs: list[AccelerateConfig]) -> tuple[Optional[int], str]:
    """(world size, where it came from): ``[tool.bertlint] world-size``, else the ``num_processes`` that all
    the accelerate launcher configs found agree on, else (None, "")."""
    ws = getattr(settings, "world_size", None)
    if _is_int(ws) and ws > 0:
        return ws, "[tool.bertlint] world-size"
    if any(_model_parallel(c.data) for c in accelerate_cfgs):
        return None, ""  # tensor / pipeline parallel: DeepSpeed's data-parallel size is not num_processes
    sizes = {c.world_size for c in accelerate_cfgs}
    if len(sizes) == 1:
        only = next(iter(sizes))
        if _is_int(only) and only > 0:
            names = ", ".join(sorted({os.path.basename(c.path or "?") for c in accelerate_cfgs}))
            return only, f"num_processes in {names}"
    return None, ""


def _model_parallel(data: Any) -> bool:
    """Model/pipeline/sequence parallelism is configured: DeepSpeed's ``world_size`` in the batch rule is then the
    data-parallel size, not the number of processes."""
    if not isinstance(data, dict):
        return False
    for k in ("pipeline", "tensor_parallel", "megatron_lm_config", "parallelism_config", "sequence_parallel_size",
              "tensor_parallel_size", "pipeline_parallel_size", "autotp_size"):
        v = data.get(k)
        if v not in (None, False, 0, 1, {}, "none", "NONE"):
            return True
    return False


def world_size_for_config(settings: Any, data: Any, accelerate_cfgs: list[AccelerateConfig]
                          ) -> tuple[Optional[int], str]:
    """``world_size_for`` for one DeepSpeed config; None when the config itself sets up model parallelism."""
    if _model_parallel(data):
        return None, ""
    return world_size_for(settings, accelerate_cfgs)


# ------------------------------------------------------------------------------------------- versions


def deepspeed_version(ctx: Any = None, filename: Optional[str] = None, settings: Any = None
                      ) -> tuple[tuple[int, ...], str]:
    """(version, source) of deepspeed: ``ctx.versions`` for a script, else the same resolution
    (``bertlint.analysis.versions.resolve``: ``[tool.bertlint]``, pins near the file, installed, current release)
    for a config file; 0.19.8 ("assumed") if that fails."""
    if ctx is not None:
        try:
            tv = ctx.versions.deepspeed  # FileContext (versions analysis)
            return tuple(tv.version), tv.source
        except Exception:
            pass
        filename = filename or getattr(ctx, "filename", None)
        settings = settings if settings is not None else getattr(ctx, "settings", None)
    try:
        from bertlint.analysis import versions as _v

        tv = _v.resolve(filename, settings, packages=("deepspeed",)).deepspeed
        return tuple(tv.version), tv.source
    except Exception:
        return DS_ASSUMED_VERSION, "assumed current release"


def vtext(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


# ======================================================================================== script side


@dataclass
class DSUse:
    """One place where a script hands a DeepSpeed configuration to a framework.

    ``framework``: "trainer" (TrainingArguments(deepspeed=...)), "engine" (deepspeed.initialize),
    "accelerate" (DeepSpeedPlugin(hf_ds_config=...)), "lightning" (DeepSpeedStrategy(config=...)).
    ``data`` is the config (a dict) when known: from a dict literal in the script (``dict_node`` then holds the
    ``cst.Dict`` and ``key_nodes`` maps key paths to the value nodes) or from a file (``doc``)."""

    framework: str
    call: Any  # cst.Call that receives the config
    arg: Any  # the argument expression (cst node), None when the config is not passed
    data: Optional[dict] = None
    doc: Optional[ConfigDoc] = None
    path: Optional[str] = None
    dict_node: Any = None
    key_nodes: dict = field(default_factory=dict)
    func: Any = None  # enclosing function of the call
    mutated: bool = False  # the dict is changed after it is built (subscript assignment / update)
    plugin_kwargs: dict = field(default_factory=dict)  # DeepSpeedPlugin(...) literal kwargs

    @property
    def source_text(self) -> str:
        if self.doc is not None and self.path:
            return os.path.basename(self.path)
        return "the config dict"

    def where(self, key: tuple) -> str:
        """"ds_config.json:7" or "the dict literal" for messages."""
        if self.doc is not None and self.path:
            row, _ = self.doc.key_position(key)
            return f"{os.path.basename(self.path)}:{row}"
        return "the dict literal"


_TA_NAMES = ("TrainingArguments", "Seq2SeqTrainingArguments")


def _qual(ctx: Any, call: Any) -> str:
    try:
        q = ctx.symbols.qualname(call.func)
    except Exception:
        q = None
    if q:
        return q
    from bertlint.analysis.symbols import call_name

    return call_name(call) or ""


def is_training_arguments(ctx: Any, call: Any) -> bool:
    q = _qual(ctx, call)
    last = q.split(".")[-1]
    if last not in _TA_NAMES:
        return False
    return q == last or q.startswith("transformers")


def all_calls(ctx: Any) -> list[tuple[Any, Any, Any]]:
    """Every call in the module with its enclosing function and class, from the shared index (``ctx.index``: no
    walk of its own), cached on ctx."""
    got = getattr(ctx, "_cf_calls", None)
    if got is None:
        got = []
        index = ctx.index
        for call in index.of(cst.Call):
            func = cls = None
            for a in index.ancestors(call):
                ta = type(a)  # exact type tests: isinstance through ABCMeta is slow
                if func is None and ta is cst.FunctionDef:
                    func = a
                elif ta is cst.ClassDef:
                    cls = a
                    break
            got.append((call, func, cls))
        try:
            ctx._cf_calls = got
        except Exception:
            pass
    return got


def _script_dir(ctx: Any) -> str:
    fn = getattr(ctx, "filename", None) or ""
    if fn in ("-", "<stdin>") or not fn:
        return os.getcwd()
    return os.path.dirname(os.path.abspath(fn))


def _mutated(ctx: Any, name: str) -> bool:
    n = re.escape(name)
    return bool(re.search(rf"(?<![\w.]){n}\s*\[[^\]\n]*\]\s*(?:\[[^\]\n]*\]\s*)*(?:=|\+=|-=|\*=|/=)(?!=)"
                          rf"|(?<![\w.]){n}\.(?:update|setdefault|pop|clear)\(|(?<![\w.])del\s+{n}\[",
                          ctx.source))


def _dict_key_nodes(d: Any, path: tuple = ()) -> dict:
    """{key path: value node} for a cst.Dict with string keys (nested dict literals too)."""
    from bertlint.analysis.symbols import literal

    out: dict = {}
    for el in d.elements:
        if not isinstance(el, cst.DictElement):
            continue
        k = literal(el.key)
        if not isinstance(k, str):
            continue
        p = path + (k,)
        out[p] = el
        if isinstance(el.value, cst.Dict):
            out.update(_dict_key_nodes(el.value, p))
    return out


def _mask_dynamic(ctx: Any, d: Any, val: dict, func: Any) -> None:
    """Values of a dict literal that come from the command line or run time (``args.bs``, a function call) become
    UNKNOWN: the resolver would give an argparse default, which the launch may override. Keys stay present."""
    from bertlint.analysis.symbols import UNKNOWN, literal

    for el in d.elements:
        if not isinstance(el, cst.DictElement):
            continue
        k = literal(el.key)
        if not isinstance(k, str) or k not in val:
            continue
        if isinstance(el.value, cst.Dict) and isinstance(val[k], dict):
            _mask_dynamic(ctx, el.value, val[k], func)
        elif not is_static_expr(ctx, el.value, func):
            val[k] = UNKNOWN


def _resolve_config_arg(ctx: Any, expr: Any, func: Any) -> dict:
    """What a config argument is: {"data", "doc", "path", "dict_node", "key_nodes", "mutated"} (data None when
    unknown)."""
    from bertlint.analysis.symbols import call_name, positional

    out: dict = {"data": None, "doc": None, "path": None, "dict_node": None, "key_nodes": {}, "mutated": False}
    if expr is None:
        return out
    node = expr
    name = None
    for _ in range(4):  # follow a few single assignments: cfg = {...}; args = dict(...)
        if isinstance(node, cst.Name):
            assigns = ctx.symbols.assignments_of(node.value, func)
            if len(assigns) != 1:
                break
            name = node.value
            node = assigns[0].value
            func = assigns[0].func
            continue
        break
    if isinstance(node, cst.Call) and (call_name(node) or "").endswith(("json.load", "json.loads")):
        inner = positional(node, 0)
        if isinstance(inner, cst.Call) and (call_name(inner) or "") == "open":
            node = positional(inner, 0) or node
    if isinstance(node, cst.Dict):
        val = ctx.resolver.value(node, func)
        if isinstance(val, dict):
            _mask_dynamic(ctx, node, val, func)
            out["data"] = val
            out["dict_node"] = node
            out["key_nodes"] = _dict_key_nodes(node)
            out["mutated"] = bool(name) and _mutated(ctx, name)
        return out
    val = ctx.resolver.value(node, func)
    if isinstance(val, str) and val.lower().endswith((".json", ".yaml", ".yml")):
        path = val if os.path.isabs(val) else os.path.join(_script_dir(ctx), val)
        doc = load_document(path)
        out["path"] = path
        if doc.error is None and isinstance(doc.data, dict):
            out["data"] = doc.data
            out["doc"] = doc
        return out
    if isinstance(val, dict) and not isinstance(node, cst.Dict) and is_static_expr(ctx, node, func):
        out["data"] = val
        out["mutated"] = bool(name) and _mutated(ctx, name)
    return out


def deepspeed_uses(ctx: Any) -> list[DSUse]:
    """Every DeepSpeed configuration the script passes (cached on ctx)."""
    got = getattr(ctx, "_cf_ds_uses", None)
    if got is not None:
        return got
    out: list[DSUse] = []
    try:
        out = list(_find_uses(ctx))
    except Exception:
        out = []
    try:
        ctx._cf_ds_uses = out
    except Exception:
        pass
    return out


def _find_uses(ctx: Any) -> Iterator[DSUse]:
    from bertlint.analysis.symbols import kwarg, literal, positional

    for call, func, _cls in all_calls(ctx):
        q = _qual(ctx, call)
        last = q.split(".")[-1]
        arg = None
        fw = None
        if last in _TA_NAMES and (q == last or q.startswith("transformers")):
            arg, fw = kwarg(call, "deepspeed"), "trainer"
        elif q in ("deepspeed.initialize",) or (q.endswith(".initialize") and q.startswith("deepspeed")):
            arg = kwarg(call, "config") or kwarg(call, "config_params")
            fw = "engine"
        elif last == "DeepSpeedPlugin" and (q == last or q.startswith("accelerate")):
            arg, fw = kwarg(call, "hf_ds_config"), "accelerate"
            if arg is None:
                arg = positional(call, 0)
        elif last == "DeepSpeedStrategy" and (q == last or q.startswith(("lightning", "pytorch_lightning"))) \
                and ".fabric" not in q:  # Fabric's strategy does not own the accumulation
            arg, fw = kwarg(call, "config"), "lightning"
        elif last == "DeepSpeedPlugin" and q.startswith("pytorch_lightning"):
            arg, fw = kwarg(call, "config"), "lightning"
        if fw is None:
            continue
        if arg is None and any(a.star == "**" for a in call.args):
            # `DeepSpeedPlugin(**kw)` / `TrainingArguments(**cfg)`: the key read through the shared evaluator
            key = {"trainer": "deepspeed", "accelerate": "hf_ds_config", "lightning": "config"}.get(fw)
            f = None
            try:
                facts = ctx.resolver.call_kwargs(call, func)
                f = facts.get(key) or (facts.get("config_params") if fw == "engine" else None) or (
                    facts.get("config") if fw == "engine" else None)
            except Exception:
                f = None
            if f is not None and f.node is not None and f.known:
                arg = f.node
        if isinstance(arg, cst.Name) and arg.value == "None":
            continue
        r = _resolve_config_arg(ctx, arg, func)
        use = DSUse(fw, call, arg, r["data"], r["doc"], r["path"], r["dict_node"], r["key_nodes"], func,
                    r["mutated"])
        if fw == "accelerate":
            for a in call.args:
                if a.keyword is not None and a.keyword.value != "hf_ds_config":
                    use.plugin_kwargs[a.keyword.value] = ctx.resolver.value(a.value, func)
        yield use


def is_static_expr(ctx, expr, func, depth: int = 0) -> bool:
    """The value of ``expr`` is fixed in the source (no command-line or runtime input)."""
    if expr is None or depth > 8:
        return False
    from bertlint.analysis.symbols import UNKNOWN, call_name, dotted, literal

    if literal(expr) is not UNKNOWN:
        return True
    d = depth + 1
    if isinstance(expr, (cst.Name, cst.Attribute)):
        name = dotted(expr)
        if not name:
            return False
        assigns = ctx.symbols.assignments_of(name, func)
        if not assigns:
            return False
        return all(is_static_expr(ctx, a.value, a.func, d) for a in assigns)
    if isinstance(expr, cst.BinaryOperation):
        return is_static_expr(ctx, expr.left, func, d) and is_static_expr(ctx, expr.right, func, d)
    if isinstance(expr, cst.UnaryOperation):
        return is_static_expr(ctx, expr.expression, func, d)
    if isinstance(expr, (cst.List, cst.Tuple)):
        return all(is_static_expr(ctx, e.value, func, d) for e in expr.elements)
    if isinstance(expr, cst.Dict):
        return all(isinstance(e, cst.DictElement) and is_static_expr(ctx, e.value, func, d) for e in expr.elements)
    if isinstance(expr, cst.Subscript):
        return is_static_expr(ctx, expr.value, func, d)
    if isinstance(expr, cst.Call):
        n = call_name(expr) or ""
        if n in ("int", "float", "dict"):
            return all(is_static_expr(ctx, a.value, func, d) for a in expr.args)
    return False


# --------------------------------------------------------------------- helpers for the loop rules


def accelerate_configs_for(ctx: Any) -> list[AccelerateConfig]:
    """The accelerate launcher configs that launch the script (``accelerate_configs_near``; cached)."""
    got = getattr(ctx, "_cf_acc", None)
    if got is None:
        try:
            got = accelerate_configs_near(getattr(ctx, "filename", None), getattr(ctx, "source", None))
        except Exception:
            got = []
        try:
            ctx._cf_acc = got
        except Exception:
            pass
    return got


def accelerate_config_for(ctx: Any) -> Optional[AccelerateConfig]:
    """The one accelerate launcher config beside the script, or None when there is none or several."""
    cfgs = accelerate_configs_for(ctx)
    return cfgs[0] if len(cfgs) == 1 else None


def _uses_accelerate(ctx: Any) -> bool:
    try:
        return ctx.symbols.uses("accelerate")
    except Exception:
        return "accelerate" in getattr(ctx, "source", "")


def deepspeed_enabled_for(ctx: Any) -> tuple[Optional[bool], str]:
    """Does an accelerate script run under DeepSpeed?  (True, reason) when a ``DeepSpeedPlugin`` is built in
    the code or every accelerate launcher config of the script has ``distributed_type: DEEPSPEED``, or (with a reason
    starting "when launched with DeepSpeed") when no launcher config decides and the script expects DeepSpeed
    (``deepspeed_expected_for``: ``DummyOptim``, ``accelerator.state.deepspeed_plugin``);
    (False, reason) when launcher configs exist and none uses DeepSpeed and the code builds no plugin;
    (None, "") when unknown (the launch command decides). Line numbers in the reason are placeholders
    (``FileContext.deferred_row``) that the diagnostic showing it resolves (``FileContext.resolve_rows``)."""
    plugins = [u for u in deepspeed_uses(ctx) if u.framework == "accelerate"]
    if plugins:
        try:
            return True, f"`DeepSpeedPlugin(...)` at line {_row(ctx, plugins[0].call)}"
        except Exception:
            return True, "`DeepSpeedPlugin(...)` in the script"
    cfgs = accelerate_configs_for(ctx)
    if cfgs:
        names = ", ".join(os.path.basename(c.path or "?") for c in cfgs)
        if all(c.uses_deepspeed for c in cfgs):
            return True, f"`distributed_type: DEEPSPEED` in the accelerate config {names}"
        if not any(c.uses_deepspeed for c in cfgs):
            return False, f"no DeepSpeed in the accelerate config {names}"
    expected = deepspeed_expected_for(ctx)
    if expected:
        return True, expected
    return None, ""


_DS_STATE_ATTRS = ("deepspeed_plugin", "deepspeed_plugins", "deepspeed_config")


def deepspeed_expected_for(ctx: Any) -> str:
    """Why the script expects to be launched with DeepSpeed (``accelerate launch`` with a DeepSpeed config, which
    is not in the code): it builds accelerate's ``DummyOptim`` / ``DummyScheduler`` (placeholders only DeepSpeed
    fills), or reads ``accelerator.state.deepspeed_plugin`` / ``accelerator.deepspeed_config``. "" when nothing says
    so. The text starts with "when launched with DeepSpeed" so the findings that use it say what they assume."""
    got = getattr(ctx, "_cf_ds_expected", None)
    if got is not None:
        return got
    reason = ""
    try:
        uses_acc = ctx.symbols.uses("accelerate")
    except Exception:
        uses_acc = False
    if uses_acc:
        src = ctx.source
        if "Dummy" in src:
            for call, _func, _cls in all_calls(ctx):
                q = _qual(ctx, call)
                last = q.split(".")[-1]
                if last in ("DummyOptim", "DummyScheduler") and (q == last or q.startswith("accelerate")):
                    reason = (f"when launched with DeepSpeed, which the script expects: it builds `{last}` "
                              f"(line {_row(ctx, call)}), a placeholder that only a DeepSpeed config fills")
                    break
        if not reason and any(a in src for a in _DS_STATE_ATTRS):
            for node in ctx.index.of(cst.Attribute):
                if node.attr.value in _DS_STATE_ATTRS:
                    inner = node.value
                    base = inner.attr.value if isinstance(inner, cst.Attribute) else (
                        inner.value if isinstance(inner, cst.Name) else "")
                    text = ctx.module.code_for_node(node)
                    if base in ("state",) or "accelerator" in text.lower():
                        reason = (f"when launched with DeepSpeed, which the script provides for: it reads `{text}` "
                                  f"(line {_row(ctx, node)})")
                        break
    try:
        ctx._cf_ds_expected = reason
    except Exception:
        pass
    return reason


def _row(ctx: Any, node: Any) -> str:
    deferred = getattr(ctx, "deferred_row", None)
    if deferred is not None:  # resolved when a finding shows the text (no positions for a file with none)
        return deferred(node)
    try:
        return str(ctx.span(node)[0].row)
    except Exception:
        return "?"


def deepspeed_gas_for(ctx: Any, framework: Optional[str] = None) -> tuple[Optional[int], str]:
    """The DeepSpeed ``gradient_accumulation_steps`` the script's engine will use, when stated as a literal in
    the config it passes (dict literal or JSON file), in ``DeepSpeedPlugin(gradient_accumulation_steps=N)``,
    or in the accelerate launcher config. (None, "") when unknown or "auto"."""
    vals: set = set()
    src = ""
    for u in deepspeed_uses(ctx):
        if framework and u.framework != framework:
            continue
        g = u.plugin_kwargs.get("gradient_accumulation_steps") if u.framework == "accelerate" else None
        if _is_int(g):
            vals.add(g)
            src = "DeepSpeedPlugin(gradient_accumulation_steps=...)"
            continue
        if u.data is not None and not u.mutated:
            v = u.data.get("gradient_accumulation_steps")
            if _is_int(v):
                vals.add(v)
                src = f"gradient_accumulation_steps in {u.where(('gradient_accumulation_steps',))}"
            elif v is None and u.framework == "engine" and not _is_int(u.data.get("train_batch_size")):
                vals.add(1)
                src = f"{u.source_text} (no gradient_accumulation_steps: DeepSpeed uses 1)"
            else:
                return None, ""
    if not vals and framework in (None, "accelerate"):
        for c in accelerate_configs_for(ctx):
            if c.uses_deepspeed and _is_int(c.gradient_accumulation_steps):
                vals.add(c.gradient_accumulation_steps)
                src = f"gradient_accumulation_steps in {os.path.basename(c.path or '?')}"
    if len(vals) == 1:
        return next(iter(vals)), src
    return None, ""


def launcher_accumulation_for(ctx: Any) -> tuple[Optional[int], str]:
    """The gradient accumulation ``accelerate launch`` injects for the launcher configs beside the script.

    With ``distributed_type: DEEPSPEED``, ``deepspeed_config.gradient_accumulation_steps: N`` becomes the env var
    ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` (``utils/launch.py``), which overrides the ``Accelerator(...)``
    argument (REFERENCE §2.1): ``accumulate()`` is then configured although the code passes nothing. (N, source)
    when every launcher config beside the script is DeepSpeed and they agree on an integer N; (None, "") otherwise.
    (A ``deepspeed_config_file`` is read for its ``gradient_accumulation_steps`` when the YAML does not set it.)"""
    cfgs = accelerate_configs_for(ctx)
    if not cfgs or not all(c.uses_deepspeed for c in cfgs):
        return None, ""
    vals = set()
    for c in cfgs:
        g = c.gradient_accumulation_steps
        if g is None and c.deepspeed_file():
            doc = load_document(c.deepspeed_file())
            g = doc.data.get("gradient_accumulation_steps") if isinstance(doc.data, dict) else None
        if not _is_int(g):
            return None, ""
        vals.add(g)
    if len(vals) != 1:
        return None, ""
    names = ", ".join(sorted({os.path.basename(c.path or "?") for c in cfgs}))
    return next(iter(vals)), f"gradient_accumulation_steps in the accelerate launcher config {names}"


def launcher_world_size(ctx: Any) -> tuple[Optional[int], str]:
    """(world size, source) from ``[tool.bertlint] world-size`` or the accelerate launcher config(s) beside the
    script; (None, "") when the launch command decides."""
    return world_size_for(getattr(ctx, "settings", None), accelerate_configs_for(ctx))
