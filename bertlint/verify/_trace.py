"""The observed run as a :class:`bertlint.trace.Trace`, and the one definition of the loop rules: a static finding is
decided by its invariant (``bertlint.trace.INVARIANTS``, the same functions the linter's dry run runs) on what really
happened.

The verifier records the same events as the dry run (backward with its loss scale, optimizer / scaler steps,
zero_grad, scheduler steps, clips, unscale_, update, accelerate's sync steps and no-op steps, the DDP sync state of
each backward's forward, the training forwards a backward's graph holds). For one rule:

* **confirmed** — its invariant fails on the observed trace; the evidence is the invariant's own message, quoted
  like the lint message quotes the dry run, with the numbers the run produced;
* **refuted** — the invariant holds and the trace has what it needs to be decided (:func:`needs`): the evidence
  says what was observed;
* **not exercised** (status ``inconclusive``) — the run did not reach what the invariant needs; the evidence says
  what (``the run stopped after 2 optimizer steps; the first-window check needs 3 windows``).

Violations the run shows with no static finding are reported too (:func:`findings`); an invariant that depends on
the accumulation N is then run only when N comes from a setting (a framework's, the static set-up), never from the
observed loss scale alone (0.25 may be a loss weight).

Pure Python (no torch): runs in the parent on the child's record. A runtime loss scale is a number; it becomes the
trace's symbolic factors when the accumulation N of the run is known: ``1/N`` by the framework (accelerate's
``backward``, the Trainer, Lightning's automatic optimization) when the framework divided, the rest ``1/N`` or
``1/N²`` by the script when it matches, else a constant.
"""

from __future__ import annotations

import os
from collections import Counter
from fractions import Fraction
from typing import Optional

from bertlint import trace as T

CONFIRMED, REFUTED, INCONCLUSIVE = "confirmed", "refuted", "inconclusive"

# the loop invariants whose events the verifier records
RUNTIME_CODES = ("BL101", "BL102", "BL103", "BL104", "BL105", "BL107", "BL108", "BL112", "BL113", "BL114", "BL201",
                 "BL202")
# invariants that read the accumulation N (a runtime-only finding needs N from a setting)
N_CODES = {"BL101", "BL103", "BL104", "BL107", "BL108"}
# optimizer steps the invariants need (the first window and two full ones: BL107); the run's default bound
WINDOWS_NEEDED = {"BL107": 3, "BL105": 2}
MAX_RECORDED_EVENTS = 3000  # the record keeps the first 3000 events (``Recorder.to_json``)

# what the fix is, for a violation the static pass did not report (the rule pages say more)
FIX = {
    "BL101": "Step (and zero the gradients) only when `(i + 1) % N == 0`.",
    "BL102": "Clear the gradients only right after `optimizer.step()`.",
    "BL103": "Divide the loss by the accumulation steps.",
    "BL104": "Remove the script's own division: the framework already divides.",
    "BL105": "Step the scheduler right after `optimizer.step()`.",
    "BL107": "Step when `(i + 1) % N == 0`.",
    "BL108": "Gate the step on `(i + 1) % N == 0` (inside `accumulate()`, step on every micro-batch).",
    "BL112": "Clip only right before the optimizer step (or under `if accelerator.sync_gradients:`).",
    "BL113": "Call `backward()` on each micro-batch's loss.",
    "BL114": "Keep forward and backward of a micro-batch on the same side of `no_sync()`, and sync the last one.",
    "BL201": "Call `scaler.unscale_(optimizer)` right before clipping.",
    "BL202": "Call `scaler.unscale_`/`step`/`update` only at the optimizer step.",
}
# a runtime-only violation explained by a static finding of another rule (the same cause, reported once)
EXPLAINED_BY = {"BL103": {"BL109", "BL405", "BL104"}, "BL101": {"BL108", "BL109"}, "BL108": {"BL101", "BL109"},
                "BL102": {"BL115"}, "BL104": {"BL109"}}


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 0.02 * abs(b)


def _scale(f: Optional[float], n: Optional[int], framework: Optional[str], scaled: bool) -> Optional[T.Scale]:
    if f is None:
        return None
    s = T.Scale()
    if framework and n and n > 1:
        s = s.times(T.Factor(T.ACCUM_FRAMEWORK, "N", power=-1, who=framework))
        f = f * n
    if n and n > 1 and _close(f, 1 / n):
        s = s.times(T.Factor(T.ACCUM_USER, "N", power=-1))
    elif n and n > 1 and _close(f, 1 / (n * n)):
        s = s.times(T.Factor(T.ACCUM_USER, "N", power=-2))
    elif not _close(f, 1.0):
        s = s.times(T.Factor(T.CONST, f"{f:.4g}", value=Fraction(f).limit_denominator(10 ** 6)))
    if scaled:
        s = s.times(T.Factor(T.SCALER, "scaler scale"))
    return s


def framework_of(record: dict) -> Optional[str]:
    """The framework that divided the loss by N before backward in this run (None: nobody did)."""
    acc = record.get("accelerate") or {}
    tr = record.get("trainer") or {}
    lt = record.get("lightning") or {}
    if acc.get("backward_calls") and (acc.get("gradient_accumulation_steps") or 1) > 1:
        return "accelerate"
    if tr.get("steps") and tr["steps"][0].get("trainer_divides") and (tr.get("gradient_accumulation_steps") or 1) > 1:
        return "the Trainer"
    if lt.get("automatic_optimization") and (lt.get("accumulate_grad_batches") or 1) > 1:
        return "Lightning"
    return None


def _owner(record: dict) -> str:
    if (record.get("accelerate") or {}).get("backward_calls"):
        return "accelerate"
    if (record.get("trainer") or {}).get("steps"):
        return "trainer"
    if (record.get("lightning") or {}).get("accumulate_grad_batches"):
        return "lightning"
    return "plain"


def build(record: dict, n: Optional[int], source_lines=(), forwards_as_micro_batches: bool = False) -> T.Trace:
    """The trace of one rank's record. ``forwards_as_micro_batches``: number micro-batches by training forwards (a
    backward whose graph holds k forwards spans k micro-batches: BL113) instead of by backward calls."""
    script = os.path.realpath(record.get("script") or "")

    def row(line) -> int:
        if line and os.path.realpath(line[0]) == script:
            return int(line[1])
        return 0

    def text(line, default: str) -> str:
        r = row(line)
        if 1 <= r <= len(source_lines):
            t = source_lines[r - 1].strip()
            if t and len(t) < 80:
                return t
        return default

    framework = framework_of(record)
    ddp = record.get("ddp") or {}
    t = T.Trace(n=n, n_text="N", n_source="observed", owner=_owner(record), ddp=bool(ddp.get("world_size")),
                sync_control=bool(ddp.get("no_sync_entries")), complete=True)
    backwards = record.get("backwards") or []
    events = list(record.get("events") or [])
    if len(events) >= MAX_RECORDED_EVENTS:  # cut short: keep the events up to the last step
        last = max((i for i, e in enumerate(events) if e.get("k") in ("optimizer_step", "scaler_step")), default=-1)
        events = events[:last + 1]
        t.notes.append("record cut at the last optimizer step before event 3000")
    # backward j (0-based) -> its micro-batch; the first micro-batch its graph holds
    tf = [max(1, int(b.get("train_forwards") or 1)) if forwards_as_micro_batches else 1 for b in backwards]
    ends, acc_ = [], 0
    for k in tf:
        acc_ += k
        ends.append(acc_ - 1)

    def mb_of(j: int) -> int:  # the micro-batch of backward j
        if j < 0:
            return -1
        return ends[j] if j < len(ends) else (ends[-1] if ends else -1) + (j - len(ends) + 1)

    def first_of(j: int) -> int:
        return mb_of(j) - (tf[j] if j < len(tf) else 1) + 1

    bi = 0
    pending_opt_step = None  # an optimizer step that ran inside scaler.step()
    # the micro-batch an event happened in (0-based, the dry run's convention): a call after backward k belongs to
    # micro-batch k, except a zero_grad with no step after it before the next backward — the next micro-batch's
    # body clearing before its own backward (`zero_grad(); loss.backward()`) — and accelerate's sync flag, set
    # when accumulate() is entered, before the micro-batch's backward
    later_step = [False] * len(events)
    seen_step = False
    for i in range(len(events) - 1, -1, -1):
        k = events[i].get("k")
        if k == "backward":
            seen_step = False
        later_step[i] = seen_step
        if k in ("optimizer_step", "scaler_step", "scaler_update", "accel_step_noop"):
            seen_step = True
    for i, e in enumerate(events):
        k = e.get("k")
        line = e.get("line")
        done = int(e.get("mb") or 0)  # backward calls finished before this event
        if k == "backward":
            b = backwards[bi] if bi < len(backwards) else {}
            fw = framework if (framework != "accelerate" or b.get("via_accelerate")) else None
            scaled = bool(b.get("scaler_scale"))
            ddp_sync = b.get("ddp_sync")
            mb = mb_of(bi)
            ev = T.Event("backward", line=row(line), text=text(line, "backward()"), mb=mb,
                         scale=_scale(b.get("factor"), n, fw, scaled), scaled=scaled,
                         in_no_sync=bool(b.get("in_no_sync")),
                         fwd_no_sync=(None if ddp_sync is None else not ddp_sync))
            if forwards_as_micro_batches and tf[bi] >= 2:
                ev.graph_from = first_of(bi)
            ev.meta["factor"] = b.get("factor")
            ev.meta["train_forwards"] = b.get("train_forwards")
            t.events.append(ev)
            bi += 1
            continue
        if (k == "zero_grad" and not later_step[i]) or k == "accel_sync":
            mb = first_of(done)
        else:
            mb = mb_of(done - 1)
        if k == "optimizer_step":
            ev = T.Event("step", line=row(line), text=text(line, "optimizer.step()"), opt=str(e.get("oid") or ""),
                         mb=mb, effective=True)
            t.events.append(ev)
            pending_opt_step = ev
        elif k == "accel_step_noop":
            t.events.append(T.Event("step", line=row(line), text=text(line, "optimizer.step()"), mb=mb,
                                    opt=str(e.get("oid") or ""),
                                    effective=False, why="off accelerate's sync step", via="accelerator"))
        elif k == "accel_sync":
            t.events.append(T.Event("counter", line=row(line), target="sync", value=bool(e.get("sync")), mb=mb))
        elif k == "scaler_step":
            if e.get("stepped") and pending_opt_step is not None:
                pending_opt_step.via = "scaler"  # the optimizer step ran inside scaler.step(): one update
                pending_opt_step.line = row(line) or pending_opt_step.line
                pending_opt_step.text = text(line, "scaler.step(optimizer)")
            else:  # inf/NaN gradients: the update was skipped, the window still ends here
                t.events.append(T.Event("step", line=row(line), text=text(line, "scaler.step(optimizer)"),
                                        opt=str(e.get("oid") or (pending_opt_step.opt if pending_opt_step else "")),
                                        mb=mb, effective=True, via="scaler",
                                        meta={"skipped": not e.get("stepped")}))
            pending_opt_step = None
            continue
        elif k == "zero_grad":
            t.events.append(T.Event("zero_grad", line=row(line), text=text(line, "zero_grad()"),
                                    of=str(e.get("kind") or "optimizer"), opt=str(e.get("oid") or ""), mb=mb,
                                    effective=True))
        elif k == "scheduler_step":
            t.events.append(T.Event("sched_step", line=row(line), text=text(line, "scheduler.step()"),
                                    target=str(e.get("cls") or "scheduler"), mb=mb, effective=True,
                                    meta={"lr": e.get("lr")}))
        elif k == "clip":
            t.events.append(T.Event("clip", line=row(line), text=text(line, str(e.get("fn") or "clip")), mb=mb,
                                    scaled=bool(e.get("scaled")), meta={"norm": e.get("norm")}))
        elif k == "scaler_unscale":
            t.events.append(T.Event("unscale", line=row(line), text=text(line, "scaler.unscale_(optimizer)"), mb=mb,
                                    opt=str(e.get("oid") or "")))
        elif k == "scaler_update":
            t.events.append(T.Event("update", line=row(line), text=text(line, "scaler.update()"), mb=mb))
        if k != "optimizer_step":
            pending_opt_step = None
    # the bound stops the run inside a micro-batch: what ran of a micro-batch whose backward never came (a zero_grad
    # at the top of the loop body) is not part of the observed trace
    last = max((e.mb for e in t.events if e.kind == "backward"), default=-1)
    t.events = [e for e in t.events if e.mb <= last]
    return t


# ------------------------------------------------------------------------------------------------ what was seen


def _g(x, digits: int = 4) -> str:
    return "?" if x is None else f"{x:.{digits}g}"


def _windows(t: T.Trace) -> list:
    return t.window_structure() or []


def windows_text(t: T.Trace) -> str:
    """``13 micro-batches, 3 optimizer steps (after micro-batches 4, 8, 12: windows of 4, 4, 4)``"""
    wins = _windows(t)
    mbs = t.micro_batches
    head = f"{mbs} micro-batch{'es' if mbs != 1 else ''}, {len(wins)} optimizer step{'s' if len(wins) != 1 else ''}"
    if not wins:
        return head
    after = ", ".join(str(w.step.mb + 1) for w in wins[:6]) + (", …" if len(wins) > 6 else "")
    sizes = ", ".join(str(len(w.backwards)) for w in wins[:6]) + (", …" if len(wins) > 6 else "")
    return f"{head} (after micro-batch{'es' if len(wins) > 1 else ''} {after}: windows of {sizes})"


def _scale_text(t: T.Trace) -> str:
    bws = [b for b in t.of("backward") if b.scale is not None]
    if not bws:
        return "the loss scale at backward could not be read"
    b = bws[0]
    f = b.meta.get("factor")
    return f"loss × {b.scale.text(t.n)} at backward ({_g(f, 4)} observed)"


def needs(code: str, t: T.Trace, record: dict) -> Optional[str]:
    """What the run did not reach that ``code``'s invariant needs to be decided (None: the trace has it)."""
    wins = _windows(t)
    stop = _stop_text(record)
    n = t.n
    bws = t.of("backward")
    if code in N_CODES and not (n and n > 1):
        return ("the run's accumulation N is not known (no framework setting, no static set-up value, no 1/N in "
                "the loss): the check compares windows with N")
    if code == "BL114" and not t.ddp:
        return "DistributedDataParallel was not initialised in the run (launch it under torchrun)"
    if code == "BL108":
        if len(bws) < 2 * n:
            return f"{len(bws)} micro-batches ran; the window-length check needs 2·N = {2 * n}"
        if not t.of("step"):
            return f"no optimizer.step() call ran ({stop})"
        return None
    if not wins:
        return f"{len(bws)} backward calls and no optimizer step took effect ({stop})"
    need = WINDOWS_NEEDED.get(code, 1)
    if len(wins) < need:
        what = {"BL107": "the first window and two full ones to compare it with",
                "BL105": "a window after the first"}.get(code, "")
        return (f"the run {stop} after {len(wins)} optimizer step{'s' if len(wins) != 1 else ''}; the check needs "
                f"{need} windows ({what})")
    multi = [w for w in wins if len(w.backwards) >= 2]
    if code in ("BL102", "BL105", "BL112", "BL114") and not multi:
        return (f"every optimizer step followed a single backward ({windows_text(t)}): no window of two or more "
                f"micro-batches")
    if code == "BL101":
        if T.accumulates(t) is None:
            return f"the loss reached backward without 1/N ({_scale_text(t)}): no accumulation intent to hold it to"
        if len(bws) < 2:
            return "fewer than two micro-batches ran"
    if code == "BL103":
        full = [w for w in wins if len(w.backwards) == n]
        if not full:
            return f"no window of N = {n} micro-batches ({windows_text(t)})"
        if any(b.scale is None for w in full for b in w.backwards):
            return "the loss scale between the loss and backward could not be read from the graph"
    if code == "BL104" and not any(b.scale is not None for b in bws):
        return "the loss scale between the loss and backward could not be read from the graph"
    if code == "BL105" and not t.of("sched_step"):
        return "no scheduler.step() ran"
    if code == "BL107" and not any(len(w.backwards) == n for w in wins[1:]):
        return f"no full window of N = {n} after the first ({windows_text(t)})"
    if code == "BL112" and not t.of("clip"):
        return "no gradient clipping ran"
    if code == "BL113" and not bws:
        return "no backward ran"
    if code == "BL201":
        if not any(b.scaled for b in bws):
            return "no enabled GradScaler scaled a loss (an fp16 GradScaler on CUDA, or torch.amp.GradScaler('cpu'))"
        if not t.of("clip"):
            return "no gradient clipping ran"
    if code == "BL202" and not t.of("update", "unscale") and not any(e.via == "scaler" for e in t.of("step")):
        return "no enabled GradScaler call ran (an fp16 GradScaler on CUDA, or torch.amp.GradScaler('cpu'))"
    return None


def holds_text(code: str, t: T.Trace, record: dict) -> str:
    """What was observed when the invariant holds (the numbers, like the dry run's)."""
    wins = _windows(t)
    w = windows_text(t)
    n = t.n
    if code == "BL101":
        k = Counter(len(x.backwards) for x in wins).most_common(1)[0][0]
        return f"{w}: one update every {k} micro-batches; {_scale_text(t)}"
    if code == "BL102":
        zg = len(t.of("zero_grad"))
        return f"{w}: no zero_grad between the backwards of a window ({zg} zero_grad calls)"
    if code == "BL103":
        b = next(b for b in t.of("backward") if b.scale is not None)
        v = b.scale.value(n)
        tot = f" → a window of {n} weighs {T._frac(v * n)}" if v is not None else ""
        return f"{w}; {_scale_text(t)}{tot}"
    if code == "BL104":
        return f"{_scale_text(t)}: divided by N once (N = {n})"
    if code == "BL105":
        s = t.of("sched_step")
        lrs = [e.meta.get("lr") for e in s]
        lr = " → ".join(_g(x, 3) for x in lrs[:5]) + (" …" if len(lrs) > 5 else "")
        return f"{w}; `{s[0].name}` ×{len(s)}: at most one per update (LR {lr})"
    if code == "BL107":
        return f"{w}: the first window has {len(wins[0].backwards)} micro-batches, like the next ones (N = {n})"
    if code == "BL108":
        return f"{w}: the windows have N = {n} micro-batches"
    if code == "BL112":
        c = t.of("clip")
        return f"{w}; `{c[0].name}` ×{len(c)}, after each window's last backward"
    if code == "BL113":
        k = len(t.of("backward"))
        return f"one training forward per backward over {k} backward calls"
    if code == "BL114":
        ddp = record.get("ddp") or {}
        return (f"{w}; the last micro-batch of each window forwarded with gradient sync on (no_sync entered "
                f"{ddp.get('no_sync_entries', 0)} times)")
    if code == "BL201":
        c = t.of("clip")
        return f"`scaler.unscale_` before each of the {len(c)} clip calls"
    if code == "BL202":
        st = [e for e in t.of("step") if e.via == "scaler"]
        return f"`scaler.update()` ×{len(t.of('update'))} for `scaler.step()` ×{len(st)}: one per optimizer step"
    return w


def _stop_text(record: dict) -> str:
    reason = record.get("stop_reason")
    if reason == "timeout":
        return "was stopped by the --verify-timeout"
    if reason in ("bound", "bound-no-eval"):
        return f"stopped at the bound ({record.get('microbatches')} micro-batches)"
    if record.get("status") == "completed":
        return "finished"
    if record.get("status") == "crashed":
        return "crashed"
    return str(record.get("status") or "ended")


def check(record: dict, n: Optional[int], code: str, source_lines=()) -> Optional[list]:
    """The violations of ``code``'s invariant on the observed trace (None: not a loop invariant the run records)."""
    if code not in RUNTIME_CODES or code not in T.INVARIANTS:
        return None
    t = build(record, n, source_lines, forwards_as_micro_batches=(code == "BL113"))
    return T.check(t, code)


def violated_text(code: str, t: T.Trace, v) -> str:
    """The evidence of a violation: the invariant's message, then the run's windows (and loss scale) in brackets."""
    scale = f"; {_scale_text(t)}" if code in ("BL101", "BL103", "BL104") else ""
    return f"observed: {v.message} [{windows_text(t)}{scale}]"


def decide_tail(record: dict, n: Optional[int], source_lines=()) -> tuple:
    """BL107's epoch tail (the epoch's last partial window dropped or leaked): the run does not record epoch
    boundaries, so only a leaked tail shows — one window longer than the others; otherwise not exercised."""
    t = build(record, n, source_lines)
    wins = _windows(t)
    sizes = [len(w.backwards) for w in wins]
    k = Counter(sizes[1:]).most_common(1)[0][0] if len(sizes) > 1 else None
    longer = [w for w in wins if k and k > 1 and len(w.backwards) > k]
    if longer:
        w = longer[0]
        return CONFIRMED, (f"observed: {w.mbs}: backward ×{len(w.backwards)}, `{w.step.name}` after the "
                           f"{T.ordinal(len(w.backwards))} while the other windows hold {k} → a partial window was "
                           f"added to the next update [{windows_text(t)}]")
    return INCONCLUSIVE, (f"not exercised: {windows_text(t)}; the epoch-tail check needs an epoch's end with a "
                          f"partial window (whether one is left depends on len(loader) % N, and the run {_stop_text(record)})")


def decide(record: dict, n: Optional[int], code: str, source_lines=(), tail: bool = False) -> Optional[tuple]:
    """(status, evidence) of a static ``code`` finding from the observed trace; None when ``code`` is not a loop
    invariant the run records. ``tail``: a BL107 finding about the epoch's tail (:func:`decide_tail`)."""
    if code not in RUNTIME_CODES or code not in T.INVARIANTS:
        return None
    if code == "BL107" and tail:
        return decide_tail(record, n, source_lines)
    t = build(record, n, source_lines, forwards_as_micro_batches=(code == "BL113"))
    if code == "BL108":
        # the static finding established that the step is gated on N (the runtime sees no conditions): the
        # invariant's "is the step gated on N itself" premise is the finding's
        for e in t.of("step"):
            e.cond_text = e.cond_text or t.n_text
    vs = T.check(t, code)
    if vs:
        return CONFIRMED, violated_text(code, t, vs[0])
    missing = needs(code, t, record)
    if missing:
        return INCONCLUSIVE, f"not exercised: {missing}"
    return REFUTED, f"observed, the invariant holds: {holds_text(code, t, record)}"


def findings(record: dict, n: Optional[int], n_from_setting: bool, static_codes: set, source_lines=()) -> list:
    """Violations the run shows for rules the static pass did not report: ``{code, row, event, message, evidence}``
    (message: the invariant's message and the fix). Invariants that read N run only when ``n_from_setting``; BL113
    is not reported on its own (two training forwards per backward is also a siamese / contrastive step)."""
    out = []
    for code in RUNTIME_CODES:
        if code in static_codes or code == "BL113" or EXPLAINED_BY.get(code, set()) & static_codes:
            continue
        if code in N_CODES and not n_from_setting:
            continue
        t = build(record, n if (n_from_setting or code not in N_CODES) else None, source_lines)
        try:
            vs = T.check(t, code)
        except Exception:  # noqa: BLE001 - the invariants are another area's; never break the report
            vs = []
        if vs and vs[0].event.line:
            out.append({"code": code, "row": vs[0].event.line,
                        "message": f"runtime: {vs[0].message}. {FIX.get(code, '')}".strip(),
                        "evidence": violated_text(code, t, vs[0])})
    return out
