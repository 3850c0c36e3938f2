"""BL103 loss-not-scaled: a hand-written accumulation window whose N backwards use the raw loss, with no gradient
rescaling before the step: the update is the *sum* of N micro-batch gradients, N× the mean
(``exp_manual_ga_patterns.out`` P4: total weight 4.00 with N=4).

Invariant over the dry run (``bertlint.trace.window_weights``): the loss scales of one full window sum to 1. The
scale comes from data flow (the value handed to ``backward``), never from a ``/`` somewhere in the loop's text; a
factor of unknown value (``loss / num_tokens``, a loss from another module) makes the sum unknown: no finding."""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.walk import iter_nodes
from bertlint.analysis.symbols import dotted
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity


@rule("BL103", "loss-not-scaled", Severity.WARNING, "hand-written accumulation without dividing the loss by N")
def check(ctx) -> None:
    f = ctx.loops
    for run, v, tr in _ga.violations(ctx, "BL103", ("plain", "fabric", "lightning-manual")):
        if _sums_over_replicas(ctx, run.loop):
            continue
        n = _ga.n_of(tr)
        if v.data.get("kind") == "uneven":
            _ga.treport(
                ctx, run, tr, v.event.node,
                f"The micro-batches of one accumulation window are weighted unequally{_ga.when(tr)}: {v.message}. "
                f"Divide every micro-batch's loss by the window length {_ga.n_shown_t(tr)}, not by a running count. "
                f"({_ga.owner_note(ctx, run.loop)}{_ga.trace_note(tr)})",
            )
            continue
        sgd = _sgd(ctx)
        _ga.treport(
            ctx, run, tr, v.event.node,
            f"The loss is not divided by the accumulation factor {_ga.n_shown_t(tr)}{_ga.when(tr)}: {v.message}"
            + (f" (with SGD that is a learning rate {n}× too large)" if sgd else
               f" (an effective learning rate up to {n}× too large with SGD; gradient clipping thresholds are hit "
               f"{n}× sooner with Adam)")
            + f". Divide before backward: `loss = loss / {tr.n_text}`. ({_ga.owner_note(ctx, run.loop)}"
            f"{_ga.trace_note(tr)})",
        )


def _sgd(ctx) -> bool:
    """An optimizer of the file is built by an SGD constructor (roles from usage)."""
    try:
        return any(r.by_constructor and "SGD" in (r.qualname or "") for _s, _p, r in ctx.roles.all("optimizer"))
    except Exception:
        return False


def _world_size_names(ctx) -> set:
    """Names bound to the number of processes: ``int(os.getenv("WORLD_SIZE", 1))``, ``os.environ["WORLD_SIZE"]``
    (the variable torchrun / torch.distributed.launch set), ``dist.get_world_size()``, ``accelerator.num_processes``."""
    memo = ctx.__dict__.get("_bl103_ws")
    if memo is not None:
        return memo
    out = set()
    for name, assigns in ctx.symbols.assignments.items():
        for a in assigns:
            if _reads_world_size(a.value):
                out.add(name)
    ctx.__dict__["_bl103_ws"] = out
    return out


def _reads_world_size(expr) -> bool:
    for n in iter_nodes(expr):
        if isinstance(n, cst.SimpleString) and n.value.strip("\"'") == "WORLD_SIZE":
            return True
        if isinstance(n, cst.Call):
            d = dotted(n.func) or ""
            if d.endswith("get_world_size"):
                return True
        if isinstance(n, cst.Attribute) and n.attr.value == "num_processes":
            return True
    return False


def _sums_over_replicas(ctx, loop) -> bool:
    """The loop multiplies the loss by the world size before its backward (``loss *= WORLD_SIZE  # gradient averaged
    between devices in DDP mode``): DDP averages the replicas' gradients and the factor turns that average back into a
    sum over every image of the step, so the script trains on gradient sums by design (its loss is a per-image sum,
    its learning rate tuned for the nominal batch it accumulates to: ultralytics' trainers). A window's sum of N
    micro-batch gradients is then what it means, not a missing 1/N."""
    ws = _world_size_names(ctx)
    if not ws:
        return False
    node = getattr(loop, "node", None)
    if node is None:
        return False
    handed = set()  # names the loop's backwards receive (``loss.backward()``, ``scaler.scale(loss).backward()``)
    for n in iter_nodes(node):
        if isinstance(n, cst.Call) and isinstance(n.func, cst.Attribute) and n.func.attr.value in ("backward",
                                                                                                  "scale"):
            for x in iter_nodes(n):
                if isinstance(x, cst.Name):
                    handed.add(x.value)
    for n in iter_nodes(node):
        if isinstance(n, cst.AugAssign) and isinstance(n.operator, cst.MultiplyAssign):
            if (dotted(n.value) or "") in ws and (dotted(n.target) or "") in handed:
                return True
        elif isinstance(n, cst.Assign) and isinstance(n.value, cst.BinaryOperation) and \
                isinstance(n.value.operator, cst.Multiply):
            v = n.value
            if ((dotted(v.left) or "") in ws or (dotted(v.right) or "") in ws) and \
                    any((dotted(t.target) or "") in handed for t in n.targets):
                return True
    return False


