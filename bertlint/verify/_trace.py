"""The observed run as a :class:`bertlint.trace.Trace`: the verifier records the same events as the linter's dry run
(backward with its loss scale, optimizer / scaler steps, zero_grad, scheduler steps, clips, unscale_, update), so
the loop rules are checked by the same invariants (``bertlint.trace.INVARIANTS``) on what really happened.

Pure Python (no torch): runs in the parent on the child's record. A runtime loss scale is a number; it becomes the
trace's symbolic factors when the accumulation N of the run is known: ``1/N`` by the framework (accelerate's
``backward``, the Trainer, DeepSpeed) when the framework divided, the rest ``1/N`` or ``1/N²`` by the script when it
matches, else a constant.
"""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Optional

from bertlint import trace as T

# the loop invariants whose events the verifier records
RUNTIME_CODES = ("BL101", "BL102", "BL103", "BL104", "BL105", "BL107", "BL112", "BL201", "BL202")


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


def build(record: dict, n: Optional[int], source_lines=()) -> T.Trace:
    """The trace of one rank's record."""
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

    acc = record.get("accelerate") or {}
    tr = record.get("trainer") or {}
    framework = None
    if acc.get("backward_calls") and (acc.get("gradient_accumulation_steps") or 1) > 1:
        framework = "accelerate"
    elif tr.get("steps") and tr["steps"][0].get("trainer_divides") and (tr.get("gradient_accumulation_steps") or 1) > 1:
        framework = "the Trainer"
    owner = "accelerate" if acc.get("backward_calls") else ("trainer" if tr.get("steps") else "plain")
    t = T.Trace(n=n, n_text="N", n_source="observed", owner=owner, ddp=bool((record.get("ddp") or {}).get("world_size")),
                sync_control=bool((record.get("ddp") or {}).get("no_sync_entries")), complete=True)
    backwards = record.get("backwards") or []
    events = record.get("events") or []
    bi = 0
    pending_opt_step = None  # an optimizer step that ran inside scaler.step()
    # the micro-batch an event happened in (0-based, the dry run's convention): a call after backward k belongs to
    # micro-batch k, except a zero_grad with no step after it before the next backward — the next micro-batch's
    # body clearing before its own backward (`zero_grad(); loss.backward()`)
    later_step = [False] * len(events)
    seen_step = False
    for i in range(len(events) - 1, -1, -1):
        k = events[i].get("k")
        if k == "backward":
            seen_step = False
        later_step[i] = seen_step
        if k in ("optimizer_step", "scaler_step", "scaler_update"):
            seen_step = True
    for i, e in enumerate(events):
        k = e.get("k")
        line = e.get("line")
        mb_done = int(e.get("mb") or 0)
        if k == "zero_grad" and not later_step[i]:
            mb_done += 1
        if k == "backward":
            b = backwards[bi] if bi < len(backwards) else {}
            bi += 1
            fw = framework if (framework != "accelerate" or b.get("via_accelerate")) else None
            scaled = bool(b.get("scaler_scale"))
            ddp_sync = b.get("ddp_sync")
            t.events.append(T.Event("backward", line=row(line), text=text(line, "backward()"), mb=mb_done,
                                    scale=_scale(b.get("factor"), n, fw, scaled), scaled=scaled,
                                    in_no_sync=bool(b.get("in_no_sync")),
                                    fwd_no_sync=(None if ddp_sync is None else not ddp_sync)))
            continue
        mb = mb_done - 1
        if k == "optimizer_step":
            ev = T.Event("step", line=row(line), text=text(line, "optimizer.step()"), opt=str(e.get("oid") or ""),
                         mb=mb, effective=True)
            t.events.append(ev)
            pending_opt_step = ev
        elif k == "scaler_step":
            if e.get("stepped") and pending_opt_step is not None:
                pending_opt_step.via = "scaler"  # the optimizer step ran inside scaler.step(): one update
                pending_opt_step.line = row(line) or pending_opt_step.line
                pending_opt_step.text = text(line, "scaler.step(optimizer)")
            else:  # inf/NaN gradients: the update was skipped, the window still ends here
                t.events.append(T.Event("step", line=row(line), text=text(line, "scaler.step(optimizer)"),
                                        opt=str(e.get("oid") or (pending_opt_step.opt if pending_opt_step else "")),
                                        mb=mb, effective=True,
                                        via="scaler"))
            pending_opt_step = None
            continue
        elif k == "zero_grad":
            t.events.append(T.Event("zero_grad", line=row(line), text=text(line, "zero_grad()"),
                                    of=str(e.get("kind") or "optimizer"), opt=str(e.get("oid") or ""), mb=mb,
                                    effective=True))
        elif k == "scheduler_step":
            t.events.append(T.Event("sched_step", line=row(line), text=text(line, "scheduler.step()"),
                                    target=str(e.get("cls") or "scheduler"), mb=mb, effective=True))
        elif k == "clip":
            t.events.append(T.Event("clip", line=row(line), text=text(line, str(e.get("fn") or "clip")), mb=mb,
                                    scaled=bool(e.get("scaled"))))
        elif k == "scaler_unscale":
            t.events.append(T.Event("unscale", line=row(line), text=text(line, "scaler.unscale_(optimizer)"), mb=mb))
        elif k == "scaler_update":
            t.events.append(T.Event("update", line=row(line), text=text(line, "scaler.update()"), mb=mb))
        if k != "optimizer_step":
            pending_opt_step = None
    return t


def check(record: dict, n: Optional[int], code: str, source_lines=()) -> Optional[list]:
    """The violations of ``code``'s invariant on the observed trace (None: not a loop invariant the run records,
    the record was cut short, or the run shows no update made of two or more backward calls)."""
    if code not in RUNTIME_CODES or code not in T.INVARIANTS:
        return None
    if len(record.get("events") or []) >= 3000:  # the record keeps the first 3000 events only
        return None
    t = build(record, n, source_lines)
    if len(t.of("backward")) < 2 or not t.of("step"):
        return None
    return T.check(t, code)
