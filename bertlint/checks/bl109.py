"""BL109 accumulate-context-misuse (loop side), accelerate:

- ``with accelerator.accumulate(model):`` while the ``Accelerator`` in the file configures no accumulation
  (no ``gradient_accumulation_steps``, no plugin): the context syncs on every micro-batch, N = 1;
- ``loss.backward()`` in a script that prepared the model with an ``Accelerator``: accelerate's ``/N``, its
  GradScaler and the DeepSpeed engine are bypassed (``exp_accelerate_ga.out`` F: gradient ×4 at N=4);
- a ``DeepSpeedPlugin`` in code with a hand-written ``(i + 1) % N`` gate and no ``accumulate()``:
  ``sync_gradients`` stays True, so the engine steps after every micro-batch and the gate is a no-op
  (``exp_accelerate_deepspeed.out``).
The accelerate-YAML side (``deepspeed_config`` in the launch config) lives in another module.

From the dry run: which ``accumulate()`` contexts it entered, which backwards it reached (and through what:
``loss.backward()`` / ``scaler.scale(loss).backward()`` against ``accelerator.backward``), and whether the step is
gated (it runs on fewer micro-batches than the backward). What the Accelerator configures (accumulation, a
DeepSpeed plugin, a launcher config) is a set-up fact of the file."""

from __future__ import annotations

import re

import libcst as cst

from bertlint.analysis.symbols import code_of
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Applicability, Severity


@rule("BL109", "accumulate-context-misuse", Severity.ERROR,
      "accelerate accumulate() misuse: no accumulation configured, loss.backward(), or a hand gate under DeepSpeed",
      fix=Applicability.UNSAFE)
def check(ctx) -> None:
    from bertlint.analysis import dryrun

    f = ctx.loops
    if not f.accelerator_calls:
        return
    accel_names = sorted({p for _s, p, r in ctx.roles.all("accelerator") if r.confident})
    accel = accel_names[0] if len(accel_names) == 1 else "accelerator"
    ds_on, ds_reason = _launcher_deepspeed(ctx)
    done: set = set()
    for run in dryrun.of(ctx):
        loop = run.loop
        traces = [t for t in run.traces if t.complete] or run.traces
        # 0. a later plain ``Accelerator()`` resets the accumulation an earlier one configured
        if f.accelerator_ga is not None and not f.accelerator_ga_unknown and f.accelerator_deepspeed is None \
                and "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in ctx.source and not ds_on \
                and any(t.sites.get("accumulate") for t in traces):
            from bertlint.analysis.versions import reaching, severity_for

            # accelerate 0.18.0 moved the factor into the shared GradientState (0.17.0 kept it on each Accelerator:
            # ``self.step % self.gradient_accumulation_steps``); checked on 0.18.0, 0.21.0 and 1.16.0
            tv = ctx.versions.accelerate
            hit = reaching(tv, lambda v: v.at_least("0.18.0"))
            resets = _resets(ctx, f, loop) if hit is not None else []
            for plain, configured, via in resets:
                if id(plain) in done:
                    continue
                done.add(id(plain))
                ga = f.accelerator_ga
                where = "" if via is None else (
                    f" (in `{via[0]}`, run by `{' '.join(code_of(via[1]).split())[:50]}` at line "
                    f"{ctx.span(via[1])[0].row})")
                _ga.treport(
                    ctx, run, traces[0], plain,
                    f"`{' '.join(code_of(plain).split())[:50]}`{where} is built after "
                    f"`{' '.join(code_of(configured).split())[:70]}` (line {ctx.span(configured)[0].row}) and before "
                    f"the training loop ends: accelerate keeps one process-wide `GradientState`, and every new "
                    f"`Accelerator` hands it its own `gradient_accumulation_steps` (default 1), so from then on "
                    f"`accumulate()` syncs and steps on every micro-batch and `accelerator.backward` divides by 1 "
                    f"(accelerate >= 0.18; {_ga.fw(ctx, 'accelerate')}: gradient_accumulation_steps "
                    f"{ga.text} -> 1; `PartialState()` does not reset it). The configured accumulation is silently "
                    f"off. Use the existing accelerator (or `PartialState()`) for process checks and printing.",
                    severity=severity_for(Severity.ERROR, hit),
                )
        # 1. accumulate() with nothing configured (the dry run entered accelerate's accumulate())
        if f.accelerator_ga is None and not f.accelerator_ga_unknown and f.accelerator_deepspeed is None \
                and "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" not in ctx.source and not ds_on:
            calls = [c for t in traces for c in t.sites.get("accumulate", [])]
            for call in calls[:1]:
                if id(call) in done:
                    continue
                done.add(id(call))
                # an accumulation factor the script names (an option, a variable, a config key) but never hands to
                # the Accelerator is a lost setting (E); with no such name anywhere the accumulate() may be a copied
                # idiom on a run meant to step every micro-batch, which N = 1 does correctly (W)
                meant = _names_accumulation(ctx.source)
                foreign = _foreign_receiver(ctx, f, call)
                if foreign is not None and ctx.versions.accelerate.below("0.18.0"):
                    continue  # (before 0.18 each Accelerator kept its own factor: the file's says nothing of this one)
                if foreign is not None:
                    # the accumulate() receiver is an Accelerator handed in; the file's own Accelerator() is another
                    # object (a progress bar's, a logger's): what it does is reset the shared setting when built
                    from bertlint.analysis.versions import severity_for

                    recv, plain, owner, site = foreign
                    head = (f"`accumulate()` runs on `{recv}`, an Accelerator this file does not build (it is handed "
                            f"in); the file's own `{' '.join(code_of(plain).split())[:50]}` (line "
                            f"{ctx.span(plain)[0].row}{', in `' + owner + '`' if owner else ''}) sets no "
                            f"accumulation, and building it resets accelerate's process-wide `GradientState` to "
                            f"gradient_accumulation_steps = 1 (accelerate >= 0.18; {_ga.fw(ctx, 'accelerate')})")
                    if site is not None:
                        msg = (head + f". `{' '.join(code_of(site[0]).split())[:50]}` builds it in `{site[1]}` "
                               f"(line {ctx.span(site[0])[0].row}), after `{recv}` was handed in, so the Accelerator "
                               f"driving this loop has N = 1 whatever it was configured with: `accumulate()` syncs "
                               f"and steps on every micro-batch and `accelerator.backward` divides by 1. Build "
                               f"helpers on `PartialState()` or hand them the existing accelerator.")
                        sev = severity_for(Severity.ERROR, ctx.versions.accelerate)
                    else:
                        msg = (head + ": when it is built after the Accelerator that drives this loop, "
                               "`accumulate()` syncs and steps on every micro-batch and `accelerator.backward` divides "
                               "by 1 (N = 1), whatever that one was configured with. Build helpers on `PartialState()` "
                               "or hand them the existing accelerator.")
                        sev = Severity.WARNING
                    _ga.treport(ctx, run, traces[0], call, msg, severity=sev)
                    continue
                _ga.treport(
                    ctx, run, traces[0], call,
                    f"`accumulate()` is used but `{' '.join(code_of(f.accelerator_calls[0]).split())[:60]}` configures no "
                    f"gradient accumulation ({_ga.fw(ctx, 'accelerate')} then syncs and steps on every micro-batch: "
                    f"N = 1)"
                    + (". " if meant else ", and nothing else in the file names an accumulation factor: if none is "
                       "meant, the context manager is a no-op here; if one is, ")
                    + ("Pass" if meant else "pass")
                    + " `Accelerator(gradient_accumulation_steps=N)` (unless `accelerate launch "
                    f"--gradient_accumulation_steps` sets it for DeepSpeed).",
                    **({} if meant else {"severity": Severity.WARNING}),
                )
        # 2. a plain loss.backward() (or scaler.scale(loss).backward()) the dry run reaches with a prepared model
        if f.prepared and f.prepared_for(loop) and _prepared_before(ctx, f, loop):
            for tr in traces:
                for bw in tr.of("backward"):
                    call = bw.node
                    if bw.via not in ("tensor", "scaler") or not isinstance(call, cst.Call) or id(call) in done:
                        continue
                    if id(call) in _own_scaled_backwards(ctx):
                        continue  # apex ``with amp.scale_loss(loss, opt) as scaled: scaled.backward()``: apex's path
                    done.add(id(call))
                    fix = None
                    arg = call.func.value if isinstance(call.func, cst.Attribute) else None
                    if bw.via == "tensor" and arg is not None and not call.args:
                        fix = ctx.fix(f"Use `{accel}.backward(...)`",
                                      [ctx.edit_replace(call, f"{accel}.backward({code_of(arg).strip()})")],
                                      Applicability.UNSAFE)
                    ga = f.accelerator_ga
                    ga_note = (f" With {ga.shown} accumulation steps the gradient is {ga.n}× too large, since "
                               f"`accelerator.backward` is what divides by N;") if ga is not None else ""
                    severe = (ga is not None and ga.is_more_than_one() is not False) or \
                        f.accelerator_deepspeed is not None or _fp16(f)
                    name = code_of(call.func).strip() if isinstance(call.func, cst.Attribute) else "backward"
                    name = "loss.backward" if bw.via == "tensor" else name
                    _ga.treport(
                        ctx, run, tr, call,
                        f"`{name}()` bypasses the `Accelerator` that prepared this model ({_ga.fw(ctx, 'accelerate')}):"
                        f"{ga_note} under fp16 its GradScaler never scales (the first unscale raises "
                        f"`AssertionError: Attempted unscale_ but _scale is None`), and under DeepSpeed the engine is "
                        f"skipped. Call `{accel}.backward(loss)`.",
                        fix=fix,
                        severity=Severity.ERROR if severe else Severity.WARNING,
                    )
        # 3. DeepSpeedPlugin + a hand gate around the step, no accumulate() (the dry run's steps skip micro-batches)
        if f.accelerator_deepspeed is not None or ds_on:
            for tr in traces:
                if tr.owner != "accelerate-manual":
                    continue
                gate = _hand_gate(tr)
                if gate is None or id(gate) in done:
                    continue
                done.add(id(gate))
                # DeepSpeed only expected (DummyOptim, a read of ``accelerator.state.deepspeed_plugin``), neither the
                # code nor a launcher config turns it on: the finding rests on how the script is launched.
                expected = f.accelerator_deepspeed is None and ds_reason.startswith("when launched with DeepSpeed")
                why = ds_reason or "`DeepSpeedPlugin`"
                _ga.treport(
                    ctx, run, tr, gate,
                    f"Hand-written accumulation gate `{code_of(gate).strip()}` under DeepSpeed ({why}) and no "
                    f"`accelerator.accumulate()` ({_ga.fw(ctx, 'accelerate')}): "
                    f"`sync_gradients` stays True, so `accelerator.backward` makes every micro-batch an accumulation "
                    f"boundary and the DeepSpeed engine updates the weights after each one; the gate only skips a "
                    f"no-op `optimizer.step()`. Wrap the body in `with accelerator.accumulate(model):` and drop the "
                    f"gate.",
                    severity=Severity.WARNING if expected else Severity.ERROR,
                )
                break


def _foreign_receiver(ctx, f, call):
    """(receiver text, the file's plain Accelerator call, the function holding it) when the receiver of
    ``accumulate()`` is bound to none of the file's ``Accelerator(...)`` calls: ``self.accelerator`` of a class that
    takes it as a parameter while another class builds its own ``self.accelerator = Accelerator()``. None when the
    receiver is (or may be) one the file builds."""
    func = call.func if isinstance(call, cst.Call) else None
    if not isinstance(func, cst.Attribute):
        return None
    from bertlint.analysis.symbols import dotted

    recv = dotted(func.value)
    if not recv:
        return None
    ancestors = ctx.index.ancestors

    def scope(node):
        return next((n for n in ancestors(node) if isinstance(n, cst.FunctionDef)), None)

    def klass(fn):
        return next((n for n in ancestors(fn) if isinstance(n, cst.ClassDef)), None) if fn is not None else None

    here = scope(call)
    built = {id(c) for c in f.accelerator_calls}
    binds = [a for a in f.t.assignments.get(recv, []) if type(a.value) is cst.Call and id(a.value) in built]
    others = [a for a in f.t.assignments.get(recv, []) if not (type(a.value) is cst.Call and id(a.value) in built)]
    if recv.startswith("self."):
        mine = klass(here)
        if mine is None or any(klass(a.func) is mine for a in binds):
            return None
        if not any(klass(a.func) is mine for a in others):
            return None  # (nothing in the receiver's class says where it comes from)
    else:
        return None  # a plain name: its binding may be any of the file's Accelerator() calls
    plains = [c for c in f.accelerator_calls if _plain_accelerator(c)]
    if not plains:
        return None
    plain = plains[0]
    fn = scope(plain)
    owner = None
    site = None
    if fn is not None:
        k = klass(fn)
        owner = f"{k.name.value}.{fn.name.value}" if k is not None else fn.name.value
        # the receiver's own class builds that object (or calls that function) in its __init__, after the
        # receiver was stored from a parameter: the handed-in Accelerator exists before, so the plain one comes after
        target = k.name.value if k is not None and fn.name.value == "__init__" else (
            fn.name.value if k is None else None)
        stores = [a for a in others if klass(a.func) is mine and a.func is not None and a.func.name.value == "__init__"]
        if target is not None and stores:
            init = stores[0].func
            for c, name, cfn in f.t.calls:
                if cfn is init and name == target and _starts_before_end(ctx, stores[0].node, c):
                    site = (c, f"{mine.name.value}.__init__")
                    break
    return recv, plain, owner, site


def _plain_accelerator(call: cst.Call) -> bool:
    """``Accelerator(...)`` that sets no accumulation of its own: no ``gradient_accumulation_steps`` /
    ``gradient_accumulation_plugin``, no ``*``/``**`` arguments, at most the three positional parameters before
    ``gradient_accumulation_steps`` (device_placement, split_batches, mixed_precision)."""
    if _configures_accumulation(call):
        return False
    if any(a.star for a in call.args):
        return False
    return sum(1 for a in call.args if a.keyword is None) <= 3


def _configures_accumulation(call: cst.Call) -> bool:
    """``Accelerator(gradient_accumulation_steps=...)`` or ``Accelerator(gradient_accumulation_plugin=...)``."""
    from bertlint.analysis.symbols import kwarg

    return kwarg(call, "gradient_accumulation_steps") is not None or \
        kwarg(call, "gradient_accumulation_plugin") is not None


def _exclusive(ctx, a, b) -> bool:
    """``a`` and ``b`` sit in different arms of one ``if``/``try`` (at most one of them runs)."""
    parent = ctx.index.parent
    up: dict = {}
    n, below = a, None
    while n is not None:
        up[id(n)] = below
        n, below = parent(n), n
    n, below = b, None
    while n is not None and id(n) not in up:
        n, below = parent(n), n
    if n is None or not isinstance(n, (cst.If, cst.Try, cst.TryStar)):
        return False
    ca = up[id(n)]  # the child of the common ancestor on the way to a
    return ca is not below and ca is not None and below is not None and (
        isinstance(n, (cst.Try, cst.TryStar)) or ca is n.orelse or below is n.orelse)


def _resets(ctx, f, loop):
    """(plain call, configured call, via) for each ``Accelerator()`` that sets no accumulation and that runs after
    the ``Accelerator`` configuring it and before ``loop`` ends: in the same function (or both at module level)
    after it, not in another arm of an ``if``; or in a same-file function, or a class's ``__init__``, that the
    configured call's scope calls (by name, or by building the class) after it and before the loop ends (``via``:
    (the function's name, that call)). Each new Accelerator hands accelerate's shared ``GradientState`` its own
    ``gradient_accumulation_steps`` (default 1): the last one built decides N (accelerate 1.16: 4 -> 1 by a
    second plain ``Accelerator()``, built before or inside the loop)."""
    scope_of = {id(c): fn for c, _n, fn in f.t.calls}
    configured = [c for c in f.accelerator_calls if _configures_accumulation(c)]
    plains = [c for c in f.accelerator_calls if _plain_accelerator(c)]
    if not configured or not plains:
        return []
    parent = ctx.index.parent
    out = []

    def restored(after) -> bool:
        # a configured Accelerator built again after the plain one (``after``: it, or the call that builds it) and
        # before the loop ends hands the shared state its N back
        return any(_starts_before_end(ctx, after, c2) and _starts_before_end(ctx, c2, loop.node) and
                   not _starts_before_end(ctx, c2, after) for c2 in configured)

    for p in plains:
        pfn = scope_of.get(id(p))
        for c in configured:
            cfn = scope_of.get(id(c))
            if id(c) not in scope_of or id(p) not in scope_of:
                continue
            if pfn is cfn:
                if _starts_before_end(ctx, c, p) and _starts_before_end(ctx, p, loop.node) and \
                        not _exclusive(ctx, c, p) and not restored(p):
                    out.append((p, c, None))
                    break
                continue
            if pfn is None:
                continue
            # the plain call's function, or the class whose __init__ holds it, called from the configured call's
            # scope after it and before the loop ends
            names = {pfn.name.value} if parent(parent(pfn)) is ctx.module or parent(pfn) is ctx.module else set()
            shown = pfn.name.value
            if pfn.name.value == "__init__":
                klass = parent(parent(pfn))  # FunctionDef -> IndentedBlock -> ClassDef
                if isinstance(klass, cst.ClassDef):
                    names = {klass.name.value}
                    shown = f"{klass.name.value}.__init__"
            if not names:
                continue
            site = None
            for call, name, fn in f.t.calls:
                if fn is cfn and name in names and call is not p and _starts_before_end(ctx, c, call) and \
                        _starts_before_end(ctx, call, loop.node) and not _exclusive(ctx, c, call):
                    site = call
                    break
            if site is not None and not restored(site):
                out.append((p, c, (shown, site)))
                break
    return out


def _prepared_before(ctx, f, loop) -> bool:
    """Some ``accelerator.prepare(...)`` can have run before the loop: one in another scope (its order is the
    callers'), one before the loop in the loop's own scope, or one inside the loop. False when every prepare is in
    the loop's scope and after it (a notebook's plain PyTorch loop in cell 14, the Accelerator version in cell 17:
    the loop trains the model before anything prepared it)."""
    seen = False
    for c, name, scope in f.t.calls:  # (the symbol table's calls, each with its enclosing function)
        if not name.endswith(".prepare") or not isinstance(c.func, cst.Attribute):
            continue
        if f.receiver_kind(name.rsplit(".", 1)[0], scope)[0] != "accelerator":
            continue  # (an Accelerator by roles from usage)
        seen = True
        if scope is not loop.func:
            return True
        if _starts_before_end(ctx, c, loop.node):
            return True  # before the loop ends: before it, or inside it
    return not seen


def _starts_before_end(ctx, node, loop) -> bool:
    """Does ``node`` start before ``loop`` ends (``span(node)[0] < span(loop)[1]``)? Decided from the tree instead
    of the positions (which regenerate the code of the enclosing top-level statement, most of a script's ``main()``):
    two nodes of one tree never overlap partially, so ``node`` starts before ``loop`` ends exactly when it is inside
    ``loop``, holds it, or comes before it in source order, i.e. when under their lowest common ancestor the child
    leading to ``node`` comes first (``walk.children`` lists children in source order; a node starting where the
    loop ends comes after it). A node the index cannot place falls back to the positions."""
    from bertlint.analysis.walk import children

    parent = ctx.index.parent
    up: dict = {}  # id(ancestor of loop, loop included) -> the child of it on the way to loop
    n, below = loop, None
    while n is not None:
        up[id(n)] = below
        n, below = parent(n), n
    if id(node) in up:
        return True  # node holds the loop (or is it)
    n = node
    while n is not None:
        p = parent(n)
        if p is None:
            break
        if id(p) in up:
            b = up[id(p)]
            if b is None:
                return True  # p is the loop: node is inside it
            kids = children(p)
            i = j = -1
            for k, x in enumerate(kids):
                if x is n:
                    i = k
                elif x is b:
                    j = k
            if i >= 0 and j >= 0:
                return i < j
            break
        n = p
    end = ctx.span(loop)[1]
    at = ctx.span(node)[0]
    return (at.row, at.column) < (end.row, end.column)


def _hand_gate(tr):
    """The condition around the optimizer step when the dry run shows it gated: the backward runs on every
    micro-batch, the step (under a condition) on fewer of them."""
    bws = [b for b in tr.of("backward") if b.certain]
    steps = tr.of("step")
    if not steps or not bws or len({b.mb for b in bws}) < tr.micro_batches:
        return None
    if len({s.mb for s in steps if s.certain}) >= tr.micro_batches:
        return None
    cond = steps[0].meta.get("cond")
    return cond if cond is not None else None


def _own_scaled_backwards(ctx) -> set:
    """ids of ``X.backward()`` calls whose ``X`` is bound by ``with <...>.scale_loss(...) as X`` around them (apex
    amp, or an optimizer wrapper with its own loss scaling): that branch scales and backpropagates through its own
    framework on purpose (the HF Trainer's ``use_apex`` path), it does not bypass the Accelerator by mistake."""
    cached = getattr(ctx, "_bl109_scaled", None)
    if cached is not None:
        return cached
    from bertlint.analysis.walk import scope_nodes as walk
    import libcst as cst

    out: set = set()
    for node in walk(ctx.module, into_scopes=True):
        if type(node) is not cst.With:
            continue
        names = set()
        for item in node.items:
            call = item.item
            if (
                isinstance(call, cst.Call)
                and isinstance(call.func, (cst.Attribute, cst.Name))
                and (call.func.attr.value if isinstance(call.func, cst.Attribute) else call.func.value) == "scale_loss"
                and item.asname is not None
                and isinstance(item.asname.name, cst.Name)
            ):
                names.add(item.asname.name.value)
        if not names:
            continue
        for inner in walk(node.body, into_scopes=False):
            if (
                type(inner) is cst.Call
                and isinstance(inner.func, cst.Attribute)
                and inner.func.attr.value == "backward"
                and isinstance(inner.func.value, cst.Name)
                and inner.func.value.value in names
            ):
                out.add(id(inner))
    try:
        ctx._bl109_scaled = out
    except AttributeError:
        pass
    return out


def _launcher_deepspeed(ctx) -> tuple[bool, str]:
    """DeepSpeed switched on by the code or by every accelerate launcher config beside the script; a launcher
    config that sets DeepSpeed accumulation also configures ``accumulate()`` (``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``)."""
    try:
        from bertlint.analysis.configfiles import deepspeed_enabled_for, launcher_accumulation_for

        on, reason = deepspeed_enabled_for(ctx)
        if on is True:
            return True, reason
        n, src = launcher_accumulation_for(ctx)
        if n is not None:
            return True, src
    except Exception:
        pass
    return False, ""


def _fp16(f) -> bool:
    """The Accelerator asks for fp16 (or its precision comes from the command line)."""
    from bertlint.analysis.symbols import kwarg, literal

    for call in f.accelerator_calls:
        mp = kwarg(call, "mixed_precision")
        if mp is None:
            continue
        v = literal(mp)
        if v == "fp16" or not isinstance(v, str):
            return True
    return False


_ACCUM_WORD = re.compile(r"accum(?!ulate\s*\()", re.IGNORECASE)


def _names_accumulation(source: str) -> bool:
    """Whether the code (comments left out) names an accumulation factor anywhere: ``--gradient_accumulation_steps``,
    ``grad_accum = 4``, ``config.accum_iter``. Only lowers a severity; never decides a finding."""
    return any(_ACCUM_WORD.search(line.split("#", 1)[0]) for line in source.splitlines())
