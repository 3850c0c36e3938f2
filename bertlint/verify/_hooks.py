"""Instrumentation installed in the verifier's child process before the user's script runs (imports torch).

Everything is recorded with the user's source line (the innermost frame that belongs to the script's folder and
is not an installed package). The run is stopped after a bounded number of micro-batches by raising
``VerifyStop`` (a ``BaseException``, so user ``except Exception`` blocks do not swallow it) from a hook.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.util
import math
import os
import sys
import sysconfig
import threading
import time
import traceback
import weakref
from collections import Counter
from typing import Any, Optional

import torch

from bertlint.verify._memory import MemoryTracker

MAX_EVENTS = 20000
_ACTIVE = None  # the process's Recorder (a forked worker inherits it)
HARD_CAP_MICROBATCHES = 64
DEFAULT_STEPS = 3  # optimizer steps observed by default (bertlint.verify._trace.WINDOWS_NEEDED)
EVAL_FORWARDS_WANTED = 5


class VerifyStop(BaseException):
    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _f(x) -> Optional[float]:
    try:
        if isinstance(x, torch.Tensor):
            if x.numel() != 1:
                return None
            x = x.detach().float().item()
        x = float(x)
        return x if math.isfinite(x) else (None if math.isnan(x) else x)
    except Exception:
        return None


_LOSS_NODE = (
    "NllLoss",
    "MseLoss",
    "BinaryCrossEntropy",
    "SmoothL1Loss",
    "HuberLoss",
    "L1Loss",
    "KlDiv",
    "SoftMarginLoss",
    "MultilabelMarginLoss",
    "MultiMarginLoss",
    "Mean",
    "LogSoftmax",
    "CrossEntropy",
)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Run a patch function right after a module is executed (transformers, accelerate, deepspeed)."""

    def __init__(self, callbacks: dict, on_error) -> None:
        self.callbacks = callbacks
        self.on_error = on_error
        self._busy: set = set()

    def find_spec(self, name, path, target=None):
        cb = self.callbacks.get(name)
        if cb is None or name in self._busy:
            return None
        self._busy.add(name)
        try:
            spec = importlib.util.find_spec(name)
        except Exception:
            spec = None
        finally:
            self._busy.discard(name)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        orig = spec.loader
        finder = self

        class _Loader(importlib.abc.Loader):
            def create_module(self, spec):
                return orig.create_module(spec)

            def exec_module(self, module):
                orig.exec_module(module)
                for f in (cb if isinstance(cb, list) else [cb]):
                    try:
                        f(module)
                    except Exception as e:  # never break the user's import
                        finder.on_error(name, e)

            def __getattr__(self, item):
                return getattr(orig, item)

        spec.loader = _Loader()
        return spec


class Recorder:
    def __init__(self, cfg: dict) -> None:
        self.cfg = cfg
        self.script = os.path.realpath(cfg["script"])
        self.script_dir = os.path.dirname(self.script)
        self.steps_cfg = cfg.get("steps")
        self.static_n = cfg.get("accumulation")
        self.want_eval = bool(cfg.get("want_eval"))
        self.watch_names = list(cfg.get("watch") or [])
        # wall-clock deadline shared by every process of the run (the parent's start + --verify-timeout)
        self.deadline = float(cfg.get("deadline") or (time.time() + float(cfg.get("timeout", 300.0))))
        self.rank = int(cfg.get("rank", os.environ.get("RANK", "0")) or 0)
        self.world = int(cfg.get("world_size", os.environ.get("WORLD_SIZE", "1")) or 1)
        self.role = cfg.get("role", "main")
        self.writer = None  # callable(final: bool): writes the record (the runner sets it)
        self._last_write = 0.0
        self.sandbox = None
        self.main_thread = threading.get_ident()
        self._user_cache: dict = {}
        self._skip = [sysconfig.get_paths().get("purelib", "@@"), sysconfig.get_paths().get("stdlib", "@@"),
                      os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]
        # counters
        self.mb = 0  # top-level backward calls (micro-batches)
        self.opt_steps = 0
        self.events: list[dict] = []
        self.counts: Counter = Counter()
        self.lines: dict[str, Counter] = {}
        self.optimizers: list = []
        self.probe: dict[int, Any] = {}
        self.probe_extra: dict[int, list] = {}
        self.in_grad: dict[int, int] = {}  # micro-batches whose gradient is in the probe's .grad
        self.since_step: dict[int, int] = {}
        self.step_marks: list[int] = []
        self.windows: list[dict] = []
        self.backwards: list[dict] = []
        self.forwards: list[dict] = []
        self.fwd_lines: Counter = Counter()
        self.fwd_backprop: Counter = Counter()
        self._fwd_keys_since_bwd: list = []
        self.eval_forwards = 0
        self.eval_grad_forwards = 0
        self.eval_no_backward_run = 0
        self._last_fwd_backpropagated = True
        self.train_forwards_since_bwd = 0
        self.sched: list[dict] = []
        self.clips: list[dict] = []
        self.zero_grads: list[dict] = []
        self.scaler_events: list[dict] = []
        self._scaled_ids: dict[int, float] = {}
        self._scaler_pending = False  # scaled backward since the last update()
        self._scaler_unscaled = False  # unscale_ since the last update()
        self.scaler_seen = False
        self.skipped_steps = 0
        self.trainer: dict[str, Any] = {}
        self.accel: dict[str, Any] = {}
        self.ds: dict[str, Any] = {"backward": 0, "step": 0, "records": []}
        self.ddp: dict[str, Any] = {}
        self.lightning: dict[str, Any] = {}
        self.batch_sizes: Counter = Counter()  # leading dimension of the training forwards' first tensor input
        self._ddp_pending_sync: Optional[bool] = None
        self._no_sync_depth = 0
        self.ckpt: dict[str, Any] = {"calls": 0, "reentrant": 0, "inputs_no_grad": 0, "lines": Counter(),
                                     "checks": []}
        self._ckpt_depth = 0
        self._ckpt_params: dict[int, Any] = {}
        self.dtypes: dict[str, int] = {}
        self._dtypes_done = False
        self.bf16_changes: list[dict] = []
        self._bf16_sample = None
        self.inference_inputs: list[dict] = []
        self.watch: dict[str, list] = {n: [] for n in self.watch_names}
        self.locals_graph: dict[str, list] = {}
        self.model_losses: dict[int, Any] = {}
        self._loss_nodes: list = []
        self.in_backward = 0
        self._cur_bwd = None
        self._in_probe = False
        self._depth = 0
        self._via_accel = 0
        self._in_clip = 0
        self._in_sched_init = 0
        self.patch_errors: list[str] = []
        self.stop_reason: Optional[str] = None
        self.status = "running"
        self.crash: Optional[dict] = None
        self.mem = MemoryTracker(limit=cfg.get("memory_limit"))
        self.t_start = time.monotonic()
        self._eval_after_bound = 0
        self.hook_marks: list = []  # hook seconds (cumulative) at each optimizer step
        self.hook_s = 0.0  # seconds spent in the verifier's own bookkeeping (not counting saved-tensor packing)

    # ---- helpers -----------------------------------------------------------------------------------------
    def _is_user(self, filename: str) -> bool:
        r = self._user_cache.get(filename)
        if r is None and (not filename or filename.startswith("<") or not os.path.isabs(filename)
                          and not os.path.exists(filename)):
            r = False  # <frozen runpy>, <string>, <stdin>: never the user's code
            self._user_cache[filename] = r
        if r is None:
            try:
                real = os.path.realpath(filename)
            except Exception:
                real = filename
            r = real == self.script or (
                real.startswith(self.script_dir + os.sep)
                and not any(real.startswith(s) for s in self._skip if s)
                and "site-packages" not in real
            )
            self._user_cache[filename] = r
        return r

    def user_frame(self):
        f = sys._getframe(2)
        while f is not None:
            if self._is_user(f.f_code.co_filename):
                return f
            f = f.f_back
        return None

    def where(self) -> Optional[list]:
        f = self.user_frame()
        if f is None:
            return None
        fn = os.path.realpath(f.f_code.co_filename)
        return [fn, f.f_lineno]

    def ev(self, _kind: str, **kw) -> dict:
        line = kw.pop("line", None)
        if line is None:
            line = self.where()
        e = {"k": _kind, "mb": self.mb, "st": self.opt_steps, "line": line, **kw}
        self.counts[_kind] += 1
        if line:
            self.lines.setdefault(_kind, Counter())[f"{line[0]}:{line[1]}"] += 1
        if len(self.events) < MAX_EVENTS:
            self.events.append(e)
        return e

    def accumulation_n(self) -> Optional[int]:
        for v in (self.trainer.get("gradient_accumulation_steps"), self.ds.get("gas"),
                  self.lightning.get("accumulate_grad_batches"),
                  self.accel.get("gradient_accumulation_steps"), self.static_n):
            if isinstance(v, int) and v >= 1:
                if v > 1:
                    return v
        return None

    def bound(self) -> int:
        """Micro-batches to run: ``steps`` optimizer steps (default :data:`DEFAULT_STEPS`: the first window and two
        full ones, what the loop invariants need — BL107 compares the first window with the next two) plus one
        micro-batch; with the accumulation N known (a framework setting, the static set-up) that is ``3·N + 1``."""
        k = int(self.steps_cfg) if self.steps_cfg else DEFAULT_STEPS
        n = self.accumulation_n()
        low = int(self.cfg.get("min_microbatches") or 0)
        marks = self.step_marks
        longer = n and any(b - a > n for a, b in zip([0] + marks, marks))
        fw = any(isinstance(v, int) and v > 1 for v in (
            self.trainer.get("gradient_accumulation_steps"), self.ds.get("gas"),
            self.lightning.get("accumulate_grad_batches"), self.accel.get("gradient_accumulation_steps")))
        if n and (fw or not longer):
            return max(k * n + 1, low)
        # no N, or the static set-up's N while the run's windows are longer (an argument read at runtime): the run's
        # own optimizer steps bound it
        low = max(low, k * n + 1) if n else low
        if len(marks) >= k:
            return max(self.step_marks[k - 1] + 1, low)
        return HARD_CAP_MICROBATCHES * max(1, (k + 1) // 2)

    def check_stop(self, where: str) -> None:
        if time.time() > self.deadline:
            raise VerifyStop("timeout")
        if self.mb < self.bound():
            return
        if self.want_eval and self.eval_forwards < EVAL_FORWARDS_WANTED:
            cap = max(10 * self.bound(), 50)
            if self.mb < cap:
                return
            raise VerifyStop("bound-no-eval")
        raise VerifyStop("bound")

    # ---- install -----------------------------------------------------------------------------------------
    def install(self) -> None:
        steps = [
            self._patch_module_call,
            self._patch_backward,
            self._patch_optimizer,
            self._patch_scheduler,
            self._patch_clip,
            self._patch_scaler,
            self._patch_checkpoint,
            self._patch_ddp,
        ]
        for s in steps:
            try:
                s()
            except Exception as e:
                self.patch_errors.append(f"{s.__name__}: {type(e).__name__}: {e}")
        try:
            self._patch_spawn()
        except Exception as e:
            self.patch_errors.append(f"_patch_spawn: {type(e).__name__}: {e}")
        cbs = {
            "transformers.trainer": [self._patch_trainer],
            "accelerate.accelerator": [self._patch_accelerate],
            "accelerate.optimizer": [self._patch_accelerate_optimizer],
            "deepspeed.runtime.engine": [self._patch_deepspeed],
            "lightning.pytorch.trainer.trainer": [self._patch_lightning],
            "pytorch_lightning.trainer.trainer": [self._patch_lightning],
        }
        if self.sandbox is not None:
            try:
                self.sandbox.install_torch()
            except Exception as e:
                self.patch_errors.append(f"sandbox torch.save: {type(e).__name__}: {e}")
            for name, cb in self.sandbox.callbacks().items():
                cbs.setdefault(name, []).append(cb)
        for name in list(cbs):  # already imported (the runner imported torch): patch now
            mod = sys.modules.get(name)
            if mod is not None:
                for cb in cbs.pop(name):
                    try:
                        cb(mod)
                    except Exception as e:
                        self._patch_error(name, e)
        sys.meta_path.insert(0, _PostImportFinder(cbs, self._patch_error))
        self.mem.install()

    def _patch_spawn(self) -> None:
        """Processes the script starts with torch.multiprocessing (spawn / start_processes) are instrumented too:
        each worker installs its own recorder, is bounded by the same deadline and writes its own record."""
        import importlib

        import torch.multiprocessing as tmp

        sp = importlib.import_module("torch.multiprocessing.spawn")  # the attribute is the function

        rec = self
        orig = sp.start_processes

        @functools.wraps(orig)
        def start_processes(fn, args=(), nprocs=1, join=True, daemon=False, start_method="spawn"):
            from bertlint.verify import _runner

            cfg = dict(rec.cfg, role="spawn", world_size=nprocs, spawned_by=os.getpid())
            rec.counts["spawned_workers"] += nprocs
            rec.mem.pause()
            try:
                _runner.ensure_importable_in_children()
            finally:
                rec.mem.resume()
            return orig(functools.partial(_runner.spawned_worker, fn, cfg), args, nprocs, join, daemon, start_method)

        sp.start_processes = start_processes
        if getattr(tmp, "start_processes", None) is orig:
            tmp.start_processes = start_processes
        self._patch_process()

    def _patch_process(self) -> None:
        """``multiprocessing.Process`` / ``torch.multiprocessing.Process`` workers the script starts (any start
        method: fork, spawn, forkserver) run instrumented: ``start()`` replaces the instance's ``run`` by
        ``_runner.process_worker`` (pickled with the process for spawn), which installs a recorder in the worker,
        bounds it by the same micro-batch bound and deadline, writes its record and returns. Processes whose work is
        not the script's (DataLoader workers, torch.multiprocessing.spawn's own, a library's pool) are left alone:
        they are ended with the process group."""
        import multiprocessing.process as mpp

        rec = self
        BP = mpp.BaseProcess
        orig = BP.start

        @functools.wraps(orig)
        def start(self):
            try:
                rec._instrument_process(self)
            except Exception as e:  # never break the script's own start
                rec._patch_error("Process.start", e)
            return orig(self)

        BP.start = start

    def _instrument_process(self, proc) -> None:
        target = getattr(proc, "_target", None)
        run = type(proc).run
        import multiprocessing.process as mpp

        if target is not None and run is mpp.BaseProcess.run:
            code = getattr(getattr(target, "__code__", None), "co_filename", None)
            if code is None and isinstance(target, functools.partial):
                code = getattr(getattr(target.func, "__code__", None), "co_filename", None)
        elif run is not mpp.BaseProcess.run:
            code = getattr(getattr(run, "__code__", None), "co_filename", None)
        else:
            return
        if not code or not self._is_user(code) or "run" in proc.__dict__:
            return
        from bertlint.verify import _runner

        i = int(self.counts["process_workers"])
        self.counts["process_workers"] += 1
        self.counts["spawned_workers"] += 1
        cfg = dict(self.cfg, role="spawn", world_size=None, spawned_by=os.getpid(), worker=i)
        self.mem.pause()
        try:
            _runner.ensure_importable_in_children()
        finally:
            self.mem.resume()
        proc.run = functools.partial(_runner.process_worker, cfg, i, proc)

    def reset_for_worker(self, cfg: dict) -> None:
        """A forked worker inherits the parent's patched torch and this recorder: start its record afresh."""
        sandbox = self.sandbox
        self.mem.uninstall()
        self.__init__(cfg)
        self.sandbox = sandbox
        self.mem.install()

    def safe(self, fn, *a, **kw):
        """Run a bookkeeping function; a bug in bertlint must never break the user's script."""
        t0 = time.perf_counter()
        self.mem.pause()  # the verifier's own tensors (probes, checksums) are not the script's memory
        try:
            return fn(*a, **kw)
        except (VerifyStop, torch.OutOfMemoryError):
            raise
        except Exception as e:
            if len(self.patch_errors) < 50:
                self.patch_errors.append(f"{getattr(fn, '__name__', fn)}: {type(e).__name__}: {e}")
            return None
        finally:
            self.mem.resume()
            self.hook_s += time.perf_counter() - t0

    def _patch_error(self, name, e) -> None:
        self.patch_errors.append(f"{name}: {type(e).__name__}: {e}")

    # ---- modules -------------------------------------------------------------------------------------------
    def _patch_module_call(self) -> None:
        Module = torch.nn.Module
        orig = Module.__call__
        rec = self
        main = self.main_thread
        has_params: dict = {}

        def __call__(self, *args, **kwargs):
            if rec._depth or rec.in_backward or rec._in_probe or threading.get_ident() != main:
                if rec._ckpt_depth and len(rec._ckpt_params) < 4096:
                    for p in self._parameters.values():
                        if p is not None and p.requires_grad:
                            rec._ckpt_params[id(p)] = p
                rec._depth += 1
                try:
                    return orig(self, *args, **kwargs)
                finally:
                    rec._depth -= 1
            key = id(self)
            hp = has_params.get(key)
            if hp is None:
                hp = any(True for _ in self.parameters())
                has_params[key] = hp
            if not hp:
                rec._depth += 1
                try:
                    out = orig(self, *args, **kwargs)
                finally:
                    rec._depth -= 1
                if isinstance(self, torch.nn.modules.loss._Loss) and isinstance(out, torch.Tensor):
                    if out.grad_fn is not None and rec.train_forwards_since_bwd:
                        rec._add_loss_node(out.grad_fn)
                return out
            return rec._top_forward(self, orig, args, kwargs)

        Module.__call__ = __call__

    def _top_forward(self, module, orig, args, kwargs):
        ctx = self.safe(self._fwd_pre, module, args, kwargs)
        self._depth += 1
        try:
            out = orig(module, *args, **kwargs)
        finally:
            self._depth -= 1
        if ctx is not None:
            self.safe(self._fwd_post, module, ctx, out)
        return out

    def _fwd_pre(self, module, args, kwargs):
        training = bool(module.training)
        grad = torch.is_grad_enabled()
        inference = torch.is_inference_mode_enabled()
        line = self.where()
        train_fwd = training and grad
        if train_fwd:
            self.check_stop("forward")
        elif not training:
            if time.time() > self.deadline:
                raise VerifyStop("timeout")
            if self.mb >= self.bound() and self.want_eval and self.eval_forwards >= EVAL_FORWARDS_WANTED:
                raise VerifyStop("bound")
        if not self._dtypes_done and train_fwd:
            self._record_dtypes(module)
        self.mem.track_params(module.parameters())
        try:
            from torch.nn.parallel import DistributedDataParallel as DDP

            if isinstance(module, DDP):
                self._ddp_pending_sync = bool(grad and module.require_backward_grad_sync)
                self.ddp.setdefault("forwards", 0)
                self.ddp["forwards"] += 1
                if not self._ddp_pending_sync:
                    self.ddp["forwards_no_sync"] = self.ddp.get("forwards_no_sync", 0) + 1
        except Exception:
            pass
        if train_fwd:
            self._check_inference_inputs(args, kwargs, line)
        phase = "forward" if train_fwd else ("eval" if not training else "forward-nograd")
        batch = _batch_size(args, kwargs) if train_fwd else None
        if batch is not None:
            self.batch_sizes[batch] += 1
        if not training and not self._last_fwd_backpropagated and grad:
            self.eval_no_backward_run += 1
        self.mem.set_tag(self.mb + 1, self.opt_steps)
        self.mem.phase_begin(phase)
        return (training, grad, inference, line, train_fwd, phase)

    def _fwd_post(self, module, ctx, out):
        training, grad, inference, line, train_fwd, phase = ctx
        rec = {"mb": self.mb, "line": line, "training": training, "grad": grad, "inference": inference,
               "cls": type(module).__name__}
        if len(self.forwards) < 2000:
            self.forwards.append(rec)
        self.fwd_lines[(tuple(line) if line else None, training, grad)] += 1
        loss = None
        try:
            if isinstance(out, torch.Tensor) and out.dim() == 0:
                loss = out
            elif hasattr(out, "get") and not isinstance(out, torch.Tensor):
                loss = out.get("loss")
            elif isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor) and out[0].dim() == 0:
                loss = out[0]
        except Exception:
            loss = None
        if train_fwd and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
            self._add_loss_node(loss.grad_fn)
        if train_fwd:
            self.train_forwards_since_bwd += 1
        if training and self._fwd_keys_since_bwd:
            # evaluation forwards followed by a training-mode forward did not feed the coming backward
            self._fwd_keys_since_bwd = [k for k in self._fwd_keys_since_bwd if k[1]]
        if grad:
            self._last_fwd_backpropagated = False
            key = (tuple(line) if line else None, training, grad)
            if len(self._fwd_keys_since_bwd) < 64:
                self._fwd_keys_since_bwd.append(key)
        # a training forward's phase lasts until its backward starts (the loss computed after the model's forward
        # and what it saves are the forward's activations)
        s = self.mem.phase_end(phase, self.mb, self.opt_steps, next_phase="forward" if train_fwd else "idle")
        if not training:
            self.eval_forwards += 1
            if grad and not inference:
                self.eval_grad_forwards += 1
            rec["saved_bytes_alive"] = s.get("activations") if grad else 0
            self._scan_locals(self.user_frame_for(line), "eval")

    def _add_loss_node(self, node) -> None:
        # only training forwards' losses (eval graphs must not be kept alive by the verifier), at most 16
        self._loss_nodes.append(node)
        if len(self._loss_nodes) > 16:
            del self._loss_nodes[0]

    def user_frame_for(self, line):
        f = sys._getframe(1)
        while f is not None:
            if self._is_user(f.f_code.co_filename):
                return f
            f = f.f_back
        return None

    def _check_inference_inputs(self, args, kwargs, line) -> None:
        try:
            for v in list(args) + list(kwargs.values()):
                if isinstance(v, torch.Tensor) and v.is_inference():
                    if len(self.inference_inputs) < 20:
                        self.inference_inputs.append({"mb": self.mb, "line": line, "shape": list(v.shape)})
                    return
        except Exception:
            pass

    def _record_dtypes(self, module) -> None:
        c: Counter = Counter()
        ct: Counter = Counter()
        for p in module.parameters():
            c[str(p.dtype).replace("torch.", "")] += p.numel()
            if p.requires_grad:
                ct[str(p.dtype).replace("torch.", "")] += p.numel()
        self.dtypes = {"all": dict(c), "trainable": dict(ct), "model": type(module).__name__}
        self._dtypes_done = True

    def _scan_locals(self, frame, when: str) -> None:
        """Autograd-graph size of tensors (and lists of tensors) held by the user's frame."""
        if frame is None:
            return
        try:
            items = list(frame.f_locals.items())
        except Exception:
            return
        for name, v in items:
            if name.startswith("__"):
                continue
            size = None
            try:
                if isinstance(v, torch.Tensor):
                    if v.grad_fn is not None:
                        size = _graph_size(v.grad_fn)
                elif isinstance(v, (list, tuple)) and 0 < len(v) <= 100000:
                    n = 0
                    for x in v:
                        if isinstance(x, torch.Tensor) and x.grad_fn is not None:
                            n += 1
                        elif hasattr(x, "get") and not isinstance(x, torch.Tensor):
                            try:
                                if any(isinstance(y, torch.Tensor) and y.grad_fn is not None for y in x.values()):
                                    n += 1
                            except Exception:
                                pass
                    if n:
                        size = -n  # negative: number of graph-carrying elements
            except Exception:
                size = None
            if size is not None:
                lst = self.locals_graph.setdefault(f"{name}@{frame.f_code.co_name}", [])
                if len(lst) < 400:
                    lst.append([self.mb, self.eval_forwards, size, when, frame.f_lineno,
                                frame.f_code.co_firstlineno])

    # ---- backward ----------------------------------------------------------------------------------------
    def _patch_backward(self) -> None:
        orig = torch.autograd.backward
        rec = self

        @functools.wraps(orig)
        def backward(tensors, *args, **kwargs):
            if rec.in_backward or threading.get_ident() != rec.main_thread:
                return orig(tensors, *args, **kwargs)
            rec.check_stop("backward")
            rec.safe(rec._before_backward, tensors)
            rec.in_backward += 1
            rec.mem.phase_begin("backward")
            try:
                return orig(tensors, *args, **kwargs)
            finally:
                rec.in_backward -= 1
                rec.safe(rec._after_backward)

        torch.autograd.backward = backward

    def _before_backward(self, tensors) -> None:
        t = tensors if isinstance(tensors, torch.Tensor) else (tensors[0] if tensors else None)
        line = self.where()
        # is the probe gradient clear (a new window starts)?
        for oid, p in list(self.probe.items()):
            clear = True
            for q in [p] + self.probe_extra.get(oid, []):  # every probe must be clear (a zero gradient alone is not)
                g = q.grad
                try:
                    if g is not None and bool(g.any()):
                        clear = False
                        break
                except Exception:
                    clear = False
                    break
            if clear:
                self.in_grad[oid] = 0
        scaler_scale = None
        if isinstance(t, torch.Tensor) and id(t) in self._scaled_ids:
            scaler_scale = self._scaled_ids.pop(id(t))
        value = _f(t) if isinstance(t, torch.Tensor) else None
        factor = None
        root = None
        if isinstance(t, torch.Tensor) and t.grad_fn is not None:
            factor, root = _loss_factor(t.grad_fn, self._loss_nodes)
        if factor is not None and scaler_scale:
            factor = factor / scaler_scale
        rec = {
            "mb": self.mb + 1,
            "line": line,
            "loss": value,
            "loss_dtype": str(t.dtype).replace("torch.", "") if isinstance(t, torch.Tensor) else None,
            "factor": factor,
            "root": root,
            "scaler_scale": scaler_scale,
            "via_accelerate": bool(self._via_accel),
            "accel_sync": self.accel.get("sync_now"),
            "ddp_sync": self._ddp_pending_sync,
            "in_no_sync": self._no_sync_depth > 0,
            "train_forwards": self.train_forwards_since_bwd,
            "saved_bytes_alive": self.mem.activation_bytes(),
        }
        if len(self.backwards) < 2000:
            self.backwards.append(rec)
        self._cur_bwd = rec
        if self._ddp_pending_sync is not None:
            self.ddp["sync_passes_pending"] = self.ddp.get("sync_passes_pending", 0) + (1 if self._ddp_pending_sync else 0)
        self._ddp_pending_sync = None
        self.train_forwards_since_bwd = 0
        self._loss_nodes = []
        for key in self._fwd_keys_since_bwd:
            self.fwd_backprop[key] += 1
        self._fwd_keys_since_bwd = []
        self._last_fwd_backpropagated = True
        self.ev("backward", line=line)
        self.mem.sample("backward-start", self.mb, self.opt_steps, "backward")
        self.mem.set_tag(self.mb + 1, self.opt_steps)

    def _after_backward(self) -> None:
        self.mb += 1
        self.mem.phase_end("backward", self.mb, self.opt_steps)
        if self.mb <= 1 or time.time() - self._last_write > 1.0:
            self.write_record()
        for oid in list(self.in_grad):
            self.in_grad[oid] += 1
        for oid in list(self.since_step):
            self.since_step[oid] += 1
        self._choose_probes()
        if self._ckpt_params and len(self.ckpt["checks"]) < 3:
            ps = [p for p in self._ckpt_params.values() if p.requires_grad]
            no_grad = sum(1 for p in ps if p.grad is None)
            self.ckpt["checks"].append({"mb": self.mb, "params": len(ps), "no_grad": no_grad})
        for name in self.watch_names:
            f = self.user_frame_for(None)
            v = None
            while f is not None and v is None:
                if self._is_user(f.f_code.co_filename):
                    v = f.f_locals.get(name, f.f_globals.get(name))
                f = f.f_back
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                self.watch[name].append([self.mb, self.opt_steps, v])
        self._scan_locals(self.user_frame_for(None), "train")

    def _choose_probes(self) -> None:
        for r in self.optimizers:
            opt = r()
            if opt is None or id(opt) in self.probe:
                continue
            cands = []
            try:
                for g in opt.param_groups:
                    for p in g["params"]:
                        if isinstance(p, torch.Tensor) and p.grad is not None and 0 < p.numel():
                            cands.append(p)
                cands.sort(key=lambda p: p.numel())
                # the two smallest parameters whose gradient is not all zero after this backward
                live = [p for p in cands[:64] if bool(p.grad.any())][:2]
            except Exception:
                continue
            if live:
                self.probe[id(opt)] = live[0]
                self.probe_extra[id(opt)] = live[1:]
                self.in_grad[id(opt)] = 1
                self.since_step.setdefault(id(opt), 1)

    # ---- optimizers ----------------------------------------------------------------------------------------
    def _patch_optimizer(self) -> None:
        O = torch.optim.Optimizer
        rec = self
        orig_init = O.__init__

        @functools.wraps(orig_init)
        def __init__(self, *a, **kw):
            orig_init(self, *a, **kw)
            try:
                rec.optimizers.append(weakref.ref(self))
                rec.since_step[id(self)] = 0
                rec.mem.track_optimizer(self)
            except Exception:
                pass

        O.__init__ = __init__
        import torch.optim.optimizer as optmod

        optmod.register_optimizer_step_pre_hook(lambda o, a, k: self.safe(self._opt_pre, o, a, k))
        optmod.register_optimizer_step_post_hook(lambda o, a, k: self.safe(self._opt_post, o, a, k))
        orig_zg = O.zero_grad

        @functools.wraps(orig_zg)
        def zero_grad(self, *a, **kw):
            rec.safe(rec._zero_grad, "optimizer", self)
            return orig_zg(self, *a, **kw)

        O.zero_grad = zero_grad
        orig_mzg = torch.nn.Module.zero_grad

        @functools.wraps(orig_mzg)
        def mzero_grad(self, *a, **kw):
            rec.safe(rec._zero_grad, "model", self)
            return orig_mzg(self, *a, **kw)

        torch.nn.Module.zero_grad = mzero_grad

    def _zero_grad(self, kind: str, obj) -> None:
        if threading.get_ident() != self.main_thread:
            return
        e = self.ev("zero_grad", kind=kind, oid=f"{type(obj).__name__}@{id(obj):x}" if kind == "optimizer" else None)
        if len(self.zero_grads) < 2000:
            self.zero_grads.append(e)

    def _opt_pre(self, opt, args, kwargs) -> None:
        self.mem.set_tag(self.mb, self.opt_steps + 1)
        self.mem.phase_begin("optimizer")
        oid = id(opt)
        if oid not in self.since_step:
            self.since_step[oid] = 0
            self.optimizers.append(weakref.ref(opt))
            self.mem.track_optimizer(opt)
        self._choose_probes()
        p = self.probe.get(oid)
        w: dict[str, Any] = {
            "opt": oid,
            "opt_cls": type(opt).__name__,
            "index": sum(1 for x in self.windows if x["opt"] == oid) + 1,
            "mb": self.mb,
            "since_step": self.since_step.get(oid, 0),
            "in_grad": self.in_grad.get(oid) if p is not None else None,
            "line": self.where(),
            "lr": _f(opt.param_groups[0].get("lr")) if opt.param_groups else None,
            "sync_passes": self.ddp.pop("sync_passes_pending", None) if self.ddp else None,
        }
        if self.scaler_seen:
            w["scaler_unscaled"] = self._scaler_unscaled
        if p is not None and p.grad is not None:
            try:
                w["probe_grad_norm"] = _f(p.grad.detach().float().norm())
                w["_before"] = p.detach().clone()
            except Exception:
                pass
        w["grad_checksum"] = _grad_checksum(opt)
        if self.world > 1 or self.ddp:
            w["rank"] = self.rank
        if len(self.bf16_changes) < 2:
            self._bf16_sample = _bf16_sample(opt)
        self._cur_window = w
        self.mem.sample("optimizer-start", self.mb, self.opt_steps, "optimizer")

    def _opt_post(self, opt, args, kwargs) -> None:
        oid = id(opt)
        w = getattr(self, "_cur_window", None)
        self.opt_steps += 1
        self.step_marks.append(self.mb)
        if w is not None and w.get("opt") == oid and self.mb != w["mb"]:
            # the backward ran inside optimizer.step(closure) (Lightning, LBFGS): read the window now
            p = self.probe.get(oid)
            w.update(mb=self.mb, since_step=self.since_step.get(oid, 0),
                     in_grad=self.in_grad.get(oid) if p is not None else None, closure=True,
                     grad_checksum=_grad_checksum(opt))
            if self.ddp:
                w["sync_passes"] = self.ddp.pop("sync_passes_pending", None)
        self.since_step[oid] = 0
        if w is not None and w.get("opt") == oid:
            before = w.pop("_before", None)
            p = self.probe.get(oid)
            if before is not None and p is not None:
                try:
                    w["param_changed"] = not torch.equal(before, p.detach())
                except Exception:
                    pass
            if len(self.windows) < 2000:
                self.windows.append(w)
        if self._bf16_sample is not None:
            try:
                self.bf16_changes.append(_bf16_compare(self._bf16_sample))
            except Exception:
                pass
            self._bf16_sample = None
        if len(self.hook_marks) < 10000:
            self.hook_marks.append(round(self.hook_s + self.mem.pack_s, 5))
        self.ev("optimizer_step", opt=type(opt).__name__, oid=f"{type(opt).__name__}@{id(opt):x}",
                line=w.get("line") if w else None)
        self.mem.update_opt_states(opt)
        self.mem.phase_end("optimizer", self.mb, self.opt_steps)
        if self.opt_steps <= 4 or time.time() - self._last_write > 0.5:
            self.write_record()

    # ---- schedulers ----------------------------------------------------------------------------------------
    def _patch_scheduler(self) -> None:
        ls = torch.optim.lr_scheduler
        rec = self
        for cls in (ls.LRScheduler, getattr(ls, "ReduceLROnPlateau", None)):
            if cls is None or "step" not in cls.__dict__:
                continue
            orig = cls.__dict__["step"]

            def make(orig):
                @functools.wraps(orig)
                def step(self, *a, **kw):
                    r = orig(self, *a, **kw)
                    if rec._in_sched_init or threading.get_ident() != rec.main_thread:
                        return r
                    try:
                        lr = _f(self.optimizer.param_groups[0]["lr"])
                    except Exception:
                        lr = None
                    e = rec.safe(rec.ev, "scheduler_step", lr=lr, cls=type(self).__name__)
                    if e is not None and len(rec.sched) < 2000:
                        rec.sched.append(e)
                    return r

                return step

            cls.step = make(orig)
        orig_init = ls.LRScheduler.__init__

        @functools.wraps(orig_init)
        def __init__(self, *a, **kw):
            rec._in_sched_init += 1
            try:
                orig_init(self, *a, **kw)
            finally:
                rec._in_sched_init -= 1

        ls.LRScheduler.__init__ = __init__

    # ---- clipping ----------------------------------------------------------------------------------------
    def _patch_clip(self) -> None:
        import torch.nn.utils as U
        import torch.nn.utils.clip_grad as C

        rec = self
        for name in ("clip_grad_norm_", "clip_grad_value_"):
            orig = getattr(C, name, None)
            if orig is None:
                continue

            def make(orig, name):
                @functools.wraps(orig)
                def clip(*a, **kw):
                    if rec._in_clip:
                        return orig(*a, **kw)
                    rec._in_clip += 1
                    try:
                        r = orig(*a, **kw)
                    finally:
                        rec._in_clip -= 1
                    rec.safe(rec._clip_event, name, r, a, kw)
                    return r

                return clip

            w = make(orig, name)
            setattr(C, name, w)
            if getattr(U, name, None) is orig:
                setattr(U, name, w)

    def _clip_event(self, name, r, a, kw, via=None) -> None:
        max_norm = kw.get("max_norm", a[1] if len(a) > 1 else None)
        e = self.ev("clip", fn=name, norm=_f(r) if name == "clip_grad_norm_" else None, max_norm=_f(max_norm),
                    scaled=bool(self._scaler_pending and not self._scaler_unscaled),
                    scale=self._scaler_scale_now(), via=via, accel_sync=self.accel.get("sync_now"))
        if len(self.clips) < 2000:
            self.clips.append(e)

    def _scaler_scale_now(self) -> Optional[float]:
        s = getattr(self, "_scaler_obj", None)
        s = s() if s is not None else None
        if s is None:
            return None
        try:
            return _f(s.get_scale()) if s.is_enabled() else None
        except Exception:
            return None

    # ---- GradScaler ----------------------------------------------------------------------------------------
    def _patch_scaler(self) -> None:
        G = torch.amp.grad_scaler.GradScaler
        rec = self
        o_scale, o_unscale, o_step, o_update = G.scale, G.unscale_, G.step, G.update

        @functools.wraps(o_scale)
        def scale(self, outputs):
            out = o_scale(self, outputs)
            try:
                if self.is_enabled() and isinstance(out, torch.Tensor):
                    rec.scaler_seen = True
                    rec._scaler_obj = weakref.ref(self)
                    s = _f(self._scale) if getattr(self, "_scale", None) is not None else None
                    rec._scaled_ids[id(out)] = s or 1.0
                    rec._scaler_pending = True
                    if rec.counts["scaler_scale"] < 200:
                        rec.ev("scaler_scale", scale=s)
                    else:
                        rec.counts["scaler_scale"] += 1
            except Exception:
                pass
            return out

        @functools.wraps(o_unscale)
        def unscale_(self, optimizer):
            rec.safe(lambda: rec.ev("scaler_unscale", scale=rec._scaler_scale_now(), pending=rec._scaler_pending))
            r = o_unscale(self, optimizer)
            rec._scaler_unscaled = True
            return r

        @functools.wraps(o_step)
        def step(self, optimizer, *a, **kw):
            before = rec.opt_steps
            r = o_step(self, optimizer, *a, **kw)
            stepped = rec.opt_steps > before
            if not stepped:
                rec.step_marks.append(rec.mb)  # a skipped update still ends the window (the bound counts it)
                # inf/NaN gradients: the scaler skipped optimizer.step(); the window still ends here
                rec.since_step[id(optimizer)] = 0
                rec.skipped_steps += 1
            rec.safe(lambda: rec.ev("scaler_step", stepped=stepped, scale=rec._scaler_scale_now(),
                                    oid=f"{type(optimizer).__name__}@{id(optimizer):x}"))
            return r

        @functools.wraps(o_update)
        def update(self, *a, **kw):
            rec.safe(lambda: rec.ev("scaler_update", scale_before=rec._scaler_scale_now()))
            r = o_update(self, *a, **kw)
            rec._scaler_pending = False
            rec._scaler_unscaled = False
            return r

        G.scale, G.unscale_, G.step, G.update = scale, unscale_, step, update

    # ---- checkpointing -------------------------------------------------------------------------------------
    def _patch_checkpoint(self) -> None:
        import torch.utils.checkpoint as CK

        rec = self
        orig = CK.checkpoint

        @functools.wraps(orig)
        def checkpoint(function, *args, use_reentrant=None, **kwargs):
            if torch.is_grad_enabled() and not rec.in_backward:
                reentrant = True if use_reentrant is None else bool(use_reentrant)
                inputs_grad = any(isinstance(a, torch.Tensor) and a.requires_grad for a in args)
                c = rec.ckpt
                c["calls"] += 1
                c["reentrant"] += int(reentrant)
                c["explicit_use_reentrant"] = use_reentrant
                if reentrant and not inputs_grad:
                    c["inputs_no_grad"] += 1
                line = rec.where()
                if line:
                    c["lines"][f"{line[0]}:{line[1]}"] += 1
                if c["calls"] <= 64:
                    rec._ckpt_depth += 1
                    try:
                        return orig(function, *args, use_reentrant=use_reentrant, **kwargs)
                    finally:
                        rec._ckpt_depth -= 1
            return orig(function, *args, use_reentrant=use_reentrant, **kwargs)

        CK.checkpoint = checkpoint

    # ---- DDP -------------------------------------------------------------------------------------------------
    def _patch_ddp(self) -> None:
        from torch.nn.parallel import DistributedDataParallel as DDP

        rec = self
        o_init = DDP.__init__

        @functools.wraps(o_init)
        def __init__(self, *a, **kw):
            o_init(self, *a, **kw)
            try:
                rec.ddp["find_unused_parameters"] = bool(getattr(self, "find_unused_parameters", False))
                rec.ddp["world_size"] = torch.distributed.get_world_size()
                rec.ddp["rank"] = torch.distributed.get_rank()
                rec.ddp["line"] = rec.where()
                rec.mem.track_params(self.module.parameters())
            except Exception:
                pass

        DDP.__init__ = __init__
        o_ns = DDP.no_sync

        @functools.wraps(o_ns)
        def no_sync(self):
            cm = o_ns(self)
            return _CountingCM(cm, rec)

        DDP.no_sync = no_sync

    # ---- transformers Trainer --------------------------------------------------------------------------
    def _patch_lightning(self, mod) -> None:
        """Lightning's Trainer: ``accumulate_grad_batches`` and whether the module optimises automatically (then
        Lightning divides the loss by it before backward)."""
        T = mod.Trainer
        rec = self
        o_fit = T.fit

        @functools.wraps(o_fit)
        def fit(self, model=None, *a, **kw):
            try:
                rec.lightning["accumulate_grad_batches"] = int(self.accumulate_grad_batches)
                rec.lightning["automatic_optimization"] = bool(getattr(model, "automatic_optimization", True))
            except Exception:
                pass
            return o_fit(self, model, *a, **kw)

        T.fit = fit

    def _patch_trainer(self, mod) -> None:
        T = mod.Trainer
        rec = self
        o_init = T.__init__

        @functools.wraps(o_init)
        def __init__(self, *a, **kw):
            o_init(self, *a, **kw)
            try:
                rec.trainer["gradient_accumulation_steps"] = int(self.args.gradient_accumulation_steps)
                rec.trainer["model_class"] = type(self.model).__name__
                rec.trainer["model_accepts_loss_kwargs_init"] = getattr(self, "model_accepts_loss_kwargs", None)
                rec.trainer["line"] = rec.where()
            except Exception:
                pass

        T.__init__ = __init__
        o_ts = T.training_step

        @functools.wraps(o_ts)
        def training_step(self, model, inputs, *a, **kw):
            # 4.x before 4.46 has no num_items_in_batch parameter: pass the arguments through unchanged
            num_items = a[0] if a else kw.get("num_items_in_batch")
            try:
                rec._trainer_step(self, model, inputs, num_items)
            except VerifyStop:
                raise
            except Exception as e:
                rec.trainer.setdefault("errors", []).append(f"{type(e).__name__}: {e}")
            return o_ts(self, model, inputs, *a, **kw)

        T.training_step = training_step

    def _trainer_step(self, tr, model, inputs, num_items) -> None:
        t = self.trainer
        t["calls"] = t.get("calls", 0) + 1
        mal = getattr(tr, "model_accepts_loss_kwargs", None)
        lis = getattr(tr, "loss_is_scaled_for_ga", None) if hasattr(type(tr), "loss_is_scaled_for_ga") or hasattr(
            tr, "loss_is_scaled_for_ga") else "absent"
        cgas = getattr(tr, "current_gradient_accumulation_steps", None)
        clf = getattr(tr, "compute_loss_func", None) is not None
        if lis != "absent" and lis is not None:
            scaled = bool(lis)
        else:
            scaled = bool((mal and num_items is not None) or clf)
        d = {"model_accepts_loss_kwargs": mal, "loss_is_scaled_for_ga": None if lis == "absent" else lis,
             "loss_is_scaled_for_ga_supported": lis != "absent",
             "current_gradient_accumulation_steps": cgas, "compute_loss_func": clf,
             "num_items_in_batch": _f(num_items) if num_items is not None else None,
             "trainer_divides": not scaled, "mb": self.mb + 1}
        if len(t.setdefault("steps", [])) < 200:
            t["steps"].append(d)
        t["gradient_accumulation_steps"] = int(getattr(tr.args, "gradient_accumulation_steps", 1) or 1)
        if "probe" not in t and mal and num_items is not None and not clf and isinstance(inputs, dict) and \
                "labels" in inputs:
            t["probe"] = self._num_items_probe(tr, inputs, num_items)

    def _num_items_probe(self, tr, inputs, num_items) -> dict:
        """Does the model's loss change with num_items_in_batch? (REFERENCE §7 BL405 runtime check)."""
        m = getattr(tr, "model", None)
        if m is None:
            return {"error": "no model"}
        try:
            inp = tr._prepare_inputs(dict(inputs))
        except Exception:
            inp = dict(inputs)
        was = m.training
        self._in_probe = True
        self.mem.enabled = False
        try:
            with torch.random.fork_rng(devices=[]), torch.no_grad():
                m.eval()
                n = num_items if isinstance(num_items, torch.Tensor) else torch.tensor(num_items)
                a = m(**inp, num_items_in_batch=n)
                b = m(**inp, num_items_in_batch=n * 1000)
                la = _f(a["loss"] if hasattr(a, "get") else a[0])
                lb = _f(b["loss"] if hasattr(b, "get") else b[0])
            return {"loss": la, "loss_num_items_x1000": lb,
                    "ignores_num_items": (la is not None and lb is not None and abs(la - lb) <= 1e-6 * max(1, abs(la))),
                    "model": type(m).__name__}
        except TypeError as e:
            return {"error": f"TypeError: {e}", "ignores_num_items": None}
        except Exception as e:
            return {"error": f"{type(e).__name__}: {e}", "ignores_num_items": None}
        finally:
            m.train(was)
            self._in_probe = False
            self.mem.enabled = True

    # ---- accelerate ------------------------------------------------------------------------------------------
    def _patch_accelerate(self, mod) -> None:
        A = mod.Accelerator
        rec = self
        o_init = A.__init__

        @functools.wraps(o_init)
        def __init__(self, *a, **kw):
            o_init(self, *a, **kw)
            try:
                rec.accel["gradient_accumulation_steps"] = int(self.gradient_accumulation_steps)
                rec.accel["mixed_precision"] = str(self.mixed_precision)
                rec.accel["distributed_type"] = str(self.distributed_type)
                rec.accel["num_processes"] = int(self.num_processes)
                rec.accel["line"] = rec.where()
            except Exception:
                pass

        A.__init__ = __init__
        o_bw = A.backward

        @functools.wraps(o_bw)
        def backward(self, loss, **kw):
            rec.accel["backward_calls"] = rec.accel.get("backward_calls", 0) + 1
            rec.accel["sync_now"] = bool(getattr(self, "sync_gradients", True))
            rec.accel["gradient_accumulation_steps"] = int(self.gradient_accumulation_steps)
            rec._via_accel += 1
            try:
                return o_bw(self, loss, **kw)
            finally:
                rec._via_accel -= 1

        A.backward = backward
        o_acc = A.accumulate

        @functools.wraps(o_acc)
        def accumulate(self, *models):
            return _AccumulateCM(o_acc(self, *models), rec, self)

        A.accumulate = accumulate
        o_clip = A.clip_grad_norm_

        @functools.wraps(o_clip)
        def clip_grad_norm_(self, parameters, max_norm, norm_type=2):
            rec._in_clip += 1
            rec.accel["sync_now"] = bool(getattr(self, "sync_gradients", True))
            try:
                r = o_clip(self, parameters, max_norm, norm_type)
            finally:
                rec._in_clip -= 1
            rec.safe(rec._clip_event, "clip_grad_norm_", r, (parameters, max_norm), {}, via="accelerate")
            return r

        A.clip_grad_norm_ = clip_grad_norm_

    def _patch_accelerate_optimizer(self, mod) -> None:
        AO = mod.AcceleratedOptimizer
        rec = self
        o_step = AO.step

        @functools.wraps(o_step)
        def step(self, *a, **kw):
            rec.accel["opt_step_calls"] = rec.accel.get("opt_step_calls", 0) + 1
            try:
                if not self.gradient_state.sync_gradients:
                    rec.accel["opt_step_noop"] = rec.accel.get("opt_step_noop", 0) + 1
                    o = self.optimizer  # accelerate skips the step off its sync micro-batch
                    rec.ev("accel_step_noop", oid=f"{type(o).__name__}@{id(o):x}")
            except Exception:
                pass
            return o_step(self, *a, **kw)

        AO.step = step

    # ---- DeepSpeed -----------------------------------------------------------------------------------------
    def _patch_deepspeed(self, mod) -> None:
        E = mod.DeepSpeedEngine
        rec = self
        o_bw, o_step = E.backward, E.step

        @functools.wraps(o_bw)
        def backward(self, loss, *a, **kw):
            rec.ds["backward"] += 1
            try:
                rec.ds["gas"] = int(self.gradient_accumulation_steps())
            except Exception:
                pass
            return o_bw(self, loss, *a, **kw)

        @functools.wraps(o_step)
        def step(self, *a, **kw):
            rec.ds["step"] += 1
            try:
                boundary = bool(self.is_gradient_accumulation_boundary())
            except Exception:
                boundary = None
            r = o_step(self, *a, **kw)
            try:
                if len(rec.ds["records"]) < 500:
                    rec.ds["records"].append({"mb": rec.mb, "global_steps": int(self.global_steps),
                                              "micro_steps": int(self.micro_steps), "boundary": boundary,
                                              "line": rec.where()})
                rec.ds["global_steps"] = int(self.global_steps)
                rec.ds["micro_steps"] = int(self.micro_steps)
            except Exception:
                pass
            return r

        E.backward, E.step = backward, step

    # ---- the end ---------------------------------------------------------------------------------------------
    def finish(self, status: str, reason: Optional[str] = None) -> None:
        self.status = status
        self.stop_reason = reason

    def record_crash(self, exc: BaseException, oom: bool = False) -> None:
        tb = exc.__traceback__
        frames = traceback.extract_tb(tb) if tb is not None else []
        user_frames = [[os.path.realpath(fr.filename), fr.lineno, fr.line, fr.name] for fr in frames
                       if self._is_user(fr.filename)]
        user = user_frames[-1][:3] if user_frames else None
        try:
            snap = self.mem.sample("crash", self.mb, self.opt_steps, self.mem.phase or "idle")
        except BaseException:
            snap = None
        message = str(exc)
        if isinstance(exc, SystemExit):
            message = f"exit status {exc.code}" if isinstance(exc.code, int) or exc.code is None else str(exc.code)
        self.crash = {
            "type": type(exc).__name__,
            "message": message[:2000],
            "user_frame": user,
            "user_frames": user_frames[-6:],
            "oom": oom,
            "phase": self.mem.phase or "idle",
            "memory": snap,
            "traceback": _user_traceback(exc, self._is_user)[-6000:],
        }
        self.status = "crashed"

    def write_record(self, final: bool = False) -> None:
        """The record so far (written incrementally: a run killed at the timeout keeps what it saw)."""
        if self.writer is None:
            return
        self._last_write = time.time()
        self.mem.pause()
        try:
            self.writer(final)
        except Exception as e:
            if len(self.patch_errors) < 50:
                self.patch_errors.append(f"write_record: {type(e).__name__}: {e}")
        finally:
            self.mem.resume()

    def to_json(self) -> dict:
        try:
            self.mem.nvml_info()
        except Exception:
            pass
        return {
            "role": self.role,
            "pid": os.getpid(),
            "rank": self.rank,
            "world_size": self.world,
            "script": self.script,
            "status": self.status,
            "stop_reason": self.stop_reason,
            "bound": self.bound(),
            "accumulation": self.accumulation_n(),
            "microbatches": self.mb,
            "optimizer_steps": self.opt_steps,
            "skipped_steps": self.skipped_steps,
            "wall_s": round(time.monotonic() - self.t_start, 3),
            "hook_s": round(self.hook_s, 4),
            "pack_s": round(self.mem.pack_s, 4),
            "hook_s_at_steps": self.hook_marks,
            "counts": dict(self.counts),
            "lines": {k: dict(v) for k, v in self.lines.items()},
            "windows": self.windows,
            "backwards": self.backwards,
            "forwards": self.forwards[:400],
            "forward_lines": [[list(k[0]) if k[0] else None, k[1], k[2], v, self.fwd_backprop.get(k, 0)]
                              for k, v in self.fwd_lines.items()],
            "eval_forwards": self.eval_forwards,
            "eval_grad_forwards": self.eval_grad_forwards,
            "eval_no_backward_run": self.eval_no_backward_run,
            "scheduler": self.sched,
            "clips": self.clips,
            "zero_grads": self.zero_grads[:500],
            "scaler": [e for e in self.events if e["k"].startswith("scaler_")][:500],
            "trainer": self.trainer,
            "accelerate": self.accel,
            "deepspeed": self.ds,
            "ddp": self.ddp,
            "lightning": self.lightning,
            "batch_sizes": {str(k): v for k, v in self.batch_sizes.items()},
            "checkpoint": {**self.ckpt, "lines": dict(self.ckpt["lines"])},
            "dtypes": self.dtypes,
            "bf16_changes": self.bf16_changes,
            "inference_inputs": self.inference_inputs,
            "watch": self.watch,
            "locals_graph": self.locals_graph,
            "events": self.events[:3000],
            "crash": self.crash,
            "patch_errors": self.patch_errors + (self.sandbox.errors if self.sandbox is not None else []),
            "redirected": self.sandbox.to_json() if self.sandbox is not None else [],
            "memory": self.mem.summary(),
            "cuda": torch.cuda.is_available(),
            "versions": {"torch": torch.__version__},
        }


def _batch_size(args, kwargs) -> Optional[int]:
    """The leading dimension of a forward's first tensor input (``input_ids`` first), None when there is none."""
    cands = []
    if isinstance(kwargs, dict):
        for k in ("input_ids", "pixel_values", "inputs_embeds", "x", "input"):
            if k in kwargs:
                cands.append(kwargs[k])
        cands.extend(kwargs.values())
    cands = list(args or ()) + cands
    for v in cands[:8]:
        if isinstance(v, dict):
            v = v.get("input_ids", next((x for x in v.values() if isinstance(x, torch.Tensor)), None))
        if isinstance(v, torch.Tensor) and v.dim() >= 1:
            return int(v.shape[0])
    return None


def _user_traceback(exc: BaseException, is_user) -> str:
    """The traceback of the script's error with only the script's own frames (no runpy, no bertlint, no
    library internals), and the exception line."""
    tb = exc.__traceback__
    frames = [fr for fr in (traceback.extract_tb(tb) if tb is not None else []) if is_user(fr.filename)]
    out = ["Traceback (most recent call last, the script's frames):\n"] if frames else []
    out += traceback.format_list(frames[-5:])
    out += traceback.format_exception_only(type(exc), exc)
    return "".join(out)


class _CountingCM:
    def __init__(self, cm, rec: Recorder):
        self.cm = cm
        self.rec = rec

    def __enter__(self):
        self.rec._no_sync_depth += 1
        self.rec.ddp["no_sync_entries"] = self.rec.ddp.get("no_sync_entries", 0) + 1
        return self.cm.__enter__()

    def __exit__(self, *exc):
        self.rec._no_sync_depth -= 1
        return self.cm.__exit__(*exc)


class _AccumulateCM:
    def __init__(self, cm, rec: Recorder, acc):
        self.cm = cm
        self.rec = rec
        self.acc = acc

    def __enter__(self):
        r = self.cm.__enter__()
        a = self.rec.accel
        a["accumulate_entries"] = a.get("accumulate_entries", 0) + 1
        try:
            sync = bool(self.acc.sync_gradients)
            a["sync_now"] = sync
            a["accumulate_syncs"] = a.get("accumulate_syncs", 0) + int(sync)
            if len(a.setdefault("sync_pattern", [])) < 200:
                a["sync_pattern"].append(int(sync))
            self.rec.ev("accel_sync", sync=sync)
            a["gradient_accumulation_steps"] = int(self.acc.gradient_accumulation_steps)
        except Exception:
            pass
        return r

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def _grad_checksum(opt) -> Optional[float]:
    """Cross-rank checksum: the sum of the gradients of up to 4 small parameters (cheap at any model size)."""
    try:
        small = []
        for g in opt.param_groups:
            for q in g["params"]:
                if q.grad is not None and q.numel() <= (1 << 20):
                    small.append(q)
                    if len(small) >= 4:
                        return sum(float(x.grad.detach().float().sum()) for x in small)
        return sum(float(x.grad.detach().float().sum()) for x in small) if small else None
    except Exception:
        return None


def _graph_size(fn, cap: int = 20000) -> int:
    seen = set()
    stack = [fn]
    while stack and len(seen) < cap:
        n = stack.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        try:
            for nxt, _ in n.next_functions:
                if nxt is not None and id(nxt) not in seen:
                    stack.append(nxt)
        except Exception:
            pass
    return len(seen)


def _loss_factor(fn, loss_nodes) -> tuple:
    """Product of constant multiplications/divisions between the tensor passed to backward and the loss the model
    or criterion produced (or a mean-type loss node). None when the chain is not recognised."""
    factor = 1.0
    node = fn
    ids = {id(n) for n in loss_nodes}
    for _ in range(16):
        if node is None:
            return None, None
        name = type(node).__name__
        if id(node) in ids:
            return factor, name
        if name in ("DivBackward0", "DivBackward1", "MulBackward0", "MulBackward1"):
            other = getattr(node, "_saved_other", None)
            val = None
            if isinstance(other, torch.Tensor):
                if other.numel() == 1 and not other.requires_grad:
                    val = _f(other)
            elif isinstance(other, (int, float)):
                val = float(other)
            if val is None or val == 0:
                return None, name
            factor = factor / val if name.startswith("Div") else factor * val
            nexts = [n for n, _ in node.next_functions if n is not None]
            if len(nexts) != 1:
                return None, name
            node = nexts[0]
            continue
        if name in ("CloneBackward0", "ViewBackward0", "SqueezeBackward0", "ToCopyBackward0"):
            nexts = [n for n, _ in node.next_functions if n is not None]
            node = nexts[0] if len(nexts) == 1 else None
            continue
        if any(name.startswith(p) for p in _LOSS_NODE):
            return factor, name
        return None, name
    return None, None


def _bf16_sample(opt):
    best = None
    for g in opt.param_groups:
        for p in g["params"]:
            if p.dtype == torch.bfloat16 and p.grad is not None and (best is None or p.numel() > best.numel()):
                best = p
    if best is None:
        return None
    k = min(best.numel(), 1 << 20)
    return best, best.detach().reshape(-1)[:k].clone(), best.grad.detach().reshape(-1)[:k].clone(), k


def _bf16_compare(sample) -> dict:
    p, before, grad, k = sample
    after = p.detach().reshape(-1)[:k]
    nz = grad != 0
    n = int(nz.sum())
    unchanged = int(((after == before) & nz).sum())
    return {"elements": n, "unchanged": unchanged, "fraction_unchanged": (unchanged / n) if n else None,
            "dtype": "bfloat16", "numel": int(p.numel())}
