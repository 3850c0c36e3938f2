"""BL106 schedule-length-mismatch: the schedule length is in the wrong units for how the scheduler is stepped.

- hand-written loop: stepped once per optimizer step (inside the gate), but built with ``len(dl) * epochs``
  micro-batches: only 1/N of the schedule runs (warm-up N× longer, the LR never decays to its end).
- accelerate ``accumulate()`` with a prepared scheduler: ``AcceleratedScheduler.step`` acts only on sync steps
  (REFERENCE §2.1), so the length must be ``len(dl) * epochs / N``; a length in micro-batches or multiplied by
  N is N× too long.

From the dry run: how often the scheduler is stepped (``sched_step`` events against the effective optimizer steps,
accelerate's ``accumulate()``); the schedule's length expression and its units are set-up facts of the file
(``_ga.sched_length``, ``FileLoops.units_of``)."""

from __future__ import annotations

import re

from bertlint.analysis.accum import ACCUM_RE
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL106", "schedule-length-mismatch", Severity.WARNING,
      "schedule length counted in micro-batches (or × N) for a scheduler stepped once per optimizer step")
def check(ctx) -> None:
    from bertlint.analysis import dryrun

    f = ctx.loops
    done = set()
    for run in dryrun.of(ctx):
        loop = run.loop
        for tr in run.traces:
            if not tr.complete or tr.n is None or tr.n <= 1:
                continue
            for recv, how in _schedulers(tr, f):
                length, call = _ga.sched_length(f, recv)
                if length is None or id(length) in done:
                    continue
                text = _ga.code_of(length).strip()
                name = recv.split(".")[-1]
                if how == "per-update":
                    if f.units_of(length, loop.func, tr.n_text) != "micro-batches":
                        continue
                    done.add(id(length))
                    n = str(tr.n) if tr.n_source == "resolved" else "N"
                    _ga.treport(
                        ctx, run, tr, length,
                        f"The schedule length `{text}` counts micro-batches, but `{name}.step()` is stepped once per "
                        f"optimizer step (every {_ga.n_shown_t(tr)} micro-batches{_ga.when(tr)}: the dry run steps it "
                        f"{how_many(tr, recv)}): only 1/{n} of the schedule runs — warm-up lasts {n}× longer and the "
                        f"learning rate never decays to its end. Use `{text} // {tr.n_text}` (optimizer steps).",
                    )
                else:
                    ga = f.accelerator_ga
                    if ga is None or ga.is_more_than_one() is False:
                        continue
                    mult = re.search(r"\*\s*\(?\s*([\w.]+)", text)
                    times_n = bool(mult and ACCUM_RE.search(mult.group(1)))
                    units = f.units_of(length, loop.func, ga.text)
                    if not times_n and units != "micro-batches":
                        continue
                    done.add(id(length))
                    _ga.treport(
                        ctx, run, tr, length,
                        f"The prepared scheduler steps only on sync steps inside `accelerator.accumulate()` "
                        f"({_ga.fw(ctx, 'accelerate')}: `AcceleratedScheduler.step` is a no-op on the other "
                        f"micro-batches), so its length must count optimizer steps, `len(train_dataloader) * epochs / "
                        f"{ga.text}`; `{text}` is {'multiplied by' if times_n else 'counted in micro-batches, i.e.'} "
                        f"{ga.n}× too long, and only 1/{ga.n} of the schedule runs.",
                    )


def _schedulers(tr, f) -> list:
    """(receiver, how) of the schedulers the dry run shows stepped once per optimizer update: ``per-update`` in a
    hand-written loop (plain / Fabric) whose windows hold N backwards, the scheduler stepped exactly on the
    micro-batches of the effective optimizer steps; ``accumulate`` for a prepared scheduler stepped inside
    ``accelerator.accumulate()`` (accelerate makes it a no-op off the sync step)."""
    out = []
    scheds: dict = {}
    for e in tr.of("sched_step"):
        if e.target:
            scheds.setdefault(e.target, []).append(e)
    if tr.owner in ("plain", "fabric"):
        wins = tr.window_structure()
        if not wins or not any(w.n_mbs == tr.n for w in wins):
            return []
        step_mbs = [s.mb for s in tr.effective_steps()]
        for recv, evs in scheds.items():
            if any(not e.certain or e.effective is not True for e in evs):
                continue
            if [e.mb for e in evs] == step_mbs:
                out.append((recv, "per-update"))
    elif tr.owner == "accelerate":
        for recv, evs in scheds.items():
            if recv in f.prepared and any(e.meta.get("in_accumulate") for e in evs):
                out.append((recv, "accumulate"))
    return out


def how_many(tr, recv: str) -> str:
    k = len([e for e in tr.of("sched_step") if e.target == recv])
    return f"{k}× in {tr.micro_batches} micro-batches"
