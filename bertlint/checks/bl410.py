"""BL410 step-units: logging/eval/save/warmup/max steps computed from a data length (micro-batches) although the Trainer
counts them in optimizer steps (REFERENCE §1.5).

Two shapes of the same unit mix-up:

* ``TrainingArguments`` (keywords or a dict literal spread into it): a step field computed from a data length, through
  names and through a function of the file that returns it (``max_steps=cls.infer_max_steps(epochs, bs, ds)``), with
  no division by the accumulation; the accumulation known > 1, or configurable (a parameter / command-line value,
  then the message says "when N > 1").
* a hand-written loop whose optimizer step is gated once per window: a counter advanced with the step (it counts
  optimizer steps) compared with, or divided by, a length counted in micro-batches (a data size divided by the
  micro-batch size, or ``len(loader)``), which nothing divides by the accumulation.
"""

from __future__ import annotations

import libcst as cst

from bertlint.analysis.symbols import code_of
from bertlint.registry import rule
from bertlint.types import Severity

_STEP_ARGS = ("max_steps", "logging_steps", "eval_steps", "save_steps", "warmup_steps")


class _Names(cst.CSTVisitor):
    def __init__(self):
        self.names = []

    def visit_Name(self, node):
        self.names.append(node.value)


def _names_of(ctx, expr, func, depth=0, out=None) -> set:
    """Every name an expression uses, following assignments 3 levels deep."""
    out = set() if out is None else out
    if expr is None or depth >= 3:
        return out
    v = _Names()
    expr.visit(v)
    for name in v.names:
        if name in out:
            continue
        out.add(name)
        for a in ctx.symbols.assignments_of(name, func):
            _names_of(ctx, a.value, a.func, depth + 1, out)
    return out


def _expr_text(ctx, expr, func, depth=0, seen=None) -> str:
    """The expression's code followed by the code of every name it uses (3 levels deep), so that a divisor named
    elsewhere (``EFFECTIVE = BATCH * GRAD_ACC``; ``len(ds) // EFFECTIVE``) is seen."""
    seen = set() if seen is None else seen
    text = code_of(expr)
    if depth >= 3:
        return text
    v = _Names()
    expr.visit(v)
    for name in v.names:
        if name in seen:
            continue
        seen.add(name)
        for a in ctx.symbols.assignments_of(name, func):
            text += " " + _expr_text(ctx, a.value, a.func, depth + 1, seen)
    return text


def _callee(ctx, call: cst.Call):
    """The one function of this file a call runs (``f(...)``, ``self.f(...)``, ``cls.f(...)``), or None."""
    f = call.func
    name = None
    if isinstance(f, cst.Name):
        name = f.value
    elif isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value in ("self", "cls"):
        name = f.attr.value
    if name is None:
        return None
    defs = ctx.symbols.functions.get(name, [])
    return defs[0] if len(defs) == 1 else None


def _returns(fn) -> list:
    out = []

    class V(cst.CSTVisitor):
        def visit_FunctionDef(self, node):
            return node is fn

        def visit_Lambda(self, node):
            return False

        def visit_Return(self, node):
            if node.value is not None:
                out.append(node.value)

    fn.visit(V())
    return out


def _step_text(ctx, expr, func) -> str:
    """``_expr_text`` plus, for each call of a function of this file in the expression, the text of what it returns."""
    text = _expr_text(ctx, expr, func)
    calls = []

    class V(cst.CSTVisitor):
        def visit_Call(self, node):
            calls.append(node)

    expr.visit(V())
    for c in calls[:4]:
        fn = _callee(ctx, c)
        if fn is None or fn is func:
            continue
        for r in _returns(fn)[:4]:
            text += " " + _expr_text(ctx, r, fn)
    return text


def _param_default(ctx, expr, func):
    """For a name that is a parameter of ``func`` (not re-bound there): its literal default, else None."""
    if not isinstance(expr, cst.Name) or func is None:
        return None
    from bertlint.analysis.symbols import literal

    for p in list(func.params.params) + list(func.params.kwonly_params):
        if p.name.value == expr.value and p.default is not None:
            v = literal(p.default)
            return v if isinstance(v, int) and not isinstance(v, bool) else None
    return None


def _value_of(node):
    if isinstance(node, (cst.Arg, cst.DictElement)):
        return node.value
    if isinstance(node, cst.BaseExpression):  # a key of a dict spread into the constructor: its own expression
        return node
    return None


def _field_node(ta, name):
    """The keyword / dict entry / spread dict value that sets field ``name`` explicitly, or None."""
    node = ta.keyword_node(name)
    if isinstance(node, cst.Arg):
        return node if node.keyword is not None and node.keyword.value == name else None
    if isinstance(node, cst.DictElement):
        return node if isinstance(node.key, cst.SimpleString) and node.key.evaluated_value == name else None
    if isinstance(node, cst.BaseExpression):
        return node
    return None


@rule("BL410", "step-units", Severity.INFO,
      "logging/eval/save/warmup/max steps computed in micro-batches although they count optimizer steps")
def check(ctx) -> None:
    _trainer_args(ctx)
    _loops(ctx)


def _trainer_args(ctx) -> None:
    if "len(" not in ctx.source:
        return
    for ta in ctx.setup.training_args:
        n = ta.int("gradient_accumulation_steps")
        ga_node = _field_node(ta, "gradient_accumulation_steps")
        ga_expr = _value_of(ga_node)
        if n is not None and n <= 1:
            continue
        default = None
        if n is None:
            # configurable accumulation (a parameter, an argparse / dataclass value): the unit mix-up bites whenever
            # it is above 1; a literal or an unseen value stays silent
            if ga_expr is None or isinstance(ga_expr, (cst.Integer, cst.Float)):
                continue
            default = _param_default(ctx, ga_expr, ta.func)
            if default is not None and default <= 1:
                continue
        ga_text = code_of(ga_expr) if ga_expr is not None else None
        # names the accumulation is derived from, other than the per-device batch's own: a step count divided by
        # one of them (``GA = GLOBAL // MICRO``; ``len(ds) // GLOBAL``) counts optimizer steps already
        ga_names = _names_of(ctx, ga_expr, ta.func) if ga_expr is not None else set()
        bs_expr = _value_of(_field_node(ta, "per_device_train_batch_size"))
        if bs_expr is not None:
            ga_names -= _names_of(ctx, bs_expr, ta.func)
        for name in _STEP_ARGS:
            node = _field_node(ta, name)
            value = _value_of(node)
            if value is None:
                continue
            text = _step_text(ctx, value, ta.func)
            if "len(" not in text:
                continue
            if ga_names & _names_of(ctx, value, ta.func):
                continue
            low = text.lower()
            if "accum" in low or (ga_text and ga_text in text) or (n is not None and (
                    f"// {n}" in text or f"/ {n}" in text)):
                continue
            if isinstance(ta.get(name), float) and name == "warmup_steps" and ta.get(name) < 1:
                continue
            if n is not None:
                times = f"one per {n} micro-batches (gradient_accumulation_steps={n}) — so it is {n}× too large"
                div = f"`math.ceil(len(train_dataloader) / {n})`"
            else:
                dflt = f", default {default}" if default is not None else ""
                times = (f"one per `{ga_text}` micro-batches (gradient_accumulation_steps = `{ga_text}`{dflt}) — so "
                         f"it is `{ga_text}`× too large whenever the accumulation is above 1")
                div = f"`math.ceil(len(train_dataloader) / {ga_text})`"
            ctx.report(
                node,
                f"`{name}` is computed from a data length ({code_of(value).strip()}), which counts micro-batches, but "
                f"the Trainer counts `{name}` in optimizer steps — {times} (transformers Trainer: `state.global_step` "
                f"advances once per optimizer step). Fix: divide by gradient_accumulation_steps (e.g. {div}).",
            )


def _micro_names(ctx, loop, acc) -> set:
    """Names holding the micro-batch size: the denominator of the accumulation's definition (``N = B // b``)."""
    out = set()
    if acc is None or not acc.text:
        return out
    for a in ctx.symbols.assignments_of(acc.text, loop.func)[:2] or ctx.symbols.assignments.get(acc.text, [])[:2]:
        v = a.value
        if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, (cst.FloorDivide, cst.Divide)) and \
                isinstance(v.right, (cst.Name, cst.Attribute)):
            d = code_of(v.right).strip()
            out.add(d)
    return out


def _accum_names(ctx, loop, acc) -> set:
    """The accumulation's name and the names its definition is made of, the micro-batch's excepted (``B`` of
    ``N = B // b``: ``len(ds) // B`` counts windows)."""
    if acc is None or not acc.text:
        return set()
    out = {acc.text}
    for a in ctx.symbols.assignments_of(acc.text, loop.func)[:2] or ctx.symbols.assignments.get(acc.text, [])[:2]:
        v = _Names()
        a.value.visit(v)
        out.update(v.names)
    return out - _micro_names(ctx, loop, acc)


def _micro_batch_count(ctx, expr, func, micro: set, accum: set) -> bool:
    """``expr`` counts micro-batches: a data length (``len(...)``) or a size divided by the micro-batch size, with no
    accumulation name anywhere along its definition (followed through names, 3 levels)."""
    names = _names_of(ctx, expr, func)
    if names & accum or any("accum" in x.lower() for x in names):
        return False
    text = _expr_text(ctx, expr, func)
    if "len(" in text:
        return True
    for m in micro:
        if f"// {m}" in text or f"/ {m}" in text or f"//{m}" in text:
            return True
    return False


def _loops(ctx) -> None:
    """From the dry run: a hand counter that advances exactly on the micro-batches where the optimizer really steps
    (it counts optimizer steps), in a loop whose windows hold N > 1 backwards."""
    from bertlint.analysis import dryrun
    from bertlint.checks import _ga

    try:
        runs = list(dryrun.of(ctx))
    except Exception:  # noqa: BLE001 - the dry run is optional here
        return
    for run in runs:
        lp = run.loop
        tr = next((t for t in run.traces if _steps_per_window(t)), None)
        if tr is None:
            continue
        acc = _Acc(tr)
        micro = _micro_names(ctx, lp, acc)
        accum = _accum_names(ctx, lp, acc)
        seen = set()
        for name in _step_counters(tr):
            for node, other in _uses(ctx, lp.node, name):
                o = code_of(other).strip()
                if (name, o) in seen:
                    continue  # one report per counter and length (the warmup test and its division)
                if not _micro_batch_count(ctx, other, lp.func, micro, accum):
                    continue
                seen.add((name, o))
                ctx.report(
                    node,
                    f"`{code_of(node).strip()}` mixes units: `{name}` advances once per optimizer step (it is "
                    f"incremented with the step, which runs once per {_ga.n_shown_t(tr)} micro-batches), but `{o}` is "
                    f"counted in micro-batches ({_expr_text(ctx, other, lp.func)[:120].strip()}), so the schedule is "
                    f"{_ga.n_of(tr)}× too long in optimizer steps. Fix: divide `{o}` by the accumulation "
                    f"{_ga.n_shown_t(tr)}, or compare it with the micro-batch index.",
                )


class _Acc:
    """The accumulation factor as the dry run ran it (its text names the definition followed above)."""

    def __init__(self, tr) -> None:
        self.text = tr.n_text


def _steps_per_window(tr) -> bool:
    """A complete hand-written (plain / Fabric) run with N > 1 whose optimizer steps once per window: a
    window of N backwards closed by an effective step."""
    if not tr.complete or tr.owner not in ("plain", "fabric") or not tr.n or tr.n <= 1 or tr.n_source == "N = 1":
        return False
    wins = tr.window_structure()
    if not wins:
        return False
    return any(w.n_mbs == tr.n for w in wins)


def _step_counters(tr) -> list:
    """Plain names of hand counters (``step_count += 1``) advanced on exactly the micro-batches of the effective
    optimizer steps."""
    step_mbs = [e.mb for e in tr.effective_steps()]
    by: dict = {}
    for e in tr.of("counter"):
        if e.via == "hand" and e.target and "." not in e.target and e.certain:
            by.setdefault(e.target, []).append(e.mb)
    return [name for name, mbs in by.items() if mbs == step_mbs and len(mbs) < tr.micro_batches]


def _uses(ctx, loop_node, name: str):
    """(node, other side) for ``name <op> X`` comparisons and ``name / X`` / ``a * name / X`` divisions in the loop
    body (from the shared node index: no walk of its own)."""
    out = []
    idx = ctx.index
    order = (cst.LessThan, cst.LessThanEqual, cst.GreaterThan, cst.GreaterThanEqual)

    def is_name(e) -> bool:
        return isinstance(e, cst.Name) and e.value == name

    for node in idx.of(cst.Comparison):
        if len(node.comparisons) != 1 or not isinstance(node.comparisons[0].operator, order):
            continue
        left, right = node.left, node.comparisons[0].comparator
        if is_name(left):
            out.append((node, right))
        elif is_name(right):
            out.append((node, left))
    for node in idx.of(cst.BinaryOperation):
        if not isinstance(node.operator, cst.Divide):
            continue
        lhs = node.left
        if is_name(lhs) or (isinstance(lhs, cst.BinaryOperation) and isinstance(lhs.operator, cst.Multiply) and
                            (is_name(lhs.left) or is_name(lhs.right))):
            out.append((node, node.right))  # step / warmup, lr * step / warmup
    body = loop_node.body
    inside = [(n, o) for n, o in out if any(a is body for a in idx.ancestors(n))]
    return [(n, o) for n, o in inside if isinstance(o, (cst.Name, cst.Attribute, cst.BinaryOperation, cst.Call))]
