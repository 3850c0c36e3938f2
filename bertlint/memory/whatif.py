"""The what-if table: the levers in the article's order, each simulated (or, for ZeRO, derived from the
simulated categories) with its new peak and whether it fits."""

from __future__ import annotations

from typing import Optional

from bertlint.memory.simulate import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, MemoryResult, apply_zero, simulate


def needed_bytes(peak: int, device: str) -> int:
    return peak + (CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES if device == "cuda" else 0)


def fits(peak: int, device: str, gpu_bytes: Optional[int]) -> Optional[bool]:
    if gpu_bytes is None:
        return None
    return needed_bytes(peak, device) <= gpu_bytes


def what_if_table(res: MemoryResult, device: str, gpu_bytes: Optional[int]) -> list[dict]:
    s = res.spec
    rows: list[dict] = []

    def add(change: str, peak: Optional[int], note: str = "", phase: Optional[str] = None) -> None:
        row = {"change": change, "peak_bytes": peak, "peak_phase": phase}
        if peak is not None:
            row["fits"] = fits(peak, device, gpu_bytes)
        if note:
            row["note"] = note
        rows.append(row)

    def sim(change: str, **kw) -> None:
        spec = s.with_(**kw)
        try:
            r = simulate(spec, device)
        except Exception as e:  # noqa: BLE001 - a lever that cannot be simulated is reported, not raised
            add(change, None, f"not simulated: {e}")
            return
        note = ""
        if r.peak_phase != res.peak_phase:
            note = f"the peak moves to the {r.peak_phase}" + (
                " (activations are freed by then: the optimizer states and gradients set it)"
                if r.peak_phase == "optimizer" else "")
        add(change, r.peak_bytes, note, r.peak_phase)

    if s.micro_batch > 1:
        sim("micro-batch 1", micro_batch=1)
    if s.seq_len >= 32:
        half = s.seq_len // 2
        sim(f"sequence length {half}", seq_len=half)
    if not s.checkpointing:
        sim("activation checkpointing on (non-reentrant)", checkpointing=True, reentrant=False)
    if s.precision == "fp32":
        sim("bf16 autocast (fp16 autocast: the same)", precision="bf16")
    if s.optimizer in ("adamw", "adam"):
        sim("8-bit AdamW (bitsandbytes)", optimizer="adam8bit")
    world = s.world_size if s.world_size > 1 else 8
    base = res if not (s.zero_stage and s.world_size > 1) else None
    for stage in (1, 2, 3):
        if s.zero_stage >= stage and s.world_size > 1:
            continue
        if base is None:
            base = simulate(s.with_(zero_stage=0), device)
        peak, _, phase = apply_zero(base, stage, world, with_phase=True)
        add(f"ZeRO stage {stage} over {world} devices", peak,
            "derived from the simulated categories; communication buckets not counted", phase)
    if not s.lora_rank:
        from bertlint.memory.script import PEFT_TARGETS

        tg = PEFT_TARGETS.get(str(s.config.get("model_type")))
        if tg:
            sim(f"LoRA rank 8 on {','.join(tg)} (PEFT's default targets)", lora_rank=8, lora_targets=tg)
    if s.accumulation > 1:
        add(f"gradient accumulation x{s.accumulation} (already on)", res.peak_bytes,
            phase=res.peak_phase, note=f"same peak; effective batch {s.micro_batch} x {s.accumulation} = {s.micro_batch * s.accumulation} per device")
    else:
        add("gradient accumulation x4", res.peak_bytes, phase=res.peak_phase,
            note=f"same peak, larger effective batch: {s.micro_batch} x 4 = {s.micro_batch * 4} per device")
    return rows
