"""The project's own sibling modules: what an import of the linted file refers to, read lazily and bounded.

A training script often keeps part of its loop in another file of the same project: ``from utils import
NativeScaler`` whose ``__call__`` runs the backward and the step, ``from engine import train_one_epoch``,
``train_util.prepare_accelerator(args)``. This module resolves such an import to a ``.py`` file of the project and
hands the analysis the function / class definitions there, so the dry run can inline them with their real
semantics.

Rules (never import or execute user code):

- **Where**: an absolute import (``from utils import x``, ``import train_utils as tu``, ``from pkg.mod import f``)
  is looked for in the linted file's directory, then its parents up to the project root (the nearest ancestor
  holding ``.git``, ``pyproject.toml``, ``setup.py`` or ``setup.cfg``; without one, the file's directory alone).
  A relative import (``from .train_utils import f``) is resolved from the file's package, never above the root.
  Nothing inside ``site-packages`` / ``dist-packages`` is read, and the top-level names of the frameworks the
  rules model (``torch``, ``transformers`` ...) are never looked for in the project.
- **When**: a module is read only when the analysis asks about a name it imports; its outline comes from ``ast``
  and a definition is parsed with libcst only when its body is needed; modules are cached per process, keyed by
  path, size and mtime.
- **Bounds**: at most ``MAX_HOPS`` imports away from the linted file, files up to ``MAX_BYTES``.
- **Unknown stays unknown**: a missing, unreadable, oversized or unparsable file gives None (the fact is
  unknown; no default replaces it).
- **Caches**: every sibling read is reported to ``bertlint.cache`` (``note_dependency``), so a cached result is
  invalidated when that file changes.

Where the analysis asks (each hook is a few lines in its module; nothing is read when the file imports no module
of the project):

- ``loops.FileLoops.callee``: an imported function, the ``__call__`` / method of an instance of an imported class
  (``loss_scaler(loss, opt)``, ``updater.step(loss, i)``; the instance from the file's assignments, or a
  parameter bound at the file's own call sites), a method inherited from a sibling's base class, and the calls
  made inside an inlined sibling function (resolved in that module). A sibling function holding its own training
  loop is not followed (its file reports it). The dry run uses the sibling's roles and qualified names in its
  frames, treats the sibling's globals as unknown, and reports at the linted file's call (``ctx.report`` names the
  other file and line).
- dry run facts: an Accelerator built by a sibling factory (its ``gradient_accumulation_steps``, parameters mapped
  to the caller's arguments), a model wrapped in ``DistributedDataParallel`` by a sibling factory (with the
  conditions it is wrapped under).
- ``roles``: what a sibling factory returns (``build_optimizer`` -> ``torch.optim.AdamW``), the family of a class
  whose base is in a sibling (a LightningModule / Trainer subclass).
- ``setup.project_class`` (Trainer / TrainingArguments classes of the project, read by setup.py itself) reports
  the files it reads as cache dependencies; ``bertlint.lsp.server`` re-lints an open file when a sibling its last
  lint read is saved (``reads``).

API::

    xp = project.of(ctx)                       # per linted file (cheap until something is resolved)
    t = xp.resolve("train_one_epoch")          # Target(kind="function"|"class"|"module", node, info) | None
    t = xp.resolve("tu.train_one_epoch")       # dotted through an imported module
    project.info_of(fn)                        # the ModuleInfo a foreign FunctionDef / ClassDef belongs to
    project.where(node)                        # "train_utils.py:42" for a node of a sibling module, else None
"""

from __future__ import annotations

import os
from typing import Optional

import libcst as cst

from bertlint import _parse
from bertlint.analysis.symbols import dotted

MAX_HOPS = 2
MAX_BYTES = 400_000
ROOT_MARKERS = (".git", "pyproject.toml", "setup.py", "setup.cfg")
_FRAMEWORKS = frozenset({
    "torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed", "numpy", "peft", "trl",
    "diffusers", "timm", "datasets", "evaluate", "bitsandbytes", "apex", "fairscale", "fairseq", "megatron",
    "tqdm", "wandb", "einops", "sklearn", "scipy", "tensorboard", "os", "sys", "math", "random", "time",
    "logging", "functools", "collections", "itertools", "typing", "dataclasses", "json", "re", "argparse",
})
_SKIP_DIRS = ("site-packages", "dist-packages")

# path -> (size, mtime_ns, ModuleInfo | None)
_MODULES: dict = {}
# id(def node) -> (node, ModuleInfo): the definitions of every parsed sibling (functions, classes, methods)
_DEFS: dict = {}
# id(call node) -> ModuleInfo: the calls of every parsed sibling (a callee is looked up where the call is)
_CALLS: dict = {}
_ROOTS: dict = {}
# linted path -> the sibling files its last lint read (the language server re-lints an open file when one of
# them is saved); _READING: the set of the lint under way
_READERS: dict = {}
_READING: Optional[set] = None
_PROJECTS: dict = {}  # id(module) -> (module, Project): the files being linted (the last few)


class Target:
    __slots__ = ("kind", "node", "info")

    def __init__(self, kind: str, node, info: "ModuleInfo") -> None:
        self.kind = kind  # "function" | "class" | "module"
        self.node = node  # FunctionDef | ClassDef | None (a module)
        self.info = info

    def __repr__(self) -> str:
        return f"Target({self.kind}, {getattr(getattr(self.node, 'name', None), 'value', '')} in {self.info.path})"


class ModuleInfo:
    """One sibling module. Its outline (top-level functions, classes and their bases, imports) comes from
    Python's own parser (``ast``, no code runs); a definition is parsed with libcst only when asked for, on its own
    source lines (a 170 kB library module costs ~30 ms, not the ~1 s of a full libcst parse)."""

    def __init__(self, path: str, source: str, tree) -> None:
        import ast

        self.path = path
        self.dir = os.path.dirname(path)
        self.lines = source.splitlines(keepends=True)
        self.imports: dict = {}
        self.spans: dict = {}  # name -> ("function" | "class", first line, last line); None: defined twice
        self.bases: dict = {}  # class name -> [dotted base]
        self.methods: dict = {}  # class name -> {method name: FunctionDef} (of the parsed classes)
        self.method_class: dict = {}  # id(FunctionDef) -> ClassDef
        self.parsed: dict = {}  # name -> FunctionDef | ClassDef | None (unparsable)
        self.segments: list = []  # (libcst module of the definition's lines, first line)
        self._positions: dict = {}
        self._symbols = None
        self._roles = None
        self._roles_n = -1
        self._import_spans: list = []
        self._import_stmts = None
        body = list(tree.body)
        while body:
            st = body.pop(0)
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                first = min([st.lineno] + [d.lineno for d in st.decorator_list])
                kind = "class" if isinstance(st, ast.ClassDef) else "function"
                self.spans[st.name] = None if st.name in self.spans else (kind, first, st.end_lineno)
                if kind == "class":
                    self.bases[st.name] = [d for d in (_ast_dotted(b) for b in st.bases) if d]
            elif isinstance(st, ast.Import):
                self._import_spans.append((st.lineno, st.end_lineno, st.col_offset))
                for a in st.names:
                    if a.asname:
                        self.imports[a.asname] = (a.name, 0, None)
                    else:
                        self.imports.setdefault(a.name.split(".")[0], (a.name.split(".")[0], 0, None))
            elif isinstance(st, ast.ImportFrom):
                self._import_spans.append((st.lineno, st.end_lineno, st.col_offset))
                for a in st.names:
                    if a.name != "*":
                        self.imports[a.asname or a.name] = (st.module or "", st.level or 0, a.name)
            elif isinstance(st, (ast.If, ast.Try)):
                body[:0] = list(st.body)

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def _parse(self, name: str):
        if name in self.parsed:
            return self.parsed[name]
        span = self.spans.get(name)
        node = None
        if span is not None:
            kind, first, last = span
            text = "".join(self.lines[first - 1:last])
            if self.lines[first - 1][:1] in (" ", "\t"):
                node = None  # (under an ``if`` / ``try``: indented, not parsed on its own)
            else:
                try:
                    seg = _parse.parse_module(text)
                    cand = seg.body[0] if seg.body else None
                    want = cst.ClassDef if kind == "class" else cst.FunctionDef
                    if isinstance(cand, want) and cand.name.value == name:
                        node = cand
                        self.segments.append((seg, first))
                        self._register(seg, node)
                except Exception:
                    node = None
        self.parsed[name] = node
        return node

    def _register(self, seg, node) -> None:
        from bertlint.analysis.walk import iter_nodes

        _DEFS[id(node)] = (node, self)
        if isinstance(node, cst.ClassDef):
            ms = self.methods.setdefault(node.name.value, {})
            for m in _body(node.body):
                if isinstance(m, cst.FunctionDef):
                    ms[m.name.value] = m
                    self.method_class[id(m)] = node
                    _DEFS[id(m)] = (m, self)
        for n in iter_nodes(seg):  # the calls (a callee is resolved in the module that makes the call)
            if type(n) is cst.Call:
                _CALLS[id(n)] = (n, self)

    def forget(self) -> None:
        """Drop this module's nodes from the registries (it was re-read after a change)."""
        for k in [k for k, v in _DEFS.items() if v[1] is self]:
            del _DEFS[k]
        for k in [k for k, v in _CALLS.items() if v[1] is self]:
            del _CALLS[k]
        _OWNS.clear()

    def line(self, node) -> int:
        from bertlint.positions import positions_of

        for seg, first in self.segments:
            pos = self._positions.get(id(seg))
            if pos is None:
                try:
                    pos = positions_of(seg)
                except Exception:
                    pos = {}
                self._positions[id(seg)] = pos
            try:
                return pos[node].start.line + first - 1
            except Exception:
                continue
        return 0

    @property
    def module(self) -> cst.Module:
        """A module of the definitions parsed so far (the same nodes: roles and symbols read them)."""
        if self._import_stmts is None:
            text = "".join("".join(self.lines[a - 1:b]) for a, b, col in self._import_spans if col == 0)
            try:
                self._import_stmts = list(_parse.parse_module(text).body)
            except Exception:
                self._import_stmts = []
        return cst.Module(body=self._import_stmts + [seg.body[0] for seg, _ in self.segments])

    @property
    def symbols(self):
        if self._symbols is None or self._roles_n != len(self.segments):
            from bertlint.analysis import symbols

            self._symbols = symbols.build(self.module)
            self._roles = None
            self._roles_n = len(self.segments)
        return self._symbols

    @property
    def roles(self):
        t = self.symbols
        if self._roles is None:
            from bertlint.analysis import roles

            self._roles = roles.build(t)
        return self._roles

    def function(self, name: str):
        span = self.spans.get(name)
        return self._parse(name) if span is not None and span[0] == "function" else None

    def cls(self, name: str):
        span = self.spans.get(name)
        return self._parse(name) if span is not None and span[0] == "class" else None

    def method(self, cls: cst.ClassDef, name: str, _depth: int = 0):
        """The method ``name`` of ``cls`` or of a base class defined in this module (never guessed)."""
        m = self.methods.get(cls.name.value, {}).get(name)
        if m is not None or _depth > 4:
            return m
        for b in self.bases.get(cls.name.value, []):
            base = self.cls(b)
            if base is not None and base is not cls:
                m = self.method(base, name, _depth + 1)
                if m is not None:
                    return m
        return None


def _ast_dotted(e) -> Optional[str]:
    import ast

    if isinstance(e, ast.Name):
        return e.id
    if isinstance(e, ast.Attribute):
        d = _ast_dotted(e.value)
        return f"{d}.{e.attr}" if d else None
    return None


# ------------------------------------------------------------------------------------------ imports
def imports_of(module: cst.Module) -> dict:
    """local name -> (module dotted, level, attribute | None) for the module's imports (top level, and under
    ``try`` / ``if`` at top level). ``import a.b as c`` -> ("a.b", 0, None); ``from .x import f`` -> ("x", 1, "f")."""
    out: dict = {}
    stack = list(module.body)
    while stack:
        st = stack.pop(0)
        if isinstance(st, cst.SimpleStatementLine):
            for s in st.body:
                if isinstance(s, cst.Import):
                    for a in s.names:
                        full = dotted(a.name) or ""
                        if a.asname is not None and isinstance(a.asname.name, cst.Name):
                            out[a.asname.name.value] = (full, 0, None)
                        elif full:
                            out.setdefault(full.split(".")[0], (full.split(".")[0], 0, None))
                elif isinstance(s, cst.ImportFrom) and not isinstance(s.names, cst.ImportStar):
                    mod = dotted(s.module) if s.module is not None else ""
                    level = len(s.relative)
                    for a in s.names:
                        nm = dotted(a.name) or ""
                        local = nm
                        if a.asname is not None and isinstance(a.asname.name, cst.Name):
                            local = a.asname.name.value
                        if local:
                            out[local] = (mod or "", level, nm)
        elif isinstance(st, (cst.Try, cst.If)):
            stack[:0] = _body(st.body)
    return out


# ------------------------------------------------------------------------------------------ the project
def project_root(directory: str) -> Optional[str]:
    d = os.path.abspath(directory)
    hit = _ROOTS.get(d, 0)
    if hit != 0:
        return hit
    cur = d
    found = None
    for _ in range(12):
        try:
            names = set(os.listdir(cur))
        except OSError:
            break
        if any(m in names for m in ROOT_MARKERS):
            found = cur
            break
        up = os.path.dirname(cur)
        if up == cur:
            break
        cur = up
    _ROOTS[d] = found
    return found


def _skipped(path: str) -> bool:
    parts = path.split(os.sep)
    return any(p in _SKIP_DIRS for p in parts)


def load(path: str) -> Optional[ModuleInfo]:
    """The parsed module at ``path`` (cached by path, size, mtime); None when missing, unreadable, too large
    or unparsable. Every existing file asked for is reported to the result cache as a dependency."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    _note(path)
    hit = _MODULES.get(path)
    if hit is not None and hit[0] == st.st_size and hit[1] == st.st_mtime_ns:
        return hit[2]
    if hit is not None and hit[2] is not None:
        hit[2].forget()
    info = None
    if st.st_size <= MAX_BYTES:
        try:
            with open(path, "rb") as fh:
                data = fh.read()
            source = data.decode("utf-8")
            import ast
            import warnings

            with warnings.catch_warnings():  # (invalid escapes ... are the module's own business)
                warnings.simplefilter("ignore")
                tree = ast.parse(source, filename=path)
            info = ModuleInfo(path, source, tree)
        except (OSError, UnicodeDecodeError, RecursionError, Exception):
            info = None
    _MODULES[path] = (st.st_size, st.st_mtime_ns, info)
    return info


def _note(path: str) -> None:
    try:
        from bertlint import cache

        cache.note_dependency(path)
    except Exception:
        pass


class Scope:
    """Where imports are resolved from: a directory, the project root, the imports, the hops used so far."""

    __slots__ = ("path", "dir", "root", "imports", "hops", "linted")

    def __init__(self, path: str, root: Optional[str], imports: dict, hops: int, linted: str = "") -> None:
        self.path = path
        self.dir = os.path.dirname(path)
        self.root = root
        self.imports = imports
        self.hops = hops
        self.linted = linted or path  # the linted file: never read back as a sibling (an import cycle)


def _inside(path: str, top: str) -> bool:
    return path == top or path.startswith(top.rstrip(os.sep) + os.sep)


def find_module(scope: Scope, dotted_name: str, level: int) -> Optional[str]:
    """The file of module ``dotted_name`` (``level`` leading dots) seen from ``scope``, or None."""
    parts = [p for p in dotted_name.split(".") if p] if dotted_name else []
    top = scope.root or scope.dir
    if level > 0:
        base = scope.dir
        for _ in range(level - 1):
            base = os.path.dirname(base)
        bases = [base] if _inside(base, top) or scope.root is None else []
    else:
        if not parts or parts[0] in _FRAMEWORKS:
            return None
        bases = []
        cur = scope.dir
        for _ in range(8):
            bases.append(cur)
            if scope.root is None or cur == scope.root or not _inside(cur, scope.root):
                break
            up = os.path.dirname(cur)
            if up == cur:
                break
            cur = up
    for b in bases:
        stem = os.path.join(b, *parts) if parts else b
        for cand in (stem + ".py", os.path.join(stem, "__init__.py")):
            if parts or cand.endswith("__init__.py"):
                if os.path.isfile(cand) and not _skipped(cand):
                    return os.path.abspath(cand)
    return None


def _module_target(scope: Scope, dotted_name: str, level: int) -> Optional[Target]:
    if scope.hops >= MAX_HOPS:
        return None
    p = find_module(scope, dotted_name, level)
    if p is None or p == os.path.abspath(scope.path) or p == os.path.abspath(scope.linted):
        return None
    if _READING is not None:
        _READING.add(p)
    info = load(p)
    if info is None:
        return None
    return Target("module", None, info)


def _member(t: Target, name: str, scope: Scope, seen: set) -> Optional[Target]:
    """``name`` inside what ``t`` is: a module's function / class / submodule / re-export, a class's method."""
    info = t.info
    if t.kind == "class":
        m = info.method(t.node, name)
        return Target("function", m, info) if m is not None else None
    if t.kind != "module":
        return None
    fn = info.function(name)
    if fn is not None:
        return Target("function", fn, info)
    cls = info.cls(name)
    if cls is not None:
        return Target("class", cls, info)
    sub_scope = Scope(info.path, scope.root, info.imports, scope.hops + 1, scope.linted)
    if name in info.imports and (info.path, name) not in seen:  # re-exported: one more hop
        seen.add((info.path, name))
        return _resolve_local(sub_scope, name, seen)
    if os.path.basename(info.path) == "__init__.py":  # ``from pkg import mod`` / ``pkg.mod``
        return _module_target(sub_scope, name, 1)
    return None


def _resolve_local(scope: Scope, name: str, seen: set) -> Optional[Target]:
    spec = scope.imports.get(name)
    if spec is None:
        return None
    mod, level, attr = spec
    if attr is None:  # ``import a.b as c`` / ``import a``
        return _module_target(scope, mod, level)
    if mod or level:
        t = _module_target(scope, mod, level)
        if t is not None:
            m = _member(t, attr, scope, seen)
            if m is not None:
                return m
    # ``from pkg import mod`` where mod is a module file
    sub = f"{mod}.{attr}" if mod else attr
    return _module_target(scope, sub, level)


def resolve_in(scope: Scope, dotted_name: str) -> Optional[Target]:
    parts = dotted_name.split(".")
    t = _resolve_local(scope, parts[0], set())
    for p in parts[1:]:
        if t is None:
            return None
        t = _member(t, p, scope, set())
    return t


class Project:
    """The resolver of one linted file."""

    def __init__(self, filename: str, module: cst.Module) -> None:
        self.path = os.path.abspath(filename) if filename else ""
        self.module = module
        self.enabled = bool(filename) and os.path.isfile(self.path) and not _skipped(self.path) and \
            os.environ.get("BERTLINT_NO_PROJECT") is None
        self._scope: Optional[Scope] = None
        self._memo: dict = {}
        self._calls: dict = {}
        self.read: set = set()  # the sibling files this lint looked at
        if self.path:
            _READERS[self.path] = self.read

    @property
    def has_siblings(self) -> bool:
        """Does any import of the linted file name a module of the project (one look per import, cached)? When
        none does, every question here is answered at once."""
        v = self.__dict__.get("_has_sib")
        if v is None:
            v = False
            if self.enabled:
                sc = self.scope
                for mod, level, attr in sc.imports.values():
                    if find_module(sc, mod, level) is not None or (
                            attr and find_module(sc, f"{mod}.{attr}" if mod else attr, level) is not None):
                        v = True
                        break
            self._has_sib = v
        return v

    @property
    def scope(self) -> Scope:
        if self._scope is None:
            d = os.path.dirname(self.path)
            self._scope = Scope(self.path, project_root(d), imports_of(self.module), 0)
        return self._scope

    def resolve(self, dotted_name: Optional[str], in_def=None, info: Optional[ModuleInfo] = None) -> Optional[Target]:
        global _READING
        _READING = self.read
        try:
            return self._resolve(dotted_name, in_def, info)
        finally:
            _READING = None

    def _resolve(self, dotted_name: Optional[str], in_def=None, info: Optional[ModuleInfo] = None) -> Optional[Target]:
        """What a name (``f``, ``tu.f``, ``Cls``) refers to in the project: seen from the linted file, or from
        the sibling module holding ``in_def`` (a foreign function / class). None: not a sibling's definition."""
        if not dotted_name or not self.has_siblings:
            return None
        scope = self.scope
        if info is None and in_def is not None:
            info = info_of(in_def)
        if info is not None:
            key = (id(info), dotted_name)
        else:
            key = dotted_name
        if key in self._memo:
            return self._memo[key]
        if info is not None:
            head = dotted_name.split(".")[0]
            fn = info.function(head)
            cls = info.cls(head)
            if fn is not None or cls is not None:
                t: Optional[Target] = Target("function", fn, info) if fn is not None else Target("class", cls, info)
                for p in dotted_name.split(".")[1:]:
                    t = _member(t, p, scope, set()) if t is not None else None
            else:
                t = resolve_in(Scope(info.path, scope.root, info.imports, 1, self.path), dotted_name)
        else:
            if dotted_name.split(".")[0] not in scope.imports:
                self._memo[key] = None
                return None
            t = resolve_in(scope, dotted_name)
        self._memo[key] = t
        return t

    # ------------------------------------------------------------------ callees (the loop model's hook)
    def foreign_call(self, call) -> bool:
        return bool(_CALLS) and info_of(call) is not None

    def class_of(self, func) -> Optional[cst.ClassDef]:
        info = info_of(func)
        return info.method_class.get(id(func)) if info is not None else None

    def callee(self, call: cst.Call, func, cls, loops) -> Optional[cst.FunctionDef]:
        if not self.has_siblings:
            return None
        key = (id(call), id(func), id(cls))
        memo = self._calls
        hit = memo.get(key)
        if hit is not None and hit[0] is call:
            return hit[1]  # (the dry run asks again on every micro-batch of every configuration)
        fn = self._callee(call, func, cls, loops)
        if fn is not None and owns_training_loop(fn):
            fn = None  # the sibling's own training loop: reported when that file is linted, never twice
        memo[key] = (call, fn)
        return fn

    def _callee(self, call: cst.Call, func, cls, loops) -> Optional[cst.FunctionDef]:
        """The sibling module's function a call runs, or None (never guessed between several):

        - a call made inside a sibling's function: that module's own functions, its imports, ``self.m()`` in its
          classes (and their bases in that module);
        - a call of the linted file: an imported function (``train_one_epoch(...)``, ``tu.step(...)``), an
          instance of an imported class called or given a method call (``loss_scaler(loss, opt)`` runs its
          ``__call__``, ``updater.step()``), ``self.m()`` where ``m`` comes from a base class in a sibling."""
        if not self.enabled:
            return None
        fn = call.func
        info = info_of(call)
        if info is not None:
            if isinstance(fn, cst.Name):
                local = info.function(fn.value)
                if local is not None:
                    return local
                t = self.resolve(fn.value, info=info)
                return t.node if t is not None and t.kind == "function" else None
            if isinstance(fn, cst.Attribute) and isinstance(fn.value, cst.Name) and fn.value.value == "self":
                if cls is not None and info_of(cls) is info:
                    return info.method(cls, fn.attr.value)
                return None
            d = dotted(fn)
            if d and d.split(".")[0] in info.imports:
                t = self.resolve(d, info=info)
                return t.node if t is not None and t.kind == "function" else None
            return None
        if isinstance(fn, cst.Name):
            t = self.resolve(fn.value)
            if t is not None:
                return t.node if t.kind == "function" else None
            c = self.instance_class(fn.value, func, loops, 0)
            if c is not None:
                return c.info.method(c.node, "__call__")
            return None
        if isinstance(fn, cst.Attribute):
            d = dotted(fn.value)
            if d is None:
                return None
            if d == "self":
                if cls is None or info_of(cls) is not None:
                    return None
                base = self.base_class(cls, loops)
                m = base.info.method(base.node, fn.attr.value) if base is not None else None
                if m is None:  # ``self.loss_scaler(loss, opt)``: an attribute holding an instance of a sibling class
                    c = self.instance_class(f"self.{fn.attr.value}", func, loops, 0)
                    m = c.info.method(c.node, "__call__") if c is not None else None
                return m
            t = self.resolve(f"{d}.{fn.attr.value}")
            if t is not None:
                return t.node if t.kind == "function" else None
            c = self.instance_class(d, func, loops, 0)
            if c is not None:
                return c.info.method(c.node, fn.attr.value)
        return None

    def built_by_factory(self, names: tuple, loops) -> Optional[tuple]:
        """A framework object the linted file gets from a sibling's factory (``accelerator =
        train_util.prepare_accelerator(args)``): ``(constructor Call in the sibling, {param: caller's argument
        text}, sibling ModuleInfo, target name)`` when every binding of the target comes from such a factory whose
        ``return`` hands back a constructor with qualified name in ``names``; None otherwise (unknown)."""
        if not self.has_siblings:
            return None
        key = ("factory", names)
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None
        res = None
        t = loops.t
        for target, assigns in t.assignments.items():
            if not assigns or not all(isinstance(a.value, cst.Call) for a in assigns):
                continue
            calls = [a.value for a in assigns]
            cn = dotted(calls[0].func)
            if cn is None or any(dotted(c.func) != cn for c in calls) or cn.split(".")[0] not in self.scope.imports:
                continue
            tg = self.resolve(cn)
            if tg is None or tg.kind != "function":
                continue
            built = _returned_constructor(tg.node, tg.info, names)
            if built is None:
                continue
            params = [p.name.value for p in tg.node.params.params]
            binds = {}
            for c in calls[:1]:
                pos = [a for a in c.args if a.keyword is None and not a.star]
                for i, a in enumerate(pos):
                    if i < len(params):
                        binds[params[i]] = _code(a.value)
                for a in c.args:
                    if a.keyword is not None:
                        binds[a.keyword.value] = _code(a.value)
            res = (built, binds, tg.info, target, tg.node)
            break
        self._memo[key] = res
        return res

    def wrapped_by_factory(self, qual_ok, loops, is_model) -> Optional[tuple]:
        """A model the linted file hands to a sibling's factory that wraps it and hands it back
        (``model, opt = distributed_opt(args, model, opt)`` whose body returns ``DistributedDataParallel(model)``):
        ``(wrapping Call in the sibling, [condition texts it runs under, outermost first], ModuleInfo, site Call)``.
        ``qual_ok(qualname)`` says which constructor wraps; ``is_model(expr text)``, which argument is a model.
        None when no such factory is seen."""
        if not self.has_siblings:
            return None
        key = ("wrap", id(qual_ok))
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None
        res = None
        pairs = [(target, a.value) for target, assigns in loops.t.assignments.items() for a in assigns]
        pairs += [(n, call) for names, call, _ in getattr(loops.t, "unpacks", ()) for n in names if n]
        for target, c in pairs:
            if True:
                if not isinstance(c, cst.Call):
                    continue
                cn = dotted(c.func)
                if cn is None or cn.split(".")[0] not in self.scope.imports:
                    continue
                tg = self.resolve(cn)
                if tg is None or tg.kind != "function":
                    continue
                args = [_code(x.value) for x in c.args if not x.star]
                if not (target in args or any(is_model(t) for t in args)):
                    continue  # the factory is not handed the model it gives back
                hit = _returned_wrap(tg.node, tg.info, qual_ok)
                if hit is not None:
                    res = (hit[0], hit[1], tg.info, c)
                    break
            if res is not None:
                break
        self._memo[key] = res
        return res

    def base_class(self, cls: cst.ClassDef, loops) -> Optional[Target]:
        """The first base of a linted-file class that is a class of a sibling module (None otherwise)."""
        for b in cls.bases:
            d = dotted(b.value)
            t = self.resolve(d) if d else None
            if t is not None and t.kind == "class":
                return t
        return None

    def instance_class(self, name: str, func, loops, depth: int) -> Optional[Target]:
        """The sibling class every binding of ``name`` (seen from ``func``) is an instance of: assignments
        ``x = Cls(...)``, or for a parameter the arguments at the file's own call sites. None when any binding
        is something else or unknown."""
        if depth > 2 or loops is None:
            return None
        key = ("inst", name, id(func))
        if key in self._memo:
            return self._memo[key]
        self._memo[key] = None  # recursion guard
        t = loops.t
        res = None
        assigns = t.assignments_of(name, func) if "." not in name else t.assignments.get(name, [])
        if assigns:
            found = []
            for a in assigns:
                v = a.value
                if not isinstance(v, cst.Call):
                    found = []
                    break
                cn = dotted(v.func)
                ct = self.resolve(cn) if cn else None
                if ct is None or ct.kind != "class":
                    found = []
                    break
                found.append(ct)
            if found and all(x.node is found[0].node for x in found):
                res = found[0]
        elif func is not None and "." not in name:
            res = self._param_class(name, func, loops, depth)
        self._memo[key] = res
        return res

    def _param_class(self, name: str, func, loops, depth: int) -> Optional[Target]:
        params = [p for p in func.params.params]
        idx = next((i for i, p in enumerate(params) if p.name.value == name), None)
        kwonly = any(p.name.value == name for p in func.params.kwonly_params)
        if idx is None and not kwonly:
            return None
        if loops.class_of(func) is not None:
            return None  # a method: its callers are not followed here
        sites = [(c, f) for c, nm, f in loops.t.calls if nm == func.name.value]
        if not sites:
            return self._duck_class(name, func)  # called from another file: the class its uses fit, if one
        found = []
        for c, caller in sites:
            arg = None
            for a in c.args:
                if a.keyword is not None and a.keyword.value == name:
                    arg = a.value
            if arg is None and idx is not None:
                pos = [a for a in c.args if a.keyword is None]
                if any(a.star for a in pos[: idx + 1]):
                    return None
                if idx < len(pos):
                    arg = pos[idx].value
            d = dotted(arg) if arg is not None else None
            ct = self.instance_class(d, caller, loops, depth + 1) if d else None
            if ct is None:
                return None
            found.append(ct)
        return found[0] if all(x.node is found[0].node for x in found) else None


    def _duck_class(self, name: str, func) -> Optional[Target]:
        """The one class of the sibling modules the file imports whose methods accept every use of parameter
        ``name`` in ``func`` (``loss_scaler(loss, optimizer, parameters=..., update_grad=...)`` fits only
        ``NativeScalerWithGradNormCount.__call__`` of ``util/misc.py``), when the function is called from another
        file. The uses must name at least one keyword (positional calls alone fit too many classes); two fitting
        classes, or a fitting class of the linted file itself, leave it unknown."""
        from bertlint.analysis.walk import iter_nodes

        uses = []
        for n in iter_nodes(func.body):
            if type(n) is not cst.Call:
                continue
            f = n.func
            if type(f) is cst.Name and f.value == name:
                uses.append(("__call__", n))
            elif type(f) is cst.Attribute and type(f.value) is cst.Name and f.value.value == name:
                uses.append((f.attr.value, n))
        if not uses or not any(a.keyword is not None for _, c in uses for a in c.args):
            return None
        if any(a.star for _, c in uses for a in c.args):
            return None
        fits = []
        for cls, info in self._imported_classes():
            if all(_accepts(info.method(cls, m) if info is not None else None, c) for m, c in uses):
                fits.append(Target("class", cls, info))
        for node in self.module.body:  # a class of the linted file that fits as well: not decided
            if isinstance(node, cst.ClassDef) and all(
                    _accepts(next((b for b in _body(node.body) if isinstance(b, cst.FunctionDef)
                                   and b.name.value == m), None), c) for m, c in uses):
                return None
        return fits[0] if len(fits) == 1 else None

    def _imported_classes(self) -> list:
        """(ClassDef, ModuleInfo) of every class defined at the top of a sibling module the linted file imports
        (a module imported as a whole: every class of it; a class imported by name: that class)."""
        got = self.__dict__.get("_imp_classes")
        if got is not None:
            return got
        got = []
        seen = set()
        for nm in list(self.scope.imports):
            t = self.resolve(nm)
            if t is None:
                continue
            if t.kind == "class" and id(t.node) not in seen:
                seen.add(id(t.node))
                got.append((t.node, t.info))
            elif t.kind == "module":
                for cname, span in list(t.info.spans.items()):
                    if span is not None and span[0] == "class":
                        c = t.info.cls(cname)
                        if c is not None and id(c) not in seen:
                            seen.add(id(c))
                            got.append((c, t.info))
        self._imp_classes = got
        return got


def _accepts(fn, call: cst.Call) -> bool:
    """Can method ``fn`` (a FunctionDef with ``self`` first) be called with ``call``'s arguments?"""
    if fn is None:
        return False
    ps = fn.params
    pos = list(ps.posonly_params) + list(ps.params)
    if pos and pos[0].name.value in ("self", "cls"):
        pos = pos[1:]
    npos = sum(1 for a in call.args if a.keyword is None)
    kws = [a.keyword.value for a in call.args if a.keyword is not None]
    if npos > len(pos) and not isinstance(ps.star_arg, cst.Param):
        return False
    names = {p.name.value for p in pos[npos:]} | {p.name.value for p in ps.kwonly_params}
    if ps.star_kwarg is None and any(k not in names for k in kws):
        return False
    return all(p.default is not None or p.name.value in kws for p in list(pos[npos:]) + list(ps.kwonly_params))


def of(ctx) -> Project:
    p = ctx.__dict__.get("_project")
    if p is None:
        p = Project(ctx.filename, ctx.module)
        ctx.__dict__["_project"] = p
        if len(_PROJECTS) >= 8:
            _PROJECTS.pop(next(iter(_PROJECTS)))
        _PROJECTS[id(ctx.module)] = (ctx.module, p)
    return p


def reads(linted: str, sibling: str) -> bool:
    """Did the last lint of ``linted`` read ``sibling`` (a module of the project it imports)?"""
    return os.path.abspath(sibling) in _READERS.get(os.path.abspath(linted), ())


def for_module(module) -> Optional[Project]:
    hit = _PROJECTS.get(id(module))
    return hit[1] if hit is not None and hit[0] is module else None


def info_of(node) -> Optional[ModuleInfo]:
    """The sibling module a FunctionDef / ClassDef (or a Call) of a parsed sibling belongs to, else None."""
    if node is None:
        return None
    hit = _DEFS.get(id(node))
    if hit is not None and hit[0] is node:
        return hit[1]
    if type(node) is cst.Call:
        hit = _CALLS.get(id(node))
        if hit is not None and hit[0] is node:
            return hit[1]
    return None


def where(node, info: Optional[ModuleInfo] = None) -> Optional[str]:
    """``"train_utils.py:42"`` for a node of a parsed sibling (looked up in ``info``, or every loaded module)."""
    infos = [info] if info is not None else [v[2] for v in _MODULES.values() if v[2] is not None]
    for i in infos:
        ln = i.line(node)
        if ln:
            return f"{i.name}:{ln}"
    return None


_OWNS: dict = {}


def owns_training_loop(fn) -> bool:
    """Does a sibling's function hold a loop whose body runs a backward (``for batch in loader: ...
    loss.backward()``)? Such a function is that file's training loop: its mistakes are reported when it is linted,
    so the linted file does not inline it (no finding twice, at two places)."""
    hit = _OWNS.get(id(fn))
    if hit is not None and hit[0] is fn:
        return hit[1]
    from bertlint.analysis.walk import iter_nodes

    res = False
    for n in iter_nodes(fn.body):
        if type(n) in (cst.For, cst.While):
            for m in iter_nodes(n.body):
                if type(m) is cst.Call and isinstance(m.func, cst.Attribute) and \
                        m.func.attr.value in ("backward", "manual_backward"):
                    res = True
                    break
            if res:
                break
    _OWNS[id(fn)] = (fn, res)
    return res


def _returned_constructor(fn: cst.FunctionDef, info: ModuleInfo, names: tuple) -> Optional[cst.Call]:
    """The constructor call (qualified name in ``names``) a sibling's function returns: ``return Cls(...)``, or
    ``x = Cls(...)`` ... ``return x`` with a single such binding of ``x``."""
    from bertlint.analysis.walk import iter_nodes

    try:
        sym = info.symbols
    except Exception:
        return None
    built: dict = {}
    rets = []
    for n in iter_nodes(fn.body):
        tp = type(n)
        if tp is cst.Assign and isinstance(n.value, cst.Call) and len(n.targets) == 1 and \
                isinstance(n.targets[0].target, cst.Name):
            q = sym.qualname(n.value.func) or ""
            nm = n.targets[0].target.value
            built.setdefault(nm, []).append(n.value if q in names else None)
        elif tp is cst.Return and n.value is not None:
            rets.append(n.value)
    found = []
    for r in rets:
        if isinstance(r, cst.Call) and (sym.qualname(r.func) or "") in names:
            found.append(r)
        elif isinstance(r, cst.Name) and r.value in built and len(built[r.value]) == 1 and built[r.value][0] is not None:
            found.append(built[r.value][0])
        else:
            return None
    return found[0] if len(found) == 1 else None


def _returned_wrap(fn: cst.FunctionDef, info: ModuleInfo, qual_ok) -> Optional[tuple]:
    """(wrapping Call, [condition texts]) of a sibling function that returns (alone or in a tuple) the result of
    a wrapping constructor ``qual_ok`` accepts, directly or through a name it assigns."""
    try:
        sym = info.symbols
    except Exception:
        return None
    returned: set = set()
    ret_calls: list = []
    wraps: list = []  # (call, assigned name | None, conditions)

    def visit(stmts, conds):
        for st in stmts:
            if isinstance(st, cst.If):
                c = _code(st.test)
                visit(_body(st.body), conds + [f"`{c}`"])
                orelse = st.orelse
                neg = [f"not `{c}`"]
                while isinstance(orelse, cst.If):  # elif chains
                    c2 = _code(orelse.test)
                    visit(_body(orelse.body), conds + neg + [f"`{c2}`"])
                    neg = neg + [f"not `{c2}`"]
                    orelse = orelse.orelse
                if orelse is not None:
                    visit(_body(orelse.body), conds + neg)
            elif isinstance(st, (cst.For, cst.While, cst.With, cst.Try)):
                visit(_body(st.body), conds + ["(inside a block)"])
            elif isinstance(st, cst.SimpleStatementLine):
                for sm in st.body:
                    if isinstance(sm, cst.Return) and sm.value is not None:
                        vals = sm.value.elements if isinstance(sm.value, cst.Tuple) else [sm.value]
                        for v in vals:
                            e = getattr(v, "value", v)
                            if isinstance(e, cst.Name):
                                returned.add(e.value)
                            elif isinstance(e, cst.Call):
                                ret_calls.append((e, conds))
                    elif isinstance(sm, cst.Assign) and isinstance(sm.value, cst.Call) and len(sm.targets) == 1 \
                            and isinstance(sm.targets[0].target, cst.Name):
                        wraps.append((sm.value, sm.targets[0].target.value, conds))

    visit(_body(fn.body), [])
    for call, name, conds in wraps + [(c, None, cd) for c, cd in ret_calls]:
        if not qual_ok(sym.qualname(call.func) or ""):
            continue
        if name is None or name in returned:
            if "(inside a block)" in conds:
                return None  # under a loop / with / try: not read
            return call, conds
    return None


def _code(node) -> str:
    try:
        return cst.Module(body=[]).code_for_node(node).strip()
    except Exception:
        return ""


def _body(suite) -> list:
    b = getattr(suite, "body", ())
    return list(b) if isinstance(b, (list, tuple)) else []


# ---------------------------------------------------------------------------------------------------------------
# reverse callers: the calls of a function of the linted file made by the other modules of the project

MAX_REVERSE_FILES = 400
_GUARDS = ("no_grad", "inference_mode")


def _guard_kind(expr) -> Optional[bool]:
    """True for ``torch.no_grad()`` / ``inference_mode()`` / ``set_grad_enabled(False)`` (any alias: the final
    name decides), False for another context or decorator, None for ``set_grad_enabled(<not a literal>)``."""
    import ast

    e = expr.func if isinstance(expr, ast.Call) else expr
    name = e.attr if isinstance(e, ast.Attribute) else e.id if isinstance(e, ast.Name) else ""
    if name in _GUARDS:
        return True
    if name == "set_grad_enabled" and isinstance(expr, ast.Call) and expr.args:
        a = expr.args[0]
        if isinstance(a, ast.Constant) and isinstance(a.value, bool):
            return not a.value
        return None
    return False


def _calls_with_guard(tree, name: str) -> list:
    """``(line, guarded)`` for every call ``name(...)`` / ``x.name(...)`` in ``tree``: guarded when an enclosing
    ``with`` or a decorator of an enclosing function turns gradients off (innermost decides); None when it cannot be
    told (``set_grad_enabled(flag)``)."""
    import ast

    out = []

    def visit(node, state):
        if isinstance(node, ast.With) or isinstance(node, ast.AsyncWith):
            kinds = [_guard_kind(it.context_expr) for it in node.items]
            inner = True if True in kinds else (None if None in kinds else state)
            for it in node.items:
                visit(it.context_expr, state)
            for st in node.body:
                visit(st, inner)
            return
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            kinds = [_guard_kind(d) for d in getattr(node, "decorator_list", [])]
            # a call inside another function runs in whatever mode that function's own callers set: not known
            inner = True if True in kinds else (None if None in kinds else None)
            for d in getattr(node, "decorator_list", []):
                visit(d, state)
            body = node.body if isinstance(node.body, list) else [node.body]
            for st in body:
                visit(st, inner)
            return
        if isinstance(node, ast.Call):
            f = node.func
            final = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if final == name:
                out.append((node.lineno, state))
        for child in ast.iter_child_nodes(node):
            visit(child, state)

    visit(tree, False)
    return out


def reverse_calls(filename: str, name: str) -> Optional[list]:
    """Calls of ``name`` (a function or method of ``filename``) made by the other Python files of its project:
    ``[(path, line, guarded)]`` with ``guarded`` True (under no_grad / inference_mode), False (module level with
    gradients on) or None (inside a function whose own callers decide, or a mode not known). Matched by the call's
    final name, so the answer is only used to stay silent when every such call turns gradients off. None when the
    project cannot be searched (no root, too many files)."""
    import ast

    if not filename or os.environ.get("BERTLINT_NO_PROJECT") is not None:
        return None
    path = os.path.abspath(filename)
    root = project_root(os.path.dirname(path))
    if root is None:
        return None
    needle = name + "("
    out: list = []
    seen = 0
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and x not in _SKIP_DIRS
                         and x not in ("node_modules", "__pycache__", "venv", "env", "build", "dist"))
        for fn in sorted(files):
            if not fn.endswith(".py"):
                continue
            p = os.path.join(d, fn)
            if p == path:
                continue
            seen += 1
            if seen > MAX_REVERSE_FILES:
                return None
            _note(p)
            try:
                if os.path.getsize(p) > MAX_BYTES:
                    continue
                with open(p, encoding="utf-8", errors="replace") as fh:
                    src = fh.read()
            except OSError:
                continue
            if needle not in src:
                continue
            try:
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    tree = ast.parse(src, filename=p)
            except Exception:
                continue
            out.extend((p, line, g) for line, g in _calls_with_guard(tree, name))
    return out
