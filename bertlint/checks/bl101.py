"""BL101 optimizer-step-not-delayed: the optimizer steps on every micro-batch of a loop that accumulates.

Reads ``ctx.loops``. Accumulation evidence (one is enough): the loss is divided by an accumulation factor,
another call of the loop (``zero_grad``, ``scheduler.step``, ``scaler.update``) runs once per window, or an
``Accelerator(gradient_accumulation_steps=N)`` divides the loss in ``accelerator.backward`` while no
``accumulate()`` context delays the step. Not flagged: steps inside ``accelerator.accumulate()`` (the prepared
optimizer is a no-op off the sync step), DeepSpeed ``engine.step()`` (must run every micro-batch), Trainer and
Lightning loops (the framework steps)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


def evidence(ctx, loop):
    """Why we believe the loop accumulates: a short phrase, or None."""
    f = ctx.loops
    divs = [d for d in loop.loss_divisions() if d.seq <= max((b.seq for b in loop.backwards), default=0) or d.in_backward_arg]
    if divs:
        return f"the loss is divided by `{divs[0].divisor_text}`", divs[0].divisor
    for e in loop.of("opt_zero", "model_zero", "scaler_update"):
        for g in e.frequency_gates:
            if g.on_boundary and g.kind in ("modulo", "counter") and not _ga._logging(g.modulus_text or ""):
                return f"`{e.name}()` runs only when `{g.text}`", g.modulus
    if loop.owner == "accelerate-manual" and f.accelerator_ga is not None and f.accelerator_ga.is_more_than_one() is not False:
        a = f.accelerator_ga
        return (f"`Accelerator` is configured with {a.shown} accumulation steps, so `accelerator.backward` divides "
                f"the loss by {a.n}, but no `with accelerator.accumulate(model):` delays the step"), a.expr
    return None


@rule(
    "BL101",
    "optimizer-step-not-delayed",
    Severity.ERROR,
    "optimizer.step() / scaler.step() runs on every micro-batch of a loop that accumulates",
    fix=Applicability.UNSAFE,
)
def check(ctx) -> None:
    for loop in ctx.loops:
        if loop.owner not in _ga.PLAIN_OWNERS or not _ga.single_optimizer(loop):
            continue
        if not loop.backwards or not all(b.per_micro_batch for b in loop.backwards):
            continue
        ev = evidence(ctx, loop)
        if ev is None:
            continue
        why, _ = ev
        n = _ga.times(loop)
        for e in loop.steps:
            if not e.per_micro_batch:
                continue
            if e.kind == "opt_step" and any(s.kind == "scaler_step" for s in loop.steps):
                continue
            gate_txt = None
            for o in loop.events:
                for g in o.frequency_gates:
                    if g.on_boundary and g.kind == "modulo":
                        gate_txt = g.text
                        break
                if gate_txt:
                    break
            if gate_txt is None and loop.index is not None and loop.accum() is not None:
                gate_txt = f"({loop.index.name} + 1) % {loop.accum().text} == 0"
            fix = None
            st = _ga.stmt_of(e)
            if st is not None and gate_txt and not e.via:
                # wrap the step and the calls that belong with it right after (zero_grad, scheduler, scaler.update)
                group = [st]
                block = e.block or []
                try:
                    i = next(k for k, b in enumerate(block) if b is st)
                except StopIteration:
                    i = None
                if i is not None:
                    followers = {id(o.stmt) for o in loop.of("opt_zero", "model_zero", "scaler_update", "sched_step")
                                 if o.per_micro_batch and not o.via and _ga.stmt_of(o) is not None}
                    for nxt in block[i + 1:]:
                        if id(nxt) in followers:
                            group.append(nxt)
                        else:
                            break
                indent = ctx.indent_of(st)
                start, _ = ctx.span(group[0])
                _, end = ctx.span(group[-1])
                body = "\n".join(f"{indent}    {_ga.code_of(g.body[0]).strip()}" for g in group)
                from bertlint.types import Edit

                fix = ctx.fix(
                    f"Run `{e.name}()` only on the window's last micro-batch",
                    [Edit(f"if {gate_txt}:\n{body}", start, end)],
                    Applicability.UNSAFE,
                )
            _ga.report(
                ctx, loop,
                e.call,
                f"`{e.name}()` runs on every micro-batch although the loop accumulates gradients ({why}): each "
                f"update sees one micro-batch instead of {n} (effective batch = micro-batch, not micro-batch × {n}), "
                f"and a divided loss makes every update {n}× too small. Step (and zero the gradients) only when "
                f"`{gate_txt or '(step + 1) % N == 0'}`, or let `accelerator.accumulate(model)` do it. ({_ga.owner_note(ctx, loop)})",
                fix=fix,
                severity=_ga.sev(e),
            )
