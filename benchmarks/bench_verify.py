"""Benchmark of the runtime verifier (``bertlint --verify``), CPU.

1. Instrumentation overhead per training step, hooks and the dispatch-mode memory tracker on, on a bert-base-sized
   step (BertForSequenceClassification with the default BertConfig: 12 layers, hidden 768, ~110M parameters; batch
   2, sequence 128; AdamW; plain loop with accumulation 2). The same script runs in a plain interpreter and under
   the verifier's instrumentation (``bertlint/verify/_runner.py``, with a bound high enough that it is never
   stopped); each run times its
   own steps (forward + backward + optimizer step) and the benchmark compares medians. Runs alternate
   (plain, instrumented, plain, instrumented, ...) to spread machine noise over both. Target: <= 5 %.
2. The wall time of ``verify_script`` on the same script with the default bound (3 optimizer steps + 1
   micro-batch), from the call to the report.

    python benchmarks/bench_verify.py [--steps 6] [--reps 2] [--batch 2] [--seq 128] [--layers 12]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SCRIPT = r'''
import json, sys, time
import torch
from transformers import BertConfig, BertForSequenceClassification

steps, batch, seq, layers, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(num_hidden_layers=layers, num_labels=2))
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
ACCUM = 2
model.train()
times = []
for i in range(steps * ACCUM):
    t0, c0 = time.perf_counter(), time.process_time()
    ids = torch.randint(0, 30000, (batch, seq))
    loss = model(input_ids=ids, labels=torch.randint(0, 2, (batch,))).loss / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
    times.append([time.perf_counter() - t0, time.process_time() - c0])
    with open(out, "w") as f:
        json.dump(times, f)
'''


def _run(instrumented: bool, script: str, steps: int, batch: int, seq: int, layers: int, tmp: str) -> list[float]:
    out = os.path.join(tmp, f"times_{int(instrumented)}_{time.time_ns()}.json")
    args = [script, str(steps), str(batch), str(seq), str(layers), out]
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    if instrumented:
        rec_dir = tempfile.mkdtemp(dir=tmp)
        cfg = os.path.join(rec_dir, "cfg.json")
        sandbox = os.path.join(rec_dir, "sandbox")
        snap = os.path.join(rec_dir, "temp_before.json")
        with open(snap, "w") as f:
            json.dump(os.listdir(tempfile.gettempdir()), f)
        with open(cfg, "w") as f:
            json.dump({"record_dir": rec_dir, "timeout": 3600, "deadline": time.time() + 3600, "steps": 10 ** 6,
                       "sandbox": sandbox, "temp_snapshot": snap}, f)
        cmd = [sys.executable, os.path.join(ROOT, "bertlint", "verify", "_runner.py"), cfg, "--", *args]
    else:
        cmd = [sys.executable, *args]
    subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(out) as f:
        times = json.load(f)
    if instrumented:
        (rec_path,) = glob.glob(os.path.join(rec_dir, "rec-main*.json"))
        with open(rec_path) as f:
            rec = json.load(f)
        marks = rec.get("hook_s_at_steps") or []
        steps = _pair_medians(times, 0)  # optimizer steps 2.. (wall)
        per_step_hooks = [b - a for a, b in zip(marks, marks[1:])]  # hook seconds in steps 2..
        HOOKS.append((sum(per_step_hooks), sum(steps[: len(per_step_hooks)]), len(per_step_hooks)))
        TRACKED.append((rec.get("memory") or {}).get("allocations") or 0)
    return times


HOOKS: list = []  # (seconds inside the verifier's hooks, seconds of all timed micro-batches, micro-batches)
TRACKED: list = []  # storage allocations the memory tracker followed, per instrumented run


def _pair_medians(times: list, k: int) -> list[float]:
    """Per optimizer step (2 micro-batches), skipping the first step (warm-up, optimizer-state allocation);
    k = 0: wall-clock seconds, k = 1: CPU seconds of the process (less sensitive to other load on the machine)."""
    pairs = [times[i][k] + times[i + 1][k] for i in range(0, len(times) - 1, 2)]
    return pairs[1:]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--skip-verify", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="bench-verify-")
    script = os.path.join(tmp, "bert_base_step.py")
    with open(script, "w") as f:
        f.write(SCRIPT)
    runs = {False: [], True: []}
    for rep in range(a.reps):
        for inst in (False, True):
            runs[inst].append(_run(inst, script, a.steps, a.batch, a.seq, a.layers, tmp))
    print(f"bert-base-sized step on CPU (layers {a.layers}, batch {a.batch} x seq {a.seq}, 2 micro-batches per "
          f"optimizer step, AdamW), {a.steps - 1} timed steps per run, {a.reps} alternating runs per variant:")
    for k, label in ((0, "wall"), (1, "CPU")):
        plain = [x for r in runs[False] for x in _pair_medians(r, k)]
        inst = [x for r in runs[True] for x in _pair_medians(r, k)]
        mp, mi = statistics.median(plain), statistics.median(inst)
        print(f"  {label:4s} plain {mp:.3f} s/step (min {min(plain):.3f}), instrumented {mi:.3f} s/step "
              f"(min {min(inst):.3f}): overhead {100 * (mi - mp) / mp:+.1f} % (median), "
              f"{100 * (min(inst) - min(plain)) / min(plain):+.1f} % (min)  [target <= 5 %]")
    inside = sum(h[0] for h in HOOKS)
    total = sum(h[1] for h in HOOKS) or 1.0
    n = sum(h[2] for h in HOOKS) or 1
    print(f"  time inside the verifier's hooks (bookkeeping; the memory tracker's cost is inside every operation and "
          f"shows only in the overhead above), optimizer steps 2..: {1000 * inside / n:.1f} ms per optimizer step = "
          f"{100 * inside / total:.2f} % of the instrumented step time; storage allocations followed by the tracker "
          f"per run: {TRACKED}")
    if not a.skip_verify:
        sys.path.insert(0, ROOT)
        os.environ["HF_HUB_OFFLINE"] = "1"
        from bertlint.verify import verify_script

        t0 = time.perf_counter()
        res = verify_script(script, ["100", str(a.batch), str(a.seq), str(a.layers), os.path.join(tmp, "v.json")], [],
                            timeout=900)
        wall = time.perf_counter() - t0
        mem = res.report_json.get("memory", {})
        print(f"  verify_script wall time (default bound: {res.report_json.get('microbatches')} micro-batches, "
              f"{res.report_json.get('optimizer_steps')} optimizer steps): {wall:.1f} s")
        print(f"  memory peak {(mem.get('peak_bytes') or 0) / 2 ** 20:.0f} MiB in {mem.get('peak_phase')}: " + ", ".join(
            f"{k} {(v or 0) / 2 ** 20:.0f} MiB" for k, v in (mem.get("peak_by_category") or {}).items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
