"""BL114 ddp-accumulation-sync: DDP with hand-written accumulation.

Invariant over the dry run (``bertlint.trace.ddp_sync``): one all-reduce per update — the forwards and backwards
of a window's first N-1 micro-batches run with gradient sync off, the last one's with sync on. DDP decides whether
to all-reduce at *forward* time (``exp_ddp_no_sync.out``), so the trace records, for each backward, whether the
forward that produced its loss ran under ``no_sync()`` / ``require_backward_grad_sync = False``.

- E: the window's last forward runs with sync off — no micro-batch synchronises before the step and the replicas
  silently diverge (0 all-reduces, ranks differ).
- W: only the backward is inside ``no_sync()`` (no saving), or DDP accumulation with sync on for every micro-batch
  (N all-reduces per optimizer step)."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL114", "ddp-accumulation-sync", Severity.WARNING,
      "DDP accumulation without no_sync(), or forward inside no_sync() and backward outside")
def check(ctx) -> None:
    for run, v, tr in _ga.violations(ctx, "BL114", ("plain", "accelerate-manual")):
        kind = v.data.get("kind")
        e = v.event
        if kind == "unsynced":
            msg = (f"Gradient sync is off for the window's last forward{_ga.when(tr)}: {v.message} (torch DDP decides "
                   f"whether to all-reduce at forward time). Run the last micro-batch's forward and backward with "
                   f"sync on, the others' both inside `no_sync()`.")
            where = e.meta.get("fwd_ctx")
            _ga.treport(ctx, run, tr, where if where is not None else e.node, msg, severity=Severity.ERROR)
        elif kind == "backward-only":
            msg = (f"Only the backward is inside `no_sync()`{_ga.when(tr)}: {v.message}. Put the forward inside the "
                   f"`no_sync()` block too.")
            _ga.treport(ctx, run, tr, e.node, msg)
        else:
            ddp_when = getattr(tr, "ddp_when", "")
            wrapped = f" ({ddp_when})" if ddp_when else ""
            ctx_fn = "accelerator.no_sync(model)" if "accelerator.prepare" in ddp_when else "model.no_sync()"
            if ddp_when.startswith("when the model is"):  # the model may be DDP: the condition leads
                lead = f"{ddp_when[0].upper()}{ddp_when[1:]}, gradients accumulated over"
            else:
                lead = f"The model is wrapped in `DistributedDataParallel`{wrapped} and gradients are accumulated over"
            msg = (f"{lead} {_ga.n_shown_t(tr)} micro-batches, but every backward all-reduces{_ga.when(tr)}: "
                   f"{v.message} "
                   f"({_ga.fw(ctx, 'torch')}: DDP all-reduces in every backward whose forward ran with sync on). "
                   f"Wrap the forward and backward of all but the window's last micro-batch in "
                   f"`with {ctx_fn}:`.")
            # where the forward and the backward meet: the backward, or the loop's call of a helper that was handed
            # the loss (``backward(loss, scaler)``)
            node = e.meta.get("site") if e.meta.get("depth") and not e.meta.get("fwd_here") else None
            _ga.treport(ctx, run, tr, node or e.node, msg)
