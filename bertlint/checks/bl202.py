"""BL202 scaler-calls-each-micro-batch: ``scaler.unscale_()`` / ``scaler.update()`` on micro-batches that do not
step. ``update()`` without a ``step()`` raises ``No inf checks were recorded prior to update`` (or, after an
unscale, changes the scale inside a window); a second ``unscale_()`` before ``update()`` raises
``unscale_() has already been called on this optimizer since the last update()`` (REFERENCE §3.2).

Invariant over the dry run (``bertlint.trace.scaler_calls_per_step``)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL202", "scaler-calls-each-micro-batch", Severity.ERROR,
      "scaler.unscale_() / scaler.update() on micro-batches that do not step", fix=Applicability.UNSAFE)
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL202", _ga.PLAIN_OWNERS):
        e = v.event
        steps = [s for s in tr.of("step") if s.via == "scaler"]
        after = [s for s in steps if tr.events.index(s) > tr.events.index(e)]
        # the step of the optimizer this call acts on (a GAN's scaler steps two optimizers)
        anchor = next((s for s in after if e.opt and s.opt == e.opt), after[0] if after else (steps[-1] if steps else None))
        if v.data.get("error") == "update skipped":
            # the skip depends on a value of the run (a gradient norm, a NaN check): a warning, with the path
            _ga.treport(ctx, run, tr, e.node,
                        f"`{e.text}` can be left without its `update()` (torch.amp GradScaler, {_ga.fw(ctx, 'torch')})"
                        f"{_ga.when(tr)}: {v.message}. Call `{v.data['update'].text}` on the skipping path too (or "
                        f"unscale only once the step is certain).", severity=Severity.WARNING)
            continue
        if v.data.get("error") == "unscale twice":
            fix = None
        elif e.kind == "update":
            fix = _ga.tmove_under(ctx, e, anchor, "Call update() right after scaler.step()")
        else:
            fix = _ga.tmove_before(ctx, e, anchor, "Unscale once per window, right before clipping / step")
        if v.data.get("error") == "mixed scaled" and anchor is not None and anchor.mb == e.mb:
            # no window involved: the unscale comes too early within one micro-batch
            msg = (f"`{e.text}` runs before another scaled backward reaches the gradients it unscaled "
                   f"(torch.amp GradScaler, {_ga.fw(ctx, 'torch')}){_ga.when(tr)}: {v.message}; `scaler.step()` "
                   f"does not unscale again, so the update mixes unscaled and scaled gradients. Unscale right "
                   f"before clipping and stepping, after the last backward that reaches these parameters.")
        else:
            msg = (f"`{e.text}` runs on micro-batches where the optimizer does not step (torch.amp GradScaler, "
                   f"{_ga.fw(ctx, 'torch')}){_ga.when(tr)}: {v.message}. Call it only inside the step gate.")
        _ga.treport(ctx, run, tr, e.node, msg, fix=fix)
