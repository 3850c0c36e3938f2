"""No side effects: what the verified script saves goes to a temporary folder that bertlint removes afterwards.

Installed in every process the verifier instruments (before the script runs). Redirected:

- ``torch.save`` / ``safetensors.torch.save_file`` / ``save_model`` to a path outside a temporary folder the run
  created itself (``tempfile.mkdtemp()`` / ``TemporaryDirectory()`` of the script are left alone); ``torch.load`` /
  ``safetensors.torch.load_file`` / ``from_pretrained`` read the redirected copy when the script reads back what it
  saved;
- transformers: ``TrainingArguments.output_dir`` (checkpoints, rotation by ``save_total_limit``, logs) and
  ``push_to_hub=False``; ``save_pretrained`` of models, tokenizers, configurations, processors; ``push_to_hub``
  (not sent); ``Trainer.save_model(dir)``;
- accelerate: ``Accelerator(project_dir=...)``, ``save_state``, ``save_model``;
- Lightning: ``Trainer(default_root_dir=...)`` (its default loggers and checkpoints), ``ModelCheckpoint(dirpath=)``,
  ``Trainer.save_checkpoint``, ``CSVLogger``/``TensorBoardLogger`` ``save_dir``;
- TensorBoard ``SummaryWriter`` (torch.utils.tensorboard, tensorboardX) ``log_dir``;
- W&B (``WANDB_MODE=disabled``), MLflow (a file store in the folder), set in the environment by the parent;
- huggingface_hub uploads (``HfApi.upload_file/upload_folder/create_commit/create_repo``): not sent.

Every redirection is recorded (``Sandbox.redirected``) and the report lists them. Other writes (``open(path, "w")``)
are not redirected.
"""

from __future__ import annotations

import functools
import json
import os
import tempfile
from typing import Callable, Optional


class Sandbox:
    def __init__(self, root: str, temp_before: Optional[list] = None) -> None:
        self.root = os.path.realpath(root)
        os.makedirs(self.root, exist_ok=True)
        self.tmp = os.path.realpath(tempfile.gettempdir())
        self.temp_before = set(temp_before if temp_before is not None else _temp_entries())
        self.redirected: dict[tuple, dict] = {}
        self.errors: list[str] = []
        self.out_dirs: set = set()  # the user's folders the run's saving was redirected from (absolute paths)

    # ---- paths -------------------------------------------------------------------------------------------
    def allowed(self, path: str) -> bool:
        """Inside the sandbox, or inside a temporary folder that did not exist when the run started."""
        p = os.path.realpath(path)
        if p == self.root or p.startswith(self.root + os.sep):
            return True
        if p.startswith(self.tmp + os.sep):
            top = p[len(self.tmp) + 1:].split(os.sep, 1)[0]
            return top not in self.temp_before
        return False

    def target(self, path) -> str:
        p = os.path.abspath(os.fspath(path))
        return os.path.join(self.root, "redirected", p.lstrip(os.sep))

    def redirect(self, path, what: str, is_dir: bool = False):
        """The path to write instead of ``path`` (``path`` itself when it may be written)."""
        if path is None or not isinstance(path, (str, os.PathLike)):
            return path
        try:
            if self.allowed(os.fspath(path)):
                return path
            to = self.target(path)
            os.makedirs(to if is_dir else os.path.dirname(to), exist_ok=True)
            if is_dir:
                self.out_dirs.add(os.path.abspath(os.fspath(path)))
        except Exception as e:
            self.errors.append(f"{what}: {type(e).__name__}: {e}")
            return path
        self.note(what, os.fspath(path), to)
        return to if isinstance(path, str) else type(path)(to) if _pathlike_ok(path) else to

    def in_out_dir(self, path) -> bool:
        """``path`` is inside a folder the run's saving was redirected from (not the working folder itself or one
        above it: ``output_dir="."`` does not hide the script's inputs)."""
        p = os.path.abspath(os.fspath(path))
        cwd = os.getcwd()
        return any((p == d or p.startswith(d + os.sep)) and not (cwd == d or cwd.startswith(d + os.sep))
                   for d in self.out_dirs)

    def read(self, path, what: str = "load"):
        """Where to read ``path`` from: the run's copy when the run wrote one; and anything inside a folder the run's
        saving was redirected from (a Trainer ``output_dir``, a ``save_pretrained`` / ``save_state`` folder) is read
        from the run's copy of that folder only — a file the run did not write there is missing (the load fails as
        on a fresh folder), never the user's stale one."""
        if path is None or not isinstance(path, (str, os.PathLike)):
            return path
        try:
            if not self.allowed(os.fspath(path)):
                to = self.target(path)
                if os.path.exists(to):
                    self.note(f"{what}: read the run's copy", os.fspath(path), to)
                    return to
                if os.path.exists(os.fspath(path)) and self.in_out_dir(path):
                    self.note(f"{what}: not written by the run (the user's files are not read)", os.fspath(path), to)
                    return to
        except Exception:
            pass
        return path

    def note(self, what: str, original: str, to: Optional[str]) -> None:
        key = (what, original)
        e = self.redirected.get(key)
        if e is None:
            self.redirected[key] = {"what": what, "path": original, "to": _rel(to, self.root) if to else None,
                                    "count": 1}
        else:
            e["count"] += 1

    def to_json(self) -> list:
        return list(self.redirected.values())[:200]

    # ---- patches -------------------------------------------------------------------------------------------
    def callbacks(self) -> dict[str, Callable]:
        return {
            "safetensors.torch": self._patch_safetensors,
            "transformers.training_args": self._patch_training_args,
            "transformers.modeling_utils": self._patch_pretrained("transformers.modeling_utils", "PreTrainedModel"),
            "transformers.tokenization_utils_base": self._patch_pretrained("transformers.tokenization_utils_base",
                                                                           "PreTrainedTokenizerBase"),
            "transformers.configuration_utils": self._patch_pretrained("transformers.configuration_utils",
                                                                       "PretrainedConfig"),
            "transformers.generation.configuration_utils": self._patch_pretrained(
                "transformers.generation.configuration_utils", "GenerationConfig"),
            "transformers.processing_utils": self._patch_pretrained("transformers.processing_utils", "ProcessorMixin"),
            "transformers.feature_extraction_utils": self._patch_pretrained("transformers.feature_extraction_utils",
                                                                            "FeatureExtractionMixin"),
            "transformers.image_processing_base": self._patch_pretrained("transformers.image_processing_base",
                                                                         "ImageProcessingMixin"),
            "transformers.utils.hub": self._patch_push_mixin,
            "transformers.models.auto.auto_factory": self._patch_loaders("_BaseAutoModelClass"),
            "transformers.models.auto.configuration_auto": self._patch_loaders("AutoConfig"),
            "transformers.models.auto.tokenization_auto": self._patch_loaders("AutoTokenizer"),
            "transformers.models.auto.processing_auto": self._patch_loaders("AutoProcessor"),
            "transformers.models.auto.feature_extraction_auto": self._patch_loaders("AutoFeatureExtractor"),
            "transformers.models.auto.image_processing_auto": self._patch_loaders("AutoImageProcessor"),
            "transformers.models.auto.video_processing_auto": self._patch_loaders("AutoVideoProcessor"),
            "peft.peft_model": self._patch_loaders("PeftModel", arg=1),
            "transformers.trainer": self._patch_hf_trainer,
            "accelerate.accelerator": self._patch_accelerator,
            "lightning.pytorch.trainer.trainer": self._patch_lightning_trainer,
            "pytorch_lightning.trainer.trainer": self._patch_lightning_trainer,
            "lightning.pytorch.callbacks.model_checkpoint": self._patch_model_checkpoint,
            "pytorch_lightning.callbacks.model_checkpoint": self._patch_model_checkpoint,
            "lightning.pytorch.loggers.csv_logs": self._patch_logger("CSVLogger"),
            "lightning.pytorch.loggers.tensorboard": self._patch_logger("TensorBoardLogger"),
            "pytorch_lightning.loggers.csv_logs": self._patch_logger("CSVLogger"),
            "pytorch_lightning.loggers.tensorboard": self._patch_logger("TensorBoardLogger"),
            "lightning.fabric.loggers.csv_logs": self._patch_logger("CSVLogger"),
            "lightning.fabric.loggers.tensorboard": self._patch_logger("TensorBoardLogger"),
            "torch.utils.tensorboard.writer": self._patch_summary_writer,
            "tensorboardX.writer": self._patch_summary_writer,
            "huggingface_hub.hf_api": self._patch_hf_api,
            "wandb": lambda m: self.note("W&B", "wandb.init/log", "WANDB_MODE=disabled"),
            "mlflow": lambda m: self.note("MLflow", os.environ.get("BERTLINT_VERIFY_MLFLOW_WAS") or "default store",
                                          os.environ.get("MLFLOW_TRACKING_URI")),
        }

    def install_torch(self) -> None:
        import torch

        sb = self
        o_save, o_load = torch.save, torch.load

        @functools.wraps(o_save)
        def save(obj, f, *a, **kw):
            return o_save(obj, sb.redirect(f, "torch.save"), *a, **kw)

        @functools.wraps(o_load)
        def load(f, *a, **kw):
            return o_load(sb.read(f, "torch.load"), *a, **kw)

        torch.save, torch.load = save, load
        try:
            import torch.serialization as ser

            ser.save, ser.load = save, load
        except Exception:
            pass

    def _patch_safetensors(self, mod) -> None:
        sb = self
        for name, arg in (("save_file", 1), ("save_model", 1)):
            orig = getattr(mod, name, None)
            if orig is None:
                continue
            setattr(mod, name, _wrap_arg(orig, arg, "filename", lambda p, n=name: sb.redirect(p, f"safetensors {n}")))
        for name in ("load_file", "load_model"):
            orig = getattr(mod, name, None)
            if orig is None:
                continue
            idx = 0 if name == "load_file" else 1
            setattr(mod, name, _wrap_arg(orig, idx, "filename", sb.read))

    def _patch_training_args(self, mod) -> None:
        TA = mod.TrainingArguments
        sb = self
        o_post = TA.__post_init__

        @functools.wraps(o_post)
        def __post_init__(self, *a, **kw):
            r = o_post(self, *a, **kw)
            try:
                sb.redirect_training_args(self)
            except Exception as e:
                sb.errors.append(f"TrainingArguments: {type(e).__name__}: {e}")
            return r

        TA.__post_init__ = __post_init__

    def redirect_training_args(self, args) -> None:
        out = getattr(args, "output_dir", None)
        shown = out if out is not None else "trainer_output"
        if out is None or not self.allowed(os.fspath(out)):
            to = self.target(shown)
            os.makedirs(to, exist_ok=True)
            args.output_dir = to
            self.out_dirs.add(os.path.abspath(os.fspath(shown)))
            self.note("Trainer output_dir (checkpoints, logs)", os.fspath(shown), to)
        ld = getattr(args, "logging_dir", None)
        if isinstance(ld, (str, os.PathLike)) and not self.allowed(os.fspath(ld)):
            args.logging_dir = self.redirect(ld, "Trainer logging_dir", is_dir=True)
        if getattr(args, "push_to_hub", False):
            args.push_to_hub = False
            self.note("Trainer push_to_hub", str(getattr(args, "hub_model_id", None) or "push_to_hub=True"),
                      "not sent")

    def _patch_pretrained(self, modname: str, clsname: str) -> Callable:
        def patch(mod) -> None:
            C = getattr(mod, clsname, None)
            if C is None:
                return
            sb = self
            if "save_pretrained" in C.__dict__:
                orig = C.__dict__["save_pretrained"]

                @functools.wraps(orig)
                def save_pretrained(self, save_directory, *a, **kw):
                    if kw.get("push_to_hub"):
                        kw["push_to_hub"] = False
                        sb.note(f"{clsname}.save_pretrained(push_to_hub=True)", os.fspath(save_directory), "not sent")
                    return orig(self, sb.redirect(save_directory, f"{clsname}.save_pretrained", is_dir=True), *a,
                                **kw)

                C.save_pretrained = save_pretrained
            if "from_pretrained" in C.__dict__:
                orig_fp = C.__dict__["from_pretrained"]
                fn = orig_fp.__func__ if isinstance(orig_fp, classmethod) else orig_fp

                @functools.wraps(fn)
                def from_pretrained(cls, name, *a, **kw):
                    return fn(cls, sb.read(name, f"{clsname}.from_pretrained"), *a, **kw)

                C.from_pretrained = classmethod(from_pretrained)
            if "get_config_dict" in C.__dict__:  # what AutoConfig and the Auto model classes read first
                raw = C.__dict__["get_config_dict"]
                gfn = raw.__func__ if isinstance(raw, classmethod) else raw

                @functools.wraps(gfn)
                def get_config_dict(cls, name, *a, **kw):
                    return gfn(cls, sb.read(name, f"{clsname}.get_config_dict"), *a, **kw)

                C.get_config_dict = classmethod(get_config_dict)

        return patch

    def _patch_loaders(self, clsname: str, arg: int = 0) -> Callable:
        """``from_pretrained`` (and a configuration's ``get_config_dict``) of an Auto class / PeftModel: the path is
        read through :meth:`read` before anything of it is opened (an Auto class reads the configuration first,
        through PretrainedConfig, then the weights)."""

        def patch(mod) -> None:
            C = getattr(mod, clsname, None)
            if C is None:
                return
            sb = self
            for meth in ("from_pretrained", "get_config_dict"):
                raw = C.__dict__.get(meth)
                if raw is None:
                    continue
                fn = raw.__func__ if isinstance(raw, (classmethod, staticmethod)) else raw

                def make(fn, meth):
                    @functools.wraps(fn)
                    def load(cls, *a, **kw):
                        a = list(a)
                        if len(a) > arg:
                            a[arg] = sb.read(a[arg], f"{clsname}.{meth}")
                        return fn(cls, *a, **kw)

                    return classmethod(load)

                setattr(C, meth, make(fn, meth))

        return patch

    def _patch_push_mixin(self, mod) -> None:
        M = getattr(mod, "PushToHubMixin", None)
        if M is None or "push_to_hub" not in M.__dict__:
            return
        sb = self

        def push_to_hub(self, repo_id=None, *a, **kw):
            sb.note(f"{type(self).__name__}.push_to_hub", str(repo_id), "not sent")
            return None

        M.push_to_hub = push_to_hub

    def _patch_hf_trainer(self, mod) -> None:
        T = mod.Trainer
        sb = self
        o_init = T.__init__

        @functools.wraps(o_init)
        def __init__(self, *a, **kw):
            o_init(self, *a, **kw)
            try:  # arguments built before the patch (or a TrainingArguments subclass without __post_init__)
                sb.redirect_training_args(self.args)
            except Exception as e:
                sb.errors.append(f"Trainer: {type(e).__name__}: {e}")

        T.__init__ = __init__
        o_sm = T.save_model

        @functools.wraps(o_sm)
        def save_model(self, output_dir=None, *a, **kw):
            return o_sm(self, sb.redirect(output_dir, "Trainer.save_model", is_dir=True), *a, **kw)

        T.save_model = save_model

        def push_to_hub(self, *a, **kw):
            sb.note("Trainer.push_to_hub", str(getattr(self.args, "hub_model_id", None)), "not sent")
            return None

        T.push_to_hub = push_to_hub

    def _patch_accelerator(self, mod) -> None:
        A = mod.Accelerator
        sb = self
        o_init = A.__init__

        @functools.wraps(o_init)
        def __init__(self, *a, **kw):
            if kw.get("project_dir") is not None:
                kw["project_dir"] = sb.redirect(kw["project_dir"], "Accelerator project_dir", is_dir=True)
            pc = kw.get("project_config")
            if pc is not None:
                for attr in ("project_dir", "logging_dir"):
                    v = getattr(pc, attr, None)
                    if v is not None:
                        try:
                            setattr(pc, attr, sb.redirect(v, f"accelerate ProjectConfiguration.{attr}", is_dir=True))
                        except Exception:
                            pass
            return o_init(self, *a, **kw)

        A.__init__ = __init__
        o_ss = A.save_state

        @functools.wraps(o_ss)
        def save_state(self, output_dir=None, *a, **kw):
            if output_dir is None:
                try:
                    pc = self.project_configuration
                    if pc.project_dir is not None and not sb.allowed(os.fspath(pc.project_dir)):
                        pc.set_directories(sb.redirect(pc.project_dir, "Accelerator project_dir", is_dir=True))
                except Exception:
                    pass
            return o_ss(self, sb.redirect(output_dir, "accelerator.save_state", is_dir=True), *a, **kw)

        A.save_state = save_state
        o_sm = A.save_model

        @functools.wraps(o_sm)
        def save_model(self, model, save_directory, *a, **kw):
            return o_sm(self, model, sb.redirect(save_directory, "accelerator.save_model", is_dir=True), *a, **kw)

        A.save_model = save_model

    def _patch_lightning_trainer(self, mod) -> None:
        T = mod.Trainer
        sb = self
        o_init = T.__init__

        @functools.wraps(o_init)
        def __init__(self, *a, **kw):
            root = kw.get("default_root_dir")
            shown = os.fspath(root) if root is not None else os.getcwd()
            if root is None or not sb.allowed(os.fspath(root)):
                to = sb.target(shown)
                os.makedirs(to, exist_ok=True)
                kw["default_root_dir"] = to
                sb.note("Lightning default_root_dir (lightning_logs, checkpoints)", shown, to)
                if root is not None:
                    sb.out_dirs.add(os.path.abspath(shown))
            return o_init(self, *a, **kw)

        T.__init__ = __init__
        o_sc = T.save_checkpoint

        @functools.wraps(o_sc)
        def save_checkpoint(self, filepath, *a, **kw):
            return o_sc(self, sb.redirect(filepath, "Lightning Trainer.save_checkpoint"), *a, **kw)

        T.save_checkpoint = save_checkpoint

    def _patch_model_checkpoint(self, mod) -> None:
        MC = mod.ModelCheckpoint
        sb = self
        o_init = MC.__init__

        @functools.wraps(o_init)
        def __init__(self, dirpath=None, *a, **kw):
            return o_init(self, sb.redirect(dirpath, "Lightning ModelCheckpoint dirpath", is_dir=True), *a, **kw)

        MC.__init__ = __init__

    def _patch_logger(self, clsname: str) -> Callable:
        def patch(mod) -> None:
            C = getattr(mod, clsname, None)
            if C is None:
                return
            sb = self
            o_init = C.__init__

            @functools.wraps(o_init)
            def __init__(self, save_dir=None, *a, **kw):
                if save_dir is None and "root_dir" in kw:
                    kw["root_dir"] = sb.redirect(kw["root_dir"], f"{clsname} root_dir", is_dir=True)
                    return o_init(self, *a, **kw)
                return o_init(self, sb.redirect(save_dir, f"{clsname} save_dir", is_dir=True), *a, **kw)

            C.__init__ = __init__

        return patch

    def _patch_summary_writer(self, mod) -> None:
        W = getattr(mod, "SummaryWriter", None)
        if W is None:
            return
        sb = self
        o_init = W.__init__

        @functools.wraps(o_init)
        def __init__(self, log_dir=None, *a, **kw):
            if log_dir is None and "logdir" not in kw:
                import socket
                from datetime import datetime

                shown = os.path.join("runs", datetime.now().strftime("%b%d_%H-%M-%S") + "_" + socket.gethostname()
                                     + str(kw.get("comment", "")))
                log_dir = sb.target(shown)
                os.makedirs(log_dir, exist_ok=True)
                sb.note("TensorBoard SummaryWriter", "runs/", log_dir)
            else:
                log_dir = sb.redirect(log_dir, "TensorBoard SummaryWriter", is_dir=True)
            return o_init(self, log_dir, *a, **kw)

        W.__init__ = __init__

    def _patch_hf_api(self, mod) -> None:
        H = getattr(mod, "HfApi", None)
        if H is None:
            return
        sb = self
        for name in ("upload_file", "upload_folder", "create_commit", "create_repo", "upload_large_folder",
                     "delete_file", "delete_folder", "delete_repo"):
            if not hasattr(H, name):
                continue

            def make(name):
                def no_op(self, *a, **kw):
                    sb.note(f"huggingface_hub HfApi.{name}", str(kw.get("repo_id") or (a[0] if a else "")), "not sent")
                    return None

                return no_op

            setattr(H, name, make(name))


def child_environment(env: dict, sandbox_root: str) -> dict:
    """Environment redirections for the child (W&B, MLflow): set by the parent before the script starts."""
    env = dict(env)
    env["WANDB_MODE"] = "disabled"
    env["WANDB_DIR"] = os.path.join(sandbox_root, "wandb")
    env["WANDB_SILENT"] = "true"
    if env.get("MLFLOW_TRACKING_URI"):
        env["BERTLINT_VERIFY_MLFLOW_WAS"] = env["MLFLOW_TRACKING_URI"]
    env["MLFLOW_TRACKING_URI"] = "file:" + os.path.join(sandbox_root, "mlruns")
    return env


def _temp_entries() -> list:
    try:
        return os.listdir(tempfile.gettempdir())
    except OSError:
        return []


def snapshot_temp(path: str) -> None:
    with open(path, "w") as f:
        json.dump(_temp_entries(), f)


def _rel(p: Optional[str], root: str) -> Optional[str]:
    if not p:
        return p
    try:
        return "<temporary folder>/" + os.path.relpath(p, root) if os.path.isabs(p) and p.startswith(root) else p
    except Exception:
        return p


def _pathlike_ok(path) -> bool:
    try:
        type(path)("x")
        return True
    except Exception:
        return False


def _wrap_arg(orig, index: int, name: str, fn) -> Callable:
    @functools.wraps(orig)
    def wrapper(*a, **kw):
        if name in kw:
            kw[name] = fn(kw[name])
        elif len(a) > index:
            a = a[:index] + (fn(a[index]),) + a[index + 1:]
        return orig(*a, **kw)

    return wrapper

