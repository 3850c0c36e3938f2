"""BL506 inference-tensor-reuse — a tensor made under ``torch.inference_mode()`` is fed to a training step.

Inference tensors cannot be saved for backward: an op that saves its input for the gradient (``nn.Linear``,
``nn.Embedding``, an HF model's ``input_ids`` / ``labels``, losses that save their target such as cross-entropy, MSE,
KL-div, BCE-with-logits) raises ``RuntimeError: Inference tensors cannot be saved for backward`` at the forward.
Ops that do not save it (``+``, ``softmax(t)``, ``l1_loss``, a model taking ``inputs_embeds`` that are first added
to other embeddings) work, and so do new tensors made from the inference tensor outside the block (``t * 1``,
``torch.cat(list)``, a DataLoader batch collated from a TensorDataset, ``t.clone()``), so the rule is narrow:

* sources: names assigned inside ``with torch.inference_mode():`` (one function or the module level) from a model
  forward or a torch call, never re-assigned outside the block; names assigned from a call of a function of this
  file decorated ``@torch.inference_mode()`` that returns such a value;
* views that stay inference tensors: basic slicing (``t[a:b]``, ``t[0]``), ``.view`` / ``.detach()`` / ``.unsqueeze``
  / ``.squeeze`` / ``.t()`` / ``.transpose`` / ``.permute``, and rows of ``for x in t`` / ``zip(t, ...)`` /
  ``enumerate(t)``;
* sinks, in a loop or scope that runs backward, with grad on: a saving loss with such an argument; an ``nn.Linear`` /
  ``nn.Embedding`` / ``nn.Sequential`` starting with one, called on it; an HF model given it as ``input_ids``,
  ``labels``, ``token_type_ids``, ``position_ids`` or first positional argument.
"""

from __future__ import annotations

from typing import Optional

import libcst as cst

from bertlint.analysis.evalflow import ENABLED, frozen, target_names
from bertlint.analysis.symbols import dotted, literal
from bertlint.registry import rule
from bertlint.types import Applicability, Severity

_VIEW_METHODS = {"view", "detach", "unsqueeze", "squeeze", "t", "transpose", "permute", "view_as", "narrow",
                 "select", "expand", "expand_as", "unflatten", "diagonal", "as_strided", "unbind", "split", "chunk"}
_HF_KEYWORDS = {"input_ids", "labels", "token_type_ids", "position_ids"}


def _basic_index(sub: cst.Subscript) -> bool:
    for el in sub.slice:
        s = el.slice
        if isinstance(s, cst.Slice):
            for part in (s.lower, s.upper, s.step):
                if part is not None and not isinstance(part, (cst.Integer, cst.Name, cst.BinaryOperation,
                                                               cst.UnaryOperation, cst.Attribute)):
                    return False
            continue
        if isinstance(s, cst.Index) and isinstance(s.value, (cst.Integer, cst.Ellipsis)):
            continue
        if isinstance(s, cst.Index) and isinstance(s.value, cst.UnaryOperation) and \
                isinstance(s.value.expression, cst.Integer):
            continue
        if isinstance(s, cst.Index) and isinstance(s.value, cst.Name) and s.value.value == "None":
            continue
        return False
    return True


def _view_of(expr: cst.BaseExpression, inf: dict[str, cst.CSTNode]) -> Optional[str]:
    """The inference name ``expr`` is (a view of), or None."""
    if isinstance(expr, cst.Name):
        return expr.value if expr.value in inf else None
    if isinstance(expr, cst.Subscript) and _basic_index(expr):
        return _view_of(expr.value, inf)
    if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in _VIEW_METHODS:
        return _view_of(expr.func.value, inf)
    return None


def _all_assignments(flow, name: str, scope):
    """Every node of ``scope`` that binds ``name`` (assignments, loop targets, with-as, imports excluded)."""
    out = []
    for a in flow.assigns.get(scope, []):
        if isinstance(a, cst.Assign):
            if any(name in target_names(t.target) for t in a.targets):
                out.append(a)
        elif isinstance(a, (cst.AugAssign, cst.AnnAssign)) and name in target_names(a.target):
            out.append(a)
    for loop in flow.loops:
        if flow.scope.get(loop) is scope and isinstance(loop, cst.For) and name in target_names(loop.target):
            out.append(loop)
    for w in flow.withs:
        if flow.scope.get(w) is scope:
            for it in w.items:
                if it.asname is not None and name in target_names(it.asname.name):
                    out.append(w)
    return out


def _sources(flow) -> dict:
    """scope -> {name: origin node (the inference block or the decorated function's call)}."""
    found: dict = {}
    # names assigned inside `with torch.inference_mode():`
    for w in flow.withs:
        if not (any(flow.ctx_kind(it.item) == "inference" for it in w.items) and flow._is_torch_inference(w.items)):
            continue
        scope = flow.scope.get(w)
        env: dict[str, bool] = {}
        for s in flow.statements(w.body):
            if isinstance(s, cst.Assign):
                for t in s.targets:
                    if isinstance(t.target, cst.Name) or isinstance(t.target, (cst.Tuple, cst.List)):
                        ok = flow.tensorish(s.value, env)
                        if isinstance(t.target, (cst.Tuple, cst.List)) and not (
                                isinstance(s.value, cst.Call) and flow.is_forward(s.value)):
                            ok = False
                        for n in target_names(t.target):
                            env[n] = ok
        for n, ok in env.items():
            if ok:
                found.setdefault(scope, {})[n] = w
    # functions decorated @torch.inference_mode() returning a tensor
    decorated = {}
    for fn in flow.functions:
        if flow.class_of(fn) is not None or flow.scope.get(fn) is not None:
            continue
        if not any(flow.ctx_kind(d.decorator) == "inference" and flow._is_torch_inference([d])
                   for d in fn.decorators):
            continue
        env = {}
        for s in flow.statements(fn.body):
            if isinstance(s, cst.Assign):
                ok = flow.tensorish(s.value, env)
                for t in s.targets:
                    for n in target_names(t.target):
                        env[n] = ok
        rets = [r for r in flow.returns.get(fn, []) if isinstance(r, cst.Return)]
        if rets and all(r.value is not None and flow.tensorish(r.value, env) for r in rets):
            decorated[fn.name.value] = fn
    if decorated:
        for scope, assigns in flow.assigns.items():
            for a in assigns:
                if isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name) \
                        and isinstance(a.value, cst.Call) and isinstance(a.value.func, cst.Name) \
                        and a.value.func.value in decorated:
                    found.setdefault(scope, {})[a.targets[0].target.value] = a
    # keep only names never bound outside their inference origin in the scope
    out: dict = {}
    for scope, names in found.items():
        for n, origin in names.items():
            binds = _all_assignments(flow, n, scope)
            if all(flow.inside(b, origin) or b is origin for b in binds):
                out.setdefault(scope, {})[n] = origin
    return out


def _extend_views(flow, scope, inf: dict, roots: dict) -> None:
    """Add names bound outside the blocks only to views / rows of inference names."""
    for _ in range(3):
        grew = False
        for a in flow.assigns.get(scope, []):
            if isinstance(a, cst.Assign) and len(a.targets) == 1 and isinstance(a.targets[0].target, cst.Name):
                n = a.targets[0].target.value
                if n in inf:
                    continue
                src = _view_of(a.value, inf)
                if src is None:
                    continue
                binds = _all_assignments(flow, n, scope)
                if all(isinstance(b, cst.Assign) and _view_of(b.value, inf) for b in binds):
                    inf[n] = inf[src]
                    roots[n] = roots.get(src, src)
                    grew = True
        for loop in flow.loops:
            if flow.scope.get(loop) is not scope or not isinstance(loop, cst.For):
                continue
            pairs = _row_targets(loop, inf)
            for n, src in pairs:
                if n in inf:
                    continue
                binds = _all_assignments(flow, n, scope)
                if all(b is loop for b in binds):
                    inf[n] = inf[src]
                    roots[n] = roots.get(src, src)
                    grew = True
        if not grew:
            break


def _row_targets(loop: cst.For, inf: dict) -> list[tuple[str, str]]:
    it, tgt = loop.iter, loop.target
    if isinstance(it, cst.Name) and it.value in inf and isinstance(tgt, cst.Name):
        return [(tgt.value, it.value)]
    if isinstance(it, cst.Call) and isinstance(it.func, cst.Name):
        fn = it.func.value
        args = [a.value for a in it.args if a.keyword is None]
        if fn == "zip" and isinstance(tgt, (cst.Tuple, cst.List)) and len(tgt.elements) == len(args):
            out = []
            for te, a in zip(tgt.elements, args):
                if isinstance(te.value, cst.Name) and isinstance(a, cst.Name) and a.value in inf:
                    out.append((te.value.value, a.value))
            return out
        if fn == "enumerate" and args and isinstance(args[0], cst.Name) and args[0].value in inf and \
                isinstance(tgt, (cst.Tuple, cst.List)) and len(tgt.elements) == 2 and \
                isinstance(tgt.elements[1].value, cst.Name):
            return [(tgt.elements[1].value.value, args[0].value)]
    return []


def _sink(flow, call: cst.Call, inf: dict) -> Optional[tuple[str, str]]:
    """(inference name, what consumes it) when ``call`` saves the inference tensor for backward."""
    kind = flow.loss_kind(call)
    if kind == "saving":
        for a in call.args:
            src = _view_of(a.value, inf)
            if src:
                return src, "a loss that saves its target for backward"
        return None
    func = call.func
    if not isinstance(func, (cst.Name, cst.Attribute)):
        return None
    recv = dotted(func)
    if not recv or recv.split(".")[0] in flow.symbols.imports:
        return None
    mk = flow.module_class(recv, flow.scope_of(call))
    if mk is None or frozen(flow, recv):
        return None  # unknown module, or frozen: nothing of it needs the input for a gradient
    pos = [a for a in call.args if a.keyword is None and not a.star]
    if mk == "hf":
        cands = [a for a in call.args if a.keyword is not None and a.keyword.value in _HF_KEYWORDS]
        cands += pos[:1]
        for a in cands:
            src = _view_of(a.value, inf)
            if src:
                where = a.keyword.value if a.keyword is not None else "input_ids"
                return src, f"the model's `{where}` (embedding lookup / loss target, saved for backward)"
        return None
    if pos:
        src = _view_of(pos[0].value, inf)
        if src:
            return src, f"an `nn.{mk}` that saves its input for the weight gradient"
    return None


def _training_region(flow, call: cst.Call, scope) -> bool:
    loop = flow.loop_of(call)
    if loop is not None:
        return flow.has_backward(loop)
    if scope is not None:
        return flow.has_backward(scope)
    for c in flow.calls:  # module level: a backward later in the script (or around this call)
        if flow.scope.get(c) is None and flow.end[c] >= flow.order[call] and flow._is_train_call(c):
            return True
    return False


def _fix(ctx, flow, origin):
    """Replace `torch.inference_mode()` of the origin block (or decorator) by `torch.no_grad()`: tensors made
    under no_grad can be used by autograd later; values are identical."""
    items = []
    if isinstance(origin, cst.With):
        items = [it.item for it in origin.items]
    elif isinstance(origin, cst.FunctionDef):
        items = [d.decorator for d in origin.decorators]
    for e in items:
        if flow.ctx_kind(e) == "inference":
            if isinstance(e, cst.Call) and (e.args and literal(e.args[0].value) is not True):
                return None
            target = e.func if isinstance(e, cst.Call) else e
            code = ctx.module.code_for_node(target)
            if not code.endswith("inference_mode"):
                return None
            new = code[: -len("inference_mode")] + "no_grad"
            if isinstance(target, cst.Name):
                q = flow.symbols.qualname(target) or ""
                if not q.startswith("torch"):
                    return None
                alias = None
                for local, qq in flow.symbols.imports.items():
                    if qq == "torch":
                        alias = local
                if alias is None:
                    return None
                new = f"{alias}.no_grad"
            return ctx.fix(f"Use `{new}()` instead of `{code}()`",
                           [ctx.edit_replace(e, f"{new}()")], Applicability.SAFE)
    return None


@rule(
    "BL506",
    "inference-tensor-reuse",
    Severity.ERROR,
    "a tensor made under torch.inference_mode() is later fed to a training forward or loss",
    fix=Applicability.SAFE,
)
def check(ctx) -> None:
    flow = ctx.evalflow
    if not flow.torch_file or "inference_mode" not in ctx.source:
        return
    sources = _sources(flow)
    for scope, inf in sources.items():
        roots: dict[str, str] = {}
        _extend_views(flow, scope, inf, roots)
        reported = set()
        for call in flow.calls:
            if flow.scope.get(call) is not scope:
                continue
            hit = _sink(flow, call, inf)
            if hit is None:
                continue
            name, what = hit
            origin = inf[name]
            if not flow.after(call, origin) or flow.inference_block(call) is not None:
                continue
            if flow.grad_state(call) != ENABLED or not _training_region(flow, call, scope):
                continue
            if name in reported:
                continue
            reported.add(name)
            row = ctx.span(origin)[0].row
            root = roots.get(name, name)
            shown = f"`{name}` (a view of `{root}`)" if root != name else f"`{name}`"
            if isinstance(origin, cst.Assign):
                fn = ctx.module.code_for_node(origin.value.func)
                made = f"returned by `{fn}()` (line {row}), which runs under `@torch.inference_mode()`,"
            else:
                made = f"made under `torch.inference_mode()` (line {row})"
            ctx.report(
                call,
                f"{shown} was {made} and is fed to {what} in a training step: inference tensors "
                f"cannot be saved for backward, so this raises `RuntimeError: Inference tensors cannot be saved for "
                f"backward` (torch >= 1.9, checked on 2.13). Make it under `torch.no_grad()` instead, or pass "
                f"`{root}.clone()` (a normal tensor) outside the inference block.",
                fix=_fix(ctx, flow, origin if not isinstance(origin, cst.Assign) else
                         _decorated_fn(flow, origin)),
                data={"tensor": name, "origin_row": row},
            )


def _decorated_fn(flow, assign: cst.Assign):
    name = assign.value.func.value if isinstance(assign.value, cst.Call) and isinstance(assign.value.func,
                                                                                         cst.Name) else None
    for fn in flow.symbols.functions.get(name or "", []):
        if flow.scope.get(fn) is None:
            return fn
    return None
