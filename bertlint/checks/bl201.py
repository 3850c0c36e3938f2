"""BL201 clip-scaled-gradients: ``clip_grad_norm_`` / ``clip_grad_value_`` between
``scaler.scale(loss).backward()`` and ``scaler.step(optimizer)`` with no ``scaler.unscale_(optimizer)`` first:
the clip sees gradients multiplied by the loss scale (65 536 at start), so clipping to 1.0 shrinks the true
gradient ~65 536× and training stalls (``exp_gradscaler.out`` [4])."""

from __future__ import annotations

from bertlint.analysis.symbols import code_of, kwarg, literal
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL201", "clip-scaled-gradients", Severity.ERROR,
      "clipping scaled gradients: no scaler.unscale_() before clip_grad_norm_", fix=Applicability.SAFE)
def check(ctx) -> None:
    f = ctx.loops
    for loop in f:
        if not any(b.backward_style == "scaler" for b in loop.backwards):
            continue
        ssteps = loop.of("scaler_step")
        if not ssteps:
            continue
        scaler = ssteps[0].receiver
        defs = f.scaler_defs.get(scaler or "", [])
        if defs and all(literal(kwarg(c, "enabled")) is False for c in defs):
            continue
        first_bw = min(b.seq for b in loop.backwards if b.backward_style == "scaler")
        for clip in loop.of("clip"):
            if clip.receiver_kind == "accelerator" or clip.receiver in ("self", "fabric"):
                continue
            if clip.seq < first_bw or not any(s.seq > clip.seq for s in ssteps):
                continue
            if any(u.seq < clip.seq for u in loop.of("scaler_unscale")):
                continue
            step = next(s for s in ssteps if s.seq > clip.seq)
            opt = code_of(step.arg).strip() if step.arg is not None else "optimizer"
            fix = None
            st = _ga.stmt_of(clip)
            same_freq = [g.text for g in clip.frequency_gates] == [g.text for g in step.frequency_gates]
            if st is not None and not clip.via and same_freq:
                fix = ctx.fix(f"Insert `{scaler}.unscale_({opt})` before clipping",
                              [ctx.edit_insert_line_before(st, f"{scaler}.unscale_({opt})")], Applicability.SAFE)
            _ga.report(
                ctx, loop,
                clip.call,
                f"`{clip.name}()` clips the *scaled* gradients: `{scaler}.scale(loss).backward()` multiplied them by "
                f"the loss scale (65 536 at the start, torch.amp in {_ga.fw(ctx, 'torch')}), so a threshold of 1.0 shrinks the true gradient "
                f"by about that factor whenever it clips and training stalls. Call `{scaler}.unscale_({opt})` right "
                f"before clipping (once per optimizer step).",
                fix=fix,
            )
