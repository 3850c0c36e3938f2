"""Roles from usage: who is the optimizer, the scheduler, the model ... of a file, and why.

API contract (``ctx.roles`` is a :class:`Roles`, built once per file from ``ctx.symbols``: no extra tree walk)::

    r = ctx.roles
    role = r.of("optimizer", func)         # Role | None; func = the FunctionDef (or ClassDef / None) it is read in
                                           # (without a scope: module level, else wherever bound when all agree)
    role = r.of(call.func.value, func)     # a Name / Attribute node works too; a Call node -> what the call returns
    role.role                              # "optimizer" | "scheduler" | "grad_scaler" | "accelerator" |
                                           # "deepspeed_engine" | "fabric" | "model" | "ddp_model" | "dataloader" |
                                           # "pipeline" | "trainer" | "lightning_module" | "other"
    role.confident                         # False when the only evidence is the name (a hint: lower a severity,
                                           # never veto a finding found by usage)
    role.by_constructor                    # a known constructor supports it (False: usage alone, e.g. a project's
                                           # optimizer wrapper that may have semantics of its own)
    role.evidence                          # (Evidence(kind, why, node), ...) strongest first;
                                           # kind: "constructor" | "usage" | "import" | "annotation" | "name"
    role.node                              # the node of the strongest evidence (an assignment, a call ...)
    role.qualname                          # resolved constructor when known ("torch.optim.AdamW", "lightning.Trainer")
    role.wrapped_by                        # "accelerator" | "fabric" | "deepspeed" | "ddp" | "fsdp" | "apex" |
                                           # "lightning" (self.optimizers()) | None
    role.conflicts                         # other roles some evidence pointed at (empty when consistent)
    role.origin                            # the constructor Call that built it (``Accelerator(...)``) followed
                                           # through prepare / factories / call-site arguments; role.origins: all
    r.legacy_kind("scaler", func)          # (kind, confident) in the loop model's words: "scaler", "engine",
                                           # "ddp", "ds_optimizer", "model", "other" ...
    r.receiver_kind("scaler", func)        # the same, (None, False) unless a kind of the training machinery
                                           # (what the loop discovery and the dry run classify calls by)
    r.role("self.optimizer", method)       # the role string or None (any confidence)
    r.is_("opt_g", "optimizer", func)      # bool; confident=True to ignore name-only roles
    r.all("optimizer")                     # [(scope, path, Role)]: every binding with that role
    r.call_role(call, func)                # Role of the value a Call produces (``Foo.from_pretrained(...)``)
    # "model" | "ddp_model" | "deepspeed_engine" | "lightning_module" are all models (a wrapped model is still
    # one): ``x.backward(loss)`` on any of them is an engine-style backward, whatever the precise role says.
    r.is_forward(call, func)               # True: a graph-recording forward (model(...), self(...) in a Module,
                                           # self.forward(...)); False: known not (a pipeline, a tokenizer,
                                           # model.generate(...) which runs under no_grad); None: unknown
    r.class_family(classdef)               # "trainer" | "lightning_module" | "module" | "optimizer" |
                                           # "scheduler" | "pipeline" | "callback" | "dataset" (also a
                                           # LightningDataModule) |
                                           # "training_args" | None (bases
                                           # followed through the file's own classes and imports:
                                           # trl.SFTTrainer -> "trainer"; PreTrainedModel -> "module")
    r.class_base(classdef)                 # the framework class reached: "trl.SFTTrainer", "torch.nn.Module", ...
    r.loss_forwards(backward_call)         # the forward calls the loss of that backward is computed from

``python -m bertlint.analysis.roles FILE`` prints what it finds (a debugging aid).

Scopes: a plain name is looked up in the function it is read in, then its enclosing functions, then the module;
``self.x`` in a method is looked up on the class (attributes set in ``__init__`` or any method). Parameters take
the role of the arguments at the file's own call sites (``train(model, optimizer)``, ``MyTrainer(opt=...)``), of
their annotation, and of how the function body uses them.

Evidence, strongest first:
- ``constructor``: a known package's class or factory (torch.optim, transformers, bitsandbytes, apex, timm,
  fairseq, deepspeed, accelerate, lightning, diffusers ...), a class of this file whose bases reach one, a
  variable holding a class (``optimizer_cls = AdamW if x else Adafactor; optimizer_cls(...)``,
  ``getattr(torch.optim, name)(...)``), a same-file factory function / method (what it returns), the
  position in ``accelerator.prepare(...)`` / ``fabric.setup(...)`` / ``deepspeed.initialize(...)`` unpacking.
- ``usage``: built from model parameters (``.parameters()``, filtered ``named_parameters()``, param-group
  lists) with optimizer settings; built on an optimizer (a scheduler); stepped and zeroed, handed to
  ``scaler.step`` / ``scaler.unscale_``, ``deepspeed.initialize(optimizer=...)``; produces the loss that reaches
  a backward (a model); ``x.parameters()``, ``x.to(device)`` as a statement, ``DDP(x)``, ``accelerator.accumulate(x)``.
- ``import``: a callee imported from a module whose path or factory name says what it builds
  (``myproj.optim.Lamb``, ``build_optimizer``); weak usage (``x.parameters()``, ``x.to(device)`` /
  ``x.eval()`` as a statement, a literal default of a parameter) is ranked here too.
- ``name``: the last hint (``opt_g``, ``lr_sched``, ``scaler``) at low confidence; flags and names about a thing
  (``save_optimizer``, ``model_path``, ``optimizer_cls``) give none.

"other" is a positive answer: known not to be any of the roles (a tokenizer, a config, a loss module, a
diffusers noise scheduler, an EMA wrapper, a string / number literal). Loop variables take the role of the
elements they iterate (``for opt in [opt_g, opt_d]``, ``zip(optimizers, schedulers)``, comprehensions, lists
built by ``append``). Where a name is rebound (``model = DDP(model)``), a binding that reads it sees only the
bindings made before it (``model_without_ddp = model`` stays "model"); a read elsewhere sees the latest one.

Example::

    optimizer_cls = torch.optim.AdamW if args.adamw else Adafactor
    opt = optimizer_cls(model.parameters(), lr=1e-4)
    r.of("opt", main).role == "optimizer"           # constructor evidence (the class held in a variable)

    def build(cfg, model):
        return torch.optim.SGD(model.parameters(), lr=cfg.lr)
    self.optimizer = build(cfg, self.model)        # in __init__
    r.of("self.optimizer", train_method).role == "optimizer"
"""

from __future__ import annotations

import re
from bertlint._dataclass import dataclass, field
from typing import Any, Optional, Union

import libcst as cst

from bertlint.analysis.symbols import SymbolTable, call_name, dotted, kwarg, positional


class _LazyRe:
    """A module-level pattern compiled on its first use (importing this module stays cheap; a lint run
    compiles only the patterns it reaches)."""

    __slots__ = ("_args", "_rx")

    def __init__(self, pattern: str, flags: int = 0) -> None:
        self._args = (pattern, flags)
        self._rx: Optional[re.Pattern] = None

    def _get(self) -> re.Pattern:
        rx = self._rx
        if rx is None:
            rx = self._rx = re.compile(*self._args)
        return rx

    def search(self, s: str):
        return self._get().search(s)

    def match(self, s: str):
        return self._get().match(s)

    def fullmatch(self, s: str):
        return self._get().fullmatch(s)

    def __getattr__(self, name: str):
        return getattr(self._get(), name)


_lazy_re = _LazyRe

ROLES = (
    "optimizer",
    "scheduler",
    "grad_scaler",
    "accelerator",
    "deepspeed_engine",
    "fabric",
    "model",
    "ddp_model",
    "dataloader",
    "pipeline",
    "trainer",
    "lightning_module",
    "other",  # something known NOT to be one of the above (tokenizer, config, loss function, noise scheduler, EMA)
)

Scope = Union[cst.FunctionDef, cst.ClassDef, None]

_STEP_BUDGET = 400_000  # evaluation steps per file (r.all() on train_large.py takes ~1,300)
_STRENGTH = {"constructor": 4, "usage": 3, "annotation": 3, "import": 2, "name": 1}


@dataclass(frozen=True)
class Evidence:
    kind: str  # constructor | usage | import | annotation | name
    role: str
    why: str
    node: Optional[cst.CSTNode] = None
    qualname: Optional[str] = None
    wrapped_by: Optional[str] = None
    origin: Optional[cst.Call] = None  # the constructor call that built the value, when known

    @property
    def strength(self) -> int:
        return _STRENGTH.get(self.kind, 0)


@dataclass
class Role:
    role: str
    evidence: tuple = ()
    conflicts: tuple = ()

    @property
    def confident(self) -> bool:
        return any(e.kind != "name" for e in self.evidence if e.role == self.role)

    @property
    def by_constructor(self) -> bool:
        """A known constructor supports the role (a package's class, a class of this file whose bases reach one,
        a class held in a variable, deepspeed.initialize ...). False when the role rests on usage alone: the
        object may be a wrapper with semantics of its own (``GradAccumOptimizer(...)``, mmengine's OptimWrapper)."""
        return any(e.kind in ("constructor", "annotation") and e.role == self.role for e in self.evidence) or any(
            e.role == self.role and e.qualname and e.kind == "usage" and e.origin is not None for e in self.evidence)

    @property
    def node(self) -> Optional[cst.CSTNode]:
        for e in self.evidence:
            if e.role == self.role and e.node is not None:
                return e.node
        return None

    @property
    def qualname(self) -> Optional[str]:
        for e in self.evidence:
            if e.role == self.role and e.qualname:
                return e.qualname
        return None

    @property
    def wrapped_by(self) -> Optional[str]:
        for e in self.evidence:
            if e.role == self.role and e.wrapped_by:
                return e.wrapped_by
        return None

    @property
    def origin(self) -> Optional[cst.Call]:
        """The constructor call that built the value (``Accelerator(...)``, ``AdamW(...)``), followed through
        ``prepare`` / ``setup``, same-file factories and call-site arguments; None when not known."""
        for e in self.evidence:
            if e.role == self.role and e.origin is not None:
                return e.origin
        return None

    @property
    def origins(self) -> tuple:
        """Every distinct constructor call seen (a name assigned in two branches has two)."""
        out: list = []
        for e in self.evidence:
            if e.role == self.role and e.origin is not None and all(o is not e.origin for o in out):
                out.append(e.origin)
        return tuple(out)

    @property
    def why(self) -> str:
        return "; ".join(e.why for e in self.evidence if e.role == self.role)

    def __eq__(self, other: object) -> bool:  # role == "optimizer" reads naturally
        if isinstance(other, str):
            return self.role == other
        if isinstance(other, Role):
            return self.role == other.role and self.evidence == other.evidence
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.role)


_MODEL_PRIORITY = ("deepspeed_engine", "ddp_model", "lightning_module", "model")
_MODEL_LIKE = set(_MODEL_PRIORITY)


# what is done with a model (and so with a DeepSpeed engine, which is one) and never with an optimizer wrapper
_ENGINE_AS_MODEL = frozenset({"train", "eval", "parameters", "named_parameters", "forward", "module",
                              "save_checkpoint", "load_checkpoint"})


def decide(evidence: list) -> Optional[Role]:
    """The role the evidence supports: the strongest kind wins; a name never vetoes usage or a constructor."""
    ev = [e for e in evidence if e is not None]
    if not ev:
        return None
    best = max(e.strength for e in ev)
    top = [e for e in ev if e.strength == best]
    score: dict[str, int] = {}
    for e in top:
        score[e.role] = score.get(e.role, 0) + 1
    # deterministic: most votes, then first seen
    order = []
    for e in top:
        if e.role not in order:
            order.append(e.role)
    if len(order) > 1 and set(order) <= _MODEL_LIKE:
        role = min(order, key=_MODEL_PRIORITY.index)  # a wrapped / framework model is still that model
    else:
        role = max(order, key=lambda r: (score[r], -order.index(r)))
    ordered = sorted(ev, key=lambda e: -e.strength)
    seen = []
    out = []
    for e in ordered:
        k = (e.kind, e.role, e.why, id(e.node))
        if k not in seen:
            seen.append(k)
            out.append(e)
    compatible = _MODEL_LIKE if role in _MODEL_LIKE else {role}
    conflicts = tuple(sorted({e.role for e in ev if e.role not in compatible and e.kind != "name" and e.role != "other"
                              and e.strength >= 3}))
    return Role(role, tuple(out), conflicts)


# ---------------------------------------------------------------------------------------------- known packages
_OPT_CLASS_NAMES = _lazy_re(
    r"(adam|sgd|lamb|lars|lion|adafactor|adagrad|adadelta|rmsprop|adamax|novograd|sophia|shampoo|came|prodigy|"
    r"schedulefree|optim|radam|nadam|lbfgs|rprop|asgd|adan|muon|galore|lomo|dadapt|apollo|madgrad|sparseadam)",
    re.I,
)
_SCHED_FACTORY = _lazy_re(r"(^|_)(get_\w*schedul\w*|\w*_scheduler|\w*lr_schedul\w*|create_scheduler\w*|"
                            r"build_\w*sched\w*|make_\w*sched\w*|\w*warmup\w*|\w*schedule_with\w*)$", re.I)
_SCHED_CLASS = _lazy_re(r"(LR|Scheduler|Schedule|Warmup\w*|LambdaLR|SWALR)$")
_OPT_FACTORY = _lazy_re(r"^(create_optimizer\w*|build_optimizer\w*|make_optimizer\w*|get_optimizer\w*|"
                          r"configure_optimizer\w*|init_optimizer\w*|setup_optimizer\w*|\w*_optimizer)$", re.I)
_LOSS_CLASS = _lazy_re(r"(Loss|Criterion)$")
# callees that take parameters without being an optimizer
_PARAM_UTILS = _lazy_re(
    r"(^|_)(clip\w*|sum|len|list|tuple|set|sorted|filter|map|zip|chain|enumerate|iter|next|any|all|print|"
    r"numel|count\w*|num_param\w*|ema\w*|\w*average\w*|\w*ema|parameters_to_vector|vector_to_parameters|"
    r"freeze\w*|unfreeze\w*|init\w*|log\w*|get_parameter_names|dict|id|str|repr|format|max|min|\w*norm\w*|"
    r"register\w*|watch|hook\w*|grad_norm|apply\w*|save\w*|load\w*|to|cast\w*|convert\w*|check\w*|"
    r"assert\w*|extend|append|update|add_param_group)$",
    re.I,
)
_OPT_KWARGS = {"lr", "learning_rate", "weight_decay", "betas", "momentum", "eps", "beta1", "beta2", "nesterov",
               "amsgrad", "scale_parameter", "relative_step", "warmup_init", "optim_bits", "fused", "foreach"}

_SUFFIX = r"(_[a-z0-9]{1,3})?"
_NAME_HINTS = (
    ("optimizer", _lazy_re(rf"^((opt|optim|optimi[sz]er){_SUFFIX}|[a-z0-9]+_(opt|optim|optimi[sz]er))$", re.I)),
    ("scheduler", _lazy_re(rf"^((sched|scheduler|lr_scheduler|lr_sched){_SUFFIX}|[a-z0-9]+_(scheduler|sched))$", re.I)),
    ("grad_scaler", _lazy_re(r"^(scaler|grad_scaler|amp_scaler|loss_scaler|fp16_scaler|gradscaler)$", re.I)),
    ("accelerator", _lazy_re(r"^(accelerator|_accelerator)$", re.I)),
    ("deepspeed_engine", _lazy_re(r"^(engine|model_engine|ds_engine|deepspeed_engine|ds_model)$", re.I)),
    ("fabric", _lazy_re(r"^(fabric)$", re.I)),
    ("dataloader", _lazy_re(r"^((train|eval|val|valid|test|data)_?(data)?_?loader|loader|dataloader|train_dl|val_dl|dl)$", re.I)),
    ("pipeline", _lazy_re(r"^(pipe|pipeline|[a-z0-9]+_pipe|[a-z0-9]+_pipeline)$", re.I)),
    ("trainer", _lazy_re(r"^(trainer|[a-z0-9]+_trainer)$", re.I)),
    ("model", _lazy_re(rf"^((model|net|network|unet|generator|discriminator|netg|netd|backbone|classifier){_SUFFIX}|"
                         r"[a-z0-9]+_(model|net))$", re.I)),
)
# flags and names about a thing, not the thing: save_optimizer, is_chat_model, model_path, optimizer_class ...
_NOT_A_THING = _lazy_re(r"^(is|use|save|load|no|skip|with|has|num|n|do|init|train|freeze|should|enable|disable|"
                          r"print|log|get|make|build|create|setup|wrap|unwrap|cast)_|"
                          r"_(path|name|names|dir|file|config|cfg|args|kwargs|type|class|cls|params|parameters|info|"
                          r"id|card|init|state|dict|fn|func|kw|list|str|size|dtype|device|out|output|outputs|inputs|"
                          r"grouped_parameters|groups|steps|step|freq|every|interval|lr|name_or_path)$", re.I)


def name_hint(path: str) -> Optional[str]:
    last = path.split(".")[-1].lstrip("_") or path
    if _NOT_A_THING.search(last):
        return None
    for role, rx in _NAME_HINTS:
        if rx.match(last):
            return role
    return None


def classify_qualname(q: str) -> Optional[tuple[str, Optional[str]]]:
    """(role, wrapped_by) of what calling the resolved callee ``q`` returns, for known packages; else None.
    ``q`` is an import-resolved dotted name such as ``torch.optim.AdamW`` or ``transformers.get_scheduler``."""
    if not q:
        return None
    parts = q.split(".")
    last = parts[-1]
    top = parts[0]
    mod = ".".join(parts[:-1])
    upper = last[:1].isupper()
    if top == "torch":
        if q.startswith("torch.optim.lr_scheduler.") or last == "SWALR":
            return ("scheduler", None) if upper else None
        if q.startswith("torch.optim.swa_utils.") and last == "AveragedModel":
            return ("other", None)
        if q.startswith("torch.optim.") and upper and last not in ("Optimizer",):
            return ("optimizer", None)
        if last.endswith("GradScaler"):
            return ("grad_scaler", None)
        if last in ("DistributedDataParallel", "DDP", "DataParallel"):
            return ("ddp_model", "ddp")
        if last in ("FullyShardedDataParallel", "FSDP"):
            return ("ddp_model", "fsdp")
        if last == "fully_shard":
            return ("model", "fsdp")
        if last == "DataLoader":
            return ("dataloader", None)
        if q.startswith("torch.nn.") and upper and not q.startswith(("torch.nn.functional", "torch.nn.parameter",
                                                                        "torch.nn.utils", "torch.nn.init")):
            if _LOSS_CLASS.search(last):
                return ("other", None)
            if last in ("Parameter", "ParameterList", "ParameterDict", "Buffer"):
                return None
            return ("model", None)
        if q in ("torch.compile", "torch.jit.script"):
            return None  # the role of its argument (handled by the caller)
        return None
    if top in _PLAIN_MODULES and last not in ("instantiate", "call", "get_class", "get_method", "getattr"):
        return ("other", None)  # json / yaml / omegaconf / numpy / os ... results are none of the roles
    if top == "torchvision" and ".models" in q and not upper:
        return ("model", None)
    if top in ("bitsandbytes", "bnb") and ".optim" in q and upper:
        return ("optimizer", None)
    if top == "apex":
        if "optimizers" in q and upper:
            return ("optimizer", None)
        if last == "DistributedDataParallel":
            return ("ddp_model", "ddp")
        return None
    if top in ("torch_optimizer", "lion_pytorch", "came_pytorch", "schedulefree", "prodigyopt", "dadaptation",
               "galore_torch", "muon", "adan_pytorch", "sophia") and upper:
        return ("optimizer", None)
    if top == "timm":
        if last in ("create_optimizer_v2", "create_optimizer") or (".optim" in q and upper):
            return ("optimizer", None)
        if last in ("create_scheduler", "create_scheduler_v2") or (".scheduler" in q and upper):
            return ("scheduler", None)
        if last == "create_model":
            return ("model", None)
        return None
    if top == "fairseq":
        if ".lr_scheduler" in q or last == "build_lr_scheduler":
            return ("scheduler", None)
        if ".optim" in q and (upper or last == "build_optimizer"):
            return ("optimizer", None)
        return None
    if top == "deepspeed":
        if last == "initialize":
            return ("deepspeed_engine", "deepspeed")
        if ".ops." in q and upper and ("adam" in q.lower() or "lamb" in q.lower() or "lion" in q.lower()):
            return ("optimizer", None)
        return None
    if top == "accelerate":
        if last == "Accelerator":
            return ("accelerator", None)
        if last == "DummyOptim":
            return ("optimizer", "deepspeed")
        if last == "DummyScheduler":
            return ("scheduler", "deepspeed")
        if last == "skip_first_batches":
            return ("dataloader", None)
        return None
    if top in ("lightning", "pytorch_lightning", "lightning_fabric"):
        if last == "Fabric":
            return ("fabric", None)
        if last == "Trainer":
            return ("trainer", None)
        return None
    if top in ("transformers", "diffusers", "peft", "trl", "sentence_transformers", "open_clip"):
        if last == "pipeline" or last.endswith("Pipeline") or re.search(r"PipelineFor[A-Z]", last):
            return ("pipeline", None)  # StableDiffusionPipeline, AutoPipelineForText2Image
        if top == "transformers" and last in ("AdamW", "Adafactor") or (last == "create_optimizer" and top == "transformers"):
            return ("optimizer", None)
        if re.match(r"get_\w*schedul\w*$", last) or (top in ("transformers", "diffusers") and last == "get_scheduler"):
            return ("scheduler", None)
        if last.endswith("Trainer"):
            return ("trainer", None)
        if top == "diffusers" and (last.endswith("Scheduler") or "schedulers" in q):
            return ("other", None)  # a noise scheduler: its .step() is a sampling step
        if last.endswith(("Tokenizer", "TokenizerFast", "Processor", "FeatureExtractor", "Config", "Arguments",
                          "Collator", "ImageProcessor")) or "tokeniz" in last.lower() or last.startswith("DataCollator"):
            return ("other", None)
        if last in ("get_peft_model", "prepare_model_for_kbit_training", "PeftModel", "SentenceTransformer") or (
            upper and (last.endswith(("Model", "LMHeadModel")) or "For" in last or last.startswith(("Auto", "UNet"))
                       or last in ("AutoencoderKL", "VQModel", "CLIPModel") or last.endswith("Transformer2DModel"))
        ):
            if last.startswith("Auto") and not last.startswith("AutoModel") and last != "AutoencoderKL":
                return ("other", None)  # AutoConfig, AutoTokenizer, AutoProcessor ...
            if top == "diffusers" and last.endswith("EMAModel"):
                return ("other", None)
            return ("model", None)
        return None
    # a project's own or an unknown package: the module path / the factory's name says what it builds
    if not upper and re.match(r"^(create|build|make|get|init|setup|configure)_\w*optimi[sz]er$", last) and \
            "sched" not in last:
        return ("optimizer", "import")
    if upper and (".optim" in mod or "optimizer" in mod.lower()) and "sched" not in mod.lower():
        if not _SCHED_CLASS.search(last):
            return ("optimizer", "import")
    if (upper or _SCHED_FACTORY.search(last)) and ("lr_scheduler" in mod or ".scheduler" in mod or "schedul" in last.lower()):
        if "diffusion" not in q.lower() and "noise" not in q.lower():
            return ("scheduler", "import")
    return None


_FAMILY_OF_QUALNAME = (
    ("callback", _lazy_re(r"^(transformers(\..*)?\.TrainerCallback|(lightning|pytorch_lightning)(\..*)?\.Callback)$")),
    ("dataset", _lazy_re(r"^(torch\.utils\.data(\.dataset)?\.(Dataset|IterableDataset)|datasets(\..*)?\.Dataset)$")),
    ("training_args", _lazy_re(r"^(transformers(\..*)?\.(Seq2Seq)?TrainingArguments|trl(\..*)?\.\w+Config)$")),
    # a LightningDataModule provides data: the "dataset" family (no "module" in the name: it is no nn.Module)
    ("dataset", _lazy_re(r"^(lightning|pytorch_lightning)(\..*)?\.LightningDataModule$")),
    ("trainer", _lazy_re(r"^(transformers|trl|lightning|pytorch_lightning)(\..*)?\.\w*Trainer$")),
    ("lightning_module", _lazy_re(r"^(lightning|pytorch_lightning)(\..*)?\.LightningModule$")),
    ("optimizer", _lazy_re(r"^torch\.optim(\.optimizer)?\.Optimizer$")),
    ("scheduler", _lazy_re(r"^torch\.optim\.lr_scheduler\.\w+$")),
    ("pipeline", _lazy_re(r"^(diffusers|transformers)(\..*)?\.\w*Pipeline(For[A-Z]\w*)?$")),
    ("module", _lazy_re(r"^(torch\.nn(\.modules)?(\.module)?\.\w+|transformers(\..*)?\.(PreTrainedModel|\w+PreTrainedModel|"
                          r"\w+Model|\w+For\w+)|diffusers(\..*)?\.(ModelMixin|\w+Model)|lightning(\..*)?\.LightningModule|"
                          r"transformers\.models\.\w+\.modeling_\w+\.(?!\w*Output$)\w+)$")),
)

_SIBLING_SKIP = ("torch", "transformers", "accelerate", "lightning", "pytorch_lightning", "deepspeed", "peft", "trl",
                 "diffusers", "timm", "apex", "bitsandbytes", "fairseq", "datasets", "numpy")
_FAMILY_ROLE = {
    "trainer": "trainer",
    "lightning_module": "lightning_module",
    "module": "model",
    "optimizer": "optimizer",
    "scheduler": "scheduler",
    "pipeline": "pipeline",
}


@dataclass
class _Binding:
    kind: str  # assign | unpack | param | iter
    value: Optional[cst.BaseExpression]
    node: cst.CSTNode
    scope: Scope  # the function / class the binding is evaluated in
    index: Optional[int] = None  # position in a tuple unpacking / in the parameter list
    func: Optional[cst.FunctionDef] = None  # the FunctionDef of a parameter
    seq: int = 0  # source order (SymbolTable's Assignment.seq); 0 for parameters and loop targets


# callee names _handed_to reads (besides scheduler-like ones)
_HANDED_LAST = frozenset({"step", "unscale_", "initialize", "DistributedDataParallel", "DDP", "FullyShardedDataParallel",
                          "FSDP", "DataParallel", "fully_shard", "compile", "setup", "accumulate", "clip_grad_norm_",
                          "clip_grad_value_"})
_ACCEL_METHODS = frozenset({"prepare", "unwrap_model", "gather_for_metrics", "prepare_model", "prepare_optimizer",
                            "prepare_scheduler", "prepare_data_loader", "wait_for_everyone",
                            "init_trackers", "end_training", "register_for_checkpointing", "skip_first_batches"})
_TARGET_KW = _lazy_re(r"^(target|targets|label|labels|y|y_true|gt|ground_truth|reference|ref)$")
_FWD_SKIP = _lazy_re(r"(loss|criterion|crit$|metric|score|^compute_|tokeniz|collat|augment|mixup|cutmix|transform|"
                       r"processor|prompting|encode_prompt|^to$|^get_)", re.I)


class Roles:
    """Roles of one file (see the module docstring for the contract)."""

    def __init__(self, table: SymbolTable) -> None:
        self.t = table
        self._bind: dict[tuple, list[_Binding]] = {}
        self._locals: dict[int, set[str]] = {}  # id(func) -> names bound in it
        self._usage: dict[tuple, list[Evidence]] = {}
        self._memo: dict[tuple, Optional[Role]] = {}
        self._busy: set = set()
        self._family: dict[int, tuple[Optional[str], Optional[str]]] = {}
        self._func_ids: dict[int, cst.FunctionDef] = {}
        self._callsites: dict[int, list[tuple[cst.Call, Scope, int]]] = {}  # id(def) -> (call, scope, self_offset)
        self._steps = 0
        self._loss_forwards: dict[int, list] = {}  # id(backward call) -> forward calls its loss comes from
        self._collect()

    # ------------------------------------------------------------------ public
    def of(self, target: Any, scope: Scope = None) -> Optional[Role]:
        if isinstance(target, cst.Call):
            return self.call_role(target, scope)
        if isinstance(target, cst.CSTNode):
            path = dotted(target)  # type: ignore[arg-type]
            if path is None:
                ev = self._expr_evidence(target, scope, 0)  # type: ignore[arg-type]
                return decide(ev)
        else:
            path = target
        if not path:
            return None
        r = self._path_role(path, scope)
        if (r is None or not r.confident) and scope is None and (0, path) not in self._bind and \
                (0, path) not in self._usage:
            # no scope given and nothing at module level: the path's role wherever it is bound, when all agree
            found = [self._key_role(k) for k in self._by_path().get(path, ())]
            found = [x for x in found if x is not None and x.confident]
            if found and len({x.role for x in found}) == 1:
                return found[0]
            if found:
                return None  # different things in different scopes: the name hint says nothing
        return r

    def _by_path(self) -> dict:
        bp = self.__dict__.get("_bp")
        if bp is None:
            bp = {}
            for k in list(self._bind) + list(self._usage):
                bp.setdefault(k[1], set()).add(k)
            self._bp = bp
        return bp

    def role(self, target: Any, scope: Scope = None) -> Optional[str]:
        r = self.of(target, scope)
        return r.role if r is not None else None

    def is_(self, target: Any, role: str, scope: Scope = None, confident: bool = False) -> bool:
        r = self.of(target, scope)
        return r is not None and r.role == role and (r.confident or not confident)

    def all(self, role: Optional[str] = None) -> list[tuple[Scope, str, Role]]:
        out = []
        keys = list(self._bind.keys()) + [k for k in self._usage if k not in self._bind]
        seen = set()
        for key in keys:
            if key in seen:
                continue
            seen.add(key)
            sid, path = key
            scope = self._scope_node(sid)
            r = self._key_role(key)
            if r is not None and (role is None or r.role == role):
                out.append((scope, path, r))
        return out

    def call_role(self, call: cst.Call, scope: Scope = None, index: Optional[int] = None) -> Optional[Role]:
        return decide(self._call_evidence(call, scope, index, 0))

    def is_forward(self, call: cst.Call, scope: Scope = None) -> Optional[bool]:
        """Whether ``call`` runs a graph-recording forward: ``model(x)``, ``self.model(x)``, ``model.forward(x)``,
        ``self(x)`` / ``self.forward(x)`` inside an nn.Module / LightningModule method. False for a pipeline or
        a known non-model; None when unknown."""
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "generate":
            # transformers' GenerationMixin.generate runs under torch.no_grad(): not graph-recording
            r = self._path_role(dotted(f.value) or "", scope) if dotted(f.value) else None
            if r is not None and r.confident and r.role in _MODEL_LIKE | {"pipeline"}:
                return False
            return None
        if isinstance(f, cst.Attribute) and f.attr.value == "forward":
            f = f.value
        path = dotted(f)
        if path is None:
            return None
        if path == "self":
            cls = self._class_of(scope)
            fam = self.class_family(cls) if cls is not None else None
            if fam in ("module", "lightning_module"):
                return True
            return None
        r = self._path_role(path, scope)
        if r is None or not r.confident:
            return None  # a name alone does not make a forward
        if r.role in ("model", "ddp_model", "deepspeed_engine", "lightning_module"):
            return True
        if r.role in ("pipeline", "other", "optimizer", "scheduler", "dataloader", "grad_scaler", "accelerator"):
            return False
        return None

    def loss_forwards(self, backward_call: cst.Call) -> list:
        """The forward calls (``model(**batch)``, ``self(x)``, ``unet(...)``) whose output the loss of this backward
        call (``loss.backward()``, ``accelerator.backward(loss)``, ``scaler.scale(loss).backward()``) is computed
        from, followed through the function's assignments and same-file helpers; [] when none is seen."""
        return list(self._loss_forwards.get(id(backward_call), ()))

    def legacy_kind(self, target: Any, scope: Scope = None) -> tuple[Optional[str], bool]:
        """(kind, confident) in the loop model's vocabulary: optimizer | scheduler | scaler | accelerator |
        engine | fabric | ddp | ds_optimizer | ds_scheduler | ds_dataloader | model | None."""
        r = self.of(target, scope)
        if r is None:
            return None, False
        k = r.role
        if r.wrapped_by == "deepspeed" and k in ("optimizer", "scheduler", "dataloader") and \
                r.qualname == "deepspeed.initialize":
            k = "ds_" + k
        k = {"grad_scaler": "scaler", "deepspeed_engine": "engine", "ddp_model": "ddp"}.get(k, k)
        return k, r.confident

    _RECEIVER_KINDS = frozenset({"optimizer", "scheduler", "scaler", "accelerator", "engine", "fabric", "ddp",
                                 "ds_optimizer", "ds_scheduler", "ds_dataloader"})

    def receiver_kind(self, target: Any, scope: Scope = None) -> tuple[Optional[str], bool]:
        """(kind, confident) of a call's receiver for the loop model and the dry run: ``legacy_kind`` when it is one
        of the training machinery's kinds (optimizer | scheduler | scaler | accelerator | engine | fabric | ddp |
        ds_optimizer | ds_scheduler | ds_dataloader); (None, False) for a model, a data loader, "other" or unknown."""
        k, conf = self.legacy_kind(target, scope)
        if k in self._RECEIVER_KINDS:
            return k, conf
        return None, False

    def class_family(self, cls: Optional[cst.ClassDef], hints: bool = False) -> Optional[str]:
        if cls is None:
            return None
        fam, _ = self._class_info(cls, 0)
        if fam is None and hints:
            last = cls.name.value
            for b in cls.bases:
                d = dotted(b.value) or ""
                if d.split(".")[-1].endswith("Trainer"):
                    return "trainer"
            if last.endswith("Trainer"):
                return "trainer"
        return fam

    def class_base(self, cls: Optional[cst.ClassDef]) -> Optional[str]:
        if cls is None:
            return None
        return self._class_info(cls, 0)[1]

    # ------------------------------------------------------------------ collection (no tree walk)
    def _collect(self) -> None:
        t = self.t
        for d in t.defs:
            if isinstance(d, cst.FunctionDef):
                self._func_ids[id(d)] = d
                names = self._locals.setdefault(id(d), set())
                for i, p in enumerate(_params(d)):
                    names.add(p.name.value)
                    self._add((self._sid_for(p.name.value, d), p.name.value),
                              _Binding("param", p.annotation.annotation if p.annotation else None, p, d, i, d))
        for name, assigns in t.assignments.items():
            for a in assigns:
                if "." not in name and a.func is not None:
                    self._locals.setdefault(id(a.func), set()).add(name)
        for names, call, func in t.unpacks:
            if func is not None:
                for n in names:
                    if n and "." not in n:
                        self._locals.setdefault(id(func), set()).add(n)
        for node, func, _ in t.loop_nodes:
            if isinstance(node, cst.For) and func is not None:
                for n in _target_names(node.target):
                    self._locals.setdefault(id(func), set()).add(n)
        self._loop_targets: set = set()
        for node, func, _ in t.loop_nodes:
            if isinstance(node, cst.For):
                for n in _target_names(node.target):
                    self._loop_targets.add((self._sid_for(n, func), n))
        body_nodes = getattr(t, "class_body_nodes", ())
        for name, assigns in t.assignments.items():
            for a in assigns:
                if id(a.node) in body_nodes:
                    continue  # a class attribute, not a module-level name
                if isinstance(a.node, (cst.Assign, cst.AnnAssign)) and a.value is not None and name != "_":
                    self._add((self._sid_for(name, a.func), name),
                              _Binding("assign", a.value, a.node, a.func, seq=getattr(a, "seq", 0)))
        useq = getattr(t, "unpack_seq", {})
        for names, call, func in t.unpacks:
            for i, n in enumerate(names):
                if n and n != "_":
                    self._add((self._sid_for(n, func), n), _Binding("unpack", call, call, func, i, seq=useq.get(id(call), 0)))
        for node, func, _ in t.loop_nodes:
            if not isinstance(node, cst.For):
                continue
            for n, it in _loop_elements(node.target, node.iter):
                self._add((self._sid_for(n, func), n), _Binding("iter", it, node, func))
        # call sites of the file's own functions / classes (parameters take their arguments' roles)
        self._appends: dict[str, list] = {}
        method_names = {m for ms in t.class_methods.values() for m in ms}
        def_names = set(t.functions) | set(t.classes)
        for call, name, func in t.calls:
            last = name.rpartition(".")[2]
            if (last == "append" or last == "extend") and call.args:
                self._appends.setdefault(name.rsplit(".", 1)[0], []).append((call, func))
            if last not in method_names and last not in def_names:
                continue  # cannot be a call of this file's own function / method / class
            target = self._callee_def(call, func)
            if target is not None:
                fn, offset = target
                self._callsites.setdefault(id(fn), []).append((call, func, offset))
        self._collect_usage()

    def _spend(self) -> bool:
        """One evaluation step; True once the file's budget is spent (a safety net: a pathological file gets
        fewer roles, never a hang)."""
        self._steps += 1
        return self._steps > _STEP_BUDGET

    def _add(self, key: tuple, b: _Binding) -> None:
        self._bind.setdefault(key, []).append(b)

    def _sid_for(self, path: str, func: Scope) -> int:
        """Scope id a path read/written in ``func`` belongs to: 0 = module, id(class) for self.x, id(def)."""
        head = path.split(".")[0]
        if head == "self" or head == "cls":
            cls = self._class_of(func)
            if cls is not None:
                return id(cls)
        f = func
        while f is not None:
            if isinstance(f, cst.FunctionDef):
                if head in self._locals.get(id(f), ()):
                    return id(f)
            f = self.t.scope_parent.get(id(f))
        return 0

    def _scope_node(self, sid: int) -> Scope:
        if sid == 0:
            return None
        if sid in self._func_ids:
            return self._func_ids[sid]
        for c in self.t.classes.values():
            if id(c) == sid:
                return c
        return None

    def _class_of(self, func: Scope) -> Optional[cst.ClassDef]:
        f = func
        while f is not None:
            if isinstance(f, cst.ClassDef):
                return f
            f = self.t.scope_parent.get(id(f))
        return None

    def _callee_def(self, call: cst.Call, func: Scope) -> Optional[tuple[cst.FunctionDef, int]]:
        """The same-file FunctionDef a call runs, with the count of implicit leading parameters (self)."""
        f = call.func
        if isinstance(f, cst.Name):
            name = f.value
            if name in self.t.imports:
                return None
            defs = self.t.module_funcs.get(name)
            if defs and len(defs) == 1:
                return defs[0], 0
            # a nested function of the enclosing function
            cands = [d for d in self.t.functions.get(name, []) if id(d) not in self.t.method_class]
            if len(cands) == 1:
                return cands[0], 0
            cls = self.t.classes.get(name)
            if cls is not None:
                init = self.t.class_methods.get(name, {}).get("__init__")
                if init is not None:
                    return init, 1
            return None
        if isinstance(f, cst.Attribute) and not (isinstance(f.value, cst.Name) and f.value.value == "self"):
            # ``raw_model.configure_optimizers(...)`` where ``raw_model = GPT(...)`` (a class of this file)
            recv = dotted(f.value)
            if recv and recv.split(".")[0] not in self.t.imports:
                cls: Optional[cst.ClassDef] = self._instance_class(f.value, func, 0)
                if cls is not None:
                    while cls is not None:
                        m = self.t.class_methods.get(cls.name.value, {}).get(f.attr.value)
                        if m is not None:
                            return m, 0 if _is_static(m) else 1
                        cls = self._own_base(cls)
            return None
        if isinstance(f, cst.Attribute) and isinstance(f.value, cst.Name) and f.value.value == "self":
            cls = self._class_of(func)
            while cls is not None:
                m = self.t.class_methods.get(cls.name.value, {}).get(f.attr.value)
                if m is not None:
                    return m, 0 if _is_static(m) else 1
                cls = self._own_base(cls)
        return None

    def _instance_class(self, e: cst.BaseExpression, func: Scope, depth: int) -> Optional[cst.ClassDef]:
        """The same-file class an expression is an instance of: ``GPT(...)``, a name bound to one, ``m.module``,
        ``DDP(m)`` / ``torch.compile(m)``, ``a if c else b`` when both agree."""
        if self._spend():
            return None
        if depth > 5:
            return None
        if isinstance(e, cst.Call):
            if isinstance(e.func, cst.Name) and e.func.value in self.t.classes and e.func.value not in self.t.imports:
                return self.t.classes[e.func.value]
            q = self.t.qualname(e.func) or ""
            if q.split(".")[-1] in ("compile", "DistributedDataParallel", "DDP", "DataParallel",
                                    "FullyShardedDataParallel", "FSDP") and e.args:
                return self._instance_class(e.args[0].value, func, depth + 1)
            return None
        if isinstance(e, cst.IfExp):
            a = self._instance_class(e.body, func, depth + 1)
            return a if a is not None and a is self._instance_class(e.orelse, func, depth + 1) else None
        if isinstance(e, cst.Attribute) and e.attr.value in ("module", "_orig_mod"):
            return self._instance_class(e.value, func, depth + 1)
        d = dotted(e)
        if not d:
            return None
        found = None
        for b in self._bind.get((self._sid_for(d, func), d), [])[:4]:
            if b.kind != "assign" or b.value is None:
                continue
            c = self._instance_class(b.value, b.scope, depth + 1)
            if c is not None:
                if found is not None and c is not found:
                    return None
                found = c
        return found

    def _own_base(self, cls: cst.ClassDef) -> Optional[cst.ClassDef]:
        for b in cls.bases:
            d = dotted(b.value)
            if d and d in self.t.classes and self.t.classes[d] is not cls:
                return self.t.classes[d]
        return None

    def _collect_usage(self) -> None:
        """Evidence from what is done with a receiver (method calls on it, what it is handed to)."""
        t = self.t
        methods: dict[tuple, dict[str, list[cst.Call]]] = {}
        bw_funcs: set[int] = set()
        for call, name, func in t.calls:
            f = call.func
            if isinstance(f, cst.Attribute):
                recv = dotted(f.value)
                attr = f.attr.value
                if attr in ("backward", "manual_backward"):
                    bw_funcs.add(id(func) if func is not None else 0)
                if recv:
                    key = (self._sid_for(recv, func), recv)
                    methods.setdefault(key, {}).setdefault(attr, []).append(call)
            self._handed_to(call, name, func)
        stmt_ids = {id(c) for c, _ in t.stmt_calls}
        ds_here = any(q == "deepspeed" or q.startswith("deepspeed.") for q in t.imports.values())
        called = set()
        for call, name, func in t.calls:
            d = dotted(call.func)
            if d:
                called.add((self._sid_for(d, func), d))
        for key, ms in methods.items():
            path = key[1]
            if path == "self" or (key[0] == 0 and path.split(".")[0] in t.imports):
                continue
            if "accumulate" in ms and not any(c.args for c in ms["accumulate"]):
                del ms["accumulate"]

            def first(*names):
                for n in names:
                    if n in ms:
                        return ms[n][0]
                return None

            # grad scaler: scale + (update | step(x) | unscale_)
            if "scale" in ms and ("update" in ms or "unscale_" in ms or "step" in ms):
                self._ev(key, "usage", "grad_scaler", f"`{path}.scale(loss)` and `{path}.update()`", first("scale"))
            elif "unscale_" in ms:
                self._ev(key, "usage", "grad_scaler", f"`{path}.unscale_(...)`", first("unscale_"))
            # accelerator / fabric
            acc_calls = _ACCEL_METHODS & set(ms)
            if acc_calls or ("accumulate" in ms and "backward" in ms):
                c = first(*sorted(acc_calls)) if acc_calls else first("accumulate")
                self._ev(key, "usage", "accelerator", f"`{path}.{c.func.attr.value}(...)`", c)  # type: ignore[union-attr]
            fab = {"setup_dataloaders", "setup_module", "setup_optimizers", "clip_gradients", "no_backward_sync",
                   "launch", "backward", "setup"} & set(ms)
            if len(fab) >= 2 and fab & {"setup_dataloaders", "setup_module", "setup_optimizers", "clip_gradients",
                                        "no_backward_sync"}:
                c = first("setup_dataloaders", "setup_module", "setup_optimizers", "clip_gradients", "no_backward_sync")
                self._ev(key, "usage", "fabric", f"`{path}.{c.func.attr.value}(...)`", c)  # type: ignore[union-attr]
            # optimizer: stepped and zeroed (a model has zero_grad but no step; an engine has backward)
            if "step" in ms and "zero_grad" in ms and "backward" not in ms:
                steps_noarg = [c for c in ms["step"] if len(c.args) <= 1]
                if steps_noarg:
                    self._ev(key, "usage", "optimizer", f"`{path}.step()` and `{path}.zero_grad()`", steps_noarg[0])
            if "backward" in ms and "step" in ms and not ({"prepare", "accumulate"} & set(ms)) and \
                    (ds_here or key in called or _ENGINE_AS_MODEL & set(ms)):
                # ``x.backward(loss)`` and ``x.step()`` is also the shape of other libraries' optimizer wrappers
                # (fairseq's FP16Optimizer, OpenNMT's Optimizer, a project's training backend), which are never the
                # model: an engine where the module uses DeepSpeed, or where the object is also run as the model
                bwc = [c for c in ms["backward"] if c.args]
                if bwc and not ({"setup", "setup_dataloaders", "clip_gradients"} & set(ms)):
                    self._ev(key, "usage", "deepspeed_engine", f"`{path}.backward(loss)` and `{path}.step()`", bwc[0])
            if ("get_last_lr" in ms or "get_lr" in ms) and "step" in ms and "zero_grad" not in ms:
                self._ev(key, "usage", "scheduler", f"`{path}.get_last_lr()`", first("get_last_lr", "get_lr"))
            # model usage
            model_calls = [m for m in ("parameters", "named_parameters", "gradient_checkpointing_enable",
                                       "resize_token_embeddings", "get_input_embeddings",
                                       "named_modules", "enable_input_require_grads", "print_trainable_parameters")
                           if m in ms]
            iter_bound = key in self._loop_targets
            stmt_model = [m for m in ("to", "cuda", "eval") if m in ms and any(id(c) in stmt_ids for c in ms[m])
                          and not iter_bound]
            if model_calls or stmt_model:
                m = (model_calls or stmt_model)[0]
                self._ev(key, "usage", "model", f"`{path}.{m}(...)`", ms[m][0], weak=True)
        self._bw_funcs = bw_funcs
        self._methods = methods
        for call, func in t.backward_calls:
            self._loss_sources(call, func)
        # a loader: iterated by the innermost for-loop whose body runs a backward (``enumerate(x)``, ``tqdm(x)``)
        innermost = set()
        for c, _f in t.backward_calls:
            loops = getattr(t, "backward_loops", {}).get(id(c)) or []
            if loops:
                innermost.add(id(loops[-1]))
        for node, func, _ in t.loop_nodes:
            if not isinstance(node, cst.For) or id(node) not in innermost:
                continue  # no backward inside, or an outer (epoch) loop around the micro-batch loop
            it = node.iter
            while isinstance(it, cst.Call) and (call_name(it) or "").rpartition(".")[2] in ("enumerate", "tqdm", "iter",
                                                                                             "islice", "zip") and it.args:
                it = it.args[0].value
            d = dotted(it)
            if d and d != "self" and d.split(".")[0] not in t.imports:
                key = (self._sid_for(d, func), d)
                if any(b.kind == "assign" and isinstance(b.value, (cst.List, cst.Tuple, cst.Set, cst.Dict, cst.ListComp,
                                                                  cst.DictComp, cst.GeneratorExp))
                       for b in self._bind.get(key, ())):
                    continue  # a list of optimizers / models / losses, not a loader
                tgt = _target_names(node.target)
                if any(n in ("step", "zero_grad") for tn in tgt for n in methods.get((self._sid_for(tn, func), tn), {})):
                    continue  # ``for opt in optimizers: opt.step()``
                self._ev(key, "usage", "dataloader",
                         f"iterated by the training loop (`for ... in {_code(node.iter)}`)", node, weak=True)

    def _loss_sources(self, call: cst.Call, func: Scope) -> None:
        """A model is what produces the loss that reaches a backward: follow the loss back through the
        function's assignments to the calls that compute it."""
        f = call.func
        loss: Optional[cst.BaseExpression] = None
        if isinstance(f, cst.Attribute):
            a0 = positional(call, 0)
            loss = a0 if a0 is not None else f.value
        if loss is None:
            return
        seen: set = set()
        found: list = []
        self._trace_loss(loss, func, 0, seen, found)
        self._loss_forwards[id(call)] = [node for _p, _s, node in found if isinstance(node, cst.Call)]
        bw = _code(call)
        for path, scope, node in found:
            key = (self._sid_for(path, scope), path)
            self._ev(key, "usage", "model", f"`{_code(node)}` produces the loss of `{bw}`", node)

    def _trace_loss(self, expr: cst.BaseExpression, func: Scope, depth: int, seen: set, found: list) -> None:
        """Walk back from a loss expression: names to their bindings, method calls to their receivers and
        arguments, function calls (a criterion, ``F.cross_entropy``) to their first argument (the prediction, not
        the target); a call that is a forward candidate ends the walk there."""
        if depth > 5 or len(found) > 6:
            return
        stack = [expr]
        while stack:
            n = stack.pop()
            if isinstance(n, cst.Call):
                # a forward's inputs can come from another forward (``D(G(z))``): its arguments are walked too
                if not self._forward_candidate(n, func, depth, seen, found):
                    f = n.func
                    if isinstance(f, cst.Attribute) and not (dotted(f) and dotted(f).split(".")[0] in self.t.imports):
                        stack.append(f.value)
                stack.extend(a.value for a in n.args if a.keyword is None or not _TARGET_KW.match(a.keyword.value))
            elif isinstance(n, cst.Name):
                if n.value in ("self", "True", "False", "None"):
                    continue
                key = (self._sid_for(n.value, func), n.value)
                if key in seen:
                    continue
                seen.add(key)
                for b in self._bind.get(key, [])[:4]:
                    if b.kind in ("assign", "unpack") and b.value is not None:
                        self._trace_loss(b.value, b.scope, depth + 1, seen, found)
            elif isinstance(n, cst.Attribute):
                stack.append(n.value)
            elif isinstance(n, (cst.Lambda, cst.FunctionDef, cst.ClassDef)):
                continue
            else:
                from bertlint.analysis.walk import children

                stack.extend(children(n))

    def _forward_candidate(self, call: cst.Call, func: Scope, depth: int, seen: set, found: list) -> bool:
        """Record ``call`` when it may be the forward that produced the loss; True when the walk stops here."""
        f = call.func
        if isinstance(f, cst.Attribute) and f.attr.value == "forward":
            f = f.value
        path = dotted(f)
        if not path:
            return False
        parts = path.split(".")
        if parts[0] in self.t.imports or path in self.t.classes:
            return False
        if _FWD_SKIP.search(parts[-1]):
            return False
        target = self._callee_def(call, func) if path != "self" else None
        if target is not None:
            fn, offset = target
            if ("def", id(fn)) in seen or depth > 3:
                return True
            seen.add(("def", id(fn)))
            inner: list = []
            for r in self.t.returns.get(id(fn), [])[:3]:
                self._trace_loss(r, fn, depth + 1, seen, inner)
            names = [p.name.value for p in _params(fn)]
            for ipath, iscope, node in inner:
                if iscope is fn and ipath in names:  # a parameter of the helper: the argument at this call
                    i = names.index(ipath) - offset
                    arg = positional(call, i) if i >= 0 else None
                    arg = arg if arg is not None else kwarg(call, ipath)
                    d = dotted(arg) if arg is not None else None
                    if d:
                        found.append((d, func, node))
                else:
                    found.append((ipath, iscope, node))
            return True
        if path == "self":
            found.append(("self", func, call))
            return True
        key = (self._sid_for(path, func), path)
        if key in self._bind or (parts[0] == "self" and len(parts) == 2) or (len(parts) > 1 and parts[-1] == "module"):
            for b in self._bind.get(key, ()):
                if b.kind != "assign" or b.value is None:
                    continue
                if not isinstance(b.value, cst.Call) and self.t.qualname(b.value):
                    return False  # a class alias (``Tensor = torch.cuda.FloatTensor``)
                if isinstance(b.value, cst.Call):
                    c = classify_qualname(self.t.qualname(b.value.func) or "")
                    if c is not None and c[0] == "other":
                        return False  # a loss module, a tokenizer ...
            found.append((path, func, call))
            return True
        return False

    def _ev(self, key: tuple, kind: str, role: str, why: str, node, weak: bool = False, **kw) -> None:
        e = Evidence("import" if weak and kind == "usage" else kind, role, why, node, **kw)
        self._usage.setdefault(key, []).append(e)

    def _arg_key(self, expr: Optional[cst.BaseExpression], func: Scope) -> Optional[tuple]:
        if expr is None:
            return None
        if isinstance(expr, cst.Call) and isinstance(expr.func, cst.Attribute) and expr.func.attr.value in (
            "parameters", "named_parameters"
        ):
            return None
        d = dotted(expr)
        if d is None or d == "self":
            return None
        return (self._sid_for(d, func), d)

    def _handed_to(self, call: cst.Call, name: str, func: Scope) -> None:
        last = name.rpartition(".")[2]
        if last not in _HANDED_LAST and not _SCHED_CLASS.search(last) and not last.startswith("get_"):
            return
        q = self.t.qualname(call.func) or name
        recv = dotted(call.func.value) if isinstance(call.func, cst.Attribute) else None
        a0 = positional(call, 0)
        if last in ("step", "unscale_") and recv and len(call.args) == 1 and a0 is not None and recv != "self":
            # scaler.step(optimizer): only when the receiver is a scaler (by usage or constructor): checked lazily
            k = self._arg_key(a0, func)
            if k:
                self._usage.setdefault(k, []).append(
                    _Lazy("optimizer", f"handed to `{name}(...)`", call, (self._sid_for(recv, func), recv), "grad_scaler"))
        if q.endswith("deepspeed.initialize") or name == "deepspeed.initialize":
            for kw, role in (("optimizer", "optimizer"), ("model", "model"), ("lr_scheduler", "scheduler")):
                k = self._arg_key(kwarg(call, kw), func)
                if k:
                    self._ev(k, "usage", role, f"`deepspeed.initialize({kw}=...)`", call)
        if last in ("DistributedDataParallel", "DDP", "FullyShardedDataParallel", "FSDP", "DataParallel",
                    "fully_shard", "compile") and (q.startswith("torch") or q.startswith("apex")):
            k = self._arg_key(a0 if a0 is not None else kwarg(call, "module"), func)
            if k:
                self._ev(k, "usage", "model", f"wrapped in `{last}(...)`", call)
        # handed to a scheduler constructor: the optimizer it schedules
        c = classify_qualname(q) if q else None
        if c is not None and c[0] == "scheduler" and c[1] != "import":
            opt_arg = kwarg(call, "optimizer")
            if opt_arg is None and (q.startswith("torch.optim.") or (q.split(".")[0] in ("transformers", "diffusers")
                                                                     and last.startswith("get_"))):
                # torch schedulers and transformers/diffusers get_*schedule*(optimizer, ...) / get_scheduler(name, optimizer)
                opt_arg = positional(call, 1 if last == "get_scheduler" else 0)
            k = self._arg_key(opt_arg, func)
            if k:
                self._ev(k, "usage", "optimizer", f"handed to `{name}(...)`", call)
        # fabric.setup(model, *optimizers)
        if last == "setup" and recv and len(call.args) >= 2:
            rkey = (self._sid_for(recv, func), recv)
            for i, a in enumerate(call.args):
                if a.keyword is not None or a.star:
                    continue
                k = self._arg_key(a.value, func)
                if k:
                    self._usage.setdefault(k, []).append(
                        _Lazy("model" if i == 0 else "optimizer", f"`{name}(...)` position {i}", call, rkey, "fabric"))
        if last == "accumulate" and recv:
            for a in call.args:
                k = self._arg_key(a.value, func)
                if k:
                    self._usage.setdefault(k, []).append(
                        _Lazy("model", f"`{name}(...)`", call, (self._sid_for(recv, func), recv), "accelerator"))
        if last in ("clip_grad_norm_", "clip_grad_value_") and a0 is not None:
            if isinstance(a0, cst.Call) and isinstance(a0.func, cst.Attribute) and a0.func.attr.value == "parameters":
                k = self._arg_key(a0.func.value, func)
                if k:
                    self._ev(k, "usage", "model", f"`{name}({dotted(a0.func.value)}.parameters())`", call, weak=True)

    # ------------------------------------------------------------------ evaluation
    def _path_role(self, path: str, scope: Scope) -> Optional[Role]:
        key = (self._sid_for(path, scope), path)
        r = self._key_role(key)
        if r is None and key[0] != 0 and "." in path:
            pass
        return r

    def _key_role(self, key: tuple) -> Optional[Role]:
        if key in self._memo:
            return self._memo[key]
        if key in self._busy:
            return None
        self._busy.add(key)
        try:
            ev = self._key_evidence(key, 0)
            r = decide(ev)
        finally:
            self._busy.discard(key)
        self._memo[key] = r
        return r

    def _key_evidence(self, key: tuple, depth: int) -> list:
        sid, path = key
        ev: list = []
        # the latest binding first: on a tie between two constructors (``ema = Unet(...)`` then
        # ``ema = EMAModel(ema.parameters())``) the value the later code sees wins
        for b in sorted(self._bind.get(key, []), key=lambda b: -b.seq):
            ev.extend(self._binding_evidence(b, path, depth))
        for e in self._usage.get(key, []):
            if isinstance(e, _Lazy):
                r = self._key_role(e.recv_key)
                if r is not None and r.role == e.recv_role and r.confident:
                    ev.append(Evidence("usage", e.role, e.why, e.node))
            else:
                ev.append(e)
        if path == "self" and sid != 0:
            cls = self._scope_node(sid)
            if isinstance(cls, cst.ClassDef):
                fam, base = self._class_info(cls, 0)
                if fam in _FAMILY_ROLE:
                    ev.append(Evidence("constructor", _FAMILY_ROLE[fam], f"`self` in a subclass of {base}", cls, base))
        if not ev and "." in path:
            ev.extend(self._attr_of_role(path, sid, depth))
        if not any(e.kind != "name" for e in ev):
            ms = self._methods.get(key, {})
            if "step" in ms and "zero_grad" not in ms and "backward" not in ms:
                for b in self._bind.get(key, [])[:4]:
                    if b.kind == "assign" and isinstance(b.value, cst.Call):
                        opt = self._optimizer_arg(b.value, b.scope, 0)
                        if opt:
                            ev.append(Evidence("usage", "scheduler", f"built on the optimizer `{opt}` and stepped "
                                               f"(`{path}.step()`), never zeroed", b.value))
                            break
        if not any(e.kind != "name" for e in ev):
            h = name_hint(path)
            if h:
                ev.append(Evidence("name", h, f"named `{path.split('.')[-1]}`", None))
        return ev

    def _attr_of_role(self, path: str, sid: int, depth: int) -> list:
        """``engine.optimizer``, ``model.module``, ``trainer.model``, ``accelerator.scaler`` ..."""
        owner, _, attr = path.rpartition(".")
        okey = (sid if owner.split(".")[0] in ("self", "cls") or sid != 0 else 0, owner)
        if depth > 4:
            return []
        r = self._key_role(okey)
        if r is None or not r.confident:
            return []
        role = _ATTR_ROLES.get((r.role, attr))
        if role:
            return [Evidence("usage", role, f"`.{attr}` of the {r.role} `{owner}`", r.node)]
        return []

    def _binding_evidence(self, b: _Binding, path: str, depth: int) -> list:
        if depth > 8:
            return []
        if b.kind == "param":
            return self._param_evidence(b, path, depth)
        if b.kind == "iter":
            return self._element_evidence(b.value, b.scope, depth)
        if b.value is None:
            return []
        if b.kind == "unpack" and isinstance(b.value, cst.Call):
            return self._call_evidence(b.value, b.scope, b.index, depth + 1, before=b.seq)
        if b.kind == "assign" and _is_plain_literal(b.value) and not _is_none(b.value):
            return [Evidence("constructor", "other", f"`{path} = {_code(b.value)}`", b.node)]
        return self._expr_evidence(b.value, b.scope, depth + 1, before=b.seq)

    def _param_evidence(self, b: _Binding, path: str, depth: int) -> list:
        ev: list = []
        p: cst.Param = b.node  # type: ignore[assignment]
        fn = b.func
        if b.value is not None:  # annotation
            q = self.t.qualname(b.value) or dotted(b.value) or ""
            fam = _family_of_qualname(q)
            if fam in _FAMILY_ROLE:
                ev.append(Evidence("annotation", _FAMILY_ROLE[fam], f"annotated `{q}`", p, q))
            else:
                c = classify_qualname(q)
                if c:
                    ev.append(Evidence("annotation", c[0], f"annotated `{q}`", p, q))
                elif q in self.t.classes:
                    fam, base = self._class_info(self.t.classes[q], 0)
                    if fam in _FAMILY_ROLE:
                        ev.append(Evidence("annotation", _FAMILY_ROLE[fam], f"annotated `{q}` ({base})", p, base))
                elif q in _PLAIN_TYPES:
                    ev.append(Evidence("annotation", "other", f"annotated `{q}`", p, q))
        if p.default is not None and _is_plain_literal(p.default):
            ev.append(Evidence("import", "other", f"defaults to `{_code(p.default)}`", p))
        if fn is None:
            return ev
        # the framework calls these methods: transformers.Trainer.compute_loss(self, model, inputs, ...)
        if fn.name.value in _TRAINER_MODEL_METHODS and b.index == 1:
            cls = self._class_of(fn)
            if cls is not None and self.class_family(cls) == "trainer":
                base = self.class_base(cls)
                ev.append(Evidence("annotation", "model", f"the model argument of {base}.{fn.name.value}()", p, base))
        name = p.name.value
        params = _params(fn)
        idx = b.index or 0
        kwonly = p in fn.params.kwonly_params
        site_ev: list = []
        site_roles: set = set()
        for call, cscope, offset in self._callsites.get(id(fn), [])[:12]:
            arg = None
            j = idx - offset
            pos_args = [a for a in call.args if a.keyword is None]
            if not kwonly and j >= 0:
                if any(a.star for a in pos_args[: j + 1]):
                    continue  # ``f(*xs)``: which argument lands here is unknown
                if j < len(pos_args):
                    arg = pos_args[j].value
            if arg is None:
                arg = kwarg(call, name)
            if arg is None:
                continue
            sub = decide(self._expr_evidence(arg, cscope, depth + 1))
            if sub is None or not sub.confident:
                continue
            site_roles.add(sub.role)
            e = next(x for x in sub.evidence if x.role == sub.role)
            site_ev.append(Evidence("usage", sub.role, f"argument `{_short_text(arg)}` at a call of `{fn.name.value}()`: {e.why}",
                                    e.node, sub.qualname, sub.wrapped_by, sub.origin))
        # a generic helper called with different things (``exists(x)``) takes no role from its call sites
        if len(site_roles) == 1 or (site_roles and site_roles <= _MODEL_LIKE):
            ev.extend(site_ev)
        del params
        return ev

    def _element_evidence(self, it: Optional[cst.BaseExpression], scope: Scope, depth: int) -> list:
        if self._spend():
            return []
        if it is None or depth > 6:
            return []
        if isinstance(it, (cst.List, cst.Tuple, cst.Set)):
            roles = [decide(self._expr_evidence(e.value, scope, depth + 1)) for e in it.elements]
            if roles and all(r is not None and r.confident for r in roles) and len({r.role for r in roles}) == 1:
                return [Evidence("usage", roles[0].role, f"element of `{_code(it)}`", it)]
            return []
        if isinstance(it, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            r = decide(self._expr_evidence(it.elt, scope, depth + 1))
            if r is not None and r.confident:
                return [Evidence("usage", r.role, f"element of `[{_code(it.elt)} for ...]`", it, r.qualname,
                                 r.wrapped_by)]
            return []
        if isinstance(it, cst.Call) and isinstance(it.func, cst.Attribute) and it.func.attr.value == "values" and depth < 6:
            return []
        d = dotted(it)
        if d:
            key = (self._sid_for(d, scope), d)
            out = []
            for b in self._bind.get(key, []):
                if b.kind == "assign" and b.value is not None:
                    out.extend(self._element_evidence(b.value, b.scope, depth + 1))
            # ``schedulers = []; schedulers.append(s)``: the appended things; ``self.optimizer["adam"] = Adam(...)``:
            # the items stored
            roles = []
            for call, func in self._appends.get(d, ())[:6]:
                if (call_name(call) or "").endswith(".append"):
                    roles.append(decide(self._expr_evidence(call.args[0].value, func, depth + 1)))
            how = "appended to"
            if not roles:
                for _key, value, func in (getattr(self.t, "item_assigns", {}).get(d) or ())[:6]:
                    if d.startswith("self.") or func is scope or func is None:
                        roles.append(decide(self._expr_evidence(value, func, depth + 1)))
                        how = "stored in"
            if roles and all(r is not None and r.confident for r in roles) and len({r.role for r in roles}) == 1:
                out.append(Evidence("usage", roles[0].role, f"{how} `{d}`", it, roles[0].qualname,
                                    roles[0].wrapped_by))
            return out
        return []

    def _expr_evidence(self, expr: cst.BaseExpression, scope: Scope, depth: int, before: int = 0) -> list:
        if self._spend():
            return []
        if depth > 10:
            return []
        if isinstance(expr, cst.Call):
            return self._call_evidence(expr, scope, None, depth + 1, before=before)
        if isinstance(expr, cst.IfExp):
            a = decide(self._expr_evidence(expr.body, scope, depth + 1))
            b = decide(self._expr_evidence(expr.orelse, scope, depth + 1))
            if a is not None and b is not None and a.role == b.role:
                return list(a.evidence)
            if a is not None and b is not None and a.confident and b.confident and {a.role, b.role} <= _MODEL_LIKE:
                # ``model.module if ddp else model``: a model either way
                return [Evidence("usage", "model", f"`{_code(expr)}` (a model either way)", expr)]
            if a is not None and _is_none(expr.orelse):
                return list(a.evidence)
            if b is not None and _is_none(expr.body):
                return list(b.evidence)
            return []
        if isinstance(expr, cst.Subscript) and isinstance(expr.value, cst.Call):
            idx = _index_of(expr)
            if idx is not None:
                return self._call_evidence(expr.value, scope, idx, depth + 1)
            return []
        if isinstance(expr, cst.Subscript) and dotted(expr.value) and len(expr.slice) == 1 and \
                isinstance(expr.slice[0].slice, cst.Index):
            return self._element_evidence(expr.value, scope, depth + 1)  # ``schedulers[i]``
        if isinstance(expr, cst.Await):
            return self._expr_evidence(expr.expression, scope, depth + 1)
        d = dotted(expr)
        if d:
            key = (self._sid_for(d, scope), d)
            if before:
                # ``model_without_ddp = model`` before ``model = DDP(model)``: only the bindings made so far count
                binds = self._bind.get(key, [])
                if any(b.seq >= before for b in binds) and any(0 < b.seq < before for b in binds):
                    ev: list = []
                    for b in binds:
                        if 0 < b.seq < before or b.kind in ("param", "iter"):
                            ev.extend(self._binding_evidence(b, d, depth + 1))
                    ev.extend(e for e in self._usage.get(key, []) if not isinstance(e, _Lazy))
                    r = decide(ev)
                    return list(r.evidence) if r is not None and r.confident else []
            if key in self._busy:
                return []
            r = self._key_role(key)
            return list(r.evidence) if r is not None and r.confident else []
        return []

    def _call_evidence(self, call: cst.Call, scope: Scope, index: Optional[int], depth: int, before: int = 0) -> list:
        if self._spend():
            return []
        if depth > 10:
            return []
        f = call.func
        name = call_name(call) or ""
        last = name.split(".")[-1]
        q = self.t.qualname(f) or ""
        recv_expr = f.value if isinstance(f, cst.Attribute) else None
        recv = dotted(recv_expr) if recv_expr is not None else None
        ev: list = []

        # --- a command-line namespace (``opt = parser.parse_args()``: an ``opt`` that is no optimizer)
        if last in ("parse_args", "parse_known_args", "parse_args_into_dataclasses", "parse_json_file",
                    "parse_yaml_file", "parse_dict", "parse_intermixed_args"):
            return [Evidence("constructor", "other", f"the result of `{name}(...)`", call)]
        # --- LightningModule.optimizers() / .lr_schedulers() (manual optimization)
        if recv == "self" and last in ("optimizers", "lr_schedulers"):
            cls = self._class_of(scope)
            if cls is not None and self.class_family(cls) == "lightning_module":
                role = "optimizer" if last == "optimizers" else "scheduler"
                return [Evidence("constructor", role, f"`self.{last}()` of a LightningModule", call,
                                 "lightning.LightningModule." + last, "lightning")]
        # --- pass-through wrappers: prepare / setup / initialize / compile / .to() ...
        if last in ("prepare", "setup") and recv:
            rr = self._path_role(recv, scope)
            if rr is not None and (rr.role == "accelerator" and last == "prepare" or rr.role == "fabric"):
                if any(a.star for a in call.args):
                    return []  # ``prepare(*objs)``: positions unknown
                args = [a.value for a in call.args if a.keyword is None]
                i = index if index is not None else 0
                if i < len(args):
                    sub = decide(self._expr_evidence(args[i], scope, depth + 1, before))
                    wb = rr.role
                    if sub is not None and sub.confident:
                        return [Evidence("usage", sub.role, f"`{name}(...)` position {i} ({sub.why})", call,
                                         sub.qualname, wb, sub.origin)]
                return []
        if last in ("setup_module", "setup_optimizers", "setup_dataloaders", "prepare_model", "prepare_optimizer",
                    "prepare_scheduler", "prepare_data_loader") and recv:
            role = {"setup_module": "model", "setup_optimizers": "optimizer", "setup_dataloaders": "dataloader",
                    "prepare_model": "model", "prepare_optimizer": "optimizer", "prepare_scheduler": "scheduler",
                    "prepare_data_loader": "dataloader"}[last]
            wb = "fabric" if last.startswith("setup") else "accelerator"
            return [Evidence("usage", role, f"`{name}(...)`", call, None, wb)]
        if q.endswith("deepspeed.initialize") or name == "deepspeed.initialize":
            roles = ("deepspeed_engine", "optimizer", "dataloader", "scheduler")
            i = 0 if index is None else index
            if i < len(roles):
                return [Evidence("constructor", roles[i], f"`deepspeed.initialize(...)` result {i}", call,
                                 "deepspeed.initialize", "deepspeed", call)]
            return []
        if (q.startswith("apex.amp.initialize") or name == "amp.initialize") and index is not None:
            args = [a.value for a in call.args if a.keyword is None]
            if index < len(args):
                sub = decide(self._expr_evidence(args[index], scope, depth + 1))
                if sub is not None and sub.confident:
                    return [Evidence("usage", sub.role, f"`{name}(...)` position {index}", call, sub.qualname, "apex",
                                     sub.origin)]
            return []
        if q in ("copy.deepcopy", "copy.copy") and call.args:
            sub = decide(self._expr_evidence(call.args[0].value, scope, depth + 1, before))
            if sub is not None and sub.confident:
                return [Evidence(e.kind, sub.role, f"a copy of `{_short_text(call.args[0].value)}` ({e.why})", call,
                                 e.qualname, None, e.origin) for e in sub.evidence if e.role == sub.role][:1]
            return []
        if q in ("torch.compile", "torch.jit.script") or last in ("unwrap_model", "to_bettertransformer") or (
            recv_expr is not None and last in ("to", "cuda", "cpu", "half", "float", "bfloat16", "train", "eval",
                                               "requires_grad_", "double", "module")
        ):
            inner = positional(call, 0) if (q.startswith("torch.") or last in ("unwrap_model",)) and recv_expr is None or \
                q in ("torch.compile", "torch.jit.script") or last == "unwrap_model" else recv_expr
            if inner is not None:
                sub = decide(self._expr_evidence(inner, scope, depth + 1, before))
                if sub is not None and sub.confident and sub.role in ("model", "ddp_model", "lightning_module", "pipeline"):
                    role = "model" if last == "unwrap_model" else sub.role
                    return [Evidence(e.kind, role, e.why, e.node, e.qualname, e.wrapped_by, e.origin) for e in sub.evidence
                            if e.role == sub.role]
            if recv_expr is not None:
                return []
        if self.__dict__.get("xp") is not None and q and not q.startswith(_SIBLING_SKIP) and \
                q.split(".")[0] in self.t.imports and self._callee_def(call, scope) is None:
            sev = self._sibling_factory_evidence(call, index, depth)  # a factory / class of a sibling module
            if sev:
                return sev
        if index is not None and self._callee_def(call, scope) is None:
            return []  # ``a, b = f(...)``: what position i of an unknown result is, is unknown
        # --- a known package's constructor / factory
        c = classify_qualname(q) if q else None
        if c is not None:
            role, wb = c
            kind = "import" if wb == "import" else "constructor"
            if role in ("ddp_model",):
                pass
            return [Evidence(kind, role, f"`{q}(...)`", call, q, None if wb == "import" else wb, call)]
        # --- X.from_pretrained(...) of a known / own class
        if last in ("from_pretrained", "from_config", "from_single_file", "from_dict") and recv_expr is not None:
            cq = self.t.qualname(recv_expr) or recv or ""
            c = classify_qualname(cq)
            if c is not None:
                return [Evidence("constructor", c[0], f"`{cq}.{last}(...)`", call, cq, None, call)]
            if recv in self.t.classes:
                fam, base = self._class_info(self.t.classes[recv], 0)
                if fam in _FAMILY_ROLE:
                    return [Evidence("constructor", _FAMILY_ROLE[fam], f"`{recv}.{last}(...)` ({base})", call, base,
                                     None, call)]
            sub = decide(self._class_value_evidence(recv_expr, scope, depth + 1))
            if sub is not None:
                return [Evidence("constructor", sub.role, f"`{_code(recv_expr)}.{last}(...)`", call, sub.qualname,
                                 None, call)]
            return []
        # --- a class of this file
        if isinstance(f, cst.Name) and f.value in self.t.classes and f.value not in self.t.imports:
            cls = self.t.classes[f.value]
            fam, base = self._class_info(cls, 0)
            if fam in _FAMILY_ROLE:
                return [Evidence("constructor", _FAMILY_ROLE[fam], f"`{f.value}(...)`, a subclass of {base}", call, base,
                                 None, call)]
        # --- a variable holding a class (optimizer_cls(...), getattr(torch.optim, name)(...))
        if isinstance(f, (cst.Name, cst.Attribute, cst.Call, cst.Subscript)) and not q:
            cev = self._class_value_evidence(f, scope, depth + 1)
            if cev:
                return [Evidence("constructor", e.role, f"`{_code(f)}(...)`: {e.why}", call, e.qualname, e.wrapped_by, call)
                        for e in cev]
        # --- a same-file factory: what it returns
        target = self._callee_def(call, scope)
        if target is not None:
            fn, _ = target
            if fn.name.value != "__init__":
                rets = self.t.returns.get(id(fn), [])
                sub_ev: list = []
                rroles = []
                for r in rets:
                    if index is not None and isinstance(r, cst.Tuple):
                        if index < len(r.elements):
                            e = decide(self._expr_evidence(r.elements[index].value, fn, depth + 1))
                        else:
                            e = None
                    elif index is not None:
                        e = decide(self._call_evidence(r, fn, index, depth + 1)) if isinstance(r, cst.Call) else None
                    else:
                        e = decide(self._expr_evidence(r, fn, depth + 1))
                    if e is not None and _is_none(r):
                        continue
                    rroles.append(e)
                rroles = [r for r in rroles if r is not None] if rroles else []
                if rroles and len({r.role for r in rroles}) == 1 and all(r.confident for r in rroles):
                    r0 = rroles[0]
                    return [Evidence("usage" if r0.evidence[0].kind != "constructor" else "constructor", r0.role,
                                     f"returned by `{fn.name.value}()` ({r0.why})", call, r0.qualname, r0.wrapped_by,
                                     r0.origin if len(rroles) == 1 else None)]
                del sub_ev
        # --- usage: built from model parameters / on an optimizer
        ev.extend(self._built_from(call, name, last, q, scope, depth))
        if ev:
            return ev
        # --- import: the module path of an imported callee
        if q:
            return []
        return []

    def _built_from(self, call: cst.Call, name: str, last: str, q: str, scope: Scope, depth: int) -> list:
        if not name or _PARAM_UTILS.search(last) or name.startswith(("torch.nn.utils", "nn.utils")):
            return []
        if _LOSS_CLASS.search(last):
            return []
        first = positional(call, 0)
        params = first if first is not None else (kwarg(call, "params") or kwarg(call, "parameters")
                                                  or kwarg(call, "model_params"))
        kws = {a.keyword.value for a in call.args if a.keyword is not None}
        if params is not None and self._is_params(params, scope, 0):
            pos = [a.value for a in call.args if a.keyword is None]
            lr_pos = len(pos) >= 2 and (isinstance(pos[1], (cst.Float, cst.Integer)) or
                                        re.search(r"(^|_|\.)(lr|learning_rate)$", dotted(pos[1]) or "") is not None)
            looks = bool(_OPT_CLASS_NAMES.search(last)) or bool(kws & _OPT_KWARGS) or lr_pos
            if looks and not _SCHED_CLASS.search(last) and "ema" not in last.lower():
                return [Evidence("usage", "optimizer", f"`{name}(...)` built from model parameters", call, q or None)]
        # a scheduler: built on an optimizer
        opt_arg = kwarg(call, "optimizer")
        cands = [opt_arg] if opt_arg is not None else [a.value for a in call.args if a.keyword is None][:3]
        for a in cands:
            d = dotted(a) if a is not None else None
            if not d:
                continue
            r = self._path_role(d, scope)
            if r is not None and r.role == "optimizer" and r.confident:
                if _SCHED_FACTORY.search(last) or _SCHED_CLASS.search(last) or "sched" in last.lower():
                    return [Evidence("usage", "scheduler", f"`{name}(...)` built on the optimizer `{d}`", call, q or None)]
                if _OPT_CLASS_NAMES.search(last) or "lookahead" in last.lower():
                    return [Evidence("usage", "optimizer", f"`{name}(...)` wraps the optimizer `{d}`", call, q or None)]
        if _OPT_FACTORY.match(last) and params is not None and self._is_params(params, scope, 0):
            return [Evidence("usage", "optimizer", f"`{name}(...)` built from model parameters", call, q or None)]
        return []

    def _optimizer_arg(self, call: cst.Call, scope: Scope, depth: int) -> Optional[str]:
        """An optimizer this call is built on (an argument), through a same-file factory's return; else None."""
        if depth > 3:
            return None
        name = call_name(call) or ""
        if name.split(".")[-1] in ("prepare", "setup", "initialize", "step", "unscale_", "clip_grad_norm_",
                                   "state_dict", "load_state_dict") or _PARAM_UTILS.search(name.split(".")[-1]):
            return None
        for a in call.args:
            d = dotted(a.value)
            if d:
                r = self._path_role(d, scope)
                if r is not None and r.role == "optimizer" and r.confident:
                    return d
        target = self._callee_def(call, scope)
        if target is not None:
            fn = target[0]
            for ret in self.t.returns.get(id(fn), [])[:3]:
                v = ret
                dn = dotted(ret)
                if dn:
                    bs = [b for b in self._bind.get((self._sid_for(dn, fn), dn), []) if b.kind == "assign"]
                    v = bs[0].value if len(bs) == 1 else None
                if isinstance(v, cst.Call):
                    got = self._optimizer_arg(v, fn, depth + 1)
                    if got:
                        return got
        return None

    def _is_params(self, e: Optional[cst.BaseExpression], scope: Scope, depth: int) -> bool:
        """Model parameters: ``m.parameters()``, ``filter(..., m.parameters())``, a comprehension over
        ``named_parameters()``, a list of ``{"params": ...}`` groups, ``chain(...)``, list + list, a variable
        holding one of those."""
        if self._spend():
            return False
        if e is None or depth > 5:
            return False
        if isinstance(e, cst.Call):
            n = call_name(e) or ""
            last = n.split(".")[-1]
            if last in ("parameters", "named_parameters", "trainable_parameters", "get_trainable_parameters"):
                return True
            if last in ("filter", "list", "chain", "from_iterable", "tuple", "iter") or n.endswith("itertools.chain"):
                return any(self._is_params(a.value, scope, depth + 1) for a in e.args)
            if last in ("get_param_groups", "param_groups", "get_optimizer_grouped_parameters", "get_parameter_groups",
                        "add_weight_decay", "param_groups_weight_decay", "param_groups_layer_decay"):
                return True
            target = self._callee_def(e, scope)
            if target is not None:
                fn, _ = target
                return any(self._is_params(r, fn, depth + 1) for r in self.t.returns.get(id(fn), []))
            return False
        if isinstance(e, (cst.ListComp, cst.GeneratorExp, cst.SetComp)):
            return self._is_params(e.for_in.iter, scope, depth + 1) or any(
                self._is_params(x, scope, depth + 1) for x in _comp_iters(e))
        if isinstance(e, (cst.List, cst.Tuple)):
            for el in e.elements:
                v = el.value
                if isinstance(v, cst.Dict):
                    for de in v.elements:
                        if isinstance(de, cst.DictElement) and isinstance(de.key, cst.SimpleString) and \
                                de.key.value.strip("'\"") == "params":
                            return True
                elif isinstance(v, cst.Call) and (call_name(v) or "").endswith("dict") and kwarg(v, "params") is not None:
                    return True
                elif self._is_params(v, scope, depth + 1):
                    return True
            return False
        if isinstance(e, cst.BinaryOperation) and isinstance(e.operator, cst.Add):
            return self._is_params(e.left, scope, depth + 1) or self._is_params(e.right, scope, depth + 1)
        d = dotted(e)
        if d:
            key = (self._sid_for(d, scope), d)
            for b in self._bind.get(key, [])[:4]:
                if b.kind == "assign" and b.value is not None and self._is_params(b.value, b.scope, depth + 1):
                    return True
            # param groups built by appends: groups = []; groups.append({"params": ...})
            for call, func in self._appends.get(d, ())[:6]:
                v = call.args[0].value
                if isinstance(v, cst.Dict) or self._is_params(v, func, depth + 1):
                    return True
        return False

    def _class_value_evidence(self, e: cst.BaseExpression, scope: Scope, depth: int) -> list:
        """Evidence for what instances of the class an expression holds are: ``AdamW``, ``cls_a if x else cls_b``,
        ``getattr(torch.optim, name)``, ``{"adam": AdamW, ...}[name]``, a variable holding one of these."""
        if self._spend():
            return []
        if depth > 8:
            return []
        if isinstance(e, cst.IfExp):
            a = decide(self._class_value_evidence(e.body, scope, depth + 1))
            b = decide(self._class_value_evidence(e.orelse, scope, depth + 1))
            if a is not None and b is not None and a.role == b.role:
                return [Evidence("constructor", a.role, f"`{_code(e)}`", e, a.qualname)]
            return []
        if isinstance(e, cst.Call):
            n = call_name(e) or ""
            if (self.t.qualname(e.func) or n) in ("functools.partial", "partial") and e.args:
                return self._class_value_evidence(e.args[0].value, scope, depth + 1)  # partial(AdamW, lr=...)
            target = self._callee_def(e, scope)
            if target is not None and target[0].name.value != "__init__":
                fn = target[0]
                rs = [decide(self._class_value_evidence(r, fn, depth + 1)) for r in self.t.returns.get(id(fn), [])[:6]]
                if rs and all(r is not None for r in rs) and len({r.role for r in rs}) == 1:
                    return [Evidence("constructor", rs[0].role, f"the class returned by `{fn.name.value}()`", e,
                                     rs[0].qualname)]
                return []
            if n == "getattr" and e.args:
                mod = self.t.qualname(e.args[0].value) or dotted(e.args[0].value) or ""
                if mod in ("torch.optim", "bitsandbytes.optim", "torch_optimizer", "transformers.optimization"):
                    return [Evidence("constructor", "optimizer", f"a class of `{mod}`", e, mod)]
                if mod in ("torch.optim.lr_scheduler",):
                    return [Evidence("constructor", "scheduler", f"a class of `{mod}`", e, mod)]
            return []
        if isinstance(e, cst.Subscript):
            base = e.value
            if isinstance(base, cst.Attribute) and base.attr.value == "__dict__":
                mod = self.t.qualname(base.value) or ""
                if mod == "torch.optim":
                    return [Evidence("constructor", "optimizer", "a class of `torch.optim`", e, mod)]
            if isinstance(base, cst.Dict):
                return self._dict_classes(base, scope, depth)
            d = dotted(base)
            if d:
                key = (self._sid_for(d, scope), d)
                for b in self._bind.get(key, [])[:2]:
                    if b.kind == "assign" and isinstance(b.value, cst.Dict):
                        return self._dict_classes(b.value, b.scope, depth)
            return []
        q = self.t.qualname(e)
        if q:
            c = classify_qualname(q)
            if c:
                return [Evidence("constructor", c[0], f"the class `{q}`", e, q)]
            fam = _family_of_qualname(q)
            if fam in _FAMILY_ROLE:
                return [Evidence("constructor", _FAMILY_ROLE[fam], f"the class `{q}`", e, q)]
            return []
        d = dotted(e)
        if d and d in self.t.classes:
            fam, base = self._class_info(self.t.classes[d], 0)
            if fam in _FAMILY_ROLE:
                return [Evidence("constructor", _FAMILY_ROLE[fam], f"the class `{d}` ({base})", e, base)]
            return []
        if d:
            key = (self._sid_for(d, scope), d)
            out: list = []
            binds = [b for b in self._bind.get(key, []) if b.kind == "assign" and b.value is not None]
            roles = []
            for b in binds[:4]:
                r = decide(self._class_value_evidence(b.value, b.scope, depth + 1))
                if r is None:
                    return []
                roles.append(r)
            if roles and len({r.role for r in roles}) == 1:
                out.append(Evidence("constructor", roles[0].role, f"`{d}` holds {roles[0].why}", binds[0].node,
                                    roles[0].qualname))
            return out
        return []

    def _dict_classes(self, dct: cst.Dict, scope: Scope, depth: int) -> list:
        roles = []
        for el in dct.elements:
            if not isinstance(el, cst.DictElement):
                return []
            r = decide(self._class_value_evidence(el.value, scope, depth + 1))
            if r is None:
                return []
            roles.append(r)
        if roles and len({r.role for r in roles}) == 1:
            return [Evidence("constructor", roles[0].role, "a class from a dict of classes", dct, roles[0].qualname)]
        return []

    def _class_info(self, cls: cst.ClassDef, depth: int) -> tuple[Optional[str], Optional[str]]:
        got = self._family.get(id(cls))
        if got is not None:
            return got
        if depth > 10:
            return (None, None)
        self._family[id(cls)] = (None, None)  # cycle guard
        res: tuple[Optional[str], Optional[str]] = (None, None)
        for b in cls.bases:
            if b.keyword is not None:
                continue
            d = dotted(b.value)
            if not d:
                continue
            q = self.t.qualname(b.value)
            if q is None and d in self.t.classes and self.t.classes[d] is not cls:
                res = self._class_info(self.t.classes[d], depth + 1)
            elif q:
                fam = _family_of_qualname(q)
                res = (fam, q) if fam else (None, None)
                if fam is None and self.__dict__.get("xp") is not None:
                    res = self._sibling_class_info(d, depth)
            if res[0] is not None:
                break
        self._family[id(cls)] = res
        return res

    def _sibling_factory_evidence(self, call: cst.Call, index: Optional[int], depth: int) -> list:
        """What a factory / class of a sibling module builds (``optimizer = build_optimizer(cfg, model)`` returning
        ``torch.optim.AdamW(...)`` in optim_utils.py; ``Net(...)`` whose base there is an ``nn.Module``), read in
        that module with its own imports (``bertlint.analysis.project``). [] when unknown."""
        cn = dotted(call.func)
        if not cn or depth > 6:
            return []
        try:
            tg = self.xp.resolve(cn)
            if tg is None:
                return []
            at = tg.info.name
            if tg.kind == "class":
                fam, base = tg.info.roles._class_info(tg.node, depth + 1)
                if fam in _FAMILY_ROLE and index is None:
                    return [Evidence("constructor", _FAMILY_ROLE[fam], f"`{cn}(...)`, a subclass of {base} ({at})",
                                     call, base, None, None)]
                return []
            if tg.kind != "function" or tg.node.name.value == "__init__":
                return []
            sib = tg.info.roles
            rets = tg.info.symbols.returns.get(id(tg.node), [])
            found = []
            for r in rets:
                if _is_none(r):
                    continue
                if index is not None:
                    if not (isinstance(r, cst.Tuple) and index < len(r.elements)):
                        return []
                    r = r.elements[index].value
                e = decide(sib._expr_evidence(r, tg.node, depth + 1))
                if e is None or not e.confident:
                    return []
                found.append(e)
            if found and len({e.role for e in found}) == 1:
                e0 = found[0]
                kind = "constructor" if e0.evidence[0].kind == "constructor" else "usage"
                return [Evidence(kind, e0.role, f"returned by `{cn}()` in {at} ({e0.why})", call, e0.qualname,
                                 e0.wrapped_by, None)]
        except Exception:
            return []
        return []

    def _sibling_class_info(self, dotted_base: str, depth: int) -> tuple[Optional[str], Optional[str]]:
        """(family, framework base) of a base class defined in a sibling module (``bertlint.analysis.project``):
        its own bases are read there, with that module's imports; (None, None) when it cannot be read."""
        try:
            tg = self.xp.resolve(dotted_base)
            if tg is None or tg.kind != "class":
                return (None, None)
            # the sibling's classes are parsed one by one when asked for: parse the chain of its own base classes
            # defined in that module first, so its roles can follow them (`KnowledgeRecommender(AbstractRecommender)`
            # with `AbstractRecommender(nn.Module)` further down the same file)
            info, todo, seen = tg.info, [tg.node.name.value], set()
            while todo and len(seen) < 8:
                n = todo.pop()
                if n in seen:
                    continue
                seen.add(n)
                for b in info.bases.get(n, []):
                    if "." not in b and info.cls(b) is not None:
                        todo.append(b)
            return info.roles._class_info(tg.node, depth + 1)
        except Exception:
            return (None, None)


@dataclass(frozen=True)
class _Lazy:
    """Usage evidence that holds only when another receiver has a role (``s.step(x)``: x is an optimizer when
    s is a grad scaler)."""

    role: str
    why: str
    node: cst.CSTNode
    recv_key: tuple
    recv_role: str
    kind: str = "usage"

    @property
    def strength(self) -> int:
        return 3


def _family_of_qualname(q: str) -> Optional[str]:
    if not q:
        return None
    for fam, rx in _FAMILY_OF_QUALNAME:
        if rx.match(q):
            if fam == "module" and _LOSS_CLASS.search(q.split(".")[-1]):
                return None
            return fam
    return None


def _is_static(fn: cst.FunctionDef) -> bool:
    return any((dotted(d.decorator) or "") == "staticmethod" for d in fn.decorators)


def _params(fn: cst.FunctionDef) -> list[cst.Param]:
    p = fn.params
    out = list(p.posonly_params) + list(p.params)
    if isinstance(p.star_arg, cst.Param):
        pass
    out.extend(p.kwonly_params)
    return out


def _loop_elements(target: cst.BaseExpression, it: cst.BaseExpression) -> list:
    """(name, iterable whose elements it takes) for a for-loop target: ``for o in opts``, ``for i, o in
    enumerate(opts)``, ``for o, s in zip(opts, scheds)``."""
    d = dotted(target)
    if d:
        return [(d, it)]
    if not isinstance(target, (cst.Tuple, cst.List)) or not isinstance(it, cst.Call):
        return []
    name = call_name(it) or ""
    els = [e.value for e in target.elements]
    args = [a.value for a in it.args if a.keyword is None and not a.star]
    if name == "enumerate" and len(els) == 2 and args:
        return _loop_elements(els[1], args[0])
    if name == "zip" and len(els) == len(args):
        out: list = []
        for e, a in zip(els, args):
            out.extend(_loop_elements(e, a))
        return out
    return []


def _target_names(t: cst.BaseExpression) -> list[str]:
    if isinstance(t, cst.Name):
        return [t.value]
    if isinstance(t, (cst.Tuple, cst.List)):
        out = []
        for el in t.elements:
            out.extend(_target_names(el.value))
        return out
    return []


def _comp_iters(e) -> list:
    out = []
    f = e.for_in
    while f is not None:
        out.append(f.iter)
        f = f.inner_for_in
    return out


# modules whose calls return none of the roles (configs, arrays, paths, loggers ...)
_PLAIN_MODULES = frozenset({"json", "yaml", "omegaconf", "toml", "tomllib", "argparse", "os", "sys", "math", "random",
                            "numpy", "pathlib", "re", "logging", "time", "datetime", "pickle",
                            "csv", "pandas", "wandb", "shutil", "glob"})

# methods a Trainer calls with the model as their first argument after self
_TRAINER_MODEL_METHODS = frozenset({"compute_loss", "training_step", "prediction_step", "_wrap_model",
                                    "get_batch_loss_metrics", "concatenated_forward", "compute_ref_log_probs"})

# (role of the owner, attribute) -> role of ``owner.attribute``
_ATTR_ROLES = {
    ("deepspeed_engine", "optimizer"): "optimizer",
    ("deepspeed_engine", "module"): "model",
    ("ddp_model", "module"): "model",
    ("model", "module"): "model",
    ("model", "_orig_mod"): "model",
    ("trainer", "model"): "model",
    ("trainer", "model_wrapped"): "model",
    ("trainer", "optimizer"): "optimizer",
    ("trainer", "lr_scheduler"): "scheduler",
    ("trainer", "accelerator"): "accelerator",
    ("accelerator", "scaler"): "grad_scaler",
    ("lightning_module", "trainer"): "trainer",
    # a pipeline's components are graph-recording modules when called directly (the pipeline's own call is not)
    ("pipeline", "unet"): "model",
    ("pipeline", "vae"): "model",
    ("pipeline", "text_encoder"): "model",
    ("pipeline", "text_encoder_2"): "model",
    ("pipeline", "transformer"): "model",
    ("pipeline", "model"): "model",
}

_PLAIN_TYPES = frozenset({"str", "int", "float", "bool", "dict", "list", "tuple", "Optional[str]"})


def _is_plain_literal(e: cst.BaseExpression) -> bool:
    """A string / number / bool literal (or an f-string): known not to be a model, an optimizer ..."""
    if isinstance(e, (cst.SimpleString, cst.ConcatenatedString, cst.FormattedString, cst.Integer, cst.Float)):
        return True
    if isinstance(e, cst.Name) and e.value in ("True", "False"):
        return True
    if isinstance(e, cst.UnaryOperation) and isinstance(e.expression, (cst.Integer, cst.Float)):
        return True
    return False


def _is_none(e: cst.BaseExpression) -> bool:
    return isinstance(e, cst.Name) and e.value == "None"


def _index_of(sub: cst.Subscript) -> Optional[int]:
    if len(sub.slice) == 1 and isinstance(sub.slice[0].slice, cst.Index):
        v = sub.slice[0].slice.value
        if isinstance(v, cst.Integer):
            return int(v.value)
    return None


def _short_text(node: cst.CSTNode) -> str:
    d = dotted(node)  # type: ignore[arg-type]
    return d if d else _code(node)


def _code(node: cst.CSTNode) -> str:
    from bertlint.analysis.symbols import code_of

    s = code_of(node).strip()
    return s if len(s) <= 60 else s[:57] + "..."


def build(ctx_or_table) -> Roles:
    """``roles.build(ctx)`` (or a SymbolTable)."""
    t = ctx_or_table if isinstance(ctx_or_table, SymbolTable) else ctx_or_table.symbols
    r = Roles(t)
    if not isinstance(ctx_or_table, SymbolTable):
        try:  # a base class imported from a sibling module of the project is followed there
            from bertlint.analysis import project

            r.xp = project.of(ctx_or_table)
        except Exception:
            pass
    return r


def _main(argv: Optional[list] = None) -> int:
    """``python -m bertlint.analysis.roles FILE...``: print the roles found (a debugging aid)."""
    import sys

    for path in (argv if argv is not None else sys.argv[1:]):
        with open(path, encoding="utf-8", errors="replace") as fh:
            module = cst.parse_module(fh.read())
        from bertlint.analysis.symbols import build as build_symbols

        t = build_symbols(module)
        r = Roles(t)
        print(f"== {path}")
        for scope, p, role in r.all():
            if role.role == "other":
                continue
            where = getattr(getattr(scope, "name", None), "value", "<module>")
            extra = f" [{role.wrapped_by}]" if role.wrapped_by else ""
            conf = "" if role.confident else " (name only)"
            print(f"  {where}: {p} -> {role.role}{extra}{conf}  | {role.why[:100]}")
        for name, cls in t.classes.items():
            fam = r.class_family(cls)
            if fam:
                print(f"  class {name}: {fam} ({r.class_base(cls)})")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
