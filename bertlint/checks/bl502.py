"""BL502 eval-without-no-grad — an evaluation loop runs the model with autograd on.

Reads ``ctx.evalflow``: forwards grouped by their innermost loop; the loop must run no backward (directly or
through functions of the file), grad must be on at every forward (no ``no_grad`` / ``inference_mode`` at any
enclosing level, decorator, or visible caller), and the loop must evaluate: ``model.eval()`` before it in the same
scope, or a function named like evaluate / validate / test / predict / inference. Framework-owned methods
(Lightning ``validation_step``, Trainer subclasses) are skipped: the framework wraps them in ``no_grad``.
"""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.walk import walk, iter_nodes

from bertlint.analysis.evalflow import (ENABLED, eval_call_text, eval_reason, forward_receiver, frozen, names_in,
                                        no_grad_expr, target_names)
from bertlint.analysis.symbols import dotted, literal
from bertlint.checks._testcode import pytest_test as _pytest_test
from bertlint.registry import rule
from bertlint.types import Applicability, Edit, Position, Severity

SAVED_PER_BATCH = "4.9 MB"  # REFERENCE §3.6 / exp_memory_patterns.out E: 2-layer BERT (hidden 64), batch 8x64 tokens


def loop_accumulators(flow, loop) -> set[str]:
    """Names a loop carries across iterations: ``x += ...``, ``x = x + ...``, ``x.append(...)`` receivers."""
    out: set[str] = set()
    fresh: set[str] = set()  # assigned anew earlier in the same iteration: `x = f(x)` then only rewrites it
    for s in flow.statements(loop.body):
        if isinstance(s, cst.AugAssign):
            out.update(n for n in target_names(s.target) if n not in fresh)
        elif isinstance(s, cst.Assign):
            read = names_in(s.value)
            for t in s.targets:
                if isinstance(t.target, cst.Subscript) and isinstance(t.target.value, cst.Name):
                    out.add(t.target.value.value)  # `outputs[k] = model(...)`: stored in a container kept across
                    continue
                for n in target_names(t.target):
                    if n in read:
                        if n not in fresh:
                            out.add(n)
                    else:
                        fresh.add(n)
        elif isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute):
            if s.value.func.attr.value in ("append", "extend", "add", "update", "insert"):
                d = dotted(s.value.func.value)
                if d and "." not in d:
                    out.add(d)
    return out


_GRAD_USE = {"requires_grad_", "retain_grad", "register_hook", "attribute", "jacobian", "hessian", "vjp", "jvp",
             "hvp", "vhp", "grad"}


def _uses_gradients(flow, loop, source: str) -> bool:
    """The loop wants gradients without a visible backward: inputs made to require grad (saliency), Captum's
    ``attribute``, ``torch.autograd.functional``, hooks on tensors. ``source``: the file's text (the loop's code
    is made only when the text holds ``requires_grad = True`` / ``requires_grad=True`` at all: libcst writes a
    node's lines back as they are, less the outer indentation, so its code holds a phrase only if the text does)."""
    for c in flow.calls_in(loop):
        func = c.func
        name = func.attr.value if isinstance(func, cst.Attribute) else (func.value if isinstance(func, cst.Name)
                                                                        else "")
        if name in _GRAD_USE:
            if name == "requires_grad_" and c.args and literal(c.args[0].value) is False:
                continue
            return True
    if "requires_grad = True" not in source and "requires_grad=True" not in source:
        return False
    code = flow.module.code_for_node(loop)
    return "requires_grad = True" in code or "requires_grad=True" in code


_AUTOGRAD_IN_FORWARD = ("torch.autograd.grad", "torch.autograd.backward", "torch.enable_grad",
                        "torch.autograd.functional.jacobian", "torch.autograd.functional.vjp",
                        "torch.func.grad", "torch.func.vjp", "torch.func.jacrev")


def forward_needs_autograd(ctx, flow, receiver: str, scope) -> bool:
    """The receiver is an instance of a class of this file or of a sibling module whose ``forward`` (or a method of
    the class it calls through ``self``) takes gradients itself: ``torch.autograd.grad`` / ``torch.enable_grad()``
    (a gradient-step denoiser ``x - grad_x g(x)``, an energy model's score, a physics-informed residual). Its
    evaluation forward needs autograd: under ``no_grad`` it raises (or re-enables it), so the rule's fix would
    break the script. Read from the bindings of the name (``m = Cls(...)``, ``m, *_ = Cls.load(...)``): one of a
    class that takes gradients is enough to stay silent (bindings of unknown class are not read)."""
    memo = flow.__dict__.setdefault("_needs_autograd_memo", {})
    key = (receiver, id(scope))
    if key not in memo:
        try:
            memo[key] = _forward_needs_autograd(ctx, receiver, scope)
        except Exception:
            memo[key] = False
    return memo[key]


def _forward_needs_autograd(ctx, receiver: str, scope) -> bool:
    from bertlint.analysis import project

    sym = ctx.symbols
    values = [a.value for a in (sym.assignments_of(receiver, scope) or sym.assignments.get(receiver, []))]
    values += [call for names, call, _f in sym.unpacks if receiver in names]
    classes = []
    for v in values:
        if not isinstance(v, cst.Call):
            continue
        f = v.func
        while isinstance(f, cst.Attribute) and f.attr.value in ("to", "cuda", "eval", "float", "half"):
            f = f.value.func if isinstance(f.value, cst.Call) else f.value
        cands = [f, f.value] if isinstance(f, cst.Attribute) else [f]  # ``Cls(...)``, ``Cls.load(...)``
        for c in cands:
            name = dotted(c) if isinstance(c, (cst.Name, cst.Attribute)) else None
            if not name:
                continue
            node = sym.classes.get(name)
            info = None
            if node is None:
                try:
                    t = project.of(ctx).resolve(name)
                except Exception:
                    t = None
                if t is not None and t.kind == "class":
                    node, info = t.node, t.info
            if node is not None:
                classes.append((node, info))
                break
    return any(_class_takes_gradients(cls, info) for cls, info in classes)



def _class_takes_gradients(cls: cst.ClassDef, info) -> bool:
    methods = {f.name.value: f for f in cls.body.body if isinstance(f, cst.FunctionDef)}
    todo, seen = ["forward"], set()
    while todo:
        name = todo.pop()
        if name in seen or name not in methods:
            continue
        seen.add(name)
        for n in iter_nodes(methods[name]):
            if isinstance(n, cst.Call):
                d = dotted(n.func) or ""
                if d in _AUTOGRAD_IN_FORWARD or d.endswith(("autograd.grad", "autograd.backward", "enable_grad",
                                                            "autograd.functional.jacobian", "func.grad")):
                    return True
                f = n.func
                if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self":
                    todo.append(f.attr.value)
    return False


_COMPS = (cst.ListComp, cst.SetComp, cst.GeneratorExp, cst.DictComp)


def _comprehension_statement(flow, call):
    """The simple statement line holding a comprehension whose element (not its iterable) is ``call``'s
    expression, e.g. ``preds = [model(b) for b in loader]``; None otherwise."""
    cur, child = flow.parent.get(call), call
    comp = None
    while cur is not None:
        if isinstance(cur, _COMPS):
            if child is getattr(cur, "elt", None) or child is getattr(cur, "key", None) or \
                    child is getattr(cur, "value", None):
                comp = cur
            else:
                return None  # in the iterable / condition part
        elif isinstance(cur, cst.SimpleStatementLine):
            return cur if comp is not None else None
        elif isinstance(cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.BaseCompoundStatement,
                              cst.SimpleStatementSuite)):
            return None
        child, cur = cur, flow.parent.get(cur)
    return None


def multiline_string_inside(node: cst.CSTNode) -> bool:
    found = []

    class V(cst.CSTVisitor):
        def visit_SimpleString(self, n: cst.SimpleString) -> None:
            if "\n" in n.value:
                found.append(n)

        def visit_FormattedString(self, n: cst.FormattedString) -> None:
            if "\n" in cst.Module(body=[]).code_for_node(n):
                found.append(n)

    walk(node, V())
    return bool(found)


def wrap_in_no_grad(ctx, loop, expr: str):
    """Edits that put ``loop`` under ``with <expr>:`` (re-indenting its lines); None when not mechanical."""
    start, end = ctx.span(loop)
    lines = ctx.lines
    if start.row < 1 or end.row > len(lines):
        return None
    first = lines[start.row - 1]
    indent = first[: start.column - 1]
    if indent.strip() or multiline_string_inside(loop):
        return None
    rest = lines[end.row - 1][end.column - 1:]
    if rest.strip() and not rest.strip().startswith("#"):
        return None
    unit = ctx.module.default_indent or "    "
    if "\t" in indent and " " in unit:
        return None
    body = []
    for ln in lines[start.row - 1: end.row]:
        body.append(unit + ln if ln.strip() else ln)
    if not body[-1].endswith("\n"):
        body[-1] += "\n"
    content = f"{indent}with {expr}:\n" + "".join(body)
    return [Edit(content, Position(start.row, 1), Position(end.row + 1, 1))]


def _returned(flow, scope, seeds: set[str], loop) -> bool:
    """A value built from the loop's results (``seeds``) is returned by ``scope``."""
    if scope is None or not seeds:
        return False
    names = flow.derived(seeds, scope, after=loop)
    for r in flow.returns.get(scope, []):
        if isinstance(r, cst.Return) and r.value is not None and names_in(r.value) & names:
            return True
    return False


def _caller_backwards(flow, scope) -> bool:
    """Some caller of ``scope`` in this file back-propagates (or passes on) what the call returns: the forwards were
    made for a gradient, after all. Unknown callers (the function is also used as a callback) count as such."""
    sites = flow.call_sites(scope)
    if sites is None:
        return True
    for site in sites:
        cs = flow.scope_of(site)
        for c in flow.calls:
            if flow.scope.get(c) is cs and flow.is_backward_call(c) and flow.inside(site, c):
                return True  # compute(...).backward() / sum(compute(...)).backward()
        stmt = flow.parent.get(site)
        while stmt is not None and not isinstance(stmt, (cst.SimpleStatementLine, cst.BaseCompoundStatement)):
            stmt = flow.parent.get(stmt)
        targets: set[str] = set()
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        targets.update(target_names(t.target))
                elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                    targets.update(target_names(small.target))
                elif isinstance(small, cst.Return) and small.value is not None and flow.inside(site, small):
                    return True  # handed on to callers further up: not followed
        if not targets:
            continue
        names = flow.derived(targets, cs, after=stmt)
        if names & flow.backward_names(cs):
            return True
        if cs is not None and any(isinstance(r, cst.Return) and r.value is not None and names_in(r.value) & names
                                  for r in flow.returns.get(cs, [])):
            return True
    return False


def _external_calls(ctx, scope):
    """The calls of ``scope`` made by the other modules of the project (``project.reverse_calls``), or None."""
    if scope is None or not isinstance(scope, cst.FunctionDef):
        return None
    from bertlint.analysis.project import reverse_calls

    try:
        return reverse_calls(ctx.filename, scope.name.value)
    except Exception:
        return None


def _guarded_elsewhere(ctx, flow, scope) -> bool:
    """``scope`` has no caller in this file and every call of it found in the other modules of the project runs under
    ``no_grad`` / ``inference_mode``: grad mode is the caller's (dynamic), so its forwards run without a graph."""
    if not isinstance(scope, cst.FunctionDef) or flow.call_sites(scope) != []:
        return False
    ext = _external_calls(ctx, scope)
    return bool(ext) and all(g is True for _, _, g in ext)


def _trained_before(flow, scope, ev) -> bool:
    """Every backward / optimizer step of ``scope`` (its own calls, the training functions of this file it calls,
    an optimizer handed on) comes before the ``X.eval()`` call ``ev``, outside any loop: the function trains first
    and then evaluates (``loss.backward(); optimizer.step(); model.eval(); out = model(x)`` for a validation
    metric), so the forwards after ``ev`` feed no backward of it."""
    if flow.loop_of(ev) is not None:
        return False
    for c in flow.calls_in(scope):
        if flow.order.get(c, -1) <= flow.order[ev]:
            continue
        if flow.has_backward(c) or flow.passes_optimizer(c):
            return False
    return True


def _single_forwards(ctx, flow, scope, fwds) -> None:
    """Forwards outside any loop in a function that puts the model in eval mode first and trains nothing
    (``sample_images()``: ``G.eval()`` then ``fake = G(real)``): one report per function, at the first such forward.
    Not in a pytest test function (``_pytest_test``)."""
    if flow.framework_owned(scope) or _uses_gradients(flow, scope, ctx.source) or _pytest_test(ctx, flow, scope):
        return
    trains = flow.has_backward(scope) or flow.passes_optimizer(scope)
    for fwd in fwds:
        if flow.grad_state(fwd) != ENABLED:
            continue
        recv = flow.forward_receiver_of(fwd) or ""
        if not recv or recv == "self" or frozen(flow, recv) or forward_needs_autograd(ctx, flow, recv, scope):
            continue
        ev = flow.eval_mode_before(fwd, {recv})
        if ev is None or flow.loop_of(ev) is not None:
            continue
        if trains and not _trained_before(flow, scope, ev):
            return
        if _guarded_elsewhere(ctx, flow, scope):
            return
        if any(isinstance(r, cst.Return) and r.value is not None for r in flow.returns.get(scope, [])):
            if _caller_backwards(flow, scope):
                return  # handed to a caller that differentiates it
            if flow.call_sites(scope) == []:
                # returned to callers in other modules: reported only when one of them is seen calling it with
                # gradients on at module level; guarded or undecidable callers (or none found) leave it silent
                ext = _external_calls(ctx, scope)
                if not ext or not any(g is False for _, _, g in ext):
                    return
        fwd_text = ctx.module.code_for_node(fwd.func)
        model = flow.forward_receiver_of(fwd) or fwd_text.removesuffix(".forward")
        ctx.report(
            fwd,
            f"`{fwd_text}(...)` runs in `{scope.name.value}()` after {eval_call_text(flow, ev)} with autograd "
            + ("on, after the function's last backward and optimizer step, and nothing back-propagates it: "
               if trains else "on, and nothing in the function back-propagates: ") +
            f"the forward records its graph and keeps its "
            f"activations until the results are dropped, for a backward that never comes (torch 2.x). "
            f"`{model}.eval()` does not turn gradients off. Fix: "
            + ("run the evaluation forwards under `with torch.no_grad():` (not the whole function: it trains "
               "before them)." if trains else
               f"decorate `{scope.name.value}` with `@torch.no_grad()` (or run the forwards under "
               f"`with torch.no_grad():`)."),
            data={"model": model, "reason": f"after {eval_call_text(flow, ev)}"},
        )
        return


@rule(
    "BL502",
    "eval-without-no-grad",
    Severity.WARNING,
    "an evaluation forward runs outside torch.no_grad() / torch.inference_mode()",
    fix=Applicability.SAFE,
)
def check(ctx) -> None:
    flow = ctx.evalflow
    if not flow.torch_file:
        return
    groups: dict = {}
    single: dict = {}  # function -> forwards outside any loop
    for c in flow.calls:
        if not flow.is_forward(c):
            continue
        # the innermost iteration: a comprehension's statement, else the enclosing for / while loop
        loop = _comprehension_statement(flow, c) or flow.loop_of(c)
        if loop is None:
            sc = flow.scope_of(c)
            if sc is not None:
                single.setdefault(sc, []).append(c)
            continue
        groups.setdefault(loop, []).append(c)
    for scope, fwds in single.items():
        _single_forwards(ctx, flow, scope, fwds)
    for loop, fwds in groups.items():
        scope = flow.scope_of(loop)
        if flow.framework_owned(scope) or _pytest_test(ctx, flow, scope):
            continue  # (a test's loop of forwards checks outputs: no evaluation that wastes a run's memory)
        if any(flow.grad_state(c) != ENABLED for c in fwds):
            continue
        site = None
        if flow.has_backward(loop):
            # a shared `run_epoch(loader, train=False)`: judged per call site
            site = flow.evaluation_call(loop)
            if site is None:
                continue
        if _uses_gradients(flow, loop, ctx.source) or flow.passes_optimizer(loop) and site is None:
            continue
        receivers = {flow.forward_receiver_of(c) or "" for c in fwds}
        if any(frozen(flow, r) for r in receivers if r):
            continue
        if any(forward_needs_autograd(ctx, flow, r, scope) for r in receivers if r):
            continue
        if site is not None:
            why = (f"when called as `{ctx.module.code_for_node(site)}` at line {ctx.span(site)[0].row}, which skips "
                   f"every backward and optimizer step of the loop")
        else:
            why = eval_reason(flow, loop, receivers)
        if why is None:
            continue
        # results that flow into a backward of the same scope make this a (deferred) training loop
        bnames = flow.backward_names(scope)
        if isinstance(loop, cst.SimpleStatementLine):  # a comprehension: its statement's targets
            outer = flow.loop_of(loop)
            if outer is not None and flow.has_backward(outer):
                continue
            seeds = set()
            returned = False
            for small in loop.body:
                if isinstance(small, cst.Assign):
                    for t in small.targets:
                        seeds.update(target_names(t.target))
                elif isinstance(small, (cst.AnnAssign, cst.AugAssign)):
                    seeds.update(target_names(small.target))
                elif isinstance(small, cst.Return):
                    returned = True
            if returned and scope is not None and flow.call_sites(scope) is None:
                continue  # returned to callers we cannot see
        else:
            seeds = loop_accumulators(flow, loop)
        if bnames and site is None and flow.derived(seeds, scope, after=loop) & bnames:
            continue
        # results handed to the callers, one of which runs a backward on them (eval mode kept for dropout / BN)
        leaves = (isinstance(loop, cst.SimpleStatementLine) and returned) or _returned(flow, scope, seeds, loop)
        if leaves and _caller_backwards(flow, scope):
            continue
        if _guarded_elsewhere(ctx, flow, scope):
            continue
        fwd = fwds[0]
        fwd_text = ctx.module.code_for_node(fwd.func)
        expr = no_grad_expr(ctx.symbols)
        fix = None
        if expr is not None and site is None:
            edits = wrap_in_no_grad(ctx, loop, expr)
            if edits:
                fix = ctx.fix(f"Wrap the evaluation loop in `with {expr}:`", edits, Applicability.SAFE)
        model = flow.forward_receiver_of(fwd) or fwd_text.removesuffix(".forward")
        ctx.report(
            fwd,
            f"`{fwd_text}(...)` runs in an evaluation loop ({why}) with autograd on: every forward records its "
            f"graph and saves activations for a backward that never comes ({SAVED_PER_BATCH} per batch of 8x64 "
            f"tokens for a 2-layer BERT, 0 under no_grad; torch 2.x). `{model}.eval()` only switches dropout and "
            f"normalisation to inference behaviour, it does not turn gradients off. "
            + (f"Wrap the loop in `with torch.set_grad_enabled(<the training flag>):` so the evaluation calls run "
               f"without a graph." if site is not None else
               f"Wrap the loop in `with torch.no_grad():` (or `torch.inference_mode()`)."),
            fix=fix,
            data={"statement_row": ctx.span(loop)[0].row, "loop_row": ctx.span(loop)[0].row,
                  "model": model, "reason": why},
        )
