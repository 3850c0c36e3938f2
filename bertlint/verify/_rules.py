"""The run's record (from ``_hooks.Recorder``) + a static diagnostic -> status and evidence with the observed
numbers. Pure Python (no torch): runs in the parent.

The loop rules are decided by their invariant on the observed trace (``bertlint.verify._trace``, the linter's own
``bertlint.trace.INVARIANTS``): nothing here re-states them. What stays here are the observations that are not
loop invariants (see ``CHECKERS``). Each returns ``(status, evidence)``; status is confirmed | refuted |
inconclusive. ``runtime_findings`` lists what the run shows that the static pass did not report.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from typing import Callable, Optional

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


# The observations that are not loop invariants (no event order decides them): accelerate's own division (BL109),
# a step counter's value (BL110), the DeepSpeed engine's counters (BL115), parameter dtypes (BL204/BL205),
# checkpoint arguments and gradients inside checkpointed blocks (BL301/BL303/BL304), the Trainer's loss factor and
# the model's use of num_items_in_batch (BL405), graphs and memory kept alive (BL501/BL502), inference tensors
# (BL506). The loop rules (bertlint.verify._trace.RUNTIME_CODES) are decided by their invariant on the trace.
CHECKERS: dict[str, Callable] = {
    "BL109": check_bl109, "BL110": check_bl110, "BL115": check_bl115, "BL204": check_bl204, "BL205": check_bl205,
    "BL301": check_bl301, "BL303": check_bl303, "BL304": check_bl304, "BL405": check_bl405, "BL501": check_bl501,
    "BL502": check_bl502, "BL506": check_bl506,
}
NEEDS_TRAINING = {"BL101", "BL102", "BL103", "BL104", "BL105", "BL107", "BL108", "BL110", "BL112", "BL113",
                  "BL114", "BL201", "BL202", "BL205"}


def verify_diagnostic(run: Run, d, source_lines: list[str]) -> tuple:
    from bertlint.verify import _trace

    code = d.code
    crash = run.crash
    if crash:
        for pat in CRASH_PATTERNS.get(code, []):
            if re.search(pat, crash.get("message") or ""):
                return CONFIRMED, (f"the script failed with {crash.get('type')}: {_short(crash.get('message'))} at "
                                   f"{fl(crash.get('user_frame'))}")
    if code in NEEDS_TRAINING and run.mb == 0:
        return _status_for_no_training(run)
    try:
        if code in _trace.RUNTIME_CODES:
            tail = bool(isinstance(d.data, dict) and d.data.get("tail"))
            st, ev = _trace.decide(run.r, run.n, code, list(source_lines), tail=tail)
            if code == "BL114":
                div = _divergence(run)
                if div:
                    ev += (f"; at optimizer step {div[0]} the gradient checksum differs across ranks "
                           f"({', '.join(g(v, 6) for v in div[1])}): the replicas diverge")
        else:
            fn = CHECKERS.get(code)
            if fn is None:
                return NOT_RUN, "no runtime check for this rule: the finding rests on the static analysis"
            st, ev = fn(run, d, source_lines) if code == "BL110" else fn(run, d)
    except Exception as e:  # a bug here must not hide the rest of the report
        return INCONCLUSIVE, f"verifier error while checking {code}: {type(e).__name__}: {e}"
    if crash and st != CONFIRMED:
        ev += f"; the script crashed ({crash.get('type')}: {_short(crash.get('message'), 100)})"
    dbg = os.environ.get("BERTLINT_VERIFY_TRACE_DEBUG")
    if dbg:
        with open(dbg, "a") as f:
            f.write(f"{code}\t{st}\t{ev[:300]}\n")
    return st, ev


# ---------------------------------------------------------------------------------------------------------------
# runtime-only findings
# ---------------------------------------------------------------------------------------------------------------


def n_from_setting(run: Run, accumulation_named: bool = False) -> Optional[int]:
    """The run's accumulation N when a setting gives it: a framework's (Trainer, accelerate, DeepSpeed, Lightning),
    the static set-up; or the loss divided by k while the script or its arguments name an accumulation."""
    n = run.r.get("accumulation")
    if isinstance(n, int) and n > 1:
        return n
    if isinstance(run.static_n, int) and run.static_n > 1:
        return run.static_n
    if accumulation_named and run.factor_k:
        return run.factor_k
    return None


def runtime_findings(run: Run, static_codes: set, accumulation_named: bool = False, source_lines=()) -> list[dict]:
    """What the run shows on its own, for codes the static pass did not report: the loop invariants on the observed
    trace (``_trace.findings``), and the observations that are decisive on their own.
    ``accumulation_named``: the script or its arguments name an accumulation setting (``--grad-accum 4``)."""
    from bertlint.verify import _trace

    out: list[dict] = []
    if run.r.get("status") == "no-torch" or not run.r:
        return out
    script = run.r.get("script")

    def add(code, line, message, evidence):
        if code in static_codes or not line:
            return
        if any(f["code"] == code for f in out):
            return
        out.append({"code": code, "line": line, "message": message, "evidence": evidence})

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
    # BL405: the Trainer's loss factor (not an event order: the model's use of num_items_in_batch)
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
    # the loop invariants on the observed trace (a violation another finding explains is reported once: BL405's ×N
    # Trainer loss is not also a BL103)
    n = n_from_setting(run, accumulation_named)
    known = set(static_codes) | {f["code"] for f in out}
    try:
        for f in _trace.findings(run.r, n if n else run.n, bool(n), known, list(source_lines)):
            out.append({"code": f["code"], "line": [script, f["row"]], "message": f["message"],
                        "evidence": f["evidence"]})
    except Exception:  # noqa: BLE001 - never break the report
        pass
    return out


class _Fake:
    def __init__(self, row):
        from types import SimpleNamespace

        self.start = SimpleNamespace(row=row)
        self.data = {}
        self.message = ""
        self.code = ""
