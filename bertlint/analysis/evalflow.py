"""Grad mode, model forwards and small function-level data flow — shared by the evaluation and memory rules
(BL501, BL502, BL506) and reusable by any rule that needs to ask:

* is this node under ``torch.no_grad()`` / ``torch.inference_mode()`` (a ``with`` at any enclosing level, a
  decorator on the enclosing function, a caller of that function in the same file)?  ``grad_state(node)``
* is this call a model forward (``model(**batch)``, ``self.model(x)``, ``model.forward(...)``)?  ``is_forward(call)``
* does this loop / function run a backward (directly or through functions of the same file)?  ``has_backward(node)``
* does this loop evaluate (``model.eval()`` before it, or a function named like evaluate/validate/predict)?
* which names of a loop body carry an autograd graph?  ``graph_env(loop)`` / ``carries_graph(expr, env)``

Built lazily, once per file, as ``ctx.evalflow``: one walk that records parents and pre-order positions (so
"before", "after" and "inside" are integer comparisons), the calls, loops, functions and assignments of each scope.
No ScopeProvider / QualifiedNameProvider: names resolve through ``ctx.symbols``' import table.

Every question answers conservatively: when the code is not understood the answer is the one that makes the
rules stay silent (``grad_state`` says "unknown", ``is_forward`` says False).
"""

from __future__ import annotations

import bisect
import re
from typing import Iterable, Iterator, Optional, Union

import libcst as cst

from bertlint.analysis.walk import children, walk

from bertlint.analysis.symbols import SymbolTable, call_name, dotted, literal

Scope = Union[cst.FunctionDef, None]  # None: module level

ENABLED = "enabled"
DISABLED = "disabled"  # no_grad / set_grad_enabled(False) / inference_mode
UNKNOWN = "unknown"

# other frameworks whose `model(x)` is not a torch forward
_FOREIGN = {"tensorflow", "keras", "jax", "flax", "mindspore", "paddle", "mxnet", "tf_keras", "oneflow"}
# libraries whose loaded "models" are called like `model(x)` but never record a torch autograd graph: not torch at all
# (spaCy, llama.cpp, fastText, gensim, scikit-learn, boosting, ONNX Runtime, CTranslate2, vLLM, API clients), or
# running their own call under no_grad / inference_mode (ultralytics' YOLO predictor, stanza's pipeline)
_NO_GRAPH_LIBS = _FOREIGN | {
    "spacy", "ultralytics", "llama_cpp", "fasttext", "gensim", "sklearn", "xgboost", "lightgbm", "catboost",
    "onnxruntime", "ctranslate2", "vllm", "openai", "anthropic", "ollama", "stanza", "nltk", "tensorrt", "cv2",
}

EVAL_TOKENS = {
    "eval", "evaluate", "evaluation", "evaluating", "validate", "validation", "valid", "val", "test", "testing",
    "predict", "prediction", "predictions", "inference", "infer", "score", "scoring",
}

_DATA_PREP_TOKENS = {
    "preprocess", "prepare", "transform", "transforms", "collate", "collator", "tokenize", "tokenise", "augment",
    "augmentation", "load", "loader", "dataset", "split", "download", "read", "write", "save",
}

_MODEL_NAME = re.compile(
    r"(?:^|_)(model|models|net|network|encoder|classifier|teacher|student|bert|roberta|backbone|transformer|"
    r"ddp_model|engine|model_engine)(?:$|_)",
    re.IGNORECASE,
)
_NOT_MODEL_TOKENS = {
    "name", "names", "path", "paths", "dir", "args", "arguments", "config", "cfg", "conf", "type", "types", "kwargs",
    "id", "ids", "file", "files", "class", "cls", "fn", "func", "inputs", "outputs", "output", "str", "url", "key",
    "card", "size", "version", "state", "dict", "info", "params", "parameters", "tokenizer", "output_dir",
    "checkpoint", "ckpt", "registry", "factory", "builder", "list",
    # verbs and serialisers: a call named for an action on a model, or pydantic's BaseModel methods
    # (`trainer.save_model(...)`, `accelerator.unwrap_model(...)`, `get_model()`, `resp.model_dump_json()`), is no
    # forward of a model
    "save", "load", "dump", "json", "schema", "validate", "build", "get", "create", "make", "unwrap", "wrap",
    "prepare", "freeze", "unfreeze", "print", "log", "export", "push", "upload", "download", "resize", "summary",
    "process", "preprocess", "postprocess", "convert", "init", "setup", "update", "unload", "offload", "reload",
    "merge", "quantize", "compile", "register", "patch", "delete", "free", "release", "move", "switch", "swap",
    # a purpose, not the object: `reranker._process_mentions_for_model(...)` prepares inputs for a model
    "for",
}

_MODEL_CTOR = re.compile(
    r"(^AutoModel|Model$|Model[A-Z]|For[A-Z]|LMHead|^DistributedDataParallel$|^DataParallel$|^DDP$|"
    r"^FullyShardedDataParallel$|^FSDP$|^PeftModel|^get_peft_model$|^prepare_model_for_kbit_training$|"
    r"^SentenceTransformer$|^unwrap_model$|Classifier$|Net$|Encoder$|Transformer$)"
)
_NOT_MODEL_CTOR = re.compile(r"(Tokenizer|Processor|Config|FeatureExtractor|ImageProcessor|Collator|Dataset|Args|"
                            r"Pipeline$|PipelineFor[A-Z]|^pipeline$)")  # AutoPipelineForText2Image: a pipeline
# a diffusers / transformers pipeline's __call__ runs under no_grad itself (diffusers decorates it with
# ``@torch.no_grad()``; transformers' ``Pipeline.forward`` uses ``no_grad`` / ``inference_mode``)

# torch.nn classes that save their input for the weight gradient (an inference tensor as input raises)
_SAVING_MODULES = {"Linear", "Bilinear", "Embedding", "EmbeddingBag", "Conv1d", "Conv2d", "Conv3d", "LayerNorm",
                   "LSTM", "GRU", "RNN", "MultiheadAttention", "BatchNorm1d", "BatchNorm2d", "LazyLinear"}

# losses that save their target (checked: an inference-mode target raises at backward)
SAVING_LOSS_FUNCS = {"cross_entropy", "nll_loss", "mse_loss", "kl_div", "binary_cross_entropy",
                     "binary_cross_entropy_with_logits", "smooth_l1_loss", "huber_loss"}
SAVING_LOSS_CLASSES = {"CrossEntropyLoss", "NLLLoss", "MSELoss", "KLDivLoss", "BCELoss", "BCEWithLogitsLoss",
                       "SmoothL1Loss", "HuberLoss"}
_LOSS_FUNCS = SAVING_LOSS_FUNCS | {"l1_loss", "cosine_embedding_loss", "margin_ranking_loss", "triplet_margin_loss",
                                   "ctc_loss", "poisson_nll_loss", "hinge_embedding_loss", "soft_margin_loss",
                                   "multilabel_soft_margin_loss", "gaussian_nll_loss", "multi_margin_loss"}

# tensor methods that keep the autograd graph of their receiver
_GRAPH_METHODS = {
    "mean", "sum", "view", "view_as", "reshape", "float", "half", "double", "bfloat16", "squeeze", "unsqueeze",
    "softmax", "log_softmax", "sigmoid", "exp", "log", "to", "cpu", "cuda", "contiguous", "flatten", "transpose",
    "permute", "t", "abs", "pow", "sqrt", "tanh", "relu", "clone", "expand", "expand_as", "narrow", "split", "chunk",
    "unbind", "masked_fill", "mul", "div", "add", "sub", "matmul", "norm", "prod", "logsumexp", "clamp", "type_as",
    "squeeze_", "unsqueeze_", "__getitem__", "gather", "index_select", "square", "neg", "reciprocal", "std", "var",
    "cumsum", "nansum", "nanmean", "amax", "amin", "repeat", "tile", "roll", "flip",
}
# torch functions that keep the graph of their tensor arguments
_GRAPH_FUNCS = {
    "cat", "stack", "concat", "concatenate", "mean", "sum", "softmax", "log_softmax", "sigmoid", "exp", "log", "tanh",
    "relu", "matmul", "bmm", "mm", "einsum", "abs", "pow", "sqrt", "square", "clamp", "where", "norm", "logsumexp",
    "flatten", "reshape", "squeeze", "unsqueeze", "transpose", "permute", "gather", "index_select", "masked_select",
    "hstack", "vstack", "mul", "div", "add", "sub", "neg", "prod", "std", "var", "cumsum", "dropout", "normalize",
    "cosine_similarity", "pairwise_distance", "linear", "layer_norm", "gelu", "silu", "amax", "amin", "nansum",
    "nanmean",
}
_BUILTIN_GRAPH = {"sum"}  # builtins that return a tensor built from tensor elements

_BACKWARD_CALLS = {"backward", "manual_backward"}
_STEP_METHODS = {"training_step", "validation_step", "test_step", "predict_step"}
# calls that run a function handed to them in a new thread or process (grad mode is thread-local: on there)
_NEW_THREAD_CALLS = {"spawn", "start_processes", "Thread", "Process", "Timer", "notebook_launcher",
                     "debug_launcher", "launch", "elastic_launch", "run_in_executor", "to_thread"}
# methods only torch code calls (``torch_file`` for a file that imports only its own package)
_TORCH_ONLY_CALLS = ("backward", "zero_grad", "no_grad", "inference_mode", "requires_grad_", "load_state_dict",
                     "named_parameters", "set_grad_enabled", "clip_grad_norm_")
_OPTIMIZER_TOKENS = {"opt", "optim", "optimizer", "optimiser", "optimizers", "scaler", "grad_scaler"}
_TRAIN_STEP_RECEIVER = re.compile(r"(opt|optim|optimizer|scaler|engine|model_engine)", re.IGNORECASE)

# methods run by frameworks under no_grad / inference_mode themselves
_FRAMEWORK_EVAL_METHODS = {
    "validation_step", "test_step", "predict_step", "validation_epoch_end", "test_epoch_end",
    "on_validation_epoch_end", "on_test_epoch_end", "on_validation_batch_end", "on_test_batch_end",
    "on_predict_epoch_end", "on_predict_batch_end", "prediction_step", "evaluation_loop", "prediction_loop",
}
# ordinary method names: the framework runs them under no_grad only when the class is the framework's own
_FRAMEWORK_GENERIC_METHODS = {"evaluate", "predict", "prediction_step", "evaluation_loop", "prediction_loop"}
_FRAMEWORK_PACKAGES = {"transformers", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "trl",
                       "diffusers", "sentence_transformers", "setfit", "peft", "ignite", "composer", "mmengine",
                       "mmcv", "detectron2", "fairseq", "allennlp", "catalyst", "skorch", "fastai", "keras",
                       "ultralytics", "torchtune", "deepspeed", "pytorch_accelerated", "nemo", "speechbrain"}
_PROJECT_FRAMEWORK_RE = re.compile(
    r"^(transformers|trl|lightning|pytorch_lightning|accelerate|diffusers)(\.[\w.]*)?\."
    r"\w*(Trainer|LightningModule|Callback|TrainerCallback|Pipeline)$")
_FRAMEWORK_BASES = re.compile(r"(LightningModule|Trainer|Callback|LightningDataModule|TrainerCallback|Pipeline|Evaluator|Predictor)$")


def final(name: Optional[str]) -> str:
    return (name or "").rsplit(".", 1)[-1]


def root_name(expr: cst.BaseExpression) -> Optional[str]:
    """``a`` for ``a``, ``a.b``, ``a[0].c``, ``a.b(...)``; None otherwise."""
    while True:
        if isinstance(expr, cst.Name):
            return expr.value
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            expr = expr.value
        elif isinstance(expr, cst.Call):
            expr = expr.func
        else:
            return None


def names_in(node: cst.CSTNode) -> set[str]:
    """Every plain Name read in ``node`` (attribute names excluded)."""
    out: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Name(self, n: cst.Name) -> None:
            out.add(n.value)

        def visit_Attribute(self, n: cst.Attribute) -> bool:
            walk(n.value, self)
            return False

    walk(node, V())
    return out


def target_names(t: cst.BaseExpression) -> list[str]:
    if isinstance(t, cst.Name):
        return [t.value]
    if isinstance(t, (cst.Tuple, cst.List)):
        out: list[str] = []
        for el in t.elements:
            out.extend(target_names(el.value))
        return out
    if isinstance(t, cst.StarredElement):
        return target_names(t.value)
    return []


_LOOP_T = (cst.For, cst.While)
_ASSIGN_T = (cst.Assign, cst.AugAssign, cst.AnnAssign)
_RET_T = (cst.Return, cst.Yield)


def _walk(flow: "EvalFlow", root: cst.Module) -> None:
    """One iterative pre-order walk over dataclass fields (several times faster than a libcst visitor): parents,
    pre-order numbers, end numbers, scopes, and the per-kind indexes. Maps are keyed by ``id(node)``."""
    parent, order, end, scope_of = flow.parent.d, flow.order.d, flow.end.d, flow.scope.d
    calls, loops, withs, functions = flow.calls, flow.loops, flow.withs, flow.functions
    calls_by_final, assigns, names, returns = flow.calls_by_final, flow.assigns, flow.names, flow.returns
    n = 0
    stack: list = [(root, None, None)]
    leave = _LEAVE
    Call, Name, With, FunctionDef = cst.Call, cst.Name, cst.With, cst.FunctionDef
    while stack:
        node, par, scope = stack.pop()
        if scope is leave:
            end[id(node)] = n - 1
            continue
        key = id(node)
        if par is not None:
            parent[key] = par
        order[key] = n
        n += 1
        tp = type(node)
        inner = scope
        if tp is Call:
            calls.append(node)
            scope_of[key] = scope
            nm = final(call_name(node))
            if nm:
                calls_by_final.setdefault(nm, []).append(node)
        elif tp is Name:
            names.setdefault(scope, []).append(node)
        elif tp in _LOOP_T:
            loops.append(node)
            scope_of[key] = scope
        elif tp is With:
            withs.append(node)
            scope_of[key] = scope
        elif tp in _ASSIGN_T:
            scope_of[key] = scope
            assigns.setdefault(scope, []).append(node)
        elif tp in _RET_T:
            returns.setdefault(scope, []).append(node)
        elif tp is FunctionDef:
            scope_of[key] = scope
            functions.append(node)
            inner = node
        stack.append((node, None, leave))
        for k in reversed(children(node)):
            stack.append((k, node, inner))
    return n


def walk_with_index(root: cst.CSTNode) -> tuple:
    """``_walk`` of ``root`` fused with ``FileContext.index``'s walk (``bertlint/context.py``): one pass fills both,
    the same tables in the same order as the two walks one after the other. Returns (nodes by type in pre-order,
    ``id(node)`` -> parent, ``id(node)`` -> children, the walk tables as a ``_Piece``); the parents dict is the
    piece's ``parent.d`` (shared, read only)."""
    from bertlint.analysis.walk import _children as kids_of_node

    p = _Piece()
    parent, order, end, scope_of = p.parent.d, p.order.d, p.end.d, p.scope.d
    loops, calls_by_final, assigns, names, returns = p.loops, p.calls_by_final, p.assigns, p.names, p.returns
    by_type: dict[type, list] = {}
    kids_of: dict[int, list] = {}
    n = 0
    stack: list = [(root, None)]
    leave = _LEAVE
    pop, push = stack.pop, stack.append
    Call, Name, With, FunctionDef, Attribute = cst.Call, cst.Name, cst.With, cst.FunctionDef, cst.Attribute
    loop_t, assign_t, ret_t = _LOOP_T, _ASSIGN_T, _RET_T
    while stack:
        node, scope = pop()
        if scope is leave:
            end[id(node)] = n - 1
            continue
        key = id(node)
        order[key] = n
        n += 1
        tp = type(node)
        got = by_type.get(tp)
        if got is None:
            by_type[tp] = [node]
        else:
            got.append(node)
        inner = scope
        if tp is Name:
            got = names.get(scope)
            if got is None:
                names[scope] = [node]
            else:
                got.append(node)
            # a Name's only field read is its text: no children (``walk._children`` gives [])
            kids_of[key] = []
            end[key] = n - 1
            continue
        if tp is Attribute:  # its fields read, in order: value, attr (``walk._children``)
            kids = [node.value, node.attr]
            kids_of[key] = kids
            push((node, leave))
            parent[id(kids[1])] = node
            push((kids[1], scope))
            parent[id(kids[0])] = node
            push((kids[0], scope))
            continue
        if tp is Call:
            scope_of[key] = scope
            nm = final(call_name(node))
            if nm:
                calls_by_final.setdefault(nm, []).append(node)
        elif tp in loop_t:
            loops.append(node)
            scope_of[key] = scope
        elif tp is With:
            scope_of[key] = scope
        elif tp in assign_t:
            scope_of[key] = scope
            assigns.setdefault(scope, []).append(node)
        elif tp in ret_t:
            returns.setdefault(scope, []).append(node)
        elif tp is FunctionDef:
            scope_of[key] = scope
            inner = node
        kids = kids_of_node(node)
        kids_of[key] = kids
        if not kids:  # a leaf ends where it starts (half of the nodes: no leave step)
            end[key] = n - 1
            continue
        push((node, leave))
        for k in reversed(kids):
            parent[id(k)] = node
            push((k, inner))
    p.calls = list(by_type.get(Call, ()))
    p.withs = list(by_type.get(With, ()))
    p.functions = list(by_type.get(FunctionDef, ()))
    p.count = n
    return by_type, parent, kids_of, p


class _Piece:
    """The walk tables of one top-level statement, numbered from 0 (``_walk_reusing``)."""

    def __init__(self) -> None:
        self.parent, self.order, self.end, self.scope = _IdMap(), _IdMap(), _IdMap(), _IdMap()
        self.calls, self.loops, self.withs, self.functions = [], [], [], []
        self.calls_by_final, self.assigns, self.names, self.returns = {}, {}, {}, {}
        self.count = 0


def _walk_piece(stmt: cst.CSTNode) -> _Piece:
    p = _Piece()
    p.count = _walk(p, stmt)  # type: ignore[arg-type]
    return p


def _walk_reusing(flow: "EvalFlow", root: cst.Module, reuse, filename: str) -> bool:
    """``_walk`` of ``root`` from the walks of its top-level statements (``reuse``: the language server's
    ``bertlint.stmtcache.StatementCache``, which keeps them for the statement objects of the last lint): a
    statement's numbers shifted by the nodes before it, every table in the order one walk fills it. False when the
    module's children are not its statements (then ``_walk`` runs)."""
    body = root.body
    kids = children(root)
    if len(kids) != len(body) or any(a is not b for a, b in zip(kids, body)):
        return False
    try:
        pieces = reuse.pieces("evalflow", filename, body, _walk_piece)
    except AttributeError:  # ``_walk`` fills a table ``_Piece`` does not have (added since): one walk, as ever
        return False
    parent, order, end, scope_of = flow.parent.d, flow.order.d, flow.end.d, flow.scope.d
    order[id(root)] = 0
    n = 1
    for st, p in zip(body, pieces):
        parent[id(st)] = root
        parent.update(p.parent.d)
        od = p.order.d
        if len(od) == p.count:  # numbered 0, 1, ... in insertion order
            order.update(zip(od, range(n, n + p.count)))
        else:  # a node object met twice (never in a parsed tree): its last number, as the walk leaves it
            order.update({k: v + n for k, v in od.items()})
        end.update({k: v + n for k, v in p.end.d.items()})
        scope_of.update(p.scope.d)
        flow.calls.extend(p.calls)
        flow.loops.extend(p.loops)
        flow.withs.extend(p.withs)
        flow.functions.extend(p.functions)
        for mine, theirs in ((flow.calls_by_final, p.calls_by_final), (flow.assigns, p.assigns),
                             (flow.names, p.names), (flow.returns, p.returns)):
            for k, v in theirs.items():
                have = mine.get(k)
                if have is None:
                    mine[k] = list(v)
                else:
                    have.extend(v)
        n += p.count
    end[id(root)] = n - 1
    return True


class _IdMap:
    """A dict keyed by node identity (libcst's ``__hash__`` is a Python-level call)."""

    __slots__ = ("d",)

    def __init__(self) -> None:
        self.d: dict[int, object] = {}

    def get(self, node, default=None):
        return self.d.get(id(node), default)

    def __getitem__(self, node):
        return self.d[id(node)]

    def __contains__(self, node) -> bool:
        return id(node) in self.d

    def __setitem__(self, node, value) -> None:
        self.d[id(node)] = value


class _Leave:
    pass


_NOVALUE = object()  # a parameter a call site leaves without a (literal) value


_LEAVE = _Leave()


class EvalFlow:
    def __init__(self, module: cst.Module, symbols: SymbolTable, filename: str = "", reuse=None,
                 tables: Optional["_Piece"] = None) -> None:
        """``reuse``: the language server's per-statement cache (``bertlint.stmtcache``): the walk tables of the
        top-level statements the last lint of ``filename`` had are taken from there (same tables). ``tables``: the
        walk tables of the whole ``module`` already made (``walk_with_index``, by ``FileContext.index``)."""
        self.module = module
        self.symbols = symbols
        self.filename = filename
        self.parent = _IdMap()  # node -> parent node
        self.order = _IdMap()  # node -> pre-order number
        self.end = _IdMap()  # node -> largest pre-order number inside it
        self.scope = _IdMap()  # call / loop / with / assignment / def -> innermost enclosing function (None: module)
        self.calls: list[cst.Call] = []
        self.calls_by_final: dict[str, list[cst.Call]] = {}
        self.loops: list[Union[cst.For, cst.While]] = []
        self.withs: list[cst.With] = []
        self.functions: list[cst.FunctionDef] = []
        self.assigns: dict[Scope, list[cst.CSTNode]] = {}
        self.names: dict[Scope, list[cst.Name]] = {}
        self.returns: dict[Scope, list[cst.CSTNode]] = {}
        if tables is not None:
            self.parent, self.order, self.end, self.scope = tables.parent, tables.order, tables.end, tables.scope
            self.calls, self.loops, self.withs, self.functions = tables.calls, tables.loops, tables.withs, tables.functions
            self.calls_by_final, self.assigns = tables.calls_by_final, tables.assigns
            self.names, self.returns = tables.names, tables.returns
        elif reuse is None or type(module) is not cst.Module or not _walk_reusing(self, module, reuse, filename):
            _walk(self, module)
        self._call_orders = [self.order[c] for c in self.calls]
        self._grad_memo: dict[int, str] = {}
        self._fn_backward: dict[int, Optional[bool]] = {}
        self._model_memo: dict[tuple, bool] = {}

    # ------------------------------------------------------------------ basics
    @property
    def torch_file(self) -> bool:
        """The file uses torch (directly or through transformers & co.) and no other tensor framework."""
        mods = self.symbols.imported_modules
        if mods & _FOREIGN:
            return False
        if mods & {"torch", "transformers", "accelerate", "deepspeed", "lightning", "pytorch_lightning",
                   "peft", "sentence_transformers", "timm"}:
            return True
        # a file that imports only its own package (``from mypkg.utils import *``) is still a torch file when it
        # calls what only torch code calls
        return any(self.calls_by_final.get(n) for n in _TORCH_ONLY_CALLS)

    def inside(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        o = self.order.get(node)
        return o is not None and self.order[container] <= o <= self.end[container]

    def after(self, node: cst.CSTNode, ref: cst.CSTNode) -> bool:
        return self.order.get(node, -1) > self.end[ref]

    def before(self, node: cst.CSTNode, ref: cst.CSTNode) -> bool:
        return self.end.get(node, 1 << 60) < self.order[ref]

    def calls_in(self, node: cst.CSTNode) -> list[cst.Call]:
        lo = bisect.bisect_left(self._call_orders, self.order[node])
        hi = bisect.bisect_right(self._call_orders, self.end[node])
        return self.calls[lo:hi]

    def scope_of(self, node: cst.CSTNode) -> Scope:
        if node in self.scope:
            return self.scope[node]
        cur = self.parent.get(node)
        while cur is not None and not isinstance(cur, cst.FunctionDef):
            cur = self.parent.get(cur)
        return cur

    def enclosing(self, node: cst.CSTNode, types) -> Optional[cst.CSTNode]:
        """The nearest ancestor of one of ``types``, not crossing a function or class boundary."""
        cur = self.parent.get(node)
        while cur is not None:
            if isinstance(cur, types):
                return cur
            if isinstance(cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            cur = self.parent.get(cur)
        return None

    def loop_of(self, node: cst.CSTNode) -> Optional[Union[cst.For, cst.While]]:
        """The nearest enclosing loop whose *body* holds ``node`` (not its iterable or test)."""
        cur, child = self.parent.get(node), node
        while cur is not None:
            tc = type(cur)  # exact type tests: isinstance through ABCMeta is slow
            if (tc is cst.For or tc is cst.While) and child is cur.body:
                if tc is cst.For and cur.asynchronous is not None:
                    return None  # async iteration: not a torch data loop we understand
                return cur
            if tc is cst.FunctionDef or tc is cst.ClassDef or tc is cst.Lambda:
                return None
            child, cur = cur, self.parent.get(cur)
        return None

    def class_of(self, func: cst.FunctionDef) -> Optional[cst.ClassDef]:
        p = self.parent.get(func)
        if isinstance(p, cst.IndentedBlock):
            p = self.parent.get(p)
        return p if isinstance(p, cst.ClassDef) else None

    def qual(self, expr: cst.BaseExpression) -> Optional[str]:
        return self.symbols.qualname(expr) or dotted(expr)

    # ------------------------------------------------------------------ grad mode
    def ctx_kind(self, expr: cst.BaseExpression) -> Optional[str]:
        """What a ``with`` item or a decorator does to grad mode: DISABLED, "inference", ENABLED, UNKNOWN or None
        (nothing known to touch grad mode)."""
        if isinstance(expr, cst.Call):
            target = expr.func
        else:
            target = expr
        name = self.qual(target) if isinstance(target, (cst.Name, cst.Attribute)) else None
        last = final(name)
        if last == "no_grad":
            return DISABLED
        if last == "enable_grad":
            return ENABLED
        if last == "inference_mode":
            if isinstance(expr, cst.Call) and expr.args:
                v = literal(expr.args[0].value)
                if v is False:
                    return None
                if v is not True:
                    return UNKNOWN
            return "inference"
        if last in ("set_grad_enabled", "_set_grad_enabled"):
            if isinstance(expr, cst.Call) and expr.args:
                v = literal(expr.args[0].value)
                if v is False:
                    return DISABLED
                if v is True:
                    return ENABLED
            return UNKNOWN
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Name):
            # a context manager of this file that disables grad inside
            for fn in self.symbols.functions.get(expr.func.value, []):
                if any(final(call_name(c)) in ("no_grad", "inference_mode", "set_grad_enabled")
                       for c in self.calls_in(fn)):
                    return UNKNOWN
        if last and ("grad" in last.lower() or "inference" in last.lower()):
            return UNKNOWN  # a helper named like a grad-mode switch (`@no_grad_eval`, `with maybe_no_grad(...)`)
        if isinstance(expr, (cst.Name, cst.Attribute)):
            # `@eval_mode` / `@self.evaluating`: a decorator or manager of this file that disables grad inside
            for fn in self.symbols.functions.get(final(dotted(expr)), []):
                if any(final(call_name(c)) in ("no_grad", "inference_mode", "set_grad_enabled")
                       for c in self.calls_in(fn)):
                    return UNKNOWN
        if isinstance(expr, cst.Name):
            # `with ctx:` where ctx = torch.no_grad() if ... else nullcontext()
            for a in self.symbols.assignments.get(expr.value, []):
                code = self.module.code_for_node(a.value)
                if "no_grad" in code or "inference_mode" in code or "set_grad_enabled" in code:
                    return UNKNOWN
        if not isinstance(expr, (cst.Call, cst.Name, cst.Attribute)):
            # `with torch.no_grad() if not train else nullcontext():` and other computed managers
            code = self.module.code_for_node(expr)
            if "no_grad" in code or "inference_mode" in code or "set_grad_enabled" in code:
                return UNKNOWN
            return None
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute):
            # e.g. `with contextlib.ExitStack()` / `with self.eval_context()`: unknown helpers of the file
            attr = expr.func.attr.value
            for fn in self.symbols.functions.get(attr, []):
                if any(final(call_name(c)) in ("no_grad", "inference_mode", "set_grad_enabled")
                       for c in self.calls_in(fn)):
                    return UNKNOWN
        return None

    def _toggles(self, scope: Scope) -> bool:
        """Statement-level grad switches in ``scope`` (``torch.set_grad_enabled(False)``, ``no_grad().__enter__()``)."""
        for nm in ("set_grad_enabled", "_set_grad_enabled", "__enter__", "enter_context", "enter_async_context"):
            for c in self.calls_by_final.get(nm, []):
                if self.scope.get(c) is scope and not isinstance(self.parent.get(self.parent.get(c)), cst.With):
                    if nm in ("set_grad_enabled", "_set_grad_enabled"):
                        return True
                    code = self.module.code_for_node(c)
                    if "grad" in code or "inference" in code:
                        return True
        return False

    def grad_state(self, node: cst.CSTNode, _depth: int = 0) -> str:
        """ENABLED, DISABLED (no_grad / inference_mode at some enclosing level, including a decorator or every
        visible caller) or UNKNOWN."""
        key = id(node)
        if _depth == 0 and key in self._grad_memo:
            return self._grad_memo[key]
        res = self._grad_state(node, _depth)
        if _depth == 0:
            self._grad_memo[key] = res
        return res

    def _grad_state(self, node: cst.CSTNode, depth: int) -> str:
        cur, child = self.parent.get(node), node
        while cur is not None:
            if isinstance(cur, cst.With) and child is cur.body:
                kinds = [self.ctx_kind(it.item) for it in cur.items]
                if DISABLED in kinds or "inference" in kinds:
                    return DISABLED
                if UNKNOWN in kinds:
                    return UNKNOWN
                if ENABLED in kinds:
                    return ENABLED
            elif isinstance(cur, cst.Lambda):
                return UNKNOWN
            elif isinstance(cur, cst.FunctionDef):
                kinds = [self.ctx_kind(d.decorator) for d in cur.decorators]
                if DISABLED in kinds or "inference" in kinds:
                    return DISABLED
                if UNKNOWN in kinds:
                    return UNKNOWN
                if ENABLED in kinds:
                    return ENABLED
                if self._toggles(cur) or self._toggles(None):
                    return UNKNOWN  # a switch in the function, or a module-level one (set at import time)
                return self._callers_state(cur, depth)
            child, cur = cur, self.parent.get(cur)
        if self._toggles(None):
            return UNKNOWN
        return ENABLED

    def call_sites(self, func: cst.FunctionDef) -> Optional[list[cst.Call]]:
        """Calls of ``func`` in this file (by name; methods through any ``x.name(...)``). None when the function
        is also referenced without being called (a callback): its callers are then unknown."""
        memo = self.__dict__.setdefault("_sites_memo", {})
        if id(func) in memo:
            return memo[id(func)]
        res = self._call_sites(func)
        memo[id(func)] = res
        return res

    def _names_by_value(self) -> dict[str, list[cst.Name]]:
        idx = self.__dict__.get("_names_idx")
        if idx is None:
            idx = {}
            for scope_names in self.names.values():
                for nm in scope_names:
                    idx.setdefault(nm.value, []).append(nm)
            self.__dict__["_names_idx"] = idx
        return idx

    def _call_sites(self, func: cst.FunctionDef) -> Optional[list[cst.Call]]:
        name = func.name.value
        is_method = self.class_of(func) is not None
        sites = []
        for c in self.calls_by_final.get(name, []):
            if isinstance(c.func, cst.Name) and not is_method:
                sites.append(c)
            elif isinstance(c.func, cst.Attribute):
                recv = dotted(c.func.value) or ""
                if is_method and recv.startswith(("self.", "cls.")):
                    continue  # `self.model.train()`: another object's method of the same name
                if not is_method and recv.split(".")[0] not in self.symbols.imports:
                    # a module-level `def train(...)` is reached as `train(...)` or through a module alias
                    # (`engine.train(...)`); `model.train()` on a local object is that object's own method
                    continue
                sites.append(c)
        refs = []
        for nm in self._names_by_value().get(name, ()):
            p = self.parent.get(nm)
            if p is func or isinstance(p, cst.ImportAlias):
                continue
            if isinstance(p, (cst.FunctionDef, cst.ClassDef)) and p.name is nm:
                continue  # another definition with the same name
            if isinstance(p, cst.Arg) and p.keyword is nm or isinstance(p, cst.Param) and p.name is nm:
                continue  # `f(train=False)`, `def g(train)`: a keyword / parameter of the same name
            if is_method and not isinstance(p, cst.Attribute):
                continue  # a method is reached through `self.name` / `obj.name`, never a bare name
            if isinstance(p, cst.Call) and p.func is nm:
                continue
            if isinstance(p, cst.Attribute) and p.attr is nm:
                gp = self.parent.get(p)
                if isinstance(gp, cst.Call) and gp.func is p:
                    continue
                if not is_method or dotted(p.value) not in ("self", "cls"):
                    continue  # `cfg.datasets.train`: another object's attribute, not this function
            refs.append(nm)  # referenced without being called: handed to a thread, a launcher, a callback, ...
        self.__dict__.setdefault("_refs_memo", {})[id(func)] = (sites, refs)
        if refs:
            return None
        return sites

    def handed_state(self, func: cst.FunctionDef, depth: int = 0) -> str:
        """Grad mode ``func`` starts in when it is referenced without being called: handed to ``mp.spawn`` /
        ``Thread(target=...)`` / a process pool (a new thread or process starts with grad on: grad mode is
        thread-local), through ``functools.partial``, or as a callback to a call running with grad on. UNKNOWN for
        hooks (they run inside someone's forward), aliases, containers, or a call that runs under no_grad."""
        self.call_sites(func)
        sites, refs = self.__dict__.get("_refs_memo", {}).get(id(func), ([], []))
        if not refs:
            return ENABLED
        for r in refs:
            if self._ref_state(r, depth) != ENABLED:
                return UNKNOWN
        return ENABLED

    def _ref_state(self, node: cst.CSTNode, depth: int) -> str:
        if depth > 4:
            return UNKNOWN
        arg = self.parent.get(node)
        if isinstance(arg, cst.Attribute) and arg.attr is node:  # `self.evaluate` handed on
            node, arg = arg, self.parent.get(arg)
        if not isinstance(arg, cst.Arg) or arg.value is not node:
            return UNKNOWN
        call = self.parent.get(arg)
        if not isinstance(call, cst.Call):
            return UNKNOWN
        q = self.qual(call.func) if isinstance(call.func, (cst.Name, cst.Attribute)) else None
        last = final(q) if q else (call.func.attr.value if isinstance(call.func, cst.Attribute) else "")
        if last in _NEW_THREAD_CALLS or (last in ("submit", "map", "apply_async", "map_async", "starmap", "imap")
                                         and isinstance(call.func, cst.Attribute)
                                         and dotted(call.func.value) not in (None, "builtins")
                                         and self._pool_like(call.func.value)):
            return ENABLED
        if "hook" in last.lower() or last in ("apply", "register", "checkpoint"):
            return UNKNOWN  # runs inside a forward / backward of somebody else's
        if last == "partial":
            # functools.partial(f, ...): the partial object's own fate decides
            up = self.parent.get(call)
            if isinstance(up, cst.Arg):
                return self._ref_state(call, depth + 1)
            if isinstance(up, cst.Assign) and len(up.targets) == 1 and isinstance(up.targets[0].target, cst.Name):
                return self._name_uses_state(up.targets[0].target.value, self.scope.get(up), up, depth + 1)
            return UNKNOWN
        st = self._grad_state(call, depth + 1)
        return ENABLED if st == ENABLED else UNKNOWN

    def _pool_like(self, expr: cst.BaseExpression) -> bool:
        d = (dotted(expr) or "").lower()
        return any(t in d for t in ("pool", "executor"))

    def _name_uses_state(self, name: str, scope: Scope, after: cst.CSTNode, depth: int) -> str:
        """Grad mode at every use of a local name bound to a partial: its calls and hand-overs."""
        uses = [n for n in self.names.get(scope, []) if n.value == name and self.order.get(n, -1) > self.end[after]]
        if not uses:
            return UNKNOWN
        for n in uses:
            p = self.parent.get(n)
            if isinstance(p, cst.Call) and p.func is n:
                if self._grad_state(p, depth + 1) != ENABLED:
                    return UNKNOWN
            elif self._ref_state(n, depth + 1) != ENABLED:
                return UNKNOWN
        return ENABLED

    def _callers_state(self, func: cst.FunctionDef, depth: int) -> str:
        if depth > 4:
            return UNKNOWN
        sites = self.call_sites(func)
        if sites is None:
            if self.handed_state(func, depth) != ENABLED:
                return UNKNOWN
            sites = self.__dict__["_refs_memo"][id(func)][0]
        for s in sites:
            if self.inside(s, func):  # recursion
                continue
            st = self._grad_state(s, depth + 1)
            if st != ENABLED:
                return UNKNOWN
        return ENABLED

    def inference_block(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The nearest enclosing ``with torch.inference_mode():`` (or a function decorated with it) that decides
        grad mode for ``node``, if that is inference mode; None otherwise."""
        cur, child = self.parent.get(node), node
        while cur is not None:
            if isinstance(cur, cst.With) and child is cur.body:
                kinds = [self.ctx_kind(it.item) for it in cur.items]
                if "inference" in kinds and self._is_torch_inference(cur.items):
                    return cur
                if any(k is not None for k in kinds):
                    return None
            elif isinstance(cur, cst.FunctionDef):
                for d in cur.decorators:
                    if self.ctx_kind(d.decorator) == "inference" and self._is_torch_inference([d]):
                        return cur
                return None
            child, cur = cur, self.parent.get(cur)
        return None

    def _is_torch_inference(self, items) -> bool:
        for it in items:
            e = it.item if isinstance(it, cst.WithItem) else it.decorator
            t = e.func if isinstance(e, cst.Call) else e
            q = self.symbols.qualname(t) if isinstance(t, (cst.Name, cst.Attribute)) else None
            if q and q.startswith("torch.") and q.endswith("inference_mode"):
                return True
        return False

    # ------------------------------------------------------------------ models, losses
    def is_model_name(self, name: str, scope: Scope) -> bool:
        key = (name, id(scope))
        if key in self._model_memo:
            return self._model_memo[key]
        self._model_memo[key] = False  # recursion guard
        res = self._is_model_name(name, scope)
        self._model_memo[key] = res
        return res

    def _name_looks_like_model(self, name: str) -> bool:
        last = name.rsplit(".", 1)[-1]
        if not _MODEL_NAME.search(last):
            return False
        tokens = set(last.lower().split("_"))
        return not (tokens & _NOT_MODEL_TOKENS)

    def _assigns_of(self, name: str, scope: Scope) -> list:
        """The assignments of ``name`` that ``scope`` sees: its own, else for ``self.x`` those of the class's
        methods, else the module level's."""
        assigns = self.symbols.assignments_of(name, scope)
        if not assigns and scope is not None and name.startswith("self."):
            # `self.model = X.from_pretrained(...)` in `__init__`, read in another method of the class
            cls = self.symbols.method_class.get(id(scope))
            if cls is not None:
                assigns = [a for a in self.symbols.assignments.get(name, [])
                           if a.func is not None and self.symbols.method_class.get(id(a.func)) is cls]
        if not assigns and scope is not None:
            assigns = [a for a in self.symbols.assignments.get(name, []) if a.func is None]
        return assigns

    def _is_model_name(self, name: str, scope: Scope) -> bool:
        assigns = self._assigns_of(name, scope)
        verdicts = [self.model_value(a.value, a.func) for a in assigns]
        if any(v is True for v in verdicts):
            return True
        if assigns and all(v is False for v in verdicts):
            return False
        if name in self.symbols.imports or (name in self.symbols.functions and "." not in name) or \
                name in self.symbols.classes:
            return False
        return self._name_looks_like_model(name)

    def model_value(self, value: cst.BaseExpression, scope: Scope) -> Optional[bool]:
        """True: builds a model; False: certainly not a model; None: cannot tell."""
        if isinstance(value, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.Integer,
                              cst.Float, cst.List, cst.Dict, cst.Tuple, cst.Set, cst.ListComp, cst.DictComp)):
            return False
        if isinstance(value, cst.Name) and value.value in ("None", "True", "False"):
            return False
        if isinstance(value, (cst.Name, cst.Attribute)):
            d = dotted(value)
            return True if d and self.is_model_name(d, scope) else None
        if isinstance(value, cst.Lambda):
            # `model = lambda x: ...`: a forward only if its body calls something model-like
            if value not in self.order:
                return None
            for c in self.calls_in(value):
                if isinstance(c.func, (cst.Name, cst.Attribute)):
                    d = dotted(c.func)
                    if d and self.is_model_name(d, scope):
                        return None
            return False
        if not isinstance(value, cst.Call):
            return None
        func = value.func
        q0 = self.qual(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
        if q0 and q0.split(".")[0] in _NO_GRAPH_LIBS:
            return False
        if q0 == "torch.hub.load" and value.args and isinstance(value.args[0].value, cst.SimpleString) and \
                str(literal(value.args[0].value) or "").startswith("ultralytics/"):
            return False  # yolov5's hub model: AutoShape.forward runs under inference mode
        if isinstance(func, cst.Attribute):
            meth = func.attr.value
            if meth in ("to", "cuda", "half", "float", "bfloat16", "double", "eval", "train", "requires_grad_",
                        "cpu", "module"):
                d = dotted(func.value)
                if d and self.is_model_name(d, scope):
                    return True
                inner = func.value
                if isinstance(inner, cst.Call):
                    return self.model_value(inner, scope)
                return None
            if meth == "from_pretrained":
                cls = final(dotted(func.value))
                if _NOT_MODEL_CTOR.search(cls):
                    return False
                if self._compiled_runtime(func.value):
                    return False
                recv = func.value
                if isinstance(recv, cst.Name) and recv.value[:1].islower() and recv.value not in self.symbols.imports \
                        and recv.value not in self.symbols.classes:
                    # `tokenizer_class.from_pretrained(...)`: a class held in a variable (`config_class, model_class,
                    # tokenizer_class = MODEL_CLASSES[model_type]`); tokenizers, configs and processors have
                    # `from_pretrained` too, so the call alone does not say it builds a model: the variable's name
                    # may say what it holds, else the bound name decides
                    tokens = set(recv.value.lower().split("_"))
                    if tokens & {"tokenizer", "processor", "config", "extractor", "feature"}:
                        return False
                    return None
                return True
        q = self.qual(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
        last = final(q)
        if not last:
            return None
        if q == "transformers.pipeline" or last == "pipeline":
            return False
        if _NOT_MODEL_CTOR.search(last):
            return False
        if last == "compile" and not (q or "").startswith("torch"):
            return None
        if last in ("unwrap_model", "compile", "DistributedDataParallel", "DataParallel", "DDP",
                    "FullyShardedDataParallel", "FSDP", "get_peft_model", "prepare_model_for_kbit_training"):
            return True
        if q and q.startswith("torch.nn.") and last[:1].isupper() and not last.endswith("Loss"):
            return True
        if last in self.symbols.classes:
            bases = " ".join(self.symbols.class_bases.get(last, []))
            if re.search(r"Module|PreTrained|Model|Lightning", bases):
                return True
        if _MODEL_CTOR.search(last):
            return True
        return None

    def is_forward(self, call: cst.Call) -> bool:
        """``model(...)`` / ``self.model(...)`` / ``model.forward(...)`` on something that is a model."""
        func = call.func
        step = False
        if isinstance(func, cst.Attribute) and func.attr.value == "forward":
            func = func.value
        elif isinstance(func, cst.Attribute) and func.attr.value in _STEP_METHODS:
            # `module.validation_step(batch, i)` called by the user's own loop: the LightningModule-style step runs
            # the model's forwards, with whatever grad mode the caller has (Lightning's loops are not involved)
            func, step = func.value, True
        if not isinstance(func, (cst.Name, cst.Attribute)):
            return False
        d = dotted(func)
        if step:
            return bool(d) and d != "self" and d != "super" and (
                self.is_model_name(d, self.scope_of(call)) or self._mode_switched(d))
        if d == "self":
            return self._self_forward(call)
        if not d or d == "super":
            return False
        if not step and self._method_forward(call) is not None:
            return True
        if not step and self._own_method(call) is not None:
            # `self.eval_model(data)`: a method of the enclosing class, not a module attribute; its own forwards are
            # judged where they are, with the grad mode of this call
            return False
        if isinstance(self.parent.get(call), cst.Await):
            return False
        head = d.split(".")[0]
        if head in self.symbols.imports and head != "self":
            return False
        scope = self.scope_of(call)
        if self._evaled(d):
            return True
        if not self.is_model_name(d, scope):
            return False
        if not call.args and "." in d and not self._built_as_model(d, scope):
            # ``completion.model_message()``, ``request.model_dump()``: a method named like a model, called with no
            # input, of an object nothing shows to be a model: a getter, not a forward (a network's forward takes its
            # inputs)
            return False
        return True

    def _built_as_model(self, name: str, scope: Scope) -> bool:
        """Some assignment of ``name`` (in ``scope``, the class's ``__init__`` for ``self.x``, or at module level)
        builds a model (``model_value``): known as one by what it is, not by its name alone."""
        return any(self.model_value(a.value, a.func) is True for a in self._assigns_of(name, scope))

    def _method_forward(self, call: cst.Call, depth: int = 0) -> Optional[cst.Call]:
        """``self.infer(x)`` where the enclosing class's one ``infer`` method returns a forward on every path
        (``return self.module_(x)``): the inner forward call, else None."""
        if depth > 2:
            return None
        method = self._own_method(call)
        if method is None:
            return None
        memo = self.__dict__.setdefault("_mfwd_memo", {})
        if id(method) in memo:
            return memo[id(method)]
        memo[id(method)] = None  # recursion guard
        rets = [r for r in self.returns.get(method, []) if isinstance(r, cst.Return)]
        inner = None
        if rets and all(isinstance(r.value, cst.Call) for r in rets):
            fwds = []
            for r in rets:
                c = r.value
                if self._method_forward(c, depth + 1) is not None:
                    fwds.append(self._method_forward(c, depth + 1))
                elif self._own_method(c) is None and self.is_forward(c):
                    fwds.append(c)
                else:
                    fwds = []
                    break
            inner = fwds[0] if fwds else None
            if inner is not None and any(not self._caller_grad_mode(f, method) for f in fwds):
                inner = None  # `with torch.set_grad_enabled(training): return self.module_(x)`: its own mode
        memo[id(method)] = inner
        return inner

    def _caller_grad_mode(self, call: cst.CSTNode, method: cst.FunctionDef) -> bool:
        """``call`` in ``method`` runs with its caller's grad mode: no grad-mode ``with`` or decorator between."""
        if any(self.ctx_kind(d.decorator) is not None for d in method.decorators):
            return False
        cur, child = self.parent.get(call), call
        while cur is not None and cur is not method:
            if isinstance(cur, cst.With) and child is cur.body and \
                    any(self.ctx_kind(it.item) is not None for it in cur.items):
                return False
            child, cur = cur, self.parent.get(cur)
        return True

    def forward_receiver_of(self, call: cst.Call) -> Optional[str]:
        """The model a forward runs: ``model`` for ``model(x)``; for ``self.infer(x)`` (a method returning a
        forward) the receiver of that forward (``self.module_``)."""
        inner = self._method_forward(call) if isinstance(call.func, cst.Attribute) else None
        return forward_receiver(inner if inner is not None else call)

    def _evaled(self, name: str) -> bool:
        """``name.eval()`` (or ``name.train(False)``, ``name.train(flag)`` with ``flag=False`` by default) is called
        in the file (an ``nn.Module``: nothing else has that method), and ``name`` is an attribute or a local binding,
        not an imported object."""
        memo = self.__dict__.setdefault("_evaled_memo", {})
        if name not in memo:
            memo[name] = any(isinstance(c.func, cst.Attribute) and dotted(c.func.value) == name and not c.args
                             for c in self.calls_by_final.get("eval", [])) or any(
                isinstance(c.func, cst.Attribute) and dotted(c.func.value) == name and self._train_false(c)
                for c in self.calls_by_final.get("train", []))  # `module.train(False)`: nn.Module.train(mode)
        return memo[name]

    def _mode_switched(self, name: str) -> bool:
        """``name.eval()`` or ``name.train()`` is called somewhere in the file: it is a module."""
        for m in ("eval", "train"):
            for c in self.calls_by_final.get(m, []):
                if isinstance(c.func, cst.Attribute) and dotted(c.func.value) == name:
                    return True
        return False

    def _self_forward(self, call: cst.Call) -> bool:
        """``self(x)`` / ``self.forward(x)`` in a method (not ``forward`` itself) of an ``nn.Module`` subclass."""
        scope = self.scope_of(call)
        if scope is None or scope.name.value in ("forward", "__call__", "_call_impl"):
            return False
        cls = self.class_of(scope)
        return cls is not None and self.module_family(cls) is not None

    def module_family(self, cls: cst.ClassDef) -> Optional[str]:
        """"module" / "lightning" / "pretrained" when ``cls``'s bases reach ``torch.nn.Module`` (``nn.Module``,
        ``PreTrainedModel``, ``LightningModule``) through this file's classes and imports; None otherwise."""
        memo = self.__dict__.setdefault("_family_memo", {})
        key = id(cls)
        if key not in memo:
            memo[key] = None
            memo[key] = self._module_family(cls, 0)
        return memo[key]

    def _module_family(self, cls: cst.ClassDef, depth: int) -> Optional[str]:
        roles = getattr(self, "roles", None)
        if roles is not None:
            try:
                fam = roles.class_family(cls)
            except Exception:
                fam = None
            if fam:
                low = str(fam).lower()
                if "lightning" in low:
                    return "lightning"
                if "pretrained" in low or "model" in low or "module" in low:
                    return "module" if "pretrained" not in low else "pretrained"
        for b in cls.bases:
            q = self.symbols.qualname(b.value) or dotted(b.value) or ""
            last = final(q)
            if q in ("torch.nn.Module", "nn.Module", "torch.nn.modules.module.Module") or \
                    (last == "Module" and q.startswith(("torch.", "nn."))):
                return "module"
            if last in ("LightningModule",):
                return "lightning"
            if last.endswith("PreTrainedModel") or last == "PreTrainedModel":
                return "pretrained"
            if last == "ModelMixin" and q.startswith("diffusers."):
                return "module"  # diffusers' ModelMixin is a torch.nn.Module (UNet2DConditionModel, AutoencoderKL)
            if q.startswith("torch.nn.") and last[:1].isupper():
                return "module"  # nn.Sequential, nn.ModuleList, ...
            local = self.symbols.classes.get(dotted(b.value) or "")
            if local is not None and local is not cls and depth < 6:
                fam = self._module_family(local, depth + 1)
                if fam:
                    return fam
        return None

    def module_class(self, name: str, scope: Scope) -> Optional[str]:
        """The torch.nn class a name was built from (``nn.Linear``, ``nn.Sequential(nn.Linear(...), ...)``'s first
        layer), or ``"hf"`` for a transformers model; None if unknown."""
        assigns = self.symbols.assignments_of(name, scope)
        if not assigns and scope is not None:
            assigns = [a for a in self.symbols.assignments.get(name, []) if a.func is None]
        kinds = set()
        for a in assigns:
            kinds.add(self._module_kind(a.value, a.func, 0))
        if len(kinds) == 1:
            return kinds.pop()
        return None

    def _module_kind(self, v: cst.BaseExpression, scope: Scope, depth: int) -> Optional[str]:
        if depth > 4 or not isinstance(v, cst.Call):
            if isinstance(v, (cst.Name, cst.Attribute)) and dotted(v) and depth <= 4:
                return self.module_class(dotted(v), scope) if depth < 3 else None
            return None
        func = v.func
        if isinstance(func, cst.Attribute) and func.attr.value in ("to", "cuda", "train", "float"):
            return self._module_kind(func.value, scope, depth + 1)
        if isinstance(func, cst.Attribute) and func.attr.value == "from_pretrained":
            q = self.symbols.qualname(func.value) or ""
            if q.startswith("transformers.") and not _NOT_MODEL_CTOR.search(q):
                return "hf"
            return None
        q = self.symbols.qualname(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
        if not q:
            return None
        last = final(q)
        if q.startswith("torch.nn.") and last in _SAVING_MODULES:
            return last
        if q.startswith("torch.nn.") and last == "Sequential" and v.args:
            return self._module_kind(v.args[0].value, scope, depth + 1)
        if q.startswith("transformers.") and re.search(r"(Model|For[A-Z])", last) and not _NOT_MODEL_CTOR.search(last):
            return "hf"
        return None

    def loss_kind(self, call: cst.Call) -> Optional[str]:
        """"saving" for a torch loss known to save its target for backward, "loss" for another loss or a criterion
        named like one, None otherwise."""
        func = call.func
        if isinstance(func, cst.Call):  # nn.CrossEntropyLoss()(a, b)
            q = self.symbols.qualname(func.func) if isinstance(func.func, (cst.Name, cst.Attribute)) else None
            if q and q.startswith("torch.nn.") and final(q) in SAVING_LOSS_CLASSES:
                return "saving"
            return "loss" if q and final(q).endswith("Loss") else None
        if not isinstance(func, (cst.Name, cst.Attribute)):
            return None
        q = self.symbols.qualname(func)
        if q and q.startswith("torch.") and final(q) in _LOSS_FUNCS:
            return "saving" if final(q) in SAVING_LOSS_FUNCS else "loss"
        d = dotted(func) or ""
        scope = self.scope_of(call)
        assigns = self.symbols.assignments_of(d, scope) or [a for a in self.symbols.assignments.get(d, [])
                                                             if a.func is None]
        for a in assigns:
            if isinstance(a.value, cst.Call) and isinstance(a.value.func, (cst.Name, cst.Attribute)):
                aq = self.symbols.qualname(a.value.func)
                if aq and aq.startswith("torch.nn.") and final(aq) in SAVING_LOSS_CLASSES:
                    return "saving"
        last = final(d).lower()
        if "loss" in last or "criterion" in last:
            return "loss"
        return None

    # ------------------------------------------------------------------ backward / training
    def is_backward_call(self, c: cst.Call) -> bool:
        name = call_name(c)
        last = final(name) if name else (c.func.attr.value if isinstance(c.func, cst.Attribute) else "")
        if last in _BACKWARD_CALLS:
            return True
        if name in ("torch.autograd.grad", "autograd.grad"):
            return True
        q = self.symbols.qualname(c.func) if isinstance(c.func, (cst.Name, cst.Attribute)) else None
        return q in ("torch.autograd.grad", "torch.autograd.backward")

    def _is_train_call(self, c: cst.Call) -> bool:
        if self.is_backward_call(c):
            return True
        if isinstance(c.func, cst.Attribute):
            attr = c.func.attr.value
            if attr == "zero_grad":
                return True
            if attr == "step":
                recv = dotted(c.func.value) or ""
                if _TRAIN_STEP_RECEIVER.search(recv.rsplit(".", 1)[-1]):
                    return True
        return False

    def has_backward(self, node: cst.CSTNode) -> bool:
        """``node`` runs a backward / optimizer step, directly or through functions of this file."""
        for c in self.calls_in(node):
            if self._is_train_call(c):
                return True
            if self._calls_training_function(c):
                return True
        return False

    def passes_optimizer(self, node: cst.CSTNode) -> bool:
        """``node`` hands an optimizer / grad scaler to a function this file does not define
        (``optimize(loss, optimizer)``, ``utils.step(model, opt)``): it may well train there."""
        for c in self.calls_in(node):
            if not isinstance(c.func, (cst.Name, cst.Attribute)):
                continue
            if isinstance(c.func, cst.Name) and c.func.value in self.symbols.functions and \
                    c.func.value not in self.symbols.imports:
                continue  # ours: has_backward() looks inside
            for a in c.args:
                d = dotted(a.value)
                if d and set(d.rsplit(".", 1)[-1].lower().split("_")) & _OPTIMIZER_TOKENS:
                    return True
        return False

    def _calls_training_function(self, c: cst.Call) -> bool:
        if isinstance(c.func, cst.Name):
            fns = [f for f in self.symbols.functions.get(c.func.value, []) if self.class_of(f) is None]
        elif isinstance(c.func, cst.Attribute) and isinstance(c.func.value, cst.Name) and c.func.value.value in (
                "self", "cls"):
            fns = [f for f in self.symbols.functions.get(c.func.attr.value, []) if self.class_of(f) is not None]
        else:
            return False
        for fn in fns:
            k = id(fn)
            if k in self._fn_backward:
                if self._fn_backward[k]:
                    return True
                continue
            self._fn_backward[k] = None  # in progress
            res = any(self._is_train_call(x) or self._calls_training_function(x) for x in self.calls_in(fn))
            self._fn_backward[k] = res
            if res:
                return True
        return False

    def evaluation_call(self, loop: cst.CSTNode) -> Optional[cst.Call]:
        """A call of the function holding ``loop`` in which none of the loop's training calls runs: every backward /
        optimizer step of the loop sits under an ``if`` on a parameter (``if train:``, ``if optimizer is not None:``,
        ``if mode == "train":``) that this call site sets (or leaves at its default) so that the branch is not taken,
        and the call itself runs with grad on. A shared ``run_epoch(loader, train=False)`` is an evaluation at that
        call even though the same function trains when ``train=True``. None when there is no such call."""
        memo = self.__dict__.setdefault("_evalcall_memo", {})
        if id(loop) not in memo:
            memo[id(loop)] = self._evaluation_call(loop)
        return memo[id(loop)]

    def _evaluation_call(self, loop: cst.CSTNode) -> Optional[cst.Call]:
        fn = self.scope_of(loop)
        if fn is None:
            return None
        trains = [c for c in self.calls_in(loop) if self._is_train_call(c) or self._calls_training_function(c)]
        if not trains:
            return None
        p = fn.params
        is_method = self.class_of(fn) is not None
        positional = [x for x in (*p.posonly_params, *p.params)]
        if is_method and positional and positional[0].name.value in ("self", "cls"):
            positional = positional[1:]
        params = {x.name.value: x for x in (*positional, *p.kwonly_params)}
        gates = []  # (If, branch taken for the training call: True = body, False = orelse, parameter name)
        for c in trains:
            g = self._param_gate(c, loop, params)
            if g is None:
                return None
            gates.append(g)
        sites = self.call_sites(fn)
        if sites is None:
            sites = self.__dict__.get("_refs_memo", {}).get(id(fn), ([], []))[0]
        for site in sites:
            if self.inside(site, fn) or any(a.star for a in site.args):
                continue
            bound = {}
            for name, param in params.items():
                v = self._arg_value(site, name, positional, param)
                bound[name] = v
            if all(self._test_value(test, name, bound.get(name, _NOVALUE)) is (not branch)
                   for test, branch, name in gates) and self.grad_state(site) == ENABLED:
                return site
        return None

    def _param_gate(self, call: cst.Call, loop: cst.CSTNode, params: dict):
        """(test, branch, parameter) of the innermost ``if`` inside ``loop`` whose test reads only one parameter of
        the function and holds ``call`` in one branch; None when ``call`` runs unconditionally (or on something
        else)."""
        cur, child = self.parent.get(call), call
        while cur is not None and cur is not loop:
            if isinstance(cur, cst.If) and child is not cur.test:
                names = names_in(cur.test) - {"None", "True", "False"}
                if len(names) == 1 and next(iter(names)) in params:
                    branch = child is cur.body
                    return cur.test, branch, next(iter(names))
            if isinstance(cur, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
                return None
            child, cur = cur, self.parent.get(cur)
        return None

    def _arg_value(self, site: cst.Call, name: str, positional: list, param: cst.Param):
        for a in site.args:
            if a.keyword is not None and a.keyword.value == name:
                return literal(a.value)
        idx = next((i for i, x in enumerate(positional) if x.name.value == name), None)
        pos = [a for a in site.args if a.keyword is None]
        if idx is not None and idx < len(pos):
            return literal(pos[idx].value)
        if param.default is not None:
            return literal(param.default)
        return _NOVALUE

    def _test_value(self, test: cst.BaseExpression, name: str, value) -> Optional[bool]:
        """The truth of ``test`` with parameter ``name`` bound to the literal ``value``; None when not known."""
        from bertlint.analysis.symbols import UNKNOWN as _U

        if value is _NOVALUE or value is _U:
            return None
        if isinstance(test, cst.Name) and test.value == name:
            return bool(value)
        if isinstance(test, cst.UnaryOperation) and isinstance(test.operator, cst.Not):
            v = self._test_value(test.expression, name, value)
            return None if v is None else not v
        if isinstance(test, cst.Comparison) and len(test.comparisons) == 1 and \
                isinstance(test.left, cst.Name) and test.left.value == name:
            op, right = test.comparisons[0].operator, test.comparisons[0].comparator
            if isinstance(op, (cst.Is, cst.IsNot)) and literal(right) is None and \
                    isinstance(right, cst.Name):
                return (value is None) if isinstance(op, cst.Is) else (value is not None)
            r = literal(right)
            if r is _U:
                if isinstance(op, (cst.In, cst.NotIn)) and isinstance(right, (cst.Tuple, cst.List, cst.Set)):
                    items = [literal(e.value) for e in right.elements]
                    if any(i is _U for i in items):
                        return None
                    return (value in items) if isinstance(op, cst.In) else (value not in items)
                return None
            if isinstance(op, cst.Equal):
                return value == r
            if isinstance(op, cst.NotEqual):
                return value != r
        return None

    def backward_names(self, scope: Scope) -> set[str]:
        """Names read by the backward calls of ``scope`` (receiver chain and arguments)."""
        out: set[str] = set()
        for c in self.calls:
            if self.scope.get(c) is scope:
                if self.is_backward_call(c):
                    out |= names_in(c)
                elif c.args and self._calls_training_function(c):  # self._step(loss) with a backward inside
                    for a in c.args:
                        out |= names_in(a.value)
        return out

    def derived(self, names: set[str], scope: Scope, after: Optional[cst.CSTNode] = None) -> set[str]:
        """``names`` plus every name assigned (in ``scope``, after ``after``) from an expression reading them."""
        out = set(names)
        assigns = [a for a in self.assigns.get(scope, []) if after is None or self.after(a, after)]
        for _ in range(len(assigns) + 1):  # to a fixed point: a chain of any length (loss from logits from a list)
            grew = False
            for a in assigns:
                if isinstance(a, cst.Assign) and names_in(a.value) & out:
                    targets = [t.target for t in a.targets]
                elif isinstance(a, (cst.AugAssign, cst.AnnAssign)) and a.value is not None and \
                        names_in(a.value) & out:
                    targets = [a.target]
                else:
                    continue
                for t in targets:
                    while isinstance(t, cst.Subscript):
                        t = t.value  # ``matrix[idx] = logits`` makes ``matrix`` carry them
                    for n in target_names(t) if not isinstance(t, cst.Attribute) else [dotted(t) or ""]:
                        if not n:
                            continue
                        if n not in out:
                            out.add(n)
                            grew = True
            if not grew:
                break
        return out

    # ------------------------------------------------------------------ evaluation context
    def framework_owned(self, scope: Scope) -> bool:
        """Methods whose forward the framework already wraps in no_grad (Lightning validation_step, a Trainer
        subclass's prediction_step / evaluate, callbacks)."""
        if scope is None:
            return False
        cls = self.class_of(scope)
        if cls is None:
            return False
        name = scope.name.value
        if name in _FRAMEWORK_GENERIC_METHODS:
            # `evaluate` / `predict` of the user's own class is an ordinary method: owned only in a framework class
            return self.framework_class(cls)
        if name in _FRAMEWORK_EVAL_METHODS:
            # a class without bases (`class Net:` / `class Net(object):`) cannot be a LightningModule / Trainer
            return any(not (dotted(b.value) in ("object",)) for b in cls.bases if b.keyword is None) or \
                self.framework_class(cls)
        return self.framework_class(cls)

    def framework_class(self, cls: cst.ClassDef, depth: int = 0) -> bool:
        """``cls`` derives from a framework class whose loops run its methods (Trainer, LightningModule, callbacks,
        pipelines), through this file's classes; an imported base counts by its name."""
        roles = getattr(self, "roles", None)
        if roles is not None and depth == 0:
            try:
                fam = roles.class_family(cls)
            except Exception:
                fam = None
            if fam and re.search(r"(?i)trainer|lightning|callback|pipeline", str(fam)):
                return True
        for base in cls.bases:
            b = dotted(base.value) or ""
            local = self.symbols.classes.get(b)
            if local is not None and local is not cls:
                if depth < 6 and self.framework_class(local, depth + 1):
                    return True
                continue
            q = self.symbols.qualname(base.value)
            if q is not None:
                # imported: a framework's class only when it comes from a framework package, or when the project's
                # own class it names derives from one (read from the project's files); the project's own
                # `BaseTrainer` with no framework base is an ordinary class whose methods the user calls
                if q.split(".")[0] in _FRAMEWORK_PACKAGES and _FRAMEWORK_BASES.search(q):
                    return True
                if q.split(".")[0] not in _FRAMEWORK_PACKAGES and self._project_framework_base(cls):
                    return True
                continue
            if _FRAMEWORK_BASES.search(b):
                return True  # a name bertlint cannot resolve (star import): keep the framework's benefit of doubt
        return False


    def _project_framework_base(self, cls: cst.ClassDef) -> bool:
        """``cls``'s bases reach a framework class through classes imported from the project's own files."""
        memo = self.__dict__.setdefault("_pfb_memo", {})
        if id(cls) not in memo:
            memo[id(cls)] = False
            try:
                import os

                from bertlint.analysis.setup import _import_map, framework_base

                d = os.path.dirname(os.path.abspath(self.filename)) if self.filename not in ("", "-", "<stdin>") \
                    else os.getcwd()
                memo[id(cls)] = framework_base(d, self.symbols, _import_map(self.module), cls,
                                               _PROJECT_FRAMEWORK_RE) is not None
            except Exception:
                memo[id(cls)] = False
        return memo[id(cls)]

    def _compiled_runtime(self, cls_expr) -> bool:
        """The class is (or a class of the file derives from) an optimum runtime model that runs a compiled graph
        outside autograd: ONNX Runtime (``optimum.onnxruntime``), AWS Neuron (``optimum.neuron``), OpenVINO
        (``optimum.intel``)."""
        for _ in range(4):
            if not isinstance(cls_expr, (cst.Name, cst.Attribute)):
                return False
            q = self.qual(cls_expr) or ""
            if q.startswith(("optimum.onnxruntime", "optimum.neuron", "optimum.intel")):
                return True
            local = self.symbols.classes.get(dotted(cls_expr) or "")
            if local is None or not local.bases:
                return False
            cls_expr = local.bases[0].value
        return False

    _STRUCT_BUILTINS = frozenset({"range", "len", "enumerate", "zip", "reversed", "list", "tuple", "min", "max"})
    _DATA_TOKENS = frozenset({"loader", "dataloader", "dataset", "data", "batches", "samples", "iterator"})

    def chunking_loop(self, loop, scope) -> bool:
        """``loop`` runs over ``range(...)`` in a method of a model class (an ``nn.Module`` / ``PreTrainedModel``
        subclass by its bases, followed into sibling modules) that nothing in this file calls: the model's own
        dispatch calls it (``forward(..., return_loss=False)`` of a base class → ``self.forward_test(imgs)``), and
        the loop cuts that one input into chunks (``for idx in range(0, imgs.shape[1], chunk)``) inside one call of
        the model, under whatever grad mode the caller runs the model with (a framework's test loop runs it under
        ``no_grad``): the method's name says nothing about autograd being on. A loop over a loader or another object
        (``for batch in loader``) is data: still judged by the name."""
        if not isinstance(loop, cst.For) or not isinstance(scope, cst.FunctionDef):
            return False
        it = loop.iter
        if not (type(it) is cst.Call and type(it.func) is cst.Name and it.func.value == "range"):
            return False
        return self._model_method(scope) and self.call_sites(scope) == []

    def _model_method(self, scope: cst.FunctionDef) -> bool:
        """``scope`` is a method of a model class: an ``nn.Module`` / ``PreTrainedModel`` subclass by its bases,
        followed into sibling modules."""
        cls = self.class_of(scope)
        return cls is not None and (self.module_family(cls) or self._sibling_family(cls)) in ("module", "pretrained")

    def structural_loop(self, loop: cst.CSTNode) -> bool:
        """``loop`` is in a method of a model class (an ``nn.Module`` / ``PreTrainedModel`` subclass by its bases,
        followed into sibling modules) and walks the model's own structure rather than data: its iterable reads only
        ``self`` attributes (``range(self.n_hop)``, ``self.layers``, ``zip(self.heads, self.norms)``), variables of
        enclosing loops of the same kind, literals and range/len/enumerate/zip/reversed. Such a loop runs once per
        layer / hop inside one call of the model (a list built there is the model's intermediate result, bounded by
        its depth), and whether autograd records it is decided by the caller, not by the method's name."""
        memo = self.__dict__.setdefault("_struct_memo", {})
        if id(loop) not in memo:
            memo[id(loop)] = self._structural_loop(loop)
        return memo[id(loop)]

    def _structural_loop(self, loop: cst.CSTNode) -> bool:
        scope = self.scope_of(loop)
        if not isinstance(scope, cst.FunctionDef) or not self._model_method(scope):
            return False
        if isinstance(loop, cst.For):
            iters = [(loop.iter, target_names(loop.target))]
        elif isinstance(loop, cst.SimpleStatementLine):  # a comprehension statement: every `for ... in` of it
            iters = []

            class V(cst.CSTVisitor):
                def visit_CompFor(self, n: cst.CompFor) -> None:
                    iters.append((n.iter, target_names(n.target)))

            walk(loop, V())
            if not iters:
                return False
        else:
            return False  # a `while` loop: its bound is not visible in an iterable
        allowed = set(self._STRUCT_BUILTINS) | {"self"}
        outer = self.parent.get(loop)
        while outer is not None and outer is not scope:  # targets of enclosing structural `for` loops
            if isinstance(outer, cst.For):
                if not self.structural_loop(outer):
                    return False
                allowed.update(target_names(outer.target))
            outer = self.parent.get(outer)
        for it, targets in iters:
            if not self._structural_iter(it, allowed):
                return False
            allowed.update(targets)
        return True

    def _structural_iter(self, it: cst.BaseExpression, allowed: set) -> bool:
        if not names_in(it) <= allowed:
            return False
        ok = [True]
        data_tokens = self._DATA_TOKENS

        class V(cst.CSTVisitor):
            def visit_Attribute(self, n: cst.Attribute) -> None:
                toks = {t for t in n.attr.value.lower().split("_") if t}
                if toks & data_tokens:
                    ok[0] = False  # `self.val_loader`, `self.dataset`: data held by the object

            def visit_Call(self, n: cst.Call) -> None:
                if not (isinstance(n.func, cst.Name) and n.func.value in EvalFlow._STRUCT_BUILTINS):
                    ok[0] = False  # `self.get_batches()`: a call may produce data

        walk(it, V())
        return ok[0]

    def _sibling_family(self, cls: cst.ClassDef) -> Optional[str]:
        """The family of ``cls`` when its base is a class of a sibling module of the project (``class
        RippleNet(KnowledgeRecommender)`` with the base, itself on ``nn.Module``, in ``abstract_recommender.py``):
        read through the file's roles (``bertlint.analysis.project``); None when unknown."""
        getter = self.__dict__.get("roles_getter")
        if getter is None:
            return None
        try:
            fam = getter().class_family(cls)
        except Exception:
            return None
        if fam == "module":
            return "module"
        return None

    def trained_by_caller(self, func: Scope) -> bool:
        """A caller of ``func`` in this file makes a training loss of its result: the call is an argument of a loss
        (``bce_loss(self.label_smoothness_predict(...), target)``), or the name it is assigned to reaches a loss call
        or a backward in the caller - outside no_grad and outside an evaluation-named caller. The function then
        computes part of a training graph, whatever its name says (callers elsewhere are unknown)."""
        if not isinstance(func, cst.FunctionDef):
            return False
        sites = self.call_sites(func)
        for site in sites or ():
            caller = self.scope.get(site)
            if not isinstance(caller, cst.FunctionDef) or caller is func or self.grad_state(site) != ENABLED:
                continue
            if self.eval_name(caller):
                continue
            cur = self.parent.get(site)
            while isinstance(cur, (cst.Arg, cst.Call, cst.BinaryOperation, cst.Attribute, cst.Subscript)):
                if isinstance(cur, cst.Call) and self.loss_kind(cur):
                    return True
                cur = self.parent.get(cur)
            stmt = self.parent.get(site)
            while stmt is not None and not isinstance(stmt, (cst.Assign, cst.AnnAssign, cst.SimpleStatementLine)):
                stmt = self.parent.get(stmt)
            if not isinstance(stmt, (cst.Assign, cst.AnnAssign)):
                continue
            targets = []
            for t in (stmt.targets if isinstance(stmt, cst.Assign) else []):
                targets += target_names(t.target)
            if isinstance(stmt, cst.AnnAssign):
                targets += target_names(stmt.target)
            names = self.derived(set(targets), caller)
            if names & self.backward_names(caller):
                return True
            for c in self.calls_in(caller):
                if self.after(c, site) and self.loss_kind(c) and \
                        any(names_in(a.value) & names for a in c.args):
                    return True
        return False

    def eval_name(self, scope: Scope) -> bool:
        if scope is None:
            return False
        name = scope.name.value.lower().strip("_")
        if name.startswith("test_") and re.search(r"(^|/)(test_[^/]*|[^/]*_test)\.py$", self.filename or ""):
            return False
        toks = set(t for t in re.split(r"_+", name) if t)
        # data preparation for the evaluation split (`preprocess_val`, `collate_eval`, `val_transform`): it prepares
        # inputs, it does not evaluate a model
        return bool(toks & EVAL_TOKENS) and not toks & _DATA_PREP_TOKENS

    def _same_model(self, a: str, b: str, scope: Scope) -> bool:
        """``a`` and ``b`` name the same module: equal, one an attribute of the other (``model.module``), or one
        assigned from an expression naming the other (``ddp_model = DDP(model)``, ``net = model.to(d)``)."""
        if a == b or a.startswith(b + ".") or b.startswith(a + "."):
            return True
        for x, y in ((a, b), (b, a)):
            assigns = self.symbols.assignments_of(x, scope) or [
                s for s in self.symbols.assignments.get(x, []) if s.func is None]
            for asg in assigns:
                if any(n == y or n.startswith(y + ".") or y.startswith(n + ".") for n in _dotted_names(asg.value)):
                    return True
        return False

    def train_flag_default(self, call: cst.Call) -> Optional[str]:
        """For ``X.train(flag)`` where ``flag`` is a parameter of the enclosing function whose default is ``False``
        (``def evaluation_step(self, x, training=False): self.module_.train(training)``): the parameter's name, the
        call being evaluation mode when the function is called with its default."""
        if len(call.args) != 1 or call.args[0].keyword is not None or not isinstance(call.args[0].value, cst.Name):
            return None
        scope = self.scope.get(call)
        if scope is None:
            return None
        name = call.args[0].value.value
        for prm in list(scope.params.params) + list(scope.params.kwonly_params):
            if prm.name.value == name:
                if prm.default is not None and literal(prm.default) is False and \
                        not any(a.func is scope for a in self.symbols.assignments.get(name, [])):  # not re-bound
                    return name
                return None
        return None

    def _train_false(self, call: cst.Call) -> bool:
        """``X.train(False)``, or ``X.train(flag)`` with a parameter ``flag=False`` by default (evaluation mode)."""
        if len(call.args) != 1:
            return False
        return literal(call.args[0].value) is False or self.train_flag_default(call) is not None

    def eval_mode_before(self, loop: cst.CSTNode, receivers: Iterable[str]) -> Optional[cst.Call]:
        """A ``X.eval()`` call before ``loop`` in its scope on one of ``receivers`` (or on a model) with no
        ``X.train()`` between it and the loop."""
        scope = self.scope_of(loop)
        recv = set(receivers)
        best = None
        evals = list(self.calls_by_final.get("eval", []))
        evals += [c for c in self.calls_by_final.get("train", []) if self._train_false(c)]  # model.train(False)
        for c in evals:
            if self.scope.get(c) is not scope or not isinstance(c.func, cst.Attribute):
                continue
            if c.args and not (c.func.attr.value == "train" and self._train_false(c)):
                continue
            if not self.before(c, loop) and not (self.inside(c, loop)):
                continue
            if self.inside(c, loop):
                continue
            r = dotted(c.func.value)
            if not r or not (r in recv or self.is_model_name(r, scope)):
                continue
            if recv and not any(self._same_model(r, x, scope) for x in recv):
                continue  # `teacher.eval()` says nothing about a loop that runs `student(...)`
            # a later .train() on the same receiver before the loop cancels it
            cancelled = False
            for t in self.calls_by_final.get("train", []):
                if t.args and self._train_false(t):
                    continue
                if self.scope.get(t) is scope and isinstance(t.func, cst.Attribute) and \
                        dotted(t.func.value) == r and self.order[t] > self.order[c] and self.before(t, loop):
                    cancelled = True
            if not cancelled:
                best = c
        return best

    # ------------------------------------------------------------------ graph-carrying values
    def carries_graph(self, expr: cst.BaseExpression, env: dict[str, bool]) -> bool:
        """``expr`` is (certainly) a tensor attached to an autograd graph, given the names in ``env``."""
        if isinstance(expr, cst.Name):
            return env.get(expr.value, False)
        if isinstance(expr, cst.Attribute):
            if expr.attr.value in ("data", "shape", "dtype", "device", "requires_grad", "grad", "is_leaf",
                                   "grad_fn", "ndim"):
                return False
            d = dotted(expr)
            if d is not None and d in env:
                return env[d]
            return self.carries_graph(expr.value, env)
        if isinstance(expr, cst.Subscript):
            return self.carries_graph(expr.value, env)
        if isinstance(expr, cst.BinaryOperation):
            return self.carries_graph(expr.left, env) or self.carries_graph(expr.right, env)
        if isinstance(expr, cst.UnaryOperation):
            return not isinstance(expr.operator, cst.Not) and self.carries_graph(expr.expression, env)
        if isinstance(expr, (cst.Tuple, cst.List)):
            return any(self.carries_graph(e.value, env) for e in expr.elements if isinstance(e, cst.Element))
        if isinstance(expr, cst.IfExp):
            return self.carries_graph(expr.body, env) and self.carries_graph(expr.orelse, env)
        if isinstance(expr, cst.Call):
            func = expr.func
            if self.is_forward(expr):
                if isinstance(func, cst.Attribute) and func.attr.value in _STEP_METHODS - {"training_step"}:
                    return False  # a validation / test step returns metrics the module chose: not known to carry
                recv = forward_receiver(expr)
                return self.grad_state(expr) == ENABLED and not (recv and frozen(self, recv))
            if isinstance(func, cst.Attribute):
                meth = func.attr.value
                q = self.symbols.qualname(func)
                if q is None and meth in _GRAPH_METHODS and self.carries_graph(func.value, env):
                    return True
                if q is not None and q.startswith("torch.") and final(q) in _GRAPH_FUNCS | _LOSS_FUNCS:
                    return any(self.carries_graph(a.value, env) for a in expr.args)
            if isinstance(func, cst.Name) and func.value in _BUILTIN_GRAPH and func.value not in self.symbols.imports:
                return any(self.carries_graph(a.value, env) for a in expr.args)
            if isinstance(func, cst.Name) and self._own_function(func.value, expr):
                # `criterion(...)` defined in this file: its returns decide, not its name (it may return `.item()`)
                return self._helper_returns_graph(func.value, expr, env)
            method = self._own_method(expr)
            if method is not None:
                return self._returns_graph(method, expr, env, skip_self=True)
            if self.loss_kind(expr) is not None:
                return any(self.carries_graph(a.value, env) for a in expr.args)
            if isinstance(func, cst.Name):
                return self._helper_returns_graph(func.value, expr, env)
            return False
        return False

    def _own_function(self, name: str, call: cst.Call) -> bool:
        """``name`` at ``call`` is a module-level function of this file: not imported, not re-bound by an
        assignment, not a parameter of the enclosing function."""
        if name in self.symbols.imports or self.symbols.assignments.get(name):
            return False
        if not any(self.scope.get(f) is None for f in self.symbols.functions.get(name, [])):
            return False
        fn = self.scope_of(call)
        while fn is not None:
            if any(p.name.value == name for p in (*fn.params.params, *fn.params.kwonly_params,
                                                   *fn.params.posonly_params)):
                return False
            fn = self.scope.get(fn)
        return True

    def _own_method(self, call: cst.Call) -> Optional[cst.FunctionDef]:
        """The method of the enclosing class that ``self.name(...)`` calls, when the class defines exactly one."""
        func = call.func
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
            return None
        cur = self.parent.get(call)
        while cur is not None and not isinstance(cur, cst.ClassDef):
            cur = self.parent.get(cur)
        if cur is None or not isinstance(cur.body, cst.IndentedBlock):
            return None
        found = [st for st in cur.body.body if isinstance(st, cst.FunctionDef) and st.name.value == func.attr.value]
        if len(found) != 1 or found[0].decorators:
            return None
        return found[0]

    def _helper_returns_graph(self, name: str, call: cst.Call, env: dict[str, bool]) -> bool:
        """A module-level function of this file (``mean_pool(hidden, mask)``) whose every return carries the graph
        of a graph-carrying argument."""
        fns = [f for f in self.symbols.functions.get(name, []) if self.scope.get(f) is None]
        if len(fns) != 1 or name in self.symbols.imports:
            return False
        return self._returns_graph(fns[0], call, env)

    def _returns_graph(self, fn: cst.FunctionDef, call: cst.Call, env: dict[str, bool],
                       skip_self: bool = False) -> bool:
        params = [p for p in fn.params.params]
        if skip_self:
            params = params[1:]
        if any(a.star or a.keyword is not None for a in call.args) or len(call.args) > len(params):
            return False
        flags = tuple(self.carries_graph(a.value, env) for a in call.args)
        if not any(flags):
            return False
        key = (id(fn), flags)
        memo = self.__dict__.setdefault("_helper_memo", {})
        if key in memo:
            return bool(memo[key])
        memo[key] = False  # recursion guard
        if any(self.ctx_kind(d.decorator) in (DISABLED, "inference", UNKNOWN) for d in fn.decorators):
            return False
        local = {p.name.value: f for p, f in zip(params, flags)}
        for s in self.statements(fn.body):
            if isinstance(s, cst.Assign):
                self._bind([t.target for t in s.targets], s.value, local)
            elif isinstance(s, cst.With):
                return False  # grad mode may change inside: stay silent
        rets = [r for r in self.returns.get(fn, []) if isinstance(r, cst.Return)]
        res = bool(rets) and all(r.value is not None and self.carries_graph(r.value, local) for r in rets)
        memo[key] = res
        return res

    def statements(self, body: cst.CSTNode) -> Iterator[cst.CSTNode]:
        """Small statements of a block in source order, descending into compound statements (not into nested
        functions or classes)."""
        if isinstance(body, cst.IndentedBlock):
            stmts: Iterable = body.body
        elif isinstance(body, cst.SimpleStatementSuite):
            stmts = [body]
        else:
            stmts = []
        for s in stmts:
            if isinstance(s, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
                yield from s.body
            elif isinstance(s, (cst.FunctionDef, cst.ClassDef)):
                continue
            elif isinstance(s, (cst.For, cst.While)):
                yield s
                yield from self.statements(s.body)
                if s.orelse is not None:
                    yield from self.statements(s.orelse.body)
            elif isinstance(s, cst.If):
                yield from self.statements(s.body)
                o = s.orelse
                while o is not None:
                    yield from self.statements(o.body)
                    o = o.orelse if isinstance(o, cst.If) else None
            elif isinstance(s, cst.With):
                yield s
                yield from self.statements(s.body)
            elif isinstance(s, (cst.Try, cst.TryStar)):
                yield from self.statements(s.body)
                for h in s.handlers:
                    yield from self.statements(h.body)
                if s.orelse is not None:
                    yield from self.statements(s.orelse.body)
                if s.finalbody is not None:
                    yield from self.statements(s.finalbody.body)

    def graph_env(self, loop: cst.CSTNode) -> dict[str, bool]:
        """Names assigned in ``loop``'s body and whether (after their last assignment in the body) they carry a
        graph. One pass in source order (two, so that a name assigned late still reaches uses early)."""
        env: dict[str, bool] = {}
        for s in self.statements(loop.body):
            if isinstance(s, cst.Assign):
                self._bind(s.targets and [t.target for t in s.targets], s.value, env)
            elif isinstance(s, cst.AnnAssign) and s.value is not None:
                self._bind([s.target], s.value, env)
            elif isinstance(s, cst.For):
                for n in target_names(s.target):
                    env[n] = False
            elif isinstance(s, cst.With):
                for it in s.items:
                    if it.asname is not None:
                        for n in target_names(it.asname.name):
                            env[n] = False
        return env

    def backwarded_names(self, loop: cst.CSTNode) -> set:
        """Usage is evidence: a name the loop calls ``backward`` on (``loss.backward()``,
        ``scaler.scale(loss).backward()``, ``accelerator.backward(loss)``) carries a graph, whatever produced it (a
        model held in a dict, a callable the analysis cannot follow) - when the loop binds it once, so the value
        backward-ed is the value used."""
        out: set = set()
        counts: dict[str, int] = {}
        for s in self.statements(loop.body):
            if isinstance(s, (cst.Assign, cst.AnnAssign, cst.AugAssign)):
                tgts = [t.target for t in s.targets] if isinstance(s, cst.Assign) else [s.target]
                for t in tgts:
                    for n in target_names(t) if isinstance(t, (cst.Name, cst.Tuple, cst.List)) else [dotted(t) or ""]:
                        counts[n] = counts.get(n, 0) + 1
        for s in self.statements(loop.body):
            if not isinstance(s, cst.Expr) or not isinstance(s.value, cst.Call):
                continue
            call = s.value
            f = call.func
            name = None
            if isinstance(f, cst.Attribute) and f.attr.value == "backward":
                v = f.value
                pos = [a for a in call.args if a.keyword is None and not a.star]
                if isinstance(v, cst.Call):
                    if isinstance(v.func, cst.Attribute) and v.func.attr.value == "scale" and v.args:
                        name = dotted(v.args[0].value)  # scaler.scale(loss).backward()
                elif pos:
                    name = dotted(pos[0].value)  # accelerator.backward(loss), engine.backward(loss)
                else:
                    name = dotted(v)  # loss.backward()
            if name and counts.get(name, 0) == 1:
                out.add(name)
        # what the backward-ed value is made of alone carries its graph too: ``loss = sum(losses) if
        # isinstance(losses, tuple) else losses`` then ``loss.backward()`` - the backward needs ``losses`` to require
        # grad (one source, kept whole: a name, ``sum(x)``, ``x.sum()`` / ``x.mean()``, ``x * 0.5``, ``x / 2``)
        if out:
            single: dict[str, cst.BaseExpression] = {}
            for s in self.statements(loop.body):
                if isinstance(s, cst.Assign) and len(s.targets) == 1 and isinstance(s.targets[0].target, cst.Name):
                    n = s.targets[0].target.value
                    if counts.get(n, 0) == 1:
                        single[n] = s.value
            todo = list(out)
            while todo:
                v = single.get(todo.pop())
                src = _sole_source(v) if v is not None else None
                if src and src not in out and counts.get(src, 0) == 1:
                    out.add(src)
                    todo.append(src)
        return out

    def _bind(self, targets, value: cst.BaseExpression, env: dict[str, bool]) -> None:
        for t in targets:
            if isinstance(t, (cst.Tuple, cst.List)) and isinstance(value, (cst.Tuple, cst.List)) and \
                    len(t.elements) == len(value.elements):
                for te, ve in zip(t.elements, value.elements):
                    self._bind([te.value], ve.value, env)
                continue
            flag = self.carries_graph(value, env)
            if isinstance(t, (cst.Name, cst.Tuple, cst.List)):
                for n in target_names(t):
                    env[n] = flag
            else:
                d = dotted(t)
                if d:
                    env[d] = flag

    # ------------------------------------------------------------------ tensors
    def tensorish(self, expr: cst.BaseExpression, env: dict[str, bool]) -> bool:
        """``expr`` is certainly a tensor (a model output or a torch call), given tensor names in ``env``."""
        if isinstance(expr, cst.Name):
            return env.get(expr.value, False)
        if isinstance(expr, (cst.Attribute, cst.Subscript)):
            if isinstance(expr, cst.Attribute) and expr.attr.value in ("shape", "dtype", "device", "ndim"):
                return False
            return self.tensorish(expr.value, env)
        if isinstance(expr, cst.BinaryOperation):
            return self.tensorish(expr.left, env) or self.tensorish(expr.right, env)
        if isinstance(expr, cst.Call):
            if self.is_forward(expr):
                return True
            func = expr.func
            q = self.symbols.qualname(func) if isinstance(func, (cst.Name, cst.Attribute)) else None
            if q and q.startswith("torch.") and not q.startswith(("torch.no_grad", "torch.inference_mode")):
                last = final(q)
                if last in ("save", "load", "manual_seed", "device", "is_tensor", "numel", "set_grad_enabled") or \
                        last[:1].isupper():
                    return False
                return True
            if isinstance(func, cst.Attribute) and q is None:
                if func.attr.value in ("item", "tolist", "numpy", "size", "dim", "numel", "__len__", "keys",
                                       "items", "values", "get"):
                    return False
                return self.tensorish(func.value, env)
        return False


# ---------------------------------------------------------------------- helpers on top of EvalFlow used by rules
def _dotted_names(node: cst.CSTNode) -> set[str]:
    """Dotted names (``a``, ``a.b``) read in ``node``."""
    out: set[str] = set()

    class V(cst.CSTVisitor):
        def visit_Attribute(self, n: cst.Attribute) -> None:
            d = dotted(n)
            if d:
                out.add(d)

        def visit_Name(self, n: cst.Name) -> None:
            out.add(n.value)

    walk(node, V())
    return out


def forward_receiver(call: cst.Call) -> Optional[str]:
    func = call.func
    if isinstance(func, cst.Attribute) and func.attr.value == "forward":
        func = func.value
    return dotted(func)


def frozen(flow: EvalFlow, receiver: str) -> bool:
    """``receiver`` is frozen in this file (``X.requires_grad_(False)`` or ``for p in X.parameters():
    p.requires_grad = False``): its forward records no graph even with grad on."""
    memo = flow.__dict__.setdefault("_frozen_memo", {})
    if receiver not in memo:
        memo[receiver] = _frozen(flow, receiver)
    return memo[receiver]


def _frozen(flow: EvalFlow, receiver: str) -> bool:
    root = receiver
    # not calls_by_final: a chained `X.eval().requires_grad_(False)` has no dotted name
    for c in flow.calls:
        if isinstance(c.func, cst.Attribute) and c.func.attr.value == "requires_grad_" and c.args and \
                literal(c.args[0].value) is False:
            r = dotted(c.func.value) or ""
            if r == root:
                return True
            # model.eval().requires_grad_(False) / model.requires_grad_(False) chained
            if isinstance(c.func.value, cst.Call) and forward_receiver_chain(c.func.value) == root:
                return True
            # enc = AutoModel.from_pretrained(...).eval().requires_grad_(False): the module is returned
            up = flow.parent.get(c)
            if isinstance(up, cst.Assign) and any(dotted(t.target) == root for t in up.targets):
                return True
    for loop in flow.loops:
        if isinstance(loop, cst.For) and isinstance(loop.iter, cst.Call):
            it = loop.iter
            if isinstance(it.func, cst.Attribute) and it.func.attr.value in ("parameters", "named_parameters"):
                if dotted(it.func.value) == root:
                    code = flow.module.code_for_node(loop.body)
                    if re.search(r"requires_grad\s*=\s*False|requires_grad_\(\s*False", code):
                        return True
    return False


def forward_receiver_chain(call: cst.Call) -> Optional[str]:
    """``model`` for ``model.eval()`` / ``model.to(d).eval()``."""
    cur: cst.BaseExpression = call
    while isinstance(cur, cst.Call) and isinstance(cur.func, cst.Attribute):
        cur = cur.func.value
    return dotted(cur)


def eval_call_text(flow: EvalFlow, ev: cst.Call) -> str:
    """``model.eval()`` for messages; a ``model.train(flag)`` says which default makes it evaluation mode."""
    text = f"`{flow.module.code_for_node(ev)}`"
    flag = flow.train_flag_default(ev) if (isinstance(ev.func, cst.Attribute) and ev.func.attr.value == "train") \
        else None
    if flag is not None:
        text += f" (evaluation mode with the default `{flag}=False`)"
    return text


def _sole_source(v: cst.BaseExpression) -> Optional[str]:
    """The one name a value is computed from with its graph kept whole: ``x``, ``sum(x)``, ``x.sum()``, ``x.mean()``,
    ``x * 0.5`` / ``x / 2`` (a number literal), or an ``a if test else b`` whose both arms are of the same name.
    None otherwise (``a + b``, ``criterion(out, y)``: several inputs, which of them carries the graph is unknown)."""
    if isinstance(v, cst.Name):
        return v.value
    if isinstance(v, cst.IfExp):
        a, b = _sole_source(v.body), _sole_source(v.orelse)
        return a if a is not None and a == b else None
    if isinstance(v, cst.Call) and not v.args and isinstance(v.func, cst.Attribute) and \
            v.func.attr.value in ("sum", "mean"):
        return _sole_source(v.func.value)
    if isinstance(v, cst.Call) and isinstance(v.func, cst.Name) and v.func.value == "sum" and len(v.args) == 1 and \
            v.args[0].keyword is None and not v.args[0].star:
        return _sole_source(v.args[0].value)
    if isinstance(v, cst.BinaryOperation) and isinstance(v.operator, (cst.Multiply, cst.Divide)) and \
            isinstance(v.right, (cst.Integer, cst.Float)):
        return _sole_source(v.left)
    return None


def eval_reason(flow: EvalFlow, loop: cst.CSTNode, receivers: Iterable[str]) -> Optional[str]:
    """Why ``loop`` is an evaluation loop (text for messages), or None.

    The function's name is a hint only: it is not taken when the loop walks a model's own structure inside one of
    the model's methods (``structural_loop``: its grad mode is the caller's), or when a caller in this file computes
    a training loss with the function's result (``trained_by_caller``)."""
    scope = flow.scope_of(loop)
    ev = flow.eval_mode_before(loop, receivers)
    if ev is not None:
        return f"after {eval_call_text(flow, ev)}"
    if flow.eval_name(scope) and not flow.structural_loop(loop) and not flow.trained_by_caller(scope) and \
            not flow.chunking_loop(loop, scope):
        return f"in `{scope.name.value}()`"
    return None


def torch_alias(symbols: SymbolTable) -> Optional[str]:
    """The local name bound to the ``torch`` module, if any."""
    if symbols.imports.get("torch") == "torch":
        return "torch"
    for local, q in symbols.imports.items():
        if q == "torch":
            return local
    return None


def no_grad_expr(symbols: SymbolTable) -> Optional[str]:
    t = torch_alias(symbols)
    if t:
        return f"{t}.no_grad()"
    for local, q in symbols.imports.items():
        if q in ("torch.no_grad", "torch.autograd.no_grad"):
            return f"{local}()"
    return None
