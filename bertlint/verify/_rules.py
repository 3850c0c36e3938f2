"""Per-rule confirm/refute logic: the run's record (from ``_hooks.Recorder``) + a static diagnostic -> status and
evidence with the observed numbers. Pure Python (no torch): runs in the parent.

Each checker returns ``(status, evidence)``; status is confirmed | refuted | inconclusive. ``runtime_findings``
lists what the run shows that the static pass did not report (only where the runtime evidence alone is decisive).
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Any, Callable, Optional

CONFIRMED, REFUTED, INCONCLUSIVE, NOT_RUN = "confirmed", "refuted", "inconclusive", "not-run"

# Crash messages that are the runtime symptom of a rule (REFERENCE.md: the texts of the errors).
CRASH_PATTERNS: dict[str, list[str]] = {
    "BL202": [r"unscale_\(\) has already been called", r"No inf checks were recorded", r"unscale_\(\) is being called after step"],
    "BL203": [r"fp16.*bf16|bf16.*fp16"],
    "BL204": [r"Attempting to unscale FP16 gradients"],
    "BL109": [r"Attempted unscale_ but _scale is None"],
    "BL303": [r"element 0 of tensors does not require grad"],
    "BL304": [r"Expected to mark a variable ready only once"],
    "BL402": [r"Check batch related parameters"],
    "BL403": [r"DeepSpeed config values that mismatch TrainingArguments"],
    "BL404": [r"compute_loss\(\) got an unexpected keyword argument 'num_items_in_batch'"],
    "BL407": [r"TrainingArguments\.__init__\(\) got an unexpected keyword argument|Trainer\.__init__\(\) got an unexpected keyword argument"],
    "BL408": [r"not supported for manual optimization|Do not set `gradient_accumulation_steps` in the DeepSpeed config"],
    "BL506": [r"Inference tensors cannot be saved for backward"],
}


def fl(line) -> str:
    if not line:
        return "?"
    return f"{os.path.basename(line[0])}:{line[1]}"


def g(x: Optional[float], digits: int = 4) -> str:
    if x is None:
        return "?"
    return f"{x:.{digits}g}"


def mib(b) -> str:
    if b is None:
        return "?"
    b = float(b)
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(b) >= div:
            return f"{b / div:.2f} {unit}"
    return f"{int(b)} B"


class Run:
    """Convenience views over one rank's record (rank 0 unless said otherwise) and the others."""

    def __init__(self, records: list[dict], static_n: Optional[int]):
        self.records = sorted(records, key=lambda r: r.get("rank", 0))
        self.r = self.records[0] if self.records else {}
        self.static_n = static_n
        r = self.r
        self.mb = int(r.get("microbatches") or 0)
        self.steps = int(r.get("optimizer_steps") or 0)
        wins = r.get("windows") or []
        by_opt = Counter(w.get("opt") for w in wins)
        main = by_opt.most_common(1)[0][0] if by_opt else None
        self.windows = [w for w in wins if w.get("opt") == main]
        self.backwards = r.get("backwards") or []
        self.crash = r.get("crash")

    @property
    def n(self) -> Optional[int]:
        rt = self.r.get("accumulation")
        if isinstance(rt, int) and rt > 1:
            return rt
        if isinstance(self.static_n, int) and self.static_n > 1:
            return self.static_n
        k = self.factor_k
        return k if k and k > 1 else None

    @property
    def factors(self) -> list[float]:
        return [b["factor"] for b in self.backwards if isinstance(b.get("factor"), (int, float))]

    @property
    def factor(self) -> Optional[float]:
        fs = self.factors
        if not fs:
            return None
        fs = sorted(fs)
        return fs[len(fs) // 2]

    @property
    def factor_k(self) -> Optional[int]:
        f = self.factor
        if f and 0 < f < 1:
            k = round(1 / f)
            if k >= 2 and abs(1 / f - k) < 0.02 * k:
                return k
        return None

    def sizes(self, key="since_step") -> list[int]:
        return [w.get(key) for w in self.windows if isinstance(w.get(key), int)]

    def counts(self, k: str) -> int:
        return int((self.r.get("counts") or {}).get(k, 0))

    def ran_header(self) -> str:
        return f"{self.mb} backward calls, {self.steps} optimizer steps"


def _status_for_no_training(run: Run) -> tuple:
    r = run.r
    if not r:
        return INCONCLUSIVE, "the run produced no record"
    if run.crash:
        c = run.crash
        return INCONCLUSIVE, (f"the script crashed before it could be observed ({c.get('type')}: "
                              f"{_short(c.get('message'))} at {fl(c.get('user_frame'))})")
    if r.get("status") == "completed":
        return INCONCLUSIVE, "the script finished without a training step (no backward call ran)"
    return INCONCLUSIVE, f"no training step within the bound ({_stop_text(r)})"


def _stop_text(r: dict) -> str:
    reason = r.get("stop_reason")
    if reason == "timeout":
        return "stopped by the --verify-timeout"
    if reason in ("bound", "bound-no-eval"):
        return f"stopped after {r.get('microbatches')} micro-batches"
    return str(r.get("status"))


def _short(s: Optional[str], n: int = 160) -> str:
    s = (s or "").strip().splitlines()[0] if (s or "").strip() else ""
    return s if len(s) <= n else s[: n - 1] + "…"


# ---------------------------------------------------------------------------------------------------------------
# per-rule checkers
# ---------------------------------------------------------------------------------------------------------------


def _acc_text(run: Run) -> str:
    n = run.n
    return f"; accumulation configured {n}" if n else ""


def check_bl101(run: Run, d) -> tuple:
    sizes = run.sizes()
    if not sizes:
        return INCONCLUSIVE, f"{run.ran_header()}: no optimizer step observed"
    f = run.factor
    ftxt = f"; loss scaled by {g(f, 3)} before backward" if f is not None and abs(f - 1) > 1e-6 else ""
    if all(s <= 1 for s in sizes):
        return CONFIRMED, f"{run.ran_header()}: one update per micro-batch{_acc_text(run)}{ftxt}"
    k = Counter(sizes).most_common(1)[0][0]
    return REFUTED, f"{run.ran_header()}: one update every {k} micro-batches (window sizes {sizes[:6]})"


def check_bl102(run: Run, d) -> tuple:
    ws = [w for w in run.windows if isinstance(w.get("in_grad"), int)]
    if not ws:
        return INCONCLUSIVE, f"{run.ran_header()}: no optimizer step with a gradient probe observed"
    lost = [w for w in ws if w["since_step"] > 1 and w["in_grad"] < w["since_step"]]
    zg = run.counts("zero_grad")
    if lost:
        w = lost[0]
        return CONFIRMED, (f"{w['since_step']} backward calls before optimizer step {w['index']} but the gradient "
                           f"held only the last {w['in_grad']} (gradients cleared in between; {zg} zero_grad calls "
                           f"for {run.steps} optimizer steps): each update saw {w['in_grad']} of {w['since_step']} "
                           f"micro-batches")
    if all(w["since_step"] <= 1 for w in ws):
        return INCONCLUSIVE, f"{run.ran_header()}: the optimizer steps on every micro-batch, nothing is accumulated"
    return REFUTED, (f"{run.ran_header()}: the gradients of all {ws[0]['since_step']} micro-batches of each window "
                     f"reached the update ({zg} zero_grad calls)")


def check_bl103(run: Run, d) -> tuple:
    ks = [w["in_grad"] for w in run.windows if isinstance(w.get("in_grad"), int)]
    f = run.factor
    if not ks:
        return INCONCLUSIVE, f"{run.ran_header()}: no optimizer step observed"
    k = Counter(ks).most_common(1)[0][0]
    if k <= 1:
        return INCONCLUSIVE, f"{run.ran_header()}: one micro-batch per update, nothing to scale"
    if f is None:
        return INCONCLUSIVE, (f"each update sums {k} micro-batch gradients; the scale between the loss and "
                              f"backward could not be read from the graph")
    if abs(f - 1) < 1e-3:
        return CONFIRMED, (f"each optimizer step sums {k} micro-batch gradients of unscaled losses (factor "
                           f"{g(f, 3)} between the loss and backward): the update is {k}× the mean gradient")
    if abs(f * k - 1) < 0.05:
        return REFUTED, f"each optimizer step sums {k} micro-batch gradients of losses scaled by {g(f, 3)} = 1/{k}"
    return INCONCLUSIVE, f"each update sums {k} micro-batch gradients; loss scaled by {g(f, 3)} before backward"


def _observed_window(run: Run) -> Optional[int]:
    """The usual number of micro-batches per optimizer step, when the run shows one (> 1): the accumulation a
    framework applied although no setting was recorded (Lightning's ``accumulate_grad_batches``)."""
    sizes = [s for s in run.sizes() if s]
    if len(sizes) < 2:
        return None
    k = Counter(sizes).most_common(1)[0][0]
    return k if k > 1 else None


def check_bl104(run: Run, d) -> tuple:
    f = run.factor
    n = run.n if not run.factor_k else (run.r.get("accumulation") or run.static_n or _observed_window(run))
    if f is None:
        return INCONCLUSIVE, f"{run.ran_header()}: the scale between the loss and backward could not be read"
    if n and n > 1:
        if abs(f * n * n - 1) < 0.05:
            return CONFIRMED, (f"the loss reaches backward scaled by {g(f, 3)} = 1/{n}²: divided by {n} twice "
                               f"(accumulation {n}); the gradient is 1/{n} of the mean")
        if abs(f * n - 1) < 0.05:
            return REFUTED, f"the loss reaches backward scaled by {g(f, 3)} = 1/{n}: divided once"
    return INCONCLUSIVE, f"the loss reaches backward scaled by {g(f, 3)}{_acc_text(run)}"


def check_bl105(run: Run, d) -> tuple:
    sched = run.r.get("scheduler") or []
    if not sched:
        return INCONCLUSIVE, f"{run.ran_header()}: no scheduler step observed"
    skipped = sum(1 for e in run.r.get("scaler") or [] if e.get("k") == "scaler_step" and not e.get("stepped"))
    same = sum(1 for a, b in zip(sched, sched[1:]) if a["st"] == b["st"])
    lrs = [e.get("lr") for e in sched]
    lr_txt = " → ".join(g(x, 3) for x in lrs[:5]) + (" …" if len(lrs) > 5 else "")
    if len(sched) > run.steps + skipped and same:
        ratio = len(sched) / max(run.steps, 1)
        return CONFIRMED, (f"{run.mb} micro-batches, {run.steps} optimizer steps, {len(sched)} scheduler steps: "
                           f"the LR changed on micro-batches that did not step ({lr_txt}); the schedule runs "
                           f"{ratio:.1f}× too fast")
    return REFUTED, (f"{len(sched)} scheduler steps for {run.steps} optimizer steps over {run.mb} micro-batches: "
                     f"one per update (LR {lr_txt})")


def check_bl107(run: Run, d) -> tuple:
    sizes = run.sizes("in_grad") or run.sizes()
    if len(sizes) < 2:
        return INCONCLUSIVE, f"{run.ran_header()}: fewer than two optimizer steps observed"
    if isinstance(d.data, dict) and d.data.get("tail"):
        # the epoch's tail: a window longer than the others is the leaked tail; none longer is no evidence either
        # way (the run's loader may hold a multiple of N micro-batches, or the tail was dropped by a zero_grad)
        k = Counter(sizes[1:]).most_common(1)[0][0]
        longer = [s for s in sizes if s > k]
        if k > 1 and longer:
            return CONFIRMED, (f"windows of {k} micro-batches, but one of {longer[0]}: the epoch's last partial window "
                               f"was added to the next epoch's first update")
        return INCONCLUSIVE, (f"{run.ran_header()}: windows of {sorted(set(sizes))[:4]} micro-batches; whether an epoch "
                              f"leaves a partial window depends on len(loader) % N")
    first, rest = sizes[0], sizes[1:]
    k = Counter(rest).most_common(1)[0][0]
    if k <= 1:
        return INCONCLUSIVE, f"{run.ran_header()}: one micro-batch per update, no accumulation window observed"
    if first < k:
        return CONFIRMED, (f"first optimizer step after {first} micro-batch{'es' if first > 1 else ''}, later ones "
                           f"after {', '.join(map(str, rest[:4]))}: the first update sees {first} of {k}")
    return REFUTED, f"every window observed has {k} micro-batches ({sizes[:6]})"


def check_bl108(run: Run, d) -> tuple:
    n = run.n
    acc = run.r.get("accelerate") or {}
    extra = ""
    if acc.get("sync_pattern"):
        syncs = [i + 1 for i, s in enumerate(acc["sync_pattern"]) if s]
        extra = f"; accumulate() synced after micro-batches {syncs[:6]}"
        if acc.get("opt_step_noop"):
            extra += f", {acc['opt_step_noop']} optimizer.step() calls were no-ops off the sync step"
    if run.mb == 0:
        return _status_for_no_training(run)
    if run.steps == 0:
        if n and run.mb > n:
            return CONFIRMED, f"{run.mb} micro-batches, 0 optimizer steps (accumulation {n}): no update at all{extra}"
        return INCONCLUSIVE, f"{run.mb} micro-batches, 0 optimizer steps{extra}"
    sizes = run.sizes()
    if not n:
        return INCONCLUSIVE, f"{run.ran_header()}, window sizes {sizes[:6]}; accumulation not known{extra}"
    bad = [s for s in sizes if s != n]
    if bad:
        return CONFIRMED, f"{run.ran_header()}: windows of {sizes[:6]} micro-batches, accumulation {n}{extra}"
    return REFUTED, f"{run.ran_header()}: every window has {n} micro-batches{extra}"


def check_bl109(run: Run, d) -> tuple:
    acc = run.r.get("accelerate") or {}
    if not acc:
        return INCONCLUSIVE, "no accelerate Accelerator was created in the run"
    ga = acc.get("gradient_accumulation_steps")
    bypass = sum(1 for b in run.backwards if not b.get("via_accelerate"))
    mp = acc.get("mixed_precision")
    dt = acc.get("distributed_type", "")
    if bypass and ((ga or 1) > 1 or mp == "fp16" or "DEEPSPEED" in dt):
        return CONFIRMED, (f"{bypass} of {len(run.backwards)} backward calls bypassed accelerator.backward "
                           f"(gradient_accumulation_steps={ga}, mixed_precision={mp}): the loss is not divided by {ga}"
                           f" and the framework's scaling is skipped")
    if acc.get("accumulate_entries") and (ga or 1) == 1:
        return CONFIRMED, (f"accumulate() entered {acc['accumulate_entries']} times with "
                           f"gradient_accumulation_steps=1: sync_gradients was True on every micro-batch, "
                           f"{run.steps} optimizer steps for {run.mb} micro-batches")
    ds = run.r.get("deepspeed") or {}
    if "DEEPSPEED" in dt and ds.get("global_steps") is not None and run.mb and ds["global_steps"] >= run.mb:
        return CONFIRMED, f"DeepSpeed global_steps {ds['global_steps']} after {run.mb} micro-batches: steps every micro-batch"
    if bypass:
        return INCONCLUSIVE, (f"{bypass} backward calls bypassed accelerator.backward, without effect in this "
                              f"configuration (gradient_accumulation_steps={ga}, mixed_precision={mp})")
    return REFUTED, (f"all {len(run.backwards)} backward calls went through accelerator.backward "
                     f"(gradient_accumulation_steps={ga}; {acc.get('accumulate_syncs', 0)} syncs in "
                     f"{acc.get('accumulate_entries', 0)} accumulate() entries)")


def _watch_name(d, source_lines: list[str]) -> Optional[str]:
    row = d.start.row
    for r in (row, d.data.get("statement_row")):
        if isinstance(r, int) and 1 <= r <= len(source_lines):
            m = re.search(r"\b([A-Za-z_]\w*)\s*\+=\s*1\b", source_lines[r - 1])
            if m:
                return m.group(1)
    m = re.search(r"`([A-Za-z_]\w*)` is advanced", d.message)
    return m.group(1) if m else None


def check_bl110(run: Run, d, source_lines=()) -> tuple:
    name = _watch_name(d, list(source_lines))
    vals = (run.r.get("watch") or {}).get(name or "", [])
    if not name or len(vals) < 2:
        return INCONCLUSIVE, f"the step counter{' `' + name + '`' if name else ''} could not be read during the run"
    adv = vals[-1][2] - vals[0][2]
    mbs = vals[-1][0] - vals[0][0]
    steps = vals[-1][1] - vals[0][1]
    if mbs and adv >= mbs and steps < mbs:
        return CONFIRMED, (f"`{name}` advanced {adv:g} times over {mbs} micro-batches while {steps} optimizer steps "
                           f"ran: it counts micro-batches")
    if adv <= steps:
        return REFUTED, f"`{name}` advanced {adv:g} times for {steps} optimizer steps over {mbs} micro-batches"
    return INCONCLUSIVE, f"`{name}` advanced {adv:g} over {mbs} micro-batches and {steps} optimizer steps"


def check_bl112(run: Run, d) -> tuple:
    clips = run.r.get("clips") or []
    if not clips:
        return INCONCLUSIVE, f"{run.ran_header()}: no gradient clipping observed"
    step_mbs = {w["mb"] for w in run.windows} | {e["mb"] for e in run.r.get("scaler") or []
                                                  if e.get("k") == "scaler_step"}  # skipped fp16 steps end windows too
    partial = [c for c in clips if c["mb"] not in step_mbs]
    if partial and run.steps < len(clips):
        norms = ", ".join(g(c.get("norm"), 3) for c in partial[:4])
        return CONFIRMED, (f"{len(clips)} clip calls for {run.steps} optimizer steps: {len(partial)} clipped a partial "
                           f"sum of the window (after micro-batches {[c['mb'] for c in partial[:6]]}; norms {norms})")
    return REFUTED, f"clipping ran once per optimizer step ({len(clips)} calls, {run.steps} steps)"


def check_bl113(run: Run, d) -> tuple:
    bw = [b for b in run.backwards if isinstance(b.get("train_forwards"), int)]
    if not bw:
        return _status_for_no_training(run)
    multi = [b for b in bw if b["train_forwards"] >= 2]
    if multi:
        b = multi[0]
        per = b["saved_bytes_alive"] / b["train_forwards"] if b.get("saved_bytes_alive") else None
        return CONFIRMED, (f"{b['train_forwards']} training forwards per backward ({len(multi)} of {len(bw)} backward "
                           f"calls): {mib(b.get('saved_bytes_alive'))} saved for backward were alive at once "
                           f"(≈ {mib(per)} per forward), the memory of one big batch")
    return REFUTED, f"one training forward per backward over {len(bw)} backward calls"


def check_bl114(run: Run, d) -> tuple:
    ddp = run.r.get("ddp") or {}
    if not ddp.get("world_size"):
        return INCONCLUSIVE, "DistributedDataParallel was not initialised in the run (launch it under torchrun)"
    ws = [w for w in run.windows if w.get("sync_passes") is not None]
    div = _divergence(run)
    sev = getattr(getattr(d, "severity", None), "value", "W")
    if div:
        i, vals = div
        return CONFIRMED, (f"at optimizer step {i} the gradient checksum differs across ranks "
                           f"({', '.join(g(v, 6) for v in vals)}): replicas diverge; gradient all-reduces in the "
                           f"windows: {[w['sync_passes'] for w in ws[:6]]}")
    if not ws:
        return INCONCLUSIVE, f"{run.ran_header()}: no optimizer step observed under DDP"
    passes = [w["sync_passes"] for w in ws]
    same = f"gradients identical across {ddp.get('world_size')} ranks at {len(ws)} steps"
    if sev == "E":
        return REFUTED, f"{same}; gradient all-reduces per optimizer step: {passes[:6]}"
    if any(p > 1 for p in passes):
        k = max(passes)
        return CONFIRMED, (f"{k} gradient all-reduces per optimizer step ({ws[0]['since_step']} micro-batches; "
                           f"no_sync entered {ddp.get('no_sync_entries', 0)} times); {same}")
    return REFUTED, f"{passes[:6]} gradient all-reduce per optimizer step; {same}"


def _divergence(run: Run):
    if len(run.records) < 2:
        return None
    per_rank = []
    for r in run.records:
        ws = r.get("windows") or []
        per_rank.append([w.get("grad_checksum") for w in ws])
    n = min(len(x) for x in per_rank)
    for i in range(n):
        vals = [x[i] for x in per_rank]
        if any(v is None for v in vals):
            continue
        ref = max(abs(v) for v in vals) or 1.0
        if max(vals) - min(vals) > 1e-5 * ref:
            return i + 1, vals
    return None


def check_bl115(run: Run, d) -> tuple:
    ds = run.r.get("deepspeed") or {}
    if not ds.get("backward"):
        return INCONCLUSIVE, "no DeepSpeed engine backward observed (deepspeed not installed or not used)"
    b, s, gas = ds["backward"], ds.get("step", 0), ds.get("gas") or 1
    gsteps = ds.get("global_steps", 0)
    zg = run.counts("zero_grad")
    if s < b:
        return CONFIRMED, (f"{b} engine.backward calls, {s} engine.step calls: global_steps {gsteps} after {b} "
                           f"micro-batches with gradient_accumulation_steps {gas} (expected {b // gas})")
    if zg:
        return CONFIRMED, f"{zg} manual zero_grad calls while the DeepSpeed engine manages gradients"
    return REFUTED, f"{b} engine.backward and {s} engine.step calls; global_steps {gsteps} (GAS {gas})"


def check_bl201(run: Run, d) -> tuple:
    clips = run.r.get("clips") or []
    scaled = [c for c in clips if c.get("scaled")]
    if scaled:
        c = scaled[0]
        true = c["norm"] / c["scale"] if c.get("norm") is not None and c.get("scale") else None
        return CONFIRMED, (f"{c['fn']} saw a total norm of {g(c.get('norm'))} while the gradients were still scaled by "
                           f"the GradScaler ({g(c.get('scale'))}) at {fl(c.get('line'))}: the true norm is ≈ {g(true)}; "
                           f"clipping to {g(c.get('max_norm'))} shrinks the update ~{g(c.get('scale'))}× whenever it fires")
    scaler_on = any(e.get("k") == "scaler_scale" for e in run.r.get("scaler") or []) or run.counts("scaler_scale")
    if not scaler_on:
        return INCONCLUSIVE, "no enabled GradScaler scaled a loss in the run (a CUDA fp16 run shows it)"
    if clips:
        return REFUTED, f"unscale_ ran before each of the {len(clips)} clip calls"
    return INCONCLUSIVE, "no gradient clipping observed"


def check_bl202(run: Run, d) -> tuple:
    ev = run.r.get("scaler") or []
    upd_wo_step, stepped_since = 0, False
    unscales_wo_step = 0
    un_since = 0
    for e in ev:
        k = e.get("k")
        if k == "scaler_step":
            stepped_since = True
            un_since = 0
        elif k == "scaler_unscale":
            un_since += 1
            if un_since > 1:
                unscales_wo_step += 1
        elif k == "scaler_update":
            if not stepped_since:
                upd_wo_step += 1
            stepped_since = False
    updates = sum(1 for e in ev if e.get("k") == "scaler_update")
    steps = sum(1 for e in ev if e.get("k") == "scaler_step")
    if upd_wo_step or unscales_wo_step:
        return CONFIRMED, (f"{updates} scaler.update() and {steps} scaler.step() calls: {upd_wo_step} updates and "
                           f"{unscales_wo_step} extra unscale_() calls on micro-batches that did not step")
    if steps and run.steps and steps > (run.steps + 1) and run.n:
        return CONFIRMED, f"scaler.step() ran {steps} times in {run.mb} micro-batches (accumulation {run.n})"
    if not ev:
        return INCONCLUSIVE, "no enabled GradScaler call observed (a CUDA fp16 run shows it)"
    return REFUTED, f"{updates} scaler.update() for {steps} scaler.step() calls: once per optimizer step"


def check_bl204(run: Run, d) -> tuple:
    dt = (run.r.get("dtypes") or {}).get("trainable") or {}
    fp16 = dt.get("float16", 0)
    total = sum(dt.values())
    if not dt:
        return _status_for_no_training(run)
    amp = run.counts("scaler_scale") or (run.r.get("accelerate") or {}).get("mixed_precision") == "fp16"
    if fp16 and amp:
        return CONFIRMED, f"{fp16} of {total} trainable parameter elements are float16 under fp16 GradScaler/AMP"
    if fp16:
        return INCONCLUSIVE, f"{fp16} of {total} trainable parameter elements are float16 (no enabled GradScaler seen)"
    return REFUTED, f"trainable parameters are {', '.join(sorted(dt))} ({total} elements): no float16 weights"


def check_bl205(run: Run, d) -> tuple:
    dt = (run.r.get("dtypes") or {}).get("trainable") or {}
    ch = [c for c in run.r.get("bf16_changes") or [] if c.get("fraction_unchanged") is not None]
    if ch:
        c = ch[0]
        lr = run.windows[0].get("lr") if run.windows else None
        pct = 100 * c["fraction_unchanged"]
        if c["fraction_unchanged"] >= 0.2:
            return CONFIRMED, (f"after optimizer step 1, {pct:.0f}% of {c['elements']} sampled bf16 weight elements "
                               f"with a nonzero gradient did not change (lr {g(lr, 3)}): the updates round away")
        return REFUTED, f"after optimizer step 1 only {pct:.0f}% of {c['elements']} sampled bf16 weight elements were unchanged"
    if dt and not dt.get("bfloat16"):
        return REFUTED, f"trainable parameters are {', '.join(sorted(dt))}: no bf16 weights are updated"
    return INCONCLUSIVE, f"{run.ran_header()}: no optimizer step on bf16 weights observed"


def check_bl301(run: Run, d) -> tuple:
    ck = run.r.get("checkpoint") or {}
    if not ck.get("calls"):
        return INCONCLUSIVE, "no torch.utils.checkpoint call observed (checkpointing runs only in training forwards)"
    if ck.get("explicit_use_reentrant") is None and ck.get("reentrant"):
        return CONFIRMED, f"torch.utils.checkpoint ran {ck['calls']} times without use_reentrant: reentrant (torch default)"
    return REFUTED, f"torch.utils.checkpoint ran {ck['calls']} times with use_reentrant={ck.get('explicit_use_reentrant')}"


def check_bl303(run: Run, d) -> tuple:
    ck = run.r.get("checkpoint") or {}
    if not ck.get("calls"):
        if run.crash and re.search(CRASH_PATTERNS["BL303"][0], run.crash.get("message", "")):
            return CONFIRMED, f"backward failed: {_short(run.crash['message'])}"
        return INCONCLUSIVE, "no torch.utils.checkpoint call observed in a training forward"
    checks = ck.get("checks") or []
    last = checks[-1] if checks else None
    if ck.get("inputs_no_grad") and last and last["params"] and last["no_grad"] == last["params"]:
        return CONFIRMED, (f"reentrant checkpoint ran {ck['inputs_no_grad']} of {ck['calls']} times with no input "
                           f"requiring grad; after backward {last['no_grad']} of {last['params']} trainable parameters "
                           f"inside checkpointed blocks had no gradient")
    if last and last["params"]:
        return REFUTED, (f"after backward {last['params'] - last['no_grad']} of {last['params']} trainable parameters "
                         f"inside checkpointed blocks had a gradient ({ck['reentrant']} of {ck['calls']} calls reentrant)")
    return INCONCLUSIVE, f"checkpoint ran {ck['calls']} times; gradients inside the blocks were not observed"


def check_bl304(run: Run, d) -> tuple:
    ddp = run.r.get("ddp") or {}
    ck = run.r.get("checkpoint") or {}
    if not ddp.get("world_size"):
        return INCONCLUSIVE, "DistributedDataParallel was not initialised in the run (launch it under torchrun)"
    if ddp.get("find_unused_parameters") and ck.get("reentrant") and run.mb and not run.crash:
        return REFUTED, (f"{run.mb} backward calls with find_unused_parameters=True and {ck['reentrant']} reentrant "
                         f"checkpoint calls ran without the error")
    if not ddp.get("find_unused_parameters"):
        return REFUTED, "DDP ran with find_unused_parameters=False"
    return INCONCLUSIVE, f"DDP find_unused_parameters=True; {ck.get('reentrant', 0)} reentrant checkpoint calls observed"


def check_bl405(run: Run, d) -> tuple:
    t = run.r.get("trainer") or {}
    steps = t.get("steps") or []
    if not steps:
        if t:
            return INCONCLUSIVE, "the Trainer was built but no training_step ran within the bound"
        return INCONCLUSIVE, "no transformers Trainer.training_step ran"
    s0 = steps[0]
    ga = t.get("gradient_accumulation_steps") or s0.get("current_gradient_accumulation_steps")
    probe = t.get("probe") or {}
    f = run.factor
    losses = ", ".join(g(b.get("loss"), 3) for b in run.backwards[:4])
    decided = (f"model_accepts_loss_kwargs={s0.get('model_accepts_loss_kwargs')}, num_items_in_batch="
               f"{g(s0.get('num_items_in_batch'))}, loss_is_scaled_for_ga={s0.get('loss_is_scaled_for_ga')}")
    if (ga or 1) <= 1:
        return REFUTED, f"gradient_accumulation_steps={ga}: nothing is accumulated ({decided})"
    if s0.get("trainer_divides"):
        return REFUTED, (f"the Trainer divides the loss by current_gradient_accumulation_steps="
                         f"{s0.get('current_gradient_accumulation_steps')} ({decided}; factor {g(f, 3)} at backward)")
    ign = probe.get("ignores_num_items")
    if ign:
        return CONFIRMED, (f"the Trainer does not divide by current_gradient_accumulation_steps="
                           f"{s0.get('current_gradient_accumulation_steps')} ({decided}), and {probe.get('model')}'s "
                           f"loss is unchanged when num_items_in_batch is ×1000 ({g(probe.get('loss'))} vs "
                           f"{g(probe.get('loss_num_items_x1000'))}): each update is the sum of {ga} micro-batch means "
                           f"(×{ga}); losses at backward {losses}")
    if ign is False:
        return REFUTED, (f"{probe.get('model')} normalises by num_items_in_batch (loss {g(probe.get('loss'))} → "
                         f"{g(probe.get('loss_num_items_x1000'))} with ×1000): the window's loss is exact ({decided})")
    return INCONCLUSIVE, f"the Trainer does not divide ({decided}); the num_items_in_batch probe failed: {probe.get('error')}"


def _series_growth(vals: list) -> Optional[tuple]:
    """(first, last, per-sample rate) of the longest stretch that grows on (almost) every sample; a drop starts a
    new stretch (a new call of the evaluation function, a new epoch)."""
    best = None
    seg: list = []
    for v in list(vals) + [None]:
        if v is not None and (not seg or v >= seg[-1]):
            seg.append(v)
            continue
        if len(seg) >= 3:
            ups = sum(1 for a, b in zip(seg, seg[1:]) if b > a)
            if ups >= max(2, int(0.75 * (len(seg) - 1))) and seg[-1] >= 1.5 * max(seg[0], 1):
                cand = (seg[0], seg[-1], (seg[-1] - seg[0]) / (len(seg) - 1))
                if best is None or cand[1] - cand[0] > best[1] - best[0]:
                    best = cand
        seg = [v] if v is not None else []
    return best


def grown_locals(run: Run) -> list[dict]:
    out = []
    for key, series in (run.r.get("locals_graph") or {}).items():
        name, _, fn = key.partition("@")
        for when in ("train", "eval"):
            s = [x for x in series if x[3] == when]
            vals = [abs(x[2]) for x in s]
            gr = _series_growth(vals)
            if gr:
                kind = "elements" if s[-1][2] < 0 else "nodes"
                n = int(round((gr[1] - gr[0]) / gr[2])) + 1 if gr[2] else len(vals)
                out.append({"name": name, "function": fn, "when": when, "first": gr[0], "last": gr[1],
                            "rate": gr[2], "kind": kind, "samples": n, "line": s[-1][4],
                            "firstlineno": s[-1][5]})
    return out


def _eval_growth(run: Run) -> Optional[tuple]:
    ev = [f.get("saved_bytes_alive") for f in run.r.get("forwards") or [] if not f.get("training")
          and isinstance(f.get("saved_bytes_alive"), int)]
    return _series_growth(ev) if ev else None


def check_bl501(run: Run, d) -> tuple:
    acc = d.data.get("accumulator") if isinstance(d.data, dict) else None
    grown = grown_locals(run)
    mine = [x for x in grown if not acc or x["name"] == acc] or ([] if acc else grown)
    eg = _eval_growth(run)
    if mine:
        x = mine[0]
        unit = "graph-carrying tensors" if x["kind"] == "elements" else "autograd-graph nodes"
        return CONFIRMED, (f"`{x['name']}` (in {x['function']}) held {x['first']} → {x['last']} {unit} over "
                           f"{x['samples']} {'micro-batches' if x['when'] == 'train' else 'evaluation forwards'} "
                           f"(+{x['rate']:.0f} per step): the graphs of all iterations stay alive"
                           + (f"; saved-for-backward bytes alive grew {mib(eg[0])} → {mib(eg[1])} across evaluation"
                              if eg else ""))
    if eg and (d.data.get("evaluation") if isinstance(d.data, dict) else False):
        return CONFIRMED, (f"saved-for-backward bytes alive grew {mib(eg[0])} → {mib(eg[1])} across evaluation "
                           f"forwards (+{mib(eg[2])} per batch): every batch's activations stay alive")
    seen = acc and any(k.split("@")[0] == acc for k in (run.r.get("locals_graph") or {}))
    evaluation = bool(d.data.get("evaluation")) if isinstance(d.data, dict) else False
    n_eval = sum(x[3] - (x[4] if len(x) > 4 else 0) for x in run.r.get("forward_lines") or [] if x[1] is False)
    if evaluation and not seen and n_eval >= 3 and not eg:
        return REFUTED, (f"over {n_eval} evaluation forwards no variable{' `' + acc + '`' if acc else ''} held a "
                         f"graph-carrying tensor and the saved-for-backward bytes alive did not grow")
    if seen:
        return REFUTED, f"`{acc}` held a graph-carrying value but it did not grow across the run"
    return INCONCLUSIVE, (f"no growing autograd graph held by the script's variables was observed"
                          f"{' (`' + acc + '` never held a graph-carrying tensor while sampled)' if acc else ''}")


def check_bl502(run: Run, d) -> tuple:
    fl_ = run.r.get("forward_lines") or []
    rows = {d.start.row, d.data.get("statement_row"), d.data.get("loop_row")} if isinstance(d.data, dict) else {d.start.row}
    evals = [x for x in fl_ if x[1] is False]
    rows = {r for r in rows if isinstance(r, int)}
    lo = min(rows) if rows else 0
    # the forwards at the flagged line, else the ones in the flagged loop's body (a few lines below it)
    here = [x for x in evals if x[0] and x[0][1] in rows] or [x for x in evals if x[0] and lo <= x[0][1] <= lo + 40]
    if not here:
        if evals:
            where = ", ".join(sorted({fl(x[0]) for x in evals if x[0]})[:3])
            return INCONCLUSIVE, f"evaluation forwards ran at {where}, none at or near line {d.start.row}"
        return INCONCLUSIVE, f"no evaluation forward (model in eval mode) ran within the bound ({_stop_text(run.r)})"
    # eval-mode forwards with grad on that fed a backward are training in eval mode, not evaluation
    with_grad = sum(x[3] - (x[4] if len(x) > 4 else 0) for x in here if x[2])
    total = sum(x[3] - (x[4] if len(x) > 4 and x[2] else 0) for x in here)
    if total <= 0:
        return INCONCLUSIVE, "the eval-mode forwards observed all fed a backward (training with model.eval())"
    per = [f.get("saved_bytes_alive") for f in run.r.get("forwards") or [] if not f.get("training") and f.get("grad")]
    where = ", ".join(sorted({fl(x[0]) for x in here if x[0]}))
    if with_grad:
        return CONFIRMED, (f"{with_grad} of {total} evaluation forwards at {where} ran with grad enabled "
                           f"(model.training False, torch.is_grad_enabled() True); {mib(per[0] if per else None)} "
                           f"saved for backward after the first")
    return REFUTED, f"all {total} evaluation forwards at {where} ran under no_grad/inference_mode"


def check_bl506(run: Run, d) -> tuple:
    inf = run.r.get("inference_inputs") or []
    if inf:
        return CONFIRMED, f"an inference-mode tensor (shape {inf[0]['shape']}) was fed to a training forward at {fl(inf[0]['line'])}"
    train_fwd = sum(x[3] for x in run.r.get("forward_lines") or [] if x[1] and x[2])
    if train_fwd:
        return REFUTED, f"none of the inputs of {train_fwd} training forwards was an inference tensor"
    return _status_for_no_training(run)


CHECKERS: dict[str, Callable] = {
    "BL101": check_bl101, "BL102": check_bl102, "BL103": check_bl103, "BL104": check_bl104, "BL105": check_bl105,
    "BL107": check_bl107, "BL108": check_bl108, "BL109": check_bl109, "BL110": check_bl110, "BL112": check_bl112,
    "BL113": check_bl113, "BL114": check_bl114, "BL115": check_bl115, "BL201": check_bl201, "BL202": check_bl202,
    "BL204": check_bl204, "BL205": check_bl205, "BL301": check_bl301, "BL303": check_bl303, "BL304": check_bl304,
    "BL405": check_bl405, "BL501": check_bl501, "BL502": check_bl502, "BL506": check_bl506,
}
NEEDS_TRAINING = {"BL101", "BL102", "BL103", "BL104", "BL105", "BL107", "BL108", "BL110", "BL112", "BL113",
                  "BL201", "BL202", "BL205"}


def verify_diagnostic(run: Run, d, source_lines: list[str]) -> tuple:
    code = d.code
    crash = run.crash
    if crash:
        for pat in CRASH_PATTERNS.get(code, []):
            if re.search(pat, crash.get("message") or ""):
                return CONFIRMED, (f"the script failed with {crash.get('type')}: {_short(crash.get('message'))} at "
                                   f"{fl(crash.get('user_frame'))}")
    fn = CHECKERS.get(code)
    if fn is None:
        return NOT_RUN, "no runtime check for this rule: the finding rests on the static analysis"
    if code in NEEDS_TRAINING and run.mb == 0:
        return _status_for_no_training(run)
    try:
        st, ev = fn(run, d, source_lines) if code == "BL110" else fn(run, d)
    except Exception as e:  # a bug here must not hide the rest of the report
        return INCONCLUSIVE, f"verifier error while checking {code}: {type(e).__name__}: {e}"
    if crash and st == INCONCLUSIVE:
        ev += f"; the script crashed ({crash.get('type')}: {_short(crash.get('message'), 100)})"
    st, ev = _with_invariant(run, d, source_lines, st, ev)
    return st, ev


def _with_invariant(run: Run, d, source_lines, st: str, ev: str) -> tuple:
    """The loop rules' one definition: the linter's invariant (bertlint.trace) run on the observed trace."""
    try:
        from bertlint.verify import _trace

        vs = _trace.check(run.r, run.n, d.code, list(source_lines))
    except Exception as e:  # the trace module is another area's; never break the report
        vs = None
        err = f"{type(e).__name__}: {e}"
    else:
        err = None
    dbg = os.environ.get("BERTLINT_VERIFY_TRACE_DEBUG")
    if dbg:
        with open(dbg, "a") as f:
            f.write(f"{d.code}\t{st}\t{None if vs is None else bool(vs)}\t{err}\t{(vs[0].message if vs else '')[:200]}"
                    f"\t{ev[:200]}\n")
    if vs:  # the invariant fails on what the run did: confirmed, quoted the way the lint message quotes the dry run
        observed = "observed: " + vs[0].message
        return CONFIRMED, (ev + "; " + observed) if st == CONFIRMED else observed
    return st, ev


# ---------------------------------------------------------------------------------------------------------------
# runtime-only findings
# ---------------------------------------------------------------------------------------------------------------


def runtime_findings(run: Run, static_codes: set, accumulation_named: bool = False, source_lines=()) -> list[dict]:
    """What the run shows on its own (decisive evidence only), for codes the static pass did not report.
    ``accumulation_named``: the script or its arguments name an accumulation setting (``--grad-accum 4``)."""
    out: list[dict] = []
    _invariant_findings(run, static_codes, out, source_lines)

    def add(code, line, message, evidence):
        if code in static_codes or not line:
            return
        if any(f["code"] == code for f in out):
            return
        out.append({"code": code, "line": line, "message": message, "evidence": evidence})

    if run.r.get("status") == "no-torch":
        return out
    # BL101: the loss is divided by k (an accumulation the script names) but every micro-batch steps
    k = run.factor_k
    sizes = run.sizes()
    framework = (run.r.get("trainer") or {}).get("steps") or (run.r.get("accelerate") or {}).get("backward_calls") \
        or (run.r.get("deepspeed") or {}).get("backward")
    if accumulation_named and k and len(sizes) >= 2 and all(x == 1 for x in sizes) and not framework:
        steps_at = [w.get("line") for w in run.windows if w.get("line")]
        line = Counter(tuple(x) for x in steps_at).most_common(1)[0][0] if steps_at else None
        add("BL101", list(line) if line else None,
            f"runtime: the loss reaches backward divided by {k} (accumulation {k} intended) but the optimizer steps "
            f"after every micro-batch: each update sees one micro-batch instead of {k} and is {k}× too small. Step "
            f"(and zero the gradients) only when `(i + 1) % {k} == 0`.",
            f"{run.ran_header()}: one update per micro-batch (window sizes {sizes[:6]}) while the loss is scaled by "
            f"{g(run.factor, 3)} = 1/{k} before backward")
    # BL102: gradients cleared between micro-batches of a window
    ws = [w for w in run.windows if isinstance(w.get("in_grad"), int)]
    lost = [w for w in ws if w["since_step"] > 1 and w["in_grad"] < w["since_step"]]
    if lost and len(lost) == len(ws):
        zg = [z for z in run.r.get("zero_grads") or [] if z.get("line")]
        line = Counter(tuple(z["line"]) for z in zg).most_common(1)[0][0] if zg else None
        st, ev = check_bl102(run, None)
        add("BL102", line, "runtime: gradients are cleared between the micro-batches of a window, so each optimizer "
            "step sees only the last micro-batch. Clear them only right after `optimizer.step()`.", ev)
    # BL112: clipping of partial sums
    clips = run.r.get("clips") or []
    step_mbs = {w["mb"] for w in run.windows} | {e["mb"] for e in run.r.get("scaler") or []
                                                  if e.get("k") == "scaler_step"}
    partial = [c for c in clips if c["mb"] not in step_mbs]
    if partial and run.steps and len(partial) >= 2 and any(s > 1 for s in run.sizes()):
        st, ev = check_bl112(run, None)
        add("BL112", partial[0].get("line"), "runtime: gradient clipping runs on micro-batches that do not step and "
            "clips partial sums of the window. Clip only right before the optimizer step (or under "
            "`if accelerator.sync_gradients:`).", ev)
    # BL201: clipping scaled gradients
    if any(c.get("scaled") for c in clips):
        st, ev = check_bl201(run, None)
        c = next(c for c in clips if c.get("scaled"))
        add("BL201", c.get("line"), "runtime: gradients are clipped while still multiplied by the GradScaler's scale. "
            "Call `scaler.unscale_(optimizer)` right before clipping.", ev)
    # BL202
    st, ev = check_bl202(run, None)
    if st == CONFIRMED and (run.r.get("scaler") or []):
        ev_l = [e for e in run.r["scaler"] if e.get("k") in ("scaler_update", "scaler_unscale")]
        add("BL202", ev_l[0].get("line") if ev_l else None, "runtime: GradScaler `update()`/`unscale_()` run on "
            "micro-batches that do not step. Call them only at the optimizer step.", ev)
    # BL204
    dt = (run.r.get("dtypes") or {}).get("trainable") or {}
    if dt.get("float16") and run.counts("scaler_scale"):
        st, ev = check_bl204(run, None)
        sc = [e for e in run.r.get("scaler") or [] if e.get("k") == "scaler_scale"]
        add("BL204", sc[0].get("line") if sc else None, "runtime: fp16 GradScaler on float16 weights. Keep the "
            "weights in float32 and let autocast run fp16.", ev)
    # BL303
    ck = run.r.get("checkpoint") or {}
    checks = ck.get("checks") or []
    if ck.get("inputs_no_grad") and checks and checks[-1]["params"] and checks[-1]["no_grad"] == checks[-1]["params"]:
        st, ev = check_bl303(run, None)
        line = None
        if ck.get("lines"):
            k = Counter(ck["lines"]).most_common(1)[0][0]
            fn, _, ln = k.rpartition(":")
            line = [fn, int(ln)]
        add("BL303", line, "runtime: reentrant checkpointing got inputs that do not require grad, so the "
            "checkpointed layers get no gradient. Use `use_reentrant=False` or `model.enable_input_require_grads()`.",
            ev)
    # BL405
    t = run.r.get("trainer") or {}
    if (t.get("probe") or {}).get("ignores_num_items") and t.get("steps") and not t["steps"][0].get("trainer_divides") \
            and (t.get("gradient_accumulation_steps") or 1) > 1:
        st, ev = check_bl405(run, None)
        add("BL405", t.get("line") or t["steps"][0].get("line"), "runtime: the Trainer does not divide the loss by the "
            "accumulation steps and the model ignores `num_items_in_batch`: each update is N× too large. Set "
            "`trainer.model_accepts_loss_kwargs = False` after building the Trainer.", ev)
    # BL501 (train or eval): a variable whose autograd graph grows every iteration
    for x in grown_locals(run):
        unit = "graph-carrying tensors" if x["kind"] == "elements" else "autograd-graph nodes"
        add("BL501", None if not x.get("line") else [run.r.get("script"), x["line"]],
            f"runtime: `{x['name']}` keeps the autograd graph of every iteration alive ({x['first']} → {x['last']} "
            f"{unit}). Accumulate `.item()` or `.detach()`.",
            f"`{x['name']}` (in {x['function']}) grew {x['first']} → {x['last']} {unit} over {x['samples']} samples "
            f"(+{x['rate']:.0f} per step)")
        break
    # BL502: evaluation forwards with grad enabled, never followed by backward
    if run.r.get("eval_no_backward_run", 0) >= 2:
        fl_ = [x for x in run.r.get("forward_lines") or [] if x[1] is False and x[2] and x[0]]
        if fl_:
            x = max(fl_, key=lambda x: x[3])
            st, ev = check_bl502(run, _Fake(x[0][1]))
            add("BL502", x[0], "runtime: evaluation forwards (model in eval mode) run with grad enabled and are "
                "never backpropagated: every batch builds an autograd graph. Wrap evaluation in `torch.no_grad()`.",
                ev)
    # BL506
    inf = run.r.get("inference_inputs") or []
    if inf:
        st, ev = check_bl506(run, None)
        add("BL506", inf[0].get("line"), "runtime: a tensor created under `torch.inference_mode()` is fed to a "
            "training forward. Create it under `torch.no_grad()` or `.clone()` it outside inference mode.", ev)
    # BL114 (E): replicas diverge
    div = _divergence(run)
    if div:
        bw = [b for b in run.backwards if b.get("line")]
        add("BL114", bw[-1]["line"] if bw else None, "runtime: the gradients differ across DDP ranks at an optimizer "
            "step: a backward ran without the all-reduce (forward inside `no_sync()`, backward outside). Keep "
            "forward and backward of a micro-batch on the same side of `no_sync()`.",
            f"at optimizer step {div[0]} the gradient checksum differs across ranks ({', '.join(g(v, 6) for v in div[1])})")
    return out


_INVARIANT_MESSAGES = {
    "BL103": "runtime: each optimizer step sums the gradients of N micro-batches whose losses are not divided by N: "
             "the update is N× the window's mean. Divide the loss by the accumulation steps.",
    "BL104": "runtime: the loss reaches backward divided by the accumulation steps twice (by the script and by the "
             "framework): each update is 1/N of the mean. Remove the script's own division.",
    "BL105": "runtime: the LR scheduler steps on micro-batches that do not step the optimizer: the schedule runs N× "
             "too fast. Step the scheduler right after `optimizer.step()`.",
    "BL107": "runtime: the first optimizer step comes after fewer micro-batches than the others (an off-by-one "
             "gate). Step when `(i + 1) % N == 0`.",
}


def _invariant_findings(run: Run, static_codes: set, out: list, source_lines) -> None:
    """The loop invariants the linter runs, on the observed trace, for rules the static pass did not report — only
    where the run's accumulation N comes from a setting (framework, the static pass), not from the loss scale."""
    n = run.r.get("accumulation") if isinstance(run.r.get("accumulation"), int) else None
    n = n if n and n > 1 else (run.static_n if isinstance(run.static_n, int) and run.static_n > 1 else None)
    if not n:
        return
    try:
        from bertlint.verify import _trace
    except Exception:
        return
    script = run.r.get("script")
    for code, message in _INVARIANT_MESSAGES.items():
        if code in static_codes or any(f["code"] == code for f in out):
            continue
        try:
            vs = _trace.check(run.r, n, code, list(source_lines))
        except Exception:
            vs = None
        if vs and vs[0].event.line:
            out.append({"code": code, "line": [script, vs[0].event.line], "message": message.replace("N", str(n))
                        if code != "BL104" else message, "evidence": "observed: " + vs[0].message})


class _Fake:
    def __init__(self, row):
        from types import SimpleNamespace

        self.start = SimpleNamespace(row=row)
        self.data = {}
        self.message = ""
        self.code = ""
