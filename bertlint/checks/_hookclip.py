"""Gradient clipping done by tensor hooks on the parameters, under a GradScaler (BL201's hook path).

``parameter.register_hook(lambda grad: grad.clamp(-c, c))`` installs a function that autograd calls *during*
``backward()``, when that parameter's gradient is computed. With ``scaler.scale(loss).backward()`` the gradient it
receives is the scaled one (× the loss scale, 65 536 at the start; torch.amp): no ``scaler.unscale_()`` can run
before a hook, so a clamp at ±c bounds the true gradient at ±c / scale. The hooks are found in this file or in the
project function this file calls to install them (``training_util.enable_gradient_clipping(model, c)``,
``bertlint/analysis/project.py``); a hook that reads the scale (``/ scaler.get_scale()``) is left alone."""

from __future__ import annotations

from typing import Optional

import libcst as cst

from bertlint.analysis.evalflow import names_in
from bertlint.analysis.symbols import dotted

_CLIP_WORDS = ("clamp", "clip")


def _final(func) -> str:
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return ""


class _Calls(cst.CSTVisitor):
    def __init__(self) -> None:
        self.calls: list = []
        self.names: set = set()

    def visit_Call(self, node: cst.Call) -> None:
        self.calls.append(node)

    def visit_Name(self, node: cst.Name) -> None:
        self.names.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> None:
        self.names.add(node.attr.value)


def _clips_arg(body: cst.CSTNode, param: str) -> bool:
    """``body`` clamps / clips its gradient argument ``param`` and never reads a loss scale."""
    v = _Calls()
    body.visit(v)
    if any("scale" in n.lower() for n in v.names):
        return False
    for c in v.calls:
        if not any(w in _final(c.func).lower() for w in _CLIP_WORDS):
            continue
        args = [a.value for a in c.args]
        if isinstance(c.func, cst.Attribute):
            args.append(c.func.value)  # grad.clamp(-c, c)
        if any(param in names_in(a) for a in args):
            return True
    return False


def _hook_clips(hook: cst.BaseExpression, defs: dict) -> bool:
    if isinstance(hook, cst.Lambda):
        ps = hook.params.params
        return len(ps) == 1 and _clips_arg(hook.body, ps[0].name.value)
    if isinstance(hook, cst.Name) and hook.value in defs:
        fn = defs[hook.value]
        ps = fn.params.params
        return len(ps) == 1 and _clips_arg(fn.body, ps[0].name.value)
    return False


def _param_loop_var(call: cst.Call, parents: dict) -> bool:
    """``call`` is ``p.register_hook(...)`` with ``p`` the target of an enclosing ``for p in X.parameters()`` (or
    the second name of ``for n, p in X.named_parameters()``)."""
    recv = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
    if not recv or "." in recv:
        return False
    cur = parents.get(call)
    while cur is not None and not isinstance(cur, (cst.FunctionDef, cst.Module)):
        if isinstance(cur, cst.For) and isinstance(cur.iter, cst.Call):
            meth = _final(cur.iter.func)
            t = cur.target
            if meth == "parameters" and isinstance(t, cst.Name) and t.value == recv:
                return True
            if meth == "named_parameters" and isinstance(t, cst.Tuple) and len(t.elements) == 2 and \
                    isinstance(t.elements[1].value, cst.Name) and t.elements[1].value.value == recv:
                return True
        cur = parents.get(cur)
    return False


class _Walk(cst.CSTVisitor):
    """Calls with their parents, and the functions defined, of one definition or module."""

    def __init__(self) -> None:
        self.parents: dict = {}
        self.stack: list = []
        self.calls: list = []
        self.defs: dict = {}

    def on_visit(self, node) -> bool:
        if self.stack:
            self.parents[node] = self.stack[-1]
        self.stack.append(node)
        if isinstance(node, cst.Call):
            self.calls.append(node)
        if isinstance(node, cst.FunctionDef):
            self.defs.setdefault(node.name.value, node)
        return True

    def on_leave(self, node) -> None:
        self.stack.pop()


def hook_installs(node: cst.CSTNode) -> list:
    """``register_hook`` calls in ``node`` that install a clipping hook on every parameter of a model."""
    w = _Walk()
    node.visit(w)
    out = []
    for c in w.calls:
        if _final(c.func) != "register_hook" or len(c.args) != 1:
            continue
        if _hook_clips(c.args[0].value, w.defs) and _param_loop_var(c, w.parents):
            out.append(c)
    return out


def module_walk(ctx) -> _Walk:
    w = ctx.__dict__.get("_hookclip_walk")
    if w is None:
        w = _Walk()
        ctx.module.visit(w)
        ctx.__dict__["_hookclip_walk"] = w
    return w


def installing_calls(ctx) -> list:
    """(node to report, text of the install, where) for each clipping-hook install this file makes: a
    ``register_hook`` here, or a call of a function (this file's, or a project module's) that makes one."""
    from bertlint.analysis import project

    out = [(c, ctx.module.code_for_node(c), None) for c in hook_installs(ctx.module)]
    local = {c for c, _, _ in out}
    own = {}
    for st in ctx.module.body:
        if isinstance(st, cst.FunctionDef):
            own[st.name.value] = st
    memo: dict = {}
    xp = None
    w = module_walk(ctx)
    for c in w.calls:
        d = dotted(c.func) if isinstance(c.func, (cst.Name, cst.Attribute)) else None
        if not d or _final(c.func) == "register_hook":
            continue
        fn = None
        where = None
        if "." not in d and d in own:
            fn = own[d]
        elif d.split(".")[0] in ctx.symbols.imports:
            if xp is None:
                xp = project.of(ctx)
            t = xp.resolve(d)
            if t is not None and t.kind == "function":
                fn = t.node
                where = project.where(t.node, t.info)
        if fn is None:
            continue
        if id(fn) not in memo:
            memo[id(fn)] = hook_installs(fn)
        hits = memo[id(fn)]
        if hits and not any(h in local for h in hits):
            out.append((c, ctx.module.code_for_node(c), where))
    return out


def torch_scaler(ctx) -> Optional[tuple]:
    """(construction call, dotted name it is bound to) of a ``torch`` GradScaler this file builds (not with a literal
    ``enabled=False``) and then uses (``.scale(`` or ``.step(`` on that name); None otherwise."""
    w = module_walk(ctx)
    for c in w.calls:
        if not isinstance(c.func, (cst.Name, cst.Attribute)):
            continue
        q = ctx.symbols.qualname(c.func) or ""
        if not (q.startswith("torch.") and q.endswith("GradScaler")):
            continue
        if any(a.keyword is not None and a.keyword.value == "enabled" and isinstance(a.value, cst.Name)
               and a.value.value == "False" for a in c.args):
            continue
        p = w.parents.get(c)
        if not isinstance(p, cst.Assign) or len(p.targets) != 1:
            continue
        name = dotted(p.targets[0].target)
        if not name:
            continue
        for u in w.calls:
            if isinstance(u.func, cst.Attribute) and u.func.attr.value in ("scale", "step") and \
                    dotted(u.func.value) == name:
                return c, name
    return None


def conditional(node, parents: dict) -> bool:
    cur = parents.get(node)
    while cur is not None:
        if isinstance(cur, (cst.If, cst.IfExp)):
            return True
        cur = parents.get(cur)
    return False
