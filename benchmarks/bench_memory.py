"""Accuracy and speed of ``bertlint memory``.

Accuracy: for each configuration of the grid, the simulated peak of one training step (fake tensors, CPU storage
rules) is compared with a real CPU run of the same step measured by the same tensor accounting
(``bertlint.memory.simulate.measure_real``). Target: every row within +-5 %.
Speed: the time to simulate one bert-large step (target <= 30 s) and a whole ``bertlint memory`` run with the
what-if table.

    python benchmarks/bench_memory.py                # the grid (about 10-15 min on 2 cores) + speed
    python benchmarks/bench_memory.py --quick        # 4 small rows + speed
    python benchmarks/bench_memory.py --json out.json
    python benchmarks/bench_memory.py --speed-only   # bert-large simulation times
    python benchmarks/bench_memory.py --memtracker   # cross-check against torch's MemTracker (fake steps only)
    python benchmarks/bench_memory.py --cuda         # with a GPU: against torch.cuda.max_memory_allocated
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from bertlint.memory.simulate import measure_real, simulate  # noqa: E402
from bertlint.memory.spec import MemorySpec, lookup_architecture  # noqa: E402

GiB = 1024**3
# (model, micro-batch, seq, precision, checkpointing): bert-base and bert-large; micro-batch 1, 8, 32; seq 128 and
# 512; fp32 and bf16 autocast; checkpointing off and on. Rows whose real run would not fit this 24 GB / 2-core
# machine in the time budget (bert-large x 8 x 512, x 32) are simulated in the speed section only.
GRID = [
    ("bert-base-uncased", 1, 128, "fp32", False),
    ("bert-base-uncased", 1, 128, "bf16", False),
    ("bert-base-uncased", 1, 512, "fp32", False),
    ("bert-base-uncased", 1, 512, "bf16", False),
    ("bert-base-uncased", 1, 512, "fp32", True),
    ("bert-base-uncased", 8, 128, "fp32", False),
    ("bert-base-uncased", 8, 128, "bf16", False),
    ("bert-base-uncased", 8, 128, "fp32", True),
    ("bert-base-uncased", 8, 128, "bf16", True),
    ("bert-base-uncased", 32, 128, "fp32", False),
    ("bert-large-uncased", 1, 128, "fp32", False),
    ("bert-large-uncased", 1, 128, "bf16", False),
    ("bert-large-uncased", 1, 512, "fp32", False),
    ("bert-large-uncased", 1, 512, "bf16", True),
    ("bert-large-uncased", 8, 128, "fp32", False),
    ("bert-large-uncased", 8, 128, "bf16", True),
]
QUICK = [GRID[0], GRID[1], GRID[4], GRID[10]]


def spec_for(model: str, mb: int, seq: int, prec: str, ckpt: bool) -> MemorySpec:
    return MemorySpec(config=lookup_architecture(model), head="AutoModelForSequenceClassification", model_name=model,
                      micro_batch=mb, seq_len=seq, precision=prec, checkpointing=ckpt)


def accuracy(grid) -> list[dict]:
    rows = []
    for model, mb, seq, prec, ckpt in grid:
        spec = spec_for(model, mb, seq, prec, ckpt)
        t = time.perf_counter()
        c = time.process_time()
        sim = simulate(spec, "cpu")
        t_sim = time.perf_counter() - t
        cpu_sim = time.process_time() - c
        gc.collect()
        t = time.perf_counter()
        c = time.process_time()
        real = measure_real(spec)
        t_real = time.perf_counter() - t
        cpu_real = time.process_time() - c
        gc.collect()
        err = 100.0 * (sim.peak_bytes - real.peak_bytes) / real.peak_bytes
        row = {"model": model.replace("-uncased", ""), "micro_batch": mb, "seq_len": seq, "precision": prec,
               "checkpointing": ckpt, "simulated_bytes": sim.peak_bytes, "real_bytes": real.peak_bytes,
               "error_pct": round(err, 3), "sim_phase": sim.peak_phase, "real_phase": real.peak_phase,
               "categories_equal": sim.by_category == real.by_category, "sim_s": round(t_sim, 1),
               "real_s": round(t_real, 1), "sim_cpu_s": round(cpu_sim, 1), "real_cpu_s": round(cpu_real, 1)}
        rows.append(row)
        print(f"  {row['model']:<10} B={mb:<2} L={seq:<3} {prec:<4} ckpt={'on ' if ckpt else 'off'} "
              f"sim {sim.peak_bytes / GiB:7.3f} GiB  real {real.peak_bytes / GiB:7.3f} GiB  {err:+6.2f} %  "
              f"({sim.peak_phase}/{real.peak_phase}; sim {t_sim:.1f} s wall {cpu_sim:.1f} s cpu, "
              f"real {t_real:.1f} s wall {cpu_real:.1f} s cpu)", flush=True)
    return rows


def speed() -> dict:
    out = {}
    for label, spec, dev in [
        ("bert-large B=8 L=512 fp32 (cuda rules)", spec_for("bert-large-uncased", 8, 512, "fp32", False), "cuda"),
        ("bert-large B=32 L=512 fp32 (cuda rules)", spec_for("bert-large-uncased", 32, 512, "fp32", False), "cuda"),
        ("bert-base B=32 L=512 fp32 (cpu rules; the issue's 25.1 GiB)", spec_for("bert-base-uncased", 32, 512, "fp32", False), "cpu"),
    ]:
        t = time.perf_counter()
        c = time.process_time()
        r = simulate(spec, dev)
        dt = time.perf_counter() - t
        dc = time.process_time() - c
        out[label] = {"seconds": round(dt, 1), "cpu_seconds": round(dc, 1), "peak_bytes": r.peak_bytes,
                      "peak_phase": r.peak_phase}
        print(f"  simulate {label}: {dt:.1f} s wall, {dc:.1f} s cpu, peak {r.peak_bytes / GiB:.2f} GiB in {r.peak_phase}", flush=True)
    t = time.perf_counter()
    c = time.process_time()
    r = simulate(spec_for("bert-large-uncased", 8, 512, "fp32", False), "cuda", what_if=True)
    dt = time.perf_counter() - t
    dc = time.process_time() - c
    out["bert-large B=8 L=512 with the what-if table"] = {"seconds": round(dt, 1), "cpu_seconds": round(dc, 1),
                                                          "rows": len(r.what_if)}
    print(f"  simulate bert-large B=8 L=512 + what-if table ({len(r.what_if)} rows): {dt:.1f} s wall, "
          f"{dc:.1f} s cpu", flush=True)
    return out


def memtracker_peak(spec: MemorySpec) -> int:
    """Independent cross-check: torch's own tracker (torch.distributed._tools.mem_tracker.MemTracker) on the same
    fake step (steady state: optimizer states created first), CPU storage rules."""
    import contextlib

    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.mem_tracker import MemTracker

    from bertlint.memory.simulate import _inputs, _instantiate, build_config

    config = build_config(spec)
    with FakeTensorMode(allow_non_fake_inputs=True):
        model = _instantiate(spec, config)
        if spec.checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": spec.reentrant})
        model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False)
        for p in model.parameters():
            p.grad = torch.zeros_like(p)
        opt.step()
        opt.zero_grad(set_to_none=True)
        batch = _inputs(torch, spec, config, config.vocab_size)
        mt = MemTracker()
        mt.track_external(model, opt, *batch.values())
        amp = torch.autocast("cpu", dtype=torch.bfloat16) if spec.precision == "bf16" else contextlib.nullcontext()
        import warnings

        with warnings.catch_warnings(), mt:
            warnings.simplefilter("ignore")
            with amp:
                loss = model(**batch).loss
            loss.backward()
            del loss
            opt.step()
            opt.zero_grad(set_to_none=True)
        return sum(v for k, v in mt.get_tracker_snapshot("peak")[torch.device("cpu")].items() if k == "Total")


def cross_check(grid) -> list[dict]:
    rows = []
    for model, mb, seq, prec, ckpt in grid:
        spec = spec_for(model, mb, seq, prec, ckpt)
        sim = simulate(spec, "cpu").peak_bytes
        ref = memtracker_peak(spec)
        err = 100.0 * (sim - ref) / ref
        rows.append({"model": model, "micro_batch": mb, "seq_len": seq, "precision": prec, "checkpointing": ckpt,
                     "simulated_bytes": sim, "memtracker_bytes": ref, "error_pct": round(err, 3)})
        print(f"  {model:<20} B={mb:<2} L={seq:<3} {prec:<4} ckpt={'on ' if ckpt else 'off'} bertlint "
              f"{sim / GiB:7.3f} GiB  torch MemTracker {ref / GiB:7.3f} GiB  {err:+6.2f} %", flush=True)
    return rows


def cuda_check(grid) -> list[dict]:
    """With a GPU: the simulated peak (CUDA rules) against torch.cuda.max_memory_allocated of the real step."""
    import torch

    from bertlint.memory.simulate import measure_cuda

    rows = []
    for model, mb, seq, prec, ckpt in grid:
        spec = spec_for(model, mb, seq, prec, ckpt)
        sim = simulate(spec, "cuda")
        tracked, allocated = measure_cuda(spec)
        err = 100.0 * (sim.peak_bytes - allocated) / allocated
        rows.append({"model": model, "micro_batch": mb, "seq_len": seq, "precision": prec, "checkpointing": ckpt,
                     "simulated_bytes": sim.peak_bytes, "tracked_on_gpu_bytes": tracked.peak_bytes,
                     "max_memory_allocated": allocated, "error_pct": round(err, 3)})
        print(f"  {model:<20} B={mb:<2} L={seq:<3} {prec:<4} ckpt={'on ' if ckpt else 'off'} simulated "
              f"{sim.peak_bytes / GiB:7.3f} GiB  tracked on GPU {tracked.peak_bytes / GiB:7.3f} GiB  "
              f"max_memory_allocated {allocated / GiB:7.3f} GiB  {err:+6.2f} %", flush=True)
        del tracked
        gc.collect()
        torch.cuda.empty_cache()
    return rows


CUDA_GRID = GRID + [("bert-base-uncased", 32, 512, "fp32", False), ("bert-base-uncased", 32, 512, "bf16", False),
                    ("bert-large-uncased", 8, 512, "fp32", False), ("bert-large-uncased", 32, 512, "bf16", True)]


def markdown(rows: list[dict]) -> str:
    lines = ["| model | B | L | precision | ckpt | simulated GiB | real CPU GiB | error % | phase (sim/real) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['micro_batch']} | {r['seq_len']} | {r['precision']} | "
                     f"{'on' if r['checkpointing'] else 'off'} | {r['simulated_bytes'] / GiB:.3f} | "
                     f"{r['real_bytes'] / GiB:.3f} | {r['error_pct']:+.2f} | {r['sim_phase']}/{r['real_phase']} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--quick", action="store_true")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--json", metavar="FILE")
    p.add_argument("--speed-only", action="store_true", help="only the speed section")
    p.add_argument("--cuda", action="store_true",
                   help="with a GPU: compare the CUDA-rules simulation with torch.cuda.max_memory_allocated")
    p.add_argument("--memtracker", action="store_true",
                   help="only the cross-check against torch's MemTracker on the same fake step (fast)")
    a = p.parse_args(argv)
    if a.cuda:
        import torch

        if not torch.cuda.is_available():
            print("--cuda: no GPU here")
            return 2
        print(f"CUDA check on {torch.cuda.get_device_name(0)}", flush=True)
        rows = cuda_check(CUDA_GRID)
        worst = max(abs(r["error_pct"]) for r in rows)
        print(f"worst error {worst:.2f} %")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"cuda": rows}, f, indent=2)
        return 0 if worst <= 5.0 else 1
    if a.speed_only:
        print("speed", flush=True)
        sp = speed()
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"speed": sp}, f, indent=2)
        return 0
    if a.memtracker:
        print("cross-check: bertlint's tracker vs torch's MemTracker, same fake step, CPU storage rules", flush=True)
        grid = GRID + [("bert-base-uncased", 32, 512, "fp32", False), ("bert-large-uncased", 8, 512, "fp32", False)]
        rows = cross_check(grid)
        worst = max(abs(r["error_pct"]) for r in rows)
        print(f"worst difference {worst:.2f} %")
        if a.json:
            with open(a.json, "w") as f:
                json.dump({"memtracker": rows}, f, indent=2)
        return 0
    t0 = time.perf_counter()
    print("accuracy: simulated peak vs a real CPU step (same tensor accounting)", flush=True)
    rows = accuracy(QUICK if a.quick else GRID)
    sp = {} if a.no_speed else (print("speed", flush=True) or speed())
    print()
    print(markdown(rows))
    worst = max(abs(r["error_pct"]) for r in rows)
    ok = worst <= 5.0
    print(f"\nworst error {worst:.2f} % ({'within' if ok else 'OUTSIDE'} +-5 %); total {time.perf_counter() - t0:.0f} s")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": rows, "speed": sp, "worst_error_pct": worst}, f, indent=2)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
