"""Rendering of memory results: text, JSON objects (RULES.md "bertlint memory"), and a PNG bar chart."""

from __future__ import annotations

import os
import re
from typing import Optional

from bertlint.memory.spec import PRECISION_TEXT
from bertlint.memory.tracker import CATEGORIES

GiB = 1024**3
MiB = 1024**2

# usable memory of common cards (what the driver reports as total), bytes
CARDS = {
    "t4": 15360 * MiB,
    "v100": 16384 * MiB,
    "v100-16gb": 16384 * MiB,
    "v100-32gb": 32768 * MiB,
    "a10": 23028 * MiB,
    "a10g": 23028 * MiB,
    "l4": 23034 * MiB,
    "rtx3090": 24576 * MiB,
    "rtx4090": 24564 * MiB,
    "3090": 24576 * MiB,
    "4090": 24564 * MiB,
    "l40s": 46068 * MiB,
    "a6000": 49140 * MiB,
    "a100": 40960 * MiB,
    "a100-40gb": 40960 * MiB,
    "a100-80gb": 81920 * MiB,
    "h100": 81559 * MiB,
    "h100-80gb": 81559 * MiB,
    "h200": 143771 * MiB,
}


def parse_gpu(text: str) -> tuple[int, str]:
    """``16GB``/``16GiB``/``16G``/``16`` -> 16 GiB (nominal memory); a card name (``T4``, ``A100-80GB``) -> its
    usable memory. Raises ValueError with the accepted forms."""
    t = text.strip().lower().replace(" ", "").replace("_", "-")
    if t in CARDS:
        return CARDS[t], text.strip()
    t2 = t.replace("nvidia-", "").replace("geforce-", "")
    if t2 in CARDS:
        return CARDS[t2], text.strip()
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(gib|gb|g)?", t)
    if m:
        return int(float(m.group(1)) * GiB), f"{m.group(1)} GiB"
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(mib|mb|m)", t)
    if m:
        return int(float(m.group(1)) * MiB), f"{m.group(1)} MiB"
    raise ValueError(f"cannot read --gpu {text!r}: give a size (16GB, 24GiB, 80) or a card "
                     f"({', '.join(sorted(k for k in CARDS if not k[0].isdigit()))})")


def local_gpu() -> Optional[tuple[int, str, Optional[int]]]:
    """(total bytes, name, measured context bytes or None) of GPU 0 via NVML; None without a GPU."""
    try:
        import pynvml  # nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        total = int(pynvml.nvmlDeviceGetMemoryInfo(h).total)
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
    except Exception:  # noqa: BLE001 - no driver, no GPU
        return None
    ctx_bytes = None
    try:  # the CUDA context of this process: what NVML sees for us minus what torch reserved
        import torch

        if torch.cuda.is_available():
            torch.empty(1, device="cuda")
            torch.cuda.synchronize()
            pid = os.getpid()
            for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
                if p.pid == pid and p.usedGpuMemory:
                    ctx_bytes = int(p.usedGpuMemory) - int(torch.cuda.memory_reserved())
    except Exception:  # noqa: BLE001
        ctx_bytes = None
    return total, name, ctx_bytes


def gib(n: Optional[int]) -> str:
    if n is None:
        return "-"
    if abs(n) >= GiB:
        return f"{n / GiB:.2f} GiB"
    return f"{n / MiB:.1f} MiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n >= 1e5 else f"{n:,}"


def to_json(res, filename: str, gpu: Optional[dict], overhead: int) -> dict:
    d = {"filename": filename}
    d.update(res.to_json())
    d["cuda_overhead_bytes"] = overhead if res.device == "cuda" else 0
    d["needed_bytes"] = res.peak_bytes + d["cuda_overhead_bytes"]
    if gpu is not None:
        d["gpu"] = gpu
        d["fits"] = d["needed_bytes"] <= gpu["bytes"]
    else:
        d["fits"] = None
    return d


def render_text(d: dict) -> str:
    L = []
    m = d["model"]
    name = f" ({m['name']})" if m.get("name") else ""
    L.append(f"bertlint memory: {d['filename']}")
    L.append(f"  model       {m['class']}{name}: {_params(m['parameters'])} parameters, "
             f"{_params(m['trainable_parameters'])} trainable")
    ck = "off" if not d["checkpointing"] else f"on ({'reentrant' if d['reentrant'] else 'non-reentrant'})"
    extra = f", ZeRO-{d['zero_stage']} over {d['world_size']}" if d.get("zero_stage") else ""
    extra += f", LoRA r={d['lora_rank']}" if d.get("lora_rank") else ""
    L.append(f"  step        micro-batch {d['micro_batch']} x sequence {d['seq_len']}, "
             f"{PRECISION_TEXT.get(d['precision'], d['precision'])}, checkpointing {ck}, optimizer {d['optimizer']}, "
             f"accumulation {d['gradient_accumulation_steps']}{extra}")
    rules = "CUDA storage rules" if d["device"] == "cuda" else "CPU storage rules"
    L.append(f"  peak        {gib(d['peak_bytes'])} in the {d['peak_phase']} ({rules}; "
             f"simulated in {d['simulation_seconds']:.1f} s)")
    if d["device"] == "cuda":
        L.append(f"  + CUDA      {gib(d['cuda_overhead_bytes'])} context and cuBLAS workspace "
                 f"-> needs {gib(d['needed_bytes'])}")
    if d.get("gpu"):
        verdict = "yes" if d["fits"] else "NO"
        L.append(f"  fits {d['gpu']['name']} ({gib(d['gpu']['bytes'])}): {verdict}")
    L.append("  by category at the peak")
    total = max(1, d["peak_bytes"])
    for c in CATEGORIES:
        v = d["by_category"].get(c, 0)
        L.append(f"    {c:<18} {gib(v):>12}  {100 * v / total:5.1f} %")
    if d.get("what_if"):
        gpu_col = f"fits {d['gpu']['name']}" if d.get("gpu") else ""
        L.append("  what if (the levers in the article's order)")
        L.append(f"    {'change':<52} {'peak':>12}  {'in the':<10} {gpu_col}")
        for row in d["what_if"]:
            fit = ""
            if d.get("gpu") and row.get("fits") is not None:
                fit = "yes" if row["fits"] else "no"
            L.append(f"    {row['change']:<52} {gib(row.get('peak_bytes')):>12}  {row.get('peak_phase') or '-':<10} "
                     f"{fit:<4} {row.get('note', '')}".rstrip())
    L.append("  assumptions")
    for a in d["assumptions"]:
        L.append(f"    - {a}")
    return "\n".join(L)


def write_png(d: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = dict(zip(CATEGORIES, ["#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#bab0ac"]))
    rows = [("this set-up", d["peak_bytes"])] + [(r["change"], r["peak_bytes"]) for r in d.get("what_if", [])
                                                 if r.get("peak_bytes") is not None]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, max(3.5, 0.45 * len(rows) + 1.5)),
                                   gridspec_kw={"width_ratios": [1, 2]})
    left = 0.0
    for c in CATEGORIES:
        v = d["by_category"].get(c, 0) / GiB
        ax1.bar([0], [v], bottom=[left], color=colors[c], label=c.replace("_", " "))
        left += v
    ax1.set_xticks([0], [f"peak ({d['peak_phase']})"])
    ax1.set_ylabel("GiB")
    ax1.set_title(f"{d['model']['class']}\nB={d['micro_batch']} L={d['seq_len']} {d['precision']}", fontsize=9)
    ax1.legend(fontsize=8, loc="upper right")
    names = [r[0] for r in rows][::-1]
    vals = [r[1] / GiB for r in rows][::-1]
    ax2.barh(names, vals, color=["#4e79a7"] * (len(vals) - 1) + ["#e15759"])
    if d.get("gpu"):
        cap = (d["gpu"]["bytes"] - d.get("cuda_overhead_bytes", 0)) / GiB
        ax2.axvline(cap, color="black", linestyle="--", linewidth=1)
        ax2.text(cap, len(vals) - 0.5, f" {d['gpu']['name']}", fontsize=8, va="bottom")
    ax2.set_xlabel("peak of one training step (GiB)")
    ax2.tick_params(axis="y", labelsize=8)
    ax2.set_title("what if", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
