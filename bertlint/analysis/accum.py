"""The accumulation factor N as a value, and the set-up facts of a file around it (BL1xx, the dry run).

- :class:`AccumFactor`: an accumulation factor — its text, its value when it resolves (else None: unknown), where it
  was found (a step gate, a loss division, the Accelerator, a plugin, the DeepSpeed plugin, a Trainer ...);
- :class:`Setup`: what the file's ``Accelerator(...)`` / plugins configure (``gradient_accumulation_steps``, a
  DeepSpeed plugin, ``**kwargs`` or a plugin it cannot read: unknown), the DDP and Lightning ``Trainer`` calls,
  the GradScaler and torch / transformers scheduler constructor calls by the name they are bound to, what ``accelerator.prepare``
  hands back, and the integer an expression resolves to (a command-line default of 1 counts as unknown);
- :func:`units_of`: whether a schedule length / step budget counts optimizer steps or micro-batches, from one walk
  of its definitions.

Receivers are classified by :mod:`bertlint.analysis.roles` (roles from usage); calls by their resolved qualified
names. ``ACCUM_RE`` is a name hint only: it words a message or lowers a severity, never makes a value N alone.
"""

from __future__ import annotations

import re
from typing import Optional

import libcst as cst

from bertlint._dataclass import dataclass, field
from bertlint.analysis.symbols import call_name, code_of, dotted, kwarg
from bertlint.analysis.walk import names_in as _names_in
from bertlint.analysis.walk import scope_nodes as _walk

# names that denote an accumulation factor: a hint (see the module docstring)
ACCUM_RE = re.compile(
    r"accum|grad_acc|gradient_acc|(^|[._])gas($|[._])|(^|[._])ga_steps|update_freq|accumulate_grad_batches|"
    r"(^|[._])n_accum|micro_steps_per|(^|[._])accum_iter",
    re.IGNORECASE,
)

# the schedulers whose length arguments ``_ga.sched_length`` reads: torch's and transformers' own (a project's
# ``get_scheduler_ex`` may take other arguments, or step differently)
_SCHED_Q = re.compile(r"^(torch\.optim\.lr_scheduler\.|torch\.optim\.swa_utils\.SWALR|"
                      r"transformers(\.optimization)?\.get_(\w*schedule\w*|scheduler)$)")
_ACCELERATOR = ("accelerate.Accelerator", "accelerate.accelerator.Accelerator")
_LIGHTNING_TRAINER = ("lightning.Trainer", "lightning.pytorch.Trainer", "pytorch_lightning.Trainer", "pl.Trainer")


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


def is_accum_name(text: str) -> bool:
    """An accumulation-named expression (``args.gradient_accumulation_steps``): a name hint."""
    return bool(ACCUM_RE.search(text.strip()))


class Setup:
    """The set-up facts of one file (see the module docstring). ``roles``: the file's :class:`roles.Roles`."""

    def __init__(self, t, r, roles) -> None:
        self.t = t
        self.r = r
        self.roles = roles
        self.prepared: set[str] = set()  # names produced by accelerator.prepare
        self.prepare_funcs: list = []  # functions (None = module level) holding an ``accelerator.prepare(...)``
        self.accelerator_calls: list[cst.Call] = []
        self.accelerator_ga: Optional[AccumFactor] = None  # None = not configured
        self.accelerator_ga_unknown = False  # **kwargs or a plugin we could not read
        self.accelerator_deepspeed: Optional[cst.CSTNode] = None  # DeepSpeedPlugin in code
        self.ddp_wrapped: set[str] = set()
        self.ddp_calls: list[cst.Call] = []
        self.lightning_trainer_calls: list[cst.Call] = []
        self.scheduler_defs: dict[str, list[cst.Call]] = {}
        self.scaler_defs: dict[str, list[cst.Call]] = {}
        self.no_sync_used = False
        self._read()

    def _is(self, path: Optional[str], role: str, func) -> bool:
        try:
            return bool(path) and self.roles.is_(path, role, func)
        except Exception:
            return False

    def _read(self) -> None:
        t = self.t
        q_of = t.qualname
        for name, assigns in t.assignments.items():
            for a in assigns:
                v = a.value
                if type(v) is not cst.Call:
                    continue
                q = q_of(v.func) or ""
                if q.startswith("torch.") and (q.endswith("DistributedDataParallel") or q == "torch.nn.parallel.DDP"):
                    self.ddp_wrapped.add(name)  # (torch's DDP only: see ddp_calls)
                    continue
                if _SCHED_Q.match(q):
                    self.scheduler_defs.setdefault(name, []).append(v)
                elif q.endswith("GradScaler") and q.startswith(("torch.", "apex")):
                    self.scaler_defs.setdefault(name, []).append(v)
        for names, call, func in t.unpacks:
            if not (call_name(call) or "").endswith(".prepare") or not isinstance(call.func, cst.Attribute):
                continue
            if not self._is(dotted(call.func.value), "accelerator", func):
                continue
            self.prepare_funcs.append(func)
            npos = sum(1 for a in call.args if a.keyword is None and not a.star)
            self.prepared.update(n for n in names[:npos] if n)
        for call, name, func in t.calls:
            q = q_of(call.func) or ""
            if q in _ACCELERATOR:
                self.accelerator_calls.append(call)
            elif q.endswith("DistributedDataParallel") and q.startswith("torch."):
                # torch's DDP only: apex.parallel.DistributedDataParallel has no ``no_sync()`` (its switch is
                # ``disable_allreduce()``) and syncs on its own terms; an unresolved class is not known to be DDP
                self.ddp_calls.append(call)
            elif q in _LIGHTNING_TRAINER or (q.endswith(".Trainer") and q.startswith(("lightning", "pytorch_lightning"))):
                self.lightning_trainer_calls.append(call)
            elif q.endswith("DeepSpeedPlugin") and q.startswith("accelerate"):
                self.accelerator_deepspeed = call
            if name.endswith(".no_sync") or name.endswith("no_backward_sync"):
                self.no_sync_used = True
        for call in self.accelerator_calls:
            self._read_accelerator(call)
        for name, assigns in t.assignments.items():
            head, _, attr = name.rpartition(".")
            if attr not in ("gradient_accumulation_steps", "gradient_state", "gradient_accumulation_plugin"):
                continue
            if not any(self._is(head, "accelerator", a.func) for a in assigns):
                continue
            if attr == "gradient_accumulation_steps":
                for a in assigns:
                    self.accelerator_ga = self.factor(a.value, "accelerator", a.func)
            else:
                self.accelerator_ga_unknown = True

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

    # ------------------------------------------------------------------ values
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
        if v == 1 and self.from_cli(expr, func, 0):
            return None
        return v

    def from_cli(self, expr: cst.BaseExpression, func, depth: int) -> bool:
        if depth > 4:
            return False
        for name in _names_in(expr):
            last = name.split(".")[-1]
            if "." in name and (last in self.t.argparse or self._cli_field(name, last, func)):
                return True
            for a in (self.t.assignments_of(name, func) or [])[:3]:
                if self.from_cli(a.value, a.func, depth + 1):
                    return True
        return False

    def _cli_field(self, name: str, last: str, func) -> bool:
        """``cfg.x`` reads a dataclass field the command line may set: not when ``cfg = Config()`` is the one
        binding of ``cfg`` (no ``x=`` passed), ``Config`` is this file's dataclass with that field, and ``Config`` is
        never handed to anything (a parser such as ``HfArgumentParser((Config,))`` / ``tyro.cli(Config)``, or a
        parameter annotation a CLI wrapper reads): its defaults are then the script's own values."""
        fields = self.t.dataclass_fields.get(last)
        if not fields:
            return False
        owner = name.rsplit(".", 1)[0]
        made = self.t.assignments_of(owner, func) or self.t.assignments_of(owner, None)
        if len(made) != 1 or not isinstance(made[0].value, cst.Call) or not isinstance(made[0].value.func, cst.Name):
            return True
        cls = made[0].value.func.value
        if cls not in self.t.classes or cls not in {c for c, _ in fields} or kwarg(made[0].value, last) is not None \
                or any(a.star for a in made[0].value.args):
            return True
        return self._passed_around(cls)

    def _passed_around(self, cls: str) -> bool:
        memo = self.__dict__.setdefault("_passed_memo", {})
        if cls not in memo:
            def mentions(e) -> bool:
                if isinstance(e, cst.Name):
                    return e.value == cls
                if isinstance(e, (cst.Tuple, cst.List)):
                    return any(mentions(el.value) for el in e.elements)
                return False

            hit = any(mentions(a.value) for call, _, _ in self.t.calls for a in call.args)
            if not hit:
                for defs in self.t.functions.values():
                    for fn in defs:
                        ps = fn.params
                        for p in list(ps.params) + list(ps.kwonly_params) + list(ps.posonly_params):
                            if p.annotation is not None and cls in (dotted(p.annotation.annotation) or ""):
                                hit = True
            memo[cls] = hit
        return memo[cls]

    def units_of(self, expr: Optional[cst.BaseExpression], func, accum_text: Optional[str] = None) -> str:
        return units_of(self.t, expr, func, accum_text)


_BATCH_DIVISOR = re.compile(r"(^|[._])(micro_|per_device_|train_)?batch(_size)?$", re.IGNORECASE)
_GLOBAL = re.compile(r"global|total|effective", re.IGNORECASE)
_MAX_STEPS = re.compile(r"\.\s*max_(train_)?steps")


def units_of(t, expr: Optional[cst.BaseExpression], func, accum_text: Optional[str] = None) -> str:
    """Units of a schedule length / step budget: ``optimizer-steps`` (divided by the accumulation factor somewhere
    along its definition), ``micro-batches`` (multiplied by it, or ``len(dl) * epochs`` with no division), or
    ``unknown`` (not visible, or divided and multiplied back).

    One walk of the definitions: N's side (a name met in a divisor carries its own definition's factors into the
    divisor: ``steps = len(data) / train_batch_size`` with ``train_batch_size = per_gpu * N`` is divided by N), and
    the definitions' roots kept for the fallbacks (``len(...)``, a division by the per-device batch size)."""
    if expr is None:
        return "unknown"

    def defs(name: str, f) -> list:
        return t.assignments_of(name, f) or t.assignments.get(name, [])

    # Names N is computed *from*, as a numerator: ``N = batch_size // micro_batch_size`` makes ``batch_size`` a
    # multiple of N (the global batch), so ``len(data) // batch_size`` already counts optimizer steps.
    n_sources: set = set()
    if accum_text:
        for a in defs(accum_text, func)[:4]:
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

    roots: list = [expr]  # the definitions met (for the fallbacks)
    seen_root: set = set()
    unresolved = False
    has_div = has_mul = False
    seen_pol: set = set()

    def follow(name: str, f, pol: Optional[int], depth: int) -> None:
        """The definitions of ``name``: walked with N's side ``pol`` (None: only kept as roots)."""
        nonlocal unresolved
        first = name not in seen_root
        seen_root.add(name)
        if pol is not None and (name, pol) in seen_pol:
            pol = None
        if pol is not None:
            seen_pol.add((name, pol))
        if not first and pol is None:
            return
        assigns = defs(name, f)
        if first and not assigns:
            head = name.split(".")[-1]
            if head in t.argparse or head in t.dataclass_fields:
                unresolved = True
            return
        keep = first and depth < 5
        if first and depth >= 5:
            unresolved = True
        for a in assigns[:4]:
            if keep:
                roots.append(a.value)
            visit(a.value, a.func, pol if depth < 6 else None, depth + 1, keep)

    def visit(e, f, pol: Optional[int], depth: int, keep: bool) -> None:
        nonlocal has_div, has_mul
        if pol is None and not keep:
            return
        tp = type(e)
        if pol is not None and tp is not cst.BinaryOperation and accumish(e):
            if pol > 0:
                has_mul = True
            else:
                has_div = True
            if not keep:
                return
            pol = None  # its definitions are still roots (the fallbacks read them), with no side
        if tp is cst.BinaryOperation:
            op = type(e.operator)
            visit(e.left, f, pol, depth, keep)
            visit(e.right, f, -pol if pol is not None and op in (cst.Divide, cst.FloorDivide) else pol, depth, keep)
            return
        if tp is cst.Name or tp is cst.Attribute:
            name = dotted(e)
            if name is not None:
                follow(name, f, pol, depth)
                return
        if tp is cst.Call:
            if keep:
                for name in _names_in(e.func):
                    follow(name, f, None, depth)
                for a in e.args:
                    if a.keyword is not None:
                        follow(a.keyword.value, f, None, depth)  # (as the names read in the call)
            for a in e.args:  # int(...), math.ceil(...), a helper's arguments: the same side
                visit(a.value, f, pol, depth, keep)
            return
        if tp is cst.UnaryOperation:
            visit(e.expression, f, pol, depth, keep)
            return
        if tp is cst.IfExp:
            visit(e.body, f, pol, depth, keep)
            visit(e.orelse, f, pol, depth, keep)
            if keep:
                for name in _names_in(e.test):
                    follow(name, f, None, depth)
            return
        if keep:
            for name in _names_in(e):
                follow(name, f, None, depth)

    visit(expr, func, 1, 0, True)
    if has_div and has_mul:
        return "unknown"  # divided and multiplied back somewhere along the way: do not guess
    if has_div:
        return "optimizer-steps"
    if has_mul:
        return "micro-batches"
    joined = "\n".join(code_of(root) for root in roots)
    if "len(" in joined and not unresolved and not _MAX_STEPS.search(joined):
        return "micro-batches"
    # a number of samples divided by the (per-device) batch size, never by N: micro-batches per rank
    # (``num_samples / args.batch_size / world_size``)
    for root in roots:
        for n in _walk(root):
            if type(n) is cst.BinaryOperation and type(n.operator) in (cst.Divide, cst.FloorDivide):
                d = dotted(n.right) or ""
                if _BATCH_DIVISOR.search(d) and not _GLOBAL.search(d):
                    return "micro-batches"
    return "unknown"
