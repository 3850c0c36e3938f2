"""BL201 clip-scaled-gradients: ``clip_grad_norm_`` / ``clip_grad_value_`` after ``scaler.scale(loss).backward()``
and before ``scaler.step(optimizer)`` with no ``scaler.unscale_(optimizer)`` in between: the clip sees gradients
multiplied by the loss scale (65 536 at start), so clipping to 1.0 shrinks the true gradient ~65 536× and training
stalls (``exp_gradscaler.out`` [4]).

Invariant over the dry run (``bertlint.trace.unscale_before_clip``): one ``unscale_`` per step, before any clip.
``accelerator.clip_grad_norm_`` and Lightning's / Fabric's ``clip_gradients`` unscale themselves."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL201", "clip-scaled-gradients", Severity.ERROR,
      "clipping scaled gradients: no scaler.unscale_() before clip_grad_norm_", fix=Applicability.SAFE)
def check(ctx) -> None:
    _hook_clipping(ctx)
    reported: set = set()
    for run, v, tr in _ga.violations(ctx, "BL201"):
        clip = v.event
        step = next((s for s in tr.of("step") if s.via == "scaler" and s.mb >= clip.mb
                     and tr.events.index(s) > tr.events.index(clip)), None)
        if step is None:
            continue
        # one missing unscale_ is one mistake: several clips before the same scaler step (in one configuration or
        # in several: `if clip_value: ...` then `if clip_norm: ...`) get one finding, at the first
        key = (id(run), step.line)
        if key in reported:
            continue
        reported.add(key)
        scaler = step.target or "scaler"
        opt = step.opt or "optimizer"
        fix = None
        st = _ga.tstmt(clip)
        if st is not None and clip.cond_text == step.cond_text and not tr.config:
            fix = ctx.fix(f"Insert `{scaler}.unscale_({opt})` before clipping",
                          [ctx.edit_insert_line_before(st, f"{scaler}.unscale_({opt})")], Applicability.SAFE)
        if getattr(run.loop, "kind", None) == "scaler_fn":
            # the backward is the caller's: it went through the scaler handed in (its step() needs scaled
            # gradients), unless the caller unscaled before the call — not seen from here: a warning
            fn = run.loop.func.name.value
            _ga.treport(
                ctx, run, tr, clip.node,
                f"`{clip.text.split('(')[0]}()` clips the *scaled* gradients{_ga.when(tr)}: `{fn}()` is handed "
                f"`{scaler}` and steps through it (`{step.text}`), so the gradients it updates come from the caller's "
                f"`{scaler}.scale(loss).backward()`; nothing calls `{scaler}.unscale_({opt})` before the clip → the "
                f"clip sees gradients × the loss scale (65 536 at the start; torch.amp in {_ga.fw(ctx, 'torch')}), "
                f"so a threshold of 1.0 shrinks the true gradient by about that factor whenever it clips. Call "
                f"`{scaler}.unscale_({opt})` in `{fn}()` before clipping (once per optimizer step).",
                severity=Severity.WARNING,
            )
            continue
        _ga.treport(
            ctx, run, tr, clip.node,
            f"`{clip.text.split('(')[0]}()` clips the *scaled* gradients{_ga.when(tr)}: {v.message} (torch.amp in "
            f"{_ga.fw(ctx, 'torch')}), so a threshold of 1.0 shrinks the true gradient by about that factor whenever "
            f"it clips and training stalls. Call `{scaler}.unscale_({opt})` right before clipping (once per "
            f"optimizer step).",
            fix=fix,
            severity=_ga.tsev(clip),  # a clipper known by its name only (``self.clip_grad_fun(parameters=...)``)
        )


def _hook_clipping(ctx) -> None:
    """Clipping hooks on the parameters (``p.register_hook(lambda g: g.clamp(-c, c))``) with a GradScaler: the
    hooks run inside the scaled backward, before any ``unscale_`` can (``bertlint/checks/_hookclip.py``)."""
    if "GradScaler" not in ctx.source:
        return
    from bertlint.checks import _hookclip as hc

    sc = hc.torch_scaler(ctx)
    if sc is None:
        return
    scaler_call, scaler = sc
    w = hc.module_walk(ctx)
    for node, text, where in hc.installing_calls(ctx):
        cond = hc.conditional(node, w.parents) or hc.conditional(scaler_call, w.parents)
        inst = f"`{text.split('(')[0]}(...)`" + (f" (which registers them: {where})" if where else "")
        ctx.report(
            node,
            f"{inst} clips gradients through tensor hooks on the parameters, and this file trains with "
            f"`{scaler}` (a GradScaler, line {ctx.span(scaler_call)[0].row}){' when both are enabled' if cond else ''}"
            f": a parameter hook runs inside `backward()`, when autograd computes that parameter's gradient, so "
            f"under `{scaler}.scale(loss).backward()` it sees the gradient × the loss scale (65 536 at the start; "
            f"torch.amp in {_ga.fw(ctx, 'torch')}) and no `{scaler}.unscale_()` can come before it: a clamp at ±c "
            f"bounds the true gradient at ±c / scale, so clipping is far stronger than asked and training stalls "
            f"whenever it bites. Clip after `{scaler}.unscale_(optimizer)` (`torch.nn.utils.clip_grad_value_`) "
            f"instead of through hooks when the scaler is on.",
            severity=Severity.WARNING if cond else None,
        )
