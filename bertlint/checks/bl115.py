"""BL115 deepspeed-engine-gated: with a ``deepspeed.initialize`` engine, ``engine.step()`` must run after every
micro-batch — the engine counts micro-steps and updates only at its own boundary. Gating it behind
``(i + 1) % N == 0`` gives one update per N² micro-batches (``exp_deepspeed_ga.out``: global_steps=1 after 16).
Calling ``zero_grad`` yourself clears the gradients the engine is accumulating.

Invariant over the dry run (``bertlint.trace.engine_owns_boundary``): one ``engine.step()`` per micro-batch that
ran ``engine.backward()`` (unless the script sets the boundary itself with ``set_gradient_accumulation_boundary``),
and no hand ``zero_grad`` where the engine accumulates (its config's ``gradient_accumulation_steps`` > 1; a warning
when that value is not known here). An object with ``backward(loss)`` and ``step()`` is an engine only where the
module uses DeepSpeed or runs the object as the model: fairseq's and OpenNMT's optimizer wrappers have the same
two methods."""

from __future__ import annotations

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL115", "deepspeed-engine-gated", Severity.ERROR,
      "DeepSpeed engine.step() behind an index gate, or manual zero_grad with the engine")
def check(ctx) -> None:
    ds = _ga.fw(ctx, "deepspeed", "DeepSpeed")
    for run, v, tr in _ga.violations(ctx, "BL115", ("deepspeed",)):
        e = v.event
        if v.data.get("kind") == "gated":
            msg = (f"`{e.text}` does not run after every `engine.backward()`{_ga.when(tr)}: {v.message}. The DeepSpeed "
                   f"engine ({ds}) accumulates by itself: call `{e.opt or 'engine'}.step()` unconditionally.")
        else:
            gas = _engine_gas(ctx) if v.data.get("n_unknown") else None
            if gas == 1 and not v.data.get("between"):
                continue  # every step is a boundary: the call clears nothing the engine still needs
            if v.data.get("n_unknown") and gas is None:
                # the engine's gradient_accumulation_steps (its DeepSpeed config) is not known here: with 1 every
                # step is a boundary and the call clears nothing the engine still needs
                msg = (f"`{e.text}` with a DeepSpeed engine ({ds}){_ga.when(tr)}, when the engine accumulates "
                       f"(its config's `gradient_accumulation_steps` > 1, not known here): {v.message}. Remove the "
                       f"call.")
                _ga.treport(ctx, run, tr, e.node, msg, severity=Severity.WARNING)
                continue
            msg = (f"`{e.text}` with a DeepSpeed engine ({ds}){_ga.when(tr)}: {v.message}. Remove the call.")
        _ga.treport(ctx, run, tr, e.node, msg, severity=_ga.tsev(e))


def _engine_gas(ctx):
    """The ``gradient_accumulation_steps`` every ``deepspeed.initialize`` of the file is given, when each one's
    config is a dict the file builds and does not change and they all say the same integer; None otherwise."""
    from bertlint.analysis import configfiles as cf

    vals = set()
    for use in cf.deepspeed_uses(ctx):
        if use.framework != "engine":
            continue
        d = use.data
        g = d.get("gradient_accumulation_steps") if isinstance(d, dict) and not use.mutated else None
        if not isinstance(g, int) or isinstance(g, bool):
            return None
        vals.add(g)
    return vals.pop() if len(vals) == 1 else None
