"""Training-loop discovery: which loops the dry run runs (BL1xx, BL2xx).

What a loop *does* — how often each call runs, the accumulation factor N it runs with, its windows — is the dry
run's (``bertlint/analysis/dryrun.py`` executes the body abstractly into a ``bertlint/trace.py`` trace); the loop
rules are invariants over that trace. This module only finds the loops:

- a *training loop* is a ``for`` / ``while`` loop whose body runs a backward — directly, or through a function or
  method defined in the same file (or a sibling module of the project) — and that contains no inner loop that itself
  runs the backward (that inner loop is then the micro-batch loop and the outer one is the epoch loop); the
  window-loop shape (``for micro in range(N): ... backward`` then the step in the parent) is modelled on the parent;
- for each loop, its backwards and optimizer steps in program order (:class:`Event`, with the ``accumulate()``
  context around them and the same-file functions they were reached through) — no condition is read: who owns
  accumulation (:attr:`TrainingLoop.owner`), whether the loop steps, its callees, its index.

Receivers are classified by :mod:`bertlint.analysis.roles` (roles from usage; a name only as its last, low-confidence
hint); the set-up facts of the file (what the Accelerator is built with, prepared names, DDP / Lightning calls) are
:class:`bertlint.analysis.accum.Setup`'s, reachable here as attributes. Anything the analysis cannot understand yields
no loops, never an exception.

API (``ctx.loops`` is a :class:`FileLoops`)::

    for loop in ctx.loops:                     # TrainingLoop: node, func, cls, outer, window_of, index, callees
        loop.owner                             # plain | accelerate | accelerate-manual | deepspeed | fabric | ...
        loop.steps, loop.backwards, loop.of(kind)
    ctx.loops.receiver_kind(recv, func)        # (optimizer | scheduler | scaler | accelerator | engine ..., confident)
    ctx.loops.accelerator_ga                   # (accum.Setup) AccumFactor of Accelerator / plugins, None: not configured
    ctx.loops.callee(call, func, cls)          # the same-file (or sibling-module) function a call runs
"""

from __future__ import annotations

from bertlint._dataclass import dataclass, field
from typing import Iterator, Optional, Union

import libcst as cst

from bertlint.analysis import accum
from bertlint.analysis.symbols import Resolver, SymbolTable, call_name, code_of, dotted, kwarg, positional
from bertlint.analysis.walk import SCOPE_TYPES as _SCOPE_TYPES
from bertlint.analysis.walk import assigned_names as _assigned_names
from bertlint.analysis.walk import children as iter_children
from bertlint.analysis.walk import scope_calls
from bertlint.analysis.walk import scope_nodes as walk

LoopNode = Union[cst.For, cst.While]

# library functions that clip the gradients in place (the norm / value over ``parameters``): torch's, and timm's
# adaptive gradient clipping (AGC, relative to each parameter's norm) and clip dispatcher (timm/utils/agc.py,
# timm/utils/clip_grad.py)
CLIP_QUALNAMES = frozenset({
    "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad_norm", "timm.utils.agc.adaptive_clip_grad", "timm.utils.adaptive_clip_grad",
    "timm.utils.clip_grad.dispatch_clip_grad", "timm.utils.dispatch_clip_grad",
})

# the set-up facts read through ``ctx.loops`` (accum.Setup)
_SETUP_FACTS = frozenset({
    "prepared", "prepare_funcs", "accelerator_calls", "accelerator_ga", "accelerator_ga_unknown",
    "accelerator_deepspeed", "ddp_wrapped", "ddp_calls", "lightning_trainer_calls", "scheduler_defs", "scaler_defs",
    "no_sync_used", "factor", "int_value", "from_cli", "units_of",
})


# ---------------------------------------------------------------------------------------------- data model
@dataclass
class Event:
    """A backward or an optimizer step the training loop makes (see ``_LoopWalker``)."""

    kind: str  # backward | opt_step | scaler_step | engine_step
    call: cst.Call
    seq: int
    receiver: Optional[str] = None  # "optimizer", "scaler", "accelerator"
    receiver_kind: Optional[str] = None  # the receiver's role (optimizer, scaler, engine ...)
    confident: bool = True  # False when the receiver's role rests on its name only
    in_accumulate: bool = False
    via: tuple[str, ...] = ()  # same-file functions the call was reached through
    backward_style: Optional[str] = None  # tensor | scaler | accelerator | engine | fabric | lightning | autograd

    @property
    def name(self) -> str:
        return call_name(self.call) or code_of(self.call.func)


@dataclass
class Index:
    name: str
    start: Optional[int]  # first value seen at the top of the body (enumerate start, range start)
    source: str  # "enumerate" | "range"


@dataclass
class TrainingLoop:
    node: LoopNode
    func: Optional[cst.FunctionDef]
    cls: Optional[cst.ClassDef]
    events: list[Event] = field(default_factory=list)
    index: Optional[Index] = None
    outer: list[LoopNode] = field(default_factory=list)
    accumulate_calls: list = field(default_factory=list)  # the ``accelerator.accumulate(...)`` calls
    callees: list = field(default_factory=list)  # same-file functions walked as part of the body
    window_of: Optional[cst.CSTNode] = None  # window-loop style: the inner micro-batch loop
    file: Optional["FileLoops"] = None
    assigned: set = field(default_factory=set)  # names assigned in the loop body

    # ---------------------------------------------------------------- queries
    def of(self, *kinds: str) -> list[Event]:
        return [e for e in self.events if e.kind in kinds]

    @property
    def backwards(self) -> list[Event]:
        return self.of("backward")

    @property
    def steps(self) -> list[Event]:
        """The optimizer-step events (``optimizer.step()`` or ``scaler.step(optimizer)``)."""
        return self.of("opt_step", "scaler_step")

    @property
    def owner(self) -> str:
        """Who owns accumulation: accelerate | deepspeed | fabric | lightning | trainer | plain."""
        bw = self.backwards
        if any(e.in_accumulate for e in self.events):
            return "accelerate"
        if any(e.backward_style == "engine" for e in bw):
            return "deepspeed"
        if any(e.backward_style == "lightning" for e in bw):
            return "lightning"
        if self.cls is not None and self.file is not None and self.file.family(self.cls) == "trainer":
            return "trainer"
        if any(e.backward_style == "fabric" for e in bw):
            return "fabric"
        if any(e.backward_style == "accelerator" for e in bw):
            if self.file is not None and self.file.accumulate_elsewhere(self):
                return "unknown"  # an accumulate() context we could not place (entered through a variable, ...)
            return "accelerate-manual"
        return "plain"


# ---------------------------------------------------------------------------------------------- the file
class FileLoops:
    """All training loops of one file. Iterating yields the loops; the file's set-up facts (``accum.Setup``) read as
    attributes (``accelerator_ga``, ``prepared`` ...)."""

    def __init__(self, module: cst.Module, symbols: SymbolTable, resolver: Resolver, roles=None) -> None:
        self.module = module
        self.t = symbols
        self.r = resolver
        if roles is None:
            from bertlint.analysis import roles as _roles

            roles = _roles.build(symbols)
        self.roles = roles
        self.setup = accum.Setup(symbols, resolver, roles)
        self.loops: list[TrainingLoop] = []
        self._backward_memo: dict[int, bool] = {}
        self._kinds: dict[tuple, tuple] = {}
        self.multi_backward: set = set()  # ids of loops run inside one micro-batch, each iteration a backward
        try:
            self._build_loops()
        except RecursionError:
            self.loops = []

    def __getattr__(self, name: str):
        if name in _SETUP_FACTS and "setup" in self.__dict__:
            return getattr(self.__dict__["setup"], name)
        raise AttributeError(name)

    def __iter__(self) -> Iterator[TrainingLoop]:
        return iter(self.loops)

    def __len__(self) -> int:
        return len(self.loops)

    # ------------------------------------------------------------------ roles
    def receiver_kind(self, recv: Optional[str], func=None) -> tuple[Optional[str], bool]:
        """(kind, confident) of a receiver text such as ``optimizer`` or ``self.scheduler``, by roles from usage
        (``Roles.receiver_kind``); (None, False) when it is none of the training machinery's kinds or unknown."""
        if not recv:
            return None, False
        key = (recv, id(func))
        v = self._kinds.get(key)
        if v is None:
            try:
                v = self.roles.receiver_kind(recv, func)
            except Exception:
                v = (None, False)
            self._kinds[key] = v
        return v

    def family(self, cls: Optional[cst.ClassDef]) -> Optional[str]:
        """The framework family a class's bases reach (``Roles.class_family``: trainer, lightning_module ...)."""
        try:
            return self.roles.class_family(cls)
        except Exception:
            return None

    def is_lightning_module(self, cls: cst.ClassDef) -> bool:
        return self.family(cls) == "lightning_module"

    def prepared_for(self, loop: "TrainingLoop") -> bool:
        """An ``accelerator.prepare(...)`` runs in the loop's function, its class, or at module level."""
        for fn in self.setup.prepare_funcs:
            if fn is None or fn is loop.func:
                return True
            if loop.cls is not None and self.class_of(fn) is loop.cls:
                return True
        return False

    def accumulate_elsewhere(self, loop: "TrainingLoop") -> bool:
        """The file calls ``<accelerator>.accumulate(...)`` somewhere this loop's walk did not see."""
        seen = {id(c) for c in loop.accumulate_calls}
        for call, name, func in self.t.calls:
            if name.endswith(".accumulate") and id(call) not in seen:
                if self.receiver_kind(name.rsplit(".", 1)[0], func)[0] == "accelerator":
                    return True
        return False

    # ------------------------------------------------------------------ functions reachable from a call
    def callee(self, call: cst.Call, func: Optional[cst.FunctionDef], cls: Optional[cst.ClassDef]):
        """The same-file function a call runs, or None (never guess between several); then a function of the
        project's own sibling modules (``bertlint.analysis.project``: imported, or the ``__call__`` / method of an
        instance of an imported class, or a method inherited from a sibling's class)."""
        xp = self.__dict__.get("xp", False)
        if xp is False:
            from bertlint.analysis import project

            xp = self.xp = project.for_module(self.module)
        if xp is not None and xp.foreign_call(call):
            return xp.callee(call, func, cls, self)
        f = call.func
        tf = type(f)  # exact type tests: isinstance through ABCMeta is slow
        if tf is cst.Name:
            defs = self.t.module_funcs.get(f.value, [])
            if len(defs) == 1:
                return defs[0]
            if defs:
                return None
        elif (
            tf is cst.Attribute
            and type(f.value) is cst.Name
            and f.value.value == "self"
            and cls is not None
        ):
            m = self.t.class_methods.get(cls.name.value, {}).get(f.attr.value)
            if m is not None:
                return m
            m = self._inherited(cls.name.value, f.attr.value)
            if m is not None:
                return m
        return xp.callee(call, func, cls, self) if xp is not None else None

    def _inherited(self, cname: str, meth: str, _depth: int = 0):
        """``meth`` of a base class of ``cname`` defined in this file (first base first, depth-first, as Python's
        MRO for single inheritance), when ``cname`` does not define it; None when a base is not of this file."""
        if _depth > 5:
            return None
        for b in self.t.class_bases.get(cname, []):
            if b not in self.t.classes or b == cname:
                return None  # an unknown (imported) base may define it first: unknown stays unknown
            m = self.t.class_methods.get(b, {}).get(meth)
            if m is not None:
                return m
            m = self._inherited(b, meth, _depth + 1)
            if m is not None:
                return m
        return None

    _RELEVANT_ATTRS = frozenset({
        "backward", "manual_backward", "step", "zero_grad", "clip_grad_norm_", "clip_grad_value_", "clip_gradients",
        "unscale_", "update", "scale", "no_sync", "no_backward_sync", "accumulate",
    })

    def relevant(self, fn: cst.FunctionDef, cls, _seen: Optional[set] = None) -> bool:
        """Does a same-file function (transitively) make any call the loop model records? Others are not
        expanded at call sites, which keeps the walk linear in practice."""
        memo = self.__dict__.setdefault("_relevant_memo", {})
        key = id(fn)
        if key in memo:
            return memo[key]
        seen = _seen if _seen is not None else set()
        if key in seen:
            return False
        seen.add(key)
        res = False
        calls = []
        for n in walk(fn.body):
            tp = type(n)
            if tp is cst.Call:
                calls.append(n)
            elif (tp is cst.BinaryOperation and type(n.operator) in (cst.Divide, cst.FloorDivide)) or (
                tp is cst.AugAssign and type(n.operator) is cst.DivideAssign
            ):
                res = True  # a loss division the rules need to see
            elif tp is cst.AugAssign and type(n.target) is cst.Attribute and n.target.attr.value in ("grad", "data") \
                    and "grad" in (dotted(n.target) or ""):
                res = True  # ``p.grad *= scaler``: a gradient rescale (``scale_grads(model, 1 / num_tokens)``)
        for c in calls:
            if res:
                break
            if isinstance(c.func, cst.Attribute) and c.func.attr.value in self._RELEVANT_ATTRS:
                res = True
                break
        if not res:
            fcls = self.class_of(fn) or cls
            for c in calls:
                g = self.callee(c, fn, fcls)
                if g is not None and self.relevant(g, fcls, seen):
                    res = True
                    break
        memo[key] = res
        return res

    def class_of(self, func: Optional[cst.FunctionDef]) -> Optional[cst.ClassDef]:
        if func is None:
            return None
        c = self.t.method_class.get(id(func))
        if c is None and self.__dict__.get("xp"):
            c = self.xp.class_of(func)  # a method of a sibling module's class
        return c

    # ------------------------------------------------------------------ loops
    def _build_loops(self) -> None:
        found: list[tuple[LoopNode, Optional[cst.FunctionDef], Optional[cst.ClassDef], list[LoopNode]]] = []
        for node, func, outer in self.t.loop_nodes:
            cls = self.t.method_class.get(id(func)) if func is not None else None
            if self._has_backward(node.body, cls, 0, set(), func):
                found.append((node, func, cls, outer))
        with_bw_ids = {id(n) for n, *_ in found}
        promoted: set = set()  # parent loops whose own counter gates the step (their inner loop: backwards per batch)
        for node, func, cls, outer in found:
            if outer and id(outer[-1]) not in promoted and _gated_on_parent(node, outer[-1], self, func):
                promoted.add(id(outer[-1]))
                self.multi_backward.add(id(node))
        for node, func, cls, outer in found:
            if id(node) in promoted:
                # ``for step, batch in enumerate(loader): for task in tasks: ...backward()`` with the step gated
                # on ``step``: the outer loop is the micro-batch loop, the inner one runs several backwards of it
                loop = TrainingLoop(node, func, cls, outer=[o for o in outer if id(o) in with_bw_ids], file=self)
                _LoopWalker(self, loop).run()
                self.loops.append(loop)
                continue
            # an outer (epoch) loop: an inner loop runs the backward
            if any(any(x is node for x in o) for _, _, _, o in found):
                continue
            if id(node) in self.multi_backward:
                continue
            loop = TrainingLoop(node, func, cls, outer=[o for o in outer if id(o) in with_bw_ids], file=self)
            _LoopWalker(self, loop).run()
            if not loop.of("opt_step", "scaler_step", "engine_step") and outer:
                window = self._window_model(loop, outer[-1], func, cls, outer[:-1], with_bw_ids)
                if window is not None:
                    self.loops.append(window)
                    continue
            self.loops.append(loop)

    def _window_model(self, inner: "TrainingLoop", parent: LoopNode, func, cls, outer, with_bw_ids):
        """``for step ...: for micro in range(N): ...backward()`` then ``optimizer.step()`` in the parent: model the
        parent loop, events inside the micro-batch loop run per micro-batch, the others once per window."""
        if not isinstance(inner.node, (cst.For, cst.While)):
            return None
        w = TrainingLoop(parent, func, cls, outer=[o for o in outer if id(o) in with_bw_ids], file=self)
        w.window_of = inner.node
        _LoopWalker(self, w).run()
        if not w.of("opt_step", "scaler_step", "engine_step"):
            return None
        return w

    def _has_backward(self, node: cst.CSTNode, cls, depth: int, seen: set, func=None) -> bool:
        key = id(node)
        if key in self._backward_memo:
            return self._backward_memo[key]
        calls = scope_calls(node)
        res = False
        for call in calls:
            if backward_style(call, self, func) is not None:
                res = True
                break
        if not res and depth < 3:
            for call in calls:
                fn = self.callee(call, func, cls)
                if fn is not None and id(fn) not in seen:
                    seen.add(id(fn))
                    if self._has_backward(fn.body, self.class_of(fn) or cls, depth + 1, seen, fn):
                        res = True
                        break
        self._backward_memo[key] = res
        return res


def _gated_on_parent(inner: LoopNode, parent: LoopNode, f=None, func=None) -> bool:
    """Is the optimizer step of this loop nest gated on the parent loop's own counter, with the inner loop running
    backwards only? ``for step, batch in enumerate(dl): for task in tasks: loss.backward()`` then ``if (step + 1) %
    N == 0: optimizer.step()`` (in the parent, or inside the inner loop): the parent's iterations are the micro-batches
    the gate counts, the inner loop is several backwards of one micro-batch (one per task / dataset), not a window.
    Only a modulo on a name the parent binds (its target, or a counter it assigns outside the inner loop) that the
    inner loop neither binds nor assigns; a window loop (``for micro in range(N)`` with an ungated step after it)
    keeps the window model."""
    if not isinstance(parent, cst.For) or not isinstance(inner, (cst.For, cst.While)):
        return False
    inner_names = set(_assigned_names(inner.body))
    if isinstance(inner, cst.For):
        inner_names |= {n.value for n in walk(inner.target) if type(n) is cst.Name}
    parent_names = {n.value for n in walk(parent.target) if type(n) is cst.Name}
    inner_ids = {id(n) for n in walk(inner)}
    for n in walk(parent.body):
        if id(n) in inner_ids and n is not inner:
            continue
        if type(n) is cst.AugAssign and type(n.target) is cst.Name:
            parent_names.add(n.target.value)
    parent_names -= inner_names
    if not parent_names:
        return False
    for n in walk(parent.body):
        if type(n) is not cst.If:
            continue
        mods = [m for m in walk(n.test) if type(m) is cst.BinaryOperation and type(m.operator) is cst.Modulo]
        if not mods:
            continue
        read = {x.value for m in mods for x in walk(m.left) if type(x) is cst.Name}
        if not read & parent_names or read & inner_names:
            continue
        for c in walk(n.body):
            if type(c) is cst.Call and isinstance(c.func, cst.Attribute) and c.func.attr.value == "step":
                rname = dotted(c.func.value)
                if f is not None and rname is not None and f.receiver_kind(rname, func)[0] == "scheduler":
                    continue  # ``if step % eval_every == 0: scheduler.step(metric)``: not the update
                return True
    return False


def backward_style(call: cst.Call, f: FileLoops, func=None, kind=None) -> Optional[str]:
    """How this call runs a backward, or None: ``loss.backward()`` (tensor), ``scaler.scale(loss).backward()``,
    ``X.backward(loss)`` by the role of X (accelerator, engine, fabric, an optimizer wrapper's ``backward(loss)``;
    a scheduler / scaler's ``backward`` is none; anything else ``engine-like``, which the dry run decides from what X is),
    ``torch.autograd.backward``, Lightning's ``manual_backward``. ``kind(recv, func)``: the receiver classifier
    (default ``f.receiver_kind``; the dry run's also reads a sibling module's roles in that module's functions)."""
    fn = call.func
    if not isinstance(fn, cst.Attribute):
        return None
    attr = fn.attr.value
    if attr == "manual_backward":
        return "lightning"
    if attr != "backward":
        return None
    recv = fn.value
    if (f.t.qualname(fn) or "") == "torch.autograd.backward":
        return "autograd"
    rname = dotted(recv)
    npos = sum(1 for a in call.args if a.keyword is None and not a.star)
    if rname is not None:
        k = (kind or f.receiver_kind)(rname, func)[0]
        if k in ("accelerator", "engine", "fabric"):
            return k
        if k == "optimizer" and npos >= 1:
            # ``optimizer.backward(loss)``: a mixed-precision optimizer wrapper's backward (apex FP16_Optimizer,
            # fairseq's FP16Optimizer, OpenNMT's Optimizer) back-propagates ``loss`` times its own loss scale and
            # undoes that scale in its step: a backward of ``loss``
            return "optimizer"
        if k in ("optimizer", "scheduler", "scaler"):
            return None
        if npos >= 1:
            return "engine-like" if rname.split(".")[-1] not in ("torch", "autograd") else "autograd"
    if isinstance(recv, cst.Call):
        inner = recv.func
        if isinstance(inner, cst.Attribute) and inner.attr.value == "scale":
            return "scaler"
    if npos == 0 or all(a.keyword is not None for a in call.args):
        return "tensor"
    return None


# ---------------------------------------------------------------------------------------------- the walk
class _LoopWalker:
    """The backwards and optimizer steps a training loop makes (directly and through the same-file functions it
    calls), in program order, with the ``accumulate()`` context around them: what the dry run starts from (who owns
    accumulation, whether the loop steps, its callees and index). No condition is read here: when each call runs,
    and how often, is the dry run's (``bertlint/analysis/dryrun.py``)."""

    # calls of the training machinery: recorded (backward, step) or known, never descended into
    _MACHINERY = frozenset({"zero_grad", "clip_grad_norm_", "clip_grad_value_", "clip_gradients", "unscale_", "update",
                            "scale"})

    def __init__(self, f: FileLoops, loop: TrainingLoop) -> None:
        self.f = f
        self.loop = loop
        self.seq = 0
        loop.assigned = _assigned_names(loop.node)

    def run(self) -> None:
        loop = self.loop
        self._index()
        self._block(_body_list(loop.node.body), False, (), loop.cls, loop.func, 0)

    # -------------------------------------------------------------- index
    def _index(self) -> None:
        node = self.loop.node
        if not isinstance(node, cst.For):
            return
        it = node.iter
        tgt = node.target
        if isinstance(it, cst.Call):
            name = call_name(it) or ""
            if name == "enumerate" and isinstance(tgt, (cst.Tuple, cst.List)) and tgt.elements:
                idx = dotted(tgt.elements[0].value)
                start_e = positional(it, 1) or kwarg(it, "start")
                start = 0 if start_e is None else self.f.r.int_value(start_e, self.loop.func)
                if idx:
                    self.loop.index = Index(idx, start, "enumerate")
            elif name == "range" and isinstance(tgt, cst.Name):
                start = 0
                if len([a for a in it.args if a.keyword is None]) >= 2:
                    start = self.f.r.int_value(positional(it, 0), self.loop.func)
                self.loop.index = Index(tgt.value, start, "range")

    # -------------------------------------------------------------- statements
    def _block(self, stmts, acc, via, cls, func, depth) -> None:
        for stmt in stmts:
            self._stmt(stmt, acc, via, cls, func, depth)

    def _stmt(self, stmt, acc, via, cls, func, depth) -> None:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                self._exprs(small, acc, via, cls, func, depth)
            return
        if isinstance(stmt, cst.If):
            self._exprs(stmt.test, acc, via, cls, func, depth)
            self._block(_body_list(stmt.body), acc, via, cls, func, depth)
            if stmt.orelse is not None:
                if isinstance(stmt.orelse, cst.If):
                    self._stmt(stmt.orelse, acc, via, cls, func, depth)
                else:
                    self._block(_body_list(stmt.orelse.body), acc, via, cls, func, depth)
            return
        if isinstance(stmt, cst.With):
            a2 = acc
            for item in stmt.items:
                self._exprs(item.item, acc, via, cls, func, depth)
                for call in _calls_of(item.item):
                    nm = call_name(call) or ""
                    if nm.endswith(".accumulate") and isinstance(call.func, cst.Attribute):
                        if self.f.receiver_kind(dotted(call.func.value), func)[0] == "accelerator":
                            a2 = True
                            self.loop.accumulate_calls.append(call)
            self._block(_body_list(stmt.body), a2, via, cls, func, depth)
            return
        if isinstance(stmt, (cst.For, cst.While)):
            self._exprs(stmt.iter if isinstance(stmt, cst.For) else stmt.test, acc, via, cls, func, depth)
            self._block(_body_list(stmt.body), acc, via, cls, func, depth)
            return
        if isinstance(stmt, cst.Try):
            self._block(_body_list(stmt.body), acc, via, cls, func, depth)
            for h in stmt.handlers:
                self._block(_body_list(h.body), acc, via, cls, func, depth)
            if stmt.orelse is not None:
                self._block(_body_list(stmt.orelse.body), acc, via, cls, func, depth)
            if stmt.finalbody is not None:
                self._block(_body_list(stmt.finalbody.body), acc, via, cls, func, depth)
            return
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return
        for child in stmt.children:  # match statements and anything else: their bodies
            if isinstance(child, cst.BaseSuite):
                self._block(_body_list(child), acc, via, cls, func, depth)

    def _exprs(self, node, acc, via, cls, func, depth) -> None:
        """The calls inside an expression / small statement, in evaluation order (arguments first)."""
        for sub in _walk_calls(node):
            self._call(sub, acc, via, cls, func, depth)

    def _call(self, call, acc, via, cls, func, depth) -> None:
        f = self.f
        loop = self.loop
        attr = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        recv = dotted(call.func.value) if attr is not None else None
        kind = None
        rkind, conf = None, True
        bstyle = backward_style(call, f, func)
        if bstyle is not None:
            kind = "backward"
        elif attr is not None and (attr == "step" or attr in self._MACHINERY):
            rkind, conf = f.receiver_kind(recv, func)
            if attr == "step":
                kind = {"optimizer": "opt_step", "ds_optimizer": "opt_step", "engine": "engine_step",
                        "scaler": "scaler_step"}.get(rkind or "")
                if kind is None and rkind in ("scheduler", "ds_scheduler"):
                    return  # a scheduler's step
            elif attr in ("zero_grad", "clip_gradients") or (rkind == "scaler" and attr in ("scale", "unscale_", "update")) \
                    or (rkind == "accelerator" and attr.startswith("clip_grad")) \
                    or (f.t.qualname(call.func) or "") in CLIP_QUALNAMES:
                return  # the other calls of the machinery (clears, clips, the scaler's calls): nothing to descend into
        if kind is not None:
            self.seq += 1
            loop.events.append(Event(kind, call, self.seq, receiver=recv, receiver_kind=rkind,
                                     confident=conf if kind != "backward" else True, in_accumulate=acc,
                                     via=tuple(via), backward_style=bstyle))
            return
        # descend into same-file functions
        if depth < 3:
            fn = f.callee(call, func, cls)
            if fn is not None and fn.name.value not in via and fn is not loop.func and f.relevant(fn, cls):
                fcls = f.class_of(fn) or cls
                if fn not in loop.callees:
                    loop.callees.append(fn)
                self._block(_body_list(fn.body), acc, via + (fn.name.value,), fcls, fn, depth + 1)


def _body_list(suite) -> list:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    if isinstance(suite, cst.SimpleStatementSuite):
        return [suite]
    return []


def _walk_calls(node: cst.CSTNode) -> list[cst.CSTNode]:
    """Calls in post-order (arguments before the call), no nested scopes."""
    out: list[cst.CSTNode] = []

    def rec(n: cst.CSTNode, depth: int) -> None:
        tp = type(n)
        if depth > 200 or (tp in _SCOPE_TYPES and n is not node):
            return
        for c in iter_children(n):
            rec(c, depth + 1)
        if tp is cst.Call:
            out.append(n)

    rec(node, 0)
    return out


def _calls_of(node: cst.CSTNode) -> list[cst.Call]:
    return scope_calls(node)


def build(ctx) -> FileLoops:
    from bertlint.analysis import project

    project.of(ctx)  # FileLoops.callee follows calls into the project's own sibling modules
    return FileLoops(ctx.module, ctx.symbols, ctx.resolver, ctx.roles)
