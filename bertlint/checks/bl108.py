"""BL108 misplaced-step-gate: the optimizer steps on the wrong micro-batches.

- an inverted gate (``% N != 0`` or the else branch): steps on N-1 of every N micro-batches;
- the step nested under a second modulo gate (logging / eval frequency): steps every lcm(N, M);
- a gate modulus different from the N the loss is divided by;
- a hand gate inside ``accelerator.accumulate()``: two gates must both hold — ``i % N == 0`` never coincides
  with a sync step (zero updates, ever) and ``(i + 1) % N == 0`` loses the end-of-epoch window
  (REFERENCE §2.2 C/D)."""

from __future__ import annotations

import math

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL108", "misplaced-step-gate", Severity.ERROR, "the optimizer step runs on the wrong micro-batches")
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        owner = loop.owner
        if owner == "accelerate":
            _accumulate(ctx, f, loop)
            continue
        if owner not in _ga.PLAIN_OWNERS:
            continue
        if not loop.backwards or not all(b.per_micro_batch for b in loop.backwards):
            continue
        if not _ga.single_optimizer(loop):
            continue
        reported = set()
        for e in loop.steps:
            if e.kind == "opt_step" and any(s.kind == "scaler_step" for s in loop.steps):
                continue
            mods = [g for g in e.frequency_gates if g.kind == "modulo"]
            if not mods:
                continue
            if e.inverse and any(not g.on_boundary for g in mods):
                g = next(g for g in mods if not g.on_boundary)
                if not _ga.accum_gate(ctx, loop, g):
                    continue
                _ga.report(
                ctx, loop,
                    e.call,
                    f"`{e.name}()` runs only when `{g.text}` is {'false' if g.eq_zero else 'true'}, i.e. on the "
                    f"micro-batches that are NOT the last of a window: it steps {_n(ctx, loop, g)} - 1 times per window "
                    f"on partial gradients and never after the window's last micro-batch. Invert the condition: "
                    f"step when `({g.index_text} + 1) % {g.modulus_text} == 0`.",
                    severity=_ga.sev(e),
                )
                reported.add(id(e))
                continue
            texts = {g.modulus_text for g in mods}
            if len(texts) >= 2:
                a, b = mods[0], mods[1]
                va = ctx.loops.int_value(a.modulus, loop.func)
                vb = ctx.loops.int_value(b.modulus, loop.func)
                lcm = str(va * vb // math.gcd(va, vb)) if va and vb else f"lcm({a.modulus_text}, {b.modulus_text})"
                _ga.report(
                ctx, loop,
                    e.call,
                    f"`{e.name}()` is nested under two frequency gates (`{a.text}` and `{b.text}`): it runs only "
                    f"every {lcm} micro-batches, and the gradients of the skipped windows keep accumulating into the "
                    f"next update. Keep only the accumulation gate around the step; put logging under its own `if`.",
                    severity=_ga.sev(e),
                )
                continue
            g = mods[0]
            if not g.on_boundary:
                continue
            divs = loop.loss_divisions()
            mv = ctx.loops.int_value(g.modulus, loop.func)
            for d in divs:
                dv = ctx.loops.int_value(d.divisor, loop.func)
                log_gate = g.modulus_text and _ga._logging(g.modulus_text)
                if (mv and dv and mv != dv and mv > 1 and dv > 1) or (log_gate and d.divisor_text != g.modulus_text):
                    _ga.report(
                ctx, loop,
                        e.call,
                        f"The step gate `{g.text}` uses modulus `{g.modulus_text}`"
                        f"{' (= ' + str(mv) + ')' if mv else ''}, but the loss is divided by `{d.divisor_text}`"
                        f"{' (= ' + str(dv) + ')' if dv else ''}: windows and loss scaling disagree, so each update "
                        f"sums the wrong number of micro-batches. Gate the step on the accumulation factor.",
                        severity=_ga.sev(e),
                    )
                    break


def _n(ctx, loop, g) -> str:
    v = ctx.loops.int_value(g.modulus, loop.func)
    return str(v) if v else "N"


def _accumulate(ctx, f, loop) -> None:
    ga = f.accelerator_ga
    if ga is None and not f.accelerator_ga_unknown and f.accelerator_deepspeed is None:
        return  # no accumulation configured: BL109
    if ga is not None and ga.is_more_than_one() is False:
        return
    seen = set()
    for e in loop.of("opt_step", "opt_zero", "sched_step", "scaler_step"):
        if not e.in_accumulate:
            continue
        for g in e.frequency_gates:
            if g.kind not in ("modulo", "counter") or id(g.node) in seen:
                continue
            if g.modulus_text and _ga._logging(g.modulus_text):
                continue
            seen.add(id(g.node))
            start = loop.index_start_at(g)
            fatal = g.kind == "modulo" and g.eq_zero and not g.negated and start == 0
            what = (
                "it fires on micro-batches 0, N, 2N, … which are never accelerate's sync steps, so the prepared "
                "optimizer's `step()`/`zero_grad()` are no-ops there: no update ever happens and gradients grow "
                "without bound"
                if fatal
                else "both it and accelerate's sync must hold: at the end of each epoch accelerate syncs on the last "
                "(partial) window but the hand gate does not, so that window's update is lost and its gradients leak "
                "into the next epoch (one optimizer step lost per epoch)"
            )
            _ga.report(
                ctx, loop,
                g.node,
                f"Hand-written gate `{g.text}` inside `accelerator.accumulate()` ({_ga.fw(ctx, 'accelerate')}): {what}. "
                f"Call `optimizer.step()`, `scheduler.step()` and `optimizer.zero_grad()` unconditionally inside "
                f"`accumulate()`; use `if accelerator.sync_gradients:` for clipping and logging.",
            )
