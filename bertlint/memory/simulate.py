"""Simulate one training step (forward, backward, optimizer step) of the real transformers model class under
``FakeTensorMode`` with tensor accounting; nothing real is allocated. ``measure_real`` runs the same step on
real CPU tensors with the same tracker (the accuracy benchmark's reference)."""

from __future__ import annotations

import contextlib
import math
import os
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Optional

from bertlint.memory.spec import PRECISION_TEXT, MemoryInputError, MemorySpec
from bertlint.memory.tracker import CATEGORIES, make_tracker

GiB = 1024**3
MiB = 1024**2
# CUDA overheads outside torch's allocator statistics (stated constants; measured with NVML when a GPU is present)
CUDA_CONTEXT_BYTES = 500 * MiB  # driver + runtime + loaded kernels; typically 300-800 MiB depending on GPU/CUDA
CUBLAS_WORKSPACE_BYTES = 32 * MiB  # PyTorch's default cuBLAS workspace on Hopper (8 MiB before sm90), per stream
MULTIPLE_CHOICES = 4
ADAM8BIT_BLOCK = 256  # bitsandbytes blockwise quantisation: one fp32 absmax per 256 values per state
ADAM8BIT_MIN_SIZE = 4096  # bitsandbytes keeps 32-bit states for tensors with fewer elements


@dataclass
class MemoryResult:
    spec: MemorySpec
    device: str  # the storage rules followed: "cuda" or "cpu"
    model_class: str
    param_count: int
    trainable_count: int
    peak_bytes: int
    peak_phase: str
    by_category: dict
    phase_peaks: dict  # phase -> {"peak_bytes", "by_category"}
    assumptions: list = field(default_factory=list)
    what_if: list = field(default_factory=list)  # [{"change", "peak_bytes", "fits"?, "note"?}]
    seconds: float = 0.0
    largest_block_bytes: int = 0  # the largest layer's parameters (ZeRO-3 gathers one at a time)

    def to_json(self) -> dict:
        s = self.spec
        return {
            "model": {"class": self.model_class, "name": s.model_name, "parameters": self.param_count,
                      "trainable_parameters": self.trainable_count},
            "micro_batch": s.micro_batch,
            "seq_len": s.seq_len,
            "precision": s.precision,
            "checkpointing": s.checkpointing,
            "reentrant": s.reentrant if s.checkpointing else None,
            "optimizer": s.optimizer,
            "gradient_accumulation_steps": s.accumulation,
            "zero_stage": s.zero_stage,
            "world_size": s.world_size,
            "lora_rank": s.lora_rank,
            "lora_targets": list(s.lora_targets) if s.lora_rank else None,
            "lora_dropout": s.lora_dropout if s.lora_rank else None,
            "fused_optimizer": bool(s.fused),
            "device": self.device,
            "peak_bytes": self.peak_bytes,
            "peak_phase": self.peak_phase,
            "by_category": dict(self.by_category),
            "phase_peaks": self.phase_peaks,
            "assumptions": list(self.assumptions),
            "what_if": list(self.what_if),
            "simulation_seconds": round(self.seconds, 2),
        }


# ---------------------------------------------------------------- model construction

def _transformers():
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    import transformers

    return transformers


def build_config(spec: MemorySpec):
    transformers = _transformers()
    cfg = {k: v for k, v in spec.config.items() if v is not None}
    model_type = cfg.pop("model_type")
    for k in ("architectures", "transformers_version", "torch_dtype", "dtype", "_name_or_path"):
        cfg.pop(k, None)
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

        known = list(CONFIG_MAPPING_NAMES)
    except ImportError:
        known = []
    if known and model_type not in known:
        import difflib

        close = difflib.get_close_matches(str(model_type), known, n=3, cutoff=0.5)
        raise MemoryInputError(
            f"transformers {transformers.__version__} has no model_type {model_type!r}"
            + (f" (closest: {', '.join(close)})" if close else "")
            + "; pass --model-config PATH to a config.json of a supported architecture") from None
    try:
        config = transformers.AutoConfig.for_model(model_type, **cfg)
    except Exception as e:  # noqa: BLE001 - transformers raises several kinds on a bad configuration
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise MemoryInputError(
            f"transformers {transformers.__version__} cannot build a configuration of model_type {model_type!r} "
            f"({msg}); pass --model-config PATH to a config.json of a supported architecture") from None
    if spec.head.endswith("ForSequenceClassification") or spec.head.endswith("ForTokenClassification"):
        config.num_labels = spec.num_labels
    return config


def _head_class(spec: MemorySpec):
    transformers = _transformers()
    cls = getattr(transformers, spec.head, None)
    if cls is None:
        raise MemoryInputError(
            f"the model class {spec.head!r} is not a transformers class (a custom model?): bertlint memory builds "
            "transformers classes only; pass --head with a transformers head class "
            "(e.g. AutoModelForSequenceClassification) and --model-config PATH")
    return cls


@contextlib.contextmanager
def _no_init(enabled: bool):
    """Skip weight initialisation (irrelevant to memory; some initialisers read values, which fake tensors do
    not have)."""
    cm = contextlib.nullcontext()
    if enabled:
        try:
            from transformers.initialization import no_init_weights

            cm = no_init_weights()
        except ImportError:  # older transformers
            try:
                from transformers.modeling_utils import no_init_weights

                cm = no_init_weights()
            except ImportError:
                pass
    with cm:
        yield


def _instantiate(spec: MemorySpec, config, fake: bool = True):
    cls = _head_class(spec)
    try:
        with _no_init(fake):
            model = cls.from_config(config) if spec.head.startswith("Auto") else cls(config)
        if fake and hasattr(model, "tie_weights"):
            model.tie_weights()  # skipped with the initialisation: tied embeddings are one parameter
        return model
    except MemoryInputError:
        raise
    except Exception as e:  # noqa: BLE001 - any construction failure is bad input, reported with the option
        raise MemoryInputError(
            f"cannot build {spec.head} from the configuration (model_type {spec.config.get('model_type')!r}): "
            f"{type(e).__name__}: {e}; pass --model-config PATH or --head CLASS") from None


def _make_lora_linear(torch, base, rank: int, alpha: float, dropout: float = 0.0):
    nn = torch.nn

    class LoraLinear(nn.Module):
        """PEFT's LoRA on a Linear: base(x) + B(A(dropout(x))) * alpha / r (lora_dropout 0: identity, as PEFT)."""

        def __init__(self) -> None:
            super().__init__()
            self.base_layer = base
            self.lora_dropout = nn.Dropout(dropout) if dropout > 0 else nn.Identity()
            self.lora_A = nn.Linear(base.in_features, rank, bias=False, dtype=base.weight.dtype)
            self.lora_B = nn.Linear(rank, base.out_features, bias=False, dtype=base.weight.dtype)
            self.scaling = alpha / rank

        def forward(self, x):
            return self.base_layer(x) + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling

    return LoraLinear()


def _apply_lora(torch, model, spec: MemorySpec) -> int:
    targets = tuple(spec.lora_targets)
    replaced = 0
    for p in model.parameters():
        p.requires_grad_(False)
    for name, mod in list(model.named_modules()):
        for cname, child in list(mod.named_children()):
            if isinstance(child, torch.nn.Linear) and cname in targets:
                alpha = spec.lora_alpha if spec.lora_alpha else 2.0 * spec.lora_rank
                setattr(mod, cname, _make_lora_linear(torch, child, spec.lora_rank, alpha, spec.lora_dropout))
                replaced += 1
    # the task head trains (PEFT's modules_to_save for classification heads)
    for name, p in model.named_parameters():
        if "lora_" in name or name.split(".")[0] in ("classifier", "qa_outputs", "cls", "pre_classifier", "score"):
            p.requires_grad_(True)
    return replaced


class _Adam8bitSim:
    """Memory model of bitsandbytes' 8-bit Adam(W): two uint8 states per parameter plus one fp32 absmax per
    256 values each; 32-bit states for tensors under 4096 elements. The update itself is a fused kernel."""

    def __init__(self, torch, params) -> None:
        self.torch = torch
        self.params = [p for p in params]
        self.state: dict = {}

    def step(self) -> None:
        torch = self.torch
        for p in self.params:
            if p.grad is None:
                continue
            st = self.state.get(p)
            if st is None:
                if p.numel() < ADAM8BIT_MIN_SIZE:
                    st = {"state1": torch.zeros_like(p, dtype=torch.float32), "state2": torch.zeros_like(p, dtype=torch.float32)}
                else:
                    nblocks = math.ceil(p.numel() / ADAM8BIT_BLOCK)
                    st = {"state1": torch.zeros(p.shape, dtype=torch.uint8, device=p.device),
                          "state2": torch.zeros(p.shape, dtype=torch.uint8, device=p.device),
                          "absmax1": torch.zeros(nblocks, dtype=torch.float32, device=p.device),
                          "absmax2": torch.zeros(nblocks, dtype=torch.float32, device=p.device)}
                self.state[p] = st

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def _make_optimizer(torch, params, spec: MemorySpec, cuda: bool):
    params = [p for p in params if p.requires_grad]
    # fused=True (the script's, or the Trainer's adamw_torch_fused default): one kernel, no foreach temporaries
    impl = {"fused": True} if spec.fused else {"foreach": cuda}
    if spec.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=1e-5, **impl)
    if spec.optimizer == "adam":
        return torch.optim.Adam(params, lr=1e-5, **impl)
    if spec.optimizer == "sgd":
        return torch.optim.SGD(params, lr=1e-3, momentum=spec.sgd_momentum, **impl)
    if spec.optimizer == "adafactor":
        from transformers.optimization import Adafactor

        return Adafactor(params, lr=1e-3, scale_parameter=False, relative_step=False, warmup_init=False)
    if spec.optimizer == "adam8bit":
        return _Adam8bitSim(torch, params)
    raise MemoryInputError(f"unknown optimizer {spec.optimizer!r}")


def _inputs(torch, spec: MemorySpec, config, vocab: int):
    B, L = spec.micro_batch, spec.seq_len
    head = spec.head
    shape = (B, MULTIPLE_CHOICES, L) if "MultipleChoice" in head else (B, L)
    kw = {"input_ids": torch.randint(0, vocab, shape)}
    if "MultipleChoice" in head:
        kw["labels"] = torch.randint(0, MULTIPLE_CHOICES, (B,))
    elif "SequenceClassification" in head:
        kw["labels"] = torch.randint(0, max(1, config.num_labels), (B,))
    elif "TokenClassification" in head:
        kw["labels"] = torch.randint(0, max(1, config.num_labels), (B, L))
    elif "MaskedLM" in head or "CausalLM" in head or "LMHead" in head:
        kw["labels"] = torch.randint(0, vocab, (B, L))
    elif "QuestionAnswering" in head:
        kw["start_positions"] = torch.randint(0, L, (B,))
        kw["end_positions"] = torch.randint(0, L, (B,))
    elif "PreTraining" in head:
        kw["labels"] = torch.randint(0, vocab, (B, L))
        kw["next_sentence_label"] = torch.randint(0, 2, (B,))
    return kw


def _largest_block_bytes(torch, model) -> int:
    best = 0
    for m in model.modules():
        if isinstance(m, torch.nn.ModuleList):
            for sub in m:
                best = max(best, sum(p.numel() * p.element_size() for p in sub.parameters()))
    try:
        emb = model.get_input_embeddings()
        best = max(best, sum(p.numel() * p.element_size() for p in emb.parameters()))
    except Exception:  # noqa: BLE001
        pass
    return best


# ---------------------------------------------------------------- CUDA kernels on the simulated step

@contextlib.contextmanager
def _cuda_kernels(torch):
    """Make the fake CPU step use the kernels PyTorch picks on a CUDA GPU, whose saved tensors differ from the
    CPU ones: dropout -> ``native_dropout`` (a bool mask, not a mask of the input dtype); scaled-dot-product
    attention -> FlashAttention (fp16/bf16 inputs, no mask, head size <= 256) or the memory-efficient kernel
    (otherwise), which keep the output and a log-sum-exp instead of the B x heads x L x L probabilities (and
    their dropout mask). ``torch.nn.functional`` is patched for the duration of the step (checkpointing
    recomputes through the same functions)."""
    import torch.nn.functional as F

    orig_dropout, orig_sdpa = F.dropout, F.scaled_dot_product_attention

    def dropout(input, p=0.5, training=True, inplace=False):
        if training and p > 0 and not inplace and isinstance(input, torch.Tensor) and input.is_floating_point():
            return torch.ops.aten.native_dropout(input, float(p), True)[0]
        return orig_dropout(input, p, training, inplace)

    def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        q, k, v = query, key, value
        if q.dim() != 4 or enable_gqa or k.shape[1] != q.shape[1]:
            return orig_sdpa(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                             enable_gqa=enable_gqa)
        if q.dtype in (torch.float16, torch.bfloat16) and attn_mask is None and q.shape[-1] <= 256:
            return torch.ops.aten._scaled_dot_product_flash_attention(
                q, k, v, float(dropout_p), bool(is_causal), False, scale=scale)[0]
        mask = attn_mask
        if mask is not None and mask.dtype == torch.bool:
            mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            q, k, v, mask, True, float(dropout_p), bool(is_causal), scale=scale)[0]

    F.dropout, F.scaled_dot_product_attention = dropout, sdpa
    try:
        yield
    finally:
        F.dropout, F.scaled_dot_product_attention = orig_dropout, orig_sdpa


# ---------------------------------------------------------------- the step

class _DataDependent(Exception):
    """The model's own loss depends on tensor values (e.g. DeBERTa's label filtering); retried with the
    cross-entropy computed outside the model."""


def _external_loss(torch, out, batch):
    F = torch.nn.functional
    if "start_positions" in batch:
        return (F.cross_entropy(out.start_logits, batch["start_positions"])
                + F.cross_entropy(out.end_logits, batch["end_positions"])) / 2
    logits = out.logits if hasattr(out, "logits") else out[0]
    labels = batch["labels"]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _run_step(spec: MemorySpec, *, fake: bool, cuda: bool, external_loss: bool = False,
              on_gpu: bool = False) -> MemoryResult:
    spec.validate()
    t0 = time.perf_counter()
    _transformers()
    import torch

    config = build_config(spec)
    vocab = int(getattr(config, "vocab_size", 0) or 0) or 1000
    notes: list[str] = []
    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode_cm = FakeTensorMode(allow_non_fake_inputs=True)
    else:
        mode_cm = contextlib.nullcontext()
    if on_gpu:  # a real step on the local GPU (benchmark reference): PyTorch's own CUDA kernels
        mode_cm = torch.device("cuda")
    with warnings.catch_warnings(), mode_cm:
        warnings.simplefilter("ignore")
        torch.manual_seed(0)
        if spec.precision.endswith("-pure"):  # built in half precision (model.to() cannot swap fake tensors)
            old_dtype = torch.get_default_dtype()
            torch.set_default_dtype(torch.bfloat16 if spec.precision.startswith("bf16") else torch.float16)
            try:
                model = _instantiate(spec, config, fake)
            finally:
                torch.set_default_dtype(old_dtype)
        else:
            model = _instantiate(spec, config, fake)
        if spec.lora_rank:
            n = _apply_lora(torch, model, spec)
            if n == 0:
                raise MemoryInputError(
                    f"LoRA targets {list(spec.lora_targets)} match no Linear module of {type(model).__name__}; "
                    "pass --lora-targets with the names of its attention projections (e.g. query,value for BERT, "
                    "q_lin,v_lin for DistilBERT, c_attn for GPT-2, q_proj,v_proj for LLaMA)")
        for prefix in spec.frozen_modules:
            for name, p in model.named_parameters():
                if name == prefix or name.startswith(prefix + ".") or f".{prefix}." in f".{name}":
                    p.requires_grad_(False)
        if spec.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": spec.reentrant})
            if spec.reentrant and (spec.lora_rank or spec.frozen_modules) and hasattr(model, "enable_input_require_grads"):
                model.enable_input_require_grads()
        model.train()
        trainable = [p for p in model.parameters() if p.requires_grad]
        opt = _make_optimizer(torch, model.parameters(), spec, cuda)
        # steady state (every step after the first): the optimizer states exist, the gradients were freed
        for p in trainable:
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)

        tracker = make_tracker(cuda_rounding=cuda)
        tracker.track_model(model)
        tracker.mark_optimizer_states(opt)
        if spec.precision in ("bf16", "fp16"):
            amp = torch.autocast("cuda" if on_gpu else "cpu", dtype=torch.bfloat16 if spec.precision == "bf16" else torch.float16)
        else:
            amp = contextlib.nullcontext()
        kernels = _cuda_kernels(torch) if cuda and not on_gpu else contextlib.nullcontext()
        if on_gpu:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        try:
            with tracker, kernels:
                tracker.set_phase("inputs")
                batch = _inputs(torch, spec, config, vocab)
                for v in batch.values():
                    tracker.register(v, "activations", override=True)
                tracker.set_phase("forward")
                with amp:
                    if external_loss:
                        labels = {k: batch[k] for k in ("labels", "start_positions", "end_positions") if k in batch}
                        out = model(**{k: v for k, v in batch.items() if k not in labels})
                        loss = _external_loss(torch, out, labels)
                    else:
                        out = model(**batch)
                    loss = getattr(out, "loss", None) if not external_loss else loss
                    if loss is None:
                        hidden = out[0] if isinstance(out, (tuple, list)) else out.last_hidden_state
                        loss = hidden.float().sum()
                        notes.append("no task head: the loss is the sum of the last hidden state")
                tracker.set_phase("backward")
                loss.backward()
                del out, loss
                tracker.set_phase("optimizer")
                opt.step()
                tracker.mark_optimizer_states(opt)
                opt.zero_grad(set_to_none=True)
                tracker.set_phase("done")
        except MemoryInputError:
            raise
        except Exception as e:  # noqa: BLE001
            if not external_loss and type(e).__name__ in ("DynamicOutputShapeException", "DataDependentOutputException"):
                raise _DataDependent(str(e)) from None
            raise MemoryInputError(
                f"the simulated step of {type(model).__name__} failed: {type(e).__name__}: {str(e)[:300]}") from None
        finally:
            tracker.remove_hooks()

        n_params = sum(p.numel() for p in model.parameters())
        n_train = sum(p.numel() for p in model.parameters() if p.requires_grad)
        largest = _largest_block_bytes(torch, model)
        model_class = type(model).__name__
    peak = tracker.peak
    phase_peaks = {ph: {"peak_bytes": s.total, "by_category": s.by_category()}
                   for ph, s in tracker.phase_peaks.items() if ph in ("forward", "backward", "optimizer")}
    res = MemoryResult(
        spec=spec, device="cuda" if cuda else "cpu", model_class=model_class, param_count=n_params,
        trainable_count=n_train, peak_bytes=peak.total if peak else 0,
        peak_phase=peak.phase if peak else "forward", by_category=tracker.breakdown(),
        phase_peaks=phase_peaks, assumptions=list(spec.assumptions) + notes,
        seconds=time.perf_counter() - t0, largest_block_bytes=largest)
    if res.peak_phase not in ("forward", "backward", "optimizer"):
        res.peak_phase = "forward"
    return res


def apply_zero(res: MemoryResult, stage: int, world: int, with_phase: bool = False):
    """Per-device peak under ZeRO stage 1/2/3 over ``world`` devices, from the simulated categories of each
    phase's peak: stage 1 shards optimizer states, 2 also gradients, 3 also parameters (plus the largest
    layer's parameters, gathered while it runs)."""
    best, best_cat, best_phase = 0, {}, res.peak_phase
    snaps = list(res.phase_peaks.items()) or [(res.peak_phase, {"peak_bytes": res.peak_bytes, "by_category": res.by_category})]
    for phase, snap in snaps:
        cat = dict(snap["by_category"])
        if stage >= 1:
            cat["optimizer_states"] = cat["optimizer_states"] // world
        if stage >= 2:
            cat["gradients"] = cat["gradients"] // world
        if stage >= 3:
            cat["parameters"] = cat["parameters"] // world + res.largest_block_bytes
        tot = sum(cat.values())
        if tot > best:
            best, best_cat, best_phase = tot, cat, phase
    return (best, best_cat, best_phase) if with_phase else (best, best_cat)


def simulate(spec: MemorySpec, device: str = "cuda", *, what_if: bool = False, gpu_bytes: Optional[int] = None) -> MemoryResult:
    """Simulate one training step of ``spec`` under fake tensors. ``device`` picks the storage rules
    ("cuda": 512-byte allocator blocks and the multi-tensor optimizer; "cpu": plain sizes)."""
    cuda = device == "cuda"
    try:
        res = _run_step(spec, fake=True, cuda=cuda)
    except _DataDependent:
        res = _run_step(spec, fake=True, cuda=cuda, external_loss=True)
        res.assumptions.append("the model's own loss depends on label values (fake tensors have none): the "
                               "cross-entropy of its logits is computed outside the model instead")
    res.assumptions.extend(standard_assumptions(spec, cuda))
    if spec.zero_stage and spec.world_size > 1:
        peak, cat = apply_zero(res, spec.zero_stage, spec.world_size)
        res.assumptions.append(
            f"ZeRO stage {spec.zero_stage} over {spec.world_size} devices applied to the simulated categories "
            f"(peak before sharding {res.peak_bytes} B); DeepSpeed's buckets and fp32 master copies are not modelled")
        res.peak_bytes, res.by_category = peak, cat
    if what_if:
        from bertlint.memory.whatif import what_if_table

        res.what_if = what_if_table(res, device, gpu_bytes)
    return res


def measure_real(spec: MemorySpec) -> MemoryResult:
    """The same step on real CPU tensors, measured by the same tracker (the benchmark's reference)."""
    return _run_step(spec, fake=False, cuda=False)


def measure_cuda(spec: MemorySpec) -> tuple[MemoryResult, int]:
    """The same step on the local GPU with PyTorch's own kernels: (the tracker's result with CUDA rounding,
    ``torch.cuda.max_memory_allocated()`` over the step). Only with a GPU (benchmark reference)."""
    import torch

    res = _run_step(spec, fake=False, cuda=True, on_gpu=True)
    peak = int(torch.cuda.max_memory_allocated())
    torch.cuda.empty_cache()
    return res, peak


def standard_assumptions(spec: MemorySpec, cuda: bool) -> list[str]:
    import torch
    import transformers

    out = [
        f"one training step simulated with torch {torch.__version__.split('+')[0]} and transformers "
        f"{transformers.__version__} under FakeTensorMode: the peak of live tensor storages",
        "steady state: the optimizer states of the previous step are alive; gradients were freed by "
        "zero_grad(set_to_none=True)",
        f"precision: {PRECISION_TEXT.get(spec.precision, spec.precision)}",
        "no padding attention mask passed (a mask adds one B x L x L boolean per forward); batches padded to "
        f"seq_len {spec.seq_len}",
        "recomputed activations (checkpointing) count as temporaries of the backward",
    ]
    if cuda:
        out.append(
            "CUDA storage rules: every storage rounded up to 512-byte allocator blocks (what "
            "torch.cuda.max_memory_allocated counts); allocator fragmentation (reserved - allocated) not included")
        out.append("the optimizer uses the fused implementation (fused=True)" if spec.fused else
                   "the optimizer uses the multi-tensor (foreach) implementation, PyTorch's default on CUDA")
        out.append(
            "CUDA kernels: dropout keeps a bool mask (native_dropout); attention uses FlashAttention for fp16/bf16 "
            "without a mask and the memory-efficient kernel otherwise (PyTorch's choice on sm80+ GPUs): output and "
            "log-sum-exp are kept, not the B x heads x L x L probabilities")
    else:
        out.append("CPU storage rules: exact storage sizes; " + (
            "the fused optimizer (fused=True)" if spec.fused else
            "the per-parameter (for-loop) optimizer, PyTorch's default on CPU"))
    if spec.precision in ("bf16", "fp16"):
        out.append("autocast simulated with torch's CPU autocast op lists: matmuls and attention in half precision, "
                   "embeddings, LayerNorm and the loss in fp32 (for BERT-family ops the same dtypes as on CUDA)")
    if spec.precision == "fp16":
        out.append("GradScaler's own tensors (a few scalars) are not counted")
    if spec.optimizer == "adam8bit":
        out.append("8-bit Adam modelled after bitsandbytes: 2 x 1 byte per parameter plus one fp32 absmax per 256 values")
    if spec.lora_rank:
        out.append(f"LoRA rank {spec.lora_rank} on {', '.join(spec.lora_targets)}, lora_dropout {spec.lora_dropout:g}"
                   f"{' (a dropout mask per adapted projection)' if spec.lora_dropout else ''}; the task head trains")
    return out
