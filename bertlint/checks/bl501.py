"""BL501 graph-kept-across-iterations — a graph-carrying tensor is accumulated across loop iterations.

Reads ``ctx.evalflow``. For each loop, the names of its body are followed in source order (``graph_env``): a name
carries a graph when it comes from a model forward or a loss with grad on, through attributes, indexing, arithmetic
and graph-keeping tensor methods; ``.item()``, ``.detach()``, ``float()``, ``.tolist()``, ``argmax`` and comparisons
end it. An accumulation (``acc += x``, ``acc = acc + x``, ``acc = torch.cat([acc, x])``, ``acc.append(x)``,
``acc.extend(x)``) of such a value into a name that lives across iterations is reported, unless:

* the accumulation runs under ``no_grad`` / ``inference_mode`` (any level, decorator, visible caller);
* the accumulator (or a value computed from it) is backward-ed in the same scope — deferred backward, BL113's;
* the accumulator is re-initialised or cleared inside the loop (a bounded window);
* the loop neither trains nor evaluates and its scope runs a backward somewhere (intent unclear), or the
  accumulator leaves the function (``return``) from a loop that does not evaluate.

Severity: E in an evaluation loop (no backward, ``model.eval()`` before it or an evaluate-like function): every
batch's saved activations stay alive; W in a training loop (backward frees the saved buffers; the graph nodes and
the tensors stay chained) and in other loops.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from bertlint.analysis.evalflow import (ENABLED, eval_reason, final, forward_receiver, frozen, names_in,
                                        target_names)
from bertlint.analysis.symbols import dotted
from bertlint.checks._testcode import pytest_test
from bertlint.registry import rule
from bertlint.types import Applicability, Severity

EVAL_BYTES = "18.4 MB"  # exp_memory_patterns.out C: 4 batches of 8x64 tokens, 2-layer BERT (hidden 64), vs 0 under no_grad
TRAIN_NODES = "417"  # exp_memory_patterns.out B: graph nodes reachable from the running total after 4 micro-batches


def _accumulation(flow, s, env) -> Optional[tuple[str, cst.BaseExpression, str]]:
    """(accumulator, accumulated value, form) when ``s`` accumulates a graph-carrying value."""
    if isinstance(s, cst.AugAssign) and isinstance(s.operator, cst.AddAssign):
        acc = dotted(s.target)
        if acc is None and isinstance(s.target, cst.Subscript) and len(s.target.slice) == 1 and \
                isinstance(s.target.slice[0].slice, cst.Index) and \
                isinstance(s.target.slice[0].slice.value, (cst.SimpleString, cst.Integer)):
            acc = dotted(s.target.value)  # `info["ratio"] += x`: a running total kept in a dict (or list) entry
        if acc and flow.carries_graph(s.value, env):
            return acc, s.value, "+="
        return None
    if isinstance(s, cst.Assign) and len(s.targets) == 1:
        acc = dotted(s.targets[0].target)
        v = s.value
        if not acc:
            return None
        if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, cst.Add):
            if dotted(v.left) == acc and flow.carries_graph(v.right, env):
                return acc, v.right, "= +"
            if dotted(v.right) == acc and flow.carries_graph(v.left, env):
                return acc, v.left, "= +"
        if isinstance(v, cst.Call) and final(flow.qual(v.func) if isinstance(v.func, (cst.Name, cst.Attribute))
                                             else None) in ("cat", "stack", "concat") and v.args:
            seq = v.args[0].value
            if isinstance(seq, (cst.List, cst.Tuple)) and len(seq.elements) == 2:
                a, b = seq.elements[0].value, seq.elements[1].value
                if dotted(a) == acc and flow.carries_graph(b, env):
                    return acc, b, "cat"
        return None
    if isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and isinstance(s.value.func, cst.Attribute):
        call = s.value
        meth = call.func.attr.value
        if meth in ("append", "extend") and call.args and call.args[0].keyword is None:
            acc = dotted(call.func.value)
            if acc is None and isinstance(call.func.value, cst.Subscript):  # d[k].append(x)
                acc = dotted(call.func.value.value)
            if acc and flow.carries_graph(call.args[0].value, env):
                return acc, call.args[0].value, meth
    return None


def _persistent(flow, acc: str, stmt, loop, scope) -> bool:
    """``acc`` lives across iterations of ``loop``: made before the loop (or an attribute), never re-made or
    cleared inside it."""
    for a in flow.assigns.get(scope, []):
        if not flow.inside(a, loop) or a is stmt:
            continue
        if isinstance(a, cst.Assign):
            for t in a.targets:
                if dotted(t.target) == acc or acc in target_names(t.target):
                    if acc not in names_in(a.value) and not (
                            "." in acc and acc in (dotted(a.value) or "")):
                        return False
        elif isinstance(a, cst.AnnAssign) and dotted(a.target) == acc:
            return False
    for c in flow.calls_by_final.get("clear", []):
        if flow.inside(c, loop) and isinstance(c.func, cst.Attribute) and dotted(c.func.value) == acc:
            return False
    if "." in acc:  # an attribute (self.losses) outlives the loop
        return True
    if scope is not None:
        params = {p.name.value for p in scope.params.params} | {p.name.value for p in scope.params.kwonly_params} \
            | {p.name.value for p in scope.params.posonly_params}
        if acc in params:
            return True
    for a in flow.assigns.get(scope, []):
        if flow.before(a, loop):
            if isinstance(a, cst.Assign) and any(acc in target_names(t.target) for t in a.targets):
                return True
            if isinstance(a, cst.AnnAssign) and dotted(a.target) == acc:
                return True
    if scope is not None:  # a module-level accumulator used from a function (global)
        return any(a.func is None for a in flow.symbols.assignments.get(acc, []))
    return False


def _backwarded(flow, acc: str, scope) -> bool:
    """The accumulator (or something computed from it) goes into a backward: deferred backward (BL113)."""
    bnames = flow.backward_names(scope)
    if "." in acc:
        for c in flow.calls:
            if flow.is_backward_call(c) and acc in flow.module.code_for_node(c):
                return True
        return False
    return bool(flow.derived({acc}, scope) & bnames)


def _returned(flow, acc: str, scope) -> bool:
    if scope is None:
        return False
    names = flow.derived({acc.split(".")[0]}, scope)
    for r in flow.returns.get(scope, []):
        if r.value is not None and names_in(r.value) & names:
            return True
    return False


def _model_computation(flow, scope) -> bool:
    """``scope`` is a method of a model class (an ``nn.Module`` / ``PreTrainedModel`` subclass, by its bases): a loop
    there that neither trains nor evaluates is the model's own computation (per-scale or per-layer outputs collected
    in ``forward`` and combined into its result), whose graph the caller's backward needs."""
    if not isinstance(scope, cst.FunctionDef):
        return False
    cls = flow.class_of(scope)
    return cls is not None and flow.module_family(cls) in ("module", "pretrained")


def _result_backwarded(flow, scope) -> bool:
    """A caller in this file differentiates the function's result (or the function is passed around, so its
    callers are unknown)."""
    if scope is None:
        return False
    sites = flow.call_sites(scope)
    if sites is None:
        return True
    for c in sites:
        p = flow.parent.get(c)
        # f(...).backward() / accelerator.backward(f(...))
        cur = p
        while isinstance(cur, (cst.Attribute, cst.Arg, cst.Call, cst.BinaryOperation, cst.Subscript)):
            if isinstance(cur, cst.Call) and flow.is_backward_call(cur):
                return True
            cur = flow.parent.get(cur)
        stmt = p
        while stmt is not None and not isinstance(stmt, (cst.Assign, cst.AnnAssign, cst.AugAssign,
                                                          cst.SimpleStatementLine)):
            stmt = flow.parent.get(stmt)
        if isinstance(stmt, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
            targets = []
            if isinstance(stmt, cst.Assign):
                for t in stmt.targets:
                    targets += target_names(t.target)
            else:
                targets += target_names(stmt.target)
            caller = flow.scope.get(stmt)
            if flow.derived(set(targets), caller) & flow.backward_names(caller):
                return True
    return False


def _numeric_uses_only(flow, acc: str, loop, scope) -> bool:
    """After the loop, ``acc`` is only used as a number (arithmetic, formatting, printing): ``.item()`` is safe."""
    if "." in acc or _returned(flow, acc, scope):
        return False
    for n in flow.names.get(scope, []):
        if n.value != acc or not flow.after(n, loop):
            continue
        p = flow.parent.get(n)
        if isinstance(p, cst.Attribute) and p.value is n:
            return False
        if isinstance(p, (cst.Return, cst.Yield)):
            return False
        if isinstance(p, cst.Arg):
            call = flow.parent.get(p)
            if isinstance(call, cst.Call):
                q = flow.qual(call.func) if isinstance(call.func, (cst.Name, cst.Attribute)) else None
                if q and q.startswith("torch"):
                    return False
    return True


def _scalar_loss(flow, value, loop, depth: int = 0) -> bool:
    """``value`` is certainly a one-element tensor: ``outputs.loss``, ``model(...).loss``, a torch loss without a
    ``reduction=`` argument, or a name bound (once in the loop) to one of those, possibly divided by a number."""
    if depth > 3:
        return False
    if isinstance(value, cst.Attribute):
        return value.attr.value == "loss"
    if isinstance(value, cst.BinaryOperation) and isinstance(value.operator, (cst.Divide, cst.Multiply)):
        return _scalar_loss(flow, value.left, loop, depth + 1) and not flow.carries_graph(value.right, {})
    if isinstance(value, cst.Call) and flow.loss_kind(value) == "saving" and not any(
            a.keyword is not None and a.keyword.value == "reduction" for a in value.args):
        return not isinstance(value.func, cst.Call) and not _reduction_module(flow, value)
    if isinstance(value, cst.Name):
        binds = [a for a in flow.assigns.get(flow.scope_of(loop), []) if flow.inside(a, loop) and
                 isinstance(a, cst.Assign) and len(a.targets) == 1 and
                 isinstance(a.targets[0].target, cst.Name) and a.targets[0].target.value == value.value]
        return len(binds) == 1 and _scalar_loss(flow, binds[0].value, loop, depth + 1)
    return False


def _reduction_module(flow, call) -> bool:
    """A criterion built with an explicit ``reduction=`` (``nn.CrossEntropyLoss(reduction="none")``)."""
    from bertlint.analysis.symbols import dotted as _d

    d = _d(call.func)
    if not d:
        return False
    for a in flow.symbols.assignments.get(d, []):
        if isinstance(a.value, cst.Call) and any(x.keyword is not None and x.keyword.value == "reduction"
                                                 for x in a.value.args):
            return True
    return False


def _fix(ctx, flow, acc, value, form, loop, scope):
    code = ctx.module.code_for_node(value)
    simple = isinstance(value, (cst.Name, cst.Attribute, cst.Subscript, cst.Call)) and not value.lpar
    wrapped = code if simple else f"({code})"
    is_loss = "loss" in code.rsplit(".", 1)[-1].lower() or "loss" in code.lower().split("(")[0]
    if form in ("+=", "= +") and is_loss:
        # .item() needs a one-element tensor: certain for an HF output's `.loss` and a mean-reduced torch loss
        safe = _numeric_uses_only(flow, acc, loop, scope) and _scalar_loss(flow, value, loop)
        return ctx.fix(f"Accumulate `{wrapped}.item()` (a Python number)",
                       [ctx.edit_replace(value, f"{wrapped}.item()")],
                       Applicability.SAFE if safe else Applicability.UNSAFE)
    if isinstance(value, (cst.List, cst.Tuple)):
        return None
    return ctx.fix(f"Accumulate `{wrapped}.detach()`", [ctx.edit_replace(value, f"{wrapped}.detach()")],
                   Applicability.SAFE if not _returned(flow, acc, scope) else Applicability.UNSAFE)


@rule(
    "BL501",
    "graph-kept-across-iterations",
    Severity.WARNING,
    "a graph-carrying tensor (loss, outputs, logits) is accumulated across loop iterations",
    fix=Applicability.SAFE,
)
def check(ctx) -> None:
    flow = ctx.evalflow
    if not flow.torch_file:
        return
    if "append(" in ctx.source and ("compute_loss" in ctx.source or "training_step" in ctx.source):
        step_stores(ctx, flow)
    for loop in flow.loops:
        scope = flow.scope_of(loop)
        if flow.framework_owned(scope) and scope is not None and scope.name.value != "training_step":
            continue
        if scope is not None and pytest_test(ctx, flow, scope):
            continue  # a test keeping its losses to compare them: no training run's memory
        env: dict[str, bool] = {}
        training: list = [None]  # computed once per loop, on demand
        backwarded = flow.backwarded_names(loop)  # usage: what the loop calls backward on carries a graph
        for s in flow.statements(loop.body):
            if isinstance(s, (cst.For, cst.While)):
                continue
            if flow.loop_of(s) is loop:
                hit = _accumulation(flow, s, env)
                if hit is not None:
                    _consider(ctx, flow, loop, scope, s, hit, training)
            if isinstance(s, cst.Assign):
                flow._bind([t.target for t in s.targets], s.value, env)
                for t in s.targets:
                    if isinstance(t.target, cst.Name) and t.target.value in backwarded:
                        env[t.target.value] = True
            elif isinstance(s, cst.AnnAssign) and s.value is not None:
                flow._bind([s.target], s.value, env)
            elif isinstance(s, cst.With):
                for it in s.items:
                    if it.asname is not None:
                        for n in target_names(it.asname.name):
                            env[n] = False


_METRIC_TOKENS = {"accuracy", "acc", "correct", "corrects", "f1", "precision", "recall", "auc", "hits", "top1", "top5",
                  "em", "exact", "matches", "error", "err", "errors"}


def _piece_key(value) -> Optional[str]:
    """The key of ``x["accuracy"]`` / ``x.acc``; None for anything else."""
    if isinstance(value, cst.Subscript) and len(value.slice) == 1:
        idx = value.slice[0].slice
        if isinstance(idx, cst.Index) and isinstance(idx.value, cst.SimpleString):
            return idx.value.evaluated_value if isinstance(idx.value.evaluated_value, str) else None
    elif isinstance(value, cst.Attribute):
        return value.attr.value
    return None


def _metric_piece(value) -> bool:
    """``x["accuracy"]`` / ``x.acc`` / ``x.get("f1")``: a subscript or attribute of another value whose key names a
    metric (the value itself is not a model's direct output tensor)."""
    key = _piece_key(value)
    if not key:
        return False
    toks = {t for t in key.lower().replace("-", "_").split("_") if t}
    return bool(toks & _METRIC_TOKENS)


# calls whose result is a Python number / list, never a tensor: `t.item()`, `float(t)`, `t.tolist()`
_SCALAR_METHODS = ("item", "tolist")
_SCALAR_BUILTINS = ("float", "int", "bool", "round", "len")


def _scalar_expr(e, assigned: dict, depth: int = 0) -> bool:
    """``e`` evaluates to a plain Python number (no tensor, no graph): a numeric literal, ``x.item()``, ``float(x)``,
    arithmetic of those, or a local name whose every assignment in the function is one of those."""
    if isinstance(e, (cst.Integer, cst.Float)):
        return True
    if isinstance(e, cst.Call):
        f = e.func
        if isinstance(f, cst.Attribute) and f.attr.value in _SCALAR_METHODS and not e.args:
            return True
        return isinstance(f, cst.Name) and f.value in _SCALAR_BUILTINS
    if isinstance(e, cst.BinaryOperation):
        return _scalar_expr(e.left, assigned, depth) and _scalar_expr(e.right, assigned, depth)
    if isinstance(e, cst.Name) and depth < 4:
        vals = assigned.get(e.value)
        return bool(vals) and all(_scalar_expr(v, assigned, depth + 1) for v in vals)
    return False


def _script_model_scalar(ctx, flow, key: str) -> bool:
    """Every ``nn.Module`` class of this file whose ``forward`` returns a dict literal with ``key`` puts a plain Python
    number there (``acc = (pred == labels).float().mean().item(); return {"loss": loss, "accuracy": acc}``), and at
    least one does: the script's own models define that output as a number, which holds no autograd graph. Unknown
    (False) when no class of the file returns the key or one of them returns something else."""
    memo = ctx.__dict__.setdefault("_bl501_scalar_keys", {})
    if key in memo:
        return memo[key]
    found = ok = False
    for cls in list(flow.symbols.classes.values()):
        if not isinstance(cls, cst.ClassDef) or flow.module_family(cls) is None:
            continue
        for st in cls.body.body:
            if not (isinstance(st, cst.FunctionDef) and st.name.value == "forward"):
                continue
            assigned: dict = {}
            returns: list = []

            class V(cst.CSTVisitor):
                def visit_FunctionDef(self, n):
                    return n is st  # not into nested functions

                def visit_ClassDef(self, n):
                    return False

                def visit_Assign(self, n):
                    for t in n.targets:
                        if isinstance(t.target, cst.Name):
                            assigned.setdefault(t.target.value, []).append(n.value)

                def visit_AugAssign(self, n):
                    if isinstance(n.target, cst.Name):
                        assigned.setdefault(n.target.value, []).append(cst.BinaryOperation(
                            n.target, cst.Add(), n.value))

                def visit_Return(self, n):
                    if n.value is not None:
                        returns.append(n.value)

            st.visit(V())
            for r in returns:
                if not isinstance(r, cst.Dict):
                    continue
                for el in r.elements:
                    if isinstance(el, cst.DictElement) and isinstance(el.key, cst.SimpleString) and \
                            el.key.evaluated_value == key:
                        found = True
                        if not _scalar_expr(el.value, assigned):
                            memo[key] = False
                            return False
                        ok = True
    memo[key] = found and ok
    return memo[key]


def _consider(ctx, flow, loop, scope, stmt, hit, training_cache) -> None:
    acc, value, form = hit
    if flow.grad_state(stmt) != ENABLED:
        return
    if not _persistent(flow, acc, stmt, loop, scope):
        return
    if _backwarded(flow, acc, scope):
        return
    if training_cache[0] is None:
        training_cache[0] = flow.has_backward(loop) or flow.passes_optimizer(loop)
    training = training_cache[0]
    recv = tuple(r for r in (forward_receiver(c) for c in flow.calls_in(loop) if flow.is_forward(c)) if r)
    why = None if training else eval_reason(flow, loop, recv)
    site = flow.evaluation_call(loop) if training and flow.has_backward(loop) else None
    if site is not None:  # a shared `run_epoch(loader, train=False)`: this call evaluates
        training = False
        why = (f"when called as `{ctx.module.code_for_node(site)}` at line {ctx.span(site)[0].row}, which skips "
               f"every backward of the loop")
    if not training and why is None:
        # neither training nor evaluating: only when nothing in the scope trains
        node = scope if scope is not None else flow.module
        if flow.has_backward(node) or _returned(flow, acc, scope):
            return
        if _model_computation(flow, scope):
            return
    if why is not None and flow.framework_owned(scope):
        return
    if _returned(flow, acc, scope) and _result_backwarded(flow, scope):
        return  # e.g. a meta-learning "validation loss" whose caller differentiates it
    key = _piece_key(value)
    if key and _script_model_scalar(ctx, flow, key):
        return  # the script's own model returns a Python number under this key: nothing holds a graph
    stmt_text = ctx.module.code_for_node(stmt).strip()
    val = ctx.module.code_for_node(value)
    if training:
        sev = Severity.WARNING
        msg = (f"`{stmt_text}` keeps every iteration's `{val}` tensor and the autograd graph behind it alive across "
               f"the loop: `backward()` frees the saved activations, but the tensors and their chained graph nodes "
               f"stay referenced, so memory grows with the number of batches ({TRAIN_NODES} graph nodes kept after 4 "
               f"micro-batches of a 2-layer BERT; torch 2.x). Accumulate `{val}.item()` or `{val}.detach()`.")
    elif why is not None:
        sev = Severity.ERROR
        msg = (f"`{stmt_text}` in an evaluation loop ({why}) with autograd on keeps every batch's autograd graph "
               f"and all its saved activations alive until the loop ends: memory grows with the number of batches "
               f"({EVAL_BYTES} kept after 4 batches of 8x64 tokens on a 2-layer BERT, 0 under no_grad; torch 2.x). "
               f"Accumulate `{val}.item()` / `{val}.detach()` and run the loop under `torch.no_grad()`.")
    else:
        sev = Severity.WARNING
        msg = (f"`{stmt_text}` keeps every iteration's `{val}` with its autograd graph and saved activations alive "
               f"(nothing in this scope calls backward on them): memory grows with the number of batches "
               f"({EVAL_BYTES} after 4 batches of 8x64 tokens on a 2-layer BERT; torch 2.x). Accumulate "
               f"`{val}.detach()` (or `.item()`), or run the loop under `torch.no_grad()`.")
    if _metric_piece(value):
        # `output_dict["accuracy"]`, `out.acc`: a piece of a forward's output named for a metric, computed by
        # comparisons (argmax == labels) that record no graph in most models; the model is not in view
        sev = Severity.INFO
        msg += (f" (Info only: `{val}` is named for a metric, which is usually computed without a graph; it keeps one "
                f"only if the model computes it from differentiable outputs.)")
    ctx.report(value, msg, severity=sev, fix=_fix(ctx, flow, acc, value, form, loop, scope),
               data={"statement_row": ctx.span(stmt)[0].row, "accumulator": acc, "training": bool(training),
                     "evaluation": why is not None})


# ---------------------------------------------------------------------------------------------------------------
# per-step framework methods: a graph kept in the object's state from one training step to the next

_ENTRY_METHODS = ("compute_loss", "training_step")
_T, _D = "tensor", "dict"  # a graph-carrying tensor; a dict holding one


class _StepStores:
    """Follows values through the methods of one framework class from a per-step entry method (``compute_loss`` /
    ``training_step``, run with grad on by the framework's training loop once per step): a model forward (grad mode
    not changed inside the method) and what graph-keeping ops make of it are graph-carrying tensors; ``d[k] = t``
    makes ``d`` a dict holding one; tuples returned by the class's own methods and nested functions are followed
    position by position. A sink is an append into an attribute of ``self`` (``self.x.append(t)``,
    ``self.x[k].append(v)``), which outlives the step."""

    def __init__(self, ctx, flow, cls):
        self.ctx, self.flow, self.cls = ctx, flow, cls
        self.methods = {st.name.value: st for st in cls.body.body if isinstance(st, cst.FunctionDef)} \
            if isinstance(cls.body, cst.IndentedBlock) else {}
        self.memo: dict = {}
        self.hits: list = []  # (sink statement, value node, origin note, entry)

    # values ------------------------------------------------------------------------------------------------
    def val(self, e, env, fn):
        flow = self.flow
        if isinstance(e, cst.Name):
            return env.get(e.value)
        if isinstance(e, cst.Tuple):
            return tuple(self.val(x.value, env, fn) if isinstance(x, cst.Element) else None for x in e.elements)
        if isinstance(e, cst.Dict):
            return _D if any(isinstance(x, cst.DictElement) and self.val(x.value, env, fn) == _T
                             for x in e.elements) else None
        if isinstance(e, cst.Call):
            f = e.func
            if flow.is_forward(e) and self._own_mode(e, fn):
                recv = flow.forward_receiver_of(e)
                return None if recv and frozen(flow, recv) else _T
            callee = self._callee(e, fn)
            if callee is not None:
                flags = tuple(self.val(a.value, env, fn) for a in e.args if not a.star)
                kw = {a.keyword.value: self.val(a.value, env, fn) for a in e.args if a.keyword is not None}
                return self.run(callee, flags, kw, bound=isinstance(f, cst.Attribute))
        boolenv = {k: v == _T for k, v in env.items()}
        return _T if flow.carries_graph(e, boolenv) else None

    def _own_mode(self, call, fn) -> bool:
        return self.flow._caller_grad_mode(call, fn) if fn is not None else False

    def _callee(self, call, fn):
        f = call.func
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self":
            m = self.methods.get(f.attr.value)
            return m if m is not None and not m.decorators else None
        if isinstance(f, cst.Name) and fn is not None:  # a function nested in the current one
            for st in _nested(fn):
                if st.name.value == f.value:
                    return st
        return None

    # functions ---------------------------------------------------------------------------------------------
    def run(self, fn, flags, kw, bound: bool, entry=None):
        """Abstract value of what ``fn`` returns, given its arguments' values; records sinks on the way."""
        key = (id(fn), flags, tuple(sorted(kw.items())))
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = None  # recursion guard
        if any(self.flow.ctx_kind(d.decorator) is not None for d in fn.decorators):
            return None
        params = list(fn.params.params)
        if bound and params:
            params = params[1:]
        env: dict = {}
        for p, v in zip(params, flags):
            env[p.name.value] = v
        for p in params + list(fn.params.kwonly_params):
            if p.name.value in kw:
                env[p.name.value] = kw[p.name.value]
        ret = None
        for s in self.flow.statements(fn.body):
            if isinstance(s, cst.With) and any(self.flow.ctx_kind(it.item) is not None for it in s.items):
                continue  # its statements are visited too, but forwards there are not in the caller's mode
            own_mode = self.flow._caller_grad_mode(s, fn)  # not inside a no_grad / inference_mode block
            if isinstance(s, cst.Assign):
                v = self.val(s.value, env, fn) if own_mode else None
                for t in s.targets:
                    self.bind(t.target, v, env, s)
            elif isinstance(s, cst.AnnAssign) and s.value is not None:
                self.bind(s.target, self.val(s.value, env, fn) if own_mode else None, env, s)
            elif isinstance(s, cst.For):
                it = s.iter
                src = None
                if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and \
                        it.func.attr.value in ("items", "values") and isinstance(it.func.value, cst.Name):
                    src = env.get(it.func.value.value)
                names = target_names(s.target)
                for n in names:
                    env[n] = None
                if src == _D and names:
                    env[names[-1]] = _T  # for k, v in d.items() / for v in d.values()
            elif isinstance(s, cst.Expr) and isinstance(s.value, cst.Call) and own_mode:
                self.sink(s, env, fn, entry)
                self.val(s.value, env, fn)  # a call of another method of the class (store_metrics(metrics))
            elif isinstance(s, cst.Return) and s.value is not None:
                r = self.val(s.value, env, fn)
                ret = r if ret is None else (ret if ret == r else _merge(ret, r))
        self.memo[key] = ret
        return ret

    def bind(self, target, v, env, stmt) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for i, el in enumerate(target.elements):
                sub = v[i] if isinstance(v, tuple) and len(v) == len(target.elements) else (
                    None if isinstance(v, tuple) else v)
                self.bind(el.value, sub, env, stmt)
            return
        if isinstance(target, cst.Subscript) and isinstance(target.value, cst.Name):
            if v == _T:
                env[target.value.value] = _D
                self.origins[target.value.value] = stmt
            return
        d = dotted(target)
        if d:
            env[d] = v

    origins: dict = {}

    def sink(self, s, env, fn, entry) -> None:
        call = s.value
        if not (isinstance(call.func, cst.Attribute) and call.func.attr.value in ("append", "extend") and call.args):
            return
        base = call.func.value
        while isinstance(base, cst.Subscript):
            base = base.value
        acc = dotted(base)
        if not acc or not acc.startswith("self."):
            return
        arg = call.args[0].value
        if self.val(arg, env, fn) == _T:
            self.hits.append((s, arg, acc, fn))


def _nested(fn):
    out = []
    body = fn.body.body if isinstance(fn.body, cst.IndentedBlock) else []
    for st in body:
        if isinstance(st, cst.FunctionDef):
            out.append(st)
    return out


def _merge(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        return tuple(x if x == y else (x or y) for x, y in zip(a, b))
    return a or b


def step_stores(ctx, flow) -> None:
    """BL501 for per-step framework methods (see :class:`_StepStores`)."""
    for cls in ctx.index.of(cst.ClassDef):
        if not isinstance(cls.body, cst.IndentedBlock):
            continue
        entries = [st for st in cls.body.body if isinstance(st, cst.FunctionDef) and st.name.value in _ENTRY_METHODS]
        if not entries or not flow.framework_class(cls):
            continue
        ss = _StepStores(ctx, flow, cls)
        ss.origins = {}
        for e in entries:
            ss.run(e, (), {}, bound=True, entry=e)
        seen = set()
        for stmt, value, acc, fn in ss.hits:
            if id(stmt) in seen:
                continue
            seen.add(id(stmt))
            origin = next(iter(ss.origins.values()), None)
            where = ""
            if origin is not None:
                where = (f" (the graph-carrying value is put in at line {ctx.span(origin)[0].row}: "
                         f"`{ctx.module.code_for_node(origin).strip()[:90]}`)")
            entry = ", ".join(f"`{e.name.value}`" for e in entries)
            ctx.report(
                value,
                f"`{ctx.module.code_for_node(stmt).strip()}` in `{fn.name.value}()` keeps a tensor that still carries "
                f"its autograd graph in `{acc}`, which outlives the training step{where}: {entry} runs once per "
                f"training step with grad on, so every step's graph stays referenced until `{acc}` is cleared, and "
                f"memory grows with the steps in between ({TRAIN_NODES} graph nodes kept after 4 micro-batches of a "
                f"2-layer BERT; torch 2.x). Store `.detach()` (or `.item()`) values.",
                severity=Severity.WARNING,
                data={"accumulator": acc, "training": True, "evaluation": False},
            )
