"""BL408 lightning-accumulation-conflict.

PyTorch Lightning 2.x (REFERENCE §4, ``exp_lightning_ga.out``):

* ``__verify_manual_optimization_support`` raises ``MisconfigurationException`` at ``fit()`` when a module with
  ``automatic_optimization = False`` runs under ``Trainer(accumulate_grad_batches != 1)`` or
  ``Trainer(gradient_clip_val > 0)``: manual optimization accumulates and clips by hand.
* Under automatic optimization Lightning divides the loss returned by ``training_step`` by
  ``accumulate_grad_batches`` itself; dividing again in ``training_step`` is reported as BL104 (loss-scaled-twice),
  not here (one mistake, one code).
* ``DeepSpeedStrategy`` raises "Do not set `gradient_accumulation_steps` in the DeepSpeed config" when the config it
  is given holds that key (``_format_batch_size_and_grad_accum_config``).

The module and the Trainer are linked through ``trainer.fit(model)`` (``model = MyModule(...)``), or, when the file
has exactly one LightningModule class and one Lightning Trainer, taken together. Trainer values that come from the
command line are not used.
"""

from __future__ import annotations

import os
import re
from bertlint._dataclass import dataclass, field
from typing import Any, Optional

import libcst as cst

from bertlint.analysis.walk import walk

from bertlint.analysis import configfiles as cf
from bertlint.analysis.symbols import UNKNOWN, call_name, dotted, kwarg, literal, positional
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


def _top_assign_false(stmts, names: tuple) -> Optional[cst.CSTNode]:
    """An unconditional ``<name> = False`` among ``stmts`` (not under if/for/try: a switch that only sometimes
    turns manual optimization on is not a certainty). A later unconditional ``= True`` cancels it."""
    found = None
    for stmt in stmts:
        if not isinstance(stmt, cst.SimpleStatementLine):
            continue
        for small in stmt.body:
            if isinstance(small, cst.Assign) and any(dotted(t.target) in names for t in small.targets):
                v = literal(small.value)
                found = small if v is False else None
    return found


def _manual_switch(cls: cst.ClassDef) -> Optional[cst.CSTNode]:
    """``automatic_optimization = False`` as a class attribute, ``self.automatic_optimization = False`` at the top
    level of ``__init__``, or an ``automatic_optimization`` property whose every return is False."""
    body = cls.body.body if isinstance(cls.body, cst.IndentedBlock) else []
    hit = _top_assign_false(body, ("automatic_optimization",))
    for stmt in body:
        if not isinstance(stmt, cst.FunctionDef):
            continue
        if stmt.name.value == "__init__" and isinstance(stmt.body, cst.IndentedBlock):
            h = _top_assign_false(stmt.body.body, ("self.automatic_optimization",))
            hit = h or hit
        elif stmt.name.value == "automatic_optimization":
            rets = []

            class R(cst.CSTVisitor):
                def visit_Return(self, r: cst.Return) -> None:
                    rets.append(r)

            walk(stmt, R())
            if rets and all(r.value is not None and literal(r.value) is False for r in rets):
                hit = hit or stmt
    return hit


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
    # (RULES.md: "loss-scaled-twice ... Lightning accumulate_grad_batches"): one mistake, one code.
    _deepspeed_config(ctx)
    _fabric_deepspeed(ctx)


def _fabric_deepspeed(ctx) -> None:
    """Fabric's ``DeepSpeedStrategy(config=cfg)`` with ``gradient_accumulation_steps`` N > 1 in ``cfg`` while the
    loop also accumulates by hand (``if (i + 1) % N == 0: optimizer.step()``). Fabric hands ``fabric.backward`` to
    ``engine.backward`` (which divides the loss by N) and ``optimizer.step()`` to ``engine.step()`` (which steps only
    at its own boundary, ``(micro_steps + 1) % N == 0``, counting its own calls): a hand gate then updates once per
    N² micro-batches, and a hand ``loss / N`` divides twice (REFERENCE §5, ``exp_deepspeed_ga.out``)."""
    src = ctx.source
    if "DeepSpeedStrategy" not in src or "%" not in src:
        return
    gate = _hand_step_gate(ctx)
    if gate is None:
        return
    for call, func, _cls in cf.all_calls(ctx):
        q = _qual(ctx, call.func)
        if not (q.endswith("DeepSpeedStrategy") and (".fabric" in q or q.startswith("lightning_fabric"))):
            continue
        cfg = kwarg(call, "config")
        if cfg is None:
            continue
        info = cf._resolve_config_arg(ctx, cfg, func)
        data = info["data"]
        if not isinstance(data, dict) or info["mutated"]:
            continue
        n = data.get("gradient_accumulation_steps")
        if isinstance(n, float) and n.is_integer():
            n = int(n)
        if isinstance(n, bool) or not isinstance(n, int) or n <= 1:
            continue
        when, sev = "", Severity.ERROR
        up = ctx.index.parent(call)
        if isinstance(up, cst.IfExp) and (up.body is call or up.orelse is call):
            test = ctx.module.code_for_node(up.test)
            v = ctx.resolver.value(up.test, func)
            taken = v if isinstance(v, bool) else None
            if up.orelse is call and taken is not None:
                taken = not taken
            when = f"When `{test}`{' (not at the values in the script)' if taken is False else ''}: "
            sev = Severity.WARNING
        row = ctx.span(gate)[0].row
        ctx.report(
            call,
            f"{when}Fabric's `DeepSpeedStrategy` is given a config with `gradient_accumulation_steps`={n}, so the "
            f"DeepSpeed engine accumulates itself — `fabric.backward` runs `engine.backward`, which divides the loss "
            f"by {n}, and `optimizer.step()` runs `engine.step()`, which updates only at its own boundary of {n} "
            f"calls — while the loop also accumulates by hand (`{ctx.module.code_for_node(gate.test)}`, line {row}): "
            f"the engine updates once per {n} × {n} = {n * n} micro-batches and a hand `loss / {n}` divides twice. "
            f"Fix: keep one accumulation — `gradient_accumulation_steps: 1` in the config with the hand gate, or "
            f"call `optimizer.step()` on every micro-batch without the gate or the manual division.",
            severity=sev,
            data={"accumulation": n, "gate_row": row},
        )


def _hand_step_gate(ctx):
    """An ``if`` whose test takes a remainder (``(i + 1) % N == 0``) and whose body steps an optimizer, inside a loop."""
    for node in ctx.index.of(cst.If):
        test = ctx.module.code_for_node(node.test)
        if "%" not in test:
            continue
        body = ctx.module.code_for_node(node.body)
        if not re.search(r"\b(opt|optim|optimizer|optimiser)\w*\.step\(", body):
            continue
        if any(isinstance(a, (cst.For, cst.While)) for a in ctx.index.ancestors(node)):
            return node
    return None


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
