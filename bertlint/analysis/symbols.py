"""Import table and static value resolution, shared by every rule and by ``explain``.

One cheap walk of the module collects: imports (local name -> qualified name), every assignment
``name = value`` with the function it lives in, argparse ``add_argument`` defaults, dataclass field
defaults, and literal dicts. ``resolve`` then evaluates the few expressions the rules need
(an accumulation factor, a batch size, a flag) without running anything.

No ScopeProvider / QualifiedNameProvider: they cost several times the parse.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
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
    parts = []
    while isinstance(expr, cst.Attribute):
        parts.append(expr.attr.value)
        expr = expr.value
    if isinstance(expr, cst.Name):
        parts.append(expr.value)
        return ".".join(reversed(parts))
    return None


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


def code_of(node: cst.CSTNode) -> str:
    return _EMPTY_MODULE.code_for_node(node)


@dataclass
class Assignment:
    target: str  # a plain name, or a dotted attribute target such as "self.n"
    value: cst.BaseExpression
    func: FuncNode  # innermost enclosing function, None at module level
    node: cst.CSTNode


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
            self.assignments.setdefault(name, []).append(Assignment(name, value, func, node))

    def visit_Assign(self, node: cst.Assign) -> None:
        for t in node.targets:
            self._add(t.target, node.value, node)
            if isinstance(t.target, (cst.Tuple, cst.List)) and isinstance(node.value, cst.Call):
                names = [None if isinstance(el, cst.StarredElement) else dotted(el.value) for el in t.target.elements]
                self.unpacks.append((names, node.value, self._func_stack[-1] if self._func_stack else None))

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        if node.value is not None and not self._class_stack or (self._func_stack and node.value is not None):
            self._add(node.target, node.value, node)

    def visit_Call(self, node: cst.Call) -> None:
        name = call_name(node)
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


def literal(expr: Optional[cst.BaseExpression]) -> Any:
    """A Python literal for literal expressions, else UNKNOWN."""
    if expr is None:
        return UNKNOWN
    if isinstance(expr, (cst.Integer, cst.Float, cst.SimpleString, cst.ConcatenatedString)):
        try:
            return ast.literal_eval(code_of(expr))
        except Exception:
            return UNKNOWN
    if isinstance(expr, cst.Name) and expr.value in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[expr.value]
    if isinstance(expr, cst.UnaryOperation) and isinstance(expr.operator, cst.Minus):
        v = literal(expr.expression)
        return -v if isinstance(v, (int, float)) and not isinstance(v, bool) else UNKNOWN
    return UNKNOWN


class Resolver:
    """Evaluate expressions statically. Anything uncertain is UNKNOWN; never a guess."""

    def __init__(self, table: SymbolTable) -> None:
        self.t = table

    def value(self, expr: Optional[cst.BaseExpression], func: FuncNode = None, _depth: int = 0) -> Any:
        if expr is None or _depth > 12:
            return UNKNOWN
        lit = literal(expr)
        if lit is not UNKNOWN:
            return lit
        d = _depth + 1
        if isinstance(expr, cst.Name):
            return self._name(expr.value, func, d)
        if isinstance(expr, cst.Attribute):
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
            # args.x from argparse / HfArgumentParser dataclasses / ClassName.attr
            if attr in self.t.argparse:
                return self.t.argparse[attr].default
            fields = self.t.dataclass_fields.get(attr)
            if fields:
                vals = {repr(self.value(v, None, d)) for _, v in fields}
                if len(vals) == 1:
                    return self.value(fields[0][1], None, d)
            return UNKNOWN
        if isinstance(expr, cst.Subscript) and len(expr.slice) == 1:
            el = expr.slice[0].slice
            if isinstance(el, cst.Index):
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

    def int_value(self, expr, func: FuncNode = None) -> Optional[int]:
        v = self.value(expr, func)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        if isinstance(v, float) and not v.is_integer():
            return None
        return int(v)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def build(module: cst.Module) -> SymbolTable:
    t = SymbolTable()
    walk(module, t)
    return t
