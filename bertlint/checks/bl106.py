"""BL106 schedule-length-mismatch: the schedule length is in the wrong units for how the scheduler is stepped.

- hand-written loop: stepped once per optimizer step (inside the gate), but built with ``len(dl) * epochs``
  micro-batches: only 1/N of the schedule runs (warm-up N× longer, the LR never decays to its end).
- accelerate ``accumulate()`` with a prepared scheduler: ``AcceleratedScheduler.step`` acts only on sync steps
  (REFERENCE §2.1), so the length must be ``len(dl) * epochs / N``; a length in micro-batches or multiplied by
  N is N× too long."""

from __future__ import annotations

import re

from bertlint.analysis.loops import ACCUM_RE
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL106", "schedule-length-mismatch", Severity.WARNING,
      "schedule length counted in micro-batches (or × N) for a scheduler stepped once per optimizer step")
def check(ctx) -> None:
    f = ctx.loops
    done = set()
    for loop in f:
        owner = loop.owner
        for e in loop.of("sched_step"):
            length, call = _ga.sched_length(f, e.receiver)
            if length is None or id(length) in done:
                continue
            text = _ga.code_of(length).strip()
            if owner in ("plain", "fabric") and _ga.accum_gated(loop) and e.per_window:
                acc = loop.accum()
                if acc is None or acc.value == 1:
                    continue
                if f.units_of(length, loop.func, acc.text) != "micro-batches":
                    continue
                done.add(id(length))
                n = acc.n if acc.value is not None else "N"
                _ga.report(
                ctx, loop,
                    length,
                    f"The schedule length `{text}` counts micro-batches, but `{e.name}()` is stepped once per optimizer "
                    f"step (every {acc.shown} micro-batches{'' if acc.value is not None else ', N'}): only 1/{n} of the schedule "
                    f"runs — warm-up lasts {n}× "
                    f"longer and the learning rate never decays to its end. Use `{text} // {acc.text}` (optimizer "
                    f"steps).",
                )
            elif owner == "accelerate" and e.in_accumulate and e.receiver in f.prepared:
                ga = f.accelerator_ga
                if ga is None or ga.is_more_than_one() is False:
                    continue
                mult = re.search(r"\*\s*\(?\s*([\w.]+)", text)
                times_n = bool(mult and ACCUM_RE.search(mult.group(1)))
                units = f.units_of(length, loop.func, ga.text)
                if not times_n and units != "micro-batches":
                    continue
                done.add(id(length))
                _ga.report(
                ctx, loop,
                    length,
                    f"The prepared scheduler steps only on sync steps inside `accelerator.accumulate()` "
                    f"({_ga.fw(ctx, 'accelerate')}: `AcceleratedScheduler.step` is a no-op on the other micro-batches), "
                    f"so its length must count optimizer steps, `len(train_dataloader) * epochs / {ga.text}`; "
                    f"`{text}` is {'multiplied by' if times_n else 'counted in micro-batches, i.e.'} {ga.n}× too long, "
                    f"and only 1/{ga.n} of the schedule runs.",
                )
