"""Memory accounting for the verifier child process (imports torch; only ever loaded inside the child).

Categories: parameters, gradients, optimizer states (tensor accounting over the optimizers and models the run
created), activations (bytes saved for backward, alive now: a global ``saved_tensors_hooks`` pair that wraps each
saved tensor in a small object whose finaliser gives the bytes back), other (CUDA: allocated minus the four
categories; CPU: live Python-visible tensors outside the categories, sampled at a few step boundaries).
"""

from __future__ import annotations

import gc
import os
import time
import weakref
from typing import Any, Optional

import torch


def _storage_key(t) -> Optional[tuple]:
    try:
        s = t.untyped_storage()
        return (s.data_ptr(), t.device.type, t.device.index), s.nbytes()
    except Exception:
        return None


class _Saved:
    __slots__ = ("t", "key", "tracker", "v", "__weakref__")

    def __init__(self, t, key, tracker):
        self.t = t
        self.key = key
        self.tracker = tracker
        self.v = t._version

    def __del__(self):
        tr = self.tracker
        if tr is None:
            return
        try:
            ent = tr.saved.get(self.key)
            if ent is not None:
                ent[0] -= 1
                if ent[0] <= 0:
                    tr.act_bytes -= ent[1]
                    del tr.saved[self.key]
        except Exception:
            pass


def _rss() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


class MemoryTracker:
    def __init__(self, limit: Optional[int] = None, max_samples: int = 4000) -> None:
        self.cuda = torch.cuda.is_available()
        self.device = "cuda" if self.cuda else "cpu"
        self.saved: dict = {}
        self.act_bytes = 0
        self.param_keys: set = set()
        self.params: list = []  # weakrefs to parameters
        self._param_ids: set = set()
        self.optimizers: list = []  # weakrefs
        self.opt_state_bytes = 0
        self.static_bytes = 0
        self.limit = limit
        self.samples: list[dict] = []
        self.max_samples = max_samples
        self.t0 = time.monotonic()
        self.phase_peaks: dict[str, dict] = {}
        self.phase: Optional[str] = None
        self.other_sampled: list[dict] = []
        self.enabled = True
        self._ctx = None
        self._packs = 0
        self.pack_s = 0.0
        self.nvml: dict[str, Any] = {}

    # ---- saved tensors (activations) ---------------------------------------------------------------------
    def install(self) -> None:
        try:
            self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
            self._ctx.__enter__()
        except Exception:
            self._ctx = None

    def _pack(self, t):
        if not self.enabled:
            return t
        t0 = time.perf_counter()
        try:
            return self._pack_inner(t)
        finally:
            self.pack_s += time.perf_counter() - t0

    def _pack_inner(self, t):
        ks = _storage_key(t)
        if ks is None:
            return t
        key, nb = ks
        if key in self.param_keys:
            return t
        ent = self.saved.get(key)
        if ent is None:
            self.saved[key] = [1, nb]
            self.act_bytes += nb
        else:
            ent[0] += 1
        self._packs += 1
        if self.limit and (self._packs & 15) == 0 and self.act_bytes + self.static_bytes > self.limit:
            self.limit_hit()
        # detach(): same storage and version counter, no grad_fn, so a saved *output* does not form a cycle
        # (tensor -> grad_fn -> saved hook object -> tensor) that would keep every graph alive
        return _Saved(t.detach(), key, self)  # noqa: the version counter is shared with t

    @staticmethod
    def _unpack(obj):
        if not isinstance(obj, _Saved):
            return obj
        t = obj.t
        if t._version != obj.v:
            # torch skips its own in-place check when saved-tensor hooks are installed: keep the error the
            # script would raise without the verifier
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"[{t.type()} {list(t.shape)}] is at version {t._version}; expected version {obj.v} instead."
            )
        return t

    def limit_hit(self) -> None:
        limit = self.limit
        self.limit = None  # raise once
        raise torch.OutOfMemoryError(
            f"simulated out of memory: the accounted training memory passed the --verify-memory-limit of "
            f"{limit} bytes"
        )

    # ---- tracked objects -----------------------------------------------------------------------------
    def track_params(self, params) -> None:
        for p in params:
            if not isinstance(p, torch.Tensor) or id(p) in self._param_ids:
                continue
            self._param_ids.add(id(p))
            self.params.append(weakref.ref(p))
            ks = _storage_key(p)
            if ks is not None:
                self.param_keys.add(ks[0])

    def track_optimizer(self, opt) -> None:
        self.optimizers.append(weakref.ref(opt))
        try:
            self.track_params(p for g in opt.param_groups for p in g["params"])
        except Exception:
            pass

    def _live_params(self):
        out = []
        for r in self.params:
            p = r()
            if p is not None:
                out.append(p)
        return out

    def categories(self) -> dict:
        seen = set()
        pbytes = 0
        gbytes = 0
        gseen = set()
        params = self._live_params()
        for p in params:
            ks = _storage_key(p)
            if ks and ks[0] not in seen:
                seen.add(ks[0])
                pbytes += ks[1]
            g = p.grad
            if g is not None:
                ks = _storage_key(g)
                if ks and ks[0] not in gseen:
                    gseen.add(ks[0])
                    gbytes += ks[1]
        self.param_keys |= seen
        return {
            "parameters": pbytes,
            "gradients": gbytes,
            "optimizer_states": self.opt_state_bytes,
            "activations": max(self.act_bytes, 0),
        }

    def update_opt_states(self) -> None:
        total = 0
        seen = set()
        for r in self.optimizers:
            opt = r()
            if opt is None:
                continue
            try:
                for st in opt.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor):
                            ks = _storage_key(v)
                            if ks and ks[0] not in seen:
                                seen.add(ks[0])
                                total += ks[1]
            except Exception:
                pass
        self.opt_state_bytes = total

    # ---- sampling ------------------------------------------------------------------------------------
    def sample(self, event: str, mb: int, step: int, phase: Optional[str] = None) -> dict:
        cats = self.categories()
        s = {"t": round(time.monotonic() - self.t0, 4), "event": event, "microbatch": mb, "step": step,
             "phase": phase or self.phase or "idle", **cats}
        acc = sum(cats.values())
        if self.cuda:
            try:
                alloc = torch.cuda.memory_allocated()
                s["allocated"] = alloc
                s["reserved"] = torch.cuda.memory_reserved()
                s["other"] = max(alloc - acc, 0)
                s["total"] = alloc
            except Exception:
                s["other"] = None
                s["total"] = acc
        else:
            s["other"] = None
            s["total"] = acc
            s["rss"] = _rss()
        self.static_bytes = cats["parameters"] + cats["gradients"] + cats["optimizer_states"]
        if len(self.samples) < self.max_samples:
            self.samples.append(s)
        ph = s["phase"]
        if ph in ("forward", "backward", "optimizer", "eval"):
            best = self.phase_peaks.get(ph)
            if best is None or s["total"] > best["total"]:
                self.phase_peaks[ph] = dict(s)
        if self.limit and acc > self.limit:
            self.limit_hit()
        return s

    def phase_begin(self, phase: str) -> None:
        self.phase = phase
        if self.cuda:
            try:
                torch.cuda.reset_peak_memory_stats()
            except Exception:
                pass

    def phase_end(self, phase: str, mb: int, step: int) -> None:
        s = self.sample(phase + "-end", mb, step, phase)
        if self.cuda:
            try:
                peak = torch.cuda.max_memory_allocated()
                best = self.phase_peaks.get(phase)
                if best is not None and peak > best.get("cuda_peak", 0):
                    best["cuda_peak"] = peak
                    best["total"] = max(best["total"], peak)
                    acc = sum(best[k] for k in ("parameters", "gradients", "optimizer_states", "activations"))
                    best["other"] = max(peak - acc, 0)
            except Exception:
                pass
        self.phase = None
        return s

    def sample_other_cpu(self, label: str) -> Optional[int]:
        """Live Python-visible tensors outside the categories (CPU; costly, so only at a few points)."""
        if self.cuda:
            return None
        try:
            known = set(self.param_keys)
            for p in self._live_params():
                if p.grad is not None:
                    ks = _storage_key(p.grad)
                    if ks:
                        known.add(ks[0])
            known |= set(self.saved)
            for r in self.optimizers:
                opt = r()
                if opt is None:
                    continue
                for st in opt.state.values():
                    for v in st.values():
                        if isinstance(v, torch.Tensor):
                            ks = _storage_key(v)
                            if ks:
                                known.add(ks[0])
            other = 0
            seen = set()
            T = torch.Tensor
            for o in gc.get_objects():
                if issubclass(type(o), T):
                    ks = _storage_key(o)
                    if ks and ks[0] not in known and ks[0] not in seen and ks[0][1] == "cpu":
                        seen.add(ks[0])
                        other += ks[1]
            self.other_sampled.append({"at": label, "bytes": other})
            return other
        except Exception:
            return None

    def nvml_info(self) -> dict:
        if not self.cuda:
            return {}
        info: dict[str, Any] = {}
        try:
            import pynvml  # type: ignore

            pynvml.nvmlInit()
            try:
                idx = torch.cuda.current_device()
                h = None
                try:  # CUDA_VISIBLE_DEVICES renumbers devices; the UUID names the physical one
                    uuid = str(torch.cuda.get_device_properties(idx).uuid)
                    h = pynvml.nvmlDeviceGetHandleByUUID(("GPU-" + uuid) if not uuid.startswith("GPU-") else uuid)
                except Exception:
                    h = None
                if h is None:
                    h = pynvml.nvmlDeviceGetHandleByIndex(idx)
                mem = pynvml.nvmlDeviceGetMemoryInfo(h)
                info.update(device_total=int(mem.total), device_used=int(mem.used), device_free=int(mem.free))
                procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
                mine = 0
                others = 0
                pid = os.getpid()
                for pr in procs:
                    used = int(pr.usedGpuMemory or 0)
                    if pr.pid == pid:
                        mine += used
                    else:
                        others += used
                info.update(this_process=mine, other_processes=others)
                reserved = torch.cuda.memory_reserved()
                if mine:
                    info["cuda_context_and_non_torch"] = max(mine - reserved, 0)
            finally:
                pynvml.nvmlShutdown()
        except Exception as e:  # pynvml missing or NVML unavailable
            info["error"] = f"{type(e).__name__}: {e}"
        self.nvml = info
        return info

    def summary(self) -> dict:
        return {
            "device": self.device,
            "samples": self.samples,
            "phase_peaks": self.phase_peaks,
            "other_sampled": self.other_sampled,
            "nvml": self.nvml,
            "cuda_max_allocated": (torch.cuda.max_memory_allocated() if self.cuda else None),
        }
