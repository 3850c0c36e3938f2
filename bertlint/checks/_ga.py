"""Helpers shared by the training-loop rules (BL101–BL115, BL201, BL202). Not a rule module (leading underscore).

The loop rules read the dry run (``bertlint/analysis/dryrun.py``: ``violations``, ``treport``, the ``t*`` fix
helpers) and the set-up facts of ``ctx.loops`` (what the Accelerator configures, schedule lengths and units).
None re-walks the tree.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from bertlint.analysis.loops import TrainingLoop
from bertlint.analysis.symbols import code_of, dotted
from bertlint.types import Applicability, Edit, Position, Severity

PLAIN_OWNERS = ("plain", "fabric", "accelerate-manual", "lightning-manual")


def fw(ctx, package: str, display: Optional[str] = None) -> str:
    """``accelerate 1.15.0 (installed)``: the framework and version a message assumes."""
    name = display or package
    try:
        tv = ctx.versions.get(package)
        return f"{name} {tv.text} [{tv.source}]"
    except Exception:
        return name




def delete_line_edit(ctx, stmt: cst.CSTNode) -> Edit:
    start, end = ctx.span(stmt)
    return Edit("", Position(start.row, 1), Position(end.row + 1, 1))






def sched_length(f, recv: Optional[str]):
    """(length expression, constructor call) of the scheduler bound to ``recv``, when built in this file."""
    from bertlint.analysis.symbols import call_name, kwarg, positional

    if not recv:
        return None, None
    defs = f.scheduler_defs.get(recv, [])
    if len(defs) != 1:
        return None, None
    call = defs[0]
    name = (call_name(call) or "").split(".")[-1]
    expr = None
    if name == "get_scheduler":
        expr = kwarg(call, "num_training_steps") or positional(call, 3)
    elif name.startswith("get_") and "constant" not in name:
        expr = kwarg(call, "num_training_steps") or positional(call, 2)
    elif name == "OneCycleLR":
        expr = kwarg(call, "total_steps") or kwarg(call, "steps_per_epoch")
    elif name == "CosineAnnealingLR":
        expr = kwarg(call, "T_max") or positional(call, 1)
    elif name in ("LinearLR", "PolynomialLR", "ConstantLR"):
        expr = kwarg(call, "total_iters")
    elif name == "LambdaLR":
        expr = _lambda_length(kwarg(call, "lr_lambda") or positional(call, 1))
    return expr, call


def _lambda_length(fn):
    """``LambdaLR(opt, lambda s: 1 - s / total_steps)``: the one name the step is divided by, if exactly one."""
    import libcst as cst

    from bertlint.analysis.walk import iter_nodes

    if not isinstance(fn, cst.Lambda):
        return None
    names = {
        n.right.value: n.right
        for n in iter_nodes(fn.body)
        if isinstance(n, cst.BinaryOperation) and isinstance(n.operator, cst.Divide) and isinstance(n.right, cst.Name)
    }
    return next(iter(names.values())) if len(names) == 1 else None


def _sibling_accelerator(ctx) -> str:
    """Where the Accelerator is built when a factory of a sibling module builds it (bertlint/analysis/project.py)."""
    dr = ctx.__dict__.get("_dryrun")
    hit = dr.__dict__.get("_sibling_acc") if dr is not None else None
    if not hit:
        return ""
    from bertlint.analysis.project import where

    at = where(hit[3], hit[2])
    return f"; the Accelerator is built in {at}" if at else ""


def owner_note(ctx, loop: TrainingLoop) -> str:
    """Who owns accumulation in this loop and the version assumed, for messages."""
    owner = loop.owner
    kind = getattr(loop, "kind", None)
    if kind == "ignite":
        return f"ignite `Engine({loop.func.name.value})` calls it once per iteration, {fw(ctx, 'torch')}"
    if kind == "method":
        return (f"`{loop.func.name.value}()` keeps its own micro-batch counter: it is called once per micro-batch, "
                f"{fw(ctx, 'torch')}")
    if kind == "step_fn":
        return (f"`{loop.func.name.value}()` backpropagates and steps, and no loop of this file calls it: its driver "
                f"calls it once per micro-batch, {fw(ctx, 'torch')}")
    if owner == "fabric":
        return f"Fabric loop, {fw(ctx, 'lightning')}"
    if owner == "accelerate-manual":
        return f"accelerate loop without accumulate(), {fw(ctx, 'accelerate')}{_sibling_accelerator(ctx)}"
    if owner == "accelerate":
        return f"accelerate accumulate(), {fw(ctx, 'accelerate')}{_sibling_accelerator(ctx)}"
    if owner == "deepspeed":
        return f"DeepSpeed engine, {fw(ctx, 'deepspeed')}"
    if owner == "lightning-manual":
        return f"Lightning manual optimization, {fw(ctx, 'lightning')}"
    return f"hand-written PyTorch loop, {fw(ctx, 'torch')}"


# ---------------------------------------------------------------------------------------------- trace-based rules
# The window rules read the dry run (bertlint/analysis/dryrun.py) and the invariants of bertlint/trace.py.


def violations(ctx, code: str, owners: Optional[tuple] = None):
    """(run, violation, trace) of one rule over every training loop, one per reported line."""
    from bertlint.analysis import dryrun

    seen = set()
    for run in dryrun.of(ctx):
        for v, tr in run.violations(code, owners):
            xsite = v.event.meta.get("xsite") if isinstance(getattr(v.event, "meta", None), dict) else None
            line = v.event.line if xsite is None else ("site", ctx.span(xsite)[0].row)
            if (code, line) in seen:
                continue
            seen.add((code, line))
            if tr.config:
                tr = _with_needed_config(run, code, owners, v, tr)
            ctx.__dict__["_ga_xsite"] = (v.event.node, xsite) if xsite is not None else None
            yield run, v, tr
        ctx.__dict__["_ga_xsite"] = None


def _with_needed_config(run, code: str, owners: Optional[tuple], v, tr):
    """A shallow copy of ``tr`` whose ``when_config`` holds only the conditions the finding depends on: the trace's
    configuration is that of whichever run reported first, and a condition that does not change whether the same
    violation occurs is no part of "when". Greedy: a condition is dropped when every configuration (same N run)
    agreeing with ``tr`` on the remaining ones shows the violation; a configuration that did not split on a
    condition agrees with either value, and an incomplete run or one of another owner counts as not showing it
    (both keep more conditions named, never fewer); a configuration whose run raises (``else: raise ValueError``)
    is not one the script runs and does not count. The same violation in every configuration: nothing named."""
    import copy

    from bertlint import trace as T
    from bertlint.analysis.dryrun import PER_LOOP

    cache = run.__dict__.setdefault("_ga_checks", {})
    key = (code, owners)
    if key not in cache:
        cache[key] = [(t, list(T.check(t, code)) if t.complete and (owners is None or t.owner in owners) else [])
                      for t in run.traces]
    group = [(t, vs) for t, vs in cache[key] if t.n_source == tr.n_source]
    occurs = []
    for t, vs in group:
        if t is not tr and not vs and t.raised:
            continue  # a configuration that stops the script (its arm raises) says nothing of "when"
        hit = False
        for w in vs:
            if code in PER_LOOP:
                hit = True
                break
            run.dr_fill(w, t)
            if w.event.line == v.event.line:
                hit = True
                break
        occurs.append((t.config, hit))
    need = dict(tr.config)
    for k in list(need):
        trial = {kk: vv for kk, vv in need.items() if kk != k}
        if all(hit for cfg, hit in occurs if all(cfg.get(kk, vv) == vv for kk, vv in trial.items())):
            need = trial
    out = copy.copy(tr)
    out.when_config = need
    return out


def tsev(ev, default: Severity = Severity.ERROR) -> Severity:
    """Receivers recognised only by their name lower an error to a warning."""
    if default == Severity.ERROR and not ev.meta.get("confident", True):
        return Severity.WARNING
    return default


def when(tr) -> str:
    """`` (when `args.fp16` is set)`` — the configuration the finding needs, or ''. Only the conditions the
    finding depends on (``when_config``, set by ``violations``), not every condition of the reporting run."""
    cfg = getattr(tr, "when_config", None)
    if cfg is None:
        t = tr.config_text()
    else:
        from bertlint import trace as T

        t = T.Trace(config=cfg).config_text()
    if tr.n_source == "N = 1":
        t = (t + " and " if t else "when ") + f"`{tr.n_text}` is 1"
    return f" ({t})" if t else ""


def n_of(tr) -> str:
    """``8`` / ``N`` (a representative value is not shown as the script's)."""
    if tr.n is not None and tr.n_source == "resolved":
        return str(tr.n)
    return "N"


def n_shown_t(tr) -> str:
    if tr.n is not None and tr.n_source == "resolved" and tr.n_text != str(tr.n):
        return f"`{tr.n_text}` (= {tr.n})"
    return f"`{tr.n_text}`"


def trace_note(tr) -> str:
    """How the dry run was made: ``dry run with N = 4 (a representative value for `args.ga`)``."""
    drv = getattr(tr, "driver", "")
    if drv:
        drv = f"; dry run with {drv}"
    if tr.n is None:
        return drv
    if drv:
        return drv + (f", N = {tr.n} standing for `{tr.n_text}`" if tr.n_source == "representative" else "")
    if tr.n_source == "representative":
        return f"; dry run with N = {tr.n} standing for `{tr.n_text}`"
    if tr.n_source == "other":
        return f"; dry run with N = {tr.n}: `{tr.n_text}` is a default the script is launched with other values of"
    return ""


def tstmt(ev) -> Optional[cst.SimpleStatementLine]:
    s = ev.meta.get("stmt")
    if isinstance(s, cst.SimpleStatementLine) and len(s.body) == 1 and not ev.meta.get("depth"):
        return s
    return None


def _sole_statement(ev, s) -> bool:
    """``s`` is the only statement of its block (``if ...: optimizer.zero_grad()``): moving it away would leave an
    empty block, which does not parse."""
    blk = ev.meta.get("block")
    return isinstance(blk, list) and len(blk) == 1 and blk[0] is s


def tmove_under(ctx, ev, anchor, msg: str):
    """Unsafe fix: move ``ev``'s statement to just after ``anchor``'s (inside the step gate)."""
    s, a = tstmt(ev), tstmt(anchor) if anchor is not None else None
    if s is None or a is None or s is a or _sole_statement(ev, s):
        return None
    try:
        text = code_of(s.body[0]).strip()
        ins = ctx.edit_insert_line_after(a, text)
        dele = delete_line_edit(ctx, s)
        if ins.start.row == dele.start.row:
            return None
        return ctx.fix(msg, [dele, ins], Applicability.UNSAFE)
    except Exception:
        return None


def tmove_before(ctx, ev, anchor, msg: str):
    s, a = tstmt(ev), tstmt(anchor) if anchor is not None else None
    if s is None or a is None or s is a or _sole_statement(ev, s):
        return None
    try:
        text = code_of(s.body[0]).strip()
        ins = ctx.edit_insert_line_before(a, text)
        dele = delete_line_edit(ctx, s)
        return ctx.fix(msg, [dele, ins], Applicability.UNSAFE)
    except Exception:
        return None


def treport(ctx, run, tr, node, message: str, **kw):
    """``ctx.report`` with the trace facts the verifier and ``explain`` use in ``data``."""
    data = dict(kw.pop("data", None) or {})
    try:
        data.setdefault("n", tr.n if tr.n_source == "resolved" else None)
        data.setdefault("n_text", tr.n_text)
        data.setdefault("owner", run.loop.owner)
        data.setdefault("loop_row", ctx.span(run.loop.node)[0].row)
        if tr.config:
            data.setdefault("config", dict(tr.config))
    except Exception:
        pass
    acc = getattr(run, "factor", None)
    code = ctx.current.code if getattr(ctx, "current", None) is not None else ""
    if acc is not None and getattr(acc, "by_name", False) and tr.n is not None and tr.n > 1 and code and \
            not run.by_usage(code, node):
        # N rests on a name alone (no step gate, window or framework setting uses it): a hint, one severity lower
        from bertlint.types import Severity

        # one step lower; unless something already lowered it below the rule's own (a receiver known by its name
        # only, ``tsev``): names are one hint, not two
        base = Severity(ctx.current.severity)
        sev = Severity(kw.get("severity") or base)
        rank = {Severity.ERROR: 0, Severity.WARNING: 1, Severity.INFO: 2}
        if rank[sev] <= rank[base]:
            kw["severity"] = {Severity.ERROR: Severity.WARNING, Severity.WARNING: Severity.INFO}.get(sev, sev)
        message = message.rstrip() + (f" (`{acc.text}` is taken for the accumulation factor by its name alone: no "
                                      "step gate, window loop or framework setting the dry run follows uses it.)")
    if tr.n_source == "other":
        # seen only with another value than the default the script carries: right as launched by default, wrong
        # when launched with other values - a warning, never an error, on a value we do not know it runs with
        from bertlint.types import Severity

        sev = kw.get("severity") or (ctx.current.severity if getattr(ctx, "current", None) is not None else None)
        if sev is not None and Severity(sev) is Severity.ERROR:
            kw["severity"] = Severity.WARNING
    xs = ctx.__dict__.get("_ga_xsite")
    if xs is not None and xs[0] is node:
        # a sibling helper's event reached from another call of this file than the one first seen (two loops
        # inlining the same helper): anchored at this run's own call
        hit = (ctx.__dict__.get("foreign_sites") or {}).get(id(node))
        if hit is not None and hit[0] is node and hit[1] is not xs[1]:
            from bertlint.analysis.project import where as _where

            where = _where(node, hit[2])
            if where and where not in message:
                message = f"{message.rstrip()} (in {where}, reached from the call on this line)"
            kw.pop("fix", None)
            return ctx.report(xs[1], message, data=data, **kw)
    return ctx.report(node, message, data=data, **kw)
