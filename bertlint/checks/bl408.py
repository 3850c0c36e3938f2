"""BL408 lightning-accumulation-conflict.

PyTorch Lightning 2.x (REFERENCE §4, ``exp_lightning_ga.out``):

* ``__verify_manual_optimization_support`` raises ``MisconfigurationException`` at ``fit()`` when a module with
  ``automatic_optimization = False`` runs under ``Trainer(accumulate_grad_batches != 1)`` or
  ``Trainer(gradient_clip_val > 0)``: manual optimization accumulates and clips by hand.
* Under automatic optimization Lightning divides the loss returned by ``training_step`` by
  ``accumulate_grad_batches`` itself; dividing again in ``training_step`` is reported as BL104 (loss-scaled-twice),
  not here (one mistake, one code). ``_double_division`` is kept as a helper.
* ``DeepSpeedStrategy`` raises "Do not set `gradient_accumulation_steps` in the DeepSpeed config" when the config it
  is given holds that key (``_format_batch_size_and_grad_accum_config``).

The module and the Trainer are linked through ``trainer.fit(model)`` (``model = MyModule(...)``), or, when the file
has exactly one LightningModule class and one Lightning Trainer, taken together. Trainer values that come from the
command line are not used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Optional

import libcst as cst

from bertlint.analysis import configfiles as cf
from bertlint.analysis.symbols import UNKNOWN, call_name, code_of, dotted, kwarg, literal, positional
from bertlint.registry import rule
from bertlint.types import Severity

_PKGS = ("lightning", "pytorch_lightning")


@dataclass
class _Module:
    cls: cst.ClassDef
    manual: Optional[cst.CSTNode] = None  # the statement that switches automatic optimization off
    training_step: Optional[cst.FunctionDef] = None


@dataclass
class _Trainer:
    call: cst.Call
    func: Any
    var: Optional[str] = None
    accumulate: Any = UNKNOWN  # int, or UNKNOWN
    accumulate_arg: Optional[cst.Arg] = None
    accumulate_given: bool = False
    clip: Any = UNKNOWN
    clip_arg: Optional[cst.Arg] = None
    open_ended: bool = False
    modules: list = field(default_factory=list)  # class names fitted with this trainer


def _qual(ctx, expr) -> str:
    q = ctx.symbols.qualname(expr)
    return q or (dotted(expr) or "")


def _is_lightning(q: str, name: str) -> bool:
    parts = q.split(".")
    return parts[-1] == name and parts[0] in _PKGS


def _lightning_modules(ctx) -> dict[str, _Module]:
    t = ctx.symbols
    names: dict[str, _Module] = {}

    def is_lm(cls_name: str, depth: int = 0) -> bool:
        cls = t.classes.get(cls_name)
        if cls is None or depth > 8:
            return False
        for b in cls.bases:
            q = _qual(ctx, b.value)
            if _is_lightning(q, "LightningModule"):
                return True
            d = dotted(b.value)
            if d and d in t.classes and d != cls_name and is_lm(d, depth + 1):
                return True
        return False

    for name, cls in t.classes.items():
        if is_lm(name):
            names[name] = _Module(cls)
    # manual optimization / training_step, inherited through the file's own classes
    for name, m in names.items():
        chain = [m.cls]
        cur = m.cls
        for _ in range(8):
            nxt = None
            for b in cur.bases:
                d = dotted(b.value)
                if d in names and names[d].cls is not cur:
                    nxt = names[d].cls
            if nxt is None:
                break
            chain.append(nxt)
            cur = nxt
        for cls in chain:
            if m.manual is None:
                m.manual = _manual_switch(cls)
            if m.training_step is None:
                m.training_step = _method(cls, "training_step")
    return names


def _method(cls: cst.ClassDef, name: str) -> Optional[cst.FunctionDef]:
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    for stmt in body:
        if isinstance(stmt, cst.FunctionDef) and stmt.name.value == name:
            return stmt
    return None


def _manual_switch(cls: cst.ClassDef) -> Optional[cst.CSTNode]:
    """``automatic_optimization = False`` as a class attribute, ``self.automatic_optimization = False`` in a method,
    or a property returning False."""
    found: list = []

    class V(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                d = dotted(t.target)
                if d in ("automatic_optimization", "self.automatic_optimization") and literal(node.value) is False:
                    found.append(node)

        def visit_ClassDef(self, node: cst.ClassDef) -> bool:
            return node is cls

        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            if node.name.value == "automatic_optimization":
                rets = []

                class R(cst.CSTVisitor):
                    def visit_Return(self, r: cst.Return) -> None:
                        rets.append(r)

                node.visit(R())
                if rets and all(r.value is not None and literal(r.value) is False for r in rets):
                    found.append(node)
                return False
            return True

    cls.visit(V())
    return found[0] if found else None


def _trainers(ctx) -> list[_Trainer]:
    out = []
    for call, func, _cls in cf.all_calls(ctx):
        q = _qual(ctx, call.func)
        if not _is_lightning(q, "Trainer"):
            continue
        tr = _Trainer(call, func)
        for a in call.args:
            if a.star:
                tr.open_ended = True
            if a.keyword is None:
                continue
            k = a.keyword.value
            if k == "accumulate_grad_batches":
                tr.accumulate_arg = a
                tr.accumulate_given = True
                if cf.is_static_expr(ctx, a.value, func):
                    v = ctx.resolver.value(a.value, func)
                    tr.accumulate = v if isinstance(v, int) and not isinstance(v, bool) else UNKNOWN
            elif k == "gradient_clip_val":
                tr.clip_arg = a
                if cf.is_static_expr(ctx, a.value, func):
                    v = ctx.resolver.value(a.value, func)
                    tr.clip = v if v is None or isinstance(v, (int, float)) and not isinstance(v, bool) else UNKNOWN
        if not tr.accumulate_given and not tr.open_ended:
            tr.accumulate = 1
        if tr.clip_arg is None and not tr.open_ended:
            tr.clip = None
        out.append(tr)
    # variable names: trainer = Trainer(...)
    for name, assigns in ctx.symbols.assignments.items():
        for a in assigns:
            for tr in out:
                if a.value is tr.call:
                    tr.var = name
    return out


def _class_of_expr(ctx, expr, func, modules: dict, depth: int = 0) -> Optional[str]:
    if expr is None or depth > 4:
        return None
    if isinstance(expr, cst.Call):
        n = call_name(expr) or ""
        head = n.split(".")[0]
        if n in modules:
            return n
        if head in modules and n.endswith(".load_from_checkpoint"):
            return head
        return None
    if isinstance(expr, cst.Name):
        assigns = ctx.symbols.assignments_of(expr.value, func)
        classes = {_class_of_expr(ctx, a.value, a.func, modules, depth + 1) for a in assigns}
        if len(classes) == 1:
            return next(iter(classes))
    return None


def _link(ctx, modules: dict, trainers: list) -> list[tuple[_Module, _Trainer]]:
    pairs = []
    seen = set()
    fit_calls = 0
    for call, func, _cls in cf.all_calls(ctx):
        f = call.func
        if not isinstance(f, cst.Attribute) or f.attr.value != "fit":
            continue
        fit_calls += 1
        target = dotted(f.value)
        trs = [t for t in trainers if t.var and t.var == target] or [t for t in trainers if t.call is f.value]
        if len(trs) != 1:
            continue
        m_expr = kwarg(call, "model") or positional(call, 0)
        cname = _class_of_expr(ctx, m_expr, func, modules)
        if cname and (cname, id(trs[0])) not in seen:
            seen.add((cname, id(trs[0])))
            pairs.append((modules[cname], trs[0]))
    # no fit() in the file at all (the Trainer is returned or fitted elsewhere): one module + one Trainer go together
    if not pairs and not fit_calls and len(modules) == 1 and len(trainers) == 1:
        pairs.append((next(iter(modules.values())), trainers[0]))
    return pairs


def _lightning_version(ctx) -> str:
    try:
        return ctx.versions.lightning.describe()
    except Exception:
        return "Lightning 2.x"


def _is_lightning_2(ctx) -> bool:
    try:
        return ctx.versions.lightning.at_least("2.0.0")
    except Exception:
        return True


@rule(
    "BL408",
    "lightning-accumulation-conflict",
    Severity.ERROR,
    "Lightning manual optimization with accumulate_grad_batches / gradient_clip_val, loss divided by N twice, or "
    "gradient_accumulation_steps in the DeepSpeedStrategy config",
)
def check(ctx) -> None:
    if "lightning" not in ctx.source:
        return
    if not (ctx.symbols.uses("lightning") or ctx.symbols.uses("pytorch_lightning")):
        return
    modules = _lightning_modules(ctx)
    trainers = _trainers(ctx)
    pairs = _link(ctx, modules, trainers)
    ver = None
    for mod, tr in pairs:
        if mod.manual is None:
            continue
        ver = ver or _lightning_version(ctx)
        cname = mod.cls.name.value
        raises = _is_lightning_2(ctx)
        acc = tr.accumulate
        if isinstance(acc, int) and acc != 1 and tr.accumulate_arg is not None:
            consequence = (
                f"{ver} raises `MisconfigurationException: Automatic gradient accumulation is not supported for "
                f"manual optimization` at `trainer.fit()`" if raises else
                f"{ver} does not accumulate for manual optimization (the setting has no effect)")
            ctx.report(
                tr.accumulate_arg,
                f"`{cname}` switches automatic optimization off, and the Trainer sets `accumulate_grad_batches={acc}`: "
                f"{consequence}. With manual optimization you accumulate by hand: `self.manual_backward(loss / {acc})` "
                f"every batch, then `opt.step(); opt.zero_grad()` when `(batch_idx + 1) % {acc} == 0`. Remove "
                f"`accumulate_grad_batches` from the Trainer (or switch back to automatic optimization).",
                data={"accumulate": acc, "module": cname},
            )
        clip = tr.clip
        if isinstance(clip, (int, float)) and not isinstance(clip, bool) and clip > 0 and tr.clip_arg is not None:
            consequence = (
                f"{ver} raises `MisconfigurationException: Automatic gradient clipping is not supported for manual "
                f"optimization` at `trainer.fit()`" if raises else f"{ver} does not clip for manual optimization")
            ctx.report(
                tr.clip_arg,
                f"`{cname}` switches automatic optimization off, and the Trainer sets `gradient_clip_val={clip}`: "
                f"{consequence}. Clip by hand in `training_step` with `self.clip_gradients(opt, "
                f"gradient_clip_val={clip}, gradient_clip_algorithm=\"norm\")` before `opt.step()`, and remove "
                f"`gradient_clip_val` from the Trainer.",
                data={"clip": clip, "module": cname},
            )
    # The training_step double division (`return loss / self.trainer.accumulate_grad_batches`) is BL104's
    # (RULES.md: "loss-scaled-twice ... Lightning accumulate_grad_batches"); `_double_division` below is kept for
    # `explain` and is not reported under BL408, so one mistake gets one code.
    _deepspeed_config(ctx)


# ------------------------------------------------------------------------------------ double division


def _returned_divisions(fdef: cst.FunctionDef) -> list[tuple[cst.BinaryOperation, cst.BaseExpression]]:
    """(division node, divisor) for each loss the function returns that was divided: ``return loss / k``,
    ``return {"loss": loss / k}``, or ``loss = ... / k`` / ``loss /= k`` then ``return loss`` /
    ``return {"loss": loss}``."""
    returns: list[cst.BaseExpression] = []
    assigns: dict[str, list] = {}

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
            return node is fdef

        def visit_Lambda(self, node) -> bool:
            return False

        def visit_Return(self, node: cst.Return) -> None:
            if node.value is not None:
                returns.append(node.value)

        def visit_Assign(self, node: cst.Assign) -> None:
            for t in node.targets:
                if isinstance(t.target, cst.Name):
                    assigns.setdefault(t.target.value, []).append(node.value)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            if isinstance(node.target, cst.Name) and isinstance(node.operator, cst.DivideAssign):
                assigns.setdefault(node.target.value, []).append(node)

    fdef.visit(V())
    out = []

    def from_expr(e, depth=0):
        if depth > 3 or e is None:
            return
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Divide):
            out.append((e, e.right))
            return
        if isinstance(e, cst.Dict):
            for el in e.elements:
                if isinstance(el, cst.DictElement) and literal(el.key) == "loss":
                    from_expr(el.value, depth + 1)
            return
        if isinstance(e, cst.Call) and (call_name(e) or "") == "dict":
            from_expr(kwarg(e, "loss"), depth + 1)
            return
        if isinstance(e, cst.Name):
            for v in assigns.get(e.value, []):
                if isinstance(v, cst.AugAssign):
                    out.append((v, v.value))
                else:
                    from_expr(v, depth + 1)

    for r in returns:
        from_expr(r)
    return out


def _divisor_kind(ctx, divisor, func) -> tuple[str, Any]:
    """("trainer", None) for ``self.trainer.accumulate_grad_batches``; ("value", int) for a static int;
    ("name", attr) for an attribute/name that mentions accumulation; ("other", None)."""
    d = dotted(divisor) or ""
    if d.endswith("trainer.accumulate_grad_batches"):
        return "trainer", None
    if cf.is_static_expr(ctx, divisor, func):
        v = ctx.resolver.value(divisor, func)
        if isinstance(v, int) and not isinstance(v, bool):
            return "value", v
    last = d.split(".")[-1] if d else ""
    if "accum" in last.lower() or last.lower() in ("grad_acc", "gas", "ga_steps"):
        return "name", last
    return "other", None


def _double_division(ctx, modules: dict, trainers: list, pairs: list) -> None:
    by_module: dict[str, list] = {}
    for mod, tr in pairs:
        by_module.setdefault(mod.cls.name.value, []).append(tr)
    ver = None
    for cname, mod in modules.items():
        if mod.manual is not None or mod.training_step is None:
            continue
        trs = by_module.get(cname, [])
        for div_node, divisor in _returned_divisions(mod.training_step):
            kind, val = _divisor_kind(ctx, divisor, mod.training_step)
            if kind == "other":
                continue
            accs = [t.accumulate for t in trs]
            known = [a for a in accs if isinstance(a, int) and not isinstance(a, bool)]
            unknown = len(known) != len(accs) or not trs
            ver = ver or _lightning_version(ctx)
            text = code_of(divisor)
            if kind == "trainer":
                if trs and not unknown and all(a == 1 for a in known):
                    continue  # dividing by 1
                n = known[0] if known and len(set(known)) == 1 and known[0] > 1 else None
                sev = Severity.ERROR if n else Severity.WARNING
                n_txt = f"{n}" if n else "N"
                arith = (f"with `accumulate_grad_batches={n}` each micro-batch contributes loss / {n * n} instead of "
                         f"loss / {n}, so the gradient of each step is 1/{n} of the intended one" if n else
                         "whenever `accumulate_grad_batches` = N > 1 each micro-batch contributes loss / N² instead "
                         "of loss / N (gradient 1/N of the intended one)")
            elif kind == "value":
                match = [a for a in known if a == val and a > 1]
                if not match:
                    continue
                n = val
                n_txt = str(n)
                sev = Severity.ERROR
                arith = (f"with `accumulate_grad_batches={n}` each micro-batch contributes loss / {n * n} instead of "
                         f"loss / {n}, so the gradient of each step is 1/{n} of the intended one")
            else:  # a name mentioning accumulation: the Trainer must be passed the same name
                same = [t for t in trs if t.accumulate_arg is not None
                        and (dotted(t.accumulate_arg.value) or "").split(".")[-1] == val]
                if not same:
                    continue
                n = same[0].accumulate if isinstance(same[0].accumulate, int) else None
                if n == 1:
                    continue
                n_txt = str(n) if n else "N"
                sev = Severity.ERROR if n else Severity.WARNING
                arith = (f"each micro-batch contributes loss / {n * n} instead of loss / {n}" if n else
                         "each micro-batch contributes loss / N² instead of loss / N") + \
                    f" (`{text}` is also passed as `accumulate_grad_batches`)"
            ctx.report(
                div_node,
                f"`{cname}.training_step` returns the loss divided by `{text}` under automatic optimization, but "
                f"Lightning already divides the returned loss by `accumulate_grad_batches` ({ver}): {arith}. Return "
                f"the undivided loss.",
                severity=sev,
                data={"accumulate": n_txt, "module": cname},
            )


# ------------------------------------------------------------------------------- DeepSpeedStrategy config


def _deepspeed_config(ctx) -> None:
    for use in cf.deepspeed_uses(ctx):
        if use.framework != "lightning" or not isinstance(use.data, dict) or use.mutated:
            continue
        if "gradient_accumulation_steps" not in use.data:
            continue
        v = use.data.get("gradient_accumulation_steps")
        el = use.key_nodes.get(("gradient_accumulation_steps",))
        if el is not None:
            node, where = el, ""
        else:
            node = use.arg if use.arg is not None else use.call
            where = (f" ({os.path.basename(use.path)}:{use.doc.key_position(('gradient_accumulation_steps',))[0]})"
                     if use.doc is not None and use.path else "")
        ctx.report(
            node,
            f"The DeepSpeed config given to Lightning's `DeepSpeedStrategy` sets `gradient_accumulation_steps`="
            f"{v!r}{where}: Lightning raises `MisconfigurationException: Do not set `gradient_accumulation_steps` in "
            f"the DeepSpeed config as this will be set with the `accumulate_grad_batches` argument` "
            f"(on {_lightning_version(ctx)}). Remove the key and pass `Trainer(accumulate_grad_batches=N)`.",
            data={"gradient_accumulation_steps": v},
        )
