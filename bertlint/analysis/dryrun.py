"""The training-loop dry run: execute each training loop's body abstractly and record a :class:`bertlint.trace.Trace`.

For every training loop found by :mod:`bertlint.analysis.loops` the body is run statement by statement over two
epochs of a simulated loader long enough to hold two full accumulation windows and a partial tail
(``2 N + 2`` micro-batches), with

- the accumulation factor N found by usage in a first run with N unknown (``_probe_factor``: the period of the gate
  the optimizer step runs under, a loss divided by an accumulation-named value, the Accelerator's setting when the
  loop backpropagates through it, a window loop's length) — its value, or a representative ``N = 4`` when it is a
  symbol (``args.gradient_accumulation_steps``), and separately ``N = 1`` (so ``if N > 1: … else: …`` runs each arm
  in the run where it applies);
- ``enumerate`` / ``range`` indices with their start, hand counters (``step += 1``) with the value they had before
  the loop, ``%`` / ``//`` / comparisons, ``len(loader)`` (the simulated length), ``continue`` / ``break`` /
  ``return`` (a guard ends the loop or skips the iteration; it never gates the rest of the body);
- inner micro-batch loops (``for micro in range(N)``), same-file functions, methods and closures inlined with their
  arguments bound;
- conditions that do not change inside the loop and cannot be decided (``args.fp16``, ``config.CLIP_GRAD``) split
  the run into configurations (at most 3 such conditions, 8 runs); a condition that changes and cannot be decided
  makes the events under it *uncertain* (they may or may not run): invariants never conclude from them;
- framework semantics (``REFERENCE.md``): ``accelerator.backward`` divides by the Accelerator's N (unknown when the
  Accelerator is not built in this file), ``accumulate()`` syncs every N-th entry and at the end of the loader and
  makes the prepared optimizer / scheduler no-ops off the sync step; ``engine.backward`` divides by the engine's GAS
  and ``engine.step()`` takes effect on its boundary; ``scaler.scale(loss).backward()`` scales the gradients until
  ``unscale_``; ``no_sync()`` regions are marked.

The loss scale reaching a backward comes from data flow: ``loss = out.loss / N`` gives ``1/N`` because the value
handed to ``backward`` was divided, not because a ``/`` appears in the loop's text. Anything not understood yields
unknown values (no finding), never an exception.

API::

    dr = dryrun.of(ctx)            # cached per file
    for run in dr:                 # one LoopRun per training loop
        run.loop                   # the loops.TrainingLoop (node, func, owner, ...) or a ManualStep
        run.factor                 # the accumulation factor N the run used (AccumFactor: text, value, source) or None
        run.traces                 # list[Trace]: one per (N, configuration)
        run.violations(code)       # invariants of bertlint.trace over every trace, deduplicated by line
"""

from __future__ import annotations

import itertools
import re
from fractions import Fraction
from typing import Any, Optional

import libcst as cst

from bertlint import trace as T
from bertlint.analysis import project
from bertlint.analysis.accum import ACCUM_RE as _ACCUM_HINT  # a name hint: never what alone makes a value N
from bertlint.analysis.loops import CLIP_QUALNAMES, backward_style
from bertlint.analysis.symbols import call_name, code_of, dotted, kwarg, literal, positional
from bertlint.analysis.walk import SCOPE_TYPES, assigned_names, children, names_in, scope_nodes

REPRESENTATIVE_N = 4
_FSDP_MODS = ("torch.distributed.fsdp", "torch.distributed._composable.fsdp")
PER_LOOP = frozenset({"BL101", "BL103", "BL107", "BL108", "BL114"})
MAX_SPLITS = 5  # configuration conditions a run splits on (2**5 runs at most per N)
PROBE_SPLITS = 4  # ... and a probe run looking for N (it stops at the first configuration that shows N by usage)
BUDGET = 60000  # statements + expressions evaluated per run before giving up (trace marked incomplete)


class _Unk:
    __slots__ = ("inv", "text", "mod")

    def __init__(self, inv: bool = False, text: str = "", mod=None) -> None:
        self.inv = inv  # loop-invariant unknown (a configuration value)
        self.text = text
        self.mod = mod  # the modulus node when the value comes from ``x % M`` with M unknown (a gate's period)

    def __repr__(self) -> str:
        return f"UNK({self.text})"


UNK = _Unk()


class Num:
    """An integer (``v``, None when unknown) and whether it is the accumulation factor."""

    __slots__ = ("v", "is_n", "text")

    def __init__(self, v: Optional[int], is_n: bool = False, text: str = "") -> None:
        self.v = v
        self.is_n = is_n
        self.text = text

    def __repr__(self) -> str:
        return f"Num({self.v}{', N' if self.is_n else ''})"


class Tensor:
    """A value carrying a graph (a loss, an output): its scale relative to the raw loss."""

    __slots__ = ("scale", "graph", "node", "since", "inner")

    def __init__(self, scale: Optional[T.Scale], graph: bool = True, node=None, since: Optional[int] = None,
                 inner=None) -> None:
        self.scale = scale  # None: unknown
        self.graph = graph
        self.node = node
        self.since = since  # the earliest micro-batch whose forward this graph holds (None: not known)
        # a loop inside the micro-batch (``for batch in window:``) whose iterations' losses this graph sums: the
        # dry run runs such a loop's body once, so the sum is marked where it is made (``total += loss`` in it)
        self.inner = inner


def _summed_in(v, loop) -> "Tensor":
    """A copy of the graph ``v`` marked as summed over the iterations of the inner ``loop``."""
    return Tensor(v.scale, v.graph, v.node, v.since, loop)


class _CtxFn:
    """A context-manager factory held in a variable (``ctx = model.no_sync if i % N else nullcontext``)."""

    __slots__ = ("kind", "text")

    def __init__(self, kind: str, text: str = "") -> None:
        self.kind = kind
        self.text = text


class DictVal:
    """A dict built in the loop; its string-keyed slots are followed (``loss_dict["batch_idx"]``)."""

    __slots__ = ("slots",)

    def __init__(self) -> None:
        self.slots: dict = {}


class ListVal:
    """A list built in the run; the graph-carrying values appended to it are followed (``losses.append(loss)``,
    then ``sum(losses).backward()`` or ``torch.stack(losses).mean()``)."""

    __slots__ = ("items", "other")
    CAP = 64

    def __init__(self, items=None) -> None:
        self.items: list = list(items or ())
        self.other = False  # it also holds something that is not a followed graph (then it reads as unknown)

    def add(self, v) -> None:
        if not isinstance(v, Tensor):
            self.other = True
        elif len(self.items) < self.CAP:
            self.items.append(v)


_PIN_RE = re.compile(r"^!when `(\w+)` has its default (-?\d+)$")


class _Split(Exception):
    def __init__(self, key: str) -> None:
        self.key = key


class _Abort(Exception):
    pass


# the attributes and qualified names ``_Runner._call`` tests before it looks for a same-file function (any other call
# goes straight to ``_call_rest``)
_CALL_ATTRS = frozenset({"values", "clip_grad_norm_", "clip_grad_value_", "clip_gradients", "step",
                         "set_gradient_accumulation_boundary", "unscale_", "update", "scale", "zero_grad", "no_sync",
                         "no_backward_sync", "div_", "mul_"})
_CALL_QS = CLIP_QUALNAMES | {"torch.stack", "torch.cat", "torch.concat", "torch.sum", "torch.mean"}

_RELEVANT = frozenset({
    "backward", "manual_backward", "step", "zero_grad", "clip_grad_norm_", "clip_grad_value_", "clip_gradients",
    "unscale_", "update", "scale", "no_sync", "no_backward_sync", "accumulate", "div_", "mul_",
})
_SYNC_ATTRS = frozenset({"no_sync", "no_backward_sync", "require_backward_grad_sync"})
_PURE = frozenset({"len", "isinstance", "hasattr", "getattr", "int", "str", "bool", "float", "callable", "type"})
_SCALE_METHODS = {"mul": cst.Multiply, "multiply": cst.Multiply, "div": cst.Divide, "divide": cst.Divide,
                  "true_divide": cst.Divide}  # torch.Tensor methods (not the in-place ``mul_`` / ``div_``)
_BUILTINS_NUM = {"len", "int", "min", "max", "abs", "round", "sum"}
_NO_GRAPH = {"item", "detach", "cpu", "tolist", "numpy", "data", "shape", "dtype", "device", "ndim"}
_KNOWN_LIBS = ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed", "numpy", "math",
               "tqdm", "datasets", "evaluate", "peft", "diffusers", "timm", "bitsandbytes", "sklearn", "functools",
               "apex", "fairscale", "einops", "random", "os", "sys", "time", "logging", "wandb", "collections")


class LoopRun:
    def __init__(self, loop, traces: list, dr=None, factor=None) -> None:
        self.loop = loop
        self.traces = traces
        self.dr = dr
        self.factor = factor  # the accumulation factor found before the run (AccumFactor: text, value, source)

    def dr_fill(self, v, tr) -> None:
        """Source lines are looked up only for what is reported (positions cost as much as a parse)."""
        if self.dr is None:
            return
        for e in [v.event] + list(v.related):
            if not e.line and e.node is not None:
                e.line = self.dr.line(e.node)
            c = e.meta.get("cond")
            if c is not None and not e.cond_line:
                e.cond_line = self.dr.line(c)
        if not tr.line:
            tr.line = self.dr.line(self.loop.node)

    def fill_lines(self) -> None:
        """Every event's source line (``explain``, the verifier's comparison)."""
        for tr in self.traces:
            for e in tr.events:
                if not e.line and e.node is not None:
                    e.line = self.dr.line(e.node)
            tr.line = self.dr.line(self.loop.node)

    def violations(self, code: str, owners: Optional[tuple] = None) -> list:
        """(violation, trace) pairs of one rule over every configuration, one per line (one per loop for the
        rules about the loop's single window structure: the same mistake seen in two configurations, e.g. the
        scaler and the plain backward of ``if use_amp: … else: …``, is one finding)."""
        out = []
        seen = set()
        for tr in self.traces:
            if not tr.complete or (owners is not None and tr.owner not in owners):
                continue
            for v in T.check(tr, code):
                self.dr_fill(v, tr)
                key = (v.code, v.event.line) if code not in PER_LOOP else (v.code,)
                if key in seen:
                    continue
                seen.add(key)
                out.append((v, tr))
        return out

    def by_usage(self, code: str, node) -> bool:
        """Whether a finding of ``code`` at ``node`` stands without the accumulation factor: true when N was found by
        usage; when it rests on a name alone (``factor.by_name``), whether a run with no N shows it too (only such a
        finding keeps its severity: the name may lower one, never make or keep one)."""
        acc = self.factor
        if acc is None or not getattr(acc, "by_name", False) or self.dr is None:
            return True
        plain = self.__dict__.get("_plain")
        if plain is None:
            try:
                plain = _traces(self.dr, self.loop, [(None, "none")], "", _callee_window(self.dr, self.loop))
            except Exception:
                plain = []
            self._plain = plain
        for tr in plain:
            if not tr.complete:
                continue
            for v in T.check(tr, code):
                if v.event.node is node or any(getattr(r, "node", None) is node for r in v.related):
                    return True
        return False

    @property
    def main(self) -> Optional[T.Trace]:
        return self.traces[0] if self.traces else None


class FileDryRun:
    def __init__(self, ctx, reused: Optional[list] = None) -> None:
        self.ctx = ctx
        self.f = ctx.loops
        self.runs: list[LoopRun] = []
        self._lines: dict = {}
        self._codes: dict = {}
        self._cond_keys: dict = {}  # id(condition) -> _cond_key(condition)
        self._defs: dict = {}
        self._nc: dict = {}
        self._rel: dict = {}
        self._roles: dict = {}
        try:
            self.roles = ctx.roles
        except Exception:  # roles unavailable: the loop model's receiver table alone
            self.roles = None
        self._inside: dict = {}
        self.call_facts: dict = {}  # (id(call), id(function), inlined) -> facts of the call (``_Runner._call``)
        self.callees: dict = {}  # (id(call), id(function), id(class)) -> the function it runs (``_Runner._callee``)
        # facts of a node the same on every pass of every run (each entry holds the node, so its id stays unique):
        self.dotted: dict = {}  # id(expression) -> (expression, its dotted name or None)
        self.resolved: dict = {}  # (id(expression) or name, id(function)) -> (function, what the resolver gives)
        self.eq_consts: dict = {}  # id(condition) -> (condition, _eq_const); configuration key -> _eq_const of it
        self.call_static: dict = {}  # id(call) -> (call, _clip_by_name, _reduction_sum)
        self.stepping = {id(lp.node) for lp in self.f if lp.of("opt_step", "scaler_step", "engine_step")}
        loops = list(self.f) + _manual_steps(self)
        if reused is not None:  # the last lint's runs, taken again (bertlint/dryreuse.py: the language server)
            if [id(lp.node) for lp in loops] != [id(node) for node, _tr, _acc in reused]:
                raise _NotReused  # other loops or scripted steps than those of the last lint
            self.runs = [LoopRun(lp, traces, self, factor) for lp, (_n, traces, factor) in zip(loops, reused)]
            return
        for loop in loops:
            try:
                traces, factor = _run_loop(self, loop)
                self.runs.append(LoopRun(loop, traces, self, factor))
            except RecursionError:
                self.runs.append(LoopRun(loop, [], self))

    @property
    def sync_refs(self) -> bool:
        """The file turns gradient sync off somewhere (``model.no_sync`` called or held in a variable,
        ``require_backward_grad_sync`` set): a configuration that does not may still be one where the model is not
        wrapped, so no run claims that the loop never turns sync off."""
        v = self.__dict__.get("_sync_refs")
        if v is None:
            try:
                v = any(a.attr.value in _SYNC_ATTRS for a in self.ctx.index.of(cst.Attribute))
            except Exception:
                v = "require_backward_grad_sync" in self.ctx.source or "no_sync" in self.ctx.source
            self._sync_refs = v
        return v

    @property
    def ddp_fact(self) -> Optional[tuple]:
        """Whether the file's model runs under DistributedDataParallel, and when: ``(True, "")`` wrapped
        unconditionally, ``(True, "when `args.distributed`")`` wrapped under a condition,
        ``(True, "when launched with more than one process ...")`` prepared by accelerate; None: not shown."""
        if "_ddp_fact" not in self.__dict__:
            try:
                self._ddp_fact = _ddp_fact(self)
            except Exception:
                self._ddp_fact = None
        return self._ddp_fact

    def t_assignments(self, name: str, func) -> list:
        return self.f.t.assignments_of(name, func) or []

    def assigned_in(self, fn) -> frozenset:
        """The names ``fn`` assigns, computed once per function of the file (every inline of a helper asks)."""
        memo = self.__dict__.setdefault("_assigned_memo", {})
        hit = memo.get(id(fn))
        if hit is None or hit[0] is not fn:
            hit = memo[id(fn)] = (fn, frozenset(_assigned(fn)))
        return hit[1]

    def loop_exits(self, stmt) -> frozenset:
        """``{"continue", "break"}`` (either, both or neither) of the enclosing loop inside ``stmt`` (not of a loop
        nested in it): a fact of the tree, asked on every pass over the statement, computed once per statement."""
        memo = self.__dict__.setdefault("_exits_memo", {})
        hit = memo.get(id(stmt))
        if hit is None or hit[0] is not stmt:
            hit = memo[id(stmt)] = (stmt, _loop_exits(stmt))
        return hit[1]

    def __iter__(self):
        return iter(self.runs)

    def run_of(self, loop) -> Optional[LoopRun]:
        for r in self.runs:
            if r.loop is loop:
                return r
        return None

    def code(self, node) -> str:
        k = id(node)
        v = self._codes.get(k)
        if v is None:
            v = self._codes[k] = code_of(node).strip()
        return v

    def relevant_branch(self, stmt, f, func=None, cls=None) -> bool:
        """Does either arm of an ``if`` hold something the trace records (a relevant call, a same-file function that
        makes one, a loss division, ``continue`` / ``break`` / ``return``)? Only such conditions split the run
        into configurations; the others are run as undecided (cheaper, same events). A call of a same-file
        function whose value is dropped and whose body can change nothing the trace records (``_inert``: an
        evaluation pass, a sampler writing images) does not make the branch relevant."""
        k = (id(stmt), id(func), id(cls))
        v = self._rel.get(k)
        if v is None:
            v = False
            dropped = {id(x.value) for x in _walk(stmt) if type(x) is cst.Expr and type(x.value) is cst.Call}
            for n in _walk(stmt):
                tp = type(n)
                if tp in (cst.Continue, cst.Break, cst.Return, cst.Raise):
                    v = True
                elif tp is cst.Call:
                    fn = n.func
                    if isinstance(fn, cst.Attribute) and fn.attr.value in _RELEVANT:
                        v = True
                    elif id(n) in dropped and func is not None and not (isinstance(fn, cst.Attribute) and
                                                                        fn.attr.value in _RELEVANT) and \
                            _inert_call(self, f, n, func, cls):
                        continue
                    elif isinstance(fn, cst.Name) and fn.value in f.t.module_funcs:
                        v = True
                    elif isinstance(fn, cst.Attribute) and isinstance(fn.value, cst.Name) and fn.value.value == "self":
                        v = True
                elif tp is cst.BinaryOperation and type(n.operator) is cst.Divide:
                    v = True
                elif tp is cst.Attribute and n.attr.value in _SYNC_ATTRS:
                    v = True  # a gradient-sync context chosen in a variable, DDP's sync flag set by hand
                elif tp is cst.AugAssign and type(n.operator) is cst.DivideAssign:
                    v = True
                if v:
                    break
            self._rel[k] = v
        return v

    def sync_branch(self, stmt) -> bool:
        """Does the ``if`` choose DDP's gradient sync (``maybe_no_sync = model.no_sync``,
        ``model.require_backward_grad_sync = ...``)? Only such conditions are split operand by operand
        (``isinstance(model, FSDP) and ii != N - 1``: the configuration, then the micro-batch)."""
        k = ("sync", id(stmt))
        v = self._rel.get(k)
        if v is None:
            v = self._rel[k] = any(type(n) is cst.Attribute and n.attr.value in _SYNC_ATTRS for n in _walk(stmt))
        return v

    def pure_calls(self, expr) -> bool:
        """Every call in the expression is a builtin without side effects (``len(cfg.gpus)``)."""
        k = ("pure", id(expr))
        v = self._nc.get(k)
        if v is None:
            v = self._nc[k] = all(isinstance(n.func, cst.Name) and n.func.value in _PURE
                                  for n in _walk(expr) if type(n) is cst.Call)
        return v

    def role(self, recv: Optional[str], func) -> tuple:
        k = (recv, id(func))
        v = self._roles.get(k)
        if v is None:
            info = project.info_of(func) if func is not None else None
            if info is not None:  # a function of a sibling module (inlined): that module's roles
                try:
                    v = _role(recv, info.roles, func)
                except Exception:
                    v = (None, False)
            else:
                v = _role(recv, self.roles, func)
            self._roles[k] = v
        return v

    def model_like(self, recv: str, func) -> bool:
        """Roles from usage (not a name alone) say ``recv`` is a model (wrapped or not)."""
        k = ("model", recv, id(func))
        v = self._roles.get(k)
        if v is None:
            info = project.info_of(func) if func is not None else None
            roles = info.roles if info is not None else self.roles
            try:
                kind, conf = roles.legacy_kind(recv, func) if roles is not None else (None, False)
            except Exception:
                kind, conf = None, False
            v = self._roles[k] = bool(conf and kind in ("model", "ddp", "engine", "lightning_module"))
        return v

    def item_role(self, node, func) -> tuple:
        """(kind, confident) of a subscripted receiver by roles from usage (None when unknown)."""
        k = ("item", id(node), id(func))
        v = self._roles.get(k)
        if v is None:
            v = (None, False)
            if self.roles is not None:
                try:
                    kind, conf = self.roles.legacy_kind(node, func)
                except Exception:
                    kind, conf = None, False
                if kind in ("optimizer", "scheduler", "scaler"):
                    v = (kind, conf)
            self._roles[k] = v
        return v

    def names_calls(self, expr) -> tuple:
        k = id(expr)
        v = self._nc.get(k)
        if v is None:
            v = self._nc[k] = (_names(expr), _has_call(expr))
        return v

    def local_defs(self, func) -> dict:
        k = id(func)
        v = self._defs.get(k)
        if v is None:
            v = self._defs[k] = _local_defs(func)
        return v

    def inside(self, node) -> set:
        k = id(node)
        v = self._inside.get(k)
        if v is None:
            v = self._inside[k] = _ids_in(node)
        return v

    def line(self, node) -> int:
        k = id(node)
        v = self._lines.get(k)
        if v is None:
            try:
                v = self.ctx.span(node)[0].row
            except Exception:
                hit = self.ctx.__dict__.get("foreign_sites", {}).get(k)
                v = self.line(hit[1]) if hit is not None and hit[0] is node else 0
            self._lines[k] = v
        return v

    def foreign(self, node, site, fn) -> None:
        """``node`` (an event of a sibling module's function the run inlined) is reported at ``site``, the call of
        this file that leads there (``ctx.report`` names the other file and line)."""
        sites = self.ctx.__dict__.setdefault("foreign_sites", {})
        if id(node) not in sites:
            sites[id(node)] = (node, site, project.info_of(fn))


class _NotReused(Exception):
    pass


def of(ctx) -> FileDryRun:
    d = ctx.__dict__.get("_dryrun")
    if d is None:
        from bertlint import dryreuse

        got = dryreuse.reuse(ctx)  # None outside the language server, or when the last run may not hold
        d = None
        if got is not None:
            try:
                d = FileDryRun(ctx, got)
            except _NotReused:
                dryreuse.not_reused(ctx, "the training loops or scripted steps changed")
        if d is None:
            d = FileDryRun(ctx)
        ctx.__dict__["_dryrun"] = d
        dryreuse.remember(d)
    return d


# ------------------------------------------------------------------------------------------------ roles
# Receivers are classified by roles from usage (bertlint/analysis/roles.py, ``Roles.receiver_kind``): the linted
# file's, or a sibling module's for the functions of that module the run inlines.


def _role(recv: Optional[str], roles=None, scope=None) -> tuple[Optional[str], bool]:
    """(kind, confident) of a receiver by roles from usage; (None, False) when unknown."""
    if roles is None or not recv:
        return None, False
    try:
        return roles.receiver_kind(recv, scope)
    except Exception:
        return None, False


# ------------------------------------------------------------------------------------------------ driver


def _run_loop(dr: FileDryRun, loop) -> tuple:
    """(traces, the accumulation factor found before the run or None)."""
    f = dr.f
    window = _callee_window(dr, loop)
    acc = _window_factor(dr, loop, window) or (loop.accum() if isinstance(loop, ManualStep) else None)
    if acc is None:
        acc = _probe_factor(dr, loop, window)  # N by usage (an Accelerator of a sibling module included)
    if acc is None or _running(loop, acc):
        acc = _counter_gate_factor(dr, loop) or acc
    if acc is not None and acc.expr is not None and not isinstance(loop, ManualStep):
        _size_counter_of(dr, loop, acc)
    n_text = acc.text if acc is not None else ""
    if acc is not None and acc.value is not None:
        ns = [(acc.value, "resolved")]
        if acc.value > 1 and acc.expr is not None and getattr(loop, "owner", "") == "plain" \
                and acc.source in ("gate", "division", "window") and _configurable(f, acc, loop):
            # a default the user changes at launch (``--grad_accum 2``): the loop must be right for other values too
            # (``if step % N:`` steps on the right micro-batches only when N = 2)
            ns.append((REPRESENTATIVE_N if acc.value != REPRESENTATIVE_N else REPRESENTATIVE_N + 1, "other"))
    elif acc is not None:
        ns = [(REPRESENTATIVE_N, "representative"), (1, "N = 1")]
    else:
        ns = [(None, "none")]
    if len(ns) > 1 and ns[1][1] == "N = 1" and not _compares(dr, loop, n_text):
        ns = ns[:1]  # nothing in the loop tests N itself: the N = 1 run would only repeat the plain arm
    return _traces(dr, loop, ns, n_text, window), acc


def _traces(dr: FileDryRun, loop, ns: list, n_text: str, window) -> list:
    """One trace per (N, configuration)."""
    traces = []
    for n, src in ns:
        pending = [{}]
        done = 0
        known: dict = {}  # outcomes of configurations a run passed through on its way (_run_chain)
        while pending and done < 2 ** MAX_SPLITS:
            cfg = pending.pop(0)
            got = known.pop(frozenset(cfg.items()), None)
            split, tr = got if got is not None else _run_chain(dr, loop, n, n_text, cfg, window, known)
            if split is not None:
                if len(cfg) >= MAX_SPLITS:
                    continue
                pending.append({**cfg, split: True})
                pending.append({**cfg, split: False})
                continue
            tr.n_source = src
            if src == "N = 1":
                tr.config = {**tr.config}
            traces.append(tr)
            done += 1
    return traces


def _run_chain(dr: FileDryRun, loop, n, n_text: str, cfg: dict, window, known: dict) -> tuple:
    """The outcome of the run in configuration ``cfg``, as ``(split key, None)`` or ``(None, trace)``: what a run
    started afresh in ``cfg`` gives. A configuration condition the run cannot decide (``_Runner._config``) ends such a
    run with a split, and ``_run_loop`` then runs ``cfg`` + {key: True} and ``cfg`` + {key: False} from the start;
    this run goes on instead as the first of those (no statement before that point read the condition, nor asked
    whether the configuration fixes it, ``_fixed_operand``: they ran as they run there), so that one is not run again: the outcomes of the configurations it passed through, each the
    one before with the next such key true, go to ``known``."""
    r = _Runner(dr, loop, n, n_text, dict(cfg), window)
    r.chain = []
    split = tr = None
    try:
        tr = r.run()
    except _Split as s:
        split = s.key
    except (_Abort, RecursionError):
        tr = r.trace
        tr.complete = False
    if tr is not None and r.chain:
        tr.config = dict(r.config)  # the configuration it ran in (a fresh run's trace copies it at the start)
    c = dict(cfg)
    first = None
    for key in r.chain:
        if first is None:
            first = (key, None)
        else:
            known[frozenset(c.items())] = (key, None)
        c[key] = True
    if first is None:
        return split, tr
    known[frozenset(c.items())] = (split, tr)
    return first


def _probe_factor(dr: FileDryRun, loop, window):
    """The accumulation factor by usage: a run with N unknown, in which a period gating the optimizer step
    (``(i + 1) % M == 0``, whatever M is called), a loss divided by an accumulation-named value, or the
    Accelerator's setting when the loop backpropagates through it, is N (``AccumFactor``; None: none)."""
    from bertlint.analysis.accum import AccumFactor

    f = dr.f
    probe = hinted = None
    pending: list = [{}]
    tries = 0
    accel = False  # some configuration backpropagates through the Accelerator

    def by_usage(p) -> bool:
        return bool(p.guard_periods) or any(t not in p.n_hint for _v, t in p.n_candidates)

    while pending and tries < 4 * PROBE_SPLITS:
        cfg = pending.pop(0)
        tries += 1
        probe = _Runner(dr, loop, None, "", cfg, window, probe=True)
        try:
            probe.run()
        except _Split as sp:
            if not by_usage(probe) and len(cfg) < PROBE_SPLITS:
                # look for N in one configuration, then run them all with it (a guard that ends the run in one
                # configuration, ``if state["iter_num"] >= max_iters: break``, is tried the other way too); a
                # candidate by its name alone does not end the search for one by usage (the step gate may lie
                # past the split)
                pending.extend([{**cfg, sp.key: True}, {**cfg, sp.key: False}])
                if probe.n_candidates and hinted is None:
                    hinted = probe
                continue
        except (_Abort, RecursionError):
            pass
        accel = accel or probe.acc_used or any(e.kind == "backward" and e.via == "accelerator"
                                               for e in probe.trace.events)
        if by_usage(probe):
            break
        if probe.n_candidates:
            hinted = hinted or probe  # by the name alone: the other configurations may show it by usage
            if not pending:
                break
    if probe is not None and not by_usage(probe) and hinted is not None:
        probe = hinted
    if probe is None:
        return None
    probe.probe = False  # the run is over: no early stop while its guards are read
    for mod, start, mb, func in probe.guard_periods:
        probe._period_gate(mod, [e for e in probe.trace.events[start:] if e.mb == mb], _Frame(func, None, 0))
    if probe.n_candidates:
        # found by usage before by the name alone, then a known value > 1 first, a step gate's period before a loss
        # divisor
        cands = [(v, text) + probe.n_nodes.get(text, (None, "gate")) for v, text in probe.n_candidates]
        cands.sort(key=lambda c: (c[1] in probe.n_hint, not (c[0] is not None and c[0] > 1), c[3] != "gate"))
        v, text, node, source = cands[0]
        if v is None and node is not None:
            v = f.int_value(node, getattr(loop, "func", None))  # a value the symbol table resolves
            v = v if v is not None and v > 1 else None
        return AccumFactor(text, v, source, node, by_name=text in probe.n_hint and not _set_as_n(f, text))
    if not accel:
        return None
    if f.accelerator_ga is not None:
        return f.accelerator_ga  # the loop backpropagates through the Accelerator: its setting is N
    if not f.accelerator_calls and not f.accelerator_ga_unknown:
        sib = _sibling_acc(dr)  # an Accelerator built by a factory of a sibling module
        if sib is not None and sib[1] != "1":
            return AccumFactor(sib[1], sib[0], "accelerator", None)
        if sib is None and probe.acc_used and probe.acc_recv:
            # the loop accumulates through ``accumulate()`` of an Accelerator built outside the file (handed to a
            # trainer class, a function's argument): its gradient_accumulation_steps is the factor, a symbol
            return AccumFactor(f"{probe.acc_recv}.gradient_accumulation_steps", None, "accumulate", None)
    return None


class ManualStep:
    """A function some driver calls once per micro-batch, seen as the body of that driver's micro-batch loop (the
    shape of ``loops.TrainingLoop`` the dry run reads). ``kind``:

    - ``"lightning"``: a LightningModule's ``training_step`` under manual optimization
      (``self.automatic_optimization = False``), called as ``training_step(batch, batch_idx)``;
    - ``"ignite"``: the process function handed to ignite's ``Engine(update)``, called as ``update(engine, batch)``
      once per iteration, ``engine.state.iteration`` counting from 1 over the whole run;
    - ``"method"``: a method that backpropagates, steps and keeps its own micro-batch counter on ``self``
      (``self.n_accumulated += 1; if self.n_accumulated >= self.accum_iters: step``) and that no loop of the file
      calls: whoever drives it calls it once per micro-batch (the counter says so)."""

    def __init__(self, dr, func, cls, kind: str = "lightning") -> None:
        self.node = func
        self.func = func
        self.cls = cls
        self.kind = kind
        self.outer: list = []
        self.window_of = None
        self.owner = "lightning-manual" if kind == "lightning" else "plain"
        self.index = None
        self.callees: list = []
        self.assigned = assigned_names(func)
        self._dr = dr

    def accum(self):
        """The modulus of the step gate (``(batch_idx + 1) % self.accumulate_grad_batches == 0``, whatever it is
        called: the ``if`` it is tested in steps an optimizer), or for a ``"method"`` the bound its counter is
        compared with there (``if self.n_accumulated >= self.accum_iters:``). A modulus / bound / loss divisor that
        gates no step is N by its name alone (``by_name``: a hint, see ``AccumFactor``)."""
        dr = self._dr
        f = dr.f
        gated = _step_gate_tests(dr, self.func, self.cls)
        hinted = []
        for n in _walk(self.func.body):
            m = None
            if type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo:
                m = n.right
            elif self.kind == "method" and type(n) is cst.Comparison and len(n.comparisons) == 1 and \
                    type(n.comparisons[0].operator) in (cst.GreaterThanEqual, cst.Equal):
                m = n.comparisons[0].comparator  # ``self.n_accumulated >= self.accum_iters``
                if _literal_int(m) is not None or not any(x in self.assigned for x in _names(n.left)):
                    m = None  # a bound the counter (assigned here) reaches; not a constant
            elif self.kind == "method" and type(n) is cst.BinaryOperation and type(n.operator) is cst.Divide:
                if _ACCUM_HINT.search(dr.code(n.right)):
                    hinted.append(n.right)
                continue
            if m is None:
                continue
            if id(n) in gated and (_literal_int(m) is None or _literal_int(m) > 1):
                return f.factor(m, "gate", self.func)
            if _ACCUM_HINT.search(dr.code(m)):
                hinted.append(m)
        if not hinted:
            return None
        acc = f.factor(hinted[0], "gate", self.func)
        acc.by_name = True
        return acc


def _manual_steps(dr) -> list:
    out = []
    f = dr.f
    for name, cls in f.t.classes.items():
        meth = f.t.class_methods.get(name, {}).get("training_step")
        if meth is None:
            continue
        is_lm = f.is_lightning_module(cls)
        if not is_lm and dr.roles is not None:
            try:
                is_lm = dr.roles.class_family(cls) == "lightning_module"
            except Exception:
                is_lm = False
        if not is_lm:
            continue
        text = dr.code(cls)
        if "automatic_optimization = False" not in text and "automatic_optimization=False" not in text:
            continue
        if "manual_backward" not in dr.code(meth):
            continue
        out.append(ManualStep(dr, meth, cls))
    out.extend(_ignite_steps(dr))
    out.extend(_counter_methods(dr, {id(m.func) for m in out}))
    out.extend(_index_param_fns(dr, {id(m.func) for m in out}))
    out.extend(_scaler_step_fns(dr, {id(m.func) for m in out}))
    out.extend(_step_fns(dr, {id(m.func) for m in out}))
    return out


def _step_fns(dr, taken: set) -> list:
    """Training-step functions: a function (a method) that backpropagates and steps an optimizer / scaler (in its own
    body or in same-file functions it calls) and that no loop of this file calls, no other such function calls, and
    that holds no stepping loop of its own: its driver (a loop in another module, a framework) calls it once per
    micro-batch. The run calls it a few times with every parameter a per-call unknown; with no counter, index or
    setting of its own the accumulation factor stays unknown, so only what holds on every call is claimed (the
    order of ``scale`` / ``unscale_`` / clip / ``step`` within a call, ``exp_gradscaler.out``)."""
    out = []
    f = dr.f
    called, stepping = _called_and_stepping(f)
    with_bw: dict = {}
    for _, func in f.t.backward_calls:
        if func is not None:
            with_bw[id(func)] = func
    cands: dict = {}
    for d in f.t.defs:
        if isinstance(d, cst.FunctionDef):
            cands[id(d)] = d
    idx, looped = _loop_scopes(dr)
    picked = []
    for fn in cands.values():
        if id(fn) in taken or id(fn) in called or id(fn) in stepping or fn.name.value.startswith("__"):
            continue
        if (id(fn) in looped) if idx is not None and idx.parent(fn) is not None else \
                any(type(n) in (cst.For, cst.While) for n in _walk(fn.body)):
            continue  # a function with loops of its own: its loops are the file's loops (or an inner window)
        cls = f.class_of(fn)
        if id(fn) not in with_bw and not f._has_backward(fn.body, cls, 0, set(), fn):
            continue
        if not _steps_somewhere(dr, fn, cls):
            continue
        picked.append((fn, cls))
    if not picked:
        return out
    # only the outermost: a candidate another candidate calls runs inside that one's run
    inner: set = set()
    for fn, cls in picked:
        for n in _walk(fn.body):
            if type(n) is cst.Call:
                g = f.callee(n, fn, cls)
                if g is not None and g is not fn:
                    inner.add(id(g))
    for fn, cls in picked:
        if id(fn) not in inner:
            m = ManualStep(dr, fn, cls, "step_fn")
            m.driver_counts = _driver_counts(dr, fn, cls, called)
            out.append(m)
    return out


def _loop_scopes(dr) -> tuple:
    """(the file's node index, ids of the scopes whose own code, nested def / class / lambda bodies left out, holds a
    ``for`` / ``while``): a loop's nearest enclosing scope by the index's parents, what ``_walk(fn.body)`` would meet
    (the same children). ``(None, set())`` when the index is not available (then each function is walked)."""
    try:
        idx = dr.ctx.index
    except Exception:
        return None, set()
    out: set = set()
    scopes = SCOPE_TYPES
    for loop in idx.of(cst.For, cst.While):
        p = idx.parent(loop)
        while p is not None and type(p) not in scopes:
            p = idx.parent(p)
        if p is not None:
            out.add(id(p))
    return idx, out


def _driver_counts(dr, fn, cls, called: set) -> list:
    """``self.n_iter += 1`` in a method of ``fn``'s class that neither backpropagates nor steps and that nothing in
    this file calls (``def iter(self): self.n_iter += 1``), when ``fn`` (or a same-class method it calls) tests
    ``self.n_iter`` in a step gate: the driver calls it once per iteration, as it calls ``fn``. The run advances the
    counter before each call of ``fn`` (the order that makes the first window whole: which order the driver uses is
    not in this file, so nothing is claimed from it). ``[(statement, method)]``."""
    if cls is None:
        return []
    f = dr.f
    tested: set = set()
    stack, seen = [fn], set()
    while stack:
        g = stack.pop()
        if id(g) in seen or len(seen) > 8:
            continue
        seen.add(id(g))
        gates = _step_gate_tests(dr, g, cls, g)
        for n in _walk(g.body):
            if id(n) in gates:
                d = dotted(n) if type(n) in (cst.Attribute, cst.Name) else None
                if d and d.startswith("self.") and d.count(".") == 1:
                    tested.add(d)
            if type(n) is cst.Call:
                h = f.callee(n, g, cls)
                if h is not None and f.class_of(h) is cls:
                    stack.append(h)
    if not tested:
        return []
    with_bw = {id(func) for _, func in f.t.backward_calls if func is not None}
    out = []
    for name in sorted(tested):
        for node, g in f.t.aug_assigns.get(name, []):
            if g is None or g is fn or id(g) in seen or f.class_of(g) is not cls or id(g) in called:
                continue
            if type(node.operator) is not cst.AddAssign or _literal_int(node.value) is None:
                continue
            if id(g) in with_bw or _steps_somewhere(dr, g, cls) or _called_in_file(dr, g):
                continue
            st = next((x for x in _body(g.body) if type(x) is cst.SimpleStatementLine and node in x.body), None)
            if st is not None:
                out.append((st, g))
    return out


def _called_in_file(dr, g) -> bool:
    """Some function of this file calls ``g`` (a same-file callee resolution)."""
    f = dr.f
    for call, _name, func in f.t.calls:
        if func is not None and func is not g and f.callee(call, func, f.class_of(func)) is g:
            return True
    return False


def _called_and_stepping(f) -> tuple[set, set]:
    """ids of the functions some loop of the file calls, and of the functions whose own loops step an optimizer."""
    called = set()
    for lp in f:
        called.update(id(c) for c in lp.callees)
    return called, {id(lp.func) for lp in f if lp.of("opt_step", "scaler_step", "engine_step")}


def _index_param_fns(dr, taken: set) -> list:
    """Functions (methods) that backpropagate and step an optimizer under a gate on one of their own parameters
    modulo the accumulation factor (``def step(self, loss, global_step): scaler.scale(loss).backward(); if
    (global_step + 1) % self.grad_accum == 0: scaler.step(opt)``) and that no loop of this file calls: the caller
    calls them once per micro-batch and hands in the micro-batch's index. The run calls them with that parameter
    counting from 0, a configuration the findings state."""
    out = []
    f = dr.f
    called, stepping = _called_and_stepping(f)
    with_bw = {id(func): func for _, func in f.t.backward_calls if func is not None}
    for fn in with_bw.values():
        if id(fn) in taken or id(fn) in called or id(fn) in stepping or fn.name.value.startswith("__"):
            continue
        params = [p.name.value for p in list(fn.params.params) + list(fn.params.kwonly_params)]
        idx = hint = None
        gated = None
        for n in _walk(fn.body):
            if type(n) is cst.BinaryOperation and type(n.operator) is cst.Modulo:
                names = [x.value for x in _walk(n.left) if type(x) is cst.Name and x.value in params]
                if len(names) != 1:
                    continue
                if gated is None:
                    gated = _step_gate_tests(dr, fn, f.class_of(fn))
                if id(n) in gated and _literal_int(n.right) is None:  # the period of an ``if`` that steps
                    idx = names[0]
                    break
                if hint is None and _ACCUM_HINT.search(dr.code(n.right)):
                    hint = names[0]  # named like one, gating no step we see (``is_update = ...``): a hint
        idx = idx or hint
        if idx is None or idx in ("self", "cls"):
            continue
        cls = f.class_of(fn)
        if not _steps_somewhere(dr, fn, cls):
            continue
        m = ManualStep(dr, fn, cls, "index")
        m.index = idx
        out.append(m)
    return out


def _scaler_step_fns(dr, taken: set) -> list:
    """Functions handed a GradScaler that step through it and clip, with no backward of their own
    (``Updater.step(self, grad_scaler=None)``: the caller ran ``grad_scaler.scale(loss).backward()`` — the scaler's
    ``step()`` needs it — and hands the scaler in for the update)."""
    out = []
    f = dr.f
    t = f.t
    with_bw = {id(func) for _, func in t.backward_calls if func is not None}
    clips = {id(func) for _, name, func in t.calls
             if func is not None and name.split(".")[-1] in ("clip_grad_norm_", "clip_grad_value_")}
    seen = set()
    for call, name, func in t.calls:
        if func is None or id(func) in seen or id(func) in taken or id(func) in with_bw or id(func) not in clips:
            continue
        parts = name.split(".")
        if len(parts) != 2 or parts[1] != "step" or positional(call, 0) is None:
            continue
        params = {p.name.value: p for p in list(func.params.params) + list(func.params.kwonly_params)}
        p = params.get(parts[0])
        if p is None:
            continue
        ann = dr.code(p.annotation.annotation) if p.annotation is not None else ""
        if "GradScaler" not in ann and dr.role(parts[0], func)[0] != "scaler":
            continue
        seen.add(id(func))
        out.append(ManualStep(dr, func, f.class_of(func), "scaler_fn"))
    return out


def _steps_somewhere(dr, fn, cls) -> bool:
    """``fn`` (or a same-file function it calls) steps an optimizer or a scaler (by the call's shape: the roles
    decide in the run)."""
    seen: set = set()
    stack = [(fn, cls, 0)]
    while stack:
        g, c, d = stack.pop()
        if id(g) in seen or d > 3:
            continue
        seen.add(id(g))
        for n in _walk(g.body):
            if type(n) is cst.Call:
                if isinstance(n.func, cst.Attribute) and n.func.attr.value == "step":
                    return True
                h = dr.f.callee(n, g, c)
                if h is not None:
                    stack.append((h, dr.f.class_of(h) or c, d + 1))
    return False


def _ignite_steps(dr) -> list:
    """Process functions handed to ignite's ``Engine(fn)`` that backpropagate and step."""
    out = []
    f = dr.f
    for call, name, func in f.t.calls:
        if name.split(".")[-1] != "Engine" or not (f.t.qualname(call.func) or "").startswith("ignite"):
            continue
        a0 = positional(call, 0)
        if not isinstance(a0, cst.Name):
            continue
        fn = dr.local_defs(func).get(a0.value) if func is not None else None
        if fn is None:
            defs = f.t.module_funcs.get(a0.value, [])
            fn = defs[0] if len(defs) == 1 else None
        if fn is None or len(fn.params.params) < 2:
            continue
        if not f._has_backward(fn.body, None, 0, set()) or not _steps_somewhere(dr, fn, None):
            continue
        if any(m.func is fn for m in out):
            continue
        out.append(ManualStep(dr, fn, None, "ignite"))
    return out


def _counter_methods(dr, taken: set) -> list:
    """Methods that keep their own micro-batch counter on ``self`` and gate the step on it, called by no loop of
    this file (see :class:`ManualStep`)."""
    out = []
    f = dr.f
    called, stepping = _called_and_stepping(f)
    cands: dict = {}  # the methods that advance a ``self.x += ...`` counter (from the symbol table: no walk)
    for name, sites in f.t.aug_assigns.items():
        if not name.startswith("self.") or name.count(".") != 1:
            continue
        for node, fn in sites:
            if fn is not None and type(node.operator) is cst.AddAssign:
                cands.setdefault(id(fn), (fn, set()))[1].add(name)
    if not cands:
        return out
    with_bw = {id(func) for _, func in f.t.backward_calls if func is not None}
    for fn, counters in cands.values():
        cls = f.class_of(fn)
        if cls is None or fn.name.value.startswith("__") or id(fn) not in with_bw:
            continue  # the backward in the method itself (the symbol table's list of backward calls)
        if id(fn) in taken or id(fn) in called or id(fn) in stepping:
            continue
        if any(type(n) in (cst.For, cst.While) and f._has_backward(n.body, cls, 0, set(), fn) for n in _walk(fn.body)):
            continue  # the backward runs in a loop of the method's own (an inner accumulation loop per call, a
            # GAN's critic / generator windows): that loop is one of the file's loops, not one call per micro-batch
        gated = False
        for n in _walk(fn.body):
            if type(n) in (cst.If, cst.Assign):
                part = n.test if type(n) is cst.If else n.value
                if type(part) in (cst.Comparison, cst.BooleanOperation) or type(n) is cst.If:
                    names = set(_names(part))
                    if names & counters:
                        gated = True
                        break
        if not gated:
            continue
        if not _steps_somewhere(dr, fn, cls):
            continue
        out.append(ManualStep(dr, fn, cls, "method"))
    return out


def _configurable(f, acc, loop) -> bool:
    """The factor's value is a command-line / dataclass default (the script is run with others too)."""
    try:
        return bool(f.from_cli(acc.expr, getattr(loop, "func", None), 0))
    except Exception:
        return False


def _compares(dr, loop, n_text: str) -> bool:
    """Some comparison in the loop (or a helper it calls) reads the accumulation factor (``if N > 1:``)."""
    if not n_text:
        return False
    nodes = [loop.node] + list(loop.callees) + list(loop.outer[:1])
    for node in nodes:
        for n in _walk(node):
            if type(n) is cst.Comparison and n_text in dr.code(n):
                return True
    return False


def _window_factor(dr, loop, window=None):
    """``for micro in range(N)`` / ``range(1, N + 1)`` inside the step loop: N is the window's length;
    ``range(0, B, m)`` (a batch split into chunks of ``m``): N is the number of chunks, ``ceil(B / m)``."""
    w = loop.window_of if loop.window_of is not None else window
    if isinstance(w, cst.While):
        return _while_window_factor(dr, loop, w)
    if not isinstance(w, cst.For) or not isinstance(w.iter, cst.Call) or call_name(w.iter) != "range":
        return None
    args = [a.value for a in w.iter.args if a.keyword is None]
    expr = None
    if len(args) == 1:
        expr = args[0]
    elif len(args) == 2 and literal(args[0]) == 1 and isinstance(args[1], cst.BinaryOperation) and \
            isinstance(args[1].operator, cst.Add) and literal(args[1].right) == 1:
        expr = args[1].left
    elif len(args) == 3 and literal(args[0]) == 0:
        from bertlint.analysis.accum import AccumFactor

        func = window_func = None
        for lp in dr.f:
            if lp.node is w:
                window_func = lp.func
        func = window_func or loop.func
        b, m = dr.f.int_value(args[1], func), dr.f.int_value(args[2], func)
        value = -(-b // m) if b is not None and m else None
        return AccumFactor(f"math.ceil({dr.code(args[1])} / {dr.code(args[2])})", value, "window")
    if expr is None:
        return None
    return dr.f.factor(expr, "window", loop.func)


def _while_window_factor(dr, loop, w):
    """A ``while`` window inside the step loop, counted by a counter only the window advances: ``while n < N: ...;
    n += 1`` or ``while True: ...; n += 1; if n >= N: break`` (N: the bound), or a counter advanced by a size the
    window does not change (``seen += micro_batch_size`` ... ``if seen >= total_batch_size: break``: ceil(total /
    size) micro-batches). None for any other ``while`` (a size read from the batch, a flag): its length is not known."""
    incs: dict = {}
    for n in _walk(w.body):
        if type(n) is cst.AugAssign and type(n.operator) is cst.AddAssign and dotted(n.target):
            incs.setdefault(dotted(n.target), []).append(n.value)
    assigned_w = {dotted(t.target) for n in _walk(w.body) if type(n) is cst.Assign for t in n.targets}

    def step_of(c):
        """1, the text of a size the window does not change, or None."""
        vs = incs.get(c) or []
        if len(vs) != 1:
            return None
        if _literal_int(vs[0]) == 1:
            return 1
        d = dotted(vs[0])
        if d and d not in assigned_w and d not in incs and d.split(".")[0] not in assigned_w:
            return d
        return None

    def pair(test, ops):
        if type(test) is not cst.Comparison or len(test.comparisons) != 1 or \
                type(test.comparisons[0].operator) not in ops:
            return None
        c, bound = dotted(test.left), test.comparisons[0].comparator
        if c and step_of(c) is not None and dotted(bound) and dotted(bound) not in incs and \
                dotted(bound) not in assigned_w:
            return c, bound
        return None

    got = pair(w.test, (cst.LessThan,))
    if got is None and type(w.test) is cst.Name and w.test.value == "True":
        for n in _walk(w.body):
            if type(n) is cst.If and n.orelse is None and any(type(x) is cst.Break for x in _walk(n.body)):
                got = pair(n.test, (cst.GreaterThanEqual, cst.Equal))
                if got is not None:
                    break
    if got is None:
        return None
    c, bound = got
    size = step_of(c)
    if size == 1:
        return dr.f.factor(bound, "window", loop.func)
    from bertlint.analysis.accum import AccumFactor

    bv, mv = dr.f.int_value(bound, loop.func), dr.f.int_value(_name_expr(size), loop.func)
    value = -(-bv // mv) if bv is not None and mv else None
    return AccumFactor(f"math.ceil({dr.code(bound).strip()} / {size})", value, "window")


def _running(loop, acc) -> bool:
    """The factor is a name the loop itself assigns (``loss / accum_n_steps`` with ``accum_n_steps += 1``): a running
    count, not the accumulation factor."""
    return acc.expr is not None and dotted(acc.expr) in (getattr(loop, "assigned", None) or ())


def _counter_gate_factor(dr, loop):
    """The bound of a hand counter's step gate (``if accum_n_steps >= accum_grad_n_steps:`` with the counter advanced
    and reset in the loop): the accumulation factor, read where the counter is compared with it."""
    assigned = getattr(loop, "assigned", None) or set()
    gated = hinted = None
    for n in _walk(loop.node):
        if type(n) is not cst.Comparison or len(n.comparisons) != 1:
            continue
        op = type(n.comparisons[0].operator)
        pairs = ((n.left, n.comparisons[0].comparator),) if op in (cst.GreaterThanEqual, cst.Equal) else \
            ((n.comparisons[0].comparator, n.left),) if op is cst.LessThanEqual else ()
        for cnt, bound in pairs:
            c, b = dotted(cnt), dotted(bound)
            if c is None and b and _since_mark(loop.node, cnt, assigned) and (
                    b not in assigned or _ramped(dr, loop.node, b)):
                # ``if ni - last_opt_step >= accumulate:`` with ``last_opt_step = ni`` where it steps: the
                # micro-batches since the last step, compared with the factor (ultralytics' trainers)
                if gated is None:
                    gated = _step_gate_tests(dr, loop.node, getattr(loop, "cls", None), loop.func)
                if id(n) in gated:
                    dr.__dict__.setdefault("_since_loops", set()).add(id(loop))
                    return dr.f.factor(bound, "gate", loop.func)
                continue
            if c and b and c in assigned and b not in assigned and _reset_in(loop.node, c):
                if gated is None:
                    gated = _step_gate_tests(dr, loop.node, getattr(loop, "cls", None), loop.func)
                if id(n) in gated:
                    acc = dr.f.factor(bound, "gate", loop.func)  # the bound of a counter gate that steps
                    _mark_size_counter(dr, loop, acc, c, b)
                    return acc
                if hinted is None and _ACCUM_HINT.search(b):
                    hinted = dr.f.factor(bound, "gate", loop.func)
                    hinted.by_name = True
    return hinted


def _size_counter_of(dr, loop, acc) -> None:
    """The counter gate ``if c >= B:`` (``B`` the factor's expression, ``c`` assigned and reset in the loop) whose
    counter grows by the micro-batch's size: see ``_mark_size_counter``."""
    if id(loop) in dr.__dict__.get("_unit_incs", {}):
        return
    assigned = getattr(loop, "assigned", None) or set()
    for n in _walk(loop.node):
        if type(n) is not cst.Comparison or len(n.comparisons) != 1:
            continue
        op = type(n.comparisons[0].operator)
        pairs = ((n.left, n.comparisons[0].comparator),) if op in (cst.GreaterThanEqual, cst.GreaterThan) else \
            ((n.comparisons[0].comparator, n.left),) if op in (cst.LessThanEqual, cst.LessThan) else ()
        for cnt, bound in pairs:
            c, b = dotted(cnt), dotted(bound)
            if c and b and b == acc.text and c in assigned and b not in assigned and _reset_in(loop.node, c):
                _mark_size_counter(dr, loop, acc, c, b)
                return


def _mark_size_counter(dr, loop, acc, counter: str, bound: str) -> None:
    """A counter advanced by the size of each micro-batch (``tokens += batch["input_ids"].numel()``, ``seen +=
    x.size(0)``) and stepped on when it reaches a bound (``if tokens >= max_tokens:``): the window holds
    ``ceil(bound / size)`` micro-batches. The run counts each micro-batch as one unit of that size (micro-batches of
    one size, the last of an epoch aside), so the bound is N units: ``dr._unit_incs`` names the increments the run
    reads as ``+= 1`` and the trace says so (``driver``)."""
    incs = [n for n in _walk(loop.node) if type(n) is cst.AugAssign and dotted(n.target) == counter
            and type(n.operator) is cst.AddAssign]
    if not incs or any(_literal_int(n.value) is not None for n in incs):
        return  # a plain count (``+= 1``), or a mix
    assigned = getattr(loop, "assigned", None) or set()
    for n in incs:
        names = [x for x in _names(n.value)]
        # the increment is a per-micro-batch quantity: it reads something the loop assigns (its batch)
        if not any(x in assigned or x.split(".")[0] in assigned for x in names):
            return
        if any(type(x) is cst.Call and not _size_call(x) for x in _walk(n.value)):
            return
    size = dr.code(incs[0].value).strip()
    dr.__dict__.setdefault("_unit_incs", {})[id(loop)] = (frozenset(id(n) for n in incs),
                                                          f"`{counter}` advanced by `{size}` per micro-batch, "
                                                          f"counted as one micro-batch of that size each",
                                                          f"({bound} / {size})")


def _size_call(call) -> bool:
    """``x.size(0)`` / ``x.size()`` / ``x.numel()`` / ``len(x)`` / ``x.sum()`` (a mask's count) / ``.item()``."""
    if isinstance(call.func, cst.Attribute):
        return call.func.attr.value in ("size", "numel", "sum", "item", "count_nonzero")
    return isinstance(call.func, cst.Name) and call.func.value == "len"


def _set_as_n(f, text: str) -> bool:
    """``text`` is what a framework is configured to accumulate over: ``Accelerator(gradient_accumulation_steps=X)``,
    ``TrainingArguments(gradient_accumulation_steps=X)``, a DeepSpeed plugin / config dict's
    ``"gradient_accumulation_steps": X`` (the keyword of the framework's API, not the name of a variable)."""
    memo = f.__dict__.get("_ga_settings")
    if memo is None:
        memo = set()
        if f.accelerator_ga is not None:
            memo.add(f.accelerator_ga.text)
        for call, _name, _fn in f.t.calls:
            for a in call.args:
                if a.keyword is not None and a.keyword.value in ("gradient_accumulation_steps",
                                                                  "accumulate_grad_batches"):
                    memo.add(code_of(a.value).strip())
        for n in f.t.dict_ga_values if hasattr(f.t, "dict_ga_values") else ():
            memo.add(code_of(n).strip())
        f.__dict__["_ga_settings"] = memo
    return text in memo


_CLIP_NAME = re.compile(r"(^|_)clip(_|$)|clip_?grad|grad_?clip", re.I)


def _no_sync_call(e) -> bool:
    return type(e) is cst.Call and type(e.func) is cst.Attribute and e.func.attr.value in ("no_sync", "no_backward_sync")


def _null_ctx(e) -> bool:
    """``nullcontext()`` / ``contextlib.nullcontext()`` / ``suppress()``: a context manager that does nothing."""
    return type(e) is cst.Call and not e.args and (call_name(e) or "").split(".")[-1] in ("nullcontext", "suppress")


def _clip_by_name(call, func) -> bool:
    """A call of a function held in a variable or attribute named like a gradient clipper (``clip_grad_fun``,
    ``grad_clipper``), handed the parameters (``parameters=model.parameters()`` or the first argument)."""
    if type(func) is cst.Attribute:
        name = func.attr.value
    elif type(func) is cst.Name:
        name = func.value
    else:
        return False
    if name in ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "clip_gradients") or not _CLIP_NAME.search(name):
        return False  # the library's own names are the caller's (its roles decide)
    for a in call.args:
        v = a.value
        if type(v) is cst.Call and type(v.func) is cst.Attribute and v.func.attr.value in ("parameters",
                                                                                         "named_parameters"):
            return True
        if a.keyword is not None and a.keyword.value in ("parameters", "params") :
            return True
    return False


def _feature_dim(node) -> bool:
    """``x.size(k)`` / ``x.shape[k]`` with a literal k >= 1: the size of a tensor along a non-batch dimension."""
    if type(node) is cst.Call and type(node.func) is cst.Attribute and node.func.attr.value == "size" and \
            len(node.args) == 1 and node.args[0].keyword is None:
        k = _literal_int(node.args[0].value)
        return k is not None and k >= 1
    if type(node) is cst.Subscript and type(node.value) is cst.Attribute and node.value.attr.value == "shape" and \
            len(node.slice) == 1 and type(node.slice[0].slice) is cst.Index:
        k = _literal_int(node.slice[0].slice.value)
        return k is not None and k >= 1
    return False


def _literal_int(e) -> Optional[int]:
    v = literal(e) if e is not None else None
    return v if type(v) is int else None


def _step_gate_tests(dr, root, cls, func=None) -> set:
    """ids of the nodes inside the test of an ``if`` (in ``root``) whose body steps an optimizer, a scaler or an
    engine (``.step(...)`` there, or in a same-file function it calls): what a step gate tests, whatever its names."""
    memo = dr.__dict__.setdefault("_gate_tests", {})
    key = id(root)
    got = memo.get(key)
    if got is not None:
        return got
    out: set = set()
    tested: set = set()
    fn = func if func is not None else (root if isinstance(root, cst.FunctionDef) else None)
    for n in _walk(root.body if isinstance(root, cst.FunctionDef) else root):
        if type(n) is not cst.If:
            continue
        steps = False
        for m in _walk(n.body):
            if type(m) is cst.Call:
                if isinstance(m.func, cst.Attribute) and m.func.attr.value == "step":
                    steps = True
                    break
                g = dr.f.callee(m, fn, cls)
                if g is not None and _steps_somewhere(dr, g, dr.f.class_of(g) or cls):
                    steps = True
                    break
        if steps:
            out.update(id(x) for x in _all_nodes(n.test))
            tested.update(x.value for x in _all_nodes(n.test) if type(x) is cst.Name)
    if tested:
        # ``apply_gradient = self.n_accumulated >= self.accum_iters`` then ``if apply_gradient: ...step``
        for n in _walk(root.body if isinstance(root, cst.FunctionDef) else root):
            if type(n) is cst.Assign and len(n.targets) == 1 and type(n.targets[0].target) is cst.Name and \
                    n.targets[0].target.value in tested:
                out.update(id(x) for x in _all_nodes(n.value))
    memo[key] = out
    return out


def _loader_length(small) -> bool:
    """``nb = len(train_loader)``: a name bound to the length of something named, the only call of the statement (run
    before the loops: the run knows its loader's length)."""
    if type(small) is not cst.Assign or len(small.targets) != 1 or type(small.targets[0].target) is not cst.Name:
        return False
    v = small.value
    return type(v) is cst.Call and type(v.func) is cst.Name and v.func.value == "len" and len(v.args) == 1 and \
        type(v.args[0].value) in (cst.Name, cst.Attribute)


def _ramped(dr, node, name: str) -> bool:
    """Every assignment of ``name`` inside the loop is in the arm of an ``if`` that compares a count with a bound
    (``if ni <= nw: accumulate = max(1, np.interp(ni, xi, [1, nbs / batch_size]).round())``): a warm-up ramp of
    the factor towards the value set before the loop. The run models the loop after the ramp: those assignments
    are marked (``dr._ramp_assigns``) and the run keeps N."""
    found = []
    ok = True

    def visit(n, under: bool) -> None:
        nonlocal ok
        for ch in children(n):
            tp = type(ch)
            if tp is cst.If:
                t = ch.test
                ramp = type(t) is cst.Comparison and len(t.comparisons) == 1 and type(
                    t.comparisons[0].operator) in (cst.LessThan, cst.LessThanEqual)
                visit(ch.body, under or ramp)
                if ch.orelse is not None:
                    visit(ch.orelse, under)
                continue
            if tp in (cst.Assign, cst.AugAssign, cst.AnnAssign):
                tg = [x.target for x in ch.targets] if tp is cst.Assign else [ch.target]
                if any(dotted(x) == name for x in tg):
                    if not under or tp is not cst.Assign:
                        ok = False
                    found.append(ch)
            if tp in SCOPE_TYPES:
                continue
            visit(ch, under)

    visit(node.body, False)
    if not ok or not found:
        return False
    dr.__dict__.setdefault("_ramp_assigns", {}).update((id(x), x) for x in found)
    return True


def _since_mark(node, expr, assigned) -> bool:
    """``expr`` is ``a - b`` with ``a`` advanced in the loop and ``b = a`` assigned inside it (the mark of the last
    step): a count of the micro-batches since that step."""
    if type(expr) is not cst.BinaryOperation or type(expr.operator) is not cst.Subtract:
        return False
    a, b = dotted(expr.left), dotted(expr.right)
    if not a or not b or a == b or a not in assigned or b not in assigned:
        return False
    return any(type(n) is cst.Assign and dotted(n.value) == a and any(dotted(t.target) == b for t in n.targets)
               for n in _walk(node))


def _reset_in(node, name: str) -> bool:
    """``name = 0`` somewhere inside the loop: a window counter (restarted after each step)."""
    for n in _walk(node):
        if type(n) is cst.Assign and literal(n.value) == 0 and any(dotted(t.target) == name for t in n.targets):
            return True
    return False


def _callee_window(dr, loop):
    """The micro-batch loop of a step loop that lives in a helper it calls (``run_step()`` ->
    ``forward_backward()``: ``for i in range(0, batch.shape[0], self.microbatch): ... loss.backward()``, then the
    step back in the caller): the one training loop of a same-file callee that runs backwards and never steps, while
    the caller steps. None when the caller has its own window loop or there is not exactly one such loop."""
    if loop.window_of is not None or isinstance(loop, ManualStep) or not loop.callees:
        return None
    if not loop.of("opt_step", "scaler_step"):
        return None
    ids = {id(fn) for fn in loop.callees}
    found = [lp for lp in dr.f if lp is not loop and lp.func is not None and id(lp.func) in ids and not lp.outer
             and lp.window_of is None and isinstance(lp.node, cst.For) and lp.backwards
             and not lp.of("opt_step", "scaler_step", "engine_step")]
    return found[0].node if len(found) == 1 else None


class _Frame:
    __slots__ = ("locals", "func", "cls", "ret", "depth")

    def __init__(self, func, cls, depth: int) -> None:
        self.locals: dict = {}
        self.func = func
        self.cls = cls
        self.ret: Any = None
        self.depth = depth


class _Runner:
    def __init__(self, dr: FileDryRun, loop, n: Optional[int], n_text: str, config: dict, window=None,
                 probe: bool = False) -> None:
        self.dr = dr
        self.f = dr.f
        self.t = dr.f.t
        self.loop = loop
        self.n = n
        self.n_text = n_text
        self.config = config
        self.chain: Optional[list] = None  # configuration keys this run went on past (_run_chain; None: it stops)
        self.chain_absent: set = set()  # configuration keys this run found not fixed (it stops at those)
        # function parameters pinned to their default by the configuration (``enumerate(loader, start=start_step + 1)``
        # with ``start_step=0``: the run where the caller leaves it, e.g. one not resumed from a checkpoint)
        self.pinned = {m.group(1): int(m.group(2)) for m in (_PIN_RE.match(k) for k, v in config.items() if v) if m}
        self.micro = loop.window_of if loop.window_of is not None else (window if window is not None else loop.node)
        self.length = (2 * n + 2) if n and n > 1 else 4
        self.trace = T.Trace(n=n, n_text=n_text or "N", config=dict(config), owner=loop.owner,
                             epoch_len=None, line=0)
        self.trace.n_intended = bool(n and n > 1)
        unit = dr.__dict__.get("_unit_incs", {}).get(id(loop)) if n is not None else None
        if unit:
            # the factor is the bound over the micro-batch's size: how messages spell it (``loss / (max_tokens /
            # batch["input_ids"].numel())``); the run itself reads the bound as N (``self.n_text``)
            self.trace.driver = unit[1]
            self.trace.n_text = unit[2]
        self.mb = -1
        self.epoch = 0
        self.certain = True
        self.conds: list = []
        self.arms: list = []  # (condition text, polarity, last store of a name it reads) of the undecided ifs entered
        self.store_seq = 0
        self.last_store: dict = {}
        self.no_sync = 0
        self.in_acc = 0
        self.sync: Optional[bool] = True
        self.acc_step = 0
        self.last_iter = False
        self.scaled = False  # gradients hold a scaler-scaled backward not yet unscaled
        self.engine_micro = 0
        self.sync_control = False
        self.acc_used = False
        self.acc_recv: Optional[str] = None  # the Accelerator ``accumulate()`` was entered through, as written
        self.n_candidates: list = []
        self.n_nodes: dict = {}  # candidate text -> (its expression, "gate" | "division")
        # the run that looks for N: a period of known value (``% 4``, ``% args.accum`` resolved to 8) is not decided
        # (the probe is shorter than such a window); a step under it makes it the accumulation factor by usage
        self.probe = probe
        self.max_splits = PROBE_SPLITS if probe else MAX_SPLITS
        unit = dr.__dict__.get("_unit_incs", {}).get(id(loop)) if n is not None else None
        self.unit_incs = unit[0] if unit else frozenset()
        self._unit_note = unit[1] if unit else ""
        self.guard_periods: list = []  # (period, first event after the guard, micro-batch, function) of the probe
        self.divisors: set = set()  # texts the loss was divided by (probe run: corroborates a gate's period)
        self.n_hint: set = set()  # candidates for N by their name alone (``_hint``)
        self._last_mod = None
        self.site = None
        self.xsite = None  # the call of this file that entered the sibling module's function being run
        self._arg_texts: list = []  # per inlined call: parameter -> the caller's argument expression
        self._chain: list = []  # the inlined calls that led from the loop body to the statement being run
        self._x_infos: list = []  # the sibling modules whose functions the run inlined
        self.no_grad = 0
        self.alias_depth = 0
        self.store_logs: list = []
        self.shared: dict = {}  # self.* attributes
        self._loader = None
        self._range_len: Optional[str] = None  # ``E`` of a micro-batch loop ``for i in range(E)``: its length
        self._outermost = None
        self._stmt_node = None
        self._cur_block: list = []
        self.depth = 0
        self._xfn = None  # the innermost inlined function of a sibling module (bertlint.analysis.project)
        self._xfns: list = []
        self.in_micro = 0
        self.roles = dr.roles
        self.grad_sync: Optional[bool] = True  # DDP's require_backward_grad_sync as the script sets it
        self.fwd_ns: dict = {}  # id(forward call) -> gradient sync was off when it ran
        self.ns_nodes: list = []  # the enclosing no_sync ``with`` statements
        self.inner_loops: list = []  # the loops inside the micro-batch being run (their bodies run once)
        self._micro_inner = 0  # how many of them were open when the micro-batch loop was entered
        self.train_nodes = {id(lp.node) for lp in dr.f} | {id(lp.window_of) for lp in dr.f if lp.window_of is not None}
        self.scaler_on = _scaler_enabled(dr.f)
        self.cost = 0
        self.loop_names = loop.assigned or set()
        self.local_defs = dr.local_defs(loop.func)
        self.acc_n = self._accelerator_n()
        self.cfg_exprs: dict = {}  # configuration key -> the condition expression it was read from
        self._dotted = dr.dotted
        self.n_ncall = bool(n_text) and ".get(" in n_text  # N spelled as a dict lookup call

    # ------------------------------------------------------------------ facts
    def _accelerator_n(self):
        """(value, text, known) of the Accelerator's accumulation factor: its value, the symbol's representative,
        1 when an Accelerator is built without one; None when the file does not show it (passed in, **kwargs)."""
        f = self.f
        ga = f.accelerator_ga
        if f.accelerator_ga_unknown:
            return None
        if ga is not None:
            if ga.value is not None:
                return (ga.value, ga.text)
            if self.n_text and ga.text == self.n_text:
                return (self.n, ga.text)
            return (self.n if self.n and self.n > 1 else None, ga.text)
        if f.accelerator_calls:
            return (1, "1")
        sib = _sibling_accelerator_n(self)
        if sib is None and self.n_text.endswith(".gradient_accumulation_steps") and \
                self.dr.role(self.n_text.rsplit(".", 1)[0], getattr(self.loop, "func", None))[0] == "accelerator":
            return (self.n, self.n_text)  # an Accelerator from outside the file: its setting is the run's N
        return sib

    # ------------------------------------------------------------------ run
    def run(self) -> T.Trace:
        loop = self.loop
        if isinstance(loop, ManualStep):
            return self._run_manual()
        chain = [o for o in loop.outer] + [loop.node]
        outermost = chain[0]
        self._outermost = outermost  # assignments inside it are looked up lazily (_counter_init)
        # the statements before the outermost loop, along the path from the function body
        path = _path_to(loop.func.body if loop.func is not None else self.dr.ctx.module, outermost) or []
        # no epoch loop around it: the function holding the loop is entered twice (two epochs)
        passes = 2 if len(chain) == 1 else 1
        for p in range(passes):
            frame = _Frame(loop.func, loop.cls, 0)
            if p:
                self.epoch += 1
            for block, idx in path:
                for stmt in block[:idx]:
                    if isinstance(stmt, cst.SimpleStatementLine):
                        self._simple_line(stmt, frame, prefix=True)
            if self._exec_loop(outermost, frame, chain, 0) == "return" and not passes:
                break
            if passes == 2:
                self._after_loop(path, frame)
        self.trace.epochs = 2
        self.trace.epoch_len = self.length
        self.trace.epochs_from = "loop" if passes == 1 else self._reentry(loop)
        # any gradient-sync control anywhere in the file (another configuration may use it): no claim that the
        # loop never turns sync off
        self.trace.sync_control = self.sync_control or any(e.kind == "no_sync" for e in self.trace.events) or \
            self.f.no_sync_used or self.dr.sync_refs
        fact, wrapped = self._ddp_here()
        self.trace.ddp = True if (fact is not None or wrapped) else None
        self.trace.ddp_when = fact[1] if fact is not None else ""
        if fact is not None and fact[2] == "launch" and self.acc_used:
            self.trace.ddp, self.trace.ddp_when = None, ""  # accumulate() owns the sync of the prepared model
        if self.trace.ddp and self._not_ddp_config():
            # this configuration is the one where the model is not a DistributedDataParallel (``if sync or not
            # isinstance(module, DDP): yield`` in a sync helper): nothing all-reduces in it
            self.trace.ddp, self.trace.ddp_when = None, ""
        ran_off = self.sync_control or any(e.kind == "no_sync" for e in self.trace.events)
        if not ran_off and self.trace.sync_control:
            gate = self._fsdp_only_gate()
            if gate is not None:
                # the file turns sync off only for an FSDP model (``if isinstance(model, FSDP) and ...``); this
                # configuration is the other one, where a DistributedDataParallel model (the file imports it)
                # all-reduces on every micro-batch
                self.trace.sync_control = False
                self.trace.ddp = True
                self.trace.ddp_when = (f"when the model is a `DistributedDataParallel` (the file imports it, and "
                                       f"turns sync off only when `{gate}`)")
        self.trace.owner = self._owner()
        self.trace.fsdp_possible = self._fsdp_possible()
        return self.trace

    def _fsdp_possible(self) -> bool:
        """The linted file, or a sibling module whose functions the run inlined, imports torch's FSDP API."""
        if any(q.startswith(_FSDP_MODS) for q in self.t.imports.values()):
            return True
        for info in {id(i): i for i in self._x_infos}.values():
            if any((mod or "").startswith(_FSDP_MODS) for mod, _lvl, _attr in info.imports.values()):
                return True
        return False

    def _reentry(self, loop) -> str:
        """No epoch loop around the training loop: ``call`` when its function may be called once per epoch with the
        same optimizer, ``once`` when the loop runs once per run (module level, or its function builds the optimizer
        it steps: each call is a training of its own)."""
        fn = loop.func
        if fn is None:
            return "once"
        opts = {e.opt or e.target for e in self.trace.events if e.kind == "step"}
        memo = self.dr.__dict__.setdefault("_built_names", {})  # id(function) -> (function, names it assigns a call)
        hit = memo.get(id(fn))
        if hit is None or hit[0] is not fn:
            built = set()
            for n in _walk(fn.body):
                if type(n) is cst.Assign and type(n.value) is cst.Call:
                    for t in n.targets:
                        built.update(_target_names(t.target))
            hit = memo[id(fn)] = (fn, built)
        return "once" if not opts.isdisjoint(hit[1]) else "call"

    def _after_loop(self, path, frame) -> None:
        """No epoch loop around the training loop (its function is one epoch): the statements after the loop, up to
        a ``return``, run at the end of each epoch (a flush of the last partial window: ``if (i + 1) % N:
        optimizer.step()``). Statements holding a loop or a definition are skipped (another loop has its own trace)."""
        self.trace.after_loop = True
        for block, idx in reversed(path):
            for stmt in block[idx + 1:]:
                if isinstance(stmt, (cst.FunctionDef, cst.ClassDef)) or any(
                        isinstance(n, (cst.For, cst.While, cst.FunctionDef, cst.Lambda)) for n in _walk(stmt)):
                    continue
                if self._stmt(stmt, frame, None, 0) is not None:
                    return

    def _not_ddp_config(self) -> bool:
        """The run's configuration took ``isinstance(x, DistributedDataParallel)`` as false."""
        for key, val in self.config.items():
            expr = self.cfg_exprs.get(key)
            while isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
                expr = expr.expression
            if val is not False or not isinstance(expr, cst.Call) or call_name(expr) != "isinstance":
                continue
            cls = positional(expr, 1)
            elems = [e.value for e in cls.elements] if isinstance(cls, cst.Tuple) else [cls] if cls is not None else []
            qs = [self.t.qualname(e) or dotted(e) or "" for e in elems]
            if qs and all(q.endswith(("DistributedDataParallel", ".DDP")) and "FullySharded" not in q for q in qs):
                return True
        return False

    def _fsdp_only_gate(self) -> Optional[str]:
        """The configuration condition ``isinstance(x, FSDP)`` this run took as false, when the file imports
        torch's DistributedDataParallel (so the model may be one) and the test names no DDP class."""
        imps = self.t.imports.values()
        if not any(q.endswith("DistributedDataParallel") and "FullySharded" not in q for q in imps):
            return None
        for key, val in self.config.items():
            expr = self.cfg_exprs.get(key)
            if val is not False or not isinstance(expr, cst.Call) or call_name(expr) != "isinstance":
                continue
            cls = positional(expr, 1)
            if cls is None:
                continue
            elems = [e.value for e in cls.elements] if isinstance(cls, cst.Tuple) else [cls]
            qs = [self.t.qualname(e) or "" for e in elems]
            if qs and all(q.endswith("FullyShardedDataParallel") for q in qs):
                return key
        return None

    def _owner(self) -> str:
        """Who owns accumulation in this run (a configuration may take the DeepSpeed arm or the plain one)."""
        static = self.loop.owner
        if static in ("trainer", "lightning", "unknown"):
            return static
        styles = {e.via for e in self.trace.events if e.kind == "backward" and e.certain}
        if not styles:
            return static
        if self.acc_used:
            return "accelerate"
        if "engine" in styles:
            return "deepspeed"
        if "lightning" in styles:
            return "lightning"
        if "fabric" in styles:
            return "fabric"
        if "accelerator" in styles:
            return "accelerate-manual" if static != "unknown" else static
        return "plain"

    def _run_manual(self) -> T.Trace:
        """Lightning manual optimization: Lightning's own loop calls ``training_step(batch, batch_idx)`` once per
        micro-batch; the body is run with ``batch_idx`` counting from 0 in each epoch."""
        fn = self.loop.func
        kind = getattr(self.loop, "kind", "lightning")
        self._outermost = fn
        params = [p.name.value for p in fn.params.params]
        idx_name = params[2] if kind == "lightning" and len(params) > 2 else None
        first = 1 if kind != "ignite" and params and params[0] in ("self", "cls") else 0
        if kind == "index":
            # every parameter is the caller's per-call value (``step == self.epoch_len - 1``): it changes between
            # calls, so a condition on it is a frequency, never a configuration
            self.loop_names = frozenset(self.loop_names) | frozenset(params[first:])
        counts = getattr(self.loop, "driver_counts", ())
        if counts:
            # the counters the driver advances between calls change from call to call: a frequency, not a
            # configuration
            names = {dotted(x.target) for st, _g in counts for x in st.body if type(x) is cst.AugAssign}
            self.loop_names = frozenset(self.loop_names) | frozenset(n for n in names if n)
        self.in_micro += 1
        # a method with its own counter sees no epochs (one run of calls); a function handed the scaler is one update
        # per call (a few calls)
        epochs = 2 if kind in ("lightning", "ignite") else 1
        length = min(self.length, 3) if kind == "scaler_fn" else self.length
        for ep in range(epochs):
            self.epoch = ep
            for k in range(length):
                self.mb += 1
                self.last_iter = k == length - 1
                frame = _Frame(fn, self.loop.cls, 0)
                for nm in params[first:]:
                    frame.locals[nm] = UNK
                if idx_name:
                    frame.locals[idx_name] = Num(k)
                if kind == "index":
                    frame.locals[self.loop.index] = Num(k)
                for st, g in getattr(self.loop, "driver_counts", ()):
                    self._block([st], _Frame(g, self.loop.cls, 0))  # the driver's per-iteration count
                if kind == "scaler_fn":
                    # each call is one update of gradients the caller produced through the scaler it hands in
                    self.scaled = self.scaler_on
                if kind == "ignite" and params:
                    # ignite's State: iteration counts from 1 over the whole run, epoch from 1
                    frame.locals[params[0] + ".state.iteration"] = Num(self.mb + 1)
                    frame.locals[params[0] + ".state.epoch"] = Num(ep + 1)
                if self._block(_body(fn.body), frame) == "break" and kind != "lightning":
                    pass
        self.in_micro -= 1
        self.trace.epochs = epochs
        self.trace.epoch_len = length
        if kind == "index":
            self.trace.driver = f"`{fn.name.value}()` called once per micro-batch with `{self.loop.index}` = 0, 1, 2, …"
        if kind in ("lightning", "method", "scaler_fn", "index", "step_fn"):
            # the driver (Lightning; for a method, a caller outside this file) may turn gradient sync off around
            # the call: no claim that it never does
            self.trace.owner = "lightning-manual" if kind == "lightning" else self._owner()
            self.trace.sync_control = True
        else:
            self.trace.sync_control = self.sync_control or any(e.kind == "no_sync" for e in self.trace.events) or \
                self.f.no_sync_used or "require_backward_grad_sync" in self.dr.ctx.source
            fact, wrapped = self._ddp_here()
            self.trace.ddp = True if (fact is not None or wrapped) else None
            self.trace.ddp_when = fact[1] if fact is not None else ""  # the wrapping's condition, as in run()
            self.trace.owner = self._owner()
        self.trace.fsdp_possible = self._fsdp_possible()
        return self.trace

    def _ddp_here(self) -> tuple:
        """The file's DistributedDataParallel fact for this loop's model, and whether a name bound to a wrapping can
        reach it: a wrapping counts when its function is connected to the loop's (the same one, nested, methods of
        one class, module level, or one calls or hands on the other, through the file's functions). A wrapping in
        an unrelated function (another test, another entry point) says nothing about this loop's model."""
        dr = self.dr
        fact = dr.ddp_fact
        calls = list(self.f.ddp_calls)
        if not calls:
            return fact, bool(self.f.ddp_wrapped)
        func = getattr(self.loop, "func", None)
        near = [c for c in calls if _connected(dr, _func_of(dr, c), func)]
        if len(near) == len(calls):
            return fact, bool(self.f.ddp_calls or self.f.ddp_wrapped)
        if not near:
            return None, False
        try:
            return _ddp_fact(dr, near), True
        except Exception:
            return fact, True

    def tick(self, k: int = 1) -> None:
        self.cost += k
        if self.cost > BUDGET:
            raise _Abort()

    # ------------------------------------------------------------------ loops
    def _exec_loop(self, node, frame, chain, level) -> Optional[str]:
        """Run a loop of the chain (epoch loops, then the training loop) or the micro-batch loop."""
        is_micro = node is self.micro
        is_train = node is self.loop.node
        if is_micro:
            count = self.length
        elif is_train:  # window-style: the parent of the micro loop runs a few windows per epoch
            count = 3
        else:
            count = 2 if (level == len(chain) - 2 or len(chain) == 1) else 1
        values = self._iter_values(node, frame, count, is_micro)
        if values is None:
            values = [None] * count
        if is_micro and len(values) < count:
            count = len(values)
        if is_micro:
            self.in_micro += 1
            saved_inner, self._micro_inner = self._micro_inner, len(self.inner_loops)
        try:
            return self._iterate(node, frame, chain, level, values, is_micro)
        finally:
            if is_micro:
                self.in_micro -= 1
                self._micro_inner = saved_inner

    def _iterate(self, node, frame, chain, level, values, is_micro) -> Optional[str]:
        for k, bind in enumerate(values):
            if is_micro:
                self.mb += 1
                self.last_iter = k == len(values) - 1
            elif k > 0 and len(chain) > 1 and level == len(chain) - 2 and node is chain[level]:
                self.epoch += 1  # the loop right around the training loop re-enters it: a new epoch
            if isinstance(node, cst.While):
                c = self.truth(node.test, frame)
                if c is False:
                    break
            if bind is not None and isinstance(node, cst.For):
                self._bind(node.target, bind, frame)
            elif isinstance(node, cst.For):
                self._bind(node.target, UNK, frame)
            sig = self._block(_body(node.body), frame, chain, level)
            if is_micro and self.probe and (self.n_candidates or self.guard_periods):
                raise _Abort()  # the probe has what it looks for after one whole micro-batch: N by usage
            if sig == "break":
                break
            if sig == "return":
                return "return"
            if self.mb >= 4 * self.length + 8:
                break
        return None

    def _iter_values(self, node, frame, count: int, is_micro: bool) -> Optional[list]:
        """Values bound to the loop target per iteration (None: unknown), at most ``count``."""
        if is_micro:
            self.trace.loader = self._loader_kind(node, frame)
        if not isinstance(node, cst.For):
            if is_micro and node is self.loop.window_of and self.n:
                return [None] * self.n  # a counted ``while`` window (``_while_window_factor``): N iterations
            return [None] * count
        it = self._held_iter(_unwrap_iter(node.iter), frame)
        tgt = node.target
        inner = it
        name = call_name(it) if isinstance(it, cst.Call) else None
        if name == "enumerate" and isinstance(it, cst.Call):
            start_e = positional(it, 1) or kwarg(it, "start")
            start = 0 if start_e is None else self._int(self.ev(start_e, frame))
            if start is None and is_micro:
                self._pin_default(start_e, frame)
            inner = positional(it, 0)
            self._loader = inner
            if isinstance(tgt, (cst.Tuple, cst.List)) and len(tgt.elements) == 2:
                return [("enum", None if start is None else start + k) for k in range(count)]
            return [None] * count
        if name == "range" and isinstance(it, cst.Call):
            args = [self.ev(a.value, frame) for a in it.args if a.keyword is None]
            ints = [self._int(a) for a in args]
            if len(ints) == 1:
                a, b, s = 0, ints[0], 1
            elif len(ints) >= 2:
                a, b = ints[0], ints[1]
                s = ints[2] if len(ints) > 2 else 1
            else:
                return [None] * count
            if a is None and not is_micro and len(ints) >= 2 and id(self.loop) in self.dr.__dict__.get(
                    "_since_loops", ()):
                # a gate on the micro-batches since the last step counted from the epoch (``ni = i + nb * epoch``)
                a = self._fresh_start([x.value for x in it.args if x.keyword is None][0])
            window = is_micro and node is not self.loop.node
            if is_micro and not window and b is None and a == 0 and s == 1:
                # ``for itr in range(E)``: the simulated loop is E iterations long, so ``itr + 1 == E`` is its
                # last iteration (as ``len(loader)`` is the simulated length of a loader)
                bound = [x.value for x in it.args if x.keyword is None][-1]
                if isinstance(bound, (cst.Name, cst.Attribute)):
                    self._range_len = self.dr.code(bound)
            if window and self.n and (b is None or s in (None, 0)):
                count = self.n  # a window loop of unknown bounds runs N times (N: its own iteration count)
            if a is None:
                return [("idx", None)] * count
            if b is None or s in (None, 0):
                if s is None and len(ints) > 2:
                    return [("idx", a if k == 0 else None) for k in range(count)]
                return [("idx", a + k * (s or 1)) for k in range(count)]
            vals = list(range(a, b, s))[:count if not is_micro or node is not self.loop.window_of else 64]
            return [("idx", v) for v in vals]
        self._loader = it
        return [None] * count

    def _fresh_start(self, expr) -> Optional[int]:
        """The first epoch of a run started afresh: ``for epoch in range(start_epoch, epochs)`` with
        ``start_epoch = 0`` before the loops and a resumed value read from a checkpoint in a branch (``start_epoch,
        ... = smart_resume(...)``): the literal, the one value the file gives it. Counts derived from the epoch
        (``ni = i + nb * epoch``) then run from it; None when the file gives no such single literal."""
        if type(expr) is not cst.Name:
            return None
        func = getattr(self.loop, "func", None)
        try:
            assigns = self.t.assignments_of(expr.value, func) or []
        except Exception:
            return None
        inside = self.dr.inside(self._outermost) if self._outermost is not None else set()
        vals = {self.f.r.int_value(a.value, a.func) for a in assigns if a.node is None or id(a.node) not in inside}
        vals.discard(None)
        return vals.pop() if len(vals) == 1 else None

    def _prefix_loader(self, frame):
        """The loader the micro-batch loop iterates, read from its ``for`` statement before the run reaches it (a
        length taken before the loops: ``nb = len(train_loader)``, then ``ni = i + nb * epoch``); None when the
        loop does not iterate a loader by name."""
        node = getattr(self.loop, "node", None)
        if type(node) is not cst.For:
            return None
        try:
            it = _unwrap_iter(self._held_iter(_unwrap_iter(node.iter), frame))
        except Exception:
            return None
        if isinstance(it, cst.Call) and (call_name(it) or "") == "enumerate":
            it = positional(it, 0)
        if isinstance(it, cst.Call) and (call_name(it) or "") == "range":
            return None
        return it if isinstance(it, (cst.Name, cst.Attribute)) else None

    def _held_iter(self, it, frame):
        """``pbar = enumerate(train_loader)`` (then ``pbar = tqdm(pbar, total=nb)``) and ``for i, b in pbar``: the
        enumerate / range a variable of the function holds, when every assignment to it there is that call or a
        wrapper of the variable itself; else the expression unchanged."""
        if type(it) is not cst.Name or frame.func is None:
            return it
        found = None
        for a in self.t.assignments_of(it.value, frame.func) or []:
            if a.func is not frame.func or a.value is None:
                continue
            v = _unwrap_iter(a.value)
            if isinstance(v, cst.Call) and (call_name(v) or "") in ("enumerate", "range"):
                if found is not None and self.dr.code(found) != self.dr.code(v):
                    return it
                found = v
                continue
            if isinstance(v, cst.Call) and type(positional(v, 0)) is cst.Name and positional(v, 0).value == it.value:
                continue  # ``pbar = tqdm(pbar, ...)``: the same iteration, wrapped
            return it
        return found if found is not None else it

    def _n_sources(self) -> frozenset:
        """What the accumulation factor's name is an alias of: the one expression (a name or attribute) every
        assignment to it in the file holds (``accum_grad = self.accum_grad`` makes ``self.accum_grad`` N as well,
        read by the helpers the loop calls)."""
        got = self.__dict__.get("_nsrc")
        if got is None:
            vals = set()
            for a in self.t.assignments.get(self.n_text, []) or []:
                if a.value is None:
                    continue
                vals.add(self.dr.code(a.value).strip() if isinstance(a.value, (cst.Name, cst.Attribute)) else None)
            got = frozenset(vals) if len(vals) == 1 and None not in vals else frozenset()
            if not vals:
                got = self._n_param_sources()
            self._nsrc = got
        return got

    def _n_param_sources(self) -> frozenset:
        """The factor is a parameter of a function of this file (``def update(..., batch_idx, accum): if (batch_idx
        + 1) % accum == 0: optimizer.step()``): the one name or attribute every call of that function in the file
        passes for it (``update(model, opt, i, accum_grad)``) is N too, so the caller's value reaches the helper's
        gate. Empty when the callers pass different expressions or something else."""
        vals = set()
        for fn in [d for d in self.t.defs if isinstance(d, cst.FunctionDef)]:
            params = list(fn.params.params)
            names = [p.name.value for p in params]
            if self.n_text not in names and self.n_text not in {p.name.value for p in fn.params.kwonly_params}:
                continue
            is_method = self.t.method_class.get(id(fn)) is not None
            pos = names[1:] if is_method and names and names[0] in ("self", "cls") else names
            for c, cname, _ in self.t.calls:
                if cname.rsplit(".", 1)[-1] != fn.name.value:
                    continue
                arg = None
                for a in c.args:
                    if a.star:
                        return frozenset()
                    if a.keyword is not None and a.keyword.value == self.n_text:
                        arg = a.value
                if arg is None and self.n_text in pos:
                    k = pos.index(self.n_text)
                    plain = [a for a in c.args if a.keyword is None]
                    if k < len(plain):
                        arg = plain[k].value
                if arg is None:
                    continue
                vals.add(self.dr.code(arg).strip() if isinstance(arg, (cst.Name, cst.Attribute, cst.Subscript))
                         else None)
        return frozenset(vals) if len(vals) == 1 and None not in vals and self.n_text not in vals else frozenset()

    def _n_multiples(self) -> frozenset:
        """The names the accumulation factor is computed from as a numerator: every assignment to it in the file is
        ``X // Y`` or ``X / Y`` (``num_accumulation_rounds = batch_gpu_total // batch_gpu``), so ``X`` is N × Y — a
        loss divided by ``X`` is divided by N (times something of unknown value), not by an N-independent weight."""
        got = self.__dict__.get("_nmul")
        if got is None:
            vals = set()
            for a in self.t.assignments.get(self.n_text, []) or []:
                v = a.value
                ok = type(v) is cst.BinaryOperation and type(v.operator) in (cst.Divide, cst.FloorDivide) and \
                    isinstance(v.left, (cst.Name, cst.Attribute))
                vals.add(self.dr.code(v.left).strip() if ok else None)
            got = frozenset(vals) if len(vals) == 1 and None not in vals else frozenset()
            self._nmul = got
        return got

    def _pin_default(self, expr, frame) -> None:
        """The micro-batch index starts at an expression of the loop function's own parameter whose default is an
        integer (``enumerate(loader, start=start_step + 1)``, ``start_step=0``), never assigned in the function: the
        run splits into the configuration where the parameter has its default (a caller that leaves it, or passes
        that value) and the one where it is unknown."""
        fn = self.loop.func
        if fn is None or frame.depth != 0 or len(self.config) >= self.max_splits:
            return
        names = {n.value for n in _walk(expr) if type(n) is cst.Name}
        for prm in list(fn.params.params) + list(fn.params.kwonly_params):
            nm = prm.name.value
            if nm not in names or prm.default is None or nm in self.pinned:
                continue
            d = self.f.r.int_value(prm.default, None) if not isinstance(prm.default, cst.Integer) else \
                int(prm.default.value, 0)
            if not isinstance(d, int) or isinstance(d, bool) or any(
                    a.func is fn for a in (self.t.assignments_of(nm, fn) or [])):
                continue
            if not self._default_reachable(fn, prm, d):
                continue
            key = f"!when `{nm}` has its default {d}"
            if key not in self.config:
                raise _Split(key)

    def _default_reachable(self, fn, prm, d: int) -> bool:
        """Some call of ``fn`` in this file leaves the parameter out or passes its default, or none is seen (the
        caller is elsewhere): the default is a run that happens."""
        params = list(fn.params.params)
        pos = next((i for i, p in enumerate(params) if p is prm), None)
        if pos is not None and params and params[0].name.value in ("self", "cls"):
            pos -= 1
        calls = [c for c, name, _ in self.t.calls if name.split(".")[-1] == fn.name.value]
        if not calls:
            return True
        for c in calls:
            if any(a.star for a in c.args):
                return True  # ``f(*args)``: not known, the default may be what it gets
            got = kwarg(c, prm.name.value)
            if got is None and pos is not None and pos >= 0:
                got = positional(c, pos)
            if got is None or literal(got) == d:
                return True
        return False

    def _loader_kind(self, node, frame) -> str:
        """What the micro-batch loop iterates: ``loader`` (a data loader, or ``range(len(loader))``: its length is not
        known to the dry run), ``range`` (a range of steps: how it relates to an epoch is not known), ``while``."""
        if not isinstance(node, cst.For):
            return "while"
        it = self._held_iter(_unwrap_iter(node.iter), frame)
        if isinstance(it, cst.Call) and call_name(it) == "enumerate":
            tgt = node.target
            if isinstance(tgt, (cst.Tuple, cst.List)) and tgt.elements and isinstance(tgt.elements[0].value, cst.Name):
                self.trace.index_text = tgt.elements[0].value.value
            it = positional(it, 0)
            it = _unwrap_iter(it) if isinstance(it, cst.Call) else it
        if isinstance(it, cst.Call) and call_name(it) == "range":
            args = [a.value for a in it.args if a.keyword is None]
            if len(args) == 1 and isinstance(args[0], cst.Call) and call_name(args[0]) == "len" and args[0].args:
                ld = args[0].args[0].value
                if isinstance(ld, (cst.Name, cst.Attribute)):
                    self.trace.loader_text = self.dr.code(ld)
                return "loader"
            return "range"
        ld = it
        while isinstance(ld, cst.Call) and ld.args:
            ld = ld.args[0].value
        if isinstance(ld, (cst.Name, cst.Attribute)):
            self.trace.loader_text = self.dr.code(ld)
        return "loader"

    def _bind(self, target, bind, frame) -> None:
        if bind is None or bind is UNK:
            for nm in _target_names(target):
                self.store(nm, UNK, frame)
            return
        kind, v = bind
        if kind == "enum" and isinstance(target, (cst.Tuple, cst.List)):
            idx = dotted(target.elements[0].value)
            if idx:
                self.store(idx, Num(v), frame)
            for nm in _target_names(target.elements[1].value):
                self.store(nm, UNK, frame)
            return
        if kind == "idx":
            d = dotted(target)
            if d:
                self.store(d, Num(v), frame)
                return
        for nm in _target_names(target):
            self.store(nm, UNK, frame)

    # ------------------------------------------------------------------ statements
    def _block(self, stmts, frame, chain=None, level=0) -> Optional[str]:
        saved = self._cur_block
        self._cur_block = stmts
        try:
            for stmt in stmts:
                sig = self._stmt(stmt, frame, chain, level)
                if sig is not None:
                    return sig
        finally:
            self._cur_block = saved
        return None

    def _stmt(self, stmt, frame, chain, level) -> Optional[str]:
        self.cost += 1  # (tick(), inlined: the hottest call of the run)
        if self.cost > BUDGET:
            raise _Abort()
        tp = type(stmt)
        if tp is cst.SimpleStatementLine or tp is cst.SimpleStatementSuite:
            return self._simple_line(stmt, frame)
        if tp is cst.If:
            return self._if(stmt, frame, chain, level)
        if tp is cst.For or tp is cst.While:
            if chain is not None and level + 1 < len(chain) and stmt is chain[level + 1]:
                return self._exec_loop(stmt, frame, chain, level + 1)
            if stmt is self.micro:
                return self._exec_loop(stmt, frame, chain or [], level + 1)
            return self._inner_loop(stmt, frame)
        if tp is cst.With:
            return self._with(stmt, frame, chain, level)
        if tp is cst.Try:
            sig = self._block(_body(stmt.body), frame, chain, level)
            if stmt.orelse is not None and sig is None:
                sig = self._block(_body(stmt.orelse.body), frame, chain, level)
            if stmt.finalbody is not None:
                s2 = self._block(_body(stmt.finalbody.body), frame, chain, level)
                sig = sig or s2
            return sig
        if tp in (cst.FunctionDef, cst.ClassDef):
            return None
        # match and others: bodies uncertain
        saved = self.certain
        self.certain = False
        try:
            for child in stmt.children:
                if isinstance(child, cst.BaseSuite):
                    self._block(_body(child), frame, chain, level)
        finally:
            self.certain = saved
        return None

    def _inner_loop(self, stmt, frame) -> Optional[str]:
        """A loop that is not the micro-batch loop (over parameters, optimizers, tasks): its body runs once."""
        if id(stmt) in self.train_nodes and (not isinstance(self.loop, ManualStep) or id(stmt) in self.dr.stepping):
            # this loop only drives another training loop (``for epoch ...: train_one_epoch()``): that loop has
            # its own trace
            self.trace.complete = False
            self.trace.notes.append("drives another training loop")
            raise _Abort()
        if isinstance(stmt, cst.For):
            self.ev(stmt.iter, frame)
            for nm in _target_names(stmt.target):
                self.store(nm, UNK, frame)
        self.inner_loops.append(stmt)
        # a loop of backwards inside one micro-batch (one per task / dataset, ``loops._gated_on_parent``) runs its
        # body twice: an optimizer step inside it, under the micro-batch counter's gate, then runs twice per window
        runs = 2 if id(stmt) in (self.f.__dict__.get("multi_backward") or ()) else 1
        try:
            for _ in range(runs):
                sig = self._block(_body(stmt.body), frame)
                if sig in ("return", "break"):
                    break
        finally:
            self.inner_loops.pop()
        if sig == "return":
            return sig
        return None

    def _if(self, stmt, frame, chain, level) -> Optional[str]:
        rel = self.dr.relevant_branch(stmt, self.f, frame.func, frame.cls)
        modes = _mode_chain(stmt) if isinstance(stmt.orelse, cst.If) else None
        if modes:
            self._exclusive_modes(modes, before=True)
        c = self.truth(stmt.test, frame, split=rel, split_parts=rel and self.dr.sync_branch(stmt))
        line = 0
        if c is True:
            if modes:
                self._exclusive_modes(modes, before=False)
            self.conds.append((line, stmt.test))
            try:
                return self._block(_body(stmt.body), frame, chain, level)
            finally:
                self.conds.pop()
        if c is False:
            if stmt.orelse is None:
                return None
            if isinstance(stmt.orelse, cst.If):
                return self._if(stmt.orelse, frame, chain, level)
            self.conds.append((line, stmt.test))
            try:
                return self._block(_body(stmt.orelse.body), frame, chain, level)
            finally:
                self.conds.pop()
        # undecidable and varying: both arms, uncertain; their terminators are assumed not taken. Each arm starts
        # from the state before the ``if``; afterwards a value the arms leave different is unknown (the same loss
        # scale, the same number on both paths is kept: ``if last: out = f() else: with no_sync(): out = f()``)
        # (the probe's trace is not kept; a ``continue`` / ``break`` of a loop inside the micro-batch, one of an
        # inlined helper's ``for k, v in kwargs.items()`` included, skips nothing of the micro-batch loop)
        exits = self.dr.loop_exits(stmt) if self.in_micro and not self.trace.undecided_skip and not self.probe \
            and len(self.inner_loops) == self._micro_inner else None
        if exits and not self._training_stop(stmt, exits):
            self.trace.undecided_skip = True  # which micro-batches run (or end the epoch) is not known
        mod = self._last_mod if self.n is None else None
        if mod is None and self.n is None:
            mod = _reset_counter_bound(stmt)  # ``if step_cnt == args.accumulate_step: ...; step_cnt = 0``
        first_ev = len(self.trace.events)
        saved = self.certain
        self.certain = False
        self.conds.append((line, stmt.test))
        arm_key = _norm(self.dr.code(stmt.test))
        arm_seq = max((self.last_store.get(nm, 0) for nm in self.dr.names_calls(stmt.test)[0]), default=0)
        self.arms.append((arm_key, True, arm_seq))
        before_l, before_s = dict(frame.locals), dict(self.shared)
        self.store_logs.append(set())
        arm1 = None
        else_ev = None
        try:
            self._block(_body(stmt.body), frame, chain, level)
            else_ev = len(self.trace.events) - first_ev
            self.arms[-1] = (arm_key, False, arm_seq)
            stored1 = self.store_logs.pop()
            arm1 = (dict(frame.locals), dict(self.shared), stored1)
            self.store_logs.append(set())
            _restore(frame.locals, before_l, stored1)
            _restore(self.shared, before_s, stored1)
            if stmt.orelse is not None:
                if isinstance(stmt.orelse, cst.If):
                    self._if(stmt.orelse, frame, chain, level)
                else:
                    self._block(_body(stmt.orelse.body), frame, chain, level)
        finally:
            self.certain = saved
            self.conds.pop()
            self.arms.pop()
            stored = self.store_logs.pop()
            if arm1 is not None:
                _merge_arms(frame.locals, before_l, arm1[0], arm1[2], stored)
                _merge_arms(self.shared, before_s, arm1[1], arm1[2], stored)
                stored = stored | arm1[2]
            else:
                _merge(frame.locals, before_l, stored)
                _merge(self.shared, before_s, stored)
            if self.store_logs:
                self.store_logs[-1] |= stored
        if mod is not None:
            self._period_gate(mod, self.trace.events[first_ev:], frame, else_ev)
            if self.probe and stmt.orelse is None and _ends_iteration(stmt.body):
                # ``if (i + 1) % M: continue`` — the rest of the iteration (the step) runs on the other side
                self.guard_periods.append((mod, len(self.trace.events), self.mb, frame.func))
        return None

    def _training_stop(self, stmt, exits) -> bool:
        """``_training_stop`` of the statement in this loop (``exits``: ``FileDryRun.loop_exits``), once per file."""
        memo = self.dr.__dict__.setdefault("_stops", {})
        key = (id(stmt), id(self.loop))
        hit = memo.get(key)
        if hit is None or hit[0] is not stmt or hit[1] is not self.loop:
            hit = memo[key] = (stmt, self.loop, _training_stop(stmt, self.loop, exits))
        return hit[2]

    def _hint(self, v: Optional[int], text: str, node, source: str) -> None:
        """A candidate for N by its name alone (``loss / args.grad_accum``): ranked after those found by usage, and
        what rests on it is lowered a severity (``by_name``); a step gate of that period makes it N by usage."""
        if any(t == text for _v, t in self.n_candidates):
            return
        self.n_candidates.append((v, text))
        self.n_nodes.setdefault(text, (node, source))
        self.n_hint.add(text)

    def _period_gate(self, mod, arm_events: list, frame, else_ev: Optional[int] = None) -> None:
        """Roles from usage: a condition ``x % M ...`` (M unknown, any name) that gates an optimizer step makes M
        the accumulation factor when the loss is also divided by M, or when it is the loop's only optimizer and no
        backward runs under the gate (one backward per micro-batch, the step every M-th: a WGAN's generator, whose
        backward runs with its step under ``i % n_critic == 0``, is not accumulation)."""
        steps = [e for e in arm_events if e.kind == "step"]
        if not steps:
            return
        text = self.dr.code(mod)
        if any(t == text for _v, t in self.n_candidates):
            self.n_nodes[text] = (mod, "gate")  # the loss divisor is also the step gate's period
            self.n_hint.discard(text)  # N by usage now, whatever its name
            return
        divided = text in self.divisors
        if not divided:
            body, other = (arm_events[:else_ev], arm_events[else_ev:]) if else_ev is not None else (arm_events, [])
            if any(e.kind == "backward" for e in body) and not any(e.kind == "backward" for e in other):
                return  # a backward only under the gate: its own update every M-th micro-batch (a GAN's generator)
            opts = {e.opt for e in self.trace.events if e.kind == "step"}
            if len(opts) != 1 or not any(e.kind == "backward" for e in self.trace.events):
                return
        v = self._resolved(mod, frame)
        self.n_candidates.append((v.v if isinstance(v, Num) and v.v is not None and v.v > 1 else None, text))
        self.n_nodes.setdefault(text, (mod, "gate"))
        if self.probe and self.n_candidates[-1][0] is not None:
            raise _Abort()  # a step gate's period of known value: the probe's answer (nothing ranks above it)

    def _with(self, stmt, frame, chain, level) -> Optional[str]:
        acc = nosync = False
        nograd = False
        for item in stmt.items:
            e = item.item
            if type(e) is cst.IfExp:
                e = self._ctx_arm(e, frame)  # ``with model.no_sync() if use_ddp() else nullcontext():``
                if e is None:
                    continue  # the null context: nothing entered
            if isinstance(e, cst.Call) and (call_name(e) or "").split(".")[-1] in ("no_grad", "inference_mode"):
                nograd = True
                continue
            if isinstance(e, cst.Call) and isinstance(e.func, cst.Attribute):
                attr = e.func.attr.value
                recv = dotted(e.func.value)
                if attr == "accumulate" and recv is not None:
                    k, _ = self.dr.role(recv, frame.func)
                    if k == "accelerator" or recv.split(".")[-1] in ("accelerator", "accel"):
                        acc = True
                        self.acc_recv = recv
                        sites = self.trace.sites.setdefault("accumulate", [])
                        if all(x is not e for x in sites):
                            sites.append(e)
                        self._enter_accumulate()
                        continue
                if attr in ("no_sync", "no_backward_sync"):
                    nosync = True
                    self.emit("no_sync", e, target=recv or "")
                    for a in e.args:
                        self.ev(a.value, frame)
                    continue
            v = self.ev(e, frame)
            if isinstance(e, cst.Call) and item.asname is not None and \
                    isinstance(positional(e, 0), (cst.Name, cst.Attribute, cst.Subscript)):
                # a context manager handed the loss yields a loss (apex ``with amp.scale_loss(loss, opt) as
                # scaled:`` — the loss times the loss scale); another one: its factors times an unknown one
                a0 = self.ev(positional(e, 0), frame)
                nm = (call_name(e) or "").split(".")[-1]
                if isinstance(a0, Tensor) and a0.scale is not None:
                    fac = T.Factor(T.SCALER, "apex amp loss scale") if nm == "scale_loss" else \
                        T.Factor(T.OTHER, self.dr.code(e.func) + "()")
                    v = Tensor(a0.scale.times(fac), a0.graph, a0.node, a0.since)
                elif nm == "scale_loss" or isinstance(v, Tensor):
                    # the loss handed in is not known here (a helper's tuple, an argument): what the manager yields
                    # is that unknown loss times its scale, not a fresh tensor of scale 1
                    v = UNK
            if isinstance(v, _CtxFn) and v.kind == "no_sync":
                nosync = True
                self.emit("no_sync", e, target=v.text)
                continue
            if item.asname is not None:
                for nm in _target_names(item.asname.name):
                    self.store(nm, v if isinstance(v, Tensor) else UNK, frame)
        if acc:
            self.in_acc += 1
        if nosync:
            self.no_sync += 1
            self.ns_nodes.append(stmt)
        if nograd:
            self.no_grad += 1
        try:
            return self._block(_body(stmt.body), frame, chain, level)
        finally:
            if nograd:
                self.no_grad -= 1
            if acc:
                self.in_acc -= 1
            if nosync:
                self.no_sync -= 1
                self.ns_nodes.pop()

    def _ctx_arm(self, e: cst.IfExp, frame):
        """The context manager a conditional ``with`` item enters: the arm its test decides, or, undecided, the
        ``no_sync()`` arm of ``no_sync() if <ddp on> else nullcontext()`` (the other arm runs only where there is no
        DDP, whose sync it would decide). None for a null context; the item itself when neither holds."""
        c = self.truth(e.test, frame)
        if c is True:
            arm = e.body
        elif c is False:
            arm = e.orelse
        elif self._fixed_test(e.test, frame) and _no_sync_call(e.body) and _null_ctx(e.orelse):
            arm = e.body
        elif self._fixed_test(e.test, frame) and _no_sync_call(e.orelse) and _null_ctx(e.body):
            arm = e.orelse
        else:
            return e
        return None if _null_ctx(arm) else arm

    def _micro_count(self, e, frame) -> bool:
        """A size of a tensor made in this micro-batch (``_own_size``), or a sum / product of such sizes
        (``pos.size(0) + neg.size(0)``); a parenthesised one too."""
        t = type(e)
        if t is cst.BinaryOperation and type(e.operator) in (cst.Add, cst.Multiply):
            return self._micro_count(e.left, frame) and self._micro_count(e.right, frame)
        return self._own_size(e, frame)

    def _fixed_test(self, expr, frame) -> bool:
        """A condition read from nothing the run varies: no local variable of the running function, no name the
        loop assigns (``use_ddp()``, ``dist.is_initialized()``, ``self.distributed``) — the same on every
        micro-batch, so it says whether DDP runs, not which micro-batch this is."""
        names, _ = self.dr.names_calls(expr)
        for n in names:
            base = n.split(".")[0]
            if n in self.loop_names or (base != "self" and (base in self.loop_names or base in frame.locals)):
                return False
        return True

    def _enter_accumulate(self) -> None:
        self.acc_used = True
        an = self.acc_n
        if an is None:
            self.sync = None
            return
        n = an[0]
        if n is None:
            self.sync = None
            return
        if self.last_iter:  # end of the (prepared) dataloader
            self.acc_step = 0
            self.sync = True
        else:
            self.acc_step += 1
            self.sync = self.acc_step % n == 0 if n else None
        if self.sync and n > 1:
            self.emit("counter", None, target="sync", value=True)

    def _simple_line(self, stmt, frame, prefix: bool = False) -> Optional[str]:
        self._stmt_node = stmt
        for small in stmt.body:
            tp = type(small)
            if prefix and (tp not in (cst.Assign, cst.AnnAssign, cst.AugAssign) or
                           (self.dr.names_calls(small)[1] and not _loader_length(small))) \
                    and not _zero_grad_call(small):
                continue
            if tp is cst.Expr:
                self._discarded = small.value  # a call whose value nothing keeps (``self.evaluate(rate)``)
                self.ev(small.value, frame)
            elif tp is cst.Assign:
                if self.n is not None and self.dr.__dict__.get("_ramp_assigns", {}).get(id(small)) is small:
                    continue  # the factor's warm-up ramp: the run models the loop after it (``_ramped``)
                v = self.ev(small.value, frame)
                if type(small.value) is cst.Dict:
                    v = self._dict(small.value, frame)
                elif self.inner_loops and isinstance(v, Tensor) and v.graph and _self_add(small):
                    v = _summed_in(v, self.inner_loops[-1])  # ``total = total + loss`` in a loop in the micro-batch
                for t in small.targets:
                    self._assign(t.target, v, frame)
            elif tp is cst.AnnAssign:
                if small.value is not None:
                    self._assign(small.target, self.ev(small.value, frame), frame)
            elif tp is cst.AugAssign:
                self._augassign(small, frame)
            elif prefix:
                continue
            elif tp is cst.Return:
                if frame.depth == 0:
                    if self.certain:
                        return "return"
                    continue
                if self.certain:
                    frame.ret = self.ev(small.value, frame) if small.value is not None else None
                    return "return"
                if small.value is not None:
                    v = self.ev(small.value, frame)
                    if frame.ret is None:
                        frame.ret = v
            elif tp is cst.Continue:
                if self.certain:
                    return "continue"
            elif tp is cst.Break:
                if self.certain:
                    return "break"
            elif tp is cst.Raise:
                if self.certain:
                    self.trace.raised = True
                    return "break" if frame.depth == 0 else "return"
        return None

    def _dict(self, d: cst.Dict, frame) -> "DictVal":
        """``loss_dict = {"batch_idx": batch_idx, ...}``: a dict whose string-keyed slots the run keeps (it is
        shared with the helpers it is handed to)."""
        out = DictVal()
        for el in d.elements:
            if isinstance(el, cst.DictElement):
                v = self.ev(el.value, frame)
                if isinstance(el.key, cst.SimpleString):
                    out.slots[el.key.value[1:-1]] = v
        return out

    def _assign(self, target, v, frame) -> None:
        tt = type(target)
        if tt is cst.Tuple or tt is cst.List:
            for el in target.elements:
                self._assign(el.value, v if isinstance(v, Tensor) else UNK, frame)
            return
        hit = self._dotted.get(id(target))
        if hit is not None and hit[0] is target:
            d = hit[1]
        else:
            d = dotted(target)
            self._dotted[id(target)] = (target, d)
        if d is None:
            if tt is cst.Subscript:
                base = self.ev(target.value, frame)
                key = _str_key(target)
                if isinstance(base, DictVal) and key is not None:
                    base.slots[key] = v
            return
        if self.n_text and d == self.n_text and self.n is not None and not (isinstance(v, Num) and v.v is not None):
            v = Num(self.n, True, d)  # the accumulation factor keeps the value the run uses
        if isinstance(v, Num) and not v.text:
            v = Num(v.v, v.is_n, d)  # the value remembers the name it was bound to (``N_ACCUM = 4``)
        if d.endswith(".require_backward_grad_sync"):
            self.grad_sync = v if isinstance(v, bool) else None
            self.sync_control = True
        if d.endswith(".grad") and isinstance(v, Tensor) and v.scale is not None:
            self.emit("rescale", target, scale=v.scale)
        self.store(d, v, frame)

    def _augassign(self, node: cst.AugAssign, frame) -> None:
        d = dotted(node.target)
        rhs = self.ev(node.value, frame)
        op = type(node.operator)
        if d is not None and (d.endswith(".grad") or d.endswith(".grad.data")):
            self.emit("rescale", node, scale=T.Scale((T.Factor(T.OTHER, self.dr.code(node.value)),)))
            return
        if d is None:
            return
        cur = self.load(d, frame)
        if self.unit_incs and id(node) in self.unit_incs:
            rhs = Num(1)  # one micro-batch's worth of the size counter (``_mark_size_counter``)
        binop = {cst.AddAssign: cst.Add, cst.SubtractAssign: cst.Subtract, cst.MultiplyAssign: cst.Multiply,
                 cst.DivideAssign: cst.Divide, cst.FloorDivideAssign: cst.FloorDivide, cst.ModuloAssign: cst.Modulo}.get(op)
        if binop is None:
            self.store(d, UNK, frame)
            return
        new = self._binop(binop, cur, rhs, node.value, node)
        if binop is cst.Add and isinstance(rhs, Tensor) and rhs.graph:
            if self.inner_loops and isinstance(new, Tensor):
                new = _summed_in(new, self.inner_loops[-1])  # ``total += loss`` in a loop inside the micro-batch
            self.emit("keep_loss", node, target=d)
        elif binop is cst.Add and self.in_micro and isinstance(rhs, Num) and rhs.v is not None and rhs.v > 0:
            # a hand counter advanced (``global_step += 1``): which micro-batches advance it (BL110)
            self.emit("counter", node, target=d, value=new.v if isinstance(new, Num) else None, via="hand")
        self.store(d, new, frame)

    # ------------------------------------------------------------------ names
    def store(self, name: str, v, frame) -> None:
        if self.store_logs:
            self.store_logs[-1].add(name)
        self.store_seq += 1
        self.last_store[name] = self.store_seq
        if isinstance(v, _Unk) and v.inv and self.n_text and frame.depth == 0 and name in self._n_multiples():
            v = _Unk(False, name)  # ``N = total // per_round``: ``total`` is N × per_round (see _n_multiples)
        if name.startswith("self."):
            self.shared[name] = v
        else:
            frame.locals[name] = v

    def load(self, name: str, frame):
        if name == self._range_len:
            got = self.shared.get(name) if name.startswith("self.") else frame.locals.get(name)
            if got is None or got is UNK or isinstance(got, _Unk) or (isinstance(got, Num) and got.v is None):
                return Num(self.length, text=name)  # the bound of the micro-batch loop's ``range(E)``: its length
        if name.startswith("self."):
            if name in self.shared:
                return self.shared[name]
        elif name in frame.locals:
            return frame.locals[name]
        v = self._initial(name, frame)
        if name.startswith("self."):  # a first read is not a store (an undecided branch does not change it)
            self.shared[name] = v
        else:
            frame.locals[name] = v
        return v

    def _initial(self, name: str, frame):
        """A name first read in the run: the accumulation factor, a resolved constant, the value a counter had
        before the loop, or an unknown (loop-invariant unknowns split configurations)."""
        func = frame.func
        if self._xfn is not None and func is not None and project.info_of(func) is not None:
            head = name.split(".")[0]
            if head not in {p.name.value for p in list(func.params.params) + list(func.params.kwonly_params)}:
                return _Unk(True, name)  # a global of the sibling module: this file's binding of the name is not it
            start = _sibling_counter_start(name, func, project.info_of(func))
            if start is not None:
                return start
        if self.n_text and name == self.n_text:
            return Num(self.n, is_n=True, text=name)
        if name in self.pinned and frame.depth == 0:
            return Num(self.pinned[name], text=name)
        if self.n_text and name in self._n_sources():
            return Num(self.n, is_n=True, text=name)  # ``accum_grad = self.accum_grad``: the aliased value is N too
        if self.n_text and name in self._n_multiples():
            return _Unk(False, name)  # ``N = total // per_round``: ``total`` is N × per_round, not independent of N
        if name.endswith(".gradient_accumulation_steps") and self.acc_n is not None:
            head = name.rsplit(".", 1)[0]
            if self.dr.role(head, func)[0] == "accelerator":
                v = self.acc_n[0]
                return Num(v, is_n=bool(v and v > 1), text=name)  # the Accelerator's own N
        varies = name in self.loop_names or name.split(".")[0] in self.loop_names or frame.depth > 0 and False
        lit = None
        memo = self.dr.resolved  # the symbol table's answer for the name in its function: the same in every run
        key = (name, id(func))
        hit = memo.get(key)
        if hit is not None and hit[0] is func:
            v = hit[1]
        else:
            try:
                v = self.f.r.value(_name_expr(name), func)
            except Exception:
                v = None
            memo[key] = (func, v)
        if isinstance(v, bool):
            lit = v
        elif isinstance(v, int):
            lit = Num(v, is_n=(self.n is not None and self.n > 1 and v == self.n and not varies), text=name)
        if varies:
            init = self._counter_init(name, func)
            if init is not None:
                return init
            return UNK
        if lit is not None:
            if isinstance(lit, Num) and lit.v == 1 and self.f.from_cli(_name_expr(name), func, 0):
                return _Unk(True, name)
            return lit
        # an alias assigned once in the function (``ga = args.gradient_accumulation_steps``, possibly inside an
        # ``if`` the run did not enter): its value is the aliased expression's
        assigns = self.t.assignments_of(name, func) or []
        if assigns and len({self.dr.code(a.value) for a in assigns}) == 1 and self.alias_depth < 3:
            val = assigns[0].value
            if isinstance(val, (cst.Name, cst.Attribute, cst.Subscript)):
                self.alias_depth += 1
                try:
                    v = self.ev(val, frame)
                finally:
                    self.alias_depth -= 1
                if isinstance(v, Num) and v.v is not None:
                    return Num(v.v, v.is_n, v.text or name)
        return _Unk(True, name)

    def _counter_init(self, name: str, func):
        inside = self.dr.inside(self._outermost) if self._outermost is not None else set()
        vals = set()
        assigns = self.t.assignments.get(name, []) if name.startswith("self.") else self.t.assignments_of(name, func)
        for a in assigns:
            if a.node is not None and id(a.node) in inside:
                continue
            vals.add(self.f.r.int_value(a.value, a.func))
        if len(vals) == 1:
            v = vals.pop()
            if v is not None:
                return Num(v)
        elif len(vals) == 2 and None in vals and name.startswith("self.") and self._advances_on_condition(name):
            # ``self.global_step = 0`` in ``__init__`` and ``= state["global_step"]`` when resuming: a fresh run
            # and a resumed one are two configurations (the resumed start stays unknown)
            v = next(x for x in vals if x is not None)
            key = f"!when `{name}` starts at {v}, not resumed from a checkpoint"
            if key in self.config:
                return Num(v) if self.config[key] else None
            if len(self.config) < self.max_splits:
                raise _Split(key)
        return None

    def _advances_on_condition(self, name: str) -> bool:
        """The loop advances the counter only when something holds (``self.global_step += int(stepped)``, or
        ``+= 1`` under an ``if``): whether it starts at its literal value (a fresh run) or a resumed one then
        decides every later gate, so the two are run as configurations."""
        if self._outermost is None:
            return False
        inside = self.dr.inside(self._outermost)
        idx = self.dr.ctx.index
        for node, _func in self.t.aug_assigns.get(name, []):
            if id(node) not in inside:
                continue
            v = node.value
            if isinstance(v, cst.Call) and call_name(v) == "int":
                return True
            for p in idx.ancestors(node):
                if p is self._outermost:
                    break
                if type(p) is cst.If:
                    return True
        return False

    # ------------------------------------------------------------------ expressions
    def _int(self, v) -> Optional[int]:
        if isinstance(v, Num):
            return v.v
        if isinstance(v, bool):
            return int(v)
        return None

    def truth(self, expr, frame, split: bool = False, split_parts: bool = False) -> Optional[bool]:
        v = self.ev(expr, frame)
        self._last_mod = v.mod if isinstance(v, _Unk) else None
        if isinstance(v, bool):
            return v
        if v is None:
            return False
        if isinstance(v, Num):
            if v.v is not None:
                return v.v != 0
        if split and type(expr) is cst.BooleanOperation and self._fixed_operand(expr):
            # ``args.max_grad_norm > 0 and not self.deepspeed`` after ``if self.deepspeed:`` fixed that operand: the
            # operands are decided one by one, so the run does not also take the arm that contradicts it
            return self._bool_split(expr, frame)
        if split and self._invariant_expr(expr) and not (self.probe and isinstance(v, _Unk) and v.mod is not None):
            if type(expr) is cst.BooleanOperation and self._known_operand(expr, frame):
                # ``sync or not isinstance(module, DDP)`` in a helper handed ``sync = (i == N - 1)``: no loop name in
                # it, but an operand known on this micro-batch did not decide it; the other one selects the
                # configuration (not the whole, whose truth changes with the known operand)
                return self._bool_split(expr, frame)
            # (a value computed from a period, ``update_grad`` handed ``(i + 1) % accum == 0``, is no configuration:
            # the probe reads the gate it makes)
            return self._config(expr, frame)
        if split_parts and type(expr) is cst.BooleanOperation:
            return self._bool_split(expr, frame)
        return None

    def _exclusive_modes(self, modes: list, before: bool) -> None:
        """The arms of a dispatch chain on mode flags (``if self.do_grad_scaling: scaler.scale(loss).backward()
        elif self.use_apex: ... elif self.deepspeed: engine.backward(loss)``) are exclusive by intent: the code
        that sets the flags never sets two (the HF Trainer turns grad scaling off under DeepSpeed), so a run
        where a later arm's flag already holds does not also take an earlier arm (``before``), and a run that took
        the first arm does not hold the later flags either (they were never tested there). Only flags this run has
        not fixed yet are fixed; a run that fixed two of them keeps both."""
        keys = [_cond_key(t) for t in modes]
        if before:
            held = [i for i, (k, pol) in enumerate(keys) if k in self.config and self.config[k] == pol]
            if held and held[0] > 0:
                for k, pol in keys[:held[0]]:
                    if k not in self.config:
                        self.config[k] = not pol
            return
        for k, pol in keys[1:]:
            if k not in self.config:
                self.config[k] = not pol

    def _fixed_operand(self, expr) -> bool:
        """An operand of the ``and`` / ``or`` is a condition this run's configuration already fixed."""
        memo = self.dr._cond_keys
        stack = [expr]
        while stack:
            e = stack.pop()
            if type(e) is cst.BooleanOperation:
                stack += [e.left, e.right]
                continue
            got = memo.get(id(e))
            if got is None:
                got = memo[id(e)] = _cond_key(e)
            if got[0] in self.config:
                return True
            if self.chain is not None:
                self.chain_absent.add(got[0])  # read as not fixed: this run may not go on past it (_config)
        return False

    def _known_operand(self, expr, frame) -> bool:
        """An operand of the ``and`` / ``or`` with no call in it has a known truth value in this pass."""
        stack = [expr]
        while stack:
            e = stack.pop()
            if type(e) is cst.BooleanOperation:
                stack += [e.left, e.right]
                continue
            if self.dr.names_calls(e)[1]:
                continue
            if _tv(self.ev(e, frame)) is not None:
                return True
        return False

    def _bool_split(self, expr, frame) -> Optional[bool]:
        """``isinstance(model, FSDP) and ii != N - 1``: an operand that does not change inside the loop selects a
        configuration (the run splits on it), the one that does is evaluated on each micro-batch; three-valued
        ``and`` / ``or`` (None: undecided)."""
        is_and = isinstance(expr.operator, cst.And)
        a = self._part_truth(expr.left, frame)
        if a is (not is_and):
            return a
        b = self._part_truth(expr.right, frame)
        if b is (not is_and):
            return b
        if a is None or b is None:
            return None
        return is_and

    def _part_truth(self, e, frame) -> Optional[bool]:
        if type(e) is cst.BooleanOperation:
            return self._bool_split(e, frame)
        t = _tv(self.ev(e, frame))
        if t is None and self._invariant_expr(e):
            return self._config(e, frame)
        return t

    def _config(self, expr, frame) -> Optional[bool]:
        memo = self.dr._cond_keys  # the key regenerates the expression's code: once per node, not per pass
        got = memo.get(id(expr))
        if got is None:
            got = memo[id(expr)] = _cond_key(expr)
        key, pol = got
        self.cfg_exprs[key] = expr
        if key in self.config:
            return self.config[key] == pol
        other = _eq_excluded(expr, self.config, self.dr.eq_consts)
        if other is not None:
            # ``x == "native"`` after ``x == "apex"`` held: one value equals one constant at most (no split, and no
            # configuration where both hold)
            return False == pol
        if len(self.config) >= self.max_splits:
            return None
        if self.chain is not None and key not in self.chain_absent:
            # the run goes on as the one where the condition holds (_run_chain): nothing before read it as not fixed
            self.chain.append(key)
            self.config[key] = True
            return self.config[key] == pol
        raise _Split(key)

    def _invariant_expr(self, expr) -> bool:
        """No name the loop (or a helper it runs) assigns, no call: the condition is the same on every
        micro-batch."""
        names, has_call = self.dr.names_calls(expr)
        if has_call and not self.dr.pure_calls(expr):
            return False
        for n in names:
            if n in self.loop_names or n.split(".")[0] in self.loop_names:
                if not self._alias_of_invariant(n.split(".")[0]):
                    return False
        return True

    def _alias_of_invariant(self, name: str) -> bool:
        """``params = self.params`` at the top of a function run as the loop body (a step function, a method): every
        assignment of ``name`` in it is a plain alias of an attribute path nothing in it assigns, so it holds the
        same object on every call."""
        if not isinstance(self.loop, ManualStep):
            return False
        fn = self.loop.func
        assigns = self.dr.t_assignments(name, fn)
        if not assigns or any(getattr(a, "func", None) is not fn for a in assigns):
            return False
        for a in assigns:
            v = getattr(a, "value", None)
            d = dotted(v) if isinstance(v, (cst.Attribute, cst.Name)) else None
            if d is None or not d.startswith("self.") or d in self.loop_names or d.split(".")[0] != "self":
                return False
            if any(x == d or x.startswith(d + ".") for x in self.loop.assigned if x.startswith("self.")):
                return False
        return True

    def ev(self, e, frame):
        self.cost += 1  # (tick(), inlined)
        if self.cost > BUDGET:
            raise _Abort()
        tp = type(e)
        if tp is cst.Integer:
            try:
                return Num(int(e.value, 0))
            except ValueError:
                return Num(None)
        if tp is cst.Name:
            nm = e.value
            if nm in ("True", "False"):
                return nm == "True"
            if nm == "None":
                return None
            if nm != self._range_len:  # (load's first test; a plain name is never a ``self.`` path)
                got = frame.locals.get(nm, _MISSING)
                if got is not _MISSING:
                    return got
            return self.load(nm, frame)
        if tp is cst.Attribute:
            if e.attr.value in ("no_sync", "no_backward_sync"):
                self.sync_control = True
                return _CtxFn("no_sync", self.dr.code(e))
            hit = self._dotted.get(id(e))
            if hit is not None and hit[0] is e:
                d = hit[1]
            else:
                d = dotted(e)
                self._dotted[id(e)] = (e, d)
            if d is not None:
                if d.endswith(".sync_gradients"):
                    return self.sync if self.in_acc or self.sync is not True else True
                head = d.rsplit(".", 1)[0]
                base = None
                if head in frame.locals or head in self.shared:
                    base = self.load(head, frame)
                elif d not in frame.locals and isinstance(frame.locals.get(d.split(".")[0]), Tensor):
                    base = self.ev(e.value, frame)  # ``out.losses.total``: an attribute path inside a model output
                if isinstance(base, Tensor):
                    return base if e.attr.value not in _NO_GRAPH else UNK
                return self.load(d, frame)
            base = self.ev(e.value, frame)
            if isinstance(base, Tensor):
                return base if e.attr.value not in _NO_GRAPH else UNK
            return UNK
        if tp is cst.Call:
            return self._call(e, frame)
        if tp is cst.BinaryOperation:
            a = self.ev(e.left, frame)
            b = self.ev(e.right, frame)
            if type(e.operator) is cst.Divide and isinstance(a, Tensor) and not isinstance(b, Tensor) and \
                    self.in_micro and self._micro_count(e.right, frame):
                # ``loss.sum() / pre_loss.shape[0]``, ``(pos.sum() - neg.sum()) / (pos.size(0) + neg.size(0))``: the
                # size of tensors of this micro-batch, a per-micro-batch mean (as a division by its own token count,
                # see ``_factor``); a count over the whole window is made before its micro-batches and stays unknown
                b = Tensor(T.Scale(), False, None, self.mb)
            return self._binop(type(e.operator), a, b, e.right, e)
        if tp is cst.UnaryOperation:
            v = self.ev(e.expression, frame)
            if isinstance(e.operator, cst.Not):
                if isinstance(v, bool):
                    return not v
                if isinstance(v, Num) and v.v is not None:
                    return v.v == 0
                if v is None:
                    return True
                return v if isinstance(v, _Unk) else UNK
            if isinstance(e.operator, cst.Minus) and isinstance(v, Num):
                return Num(-v.v if v.v is not None else None)
            return v
        if tp is cst.BooleanOperation:
            a = self.ev(e.left, frame)
            ta = _tv(a)
            if isinstance(e.operator, cst.And):
                if ta is False:
                    return False
                b = self.ev(e.right, frame)
                tb = _tv(b)
                if ta is True:
                    return b if not isinstance(b, Num) else (tb if tb is not None else b)
                if tb is False:
                    return False
                return _unk_of(a, b)
            if ta is True:
                return True
            b = self.ev(e.right, frame)
            tb = _tv(b)
            if ta is False:
                return b if not isinstance(b, Num) else (tb if tb is not None else b)
            if tb is True:
                return True
            return _unk_of(a, b)
        if tp is cst.Comparison:
            return self._compare(e, frame)
        if tp is cst.Subscript:
            base = self.ev(e.value, frame)
            if isinstance(base, DictVal):
                key = _str_key(e)
                return base.slots.get(key, UNK) if key is not None else UNK
            for el in e.slice:
                if isinstance(el.slice, cst.Index):
                    self.ev(el.slice.value, frame)
            if isinstance(base, Tensor):
                return base
            if isinstance(base, ListVal):
                return self._joined(base)
            return self._resolved(e, frame)
        if tp is cst.IfExp:
            c = self.truth(e.test, frame)
            if c is True:
                return self.ev(e.body, frame)
            if c is False:
                return self.ev(e.orelse, frame)
            a, b = self.ev(e.body, frame), self.ev(e.orelse, frame)
            if isinstance(a, Tensor) and isinstance(b, Tensor) and a.scale == b.scale:
                return a
            return UNK
        if tp is cst.NamedExpr:
            v = self.ev(e.value, frame)
            d = dotted(e.target)
            if d:
                self.store(d, v, frame)
            return v
        if tp in (cst.Tuple, cst.List):
            vals = [self.ev(el.value, frame) for el in e.elements]
            if tp is cst.List and all(isinstance(v, Tensor) for v in vals) and \
                    not any(isinstance(el, cst.StarredElement) for el in e.elements):
                return ListVal(vals)  # ``[]`` or a list of losses; anything else stays unknown
            return UNK
        if tp is cst.Float:
            return UNK
        if tp in (cst.SimpleString, cst.FormattedString, cst.ConcatenatedString):
            return UNK
        if tp is cst.Dict:
            return self._dict(e, frame)  # ``return {"loss": loss}``: the slots are followed
        if tp in (cst.ListComp, cst.GeneratorExp) and e.for_in.inner_for_in is None and not e.for_in.ifs and \
                type(e.elt) is cst.Name and type(e.for_in.target) is cst.Name and e.elt.value == e.for_in.target.value:
            # ``sum(loss for loss in loss_dict.values())`` / ``[l for l in losses]``: the iterated values themselves
            it = self.ev(e.for_in.iter, frame)
            if isinstance(it, ListVal):
                out = ListVal(it.items)
                out.other = it.other
                return out
            if isinstance(it, Tensor):
                return ListVal([it])
            return UNK
        if tp in (cst.ListComp, cst.GeneratorExp, cst.SetComp, cst.DictComp):
            return UNK
        return UNK

    def _resolved(self, e, frame):
        """A value the symbol table resolves (``cfg["gradient_accumulation_steps"]``), else unknown."""
        if self.n_text and self.dr.code(e) == self.n_text:
            return Num(self.n, is_n=True, text=self.n_text)
        func = frame.func
        memo = self.dr.resolved  # the symbol table's answer is a fact of the expression in its function
        key = (id(e), id(func))
        hit = memo.get(key)
        if hit is not None and hit[0] is e and hit[1] is func:
            v = hit[2]
        else:
            try:
                v = self.f.r.value(e, func)
            except Exception:
                v = _MISSING
            memo[key] = (e, func, v)
        if v is _MISSING:
            return UNK
        if isinstance(v, bool):
            return v
        if isinstance(v, int):
            return Num(v)
        return UNK

    def _binop(self, op, a, b, right_node, whole=None):
        if op is cst.Modulo and self.n is None and right_node is not None and isinstance(b, (Num, _Unk)):
            # a gate modulo an accumulation-named value (``(idx + 1) % self._gradient_accumulation_steps``)
            # (a hint: N by usage is the period of a gate that steps, ``_period_gate``; by the name alone it ranks
            # last, and what rests on it is lowered a severity)
            text = b.text or self.dr.code(right_node)
            if _ACCUM_HINT.search(text) and (not isinstance(b, Num) or b.v is None or b.v > 1):
                self._hint(b.v if isinstance(b, Num) else None, self.dr.code(right_node), right_node, "gate")
            if self.probe and self.in_micro and isinstance(b, Num) and b.v is not None and b.v > 1 and \
                    isinstance(a, Num) and a.v is not None:
                return _Unk(False, self.dr.code(right_node), mod=right_node)  # a period the probe does not decide
        if op is cst.Divide and self.n is None and right_node is not None and not (isinstance(a, Num) and a.v is not None):
            text = self.dr.code(right_node)
            self.divisors.add(text)  # a loss (or a value the run could not type) divided by it
            if self.probe and not isinstance(a, Tensor) and isinstance(b, (Num, _Unk)) and _ACCUM_HINT.search(text) \
                    and not (isinstance(b, Num) and b.v is not None and b.v <= 1):
                # a value the run could not type (``logits, loss = model(x, y)``) divided by an accumulation-named one
                self._hint(b.v if isinstance(b, Num) else None, text, right_node, "division")
        r = self._binop2(op, a, b, right_node, whole)
        if isinstance(r, Tensor) and r is not a and r is not b and r.inner is None:
            r.inner = next((x.inner for x in (a, b) if isinstance(x, Tensor) and x.inner is not None), None)
        if isinstance(r, Tensor):
            spans = [x.since for x in (a, b) if isinstance(x, Tensor) and x.since is not None and x.graph]
            if spans:
                r.since = min(spans) if r.since is None else min(min(spans), r.since)
        elif (op is cst.Modulo and self.n is None and right_node is not None
              and (isinstance(r, _Unk) or (isinstance(r, Num) and r.v is None and isinstance(b, Num) and b.v is None))
              and not isinstance(a, Tensor) and not (isinstance(b, Num) and b.v is not None and b.v <= 1)):
            # a period whose value is unknown (an unknown integer too: ``accelerator.gradient_accumulation_steps``):
            # if it gates an optimizer step, it is the accumulation factor by usage, whatever its name (see _if)
            return _Unk(r.inv if isinstance(r, _Unk) else False, r.text, mod=right_node)
        return r

    def _binop2(self, op, a, b, right_node, whole=None):
        if isinstance(a, Tensor) or isinstance(b, Tensor):
            if op is cst.Divide and isinstance(a, Tensor):
                return Tensor(_times(a.scale, self._factor(b, right_node, -1, whole)), a.graph, a.node)
            if op is cst.Multiply:
                t, o = (a, b) if isinstance(a, Tensor) else (b, a)
                if isinstance(o, Tensor):
                    # a product of two tensors (``losses["loss"] * weights``, ``logp * mask``): the factors of both
                    # survive (a ``1/N`` in either stays a ``1/N``); the other tensor is a weight of unknown value,
                    # independent of N when nothing N-dependent went into it
                    if t.scale is None or o.scale is None:
                        return Tensor(None, True, self._fwd_node(a, b))
                    other = right_node if t is a else (whole.left if whole is not None else None)
                    txt = self.dr.code(other) if other is not None else "a tensor"
                    kind = T.WEIGHT if o.scale.n_free else T.OTHER
                    sc = T.Scale(t.scale.factors + o.scale.factors).times(T.Factor(kind, txt))
                    return Tensor(sc, t.graph or o.graph, self._fwd_node(a, b))
                rn = right_node if t is a else (whole.left if whole is not None else None)
                return Tensor(_times(t.scale, self._factor(o, rn, 1, whole)), t.graph, t.node)
            if op in (cst.Add, cst.Subtract):
                if isinstance(a, Tensor) and isinstance(b, Tensor):
                    if a.scale == b.scale:
                        return Tensor(a.scale, a.graph or b.graph, a.node)
                    if a.scale is not None and b.scale is not None and a.scale.n_free and b.scale.n_free:
                        # a weighted sum of losses, none divided by N
                        return Tensor(T.Scale((T.Factor(T.WEIGHT, "a weighted sum of losses"),)), True, a.node)
                    return Tensor(None, a.graph or b.graph, a.node)
                t = a if isinstance(a, Tensor) else b
                if a is None or isinstance(a, (Num,)) and a.v == 0:
                    return b
                return t
            return Tensor(None, True)
        if isinstance(a, Num) and isinstance(b, Num):
            x, y = a.v, b.v
            if x is None or y is None:
                return Num(None)
            try:
                if op is cst.Add:
                    return Num(x + y)
                if op is cst.Subtract:
                    return Num(x - y)
                if op is cst.Multiply:
                    return Num(x * y, is_n=(a.is_n and y == 1) or (b.is_n and x == 1))
                if op is cst.FloorDivide:
                    return Num(x // y)
                if op is cst.Modulo:
                    return Num(x % y)
                if op is cst.Divide:
                    return Num(x // y) if y and x % y == 0 else Num(None)
                if op is cst.Power:
                    return Num(x ** y) if 0 <= y < 16 else Num(None)
            except ZeroDivisionError:
                return Num(None)
            return Num(None)
        if isinstance(a, _Unk) and a.inv and (isinstance(b, Num) or (isinstance(b, _Unk) and b.inv)):
            return _Unk(True, a.text)
        if isinstance(b, _Unk) and b.inv and isinstance(a, Num) and a.v is not None:
            return _Unk(True, b.text)
        return UNK

    def _fwd_node(self, a: "Tensor", b: "Tensor"):
        """Of two graphs combined, the one whose forward the run recorded (DDP decides sync at that forward)."""
        for x in (a, b):
            if x.node is not None and id(x.node) in self.fwd_ns:
                return x.node
        return a.node if a.node is not None else b.node

    def _own_size(self, e, frame) -> bool:
        """``x.shape[i]`` / ``x.size(i)`` / ``x.size()[i]`` / ``x.numel()`` / ``len(x)`` of a tensor made in this
        micro-batch (its forward's output, a loss)."""
        base = None
        if type(e) is cst.Subscript and type(e.value) is cst.Attribute and e.value.attr.value == "shape":
            base = e.value.value
        elif type(e) is cst.Subscript and type(e.value) is cst.Call and type(e.value.func) is cst.Attribute and \
                e.value.func.attr.value == "size" and not e.value.args:
            base = e.value.func.value
        elif type(e) is cst.Call and type(e.func) is cst.Attribute and e.func.attr.value in ("size", "numel") and \
                (len(e.args) == 1 if e.func.attr.value == "size" else not e.args):
            base = e.func.value
        elif type(e) is cst.Call and type(e.func) is cst.Name and e.func.value == "len" and len(e.args) == 1:
            base = e.args[0].value
        if base is None or type(base) not in (cst.Name, cst.Attribute, cst.Subscript):
            return False  # (no call is evaluated a second time)
        v = self.ev(base, frame)
        return isinstance(v, Tensor) and v.since is not None and v.since == self.mb

    def _factor(self, v, node, power: int, whole=None) -> T.Factor:
        text = self.dr.code(node) if node is not None else "?"
        # no accumulation factor known before the run: a divisor whose value comes from an accumulation-named
        # expression (through arguments and variables) is one; the loop is run again with it
        if self.probe and power < 0 and not isinstance(v, (Num, _Unk)) and _ACCUM_HINT.search(text):
            self._hint(None, text, node, "division")  # divided by a value the run could not type (a call's result)
        if self.n is None and power < 0 and isinstance(v, (Num, _Unk)):
            src = v.text or text
            if self.probe and not _ACCUM_HINT.search(src) and _ACCUM_HINT.search(text):
                src = text  # ``loss / grad_accum_steps`` whose value is unknown through ``ddp_world_size``
            if src and _ACCUM_HINT.search(src) and (not isinstance(v, Num) or v.v is None or v.v > 1):
                self._hint(v.v if isinstance(v, Num) else None, src, node if src == text else None, "division")
        if isinstance(v, Num) and v.v is not None:
            if (v.is_n or (self.n is not None and self.n > 1 and v.v == self.n)) and v.v > 1:
                return T.Factor(T.ACCUM_USER, text, power=power, node=whole)
            return T.Factor(T.CONST, text, value=Fraction(v.v) ** power if v.v else None, node=whole)
        if isinstance(v, Num) and v.is_n:
            return T.Factor(T.ACCUM_USER, text, power=power, node=whole)
        if power > 0 and isinstance(v, _Unk) and v.inv:
            return T.Factor(T.WEIGHT, text, power=power, node=whole)  # ``loss * args.alpha``
        if power > 0 and _feature_dim(node):
            # ``loss.mean() * batch['targets'].size(1)``: a count along a non-batch dimension (labels, classes, a
            # sequence) scales each micro-batch's mean alike and does not change with N (dimension 0 would turn
            # the mean into a per-sample sum, whose window weight is unknown: OTHER)
            return T.Factor(T.WEIGHT, text, power=power, node=whole)
        if power < 0 and isinstance(v, Tensor) and self.in_micro and v.since is not None and v.since == self.mb \
                and v.scale is not None and v.scale.n_free:
            # divided by a tensor made from this micro-batch's own data (``/ torch.sum(label_mask, axis=1)``,
            # ``/ (labels != -100).sum()``): a per-micro-batch normalisation (a token mean), independent of N — not a
            # count over the whole window, which is made before the micro-batch loop
            return T.Factor(T.WEIGHT, text, power=power, node=whole)
        return T.Factor(T.OTHER, text, power=power, node=whole)

    def _compare(self, e: cst.Comparison, frame):
        left = self.ev(e.left, frame)
        result: Any = True
        for ct in e.comparisons:
            right = self.ev(ct.comparator, frame)
            op = type(ct.operator)
            r = _cmp(op, left, right)
            if r is False:
                return False
            if r is None:
                result = _unk_of(left, right) if result is True else result
            left = right
        return result

    # ------------------------------------------------------------------ calls
    def _call(self, call: cst.Call, frame):
        f = self.f
        func = call.func
        is_attr = type(func) is cst.Attribute  # an exact type test: isinstance through ABCMeta is slow
        attr = func.attr.value if is_attr else None
        recv_node = func.value if is_attr else None
        # facts of the call node in its function, the same on every pass of every run over it (the dotted
        # receiver, the qualified name by the symbol table of the module it is in, and how it backpropagates by the
        # receiver's role, which ``FileDryRun.role`` memoizes): computed once per (call, function)
        memo = self.dr.call_facts
        key = (id(call), id(frame.func), self.depth > 0)
        hit = memo.get(key)
        if hit is not None and hit[0] is call and hit[1] is frame.func:
            recv, name, q, bstyle = hit[2]
        else:
            recv = dotted(recv_node) if recv_node is not None else None
            name = call_name(call) or ""
            xinfo = project.info_of(frame.func) if self.depth else None
            q = (xinfo.symbols if xinfo is not None else self.t).qualname(func) or ""
            bstyle = backward_style(call, f, frame.func, self.dr.role)
            memo[key] = (call, frame.func, (recv, name, q, bstyle))
        if self.n_ncall and attr == "get" and self.dr.code(call) == self.n_text:
            return Num(self.n, is_n=True, text=self.n_text)  # ``self.conf.get("grad_accum_iters", 1)`` is N
        if self.n is not None and self.n_text and self.n_text[-1] == ")" and \
                self.n_text.startswith(self.dr.code(func)) and self.dr.code(call) == self.n_text:
            # the factor's own expression written out (``loss / math.ceil(batch.shape[0] / self.microbatch)``,
            # the number of micro-batches of a window loop): it is N
            return Num(self.n, is_n=True, text=self.n_text)
        if bstyle == "engine-like" and self._callee(call, frame) is not None:
            bstyle = None  # ``self.mp_trainer.backward(loss)`` of a class the project defines: its body says what it does
        if bstyle is not None:
            return self._backward(call, bstyle, recv, frame)
        rkind, conf = self.dr.role(recv, frame.func) if recv else (None, False)
        if rkind is not None and recv is not None and attr in _RELEVANT and recv != "self":
            xfn = self._callee(call, frame)
            if xfn is not None and project.info_of(xfn) is not None:
                # ``updater.step(loss, i)`` on an instance of a sibling module's class: its own method runs (the
                # backward and the optimizer step it makes), whatever role the receiver's usage suggests
                rkind, conf = None, False
        if recv is None and type(recv_node) is cst.Subscript:
            # ``self.optimizer[name].step()``: an item of a container the file fills with optimizers
            rkind, conf = self.dr.item_role(recv_node, frame.func)
            if rkind is not None:
                recv = self.dr.code(recv_node)
        # arguments first (calls inside them run first)
        argv = []
        if attr not in ("step",) or rkind not in ("optimizer", "ds_optimizer"):
            for a in call.args:
                argv.append(self.ev(a.value, frame))
        base = self.ev(recv_node, frame) if recv_node is not None else None
        if attr not in _CALL_ATTRS and q not in _CALL_QS and type(base) is not DictVal and type(base) is not ListVal:
            return self._call_rest(call, frame, func, attr, recv, recv_node, argv, base)
        if isinstance(base, DictVal) and attr == "values" and not argv:
            out = ListVal()
            for v in base.slots.values():
                out.add(v)  # ``sum(losses.values())`` of a dict the run filled
            return out
        if isinstance(base, ListVal):
            if attr in ("append", "insert") and argv:
                base.add(argv[-1])
            elif attr == "extend" and argv and isinstance(argv[0], ListVal):
                for v in argv[0].items:
                    base.add(v)
                base.other = base.other or argv[0].other
            elif attr == "extend":
                base.other = True
            elif attr == "pop":
                return self._joined(base)
            return UNK
        if q in ("torch.stack", "torch.cat", "torch.concat", "torch.sum", "torch.mean") and argv and \
                isinstance(argv[0], ListVal):
            return self._joined(argv[0])  # ``torch.stack(losses).mean()``: the losses' common scale
        if q in CLIP_QUALNAMES or (
                attr in ("clip_grad_norm_", "clip_grad_value_") and rkind != "engine" and recv is not None
                and (rkind == "accelerator" or recv.split(".")[-1] in ("utils", "nn_utils", "clip_grad"))) or (
                attr == "clip_gradients" and (recv == "self" or rkind == "fabric")):
            own = rkind == "accelerator" or attr == "clip_gradients"
            self.emit("clip", call, scaled=(self.scaled and not own), target=recv or "")
            return UNK
        if attr == "step" and rkind in ("optimizer", "ds_optimizer"):
            clo = positional(call, 0) or kwarg(call, "closure")
            if clo is not None:
                fn = self._closure(clo, frame)
                if fn is not None:
                    self._inline(fn, [], {}, frame, None)
                elif isinstance(clo, cst.Call) and (call_name(clo) or "").split(".")[-1] == "partial" and clo.args \
                        and clo.args[0].keyword is None and not clo.args[0].star:
                    # ``optimizer.step(partial(self.training_step, model=model, batch=batch))``: the closure is
                    # the bound function, run by the step before it updates
                    bound = cst.Call(func=clo.args[0].value, args=list(clo.args[1:]))
                    fn = self._callee(bound, frame)
                    if fn is not None and frame.depth < 4:
                        argv = [self.ev(a.value, frame) for a in bound.args]
                        args, kws = self._args(bound, frame, argv)
                        self._inline(fn, args, kws, frame, bound)
            eff, why = self._prepared_effect(recv)
            self.emit("step", call, opt=recv or "", effective=eff, why=why, confident=conf)
            return UNK
        if attr == "step" and rkind in ("scheduler", "ds_scheduler"):
            eff, why = self._prepared_effect(recv)
            self.emit("sched_step", call, target=recv or "", effective=eff, why=why, confident=conf)
            return UNK
        if attr == "set_gradient_accumulation_boundary" and rkind == "engine":
            # the script decides the engine's boundary itself (DeepSpeed engine.set_gradient_accumulation_boundary):
            # stepping only on the boundaries it sets is then its contract, not a gate on the engine's own count
            self.emit("boundary_set", call, opt=recv or "", confident=conf)
            return UNK
        if attr == "step" and rkind == "engine":
            self.engine_micro += 1
            gas = self.n if self.n else None
            eff = None if gas is None else (self.engine_micro % gas == 0)
            self.emit("step", call, opt=recv or "", via="engine", effective=eff,
                      why="" if eff else "off the DeepSpeed boundary", confident=conf)
            return UNK
        if attr == "step" and rkind == "scaler":
            opt = positional(call, 0)
            self.emit("step", call, opt=self.dr.code(opt) if opt is not None else "", via="scaler",
                      target=recv or "", confident=conf)
            self.scaled = False
            return UNK
        if attr == "unscale_" and rkind == "scaler":
            opt = positional(call, 0)
            self.emit("unscale", call, opt=self.dr.code(opt) if opt is not None else "", target=recv or "",
                      confident=conf)
            self.scaled = False
            return UNK
        if attr == "update" and rkind == "scaler":
            self.emit("update", call, target=recv or "", confident=conf)
            return UNK
        if attr == "scale" and rkind == "scaler":
            v = argv[0] if argv else UNK
            if isinstance(v, Tensor):
                return Tensor(_times(v.scale, T.Factor(T.SCALER, recv or "scaler")), v.graph, v.node)
            return UNK
        if attr == "zero_grad":
            if rkind in ("optimizer", "ds_optimizer"):
                eff, why = self._prepared_effect(recv)
                if eff is not False and recv is not None and recv in f.prepared and _accelerate_deepspeed(self.dr):
                    # accelerate 1.15 utils/deepspeed.py DeepSpeedOptimizerWrapper.zero_grad: `pass` — the engine's
                    # step (run by accelerator.backward on the sync step) clears the gradients itself
                    eff, why = False, "a no-op under accelerate's DeepSpeed (the engine clears the gradients)"
                self.emit("zero_grad", call, opt=recv or "", of="optimizer", effective=eff, why=why, confident=conf,
                          via="ds" if rkind == "ds_optimizer" else "")
            elif rkind == "engine":
                self.emit("zero_grad", call, opt=recv or "", of="engine", confident=conf)
            elif recv is not None and rkind in (None, "ddp"):
                # a model's clear; a receiver of no known role (``self_optim_state.zero_grad()``) may clear the
                # model's gradients too: recorded as such at low confidence (a finding resting on it is lowered),
                # never dropped for its name (an optimizer known by its name only is one by roles: the branch above)
                self.emit("zero_grad", call, target=recv, of="model",
                          confident=rkind == "ddp" or self.dr.model_like(recv, frame.func))
            return UNK
        if attr in ("no_sync", "no_backward_sync"):
            self.sync_control = True
            return _CtxFn("no_sync", self.dr.code(call))
        if attr in ("div_", "mul_") and recv_node is not None and (
                ".grad" in (recv if recv is not None else self.dr.code(recv_node))):
            self.emit("rescale", call, scale=T.Scale((T.Factor(T.OTHER, self.dr.code(call)),)))
            return UNK
        return self._call_rest(call, frame, func, attr, recv, recv_node, argv, base)

    def _call_rest(self, call, frame, func, attr, recv, recv_node, argv, base):
        """``_call`` past the calls the trace records by their attribute or qualified name (``_CALL_ATTRS``,
        ``_CALL_QS``): same-file functions, clips by name, values."""
        f = self.f
        if type(func) is cst.Name:
            fv = frame.locals.get(func.value)
            if isinstance(fv, _CtxFn):
                return fv
        # same-file functions and methods: inlined
        fn = self._callee(call, frame)
        if fn is not None:
            if call is self.__dict__.get("_discarded") and not any(isinstance(a, (DictVal, ListVal)) for a in argv) \
                    and _inert(self.dr, fn, f.class_of(fn) or frame.cls):
                return UNK  # its value is dropped and its body can change nothing the trace records: not run
            if frame.depth < 4 and (f.relevant(fn, f.class_of(fn) or frame.cls) or
                                    any(isinstance(a, DictVal) for a in argv)):
                # (a helper handed a dict the run follows may fill it: ``forward_step(model, batch, loss_dict)``
                # stores the loss, and where its forward ran, for the backward of another helper)
                args, kws = self._args(call, frame, argv)
                return self._inline(fn, args, kws, frame, call)
            return Tensor(T.Scale(), True, call)
        if self._static(call)[1]:
            # ``self.clip_grad_fun(parameters=model.parameters())``: a clipping function the script built elsewhere
            # (a builder of another module, a config choice) handed the model's parameters: a clip, known by its
            # name and its argument only (a finding resting on it is lowered a severity)
            self.emit("clip", call, scaled=self.scaled, target=self.dr.code(func), confident=False)
            return UNK
        # values
        if type(func) is cst.Name:
            nm = func.value
            if nm in _BUILTINS_NUM:
                if nm == "len" and argv:
                    a0 = call.args[0].value
                    ld = self._loader
                    if ld is None:
                        ld = self._prefix_loader(frame)  # ``nb = len(train_loader)`` before the loops
                    if ld is not None and self.dr.code(a0) in _loader_texts(ld, self.dr):
                        return Num(self.length)
                    return Num(None)
                if nm == "int" and argv and isinstance(argv[0], Num):
                    return argv[0]
                if nm == "int" and argv and isinstance(argv[0], bool):
                    return Num(int(argv[0]))
                if nm in ("min", "max") and argv and all(isinstance(a, Num) and a.v is not None for a in argv):
                    vals = [a.v for a in argv]
                    return Num(min(vals) if nm == "min" else max(vals))
                if nm == "sum" and argv and isinstance(argv[0], Tensor):
                    return argv[0]
                if nm == "sum" and argv and isinstance(argv[0], ListVal):
                    return self._joined(argv[0])
                return Num(None)
            if nm in ("print", "isinstance", "str", "range", "enumerate", "zip", "float", "bool", "list",
                      "dict", "tuple", "hasattr", "getattr", "setattr", "iter", "next", "type", "repr", "format",
                      "open", "sorted", "any", "all", "map", "filter", "id", "super", "vars", "set"):
                return UNK
            imp = self.t.imports.get(nm)
            if imp is not None and not imp.split(".")[0] in _KNOWN_LIBS:
                self._unknown_grad_helper(call, frame)
                # a function from another module of the project: it may scale the loss itself, but only by what it
                # is given — handed no accumulation factor (nor a config object that may hold one), its result
                # does not depend on N
                n_free = not any(a.star for a in call.args) and not any(
                    (isinstance(v, Num) and v.is_n) or isinstance(v, _Unk) or (isinstance(v, ListVal) and v.other)
                    for v in argv)
                kind = T.WEIGHT if n_free else T.OTHER
                t = self._fresh(call)
                t.scale = T.Scale((T.Factor(kind, f"{nm}() from {imp}"),))
                return t
            return self._handed_n(call, argv)
        if type(func) is cst.Attribute:
            if attr == "backward" and not isinstance(base, Tensor):
                # what a wrapper's ``backward(loss)`` returns (``loss_scale, loss_value = optimizer.backward(loss)``)
                # carries no graph a later backward could use: the backward freed the loss's graph
                return UNK
            if isinstance(base, Tensor):
                if attr in _NO_GRAPH:
                    return UNK
                if attr in _SCALE_METHODS and len(argv) == 1 and len(call.args) == 1 and call.args[0].keyword is None \
                        and not call.args[0].star:
                    # ``loss.mul(x)`` / ``loss.div(x)``: the scale of ``loss * x`` / ``loss / x``
                    return self._binop(_SCALE_METHODS[attr], base, argv[0], call.args[0].value, None)
                if attr in ("mean", "sum", "float", "half", "to", "squeeze", "view", "reshape", "contiguous",
                            "clone", "cuda", "bfloat16"):
                    return base
                return base
            if recv is not None:
                head = recv.split(".")[0]
                imp = self.t.imports.get(head)
                if imp is not None and not imp.split(".")[0] in _KNOWN_LIBS and head == recv:
                    self._unknown_grad_helper(call, frame)
                    return Tensor(T.Scale((T.Factor(T.OTHER, f"{recv}.{attr}()"),)), True, call)
            if attr in ("item", "detach", "tolist", "numpy", "cpu", "get", "items", "keys", "values", "append",
                        "format", "join", "split", "log", "info", "warning", "write", "add_scalar", "update",
                        "set_postfix", "set_description", "save", "eval", "train", "parameters",
                        "named_parameters", "state_dict", "load_state_dict", "wait_for_everyone", "gather",
                        "reduce", "print", "is_main_process", "set_to_none", "numel", "size", "dim", "unwrap_model"):
                return UNK
            if recv == "self" or (recv or "").startswith("self."):
                self._unknown_grad_helper(call, frame, divided=True)  # a callable kept on the object
            return self._handed_n(call, argv)
        return UNK

    def _handed_n(self, call, argv) -> Tensor:
        """The output of a call the trace does not model (``_fresh``). When the call is handed the accumulation
        factor itself (``batch.normalize(loss, n_accumulation=self.args.batch_multiplier)``, a method of another
        module's object), it may divide by it: the result's scale holds a factor of unknown value, so no rule claims
        a missing (or a doubled) ``/ N`` from it."""
        t = self._fresh(call, argv)
        if t.graph and any(isinstance(v, Num) and v.is_n for v in argv):
            t.scale = T.Scale((T.Factor(T.OTHER, f"{self.dr.code(call.func)}() is handed {self.n_text}"),))
        return t

    def _ds_config_n(self, scale, frame) -> Optional[str]:
        """The text of a user ``/ N`` whose N is read from the DeepSpeed config the Accelerator runs with
        (``args.ga = accelerator.state.deepspeed_plugin.deepspeed_config["gradient_accumulation_steps"]``): the
        engine divides by that same value. None otherwise."""
        for fac in scale.by(T.ACCUM_USER):
            if fac.power >= 0 or not fac.text:
                continue
            name = fac.text.strip()
            assigns = self.t.assignments.get(name, []) if "." in name else (
                self.t.assignments_of(name, frame.func) or [])
            for a in assigns:
                txt = self.dr.code(a.value)
                if "gradient_accumulation_steps" in txt and ("deepspeed_config" in txt or "deepspeed_plugin" in txt):
                    return name
        return None

    def _unknown_grad_helper(self, call, frame, divided: bool = False) -> None:
        """A function of another package or module of the project handed the model or its parameters
        (``training.scale_grads(model, 1 / num_tokens)``) may rescale the gradients: the trace records a rescale of
        unknown value (the window's loss weights then prove nothing). ``divided``: only when another argument is a
        quotient too (a callable the run cannot resolve, ``self._grad_scaler(list(model.parameters()), world /
        num_tokens)``: the factor it is handed)."""
        if divided and not any(type(a.value) is cst.BinaryOperation and type(a.value.operator) is cst.Divide
                               for a in call.args):
            return
        for a in call.args:
            v = a.value
            if type(v) is cst.Call and type(v.func) is cst.Name and v.func.value in ("list", "tuple") and v.args:
                v = v.args[0].value  # ``list(model.parameters())``
            if isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and \
                    v.func.attr.value in ("parameters", "named_parameters"):
                hit = True
            else:
                d = dotted(v)
                hit = False
                if d is not None and self.roles is not None:
                    try:
                        hit = self.roles.role(d, frame.func) in ("model", "ddp_model", "deepspeed_engine")
                    except Exception:
                        hit = False
            if hit:
                self.emit("rescale", call, scale=T.Scale((T.Factor(T.OTHER, self.dr.code(call)),)))
                return

    def _joined(self, lst) -> Any:
        """The values of a list taken together (``sum(losses)``, ``losses[i]``): their common scale (unknown when
        they differ), and the forward they come from when all of theirs ran with the same gradient sync."""
        ts = [v for v in lst.items if isinstance(v, Tensor)]
        if not ts or lst.other:
            return UNK
        scale = ts[0].scale if all(t.scale is not None and t.scale == ts[0].scale for t in ts) else None
        graphs = [t for t in ts if t.graph]
        if not graphs:
            return Tensor(scale, False, None, None)
        nss = {self.fwd_ns[id(t.node)][0] if t.node is not None and id(t.node) in self.fwd_ns else None
               for t in graphs}
        node = graphs[0].node if len(nss) == 1 and None not in nss else None
        sinces = [t.since for t in graphs]
        since = None if any(x is None for x in sinces) else min(sinces)
        return Tensor(scale, True, node, since)

    def _fresh(self, call, argv=()) -> Tensor:
        """The output of a call the trace does not model (a forward, a criterion): a loss of scale 1; whether
        gradient sync was off when it ran is remembered (DDP decides at forward time). A call handed graphs whose
        forwards ran with sync off or unknown (``criterion(logits)`` outside the ``no_sync()`` of the model's
        forward) leaves that unknown."""
        if self.no_sync:
            ns: Optional[bool] = True
        elif self.grad_sync is None:
            ns = None
        else:
            ns = not self.grad_sync
        if ns is False:
            # (only that direction: a tensor made with sync on and handed to a forward inside ``no_sync()`` is
            # usually the input batch, not a forward)
            for a in argv:
                for t in (a.items if isinstance(a, ListVal) else (a,)):
                    if isinstance(t, Tensor) and t.graph and t.node is not None and id(t.node) in self.fwd_ns \
                            and self.fwd_ns[id(t.node)][0] is not False:
                        ns = None
        self.fwd_ns[id(call)] = (ns, self.ns_nodes[-1] if self.ns_nodes else None, self.certain,
                                 self.site if self.depth else None)
        if self.no_grad:
            return Tensor(T.Scale(), False, call, None)  # made under no_grad(): no graph
        if self._sum_reduced(call):
            # a summed loss (``reduction="sum"``): the micro-batches' gradients add up to the whole batch's without
            # any 1/N, so the window's weight is not 1-per-mean: a factor of unknown value (no window rule rests
            # on it)
            return Tensor(T.Scale((T.Factor(T.OTHER, "reduction='sum'"),)), True, call, self.mb if self.in_micro else None)
        # made outside the micro-batch loop (``step_tokens = count_tokens(micro_batches)`` before it, once per
        # window): no micro-batch's graph starts there
        return Tensor(T.Scale(), True, call, self.mb if self.in_micro else None)

    def _sum_reduced(self, call) -> bool:
        """``criterion(..., reduction="sum")``, or the call of a model whose class (defined in this file) returns
        such a loss from ``forward``."""
        st = self._static(call)
        if st[2]:
            return True
        d = st[3]
        if d is None:
            return False
        memo = self.dr.__dict__.setdefault("_sum_forward", {})
        if d in memo:
            return memo[d]
        memo[d] = False
        t = self.t
        values = []
        for a in t.assignments.get(d, []):
            v = a.value
            while isinstance(v, cst.Call) and isinstance(v.func, cst.Attribute) and \
                    v.func.attr.value in ("cuda", "to", "float", "half", "bfloat16", "train"):
                v = v.func.value  # GPT(...).cuda()
            values.append(v)
        if any(isinstance(v, cst.Call) and (_reduction_sum(v) or _size_average_false(v)) for v in values):
            # ``loss_fn = torch.nn.BCELoss(reduction="sum").cuda()`` (or the legacy ``size_average=False``): a
            # criterion module that sums over the micro-batch's elements
            memo[d] = True
            return True
        for v in values:
            if isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value in t.classes \
                    and v.func.value not in t.imports:
                cls = t.classes[v.func.value]
                for st in cls.body.body:
                    if isinstance(st, cst.FunctionDef) and st.name.value == "forward":
                        memo[d] = _returns_sum_loss(st)
                break
        return memo[d]

    def _static(self, call) -> tuple:
        """(call, _clip_by_name, _reduction_sum, dotted callee) of a call node: facts of its text, computed once."""
        memo = self.dr.call_static
        hit = memo.get(id(call))
        if hit is None or hit[0] is not call:
            hit = memo[id(call)] = (call, _clip_by_name(call, call.func), _reduction_sum(call), dotted(call.func))
        return hit

    def _args(self, call, frame, argv):
        args, kws = [], {}
        i = 0
        for a in call.args:
            v = argv[i] if i < len(argv) else UNK
            i += 1
            if a.star:
                continue
            if a.keyword is not None:
                kws[a.keyword.value] = v
            else:
                args.append(v)
        return args, kws

    def _callee(self, call, frame):
        # the same-file / sibling function a call runs is a fact of the call in its function and class (the loop
        # model's tables, the project's modules): asked on every pass over the call, computed once (the memo holds
        # the nodes, so their ids stay unique)
        memo = self.dr.callees
        func, cls = frame.func, frame.cls
        key = (id(call), id(func), id(cls))
        hit = memo.get(key)
        if hit is not None and hit[0] is call and hit[1] is func and hit[2] is cls:
            fn = hit[3]
        else:
            fn = self.f.callee(call, func, cls)
            memo[key] = (call, func, cls, fn)
        if fn is not None:
            return fn
        if type(call.func) is cst.Name:
            return self.local_defs.get(call.func.value)
        return None

    def _closure(self, expr, frame):
        if isinstance(expr, cst.Name):
            return self.local_defs.get(expr.value) or (self.f.t.module_funcs.get(expr.value) or [None])[0]
        return None

    def _inline(self, fn, args, kws, frame, call):
        if frame.depth >= 4:
            return Tensor(T.Scale(), True, call)
        cls = self.f.class_of(fn) or frame.cls
        new = _Frame(fn, cls, frame.depth + 1)
        params = list(fn.params.params)
        if cls is not None and params and params[0].name.value in ("self", "cls") and call is not None and \
                (isinstance(call.func, cst.Attribute) or fn.name.value == "__call__"):
            params = params[1:]  # (``scaler(loss, opt)``: an instance called runs its ``__call__``)
        for p, v in zip(params, args):
            new.locals[p.name.value] = v
        allp = list(fn.params.params) + list(fn.params.kwonly_params)
        for p in allp:
            nm = p.name.value
            if nm in kws:
                new.locals[nm] = kws[nm]
            elif nm not in new.locals and p.default is not None:
                lit = literal(p.default)
                new.locals[nm] = lit if isinstance(lit, bool) else Num(lit) if isinstance(lit, int) else UNK
            elif nm not in new.locals and nm not in ("self", "cls"):
                new.locals[nm] = UNK
        # how the caller wrote each argument, for messages (``under `update_grad` = `(i + 1) % accum == 0```)
        texts = {}
        if call is not None:
            pos_args = [a for a in call.args if a.keyword is None and not a.star]
            for p, a in zip(params, pos_args):
                texts[p.name.value] = a.value
            for a in call.args:
                if a.keyword is not None:
                    texts[a.keyword.value] = a.value
        self._arg_texts.append(texts)
        self._chain.append(call)
        saved_names = self.loop_names
        self.loop_names = saved_names | self.dr.assigned_in(fn)
        saved_stmt = self._stmt_node
        if self.depth == 0:
            self.site = call  # the loop body's call that led into the helpers
        self.depth += 1
        saved_x = self._xfn
        saved_xsite = self.xsite
        if project.info_of(fn) is not None:
            self._x_infos.append(project.info_of(fn))
            if self._xfn is None:
                self.xsite = call  # the innermost call of this file on the way into the sibling module
            self._xfn = fn
            self._xfns.append(fn)
        try:
            self._block(_body(fn.body), new)
        finally:
            self._arg_texts.pop()
            self._chain.pop()
            self.xsite = saved_xsite
            self.loop_names = saved_names
            self.depth -= 1
            self._stmt_node = saved_stmt
            if self._xfn is not saved_x:
                self._xfns.pop()
            self._xfn = saved_x
        return new.ret if new.ret is not None else UNK

    def _prepared_effect(self, recv: Optional[str]) -> tuple[Optional[bool], str]:
        """Does an optimizer / scheduler call take effect now? Inside ``accumulate()`` a prepared one is a no-op off
        the sync step (accelerate 1.15 AcceleratedOptimizer / AcceleratedScheduler)."""
        if not self.in_acc and not self.acc_used:
            return True, ""
        f = self.f
        built_here = recv is not None and f.prepared and recv not in f.prepared and self._built_here(recv)
        if built_here:
            return True, ""
        # the prepared optimizer reads accelerate's gradient state, which keeps the value the last accumulate()
        # entry set after the with-block is left
        if self.sync is None:
            return None, "sync step unknown"
        return (True, "") if self.sync else (False, "off the sync step")

    def _built_here(self, recv: str) -> bool:
        """The optimizer / scheduler ``recv`` is built by a known constructor (or DeepSpeed / Fabric hand it back),
        not by ``accelerator.prepare``."""
        roles = self.dr.roles
        try:
            r = roles.of(recv, self.loop.func) if roles is not None else None
        except Exception:
            r = None
        return r is not None and r.confident and r.by_constructor and r.wrapped_by != "accelerator"

    def _backward(self, call, style, recv, frame):
        f = self.f
        scaled = False
        if style == "tensor":
            tgt = call.func.value
            v = self.ev(tgt, frame)
        elif style == "scaler":
            inner = call.func.value  # scaler.scale(loss)
            v = self.ev(positional(inner, 0), frame) if positional(inner, 0) is not None else UNK
            v = Tensor(_times(v.scale, T.Factor(T.SCALER, "scaler")), True, v.node) if isinstance(v, Tensor) else UNK
            scaled = self.scaler_on
        else:
            a0 = positional(call, 0)
            v = self.ev(a0, frame) if a0 is not None else UNK
            for a in call.args[1:]:
                self.ev(a.value, frame)
        scale = v.scale if isinstance(v, Tensor) else None
        if scale is not None and style == "accelerator":
            an = self.acc_n
            ds = self._ds_config_n(scale, frame)
            if ds is not None:
                # under a DeepSpeed launch accelerator.backward() is the engine's backward, which divides by the
                # DeepSpeed config's gradient_accumulation_steps — the value the script divided by
                scale = _times(scale, T.Factor(T.ACCUM_FRAMEWORK, ds, power=-1,
                                               who="accelerator.backward() under DeepSpeed (the engine)"))
            elif an is None:
                scale = _times(scale, T.Factor(T.OTHER, "accelerator's gradient_accumulation_steps"))
            elif an[0] is None:
                scale = _times(scale, T.Factor(T.OTHER, an[1]))
            elif an[0] > 1:
                scale = _times(scale, T.Factor(T.ACCUM_FRAMEWORK, an[1], power=-1, who="accelerator.backward()"))
            if self.f.accelerator_deepspeed is None and _fp16(self):
                scaled = scaled
        elif scale is not None and style == "engine":
            if kwarg(call, "scale_wrt_gas") is None:
                scale = _times(scale, T.Factor(T.ACCUM_FRAMEWORK, "gradient_accumulation_steps", power=-1,
                                               who="the DeepSpeed engine"))
        elif style == "engine-like":
            if recv and self.dr.role(recv, frame.func)[0] == "engine" and scale is not None:
                if kwarg(call, "scale_wrt_gas") is None:
                    scale = _times(scale, T.Factor(T.ACCUM_FRAMEWORK, "gradient_accumulation_steps", power=-1,
                                                   who="the DeepSpeed engine"))
                style = "engine"
            else:
                scale = None
        if scaled:
            self.scaled = True
        if not self.in_micro:
            # a backward outside the micro-batch loop (the non-accumulating arm of ``if N > 1: ... else: ...``):
            # each one is a micro-batch of its own
            self.mb += 1
        fns, where, fwd_certain, fwd_site = self.fwd_ns.get(id(v.node), (None, None, False, None)) \
            if isinstance(v, Tensor) and v.node is not None else (None, None, False, None)
        since = v.since if isinstance(v, Tensor) and v.graph else None
        if not self.in_micro and since is not None and since == self.mb - 1:
            since = self.mb  # the forward ran in this iteration, before the backward opened its micro-batch
        summed = v.inner if isinstance(v, Tensor) and v.graph and v.inner is not None and \
            not any(x is v.inner for x in self.inner_loops) else None  # backward after the loop that summed it
        self.emit("backward", call, scale=scale, scaled=scaled, via=style, fwd_no_sync=fns, graph_from=since,
                  graph_loop=_loop_header(self.dr, summed) if summed is not None else "")
        if summed is not None:
            self.trace.events[-1].meta["graph_loop"] = summed
        self.trace.events[-1].meta["fwd_ctx"] = where
        self.trace.events[-1].meta["fwd_certain"] = fwd_certain  # the forward ran whatever the undecided conditions
        if frame.depth and frame.func is not None:
            # the helper holding the backward also runs the forward of its loss (``_training_iteration``), or was
            # handed a loss made by its caller (``backward(loss, scaler)``)
            self.trace.events[-1].meta["fwd_here"] = isinstance(v, Tensor) and v.node is not None and (
                id(v.node) in self.dr.inside(frame.func) or (fwd_site is not None and fwd_site is self.site))
        return UNK

    # ------------------------------------------------------------------ events
    def emit(self, kind: str, node, confident: bool = True, **kw) -> None:
        cond_line, cond_text = 0, ""
        if self.conds:
            cond_line = self.conds[-1][0]
            test = self.conds[-1][1]
            cond_text = self.dr.code(test)
        text = ""
        if isinstance(node, cst.Call):
            text = self.dr.code(node)
            if len(text) > 60:
                text = (call_name(node) or "call") + "(…)"
        ev = T.Event(kind, 0, certain=self.certain, in_no_sync=bool(self.no_sync), text=text,
                     mb=self.mb, epoch=self.epoch, cond_line=cond_line, cond_text=cond_text, node=node, **kw)
        ev.meta["confident"] = confident
        ev.meta["stmt"] = self._stmt_node
        ev.meta["block"] = self._cur_block
        ev.meta["depth"] = self.depth
        ev.meta["site"] = self.site if self.depth else None
        ev.meta["chain"] = tuple(self._chain)
        ev.meta["cond"] = self.conds[-1][1] if self.conds else None
        ev.meta["conds"] = [c for _, c in self.conds]
        # a helper's flag condition (``if update_grad:``): the argument its caller passed, for messages
        ev.meta["cond_args"] = {id(c): a for c in ev.meta["conds"] if type(c) is cst.Name and self._arg_texts
                                for a in [self._arg_texts[-1].get(c.value)] if a is not None and type(a) is not cst.Name}
        ev.meta["arms"] = tuple(self.arms)  # the undecided conditions and the side taken (trace.update_on_every_path)
        ev.meta["seq"] = self.store_seq
        ev.meta["in_accumulate"] = bool(self.in_acc)
        if self._xfn is not None and self.site is not None:
            # made in a sibling module: reported at the call of this file that leads there
            ev.meta["xsite"] = self.xsite or self.site
            for n in [node, self._stmt_node] + ev.meta["conds"]:
                if n is not None:
                    fn = next((g for g in reversed(self._xfns) if id(n) in self.dr.inside(g)), None)
                    if fn is not None:
                        self.dr.foreign(n, self.xsite or self.site, fn)
        self.trace.events.append(ev)


_MODEL_ROLES = ("model", "ddp_model", "lightning_module")

_ACCELERATOR_Q = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")


def _sibling_accelerator_n(r) -> Optional[tuple]:
    """The accumulation factor of an Accelerator the file gets from a factory in a sibling module of the project
    (``accelerator = train_util.prepare_accelerator(args)``, ``bertlint.analysis.project``), as
    ``_Runner._accelerator_n`` gives it; None when not shown (no such factory, ``**kwargs``, a plugin, a file that
    cannot be read)."""
    hit = _sibling_acc(r.dr)
    if hit is None:
        return None
    v, text = hit[0], hit[1]
    if v is not None:
        return (v, text)
    if r.n_text and text == r.n_text:
        return (r.n, text)
    return (r.n if r.n and r.n > 1 else None, text)


def _sibling_acc(dr) -> Optional[tuple]:
    """(value | None, text, ModuleInfo, Accelerator call) of a sibling-built Accelerator (memoised per file)."""
    hit = dr.__dict__.get("_sibling_acc", False)
    if hit is False:
        hit = None
        xp = project.for_module(dr.ctx.module)
        try:
            got = xp.built_by_factory(_ACCELERATOR_Q, dr.f) if xp is not None else None
        except Exception:
            got = None
        if got is not None:
            call, binds, info, target, fn = got
            if dr.f.receiver_kind(target)[0] == "accelerator" or (dr.roles is not None and dr.roles.role(target)
                                                                  in ("accelerator", None)):
                if any(a.star for a in call.args) or kwarg(call, "gradient_accumulation_plugin") is not None:
                    hit = None
                else:
                    ga = kwarg(call, "gradient_accumulation_steps")
                    if ga is None:
                        hit = (1, "1", info, call)
                    else:
                        lit = literal(ga)
                        text = dr.code(ga)
                        head = text.split(".")[0]
                        if head in binds and "(" not in text:
                            text = binds[head] + text[len(head):]  # the factory's parameter: the caller's argument
                        hit = (lit if isinstance(lit, int) and not isinstance(lit, bool) else None, text, info, call)
        dr._sibling_acc = hit
    return hit


def _ddp_fact(dr, calls=None) -> Optional[tuple]:
    """(True, when, how) for the file's DistributedDataParallel wrapping (see ``FileDryRun.ddp_fact``); ``calls``:
    only these wrappings of the file (default: all)."""
    calls = list(dr.f.ddp_calls if calls is None else calls)
    if calls:
        chains = []
        for c in calls:
            ch = _wrap_conditions(dr, c)
            if not ch:
                return (True, "", "wrap")
            chains.append(ch)
        # the innermost condition every wrapping is under (``if dist is not None:`` around ``if nccl: DDP(m, ids)
        # else: DDP(m)``); the two arms of one ``if`` between them: unconditional; else the first one's
        keys = [{(k, side) for k, side, _ in ch} for ch in chains]
        for k, side, text in chains[0]:
            if all((k, side) in ks for ks in keys[1:]):
                return (True, text, "wrap")
        outer = {ch[-1][0] for ch in chains}
        if len(outer) == 1 and len({ch[-1][1] for ch in chains}) == 2:
            return (True, "", "wrap")
        return (True, chains[0][0][2], "wrap")
    sib = _sibling_ddp(dr)
    if sib is not None:
        return sib
    # a parameter annotated as one (``def train(model: DistributedDataParallel, ...)``)
    t = dr.f.t
    for d in t.defs:
        if not isinstance(d, cst.FunctionDef):
            continue
        for p in list(d.params.params) + list(d.params.kwonly_params):
            ann = p.annotation.annotation if p.annotation is not None else None
            if ann is None or isinstance(ann, cst.SimpleString):
                continue
            q = t.qualname(ann) or ""
            if q.endswith("DistributedDataParallel") and "FullySharded" not in q and q.split(".")[0] in ("torch",):
                return (True, f"`{p.name.value}` is annotated as one", "annotation")
    # a model prepared by accelerate is DDP when the script is launched with more than one process (and no DeepSpeed
    # / FSDP plugin): how many, the file does not say — only the configuration's ``world-size`` does (unknown stays
    # unknown: no finding without it)
    ws = getattr(dr.ctx.settings, "world_size", None)
    if isinstance(ws, int) and ws > 1 and not _accelerate_plugin(dr) and _prepared_model(dr):
        return (True, f"by `accelerator.prepare` when launched with {ws} processes, the configuration's "
                      f"`world-size`", "launch")
    return None


def _func_of(dr, node) -> Optional[cst.FunctionDef]:
    return next((a for a in dr.ctx.index.ancestors(node) if isinstance(a, cst.FunctionDef)), None)


def _call_graph(dr) -> dict:
    """id(function) -> names of the file's functions it calls or hands on (``train(...)``, ``self.train(...)``,
    ``mp.spawn(train, ...)``, ``partial(train, ...)``)."""
    g = dr.__dict__.get("_call_graph")
    if g is None:
        g = {}
        for call, name, func in dr.f.t.calls:
            out = g.setdefault(id(func), set())
            out.add(name.rsplit(".", 1)[-1])
            for a in call.args:
                if isinstance(a.value, cst.Name):
                    out.add(a.value.value)
                elif isinstance(a.value, cst.Attribute) and isinstance(a.value.value, cst.Name) and \
                        a.value.value.value == "self":
                    out.add(a.value.attr.value)
        dr.__dict__["_call_graph"] = g
    return g


def _reaches(dr, a, b, depth: int = 4) -> bool:
    """Function ``a`` calls (or hands on) ``b``, directly or through the file's functions it calls."""
    g = _call_graph(dr)
    funcs = dr.f.t.module_funcs
    methods = dr.f.t.class_methods
    seen = {id(a)}
    frontier = [a]
    for _ in range(depth):
        nxt = []
        for f in frontier:
            for name in g.get(id(f), ()):
                if name == b.name.value:
                    return True
                for cand in list(funcs.get(name, ())) + [m[name] for m in methods.values() if name in m]:
                    if id(cand) not in seen:
                        seen.add(id(cand))
                        nxt.append(cand)
        frontier = nxt
        if not frontier:
            break
    return False


def _connected(dr, a, b) -> bool:
    """Two scopes of the file can share a model: one of them is module level, they are the same function, one is
    nested in the other, both are methods of one class, or one reaches the other through calls."""
    if a is None or b is None or a is b:
        return True
    try:
        anc_b = set(map(id, dr.ctx.index.ancestors(b)))
        anc_a = set(map(id, dr.ctx.index.ancestors(a)))
        if id(a) in anc_b or id(b) in anc_a:
            return True
        mc = dr.f.t.method_class
        ca, cb = mc.get(id(a)), mc.get(id(b))
        if ca is not None and ca is cb:
            return True
        return _reaches(dr, a, b) or _reaches(dr, b, a)
    except Exception:
        return True


def _accelerate_deepspeed(dr) -> bool:
    """accelerate runs the script under DeepSpeed: a ``DeepSpeedPlugin`` in the code, every accelerate launcher
    config beside the script with ``distributed_type: DEEPSPEED``, or a script written for it (``DummyOptim``);
    the prepared optimizer is then accelerate's ``DeepSpeedOptimizerWrapper``."""
    memo = dr.__dict__.get("_acc_ds")
    if memo is None:
        memo = dr.f.accelerator_deepspeed is not None
        if not memo:
            try:
                from bertlint.analysis.configfiles import deepspeed_enabled_for

                memo = deepspeed_enabled_for(dr.ctx)[0] is True
            except Exception:
                memo = False
        dr.__dict__["_acc_ds"] = memo
    return memo


def _is_ddp_q(q: str) -> bool:
    return q.endswith("DistributedDataParallel") and q.startswith("torch")


def _sibling_ddp(dr) -> Optional[tuple]:
    """The model handed to a factory of a sibling module that wraps it in DistributedDataParallel and returns it
    (``model, opt = distributed_opt(args, model, opt)``, ``bertlint.analysis.project``): ``(True, when, "wrap")``
    as ``_ddp_fact`` gives it, the conditions read in the sibling and its file and line named."""
    xp = project.for_module(dr.ctx.module)
    if xp is None:
        return None

    def is_model(text: str) -> bool:
        try:
            return dr.roles is not None and dr.roles.role(text) in _MODEL_ROLES
        except Exception:
            return False

    try:
        hit = xp.wrapped_by_factory(_is_ddp_q, dr.f, is_model)
    except Exception:
        hit = None
    if hit is None:
        return None
    call, conds, info, site = hit
    at = project.where(call, info) or info.name
    fname = dr.code(site.func)
    by = f"by `{fname}` at {at}"
    return (True, f"when {' and '.join(conds)}, {by}" if conds else by, "wrap")


def _accelerate_plugin(dr) -> bool:
    """The file reads or configures accelerate's DeepSpeed / FSDP plugin (the prepared model may then be a
    DeepSpeed engine or FSDP module, which own their sync)."""
    if dr.f.accelerator_deepspeed is not None:
        return True
    names = {"deepspeed_plugin", "fsdp_plugin", "DEEPSPEED", "FSDP"}
    return any(a.attr.value in names for a in dr.ctx.index.of(cst.Attribute)) or any(
        n.value in ("DeepSpeedPlugin", "FullyShardedDataParallelPlugin") for n in dr.ctx.index.of(cst.Name))


def _wrap_conditions(dr, call) -> list:
    """The conditions of the function a wrapping runs under, innermost first: ``(id(if), in body, "when
    `args.distributed`")``; [] when unconditional (``if __name__ == "__main__"`` is no condition)."""
    out = []
    child = call
    for p in dr.ctx.index.ancestors(call):
        tp = type(p)
        if tp in (cst.FunctionDef, cst.Module, cst.ClassDef, cst.Lambda):
            break
        if (tp is cst.If or tp is cst.IfExp) and child is not p.test:
            text = _norm(dr.code(p.test))
            if "__name__" not in text:
                body = child is p.body
                out.append((id(p), body, f"when `{text}`" if body else f"when `{text}` is false"))
        child = p
    return out


def _prepared_model(dr) -> bool:
    """An ``accelerator.prepare(...)`` / ``prepare_model(...)`` of this file receives a model (by role, through
    ``*components`` lists built in the same function)."""
    roles = dr.roles
    if roles is None:
        return False
    for call in dr.ctx.index.of(cst.Call):
        fn = call.func
        if not isinstance(fn, cst.Attribute) or fn.attr.value not in ("prepare", "prepare_model"):
            continue
        func = _func_of(dr, call)
        recv = dotted(fn.value)
        if recv is None or dr.role(recv, func)[0] != "accelerator":
            continue
        for a in call.args:
            elems = [a.value]
            if a.star and isinstance(a.value, cst.Name):
                elems = []
                for asg in dr.t_assignments(a.value.value, func):
                    if isinstance(asg.value, (cst.List, cst.Tuple)):
                        elems.extend(e.value for e in asg.value.elements)
            for e in elems:
                try:
                    r = roles.of(e, func)
                except Exception:
                    r = None
                if r is not None and r.confident and r.role in _MODEL_ROLES:
                    return True
    return False


def _fp16(r) -> bool:
    return False


def _scaler_enabled(f) -> bool:
    """False when every GradScaler of the file is built with ``enabled=False`` (it then scales nothing)."""
    defs = [c for cs in f.scaler_defs.values() for c in cs]
    return not (defs and all(literal(kwarg(c, "enabled")) is False for c in defs))


# ------------------------------------------------------------------------------------------------ helpers


def _training_stop(stmt, loop, exits: frozenset) -> bool:
    """``if 0 < max_steps < global_step: break``: a guard that only breaks (no ``continue``) and does not test the
    micro-batch loop's own position (its target / index names) stops training once, when a budget is reached; it
    does not decide which micro-batches of each epoch run (``if i >= steps_per_epoch: continue`` does)."""
    node = getattr(loop, "node", None)
    if not isinstance(node, cst.For) or not isinstance(stmt, cst.If) or stmt.orelse is not None:
        return False
    if exits != frozenset(("break",)):
        return False
    position = set(_target_names(node.target))
    used = {n.value for n in _walk(stmt.test) if type(n) is cst.Name}
    return bool(used) and not (used & position)


def _loop_exits(stmt) -> frozenset:
    """The ``continue`` / ``break`` statements of the enclosing loop inside ``stmt`` (see FileDryRun.loop_exits)."""
    found = set()
    todo = list(children(stmt))  # the cached code-bearing children (libcst's ``.children`` runs a visitor each time)
    while todo and len(found) < 2:
        n = todo.pop()
        tp = type(n)
        if tp is cst.Continue:
            found.add("continue")
        elif tp is cst.Break:
            found.add("break")
        elif tp in (cst.For, cst.While, cst.FunctionDef, cst.ClassDef, cst.Lambda):
            continue
        todo.extend(children(n))
    return frozenset(found)


def _zero_grad_call(small) -> bool:
    """``optimizer.zero_grad()`` / ``model.zero_grad()`` as a statement of its own: run even before the loop (at the
    start of each epoch when the loop's function is one epoch)."""
    return type(small) is cst.Expr and type(small.value) is cst.Call and isinstance(small.value.func, cst.Attribute) \
        and small.value.func.attr.value == "zero_grad"


def _unwrap_iter(it):
    """``tqdm(enumerate(loader))`` / ``logger.log_every(range(n), ...)``: the enumerate / range inside a wrapper."""
    seen = 0
    cur = it
    while isinstance(cur, cst.Call) and seen < 3:
        name = call_name(cur) or ""
        if name in ("enumerate", "range"):
            return cur
        a0 = positional(cur, 0)
        if not isinstance(a0, cst.Call):
            return it
        cur = a0
        seen += 1
    return cur if isinstance(cur, cst.Call) and (call_name(cur) or "") in ("enumerate", "range") else it


def _str_key(e) -> Optional[str]:
    """``d["loss"]`` -> 'loss'."""
    if not isinstance(e, cst.Subscript) or len(e.slice) != 1 or not isinstance(e.slice[0].slice, cst.Index):
        return None
    k = e.slice[0].slice.value
    if not isinstance(k, cst.SimpleString):
        return None
    return k.value[1:-1]


def _merge(now: dict, before: dict, stored: set) -> None:
    """After an undecided branch: what it changed is unknown (a loss keeps its scale only if it is unchanged)."""
    for k, v in list(now.items()):
        if k not in stored:
            continue
        old = before.get(k, _MISSING)
        if v is old:
            continue
        if isinstance(v, Tensor) and isinstance(old, Tensor) and v.scale == old.scale:
            continue
        now[k] = Tensor(None, True) if isinstance(v, Tensor) or isinstance(old, Tensor) else UNK


_MISSING = object()


def _restore(now: dict, before: dict, stored: set) -> None:
    """Back to the state before an undecided ``if``: what the arm stored is undone (first reads made by the arm are
    kept: they are not stores)."""
    now.update(before)
    for k in stored:
        if k not in before:
            now.pop(k, None)


def _same(a, b) -> bool:
    if a is b:
        return True
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return a.scale is not None and a.scale == b.scale and a.graph == b.graph
    if isinstance(a, Num) and isinstance(b, Num):
        return a.v is not None and a.v == b.v and a.is_n == b.is_n
    if isinstance(a, bool) and isinstance(b, bool):
        return a == b
    return False


def _merge_arms(now: dict, before: dict, arm1: dict, stored1: set, stored2: set) -> None:
    """After an undecided ``if``: ``now`` holds the second arm's state. A name either arm stored keeps its value
    when both paths leave the same (an arm that did not store it leaves the value from before)."""
    for k in stored1 | stored2:
        if k in stored2:
            v2 = now.get(k, _MISSING)
        else:
            v2 = before.get(k, _MISSING)
        if k in stored1:
            v1 = arm1.get(k, _MISSING)
        else:
            v1 = before.get(k, _MISSING)
        if v1 is _MISSING and v2 is _MISSING:
            continue
        if _same(v1, v2):
            if isinstance(v1, Tensor) and v1 is not v2:
                # the same scale from two different computations: which forward made it is not known
                v2 = Tensor(v2.scale, v2.graph, v1.node if v1.node is v2.node else None,
                            v1.since if v1.since == v2.since else None)
            now[k] = v2
            continue
        if isinstance(v1, DictVal) and v1 is v2:
            now[k] = v1
            continue
        w = _weight_only_join(v1, v2)
        if w is not None:
            now[k] = w
            continue
        now[k] = Tensor(None, True) if isinstance(v1, Tensor) or isinstance(v2, Tensor) else UNK


def _weight_only_join(v1, v2) -> Optional[Tensor]:
    """Two losses whose scales differ only by weights that do not change with N (``itm + lam * ot`` on one path,
    ``loss.mean()`` on the other): the same accumulation and loss-scaler factors on both paths, times a weight of
    unknown value. None when they differ otherwise (an unknown factor, another power of N, a graph on one only)."""
    if not (isinstance(v1, Tensor) and isinstance(v2, Tensor)) or v1.scale is None or v2.scale is None:
        return None
    if v1.graph != v2.graph or not v1.graph:
        return None
    keep = (T.ACCUM_USER, T.ACCUM_FRAMEWORK, T.SCALER)
    a = [f for f in v1.scale.factors if f.kind in keep]
    b = [f for f in v2.scale.factors if f.kind in keep]
    if any(f.kind == T.OTHER for f in v1.scale.factors + v2.scale.factors):
        return None
    if sorted((f.kind, f.power, f.text) for f in a) != sorted((f.kind, f.power, f.text) for f in b):
        return None
    return Tensor(T.Scale(tuple(b) + (T.Factor(T.WEIGHT, "a weight that differs between the branches"),)), True,
                  v1.node if v1.node is v2.node else None, v1.since if v1.since == v2.since else None)


def _loader_texts(ld, dr) -> set:
    """``tqdm(train_loader, ...)`` also stands for ``train_loader`` (``len(train_loader)``)."""
    out = {dr.code(ld)}
    while isinstance(ld, cst.Call) and ld.args:
        ld = ld.args[0].value
        out.add(dr.code(ld))
    return out


def _times(scale: Optional[T.Scale], f: T.Factor) -> Optional[T.Scale]:
    if scale is None:
        return None
    return scale.times(f)


def _tv(v) -> Optional[bool]:
    if isinstance(v, bool):
        return v
    if v is None:
        return False
    if isinstance(v, Num):
        return None if v.v is None else v.v != 0
    return None


def _unk_of(a, b):
    m = getattr(a, "mod", None) or getattr(b, "mod", None)
    return _Unk(mod=m) if m is not None else UNK


def _has_call(node) -> bool:
    return any(type(x) is cst.Call for x in _walk(node))


def _cmp(op, a, b) -> Optional[bool]:
    if op in (cst.Is, cst.IsNot):
        if a is None and b is None:
            r = True
        elif (a is None) != (b is None) and (isinstance(a, (Num, bool, Tensor)) or isinstance(b, (Num, bool, Tensor))):
            r = False
        else:
            return None
        return r if op is cst.Is else not r
    x = a.v if isinstance(a, Num) else (int(a) if isinstance(a, bool) else None)
    y = b.v if isinstance(b, Num) else (int(b) if isinstance(b, bool) else None)
    if x is None or y is None:
        return None
    if op is cst.Equal:
        return x == y
    if op is cst.NotEqual:
        return x != y
    if op is cst.LessThan:
        return x < y
    if op is cst.LessThanEqual:
        return x <= y
    if op is cst.GreaterThan:
        return x > y
    if op is cst.GreaterThanEqual:
        return x >= y
    return None


def _size_average_false(call) -> bool:
    """The legacy ``nn.XLoss(size_average=False)`` (summed unless ``reduce=False``)."""
    r = kwarg(call, "size_average")
    red = kwarg(call, "reduce")
    return type(r) is cst.Name and r.value == "False" and not (type(red) is cst.Name and red.value == "False")


def _reduction_sum(call) -> bool:
    r = kwarg(call, "reduction")
    return type(r) is cst.SimpleString and r.evaluated_value == "sum"


def _sum_expr(e, sums: set) -> bool:
    """``e`` is a summed loss: a ``reduction="sum"`` call, a name bound to one, a sum of such terms, or one of
    them scaled by a number literal (``F.mse_loss(..., reduction="sum") / 2``)."""
    if isinstance(e, cst.Call):
        return _reduction_sum(e)
    if isinstance(e, cst.Name):
        return e.value in sums
    if isinstance(e, cst.BinaryOperation):
        if isinstance(e.operator, cst.Add):
            return _sum_expr(e.left, sums) and _sum_expr(e.right, sums)
        if isinstance(e.operator, (cst.Multiply, cst.Divide)):
            num = (cst.Integer, cst.Float)
            if isinstance(e.right, num):
                return _sum_expr(e.left, sums)
            if isinstance(e.operator, cst.Multiply) and isinstance(e.left, num):
                return _sum_expr(e.right, sums)
    return False


def _returns_sum_loss(fn) -> bool:
    """A ``forward`` whose every ``return`` of a call is a ``reduction="sum"`` loss (``return F.cross_entropy(...,
    reduction="sum")``, or a name assigned from one, or the first item of a returned tuple
    ``return loss, loss_xy, ...``), where a name may also be built up as ``loss = 0`` then ``loss += F.bce(...,
    reduction="sum")`` (a detection loss summed over the images of the batch)."""
    sums: set = set()
    bad: set = set()  # bound to something else too
    zero: set = set()
    rets: list = []

    class V(cst.CSTVisitor):
        def visit_Assign(self, node):
            for t in node.targets:
                tgt, vals = t.target, [node.value]
                if isinstance(tgt, cst.Tuple) and isinstance(node.value, cst.Tuple) and \
                        len(tgt.elements) == len(node.value.elements):
                    pairs = [(a.value, b.value) for a, b in zip(tgt.elements, node.value.elements)]
                else:
                    pairs = [(tgt, vals[0])]
                for tg, v in pairs:
                    if not isinstance(tg, cst.Name):
                        continue
                    if _sum_expr(v, sums):
                        sums.add(tg.value)
                    elif isinstance(v, cst.Integer) and v.value == "0":
                        zero.add(tg.value)
                    else:
                        bad.add(tg.value)

        def visit_AugAssign(self, node):
            if isinstance(node.target, cst.Name):
                n = node.target.value
                if isinstance(node.operator, cst.AddAssign) and _sum_expr(node.value, sums) and \
                        (n in zero or n in sums):
                    sums.add(n)
                elif not (isinstance(node.operator, (cst.MultiplyAssign, cst.DivideAssign))
                          and isinstance(node.value, (cst.Integer, cst.Float))):
                    bad.add(n)

        def visit_Return(self, node):
            rets.append(node.value)

        def visit_FunctionDef(self, node):
            return node is fn  # not into nested functions

    fn.visit(V())
    sums -= bad
    if not rets:
        return False
    for r in rets:
        if isinstance(r, cst.Tuple) and r.elements:
            r = r.elements[0].value
        if _sum_expr(r, sums):
            continue
        return False
    return True


def _eq_const(expr) -> Optional[tuple]:
    """``x == C`` (one ``==``, no ``not``) with ``C`` a literal or a dotted name (an enum member, a module constant):
    (code of ``x``, code of ``C``); None otherwise."""
    if not isinstance(expr, cst.Comparison) or len(expr.comparisons) != 1:
        return None
    ct = expr.comparisons[0]
    if not isinstance(ct.operator, cst.Equal):
        return None
    c = ct.comparator
    if isinstance(c, (cst.SimpleString, cst.Integer, cst.Float)):
        return _norm(code_of(expr.left)), code_of(c).strip().strip("'\"") if isinstance(c, cst.SimpleString) \
            else code_of(c).strip()
    d = dotted(c)
    if d is None or d in ("True", "False", "None") or d.split(".")[-1][:1].islower():
        return None  # ``x == y`` of two variables (``C`` upper-case or an enum attribute: a constant)
    return _norm(code_of(expr.left)), d


def _eq_excluded(expr, config: dict, memo: Optional[dict] = None) -> Optional[str]:
    """The key of a configuration condition ``x == A`` that holds in ``config`` while ``expr`` is ``x == B`` with a
    different constant ``B``: ``expr`` is then False (None: not such a case). ``memo`` (the file's): ``_eq_const`` of
    the expression and of each key, computed once."""
    if not config:
        return None
    if memo is None:
        memo = {}
    hit = memo.get(id(expr))
    if hit is None or hit[0] is not expr:
        hit = memo[id(expr)] = (expr, _eq_const(expr))
    mine = hit[1]
    if mine is None:
        return None
    for k, held in config.items():
        if held is not True or " == " not in k:
            continue
        if k in memo:
            theirs = memo[k]
        else:
            try:
                theirs = _eq_const(cst.parse_expression(k))
            except Exception:
                theirs = None
            memo[k] = theirs
        if theirs is not None and theirs[0] == mine[0] and theirs[1] != mine[1]:
            return k
    return None


def _mode_chain(stmt) -> Optional[list]:
    """The tests of an ``if`` / ``elif`` chain when every one is a bare flag (``self.use_apex``, ``args.fp16``, ``not
    x``): a dispatch on exclusive modes. None for any other chain."""
    tests = []
    while isinstance(stmt, cst.If):
        t = stmt.test
        while isinstance(t, cst.UnaryOperation) and isinstance(t.operator, cst.Not):
            t = t.expression
        if type(t) not in (cst.Name, cst.Attribute) or dotted(t) is None:
            return None
        tests.append(stmt.test)
        stmt = stmt.orelse
    return tests if len(tests) >= 2 else None


def _cond_key(expr) -> tuple[str, bool]:
    """A configuration key and polarity: ``not x`` / ``x is None`` -> (x, False); ``x is not None`` -> (x, True)."""
    pol = True
    while isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Not):
        pol = not pol
        expr = expr.expression
    if isinstance(expr, cst.Comparison) and len(expr.comparisons) == 1:
        ct = expr.comparisons[0]
        if isinstance(ct.comparator, cst.Name) and ct.comparator.value == "None":
            if isinstance(ct.operator, cst.Is):
                return _norm(code_of(expr.left)), not pol
            if isinstance(ct.operator, cst.IsNot):
                return _norm(code_of(expr.left)), pol
    return _norm(code_of(expr)), pol


def _norm(text: str) -> str:
    t = " ".join(text.split())
    if t.startswith("(") and t.endswith(")"):
        t = t[1:-1].strip()
    return t


def _body(suite) -> list:
    if isinstance(suite, cst.IndentedBlock):
        return list(suite.body)
    if isinstance(suite, cst.SimpleStatementSuite):
        return [suite]  # ``if x: a(); b()`` runs like a simple statement line
    return []


def _name_expr(name: str):
    parts = name.split(".")
    e: cst.BaseExpression = cst.Name(parts[0])
    for p in parts[1:]:
        e = cst.Attribute(value=e, attr=cst.Name(p))
    return e


def _sibling_counter_start(name: str, func, info) -> Optional[Num]:
    """``self.local_updates`` read in a sibling module's method (``model.update(batch)`` of a class defined in
    ``mt_dnn/model.py``): a counter of the object that the class's ``__init__`` sets to one integer literal and that
    only ``+=`` changes afterwards starts at that literal in a fresh run (the same reading as a counter of this
    file's own class, ``_counter_init``). Anything else (assigned again, loaded from a checkpoint): None."""
    if info is None or not name.startswith("self.") or name.count(".") != 1:
        return None
    try:
        st = info.symbols
    except Exception:
        return None
    cls = st.method_class.get(id(func))
    if cls is None or not st.aug_assigns.get(name):
        return None
    assigns = st.assignments.get(name, [])
    if len(assigns) != 1:
        return None
    a = assigns[0]
    if a.func is None or a.func.name.value != "__init__" or st.method_class.get(id(a.func)) is not cls:
        return None
    v = literal(a.value)
    if type(v) is not int:
        return None
    for node, _f in st.aug_assigns[name]:
        if not isinstance(node.operator, cst.AddAssign) or type(literal(node.value)) is not int:
            return None
    return Num(v)


def _target_names(t) -> list:
    out: list = []
    tt = type(t)
    if tt is cst.Tuple or tt is cst.List:
        for el in t.elements:
            out.extend(_target_names(el.value))
    elif tt is cst.StarredElement:
        out.extend(_target_names(t.value))
    else:
        d = dotted(t)
        if d:
            out.append(d)
    return out


def _ends_iteration(suite) -> bool:
    """The block ends with ``continue`` or ``return`` (the rest of the iteration does not run after it)."""
    body = _body(suite)
    last = body[-1] if body else None
    if isinstance(last, cst.SimpleStatementLine):
        return any(isinstance(x, (cst.Continue, cst.Return)) for x in last.body)
    return isinstance(suite, cst.SimpleStatementSuite) and any(isinstance(x, (cst.Continue, cst.Return))
                                                                for x in suite.body)


def _self_add(small) -> bool:
    """``x = x + y`` / ``x = y + x`` (one target)."""
    v = small.value
    if len(small.targets) != 1 or type(v) is not cst.BinaryOperation or type(v.operator) is not cst.Add:
        return False
    d = dotted(small.targets[0].target)
    return d is not None and (dotted(v.left) == d or dotted(v.right) == d)


def _loop_header(dr, node) -> str:
    """``for batch in window`` / ``while ...`` as written (shortened)."""
    if isinstance(node, cst.For):
        return f"for {dr.code(node.target)} in {dr.code(node.iter)}"[:80]
    if isinstance(node, cst.While):
        return f"while {dr.code(node.test)}"[:80]
    return ""


def _reset_counter_bound(stmt: cst.If):
    """The bound ``M`` of a gate ``if c == M:`` (or ``c >= M``) whose own body resets the counter (``c = 0``): the
    gate fires every M-th advance of ``c``, a period like ``i % M == 0`` (the step under it makes M the accumulation
    factor by usage, ``_period_gate``). None for other conditions, a literal bound (the run decides it), or a
    counter the gate does not reset (``c == M`` then fires once)."""
    t = stmt.test
    if type(t) is not cst.Comparison or len(t.comparisons) != 1:
        return None
    ct = t.comparisons[0]
    if type(ct.operator) not in (cst.Equal, cst.GreaterThanEqual):
        return None
    ctr = dotted(t.left)
    bound = ct.comparator
    if ctr is None or dotted(bound) is None:  # (a literal bound: the run decides the gate itself)
        return None
    for n in _walk(stmt.body):
        if type(n) is cst.Assign and len(n.targets) == 1 and dotted(n.targets[0].target) == ctr and \
                literal(n.value) == 0:
            return bound
    return None


# method names that change their receiver (or record an event): a function calling one is not inert
_MUTATORS = frozenset({"append", "extend", "insert", "add", "setdefault", "pop", "popitem", "clear", "remove",
                       "discard", "update", "register_hook", "register_forward_hook", "register_full_backward_hook",
                       "register_forward_pre_hook", "apply", "load_state_dict", "optimizer_step",
                       "backward", "manual_backward", "accumulate", "autocast", "set_gradient_accumulation_boundary"})


def _inert_call(dr, f, call, func, cls) -> bool:
    """``call`` runs a same-file function that is ``_inert`` (its arguments hold no call either)."""
    try:
        g = f.callee(call, func, cls)
    except Exception:
        return False
    if g is None or any(type(x) is cst.Call for a in call.args for x in _walk(a.value)):
        return False
    return _inert(dr, g, f.class_of(g) or cls)


def _inert(dr, fn, cls, _seen: Optional[set] = None) -> bool:
    """A same-file (or sibling-module) function whose call, its value dropped, cannot change anything the trace
    records: no call of a method the loop model records or that changes its receiver (``_RELEVANT``,
    ``_CALL_ATTRS``, ``_MUTATORS``, an in-place ``x.add_()``), no assignment to an attribute, to an item of
    something it did not make itself, no ``global`` / ``nonlocal`` / ``yield``, and only such functions among the
    ones it calls (the model's forward, metrics, image saving and printing are opaque and record nothing). An
    evaluation pass or a sampler called for its files and logs (``self.evaluation(rate)``) is then not run: it
    can neither step, clear, clip nor keep a loss, and running it costs the run its budget."""
    memo = dr.__dict__.setdefault("_inert_memo", {})
    hit = memo.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    seen = _seen if _seen is not None else set()
    if id(fn) in seen:
        return True  # a cycle: the function's own body decides
    seen.add(id(fn))
    res = _inert_body(dr, fn, cls, seen)
    memo[id(fn)] = (fn, res)
    return res


def _inert_body(dr, fn, cls, seen: set) -> bool:
    params = {p.name.value for p in list(fn.params.params) + list(fn.params.kwonly_params)}
    for p in (fn.params.star_arg, fn.params.star_kwarg):
        if isinstance(p, cst.Param):
            params.add(p.name.value)
    local = set(assigned_names(fn.body)) - params
    calls = []
    for n in _walk(fn.body):
        tp = type(n)
        if tp in (cst.Global, cst.Nonlocal, cst.Yield, cst.Await):
            return False
        if tp is cst.Call:
            calls.append(n)
        elif tp in (cst.Assign, cst.AugAssign, cst.AnnAssign, cst.Del):
            targets = [t.target for t in n.targets] if tp is cst.Assign else [n.target]
            for t in targets:
                for x in _walk(t):
                    if type(x) is cst.Attribute and type(x.value) is not cst.Attribute:
                        return False  # ``self.fid = ...``, ``p.grad = None``, ``obj.attr += 1``
                    if type(x) is cst.Subscript:
                        root = x.value
                        while type(root) in (cst.Attribute, cst.Subscript):
                            root = root.value
                        if type(root) is not cst.Name or root.value not in local:
                            return False  # an item of a parameter, of ``self`` or of a global
    f = dr.f
    for c in calls:
        g = f.callee(c, fn, cls)
        if g is not None:
            if not _inert(dr, g, f.class_of(g) or cls, seen):
                return False
            continue
        func = c.func
        if type(func) is cst.Name:
            if func.value in _RELEVANT or func.value in ("exit", "quit"):
                return False  # ``clip_grad_norm_(...)`` imported by name, the process ended
            continue
        if type(func) is not cst.Attribute:
            continue
        name = func.attr.value
        if name in _RELEVANT or name in _CALL_ATTRS:
            return False
        if name in _MUTATORS or (name.endswith("_") and not name.startswith("_")):
            root = func.value
            while type(root) in (cst.Attribute, cst.Subscript, cst.Call):
                root = root.func if type(root) is cst.Call else root.value
            if type(root) is not cst.Name or root.value not in local:
                return False  # changes something the caller can see (``self.losses.append``, ``p.add_``)
    return True


def _walk(node):
    return scope_nodes(node)


def _names(expr) -> list:
    return names_in(expr)


def _ids_in(node) -> set:
    return {id(n) for n in _all_nodes(node)}


def _all_nodes(node):
    return scope_nodes(node, into_scopes=True)


def _assigned(fn) -> set:
    try:
        return assigned_names(fn)
    except Exception:
        return set()


def _local_defs(func) -> dict:
    if func is None:
        return {}
    out = {}
    for n in _walk(func.body):
        if type(n) is cst.FunctionDef:
            out.setdefault(n.name.value, n)
    return out


def _path_to(root, target) -> Optional[list]:
    """[(block, index)] from ``root``'s body down to the statement ``target``."""
    body = _body(root) if isinstance(root, (cst.IndentedBlock, cst.SimpleStatementSuite)) else (
        list(root.body) if isinstance(root, cst.Module) else [])
    return _find(body, target, 0)


def _find(block: list, target, depth: int) -> Optional[list]:
    if depth > 12:
        return None
    for i, s in enumerate(block):
        if s is target:
            return [(block, i)]
        for sub in _sub_blocks(s):
            r = _find(sub, target, depth + 1)
            if r is not None:
                return [(block, i)] + r
    return None


_BLOCK_STMTS = frozenset({cst.If, cst.For, cst.While, cst.With, cst.Try})


def _sub_blocks(s) -> list:
    # exact type tests (every libcst node class here has no subclass): isinstance through ABCMeta is slow
    out = []
    if type(s) in _BLOCK_STMTS:
        out.append(_body(s.body))
        orelse = getattr(s, "orelse", None)
        if type(orelse) is cst.If:
            out.extend(_sub_blocks(orelse))
        elif orelse is not None:
            out.append(_body(orelse.body))
        if type(s) is cst.Try:
            for h in s.handlers:
                out.append(_body(h.body))
            if s.finalbody is not None:
                out.append(_body(s.finalbody.body))
    return out
