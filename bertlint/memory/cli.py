"""``bertlint memory SCRIPT``: where does the GPU memory of one training step go, before renting the GPU.

Exit status: 0 the report was printed (and, with --gpu, the set-up fits); 1 a set-up does not fit the card
given with --gpu; 2 usage error or a set-up the simulator cannot build (the message names the option)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Optional

from bertlint.memory.spec import OPTIMIZERS, PRECISIONS, MemoryInputError


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="bertlint memory",
        description="Simulate one training step (forward, backward, optimizer step) of the script's model under "
                    "fake tensors and report the peak memory by category, whether it fits a card, and what each "
                    "lever would change. Nothing is downloaded or allocated.")
    p.add_argument("script", help="training script (.py)")
    p.add_argument("--seq-len", type=int, help="sequence length (default: the tokenizer max_length in the script)")
    p.add_argument("--model-config", metavar="PATH", help="a transformers config.json for the model")
    p.add_argument("--head", metavar="CLASS", help="transformers model class (AutoModelForSequenceClassification, "
                                                    "BertForMaskedLM, ...)")
    p.add_argument("--micro-batch", type=int, help="per-device micro-batch (default: from the script)")
    p.add_argument("--precision", choices=PRECISIONS, help="fp32 | bf16/fp16 (autocast on fp32 weights) | "
                                                           "bf16-pure/fp16-pure (half weights)")
    p.add_argument("--checkpointing", choices=("on", "off"), help="activation checkpointing (default: from the script)")
    p.add_argument("--optimizer", choices=OPTIMIZERS)
    p.add_argument("--lora-rank", type=int, help="simulate LoRA of this rank (targets: --lora-targets, else the "
                                                  "script's LoraConfig, else PEFT's default for the model type)")
    p.add_argument("--lora-targets", metavar="NAMES", help="comma-separated module names LoRA adapts (query,value)")
    p.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3))
    p.add_argument("--world-size", type=int, help="devices the ZeRO stages shard over")
    p.add_argument("--gpu", help="card to fit: a size (16GB, 24GiB) or a name (T4, A100-80GB); default: the local "
                                 "GPU via NVML")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="storage rules to follow (default cuda)")
    p.add_argument("--output-format", choices=("text", "json"), default="text")
    p.add_argument("--report", metavar="DIR", help="write memory.json and a bar chart (memory.png) to DIR")
    p.add_argument("--no-what-if", action="store_true", help="skip the what-if table (faster)")
    return p


def main(argv: Optional[list] = None) -> int:
    p = _parser()
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0) if e.code in (0, None) else 2
    from bertlint.memory.report import local_gpu, parse_gpu, render_text, to_json, write_png
    from bertlint.memory.script import Overrides, specs_from_script

    gpu = None
    if a.gpu:
        try:
            b, name = parse_gpu(a.gpu)
        except ValueError as e:
            print(f"bertlint memory: error: {e}", file=sys.stderr)
            return 2
        gpu = {"name": name, "bytes": b, "source": "--gpu"}
    for opt in ("seq_len", "micro_batch", "lora_rank", "world_size"):
        v = getattr(a, opt)
        if v is not None and v < 1:
            print(f"bertlint memory: error: --{opt.replace('_', '-')} must be >= 1", file=sys.stderr)
            return 2
    ov = Overrides(seq_len=a.seq_len, model_config=a.model_config, head=a.head, micro_batch=a.micro_batch,
                   precision=a.precision, checkpointing=None if a.checkpointing is None else a.checkpointing == "on",
                   optimizer=a.optimizer, zero_stage=a.zero_stage, world_size=a.world_size, lora_rank=a.lora_rank,
                   lora_targets=tuple(t.strip() for t in a.lora_targets.split(",") if t.strip()) if a.lora_targets else None)
    try:
        specs = specs_from_script(a.script, overrides=ov)
    except MemoryInputError as e:
        print(f"bertlint memory: {a.script}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001
        print(f"bertlint memory: {a.script}: cannot resolve the training set-up: {type(e).__name__}: {e} "
              "(pass --model-config, --head, --micro-batch and --seq-len)", file=sys.stderr)
        return 2
    from bertlint.memory.simulate import CUBLAS_WORKSPACE_BYTES, CUDA_CONTEXT_BYTES, simulate

    overhead = CUDA_CONTEXT_BYTES + CUBLAS_WORKSPACE_BYTES
    gpu_note = None
    if gpu is None and a.device == "cuda":
        loc = local_gpu()
        if loc is not None:
            total, name, ctx_bytes = loc
            gpu = {"name": name, "bytes": total, "source": "NVML"}
            if ctx_bytes and ctx_bytes > 0:
                overhead = ctx_bytes + CUBLAS_WORKSPACE_BYTES
                gpu_note = f"CUDA context measured with NVML: {ctx_bytes} bytes"
    out, failed = [], 0
    for spec in specs:
        try:
            res = simulate(spec, a.device, what_if=not a.no_what_if, gpu_bytes=gpu["bytes"] - 0 if gpu else None)
        except MemoryInputError as e:
            print(f"bertlint memory: {a.script}: {e}", file=sys.stderr)
            failed += 1
            continue
        except Exception as e:  # noqa: BLE001 - never a traceback: say what failed
            print(f"bertlint memory: {a.script}: the simulation failed: {type(e).__name__}: {e} (please report it)",
                  file=sys.stderr)
            failed += 1
            continue
        if gpu_note:
            res.assumptions.append(gpu_note)
        elif a.device == "cuda":
            res.assumptions.append(f"CUDA overheads (constants, no GPU measured): context {CUDA_CONTEXT_BYTES} B, "
                                   f"cuBLAS workspace {CUBLAS_WORKSPACE_BYTES} B")
        if gpu is None:
            res.assumptions.append("no --gpu and no local GPU: whether it fits is not judged")
        d = to_json(res, a.script, gpu, overhead)
        if gpu is not None:  # what-if fits include the same overheads
            for row in d["what_if"]:
                if row.get("peak_bytes") is not None:
                    row["fits"] = row["peak_bytes"] + d["cuda_overhead_bytes"] <= gpu["bytes"]
        out.append(d)
    if not out:
        return 2
    if a.output_format == "json":
        print(json.dumps(out, indent=2))
    else:
        print("\n\n".join(render_text(d) for d in out))
    if a.report:
        os.makedirs(a.report, exist_ok=True)
        with open(os.path.join(a.report, "memory.json"), "w") as f:
            json.dump(out, f, indent=2)
        for i, d in enumerate(out):
            name = "memory.png" if len(out) == 1 else f"memory-{i + 1}.png"
            write_png(d, os.path.join(a.report, name))
    if failed:
        return 2
    if gpu is not None and any(d["fits"] is False for d in out):
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
