"""GPU check of the memory figures and of --verify on CUDA: one bounded script (at most --budget seconds, default
480 = 8 minutes) for a machine with a CUDA GPU. Nothing here runs on the development machines (no GPU): without
CUDA it says so and exits 0.

1. ``bertlint memory --device cuda`` (the FakeTensor simulation) against ``torch.cuda.max_memory_allocated`` of
   the same training step run for real, over a grid of BERT configurations (layers/hidden, micro-batch, sequence
   length, fp32 / bf16 autocast), smallest first, until its share of the budget is spent.
2. ``--verify`` of fp16 GradScaler scripts on CUDA (a tiny BERT under fp16 autocast: gradients clipped before
   ``unscale_`` (BL201) and the correct order) and of the GradScaler fixtures in ``fixtures/``: outcome, the
   verification of each finding, GradScaler calls, and the run's CUDA figures (``torch.cuda.max_memory_allocated``
   against the tracker's peak, the memory snapshot, NVML).
3. NVML: device total / used, this process and the others (pynvml).

    python benchmarks/gpu_check.py [--budget 480] [--json OUT.json] [--quick]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (layers, hidden, heads, intermediate), micro-batch, sequence length, precision
GRID = [((l, h, a, i), b, s, p)
        for (l, h, a, i) in ((2, 128, 2, 512), (4, 256, 4, 1024), (12, 768, 12, 3072))
        for b, s in ((8, 128), (32, 128), (8, 512))
        for p in ("fp32", "bf16")]

SIM_SCRIPT = '''"""Training step read by `bertlint memory` (every setting is also given on its command line)."""
import torch
from transformers import BertConfig, BertForSequenceClassification

model = BertForSequenceClassification(BertConfig.from_json_file({config!r})).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
for batch in loader:
    loss = model(**batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
'''

REAL_STEP = r'''
import json, sys, torch
from transformers import BertConfig, BertForSequenceClassification
cfg, b, s, prec, out = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig.from_json_file(cfg)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
ids = torch.randint(0, 1000, (b, s), device="cuda")
labels = torch.randint(0, 2, (b,), device="cuda")
peaks = []
for step in range(3):
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=prec == "bf16"):
        loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    peaks.append(torch.cuda.max_memory_allocated())
json.dump({"peaks": peaks}, open(out, "w"))
'''

FP16_SCRIPT = '''"""fp16 autocast + GradScaler on CUDA, tiny BERT, accumulation 2. --order clip-first: clip_grad_norm_ before
unscale_ (BL201); --order unscale-first: the correct order."""
import argparse
import torch
from transformers import BertConfig, BertForSequenceClassification

p = argparse.ArgumentParser()
p.add_argument("--order", default="clip-first")
a = p.parse_args()
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                                 intermediate_size=128, vocab_size=500, num_labels=2)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
ACCUM = 2
for i in range(100):
    ids = torch.randint(0, 500, (8, 64), device="cuda")
    labels = torch.randint(0, 2, (8,), device="cuda")
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(input_ids=ids, labels=labels).loss / ACCUM
    scaler.scale(loss).backward()
    if (i + 1) % ACCUM == 0:
        if a.order == "clip-first":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.unscale_(optimizer)
        else:
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
'''


def mib(b) -> str:
    return "?" if b is None else f"{b / 2 ** 20:.1f} MiB"


def part_memory(tmp: str, until: float, quick: bool) -> list[dict]:
    rows = []
    grid = GRID[:4] if quick else GRID
    for (layers, hidden, heads, inter), b, s, prec in grid:
        if time.time() > until:
            rows.append({"skipped": "budget spent", "config": [layers, hidden, b, s, prec]})
            break
        name = f"L{layers}-H{hidden}-b{b}-s{s}-{prec}"
        cfg = os.path.join(tmp, name + ".json")
        with open(cfg, "w") as f:
            json.dump({"model_type": "bert", "hidden_size": hidden, "num_hidden_layers": layers,
                       "num_attention_heads": heads, "intermediate_size": inter, "vocab_size": 1000,
                       "num_labels": 2, "max_position_embeddings": 512}, f)
        script = os.path.join(tmp, name + ".py")
        with open(script, "w") as f:
            f.write(SIM_SCRIPT.format(config=cfg))
        row: dict = {"config": name}
        t0 = time.time()
        try:
            p = subprocess.run([sys.executable, "-m", "bertlint", "memory", script, "--model-config", cfg, "--head",
                                "BertForSequenceClassification", "--micro-batch", str(b), "--seq-len", str(s),
                                "--precision", prec, "--optimizer", "adamw", "--device", "cuda", "--output-format",
                                "json", "--no-what-if"], capture_output=True, text=True, timeout=180, cwd=ROOT)
            data = json.loads(p.stdout)
            data = data[0] if isinstance(data, list) else data
            row["simulated"] = data.get("peak_bytes")
            row["simulated_phase"] = data.get("peak_phase")
        except Exception as e:
            row["simulated_error"] = f"{type(e).__name__}: {e}"
        row["simulate_s"] = round(time.time() - t0, 1)
        out = os.path.join(tmp, name + ".real.json")
        try:
            real = os.path.join(tmp, "real_step.py")
            with open(real, "w") as f:
                f.write(REAL_STEP)
            subprocess.run([sys.executable, real, cfg, str(b), str(s), prec, out], check=True, timeout=180,
                           capture_output=True)
            with open(out) as f:
                peaks = json.load(f)["peaks"]
            row["real_peaks"] = peaks
            row["real"] = max(peaks[1:])  # steps 2 and 3: optimizer states exist, as in the simulation
        except Exception as e:
            row["real_error"] = f"{type(e).__name__}: {e}"
        if row.get("simulated") and row.get("real"):
            row["error_pct"] = round(100.0 * (row["simulated"] - row["real"]) / row["real"], 2)
        print(f"  {name:28s} simulated {mib(row.get('simulated')):>12s}  torch.cuda.max_memory_allocated "
              f"{mib(row.get('real')):>12s}  error {row.get('error_pct', '?')} %"
              + (f"  [{row.get('simulated_error') or row.get('real_error')}]" if 'error_pct' not in row else ""),
              flush=True)
        rows.append(row)
    return rows


def part_verify(tmp: str, until: float) -> list[dict]:
    sys.path.insert(0, ROOT)
    from bertlint.api import lint_path
    from bertlint.verify import verify_script

    script = os.path.join(tmp, "fp16_scaler_bert.py")
    with open(script, "w") as f:
        f.write(FP16_SCRIPT)
    jobs = [(script, ["--order", "clip-first"]), (script, ["--order", "unscale-first"])]
    for path in sorted(glob.glob(os.path.join(ROOT, "fixtures", "*", "*.py"))):
        with open(path, encoding="utf-8", errors="replace") as f:
            if "GradScaler" in f.read():
                jobs.append((path, []))
    rows = []
    for path, args in jobs:
        if time.time() > until:
            rows.append({"script": path, "skipped": "budget spent"})
            continue
        t0 = time.time()
        try:
            diags = lint_path(path)
        except Exception:
            diags = []
        res = verify_script(path, args, diags, timeout=max(20.0, min(90.0, until - time.time())))
        r = res.report_json
        mem = r.get("memory") or {}
        row = {"script": os.path.relpath(path, ROOT) if path.startswith(ROOT) else os.path.basename(path),
               "args": args, "outcome": res.outcome, "exit": res.exit_code, "wall_s": round(time.time() - t0, 1),
               "counts": {k: v for k, v in (r.get("counts") or {}).items() if k.startswith("scaler") or k in
                          ("backward", "optimizer_step", "clip")},
               "skipped_steps": (res.records[0].get("skipped_steps") if res.records else None),
               "verifications": [(d.code, d.start.row, d.verification.status if d.verification else None,
                                  (d.verification.evidence if d.verification else "")[:160]) for d in res.diagnostics],
               "device": mem.get("device"), "tracker_peak": mem.get("peak_bytes"),
               "cuda_max_allocated": (mem.get("cuda") or {}).get("max_memory_allocated"),
               "nvml": mem.get("nvml")}
        print(f"  {row['script']} {' '.join(args)}: {row['outcome']} (exit {row['exit']}), {row['wall_s']} s, "
              f"device {row['device']}; scaler {row['counts']}; tracker peak {mib(row['tracker_peak'])}, "
              f"torch.cuda.max_memory_allocated {mib(row['cuda_max_allocated'])}", flush=True)
        for code, line, st, ev in row["verifications"]:
            print(f"      {code} line {line}: {st}: {ev}")
        rows.append(row)
    return rows


def part_nvml() -> dict:
    try:
        import pynvml  # type: ignore
    except Exception as e:
        return {"error": f"pynvml not importable: {type(e).__name__}: {e}"}
    try:
        pynvml.nvmlInit()
        try:
            h = pynvml.nvmlDeviceGetHandleByIndex(0)
            m = pynvml.nvmlDeviceGetMemoryInfo(h)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
            name = pynvml.nvmlDeviceGetName(h)
            return {"name": name.decode() if isinstance(name, bytes) else name, "total": int(m.total),
                    "used": int(m.used), "free": int(m.free),
                    "processes": [{"pid": p.pid, "used": int(p.usedGpuMemory or 0)} for p in procs]}
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=480.0, help="seconds for the whole check (default 480)")
    ap.add_argument("--json", default=None, help="write every figure to this JSON file")
    ap.add_argument("--quick", action="store_true", help="the 4 smallest grid points only")
    a = ap.parse_args(argv)
    try:
        import torch
    except Exception as e:
        print(f"gpu_check: torch is not importable ({type(e).__name__}: {e}); nothing to check")
        return 0
    if not torch.cuda.is_available():
        print("gpu_check: CUDA is not available on this machine; nothing to check (run it on a machine with a CUDA "
              "GPU)")
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    t0 = time.time()
    end = t0 + a.budget
    tmp = tempfile.mkdtemp(prefix="gpu-check-")
    print(f"gpu_check on {torch.cuda.get_device_name(0)} (torch {torch.__version__}), budget {a.budget:.0f} s")
    out = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__}
    print("1. bertlint memory --device cuda vs torch.cuda.max_memory_allocated (steps 2-3 of a real AdamW step):")
    out["memory"] = part_memory(tmp, t0 + 0.6 * a.budget, a.quick)
    print("2. --verify of fp16 GradScaler scripts:")
    out["verify"] = part_verify(tmp, end - 15)
    print("3. NVML:")
    out["nvml"] = part_nvml()
    print("  " + json.dumps(out["nvml"]))
    errs = [r["error_pct"] for r in out["memory"] if "error_pct" in r]
    if errs:
        print(f"memory: {len(errs)} configurations, |error| median {sorted(abs(x) for x in errs)[len(errs) // 2]:.2f} %,"
              f" max {max(abs(x) for x in errs):.2f} %")
    out["wall_s"] = round(time.time() - t0, 1)
    print(f"done in {out['wall_s']} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    sys.exit(main())
