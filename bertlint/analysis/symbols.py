"""Import table and static value resolution, shared by every rule and by ``explain``.

One cheap walk of the module collects: imports (local name -> qualified name), every assignment
``name = value`` with the function it lives in, argparse ``add_argument`` defaults, dataclass field
defaults, and literal dicts. ``resolve`` then evaluates the few expressions the rules need
(an accumulation factor, a batch size, a flag) without running anything.

``Resolver.fact(expr, func)`` is the value evaluator with sources (issue 14): it returns a :class:`Fact`
(value or UNKNOWN, where it came from, and whether the launch may override it) and keeps unknown unknown: a
function's parameter, an attribute of an object passed in, a name bound by a loop or updated in place, a
keyword not passed to a constructor are UNKNOWN with the reason as their source::

    r = ctx.resolver
    r.fact(expr, func)              # Fact(value, source, node, kind): kind literal | default | environment |
                                    # unset | unknown; fact.known, fact.definite, fact.describe(ctx) (adds the line)
    r.call_kwargs(call, func)       # {"gradient_accumulation_steps": Fact, ...} with ``**{...}`` / ``**kw`` read;
                                    # key "**" (an UNKNOWN Fact) when some ``**x`` could not be read
    r.call_args(call, func)         # a call of this file's own function bound to its parameters:
                                    # {"train": Fact(False, ...), "n": Fact(4, "default of n= in run_epoch()")}

It reads ``not`` / ``and`` / ``or`` / comparisons / ``x if c else y``, arithmetic, ``int()`` / ``max()`` /
``min()``, dict literals and ``dict(...)``, ``os.environ.get(k, d)`` / ``os.getenv``, argparse options
(``store_true`` / ``store_false`` / ``default`` / ``type`` / ``set_defaults``), HfArgumentParser dataclasses
(by their position in the parser's tuple), dataclass field defaults, plain config classes (``CFG.ACCUM``),
``obj.x`` where ``obj = Ctor(..., x=...)`` (also through ``self.x`` and aliases), ``**vars(args)``. One
exception to "a parameter is unknown": ``args.x`` where ``args`` is an args-like parameter (``args``, ``opt``,
``cfg``, ``*_args``) or every same-file call passes a ``parse_args()`` result, and this file defines the option:
its argparse default, kind "default". ``value`` / ``int_value`` keep their older, laxer contract.

No ScopeProvider / QualifiedNameProvider: they cost several times the parse.
"""

from __future__ import annotations

import ast
from bertlint._dataclass import dataclass, field
from typing import Any, Optional, Union

import libcst as cst

from bertlint.analysis.walk import walk


class _Unknown:
    _inst = None

    def __new__(cls):
        if cls._inst is None:
            cls._inst = super().__new__(cls)
        return cls._inst

    def __repr__(self) -> str:
        return "UNKNOWN"

    def __bool__(self) -> bool:
        return False


UNKNOWN: Any = _Unknown()

FuncNode = Union[cst.FunctionDef, None]


def dotted(expr: cst.BaseExpression) -> Optional[str]:
    """``a.b.c`` for Name/Attribute chains, else None."""
    # exact type tests: libcst nodes are ABCs, and isinstance through ABCMeta is the hot spot of the dry run here
    tp = type(expr)
    if tp is _Name:
        return expr.value
    parts = []
    while tp is _Attribute:
        parts.append(expr.attr.value)
        expr = expr.value
        tp = type(expr)
    if tp is _Name:
        parts.append(expr.value)
        return ".".join(reversed(parts))
    return None


_Name, _Attribute = cst.Name, cst.Attribute


def call_name(call: cst.Call) -> Optional[str]:
    return dotted(call.func)


def kwarg(call: cst.Call, name: str) -> Optional[cst.BaseExpression]:
    for a in call.args:
        if a.keyword is not None and a.keyword.value == name:
            return a.value
    return None


def positional(call: cst.Call, index: int) -> Optional[cst.BaseExpression]:
    i = 0
    for a in call.args:
        if a.keyword is None and not a.star:
            if i == index:
                return a.value
            i += 1
    return None


_EMPTY_MODULE = cst.Module(body=[])

try:  # libcst's code generation without its per-node ``contextmanager`` (which only positions use): same text
    from contextlib import nullcontext as _nullcontext

    from libcst._nodes.internal import CodegenState as _CodegenState

    _NO_POSITION = _nullcontext()

    class _CodeState(_CodegenState):
        __slots__ = ()

        def record_syntactic_position(self, node, *, start_node=None, end_node=None):  # type: ignore[override]
            return _NO_POSITION

    _INDENT, _NEWLINE = _EMPTY_MODULE.default_indent, _EMPTY_MODULE.default_newline

    def code_of(node: cst.CSTNode) -> str:
        """``Module([]).code_for_node(node)``: the node's source text (comments inside it included)."""
        state = _CodeState(default_indent=_INDENT, default_newline=_NEWLINE)
        node._codegen(state)
        return "".join(state.tokens)

except Exception:  # libcst's internals moved: its public way

    def code_of(node: cst.CSTNode) -> str:
        return _EMPTY_MODULE.code_for_node(node)


@dataclass
class Assignment:
    target: str  # a plain name, or a dotted attribute target such as "self.n"
    value: cst.BaseExpression
    func: FuncNode  # innermost enclosing function, None at module level
    node: cst.CSTNode
    seq: int = 0  # source order among the file's bindings (assignments and unpackings)


@dataclass
class ArgOption:
    dest: str
    default: Any  # resolved literal or UNKNOWN
    type_name: Optional[str]
    call: cst.Call


class SymbolTable(cst.CSTVisitor):
    """Built by one walk; read by everybody."""

    def __init__(self) -> None:
        super().__init__()
        self.imports: dict[str, str] = {}  # local name -> qualified name
        self.imported_modules: set[str] = set()  # top-level packages imported ("torch", "transformers")
        self.assignments: dict[str, list[Assignment]] = {}
        self.argparse: dict[str, ArgOption] = {}  # dest -> option
        self.dataclass_fields: dict[str, list[tuple[str, cst.BaseExpression]]] = {}  # field -> [(class, default)]
        self.classes: dict[str, cst.ClassDef] = {}
        self.functions: dict[str, list[cst.FunctionDef]] = {}  # name -> defs (methods too)
        self.class_bases: dict[str, list[str]] = {}
        self._func_stack: list[cst.FunctionDef] = []
        self._class_stack: list[cst.ClassDef] = []
        # structure for the training-loop analysis (bertlint/analysis/loops.py), collected in the same walk
        self.loop_nodes: list[tuple[cst.CSTNode, FuncNode, list]] = []  # (for/while, function, enclosing loops)
        self.unpacks: list[tuple[list, cst.Call, FuncNode]] = []  # ``a, b = f(...)`` (targets as dotted names)
        self.calls: list[tuple[cst.Call, str, FuncNode]] = []  # every call with a dotted name
        self.method_class: dict[int, cst.ClassDef] = {}  # id(FunctionDef) -> class, for direct methods
        self.class_methods: dict[str, dict[str, cst.FunctionDef]] = {}
        self.module_funcs: dict[str, list[cst.FunctionDef]] = {}  # module-level functions only
        self._scope: list[cst.CSTNode] = []
        self._loop_stack: list[list] = [[]]
        # for bertlint/analysis/roles.py, collected in the same walk
        self.scope_parent: dict[int, Optional[cst.CSTNode]] = {}  # id(def/class) -> enclosing def/class (None: module)
        self.returns: dict[int, list[cst.BaseExpression]] = {}  # id(FunctionDef) -> returned expressions
        self.stmt_calls: list[tuple[cst.Call, FuncNode]] = []  # calls that are a whole statement (``model.to(dev)``)
        self.defs: list[cst.CSTNode] = []  # every FunctionDef / ClassDef in pre-order
        self.backward_calls: list[tuple[cst.Call, FuncNode]] = []  # ``<anything>.backward(...)`` / ``manual_backward``
        self.backward_loops: dict[int, list] = {}  # id(backward call) -> enclosing for/while loops (outermost first)
        # for Resolver.fact: bindings that make a name's value not a single assignment
        self.aug_assigns: dict[str, list[tuple[cst.AugAssign, FuncNode]]] = {}  # ``x += 1``
        self.item_assigns: dict[str, list[tuple[cst.BaseExpression, cst.BaseExpression, FuncNode]]] = {}  # d[k] = v
        self.unpack_seq: dict[int, int] = {}  # id(call) of an unpacking -> its source order (Assignment.seq)
        self.class_attrs: dict[str, dict[str, cst.BaseExpression]] = {}  # class -> attribute -> value (class body)
        self.class_body_nodes: set[int] = set()  # id(Assign) of class-body assignments (not module-level names)
        self._seq = 0

    # ---- imports
    def visit_Import(self, node: cst.Import) -> None:
        for alias in node.names:
            full = dotted(alias.name) or ""
            self.imported_modules.add(full.split(".")[0])
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                self.imports[alias.asname.name.value] = full
            else:
                head = full.split(".")[0]
                self.imports[head] = head

    def visit_ImportFrom(self, node: cst.ImportFrom) -> None:
        if node.relative or node.module is None:
            mod = None
        else:
            mod = dotted(node.module)
        if mod:
            self.imported_modules.add(mod.split(".")[0])
        if isinstance(node.names, cst.ImportStar):
            return
        for alias in node.names:
            name = dotted(alias.name) or ""
            local = name
            if alias.asname is not None and isinstance(alias.asname.name, cst.Name):
                local = alias.asname.name.value
            self.imports[local] = f"{mod}.{name}" if mod else name

    # ---- scopes
    def visit_FunctionDef(self, node: cst.FunctionDef) -> None:
        self.functions.setdefault(node.name.value, []).append(node)
        parent = self._scope[-1] if self._scope else None
        self.scope_parent[id(node)] = parent
        self.defs.append(node)
        if isinstance(parent, cst.ClassDef):
            self.method_class[id(node)] = parent
            self.class_methods.setdefault(parent.name.value, {})[node.name.value] = node
        elif parent is None:
            self.module_funcs.setdefault(node.name.value, []).append(node)
        self._scope.append(node)
        self._loop_stack.append([])
        self._func_stack.append(node)

    def leave_FunctionDef(self, original_node: cst.FunctionDef) -> None:
        self._func_stack.pop()
        self._scope.pop()
        self._loop_stack.pop()

    def _loop(self, node: cst.CSTNode) -> None:
        self.loop_nodes.append((node, self._func_stack[-1] if self._func_stack else None, list(self._loop_stack[-1])))
        self._loop_stack[-1].append(node)

    def visit_For(self, node: cst.For) -> None:
        self._loop(node)

    def leave_For(self, original_node: cst.For) -> None:
        self._loop_stack[-1].pop()

    def visit_While(self, node: cst.While) -> None:
        self._loop(node)

    def leave_While(self, original_node: cst.While) -> None:
        self._loop_stack[-1].pop()

    def visit_ClassDef(self, node: cst.ClassDef) -> None:
        self.scope_parent[id(node)] = self._scope[-1] if self._scope else None
        self.defs.append(node)
        self.classes[node.name.value] = node
        self.class_methods.setdefault(node.name.value, {})
        self._scope.append(node)
        self.class_bases[node.name.value] = [d for d in (dotted(b.value) for b in node.bases) if d]
        self._class_stack.append(node)
        is_dc = any(
            (dotted(d.decorator.func) if isinstance(d.decorator, cst.Call) else dotted(d.decorator) or "").split(".")[-1]
            == "dataclass"
            for d in node.decorators
        )
        if is_dc:
            for stmt in node.body.body if isinstance(node.body, cst.IndentedBlock) else []:
                if isinstance(stmt, cst.SimpleStatementLine):
                    for small in stmt.body:
                        if isinstance(small, cst.AnnAssign) and isinstance(small.target, cst.Name) and small.value:
                            val = small.value
                            if isinstance(val, cst.Call) and (call_name(val) or "").split(".")[-1] == "field":
                                val = kwarg(val, "default") or val
                            self.dataclass_fields.setdefault(small.target.value, []).append((node.name.value, val))

    def leave_ClassDef(self, original_node: cst.ClassDef) -> None:
        self._class_stack.pop()
        self._scope.pop()

    # ---- assignments
    def _add(self, target: cst.BaseExpression, value: cst.BaseExpression, node: cst.CSTNode) -> None:
        func = self._func_stack[-1] if self._func_stack else None
        if isinstance(target, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)):
            if len(target.elements) == len(value.elements):
                for t, v in zip(target.elements, value.elements):
                    self._add(t.value, v.value, node)
            return
        name = dotted(target)
        if name:
            self._seq += 1
            self.assignments.setdefault(name, []).append(Assignment(name, value, func, node, self._seq))
        elif isinstance(target, cst.Subscript) and len(target.slice) == 1 and isinstance(target.slice[0].slice, cst.Index):
            owner = dotted(target.value)
            if owner:
                self.item_assigns.setdefault(owner, []).append((target.slice[0].slice.value, value, func))

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        name = dotted(node.target)
        if name:
            self.aug_assigns.setdefault(name, []).append((node, self._func_stack[-1] if self._func_stack else None))

    def _class_body(self, node: cst.CSTNode, target: cst.BaseExpression, value: Optional[cst.BaseExpression]) -> None:
        if self._scope and isinstance(self._scope[-1], cst.ClassDef) and value is not None:
            self.class_body_nodes.add(id(node))
            if isinstance(target, cst.Name):
                self.class_attrs.setdefault(self._scope[-1].name.value, {})[target.value] = value

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._class_body(node, t.target, node.value)
            self._add(t.target, node.value, node)
            if isinstance(t.target, (cst.Tuple, cst.List)) and isinstance(node.value, cst.Call):
                names = [None if isinstance(el, cst.StarredElement) else dotted(el.value) for el in t.target.elements]
                self._seq += 1
                self.unpack_seq[id(node.value)] = self._seq
                self.unpacks.append((names, node.value, self._func_stack[-1] if self._func_stack else None))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._class_body(node, node.target, node.value)
        if node.value is not None and not self._class_stack or (self._func_stack and node.value is not None):
            self._add(node.target, node.value, node)

    def visit_Return(self, node: cst.Return) -> None:
        if self._func_stack and node.value is not None:
            self.returns.setdefault(id(self._func_stack[-1]), []).append(node.value)

    def visit_Expr(self, node: cst.Expr) -> None:
        if isinstance(node.value, cst.Call):
            self.stmt_calls.append((node.value, self._func_stack[-1] if self._func_stack else None))

    def visit_Call(self, node: cst.Call) -> None:
        name = call_name(node)
        f = node.func
        if isinstance(f, cst.Attribute) and f.attr.value in ("backward", "manual_backward"):
            self.backward_calls.append((node, self._func_stack[-1] if self._func_stack else None))
            self.backward_loops[id(node)] = list(self._loop_stack[-1])
        if name:
            self.calls.append((node, name, self._func_stack[-1] if self._func_stack else None))
        if name and name.endswith("add_argument"):
            opts = [a.value for a in node.args if a.keyword is None]
            strings = [literal(o) for o in opts]
            strings = [s for s in strings if isinstance(s, str)]
            dest_expr = kwarg(node, "dest")
            dest = literal(dest_expr) if dest_expr is not None else None
            if not isinstance(dest, str):
                longs = [s for s in strings if s.startswith("--")]
                pick = longs[0] if longs else (strings[0] if strings else None)
                dest = pick.lstrip("-").replace("-", "_") if pick else None
            if dest:
                d = kwarg(node, "default")
                default: Any = literal(d) if d is not None else None
                action = literal(kwarg(node, "action")) if kwarg(node, "action") is not None else None
                if d is None and action == "store_true":
                    default = False
                elif d is None and action == "store_false":
                    default = True
                t = kwarg(node, "type")
                self.argparse[dest] = ArgOption(dest, default, dotted(t) if t is not None else None, node)

    # ---- queries
    def qualname(self, expr: cst.BaseExpression) -> Optional[str]:
        """Resolve a Name/Attribute chain through the import table: ``nn.Linear`` -> ``torch.nn.Linear``.
        Returns None when the head is not an imported name."""
        d = dotted(expr)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        q = self.imports.get(head)
        if q is None:
            return None
        return f"{q}.{rest}" if rest else q

    def uses(self, package: str) -> bool:
        return package in self.imported_modules

    def assignments_of(self, name: str, func: FuncNode = None) -> list[Assignment]:
        """Assignments visible from ``func``: those in the function itself if any, else module-level ones."""
        all_ = self.assignments.get(name, [])
        if func is not None:
            local = [a for a in all_ if a.func is func]
            if local:
                return local
        mod = [a for a in all_ if a.func is None]
        return mod if mod else (all_ if func is None else [])


_LITERAL_TYPES = frozenset({cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString})


def literal(expr: Optional[cst.BaseExpression]) -> Any:
    """A Python literal for literal expressions, else UNKNOWN."""
    if expr is None:
        return UNKNOWN
    tp = type(expr)
    if tp is cst.Integer:
        try:
            return int(expr.value, 0)  # 0x10, 1_000 (an old-style 010 is not Python 3: literal_eval below says so)
        except ValueError:
            pass
    elif tp is cst.Float:
        try:
            return float(expr.value)
        except ValueError:
            pass
    # exact type tests (these libcst classes have no subclasses): isinstance through ABCMeta is slow
    if tp in _LITERAL_TYPES:
        try:
            return ast.literal_eval(expr.value if tp is cst.SimpleString else code_of(expr))
        except Exception:
            return UNKNOWN
    if tp is cst.Name and expr.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expr.value]
    if tp is cst.UnaryOperation and type(expr.operator) is cst.Minus:
        v = literal(expr.expression)
        return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else UNKNOWN
    return UNKNOWN


class Resolver:
    """Evaluate expressions statically. Anything uncertain is UNKNOWN; never a guess."""

    def __init__(self, table: SymbolTable) -> None:
        self.t = table

    def value(self, expr: Optional[cst.BaseExpression], func: FuncNode = None, _depth: int = 0) -> Any:
        if _depth == 0 and self.__dict__.get("_vbudget") is None:
            # one top-level question gets a step budget: names assigned from each other can branch exponentially
            self._vbudget = 20000
            try:
                return self.value(expr, func, -1)
            finally:
                self._vbudget = None
        if _depth < 0:
            _depth = 0
        if expr is None or _depth > 12:
            return UNKNOWN
        vb = self.__dict__.get("_vbudget")
        if vb is not None:
            if vb <= 0:
                return UNKNOWN
            self._vbudget = vb - 1
        lit = literal(expr)
        if lit is not UNKNOWN:
            return lit
        d = _depth + 1
        tp = type(expr)  # exact type tests: isinstance through ABCMeta is slow
        if tp is cst.Name:
            return self._name(expr.value, func, d)
        if tp is cst.Attribute:
            name = dotted(expr)
            if name is None:
                return UNKNOWN
            if name in self.t.assignments:
                return self._name(name, func, d)
            attr = expr.attr.value
            # obj.x where obj = Ctor(..., x=value) (TrainingArguments(...), a config dataclass instance, ...)
            if isinstance(expr.value, (cst.Name, cst.Attribute)):
                owner = dotted(expr.value)
                made = self.t.assignments_of(owner, func) if owner else []
                if len(made) == 1 and isinstance(made[0].value, cst.Call):
                    kw = kwarg(made[0].value, attr)
                    if kw is not None:
                        return self.value(kw, made[0].func, d)
                if owner:
                    # ``CFG.accum_steps`` / ``cfg.accum_steps`` (``cfg = CFG()``): a class-body assignment of this
                    # file (a notebook's plain config class), as ``fact()`` reads it
                    ca = self._class_attr_fact(owner, attr, func, d)
                    if ca is not None:
                        return ca.value if ca.known else UNKNOWN
            # args.x from argparse / HfArgumentParser dataclasses / ClassName.attr
            if attr in self.t.argparse:
                return self.t.argparse[attr].default
            fields = self.t.dataclass_fields.get(attr)
            if fields:
                vals = {repr(self.value(v, None, d)) for _, v in fields}
                if len(vals) == 1:
                    return self.value(fields[0][1], None, d)
            return UNKNOWN
        if tp is cst.Subscript and len(expr.slice) == 1:
            el = expr.slice[0].slice
            if type(el) is cst.Index:
                key = self.value(el.value, func, d)
                container = self.value(expr.value, func, d)
                if isinstance(container, dict) and isinstance(key, str) and key in container:
                    return container[key]
            return UNKNOWN
        if isinstance(expr, cst.Dict):
            out = {}
            for el in expr.elements:
                if isinstance(el, cst.DictElement):
                    k = self.value(el.key, func, d)
                    if not isinstance(k, (str, int)):
                        return UNKNOWN
                    out[k] = self.value(el.value, func, d)
                else:  # **other
                    other = self.value(el.value, func, d)
                    if not isinstance(other, dict):
                        return UNKNOWN
                    out.update(other)
            return out
        if isinstance(expr, (cst.List, cst.Tuple)):
            items = [self.value(e.value, func, d) for e in expr.elements]
            return items if isinstance(expr, cst.List) else tuple(items)
        if isinstance(expr, cst.BinaryOperation):
            a = self.value(expr.left, func, d)
            b = self.value(expr.right, func, d)
            if not _num(a) or not _num(b):
                return UNKNOWN
            op = type(expr.operator).__name__
            try:
                return {
                    "Add": lambda: a + b,
                    "Subtract": lambda: a - b,
                    "Multiply": lambda: a * b,
                    "Divide": lambda: a / b,
                    "FloorDivide": lambda: a // b,
                    "Modulo": lambda: a % b,
                    "Power": lambda: a**b if abs(b) < 64 else UNKNOWN,
                }.get(op, lambda: UNKNOWN)()
            except Exception:
                return UNKNOWN
        if isinstance(expr, cst.Call):
            name = call_name(expr) or ""
            if name in ("int", "float") and expr.args:
                v = self.value(expr.args[0].value, func, d)
                try:
                    return int(v) if name == "int" else float(v)
                except Exception:
                    return UNKNOWN
            if name == "dict":
                out = {}
                for a in expr.args:
                    if a.keyword is None:
                        return UNKNOWN
                    out[a.keyword.value] = self.value(a.value, func, d)
                return out
            if name.endswith(".get") and isinstance(expr.func, cst.Attribute):
                container = self.value(expr.func.value, func, d)
                key = self.value(positional(expr, 0), func, d)
                if isinstance(container, dict) and isinstance(key, str):
                    if key in container:
                        return container[key]
                    dflt = positional(expr, 1)
                    return self.value(dflt, func, d) if dflt is not None else None
            return UNKNOWN
        return UNKNOWN

    def _name(self, name: str, func: FuncNode, d: int) -> Any:
        assigns = self.t.assignments_of(name, func)
        if not assigns:
            return UNKNOWN
        vals = [self.value(a.value, a.func, d) for a in assigns]
        first = vals[0]
        if first is UNKNOWN:
            return UNKNOWN
        for v in vals[1:]:
            if v is UNKNOWN or v != first:
                return UNKNOWN
        return first

    # ------------------------------------------------------------------ facts: a value with where it came from
    def fact(self, expr: Optional[cst.BaseExpression], func: FuncNode = None) -> "Fact":
        """The value of ``expr`` read in ``func`` with its source (see :class:`Fact`). Unlike ``value``, a
        parameter of a function, or an attribute of an object passed in, is UNKNOWN (never a default): only
        the file's own argparse / dataclass definitions give ``args.x`` a (launch-overridable) default."""
        top = self.__dict__.get("_budget") is None
        if top:
            self._budget = 4000  # evaluation steps for one top-level question (aliases can branch)
        try:
            return self._fact(expr, func, 0)
        except RecursionError:
            return Fact(UNKNOWN, "unknown: too deep", expr, "unknown")
        finally:
            if top:
                self._budget = None

    def call_kwargs(self, call: cst.Call, func: FuncNode = None) -> dict[str, "Fact"]:
        """Each keyword of ``call`` with its Fact, those from ``**{...}`` / ``**kwargs_dict`` / ``**dict(...)``
        included (later ones win, as in Python). A ``**x`` that cannot be read adds the key ``"**"`` (an UNKNOWN
        Fact): any other keyword may then be set too."""
        out: dict[str, Fact] = {}
        for a in call.args:
            if a.keyword is not None:
                out[a.keyword.value] = self.fact(a.value, func)
            elif a.star == "**":
                items = self._dict_items(a.value, func, 0)
                if items is None:
                    out["**"] = Fact(UNKNOWN, f"unknown: `**{_short(a.value)}` could not be read", a.value, "unknown")
                else:
                    out.update(items)
        if "**" in out:
            out["**"] = out.pop("**")
        return out

    def call_args(self, call: cst.Call, func: FuncNode = None, fn: Optional[cst.FunctionDef] = None) -> dict[str, "Fact"]:
        """Bind a call of one of this file's functions to its parameters: ``{param: Fact}`` with the arguments'
        facts (read in ``func``), and for a parameter the call does not pass, its default (a literal default
        is definite at that call site: "default of train= in run_epoch()"); a parameter with neither, or one a
        ``*args`` / ``**kw`` may fill, is UNKNOWN. ``fn``: the callee (found by name among module-level
        functions, or ``self.method`` in the caller's class, when not given). Empty when the callee is unknown."""
        if fn is None:
            fn = self._callee_of(call, func)
        if fn is None:
            return {}
        p = fn.params
        positional_params = list(p.posonly_params) + list(p.params)
        offset = 0
        if positional_params and positional_params[0].name.value in ("self", "cls") and isinstance(call.func, cst.Attribute):
            offset = 1
        out: dict[str, Fact] = {}
        pos = [a for a in call.args if a.keyword is None]
        starred = any(a.star for a in call.args)
        kw = {a.keyword.value: a.value for a in call.args if a.keyword is not None}
        fname = fn.name.value
        for i, prm in enumerate(positional_params[offset:] + list(p.kwonly_params)):
            name = prm.name.value
            j = i if i < len(positional_params) - offset else None
            if j is not None and j < len(pos) and not any(a.star for a in pos[: j + 1]):
                out[name] = self.fact(pos[j].value, func)
            elif name in kw:
                out[name] = self.fact(kw[name], func)
            elif starred:
                out[name] = Fact(UNKNOWN, f"unknown: `{name}` may come from a `*`/`**` argument", call, "unknown")
            elif prm.default is not None:
                f = self.fact(prm.default, None)
                out[name] = Fact(f.value, f"default of {name}= in {fname}()" +
                                 ("" if f.source.startswith("literal") else f" ({f.source})"), prm.default, f.kind)
            else:
                out[name] = Fact(UNKNOWN, f"unknown: `{name}` is not passed", call, "unknown")
        return out

    def _callee_of(self, call: cst.Call, func: FuncNode) -> Optional[cst.FunctionDef]:
        f = call.func
        if isinstance(f, cst.Name):
            defs = getattr(self.t, "module_funcs", {}).get(f.value, [])
            return defs[0] if len(defs) == 1 else None
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self":
            cls = self._class_of(func)
            if cls is not None:
                return self.t.class_methods.get(cls.name.value, {}).get(f.attr.value)
        return None

    def _dict_items(self, expr: cst.BaseExpression, func: FuncNode, d: int) -> Optional[dict[str, "Fact"]]:
        """Per-key facts of a dict expression: a dict literal, ``dict(a=...)``, a name holding one."""
        if d > 8:
            return None
        if isinstance(expr, cst.Dict):
            out: dict[str, Fact] = {}
            for el in expr.elements:
                if isinstance(el, cst.DictElement):
                    k = literal(el.key)
                    if not isinstance(k, str):
                        return None
                    f = self._fact(el.value, func, d + 1)
                    out[k] = Fact(f.value, f"dict literal key {k!r}" + ("" if f.kind == "literal" else f" ({f.source})"),
                                  f.node if f.kind != "literal" else el.value, f.kind)
                else:
                    sub = self._dict_items(el.value, func, d + 1)
                    if sub is None:
                        # the keys so far may be overridden by what ``**x`` holds; later keys are certain
                        why = f"unknown: may be overridden by `**{_short(el.value)}`"
                        out = {k: Fact(UNKNOWN, why, el.value, "unknown") for k in out}
                        out["**"] = Fact(UNKNOWN, f"unknown: `**{_short(el.value)}` could not be read", el.value,
                                         "unknown")
                    else:
                        out.update(sub)
            return out
        if isinstance(expr, cst.Call) and (call_name(expr) or "") == "dict":
            out = {}
            for a in expr.args:
                if a.keyword is not None:
                    f = self._fact(a.value, func, d + 1)
                    out[a.keyword.value] = Fact(f.value, f"dict(...) key {a.keyword.value!r}" +
                                                ("" if f.kind == "literal" else f" ({f.source})"), f.node or a.value, f.kind)
                elif a.star == "**" or a.star == "":
                    sub = self._dict_items(a.value, func, d + 1)
                    if sub is None:  # dict(a=1, **kw): kw cannot repeat ``a``, so the explicit keys stay
                        out["**"] = Fact(UNKNOWN, f"unknown: `{a.star}{_short(a.value)}` could not be read", a.value,
                                         "unknown")
                    else:
                        out.update(sub)
            if "**" in out:
                out["**"] = out.pop("**")
            return out
        if isinstance(expr, cst.Call) and call_name(expr) == "vars" and len(expr.args) == 1 or (
            isinstance(expr, cst.Attribute) and expr.attr.value == "__dict__"
        ):
            # ``**vars(args)`` of this file's argparse namespace: every option with its default
            ns = expr.args[0].value if isinstance(expr, cst.Call) else expr.value  # type: ignore[union-attr]
            if self.t.argparse and self._is_namespace(ns, func):
                out = {}
                for dest in self.t.argparse:
                    f = self._cli_fact(dest, ns, d + 1)
                    if f is not None:
                        out[dest] = f
                return out
            return None
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
            # ``**make_data_module(...)``: a same-file function returning one dict literal (its keys are known,
            # its values are read in the function: a parameter there stays unknown)
            defs = getattr(self.t, "module_funcs", {}).get(expr.func.value, [])
            if len(defs) == 1:
                rets = getattr(self.t, "returns", {}).get(id(defs[0]), [])
                if len(rets) == 1:
                    return self._dict_items(rets[0], defs[0], d + 1)
            return None
        name = dotted(expr)
        if name is None:
            return None
        if self._param_owner(name, func):
            return None
        if name in self.t.aug_assigns:
            return None
        assigns = self.t.assignments_of(name, func)
        if len(assigns) != 1:
            return None
        items = self._dict_items(assigns[0].value, assigns[0].func, d + 1)
        if items is None:
            return None
        for key_expr, _v, _f in self.t.item_assigns.get(name, []):
            k = literal(key_expr)
            if not isinstance(k, str):
                return None
            items[k] = Fact(UNKNOWN, f"unknown: `{name}[{k!r}]` is assigned separately", key_expr, "unknown")
        for call, cname, _f in self.t.calls:
            if cname in (f"{name}.update", f"{name}.setdefault", f"{name}.pop"):
                return None
        return items

    def _param_owner(self, name: str, func: FuncNode) -> Optional[cst.FunctionDef]:
        """The function (``func`` or an enclosing one) whose parameter the head of ``name`` is, when the name is
        not re-bound in that function's body."""
        head = name.split(".")[0]
        f: Any = func
        parents = getattr(self.t, "scope_parent", {})
        while f is not None:
            if isinstance(f, cst.FunctionDef):
                for a in self.t.assignments.get(head, []):
                    if a.func is f:
                        return None
                if head in _param_names(f):
                    return f
            f = parents.get(id(f))
        return None

    def _fact(self, expr: Optional[cst.BaseExpression], func: FuncNode, d: int) -> "Fact":
        if expr is None:
            return Fact(UNKNOWN, "unknown: no expression", None, "unknown")
        b = self.__dict__.get("_budget")
        if b is not None:
            if b <= 0:
                return Fact(UNKNOWN, "unknown: too many steps", expr, "unknown")
            self._budget = b - 1
        if d > 14:
            return Fact(UNKNOWN, "unknown: too deep", expr, "unknown")
        lit = literal(expr)
        if lit is not UNKNOWN or (isinstance(expr, cst.Name) and expr.value == "None"):
            return Fact(lit, "literal", expr, "literal")
        d += 1
        if isinstance(expr, cst.Name):
            return self._fact_name(expr.value, expr, func, d)
        if isinstance(expr, cst.Attribute):
            return self._fact_attr(expr, func, d)
        if isinstance(expr, cst.UnaryOperation):
            f = self._fact(expr.expression, func, d)
            if not f.known:
                return f
            op = type(expr.operator).__name__
            try:
                v = {"Not": lambda x: not x, "Minus": lambda x: -x, "Plus": lambda x: +x,
                     "BitInvert": lambda x: ~x}[op](f.value)
            except Exception:
                return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
            return Fact(v, f.source, f.node, f.kind)
        if isinstance(expr, cst.BooleanOperation):
            left = self._fact(expr.left, func, d)
            is_and = isinstance(expr.operator, cst.And)
            if left.known:
                if is_and and not left.value or (not is_and and left.value):
                    return left
                right = self._fact(expr.right, func, d)
                return Fact(right.value, _join(left, right), right.node, _weakest(left, right)) if right.known else right
            return left
        if isinstance(expr, cst.Comparison):
            cur = self._fact(expr.left, func, d)
            facts = [cur]
            if not cur.known:
                return cur
            result = True
            lv = cur.value
            for t in expr.comparisons:
                rf = self._fact(t.comparator, func, d)
                if not rf.known:
                    return rf
                facts.append(rf)
                op = type(t.operator).__name__
                try:
                    ok = {"Equal": lambda a, b: a == b, "NotEqual": lambda a, b: a != b,
                          "LessThan": lambda a, b: a < b, "LessThanEqual": lambda a, b: a <= b,
                          "GreaterThan": lambda a, b: a > b, "GreaterThanEqual": lambda a, b: a >= b,
                          "Is": lambda a, b: a is b, "IsNot": lambda a, b: a is not b,
                          "In": lambda a, b: a in b, "NotIn": lambda a, b: a not in b}[op](lv, rf.value)
                except Exception:
                    return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
                result = result and bool(ok)
                lv = rf.value
            return Fact(result, _join(*facts), expr, _weakest(*facts))
        if isinstance(expr, cst.IfExp):
            test = self._fact(expr.test, func, d)
            if test.known:
                br = self._fact(expr.body if test.value else expr.orelse, func, d)
                return Fact(br.value, _join(test, br), br.node, _weakest(test, br)) if br.known else br
            a = self._fact(expr.body, func, d)
            b = self._fact(expr.orelse, func, d)
            if a.known and b.known and a.value == b.value and type(a.value) is type(b.value):
                return Fact(a.value, _join(a, b), a.node, _weakest(a, b))
            return Fact(UNKNOWN, f"unknown: depends on `{_short(expr.test)}` ({test.source})", expr, "unknown")
        if isinstance(expr, cst.BinaryOperation):
            a = self._fact(expr.left, func, d)
            if not a.known:
                return a
            b = self._fact(expr.right, func, d)
            if not b.known:
                return b
            op = type(expr.operator).__name__
            x, y = a.value, b.value
            try:
                if op == "Add" and isinstance(x, (str, list, tuple)) and type(x) is type(y):
                    v = x + y
                elif not _num(x) or not _num(y):
                    return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
                else:
                    v = {
                        "Add": lambda: x + y,
                        "Subtract": lambda: x - y,
                        "Multiply": lambda: x * y,
                        "Divide": lambda: x / y,
                        "FloorDivide": lambda: x // y,
                        "Modulo": lambda: x % y,
                        "Power": lambda: x**y if abs(y) < 64 else UNKNOWN,
                    }.get(op, lambda: UNKNOWN)()
            except Exception:
                v = UNKNOWN
            if v is UNKNOWN:
                return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
            kind = _weakest(a, b)
            return Fact(v, "computed" if kind == "literal" else f"computed from {_join(a, b)}", expr,
                        kind if kind != "literal" else "literal")
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
            el = expr.slice[0].slice
            base = self.t.qualname(expr.value) or dotted(expr.value) or ""
            if base in ("os.environ",):
                return Fact(UNKNOWN, f"environment: `{_short(expr)}`", expr, "unknown")
            if isinstance(el, cst.Index):
                kf = self._fact(el.value, func, d)
                if isinstance(kf.value, str):
                    items = self._dict_items(expr.value, func, d)
                    if items is not None and kf.value in items:
                        return items[kf.value]
                cf = self._fact(expr.value, func, d)
                if cf.known and kf.known:
                    try:
                        return Fact(cf.value[kf.value], _join(cf, kf), cf.node, _weakest(cf, kf))
                    except Exception:
                        pass
            return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
        if isinstance(expr, cst.Dict):
            items = self._dict_items(expr, func, d)
            if items is None or "**" in items:
                return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
            facts = [f for f in items.values() if f.known]
            return Fact({k: f.value for k, f in items.items()}, "dict literal", expr, _weakest(*facts) if facts else "literal")
        if isinstance(expr, (cst.List, cst.Tuple, cst.Set)):
            facts = []
            for el in expr.elements:
                if isinstance(el, cst.StarredElement):
                    return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
                f = self._fact(el.value, func, d)
                if not f.known:
                    return f
                facts.append(f)
            vals = [f.value for f in facts]
            try:
                v: Any = vals if isinstance(expr, cst.List) else tuple(vals) if isinstance(expr, cst.Tuple) else set(vals)
            except TypeError:
                return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
            kind = _weakest(*facts) if facts else "literal"
            return Fact(v, "literal" if kind == "literal" and all(f.source.startswith("literal") for f in facts)
                        else f"computed from {_join(*facts)}", expr, kind)
        if isinstance(expr, cst.Call):
            return self._fact_call(expr, func, d)
        return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")

    def _fact_call(self, expr: cst.Call, func: FuncNode, d: int) -> "Fact":
        name = call_name(expr) or ""
        q = self.t.qualname(expr.func) or name
        pos = [a.value for a in expr.args if a.keyword is None and not a.star]
        if name in ("int", "float", "bool", "str", "abs", "round") and len(pos) == 1 and len(expr.args) == 1:
            f = self._fact(pos[0], func, d)
            if not f.known:
                return f
            try:
                fn = {"int": int, "float": float, "bool": bool, "str": str, "abs": abs, "round": round}[name]
                return Fact(fn(f.value), f.source, f.node, f.kind)
            except Exception:
                return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
        if name in ("max", "min") and len(pos) >= 2 and len(pos) == len(expr.args):
            facts = [self._fact(p, func, d) for p in pos]
            for f in facts:
                if not f.known:
                    return f
            try:
                v = (max if name == "max" else min)(f.value for f in facts)
            except Exception:
                return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
            kind = _weakest(*facts)
            return Fact(v, "computed" if kind == "literal" else f"computed from {_join(*facts)}", expr, kind)
        if q in ("os.environ.get", "os.getenv") or name in ("os.environ.get", "os.getenv", "environ.get"):
            key = literal(pos[0]) if pos else UNKNOWN
            dflt = pos[1] if len(pos) > 1 else kwarg(expr, "default")
            if dflt is None:
                return Fact(UNKNOWN, f"environment: {key if isinstance(key, str) else '?'} (no default)", expr, "unknown")
            f = self._fact(dflt, func, d)
            if not f.known:
                return f
            return Fact(f.value, f"environment variable {key if isinstance(key, str) else '?'} (default {f.value!r})",
                        expr, "environment")
        if name == "getattr" and len(pos) >= 2:
            attr = literal(pos[1])
            owner = dotted(pos[0])
            if isinstance(attr, str) and owner:
                got = self._fact_attr(cst.Attribute(value=pos[0], attr=cst.Name(attr)), func, d) if attr.isidentifier() \
                    else Fact(UNKNOWN, "unknown", expr, "unknown")
                if got.known or len(pos) < 3:
                    return got
                if got.source.startswith("unknown: no"):
                    return self._fact(pos[2], func, d)
                return got
        if name == "dict" or isinstance(expr.func, cst.Attribute) and expr.func.attr.value == "get":
            if name == "dict":
                items = self._dict_items(expr, func, d)
                if items is None or "**" in items:
                    return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
                vals = {k: f.value for k, f in items.items()}
                facts = [f for f in items.values() if f.known]
                return Fact(vals, "dict(...)", expr, _weakest(*facts) if facts else "literal")
            items = self._dict_items(expr.func.value, func, d)  # type: ignore[union-attr]
            key = self._fact(pos[0], func, d) if pos else None
            if items is not None and key is not None and isinstance(key.value, str):
                if key.value in items:
                    return items[key.value]
                if "**" in items:
                    return items["**"]
                dflt = pos[1] if len(pos) > 1 else None
                if dflt is None:
                    return Fact(None, f"`.get({key.value!r})` of a dict without that key", expr, "literal")
                return self._fact(dflt, func, d)
            return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
        # a same-file function without parameters that returns one value
        if isinstance(expr.func, cst.Name) and not expr.args:
            defs = getattr(self.t, "module_funcs", {}).get(expr.func.value, [])
            if len(defs) == 1 and not _param_names(defs[0]):
                rets = getattr(self.t, "returns", {}).get(id(defs[0]), [])
                if len(rets) == 1:
                    f = self._fact(rets[0], defs[0], d)
                    if f.known:
                        return Fact(f.value, f"returned by {expr.func.value}() ({f.source})", f.node, f.kind)
        return Fact(UNKNOWN, f"unknown: result of `{_short(expr.func)}(...)`", expr, "unknown")

    def _fact_name(self, name: str, node: cst.CSTNode, func: FuncNode, d: int) -> "Fact":
        owner = self._param_owner(name, func)
        if owner is not None:
            return Fact(UNKNOWN, f"unknown: parameter of {owner.name.value}()", node, "unknown")
        if name in self.t.aug_assigns or name in self._mutated():
            return Fact(UNKNOWN, f"unknown: `{name}` is updated in place", node, "unknown")
        if self._rebound(name, func):
            return Fact(UNKNOWN, f"unknown: `{name}` is bound by a loop or an unpacking", node, "unknown")
        busy = self.__dict__.setdefault("_name_busy", set())
        bkey = (name, id(func))
        if bkey in busy:
            return Fact(UNKNOWN, f"unknown: `{name}` depends on itself", node, "unknown")
        busy.add(bkey)
        try:
            return self._fact_name_assigns(name, node, func, d)
        finally:
            busy.discard(bkey)

    def _fact_name_assigns(self, name: str, node: cst.CSTNode, func: FuncNode, d: int) -> "Fact":
        assigns = self._visible_assigns(name, func)
        if not assigns:
            if name in self.t.imports:
                return Fact(UNKNOWN, f"unknown: imported from {self.t.imports[name]}", node, "unknown")
            return Fact(UNKNOWN, f"unknown: `{name}` is not assigned in this file", node, "unknown")
        facts = [self._fact(a.value, a.func, d) for a in assigns]
        first = facts[0]
        if not first.known:
            return first
        for f in facts[1:]:
            if not f.known:
                return f
            if f.value != first.value or type(f.value) is not type(first.value):
                return Fact(UNKNOWN, f"unknown: `{name}` is assigned different values", node, "unknown")
        if first.kind == "literal" and first.source == "literal":
            return Fact(first.value, f"literal (`{name} = {_short(assigns[0].value)}`)", assigns[0].value, "literal")
        return first

    def _mutated(self) -> set:
        """Names whose container is changed in place somewhere (``d[k] = v``, ``xs.append(v)``, ``d.update(...)``)."""
        m = self.__dict__.get("_mutated_names")
        if m is None:
            m = set(getattr(self.t, "item_assigns", {}))
            for _call, cname, _f in self.t.calls:
                owner, _, meth = cname.rpartition(".")
                if owner and meth in _MUTATORS:
                    m.add(owner)
            self._mutated_names = m
        return m

    def _visible_assigns(self, name: str, func: FuncNode) -> list:
        """Assignments of ``name`` visible from ``func``: its own, then its enclosing functions', then the
        module's (a name assigned in some other function is not visible)."""
        all_ = self.t.assignments.get(name, [])
        f: Any = func
        parents = getattr(self.t, "scope_parent", {})
        while f is not None:
            if isinstance(f, cst.FunctionDef):
                local = [a for a in all_ if a.func is f]
                if local:
                    return local
            f = parents.get(id(f))
        if "." in name and name.split(".")[0] in ("self", "cls"):
            # attributes: every method's assignment of self.x counts
            cls = self._class_of(func)
            return [a for a in all_ if a.func is not None and self._class_of(a.func) is cls] if cls is not None else []
        body = getattr(self.t, "class_body_nodes", ())
        return [a for a in all_ if a.func is None and id(a.node) not in body]

    def _class_of(self, func: Any) -> Optional[cst.ClassDef]:
        parents = getattr(self.t, "scope_parent", {})
        f = func
        while f is not None:
            if isinstance(f, cst.ClassDef):
                return f
            f = parents.get(id(f))
        return None

    def _rebound(self, name: str, func: FuncNode) -> bool:
        memo = self.__dict__.setdefault("_rebound_memo", None)
        if memo is None:
            memo = set()
            for names, _call, f in self.t.unpacks:
                for n in names:
                    if n:
                        memo.add((n, id(f) if f is not None else 0))
            for node, f, _ in self.t.loop_nodes:
                if isinstance(node, cst.For):
                    for n in _target_names(node.target):
                        memo.add((n, id(f) if f is not None else 0))
            self._rebound_memo = memo
        scope = func
        while scope is not None and not isinstance(scope, cst.FunctionDef):
            scope = getattr(self.t, "scope_parent", {}).get(id(scope))
        if (name, id(func) if func is not None else 0) in memo:
            return True
        return func is not None and not self._visible_local(name, func) and (name, 0) in memo

    def _visible_local(self, name: str, func: Any) -> bool:
        return any(a.func is func for a in self.t.assignments.get(name, []))

    def _fact_attr(self, expr: cst.Attribute, func: FuncNode, d: int) -> "Fact":
        name = dotted(expr)
        if name is None:
            return Fact(UNKNOWN, f"unknown: `{_short(expr)}`", expr, "unknown")
        attr = expr.attr.value
        owner = name.rsplit(".", 1)[0]
        busy = self.__dict__.setdefault("_fact_busy", set())
        own_assigns = self._visible_assigns(name, func) if name not in busy else []
        if own_assigns and (name in self.t.aug_assigns or name in self._mutated()):
            return Fact(UNKNOWN, f"unknown: `{name}` is updated in place", expr, "unknown")
        if own_assigns:
            busy.add(name)
            try:
                facts = [self._fact(a.value, a.func, d) for a in own_assigns]
            finally:
                busy.discard(name)
            if all(f.known for f in facts) and len({repr(f.value) for f in facts}) == 1:
                return facts[0]
            return next((f for f in facts if not f.known),
                        Fact(UNKNOWN, f"unknown: `{name}` is assigned different values", expr, "unknown"))
        cls_attr = self._class_attr_fact(owner, attr, func, d)
        if cls_attr is not None:
            return cls_attr
        hf = self._hf_dataclass_of(owner, func)
        if hf is not None:
            return self._hf_fact(hf, attr, expr, d)
        on_self = owner.split(".")[0] in ("self", "cls")
        if owner in ("self", "cls"):
            return Fact(UNKNOWN, f"unknown: `{name}` is not assigned in this class", expr, "unknown")
        pown = None if on_self else self._param_owner(owner, func)
        if pown is not None:
            if _ARGS_LIKE.match(owner.split(".")[-1]) or self._passed_cli(pown, owner):
                cli = self._cli_fact(attr, expr, d)
                if cli is not None:
                    return cli
            return Fact(UNKNOWN, f"unknown: attribute of `{owner}`, a parameter of {pown.name.value}()", expr, "unknown")
        made = self._visible_assigns(owner, func)
        if len(made) == 1 and isinstance(made[0].value, (cst.Name, cst.Attribute)) and dotted(made[0].value) != owner:
            # an alias (``self.accelerator = accelerator``, ``acc = self.accelerator``): read through it
            abusy = self.__dict__.setdefault("_alias_busy", set())
            akey = (owner, attr, id(func))
            if akey in abusy:
                return Fact(UNKNOWN, f"unknown: `{name}` depends on itself", expr, "unknown")
            abusy.add(akey)
            try:
                return self._fact_attr(cst.Attribute(value=made[0].value, attr=cst.Name(attr)), made[0].func, d + 1)
            finally:
                abusy.discard(akey)
        if on_self and not made:
            if _ARGS_LIKE.match(owner.split(".")[-1]):
                cli = self._cli_fact(attr, expr, d)
                if cli is not None:
                    return cli
            return Fact(UNKNOWN, f"unknown: `{owner}` is not assigned in this class", expr, "unknown")
        if not made:
            if any(owner in names for names, _c, _f in self.t.unpacks):
                for names, c, _f in self.t.unpacks:
                    if owner in names and ((call_name(c) or "").endswith("parse_known_args") or
                                           self._returns_namespace(c, names.index(owner))):
                        cli = self._cli_fact(attr, expr, d)
                        if cli is not None:
                            return cli
                return Fact(UNKNOWN, f"unknown: `{owner}` is bound by an unpacking", expr, "unknown")
            cli = self._cli_fact(attr, expr, d)
            if cli is not None:
                return cli
            return Fact(UNKNOWN, f"unknown: `{name}`", expr, "unknown")
        if len(made) == 1 and isinstance(made[0].value, cst.Call):
            ctor = made[0].value
            cname = call_name(ctor) or ""
            if cname.endswith(("parse_args", "parse_known_args")):
                cli = self._cli_fact(attr, expr, d)
                if cli is not None:
                    return cli
                return Fact(UNKNOWN, f"unknown: `{attr}` is not an option of this file's parser", expr, "unknown")
            last = cname.rpartition(".")[2]
            if not (last[:1].isupper() or cname in self.t.classes):
                # the result of a function call (``loss = criterion(...)``), not an object built from keywords
                return Fact(UNKNOWN, f"unknown: `{name}` of the result of `{_short(ctor.func)}(...)`", expr, "unknown")
            # obj.x where obj = Ctor(..., x=value)
            kws = self.call_kwargs(ctor, made[0].func)
            if attr in kws:
                k = kws[attr]
                if k.known and k.value is None:
                    # ``Accelerator(mixed_precision=None)``: None selects the library's default / the launch config
                    return Fact(UNKNOWN, f"unknown: `{attr}=None` is passed to `{_short(ctor.func)}(...)` ({k.source}): "
                                f"its default applies", ctor, "unset")
                return k
            if cname in self.t.classes:
                ff = self._field_default(cname, attr, d)
                if ff is not None:
                    return ff
            if "**" in kws:
                return kws["**"]
            return Fact(UNKNOWN, f"unknown: `{attr}` is not passed to `{_short(ctor.func)}(...)` (its default applies)",
                        ctor, "unset")
        return Fact(UNKNOWN, f"unknown: `{name}`", expr, "unknown")

    def _class_attr_fact(self, owner: str, attr: str, func, d: int) -> Optional["Fact"]:
        """``CFG.ACCUM`` / ``cfg.ACCUM`` (``cfg = CFG()``) / ``self.ACCUM``: a class-body assignment of this file
        (a plain config class), unless an instance attribute of that name is assigned somewhere."""
        attrs_of = getattr(self.t, "class_attrs", {})
        cls_name = None
        if owner in ("self", "cls"):
            c = self._class_of(func)
            cls_name = c.name.value if c is not None else None
        elif owner in self.t.classes and owner not in self.t.imports and not self._visible_assigns(owner, func):
            cls_name = owner
        elif "." not in owner and self._param_owner(owner, func) is None:
            made = self._visible_assigns(owner, func)
            if len(made) == 1 and isinstance(made[0].value, cst.Call) and isinstance(made[0].value.func, cst.Name):
                cn = made[0].value.func.value
                if cn in self.t.classes and cn not in self.t.imports and not made[0].value.args:
                    cls_name = cn
        seen = 0
        while cls_name and cls_name in self.t.classes and seen < 6:
            seen += 1
            v = attrs_of.get(cls_name, {}).get(attr)
            if v is not None:
                if any(a.target.endswith(f".{attr}") and a.func is not None for a in self.t.assignments.get(f"self.{attr}", [])):
                    return None  # an instance attribute of that name shadows it somewhere
                f = self._fact(v, None, d)
                if not f.known:
                    return f
                src = f"class attribute {cls_name}.{attr}" + ("" if f.source.startswith("literal") else f" ({f.source})")
                return Fact(f.value, src, v, f.kind)
            bases = [b for b in self.t.class_bases.get(cls_name, []) if b in self.t.classes]
            cls_name = bases[0] if bases else None
        return None

    def _is_namespace(self, e: cst.BaseExpression, func) -> bool:
        """``e`` holds this file's ``parse_args()`` result (a name bound to it, an args-like parameter)."""
        n = dotted(e)
        if not n or "." in n:
            return False
        if self._param_owner(n, func) is not None:
            return bool(_ARGS_LIKE.match(n))
        made = self._visible_assigns(n, func)
        if len(made) == 1 and isinstance(made[0].value, cst.Call):
            return (call_name(made[0].value) or "").endswith("parse_args")
        for names, c, _f in self.t.unpacks:
            if n in names and ((call_name(c) or "").endswith("parse_known_args") and names.index(n) == 0
                               or self._returns_namespace(c, names.index(n))):
                return True
        return False

    def _returns_namespace(self, call: cst.Call, index: int) -> bool:
        """``args, text = _parse_args()`` where the same-file function returns ``parser.parse_args(...)`` (or a
        name bound to it) at that position."""
        if not isinstance(call.func, cst.Name):
            return False
        defs = getattr(self.t, "module_funcs", {}).get(call.func.value, [])
        if len(defs) != 1:
            return False
        for r in getattr(self.t, "returns", {}).get(id(defs[0]), [])[:3]:
            el = r.elements[index].value if isinstance(r, cst.Tuple) and index < len(r.elements) else None
            if el is None:
                continue
            if isinstance(el, cst.Call) and (call_name(el) or "").endswith(("parse_args", "parse_known_args")):
                return True
            n = dotted(el)
            if n:
                for a in self.t.assignments.get(n, []):
                    if a.func is defs[0] and isinstance(a.value, cst.Call) and \
                            (call_name(a.value) or "").endswith(("parse_args", "parse_known_args")):
                        return True
        return False

    def _passed_cli(self, fn: cst.FunctionDef, owner: str) -> bool:
        """Every same-file call of ``fn`` passes a ``parse_args()`` result as ``owner``."""
        names = _param_names(fn)
        if owner not in names:
            return False
        i = names.index(owner)
        if fn.name.value not in getattr(self.t, "module_funcs", {}):
            return False
        seen = False
        for call, cname, f in self.t.calls:
            if cname != fn.name.value:
                continue
            arg = positional(call, i) or kwarg(call, owner)
            dn = dotted(arg) if arg is not None else None
            if not dn:
                return False
            made = self._visible_assigns(dn, f)
            ok = len(made) == 1 and isinstance(made[0].value, cst.Call) and (call_name(made[0].value) or "").endswith(
                ("parse_args", "parse_known_args"))
            if not ok:
                return False
            seen = True
        return seen

    def _hf_fact(self, cls: str, attr: str, expr, d: int) -> "Fact":
        ff = self._field_default(cls, attr, d)
        if ff is not None:
            return ff
        for b in self.t.class_bases.get(cls, []):
            ff = self._field_default(b, attr, d)
            if ff is not None:
                return ff
        return Fact(UNKNOWN, f"unknown: `{attr}` of {cls} (command line; the library's default)", expr, "unknown")

    def _cli_fact(self, attr: str, expr, d: int) -> Optional["Fact"]:
        """``args.attr`` from this file's argparse options or (unique) dataclass field defaults."""
        for call, cname, _f in self.t.calls:
            if cname.endswith(".set_defaults") and kwarg(call, attr) is not None:
                f = self._fact(kwarg(call, attr), None, d)
                if not f.known:
                    return Fact(UNKNOWN, f"unknown: `{cname}({attr}=...)` ({f.source})", call, "unknown")
                return Fact(f.value, f"argparse default of {attr} (`{cname}(...)`)", call, "default")
        if attr in self.t.argparse:
            opt = self.t.argparse[attr]
            flag = _flag_of(opt)
            action = literal(kwarg(opt.call, "action")) if kwarg(opt.call, "action") is not None else None
            dflt = kwarg(opt.call, "default")
            if dflt is None:
                if action in ("store_true", "store_false"):
                    return Fact(action == "store_false", f"argparse {action} {flag} (off unless passed)", opt.call, "default")
                if kwarg(opt.call, "required") is not None and literal(kwarg(opt.call, "required")) is True:
                    return Fact(UNKNOWN, f"unknown: required argparse option {flag}", opt.call, "unknown")
                return Fact(None, f"argparse default of {flag} (None)", opt.call, "default")
            f = self._fact(dflt, None, d)
            if not f.known:
                return Fact(UNKNOWN, f"unknown: argparse default of {flag} ({f.source})", opt.call, "unknown")
            v = f.value
            tname = opt.type_name
            if tname in ("int", "float") and isinstance(v, str):
                try:
                    v = int(v) if tname == "int" else float(v)
                except ValueError:
                    pass
            return Fact(v, f"argparse default of {flag}", opt.call, "default")
        fields = self.t.dataclass_fields.get(attr)
        if fields:
            facts = [self._fact(v, None, d) for _, v in fields]
            if all(f.known for f in facts) and len({repr(f.value) for f in facts}) == 1:
                return Fact(facts[0].value, f"dataclass field default ({fields[0][0]}.{attr})", fields[0][1], "default")
            return Fact(UNKNOWN, f"unknown: dataclass field `{attr}` has different defaults", expr, "unknown")
        return None

    def _field_default(self, cls: str, attr: str, d: int) -> Optional["Fact"]:
        for c, v in self.t.dataclass_fields.get(attr, []):
            if c == cls:
                f = self._fact(v, None, d)
                if not f.known:
                    return Fact(UNKNOWN, f"unknown: default of {cls}.{attr} ({f.source})", v, "unknown")
                return Fact(f.value, f"dataclass field default ({cls}.{attr})", v, "default")
        return None

    def _hf_dataclass_of(self, owner: str, func) -> Optional[str]:
        if "." in owner:
            return None
        for names, call, f in self.t.unpacks:
            if owner in names and (call_name(call) or "").endswith(
                    ("parse_args_into_dataclasses", "parse_json_file", "parse_yaml_file", "parse_dict")):
                idx = names.index(owner)
                return self._hf_parser_class(call, idx, f)
        for a in self._visible_assigns(owner, func):
            v = a.value
            if isinstance(v, cst.Subscript) and isinstance(v.value, cst.Call):
                i = literal(v.slice[0].slice.value) if isinstance(v.slice[0].slice, cst.Index) else None
                if isinstance(i, int) and (call_name(v.value) or "").endswith("parse_args_into_dataclasses"):
                    return self._hf_parser_class(v.value, i, a.func)
        return None

    def _hf_parser_class(self, call: cst.Call, idx: int, func) -> Optional[str]:
        recv = call.func.value if isinstance(call.func, cst.Attribute) else None
        pcall = recv if isinstance(recv, cst.Call) else None
        if pcall is None and recv is not None:
            rn = dotted(recv)
            made = self._visible_assigns(rn, func) if rn else []
            if len(made) == 1 and isinstance(made[0].value, cst.Call):
                pcall = made[0].value
        if pcall is None or not pcall.args:
            return None
        tup = pcall.args[0].value
        if isinstance(tup, (cst.Tuple, cst.List)):
            if idx < len(tup.elements):
                return dotted(tup.elements[idx].value)
            return None
        return dotted(tup) if idx == 0 else None

    def int_value(self, expr, func: FuncNode = None) -> Optional[int]:
        v = self.value(expr, func)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, float) and not v.is_integer():
            return None
        return int(v)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def build(module: cst.Module, reuse=None, filename: str = "") -> SymbolTable:
    """``reuse``: the language server's per-statement cache (``bertlint.stmtcache``): the tables of the top-level
    statements the last lint of ``filename`` had are taken from there and merged (the table one walk gives)."""
    if reuse is not None and type(module) is cst.Module:
        from bertlint.analysis.walk import children

        kids = children(module)
        if _mergeable() and len(kids) == len(module.body) and all(a is b for a, b in zip(kids, module.body)):
            return _merged(reuse.pieces("symbols", filename, module.body, _piece))
    t = SymbolTable()
    walk(module, t)
    return t


# Every attribute a SymbolTable has after __init__, each merged by ``_merged``: a table with another attribute (one
# added since) is built by one walk until ``_merged`` merges it too.
_MERGED_ATTRS = frozenset({
    "imports", "imported_modules", "assignments", "argparse", "dataclass_fields", "classes", "functions",
    "class_bases", "_func_stack", "_class_stack", "loop_nodes", "unpacks", "calls", "method_class", "class_methods",
    "module_funcs", "_scope", "_loop_stack", "scope_parent", "returns", "stmt_calls", "defs", "backward_calls",
    "backward_loops", "aug_assigns", "item_assigns", "unpack_seq", "class_attrs", "class_body_nodes", "_seq",
    "metadata",  # CSTVisitor's (empty: the walk runs no metadata providers)
})
_MERGEABLE: list = []


def _mergeable() -> bool:
    if not _MERGEABLE:
        _MERGEABLE.append(set(vars(SymbolTable())) == _MERGED_ATTRS)
    return _MERGEABLE[0]


class _Adds(dict):
    """A set's ``add`` that remembers the order of first additions (a piece's ``imported_modules``,
    ``class_body_nodes``): the merged set gets its elements in the order one walk adds them."""

    def add(self, x) -> None:
        self[x] = None


def _piece(stmt: cst.CSTNode) -> SymbolTable:
    """The table of one top-level statement alone. Every visit reads only the stacks of the statement it is in
    (function, class, scope, loop), which are empty again after each top-level statement, so the table of the
    whole module is the pieces' merged in order, binding numbers (``seq``) shifted by the bindings before."""
    t = SymbolTable()
    t.imported_modules = _Adds()  # type: ignore[assignment]
    t.class_body_nodes = _Adds()  # type: ignore[assignment]
    walk(stmt, t)
    return t


def _merged(pieces: list) -> SymbolTable:
    """One walk's table from the pieces (which stay as they are: lists, dicts and the records that analyses might
    change are new objects here)."""
    import copy

    t = SymbolTable()
    off = 0
    for p in pieces:
        t.imports.update(p.imports)
        for m in p.imported_modules:
            t.imported_modules.add(m)
        for k, v in p.assignments.items():
            t.assignments.setdefault(k, []).extend(
                Assignment(a.target, a.value, a.func, a.node, a.seq + off) for a in v)
        for k, o in p.argparse.items():
            d = o.default
            t.argparse[k] = ArgOption(o.dest, copy.deepcopy(d) if isinstance(d, (list, dict, set, tuple)) else d,
                                      o.type_name, o.call)
        for k, v in p.dataclass_fields.items():
            t.dataclass_fields.setdefault(k, []).extend(v)
        t.classes.update(p.classes)
        for k, v in p.functions.items():
            t.functions.setdefault(k, []).extend(v)
        for k, v in p.class_bases.items():
            t.class_bases[k] = list(v)
        t.loop_nodes.extend((n, f, list(o)) for n, f, o in p.loop_nodes)
        t.unpacks.extend((list(names), c, f) for names, c, f in p.unpacks)
        t.calls.extend(p.calls)
        t.method_class.update(p.method_class)
        for k, v in p.class_methods.items():
            t.class_methods.setdefault(k, {}).update(v)
        for k, v in p.module_funcs.items():
            t.module_funcs.setdefault(k, []).extend(v)
        t.scope_parent.update(p.scope_parent)
        for k, v in p.returns.items():
            t.returns.setdefault(k, []).extend(v)
        t.stmt_calls.extend(p.stmt_calls)
        t.defs.extend(p.defs)
        t.backward_calls.extend(p.backward_calls)
        for k, v in p.backward_loops.items():
            t.backward_loops[k] = list(v)
        for k, v in p.aug_assigns.items():
            t.aug_assigns.setdefault(k, []).extend(v)
        for k, v in p.item_assigns.items():
            t.item_assigns.setdefault(k, []).extend(v)
        for k, v in p.unpack_seq.items():
            t.unpack_seq[k] = v + off
        for k, v in p.class_attrs.items():
            t.class_attrs.setdefault(k, {}).update(v)
        for x in p.class_body_nodes:
            t.class_body_nodes.add(x)
        off += p._seq
    t._seq = off
    return t


@dataclass(frozen=True)
class Fact:
    """A value read statically, with where it came from.

    ``value``: the Python value, or UNKNOWN. ``source``: "literal", "literal (`N = 4`)", "argparse default of
    --grad-accum", "argparse store_true --fp16 (off unless passed)", "dataclass field default (Args.x)",
    "dict literal key 'x'", "environment variable GA (default 4)", "computed from ...", or
    "unknown: parameter of train()" / "unknown: ..." when UNKNOWN. ``kind``: "literal" (fixed in the code),
    "default" (an argparse / dataclass default: the command line may override it), "environment" (an
    environment variable's default), "unset" (UNKNOWN: the keyword is not passed to the constructor, so the
    library's default, or a launch configuration, applies; ``node`` is the constructor call), "unknown".
    ``node``: where the value is written (for a line number: ``fact.describe(ctx)``).

    Example::

        f = ctx.resolver.fact(call_kwarg_expr, func)
        if f.definite: ...                       # fixed in the code
        elif f.known: ...                        # a default the command line / environment may override
        else: f.source                           # "unknown: parameter of train()" -> stay silent or say so"""

    value: Any
    source: str
    node: Optional[cst.CSTNode] = field(default=None, repr=False, compare=False)
    kind: str = "literal"

    @property
    def known(self) -> bool:
        return self.value is not UNKNOWN

    @property
    def definite(self) -> bool:
        """Known and fixed in the code (not a default the launch may override)."""
        return self.known and self.kind == "literal"

    def describe(self, ctx: Any = None) -> str:
        """``source`` with the line of ``node`` when a FileContext is given: "argparse default of --x (line 40)"."""
        if ctx is None or self.node is None:
            return self.source
        try:
            line = ctx.span(self.node)[0].row
        except Exception:
            return self.source
        return f"{self.source} (line {line})"


_ARGS_LIKE = __import__("re").compile(
    r"^(args|arg|opt|opts|options|cfg|config|conf|hparams|hp|params|flags|FLAGS|argv|arguments|\w+_args|args_\w+|\w+_cfg|\w+_config)$"
)

_MUTATORS = frozenset({"append", "extend", "insert", "update", "setdefault", "pop", "popitem", "clear", "add",
                       "remove", "discard", "sort", "reverse"})

_KIND_ORDER = {"literal": 0, "default": 1, "environment": 2, "unset": 3, "unknown": 3}


def _weakest(*facts: "Fact") -> str:
    return max((f.kind for f in facts), key=lambda k: _KIND_ORDER.get(k, 3)) if facts else "literal"


def _join(*facts: "Fact") -> str:
    out: list[str] = []
    for f in facts:
        src = f.source[len("computed from "):] if f.source.startswith("computed from ") else f.source
        for part in src.split(" and ") if f.source.startswith("computed from ") else [src]:
            if part not in out and not part.startswith("literal") and part != "computed":
                out.append(part)
    return " and ".join(out) if out else "literal"


def _short(node: cst.CSTNode) -> str:
    s = code_of(node).strip()
    return s if len(s) <= 50 else s[:47] + "..."


def _param_names(fn: cst.FunctionDef) -> list[str]:
    p = fn.params
    out = [x.name.value for x in list(p.posonly_params) + list(p.params) + list(p.kwonly_params)]
    for star in (p.star_arg, p.star_kwarg):
        if isinstance(star, cst.Param):
            out.append(star.name.value)
    return out


def _target_names(t: cst.BaseExpression) -> list[str]:
    if isinstance(t, cst.Name):
        return [t.value]
    if isinstance(t, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in t.elements:
            out.extend(_target_names(el.value))
        return out
    return []


def _flag_of(opt: "ArgOption") -> str:
    for a in opt.call.args:
        if a.keyword is None:
            s = literal(a.value)
            if isinstance(s, str) and s.startswith("--"):
                return s
    for a in opt.call.args:
        if a.keyword is None:
            s = literal(a.value)
            if isinstance(s, str):
                return s
    return f"--{opt.dest}"
