"""BL101 optimizer-step-not-delayed: the optimizer steps on every micro-batch of a loop that accumulates.

Invariant over the dry run (``bertlint.trace.steps_delayed``): when a backward's loss carries 1/N with N > 1 (the
script divides by N, or ``accelerator.backward`` divides by the Accelerator's N), the optimizer's effective steps
come once per N backwards, not after each one. Not flagged: steps inside ``accelerator.accumulate()`` (the
prepared optimizer is a no-op off the sync step: the trace shows no effective step there), DeepSpeed
``engine.step()`` (it owns the boundary), Trainer and Lightning loops (the framework steps)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Edit, Severity


def _gate_text(run, tr) -> str:
    loop = run.loop
    if loop.index is not None:
        start = loop.index.start
        idx = loop.index.name if start == 1 else f"{loop.index.name} + 1"
        gate = f"({idx}) % {tr.n_text} == 0" if start != 1 else f"{idx} % {tr.n_text} == 0"
        if tr.loader == "loader" and tr.loader_text and start in (0, 1):
            gate += f" or {idx} == len({tr.loader_text})"  # the epoch's last partial window is stepped too (BL107)
        return gate
    return ""


def _fix(ctx, run, tr, step):
    st = _ga.tstmt(step)
    gate = _gate_text(run, tr)
    if st is None or not gate:
        return None
    block = step.meta.get("block") or []
    try:
        i = next(k for k, b in enumerate(block) if b is st)
    except StopIteration:
        return None
    followers = {id(e.meta.get("stmt")) for e in tr.events
                 if e.kind in ("zero_grad", "update", "sched_step") and e.mb == step.mb and _ga.tstmt(e) is not None}
    group = [st]
    for nxt in block[i + 1:]:
        if id(nxt) in followers:
            group.append(nxt)
        else:
            break
    indent = ctx.indent_of(st)
    start, _ = ctx.span(group[0])
    _, end = ctx.span(group[-1])
    body = "\n".join(f"{indent}    {_ga.code_of(g.body[0]).strip()}" for g in group)
    return ctx.fix(f"Run `{step.text}` only on the window's last micro-batch", [Edit(f"if {gate}:\n{body}", start, end)],
                   Applicability.UNSAFE)


@rule(
    "BL101",
    "optimizer-step-not-delayed",
    Severity.ERROR,
    "optimizer.step() / scaler.step() runs on every micro-batch of a loop that accumulates",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL101", _ga.PLAIN_OWNERS):
        step = v.event
        if step.via == "engine":
            continue
        n = _ga.n_of(tr)
        gate = _gate_text(run, tr) or "(step + 1) % N == 0"
        _ga.treport(
            ctx, run, tr, step.node,
            f"`{step.text}` runs on every micro-batch although the loop accumulates gradients{_ga.when(tr)}: "
            f"{v.message}. Each update sees one micro-batch instead of {n} (effective batch = micro-batch, not "
            f"micro-batch × {n}), and every update is {n}× too small. Step (and zero the gradients) only when "
            f"`{gate}`, or let `accelerator.accumulate(model)` do it. ({_ga.owner_note(ctx, run.loop)}"
            f"{_ga.trace_note(tr)})",
            fix=_fix(ctx, run, tr, step),
            severity=_ga.tsev(step),
        )
