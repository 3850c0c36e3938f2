"""Training-loop discovery and the per-file set-up facts the dry run starts from (BL1xx, BL2xx).

What a loop *does* — how often each call runs, the accumulation factor N it runs with, its windows — is the dry
run's (``bertlint/analysis/dryrun.py`` executes the body abstractly into a ``bertlint/trace.py`` trace); the loop
rules are invariants over that trace. This module finds the loops the dry run runs, and the facts of the file
around them:

- a *training loop* is a ``for`` / ``while`` loop whose body runs a backward — directly, or through a function or
  method defined in the same file (or a sibling module of the project) — and that contains no inner loop that itself
  runs the backward (that inner loop is then the micro-batch loop and the outer one is the epoch loop); the
  window-loop shape (``for micro in range(N): ... backward`` then the step in the parent) is modelled on the parent;
- for each loop, the calls it makes in program order (:class:`Event`: backward / step / zero_grad / clip / scaler /
  engine calls, with the ``accumulate()`` / ``no_sync()`` context around them and the same-file functions they were
  reached through) — no condition is read: who owns accumulation (:attr:`TrainingLoop.owner`), whether the loop
  steps, its callees, its index;
- the file-level facts: the receivers table (constructors, ``prepare`` / ``deepspeed.initialize`` unpacking; the
  fallback after ``ctx.roles``, roles from usage), what the Accelerator / GradScaler / schedulers are built with,
  schedule-length units (``units_of``).

Everything is resolved from the import table of :mod:`bertlint.analysis.symbols`. Anything the analysis cannot
understand yields no facts, never an exception.

API (``ctx.loops`` is a :class:`FileLoops`)::

    for loop in ctx.loops:                     # TrainingLoop: node, func, cls, outer, window_of, index, callees
        loop.owner                             # plain | accelerate | accelerate-manual | deepspeed | fabric | ...
        loop.steps, loop.backwards, loop.of(kind)
    ctx.loops.kinds                            # variable -> optimizer | scheduler | scaler | accelerator | engine ...
    ctx.loops.accelerator_ga                   # AccumFactor of Accelerator / plugins, None when not configured
    ctx.loops.accelerator_deepspeed            # the DeepSpeedPlugin expression, if any
    ctx.loops.deepspeed_initialize             # deepspeed.initialize(...) calls
    ctx.loops.units_of(expr, func)             # optimizer-steps | micro-batches | unknown
"""

from __future__ import annotations

import re
from bertlint._dataclass import dataclass, field
from typing import Iterator, Optional, Union

import libcst as cst

from bertlint.analysis.symbols import (
    SymbolTable,
    Resolver,
    call_name,
    code_of,
    dotted,
    kwarg,
    positional,
)

LoopNode = Union[cst.For, cst.While]

from bertlint.analysis.walk import SCOPE_TYPES as _SCOPE_TYPES
from bertlint.analysis.walk import assigned_names as _assigned_names
from bertlint.analysis.walk import children as iter_children
from bertlint.analysis.walk import names_in as _names_in
from bertlint.analysis.walk import scope_nodes as walk

# names that denote an accumulation factor
ACCUM_RE = re.compile(
    r"accum|grad_acc|gradient_acc|(^|[._])gas($|[._])|(^|[._])ga_steps|update_freq|accumulate_grad_batches|"
    r"(^|[._])n_accum|micro_steps_per|(^|[._])accum_iter",
    re.IGNORECASE,
)

OPT_NAME_RE = re.compile(r"^(opt|optim|optimizer|optimiser|.*_optimizer|optimizer_.*|.*_opt)$", re.IGNORECASE)
SCHED_NAME_RE = re.compile(r"^(sched|scheduler|lr_scheduler|.*_scheduler|scheduler_.*|lr_sched|.*_sched)$", re.I)
SCALER_NAME_RE = re.compile(r"^(scaler|grad_scaler|.*_scaler|amp_scaler)$", re.IGNORECASE)
ACCEL_NAME_RE = re.compile(r"^(accelerator|accel)$")
ENGINE_NAME_RE = re.compile(r"^(engine|model_engine|ds_engine|deepspeed_engine|ds_model)$")

_OPT_MODULES = (
    "torch.optim.",
    "bitsandbytes.optim.",
    "deepspeed.ops.adam.",
    "deepspeed.ops.lamb.",
    "apex.optimizers.",
    "transformers.optimization.Adafactor",
    "transformers.optimization.AdamW",
    "transformers.AdamW",
    "transformers.Adafactor",
    "torch_optimizer.",
    "timm.optim.",
    "lion_pytorch.",
)


# ---------------------------------------------------------------------------------------------- data model
@dataclass
class AccumFactor:
    """An accumulation factor: the expression, its source text and its value when it resolves."""

    text: str
    value: Optional[int]  # resolved integer, None when unknown
    source: str  # "gate" | "division" | "accelerator" | "plugin" | "deepspeed-plugin" | "trainer" | ...
    expr: Optional[cst.BaseExpression] = field(default=None, repr=False)
    # recognised by its name alone (``loss / args.grad_accum`` with no step gate, setting or window using it): a hint
    # that may word a message or lower a severity (``_ga.treport``), never what decides a finding's existence alone
    by_name: bool = False

    @property
    def shown(self) -> str:
        """``args.gradient_accumulation_steps`` (= 8), or the text alone when unresolved."""
        if self.value is not None and self.text != str(self.value):
            return f"`{self.text}` (= {self.value})"
        return f"`{self.text}`"

    @property
    def n(self) -> str:
        return str(self.value) if self.value is not None else self.text

    def is_more_than_one(self) -> Optional[bool]:
        """True when > 1, False when resolved to 1 (or 0), None when unknown."""
        if self.value is None:
            return None
        return self.value > 1


@dataclass
class Event:
    """A call the training loop makes (see ``_LoopWalker``)."""

    kind: str
    # backward | opt_step | opt_zero | model_zero | sched_step | clip | scaler_scale | scaler_unscale | scaler_step
    # | scaler_update | engine_step | engine_zero
    call: cst.Call
    seq: int
    receiver: Optional[str] = None  # "optimizer", "scaler", "accelerator"
    receiver_kind: Optional[str] = None  # kind of the receiver (optimizer, scheduler, scaler, accelerator, engine ...)
    confident: bool = True  # False when the receiver was recognised by its name only
    in_accumulate: bool = False
    in_no_sync: bool = False
    via: tuple[str, ...] = ()  # same-file functions the call was reached through
    backward_style: Optional[str] = None  # tensor | scaler | accelerator | engine | fabric | lightning | autograd

    @property
    def name(self) -> str:
        return call_name(self.call) or code_of(self.call.func)


@dataclass
class Index:
    name: str
    start: Optional[int]  # first value seen at the top of the body (enumerate start, range start, counter init)
    source: str  # "enumerate" | "range" | "counter"


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
        if self.cls is not None and self.file is not None and self.file.is_trainer_class(self.cls):
            return "trainer"
        if any(e.backward_style == "fabric" for e in bw):
            return "fabric"
        if any(e.backward_style == "accelerator" for e in bw):
            if self.file is not None and self.file.accumulate_elsewhere(self):
                return "unknown"  # an accumulate() context we could not place (entered through a variable, ...)
            return "accelerate-manual"
        return "plain"


# ---------------------------------------------------------------------------------------------- collection
class _Collector:
    """One walk: loops with their function / class, tuple-unpacking assignments, calls of interest."""

    def __init__(self) -> None:
        self.loops: list[tuple[LoopNode, Optional[cst.FunctionDef], Optional[cst.ClassDef], list[LoopNode]]] = []
        self.unpacks: list[tuple[list[Optional[str]], cst.Call, Optional[cst.FunctionDef]]] = []
        self.calls: list[tuple[cst.Call, str, Optional[cst.FunctionDef]]] = []
        self.method_class: dict[int, cst.ClassDef] = {}
        self.class_methods: dict[str, dict[str, cst.FunctionDef]] = {}
        self.module_funcs: dict[str, list[cst.FunctionDef]] = {}
        self.exotic = False  # exec/eval present

    def from_symbols(self, t) -> None:
        self.method_class = t.method_class
        self.class_methods = t.class_methods
        self.module_funcs = t.module_funcs
        self.unpacks = t.unpacks
        self.calls = t.calls
        self.exotic = any(name in ("exec", "eval") for _, name, _ in t.calls)
        for node, func, outer in t.loop_nodes:
            cls = self.method_class.get(id(func)) if func is not None else None
            self.loops.append((node, func, cls, outer))

    def run(self, module: cst.Module) -> None:
        # explicit stack: (node, scope (FunctionDef | ClassDef | None), func, loops enclosing it in its function)
        stack: list = [(module, None, None, ())]
        ClassDef, FunctionDef, For, While, Assign, Call = (cst.ClassDef, cst.FunctionDef, cst.For, cst.While,
                                                          cst.Assign, cst.Call)
        while stack:
            node, scope, func, loops = stack.pop()
            tp = type(node)
            if tp is ClassDef:
                self.class_methods.setdefault(node.name.value, {})
                kids_scope, kids_func, kids_loops = node, func, ()
            elif tp is FunctionDef:
                if type(scope) is ClassDef:
                    self.method_class[id(node)] = scope
                    self.class_methods[scope.name.value][node.name.value] = node
                elif scope is None:
                    self.module_funcs.setdefault(node.name.value, []).append(node)
                kids_scope, kids_func, kids_loops = node, node, ()
            elif tp is For or tp is While:
                cls = self.method_class.get(id(func)) if func is not None else None
                self.loops.append((node, func, cls, list(loops)))
                kids_scope, kids_func, kids_loops = scope, func, loops + (node,)
            else:
                kids_scope, kids_func, kids_loops = scope, func, loops
                if tp is Assign and type(node.value) is Call:
                    for t in node.targets:
                        if isinstance(t.target, (cst.Tuple, cst.List)):
                            names = [dotted(el.value) if not isinstance(el, cst.StarredElement) else None
                                     for el in t.target.elements]
                            self.unpacks.append((names, node.value, func))
                elif tp is Call:
                    name = call_name(node)
                    if name:
                        self.calls.append((node, name, func))
                        if name in ("exec", "eval"):
                            self.exotic = True
            kids = iter_children(node)
            for k in reversed(kids):
                stack.append((k, kids_scope, kids_func, kids_loops))


class FileLoops:
    """All training loops of one file plus the file-level facts rules need. Iterating yields the loops."""

    def __init__(self, module: cst.Module, symbols: SymbolTable, resolver: Resolver) -> None:
        self.module = module
        self.t = symbols
        self.r = resolver
        c = _Collector()
        try:
            if hasattr(symbols, "loop_nodes"):
                c.from_symbols(symbols)  # the shared walk already collected the structure
            else:
                c.run(module)
        except RecursionError:
            c = _Collector()
        self.c = c
        self.loops: list[TrainingLoop] = []
        self.kinds: dict[str, str] = {}  # variable -> kind (optimizer, scheduler, scaler, accelerator, engine ...)
        self.prepared: set[str] = set()  # names produced by accelerator.prepare
        self.prepare_funcs: list = []  # functions (None = module level) holding an ``accelerator.prepare(...)``
        self.accelerator_calls: list[cst.Call] = []
        self.accelerator_ga: Optional[AccumFactor] = None  # None = not configured
        self.accelerator_ga_unknown = False  # **kwargs or a plugin we could not read
        self.accelerator_deepspeed: Optional[cst.CSTNode] = None  # DeepSpeedPlugin in code
        self.deepspeed_initialize: list[cst.Call] = []
        self.ddp_wrapped: set[str] = set()
        self.ddp_calls: list[cst.Call] = []
        self.lightning_trainer_calls: list[cst.Call] = []
        self.scheduler_defs: dict[str, list[cst.Call]] = {}
        self.scaler_defs: dict[str, list[cst.Call]] = {}
        self.no_sync_used = False
        self._backward_memo: dict[int, bool] = {}
        self._func_of_node: dict[int, Optional[cst.FunctionDef]] = {}
        try:
            self._classify_receivers()
            self._build_loops()
        except RecursionError:
            self.loops = []

    def __iter__(self) -> Iterator[TrainingLoop]:
        return iter(self.loops)

    def __len__(self) -> int:
        return len(self.loops)

    # ------------------------------------------------------------------ receivers: who is who
    def constructor_kind(self, call: cst.Call) -> Optional[str]:
        q = self.t.qualname(call.func) or ""
        name = call_name(call) or ""
        last = name.split(".")[-1]
        if not q:
            return None
        if q.startswith("torch.optim.lr_scheduler.") or q.startswith("torch.optim.swa_utils.SWALR"):
            return "scheduler"
        if re.match(r"^transformers(\.optimization)?\.get_\w*schedule\w*$", q) or q in (
            "transformers.get_scheduler",
            "transformers.optimization.get_scheduler",
        ):
            return "scheduler"
        if q.endswith("GradScaler") and q.startswith(("torch.", "apex")):
            return "scaler"
        if q in ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"):
            return "accelerator"
        if q in ("lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric", "lightning.fabric.fabric.Fabric"):
            return "fabric"
        if q.endswith("DistributedDataParallel") or q == "torch.nn.parallel.DDP":
            return "ddp"
        if q.startswith(_OPT_MODULES) and last[:1].isupper() and "lr_scheduler" not in q:
            return "optimizer"
        return None

    def _classify_receivers(self) -> None:
        t = self.t
        # plain assignments x = Ctor(...)
        for name, assigns in t.assignments.items():
            kinds = set()
            for a in assigns:
                v = a.value
                if isinstance(v, cst.Call):
                    k = self.constructor_kind(v)
                    if k is None and (call_name(v) or "").endswith((".prepare", ".setup")):
                        continue
                    kinds.add(k)
                    if k == "scheduler":
                        self.scheduler_defs.setdefault(name, []).append(v)
                    if k == "scaler":
                        self.scaler_defs.setdefault(name, []).append(v)
                    if k == "ddp" and (self.t.qualname(v.func) or "").startswith("torch."):
                        self.ddp_wrapped.add(name)
            if len(kinds) == 1 and None not in kinds:
                self.kinds[name] = kinds.pop()
        # accelerate / deepspeed / fabric unpacking
        for names, call, func in self.c.unpacks:
            cname = call_name(call) or ""
            recv = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
            q = self.t.qualname(call.func) or ""
            if q == "deepspeed.initialize" or cname == "deepspeed.initialize":
                self.deepspeed_initialize.append(call)
                roles = ["engine", "ds_optimizer", "ds_dataloader", "ds_scheduler"]
                for n, role in zip(names, roles):
                    if n:
                        self.kinds[n] = role
                continue
            if cname.endswith(".prepare") and recv and (self.kinds.get(recv) == "accelerator" or recv == "accelerator"):
                args = [a.value for a in call.args if a.keyword is None and not a.star]
                self.prepare_funcs.append(func)
                for n, a in zip(names, args):
                    if not n:
                        continue
                    self.prepared.add(n)
                    k = self._expr_kind(a)
                    if k:
                        self.kinds[n] = k
                continue
            if cname.endswith(".setup") and recv and self.kinds.get(recv) == "fabric":
                args = [a.value for a in call.args if a.keyword is None and not a.star]
                for n, a in zip(names, args):
                    k = self._expr_kind(a) if n else None
                    if n and k:
                        self.kinds[n] = k
        for call, name, func in self.c.calls:
            q = self.t.qualname(call.func) or ""
            if q in ("accelerate.Accelerator", "accelerate.accelerator.Accelerator"):
                self.accelerator_calls.append(call)
            elif q.endswith("DistributedDataParallel") and q.startswith("torch."):
                # torch's DDP only: apex.parallel.DistributedDataParallel has no ``no_sync()`` (its switch is
                # ``disable_allreduce()``) and syncs on its own terms; an unresolved class is not known to be DDP
                self.ddp_calls.append(call)
            elif q in ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer", "pl.Trainer") or (
                q.endswith(".Trainer") and q.startswith(("lightning", "pytorch_lightning"))
            ):
                self.lightning_trainer_calls.append(call)
            elif q.endswith("DeepSpeedPlugin") and q.startswith("accelerate"):
                self.accelerator_deepspeed = call
            if name.endswith(".no_sync") or name.endswith("no_backward_sync"):
                self.no_sync_used = True
        for call in self.accelerator_calls:
            self._read_accelerator(call)
        for name, k in list(self.kinds.items()):
            if k == "accelerator":
                for a in self.t.assignments.get(f"{name}.gradient_accumulation_steps", []):
                    self.accelerator_ga = self.factor(a.value, "accelerator", a.func)
                if self.t.assignments.get(f"{name}.gradient_state") or self.t.assignments.get(f"{name}.gradient_accumulation_plugin"):
                    self.accelerator_ga_unknown = True

    def _expr_kind(self, expr: cst.BaseExpression) -> Optional[str]:
        if isinstance(expr, cst.Call):
            return self.constructor_kind(expr)
        d = dotted(expr)
        if d is None:
            return None
        return self.kinds.get(d)

    def _resolve_call(self, expr: Optional[cst.BaseExpression]) -> Optional[cst.Call]:
        if isinstance(expr, cst.Call):
            return expr
        d = dotted(expr) if expr is not None else None
        if d:
            assigns = self.t.assignments.get(d, [])
            calls = [a.value for a in assigns if isinstance(a.value, cst.Call)]
            if len(calls) == 1 and len(assigns) == 1:
                return calls[0]
        return None

    def _read_accelerator(self, call: cst.Call) -> None:
        ga = kwarg(call, "gradient_accumulation_steps")
        if any(a.star == "**" for a in call.args) and ga is None:
            # (an explicit ``gradient_accumulation_steps=`` decides: the same key in ``**kwargs`` is a TypeError, a
            # plugin there a ValueError)
            self.accelerator_ga_unknown = True
        if ga is not None:
            self.accelerator_ga = self.factor(ga, "accelerator", None)
        plugin = self._resolve_call(kwarg(call, "gradient_accumulation_plugin"))
        if kwarg(call, "gradient_accumulation_plugin") is not None:
            if plugin is not None and kwarg(plugin, "num_steps") is not None:
                self.accelerator_ga = self.factor(kwarg(plugin, "num_steps"), "plugin", None)
            else:
                self.accelerator_ga_unknown = True
        dsp_expr = kwarg(call, "deepspeed_plugin") or kwarg(call, "deepspeed_plugins")
        if dsp_expr is not None:
            self.accelerator_deepspeed = dsp_expr
            dsp = self._resolve_call(dsp_expr)
            if dsp is not None and kwarg(dsp, "gradient_accumulation_steps") is not None and self.accelerator_ga is None:
                self.accelerator_ga = self.factor(kwarg(dsp, "gradient_accumulation_steps"), "deepspeed-plugin", None)
            elif dsp is None or kwarg(dsp, "hf_ds_config") is not None:
                self.accelerator_ga_unknown = True

    def factor(self, expr: cst.BaseExpression, source: str, func) -> AccumFactor:
        v = self.int_value(expr, func)
        return AccumFactor(code_of(expr).strip(), v, source, expr)

    def int_value(self, expr: Optional[cst.BaseExpression], func) -> Optional[int]:
        """An integer the expression resolves to; None when unknown. A command-line / config default of 1 counts
        as unknown: the script is written for the value passed at launch (``--gradient_accumulation_steps 8``)."""
        if expr is None:
            return None
        v = self.r.int_value(expr, func)
        if v is None:
            v = self.r.int_value(expr, None)
        if v == 1 and self._from_cli(expr, func, 0):
            return None
        return v

    def _from_cli(self, expr: cst.BaseExpression, func, depth: int) -> bool:
        if depth > 4:
            return False
        for name in _names_in(expr):
            last = name.split(".")[-1]
            if "." in name and (last in self.t.argparse or last in self.t.dataclass_fields):
                return True
            for a in (self.t.assignments_of(name, func) or [])[:3]:
                if self._from_cli(a.value, a.func, depth + 1):
                    return True
        return False

    def receiver_kind(self, recv: Optional[str]) -> tuple[Optional[str], bool]:
        """(kind, confident) of a receiver text such as ``optimizer`` or ``self.scheduler``."""
        if not recv:
            return None, False
        k = self.kinds.get(recv)
        if k:
            return k, True
        if self._made_by_unknown_call(recv):
            return None, False  # a wrapper or factory we cannot see into: no name-based guess
        last = recv.split(".")[-1]
        if OPT_NAME_RE.match(last):
            return "optimizer", False
        if SCHED_NAME_RE.match(last):
            return "scheduler", False
        if SCALER_NAME_RE.match(last):
            return "scaler", False
        if ACCEL_NAME_RE.match(last):
            return "accelerator", False
        if ENGINE_NAME_RE.match(last):
            return "engine", False
        return None, False

    def prepared_for(self, loop: "TrainingLoop") -> bool:
        """An ``accelerator.prepare(...)`` runs in the loop's function, its class, or at module level."""
        for fn in self.prepare_funcs:
            if fn is None or fn is loop.func:
                return True
            if loop.cls is not None and self.class_of(fn) is loop.cls:
                return True
        return False

    def accumulate_elsewhere(self, loop: "TrainingLoop") -> bool:
        """The file calls ``<accelerator>.accumulate(...)`` somewhere this loop's walk did not see."""
        seen = {id(c) for c in loop.accumulate_calls}
        for call, name, _ in self.c.calls:
            if name.endswith(".accumulate") and id(call) not in seen:
                recv = name.rsplit(".", 1)[0]
                if self.kinds.get(recv) == "accelerator" or ACCEL_NAME_RE.match(recv.split(".")[-1]):
                    return True
        return False

    def _made_by_unknown_call(self, name: str) -> bool:
        """The name is bound in this file from a call we do not recognise (``GradAccumOptimizer(...)``,
        ``build_optimizer(...)``): it may be a wrapper with its own semantics."""
        memo = self.__dict__.setdefault("_unknown_memo", {})
        if name in memo:
            return memo[name]
        res = False
        for a in self.t.assignments.get(name, []):
            v = a.value
            if isinstance(v, cst.Call):
                cname = call_name(v) or ""
                if cname.endswith(".prepare") or cname.endswith(".setup"):
                    continue
                if self.constructor_kind(v) is None:
                    res = True
        if not res:
            for names, call, _ in self.c.unpacks:
                if name in names:
                    cname = call_name(call) or ""
                    q = self.t.qualname(call.func) or ""
                    if not (cname.endswith((".prepare", ".setup")) or q == "deepspeed.initialize"):
                        res = True
        memo[name] = res
        return res

    def is_trainer_class(self, cls: cst.ClassDef) -> bool:
        for b in cls.bases:
            q = self.t.qualname(b.value) or dotted(b.value) or ""
            if q.split(".")[-1] in ("Trainer", "Seq2SeqTrainer", "SFTTrainer") or q.startswith("transformers."):
                return True
        return False

    def is_lightning_module(self, cls: cst.ClassDef) -> bool:
        for b in cls.bases:
            q = self.t.qualname(b.value) or ""
            if q.endswith("LightningModule") and q.startswith(("lightning", "pytorch_lightning")):
                return True
        return False

    # ------------------------------------------------------------------ accumulation expressions
    def is_accum_expr(self, expr: cst.BaseExpression) -> bool:
        """An accumulation-named expression (``args.gradient_accumulation_steps``): a name hint."""
        return bool(ACCUM_RE.search(code_of(expr).strip()))

    def units_of(self, expr: Optional[cst.BaseExpression], func, accum_text: Optional[str] = None) -> str:
        """Units of a schedule length / step budget: ``optimizer-steps`` (divided by the accumulation factor
        somewhere along its definition), ``micro-batches`` (multiplied by it, or ``len(dl) * epochs`` with no
        division), or ``unknown`` (not visible, or divided and multiplied back)."""
        if expr is None:
            return "unknown"
        nodes: list = []
        seen: set = set()
        unresolved = [False]

        def walk_def(e: cst.BaseExpression, f, depth: int) -> None:
            if depth > 5:
                unresolved[0] = True
                return
            nodes.append(e)
            for name in _names_in(e):
                if name in seen:
                    continue
                seen.add(name)
                assigns = self.t.assignments_of(name, f) or self.t.assignments.get(name, [])
                if not assigns:
                    head = name.split(".")[-1]
                    if head in self.t.argparse or head in self.t.dataclass_fields:
                        unresolved[0] = True
                    continue
                for a in assigns[:4]:
                    walk_def(a.value, a.func, depth + 1)

        walk_def(expr, func, 0)

        # Names N is computed *from*, as a numerator: ``N = batch_size // micro_batch_size`` makes ``batch_size`` a
        # multiple of N (the global batch), so ``len(data) // batch_size`` already counts optimizer steps.
        n_sources: set = set()
        if accum_text:
            for a in (self.t.assignments_of(accum_text, func) or self.t.assignments.get(accum_text, []))[:4]:
                v = a.value
                while type(v) is cst.BinaryOperation and type(v.operator) in (cst.Divide, cst.FloorDivide):
                    v = v.left
                    if type(v) is cst.BinaryOperation and type(v.operator) is cst.Multiply:
                        break
                if v is not a.value:
                    inner = v
                    while type(inner) is cst.BinaryOperation and type(inner.operator) is cst.Multiply:
                        inner = inner.left
                    d = dotted(inner) if isinstance(inner, (cst.Name, cst.Attribute)) else None
                    if d:
                        n_sources.add(d)

        def accumish(e) -> bool:
            d = dotted(e)
            if d is None:
                if type(e) is cst.BinaryOperation and type(e.operator) is cst.Multiply:
                    return accumish(e.left) or accumish(e.right)  # ``/ (N * world_size)``
                return bool(accum_text) and code_of(e).strip() == accum_text  # ``/ 8`` with N = 8
            return bool(ACCUM_RE.search(d) or (accum_text and d == accum_text) or d in n_sources)

        has_div = has_mul = False
        texts = [code_of(root) for root in nodes]
        # N's side along the definitions: a name met in a divisor carries its own definition's factors into the
        # divisor (``steps = len(data) / train_batch_size`` with ``train_batch_size = per_gpu * N``: divided by N)
        seen_pol: set = set()

        def side(e, f, pol: int, depth: int) -> None:
            nonlocal has_div, has_mul
            if depth > 6:
                return
            if type(e) is not cst.BinaryOperation and accumish(e):
                if pol > 0:
                    has_mul = True
                else:
                    has_div = True
                return
            tp = type(e)
            if tp is cst.BinaryOperation:
                op = type(e.operator)
                side(e.left, f, pol, depth)
                side(e.right, f, -pol if op in (cst.Divide, cst.FloorDivide) else pol, depth)
                return
            if tp in (cst.Name, cst.Attribute):
                name = dotted(e)
                if name is None:
                    return
                if (name, pol) in seen_pol:
                    return
                seen_pol.add((name, pol))
                assigns = self.t.assignments_of(name, f) or self.t.assignments.get(name, [])
                for a in assigns[:4]:
                    side(a.value, a.func, pol, depth + 1)
                return
            if tp is cst.Call:
                for a in e.args:  # int(...), math.ceil(...), a helper's arguments: the same side
                    side(a.value, f, pol, depth)
                return
            if tp is cst.UnaryOperation:
                side(e.expression, f, pol, depth)
            elif tp is cst.IfExp:
                side(e.body, f, pol, depth)
                side(e.orelse, f, pol, depth)

        side(expr, func, 1, 0)
        if has_div and has_mul:
            return "unknown"  # divided and multiplied back somewhere along the way: do not guess
        if has_div:
            return "optimizer-steps"
        if has_mul:
            return "micro-batches"
        joined = "\n".join(texts)
        if "len(" in joined and not unresolved[0] and not re.search(r"\.\s*max_(train_)?steps", joined):
            return "micro-batches"
        # a number of samples divided by the (per-device) batch size, never by N: micro-batches per rank
        # (``num_samples / args.batch_size / world_size``)
        for root in nodes:
            for n in walk(root):
                if type(n) is cst.BinaryOperation and type(n.operator) in (cst.Divide, cst.FloorDivide):
                    d = dotted(n.right) or ""
                    if re.search(r"(^|[._])(micro_|per_device_|train_)?batch(_size)?$", d, re.IGNORECASE) \
                            and not re.search(r"global|total|effective", d, re.IGNORECASE):
                        return "micro-batches"
        return "unknown"

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
            defs = self.c.module_funcs.get(f.value, [])
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
            m = self.c.class_methods.get(cls.name.value, {}).get(f.attr.value)
            if m is not None:
                return m
        return xp.callee(call, func, cls, self) if xp is not None else None

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
        c = self.c.method_class.get(id(func))
        if c is None and self.__dict__.get("xp"):
            c = self.xp.class_of(func)  # a method of a sibling module's class
        return c

    # ------------------------------------------------------------------ loops
    def _build_loops(self) -> None:
        found: list[tuple[LoopNode, Optional[cst.FunctionDef], Optional[cst.ClassDef], list[LoopNode]]] = []
        for node, func, cls, outer in self.c.loops:
            if self._has_backward(node.body, cls, 0, set(), func):
                found.append((node, func, cls, outer))
        with_bw_ids = {id(n) for n, *_ in found}
        for node, func, cls, outer in found:
            # an outer (epoch) loop: an inner loop runs the backward
            inner = [n for n2, _, _, o in found for n in [n2] if any(x is node for x in o)]
            if inner:
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
        if not isinstance(inner.node, cst.For):
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
        calls = [n for n in walk(node) if type(n) is cst.Call]
        res = False
        for call in calls:
            if backward_style(call, self) is not None:
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


# library functions that clip the gradients in place (the norm / value over ``parameters``): torch's, and timm's
# adaptive gradient clipping (AGC, relative to each parameter's norm) and clip dispatcher (timm/utils/agc.py,
# timm/utils/clip_grad.py)
CLIP_QUALNAMES = frozenset({
    "torch.nn.utils.clip_grad_norm_", "torch.nn.utils.clip_grad_value_", "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad_norm", "timm.utils.agc.adaptive_clip_grad", "timm.utils.adaptive_clip_grad",
    "timm.utils.clip_grad.dispatch_clip_grad", "timm.utils.dispatch_clip_grad",
})


def backward_style(call: cst.Call, f: FileLoops) -> Optional[str]:
    """How this call runs a backward, or None."""
    func = call.func
    if not isinstance(func, cst.Attribute):
        return None
    attr = func.attr.value
    if attr == "manual_backward":
        return "lightning"
    if attr != "backward":
        return None
    recv = func.value
    q = f.t.qualname(func) or ""
    if q in ("torch.autograd.backward",):
        return "autograd"
    rname = dotted(recv)
    npos = sum(1 for a in call.args if a.keyword is None and not a.star)
    if rname is not None:
        k = f.kinds.get(rname)
        if k == "accelerator":
            return "accelerator"
        if k == "engine":
            return "engine"
        if k == "fabric":
            return "fabric"
        if k in ("optimizer", "scheduler", "scaler"):
            return None
        if npos >= 1:
            last = rname.split(".")[-1]
            if last in ("accelerator", "accel"):
                return "accelerator"
            if last == "fabric":
                return "fabric"
            if "engine" in last:
                return "engine"
            return "engine-like" if last not in ("torch", "autograd") else "autograd"
    if isinstance(recv, cst.Call):
        inner = recv.func
        if isinstance(inner, cst.Attribute) and inner.attr.value == "scale":
            return "scaler"
    if npos == 0 or all(a.keyword is not None for a in call.args):
        return "tensor"
    return None


# ---------------------------------------------------------------------------------------------- the walk
class _LoopWalker:
    """The calls a training loop makes (directly and through the same-file functions it calls), in program order:
    what the dry run starts from (who owns accumulation, whether the loop steps, its callees and index). No
    condition is read here: when each call runs, and how often, is the dry run's (``bertlint/analysis/dryrun.py``)."""

    def __init__(self, f: FileLoops, loop: TrainingLoop) -> None:
        self.f = f
        self.loop = loop
        self.seq = 0
        loop.assigned = _assigned_names(loop.node)

    def run(self) -> None:
        loop = self.loop
        self._index()
        self._block(_body_list(loop.node.body), False, False, (), loop.cls, loop.func, 0)

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
    def _block(self, stmts, acc, nosync, via, cls, func, depth) -> None:
        for stmt in stmts:
            self._stmt(stmt, acc, nosync, via, cls, func, depth)

    def _stmt(self, stmt, acc, nosync, via, cls, func, depth) -> None:
        if isinstance(stmt, cst.SimpleStatementLine):
            for small in stmt.body:
                self._exprs(small, acc, nosync, via, cls, func, depth)
            return
        if isinstance(stmt, cst.If):
            self._exprs(stmt.test, acc, nosync, via, cls, func, depth)
            self._block(_body_list(stmt.body), acc, nosync, via, cls, func, depth)
            if stmt.orelse is not None:
                if isinstance(stmt.orelse, cst.If):
                    self._stmt(stmt.orelse, acc, nosync, via, cls, func, depth)
                else:
                    self._block(_body_list(stmt.orelse.body), acc, nosync, via, cls, func, depth)
            return
        if isinstance(stmt, cst.With):
            a2, n2 = acc, nosync
            for item in stmt.items:
                self._exprs(item.item, acc, nosync, via, cls, func, depth)
                for call in _calls_of(item.item):
                    nm = call_name(call) or ""
                    if nm.endswith(".accumulate") and isinstance(call.func, cst.Attribute):
                        recv = dotted(call.func.value)
                        if recv and (self.f.kinds.get(recv) == "accelerator" or ACCEL_NAME_RE.match(recv.split(".")[-1])):
                            a2 = True
                            self.loop.accumulate_calls.append(call)
                    if nm.endswith(".no_sync") or nm.endswith("no_backward_sync"):
                        n2 = True
            self._block(_body_list(stmt.body), a2, n2, via, cls, func, depth)
            return
        if isinstance(stmt, (cst.For, cst.While)):
            self._exprs(stmt.iter if isinstance(stmt, cst.For) else stmt.test, acc, nosync, via, cls, func, depth)
            self._block(_body_list(stmt.body), acc, nosync, via, cls, func, depth)
            return
        if isinstance(stmt, cst.Try):
            self._block(_body_list(stmt.body), acc, nosync, via, cls, func, depth)
            for h in stmt.handlers:
                self._block(_body_list(h.body), acc, nosync, via, cls, func, depth)
            if stmt.orelse is not None:
                self._block(_body_list(stmt.orelse.body), acc, nosync, via, cls, func, depth)
            if stmt.finalbody is not None:
                self._block(_body_list(stmt.finalbody.body), acc, nosync, via, cls, func, depth)
            return
        if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)):
            return
        for child in stmt.children:  # match statements and anything else: their bodies
            if isinstance(child, cst.BaseSuite):
                self._block(_body_list(child), acc, nosync, via, cls, func, depth)

    def _exprs(self, node, acc, nosync, via, cls, func, depth) -> None:
        """The calls inside an expression / small statement, in evaluation order (arguments first)."""
        for sub in _walk_calls(node):
            self._call(sub, acc, nosync, via, cls, func, depth)

    def _call(self, call, acc, nosync, via, cls, func, depth) -> None:
        f = self.f
        loop = self.loop
        name = call_name(call) or ""
        attr = call.func.attr.value if isinstance(call.func, cst.Attribute) else None
        recv = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
        q = f.t.qualname(call.func) or ""
        kind = None
        rkind, conf = f.receiver_kind(recv)
        bstyle = backward_style(call, f)
        if bstyle is not None:
            kind = "backward"
        elif q in CLIP_QUALNAMES or (attr in ("clip_grad_norm_", "clip_grad_value_") and rkind == "accelerator") or (
            attr in ("clip_gradients",) and recv in ("self", "fabric")
        ) or (name.endswith("clip_grad_norm_") and rkind != "engine" and not q.startswith("torch.nn.utils") and recv not in (None,) and rkind in (None, "accelerator") and recv.split(".")[-1] in ("utils", "nn_utils", "clip_grad")):
            kind = "clip"
        elif attr == "step" and rkind in ("optimizer", "ds_optimizer"):
            kind = "opt_step"
        elif attr == "step" and rkind in ("scheduler", "ds_scheduler"):
            kind = "sched_step"
        elif attr == "step" and rkind == "engine":
            kind = "engine_step"
        elif attr == "step" and rkind == "scaler":
            kind = "scaler_step"
        elif attr == "scale" and rkind == "scaler":
            kind = "scaler_scale"
        elif attr == "unscale_" and rkind == "scaler":
            kind = "scaler_unscale"
        elif attr == "update" and rkind == "scaler":
            kind = "scaler_update"
        elif attr == "zero_grad":
            if rkind in ("optimizer", "ds_optimizer"):
                kind = "opt_zero"
            elif rkind == "engine":
                kind = "engine_zero"
            elif rkind in (None, "ddp") and recv is not None:
                last = recv.split(".")[-1]
                if rkind is None and recv in self.f.kinds:
                    kind = None  # bound to something that is not a model: no clear of the model's gradients
                elif rkind is None and (OPT_NAME_RE.match(last) or "optim" in last.lower()):
                    kind, conf = "opt_zero", False  # an optimizer by its name only: recorded, at low confidence
                else:
                    kind = "model_zero"
                    conf = True
        if kind is not None:
            self.seq += 1
            loop.events.append(Event(
                kind,
                call,
                self.seq,
                receiver=recv,
                receiver_kind=rkind,
                confident=conf if kind not in ("backward", "clip") else True,
                in_accumulate=acc,
                in_no_sync=nosync,
                via=tuple(via),
                backward_style=bstyle,
            ))
            return
        # descend into same-file functions
        if depth < 3:
            fn = f.callee(call, func, cls)
            if fn is not None and fn.name.value not in via and fn is not loop.func and f.relevant(fn, cls):
                fcls = f.class_of(fn) or cls
                if fn not in loop.callees:
                    loop.callees.append(fn)
                self._block(_body_list(fn.body), acc, nosync, via + (fn.name.value,), fcls, fn, depth + 1)


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
    return [n for n in walk(node) if type(n) is cst.Call]


def build(ctx) -> FileLoops:
    from bertlint.analysis import project

    project.of(ctx)  # FileLoops.callee follows calls into the project's own sibling modules
    return FileLoops(ctx.module, ctx.symbols, ctx.resolver)
