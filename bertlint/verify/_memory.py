"""Memory accounting for the verifier's child process (imports torch; only ever loaded inside the child).

One tracker for ``bertlint memory`` and ``--verify``: ``bertlint.memory.tracker``'s dispatch-mode tracker follows
every storage allocation and free of the bounded run (on the real tensors here, on fake tensors in the
simulation). The peak is the true peak of live tensor bytes (not a sample at a phase boundary), with the phase
and the micro-batch it happened in and the categories alive at that moment: parameters, gradients, optimizer
states, activations (what a grad-enabled forward created that is still alive: saved for backward, outputs
holding the graph), temporaries (everything else: transients, the batch, tensors the script keeps).

On CUDA the allocator's own figures are read as well: ``torch.cuda.max_memory_allocated`` per phase, a memory
snapshot (``torch.cuda.memory._record_memory_history``) and NVML (device total, other processes, the CUDA
context).
"""

from __future__ import annotations

import os
import threading
import time
from typing import Any, Optional

import torch

from bertlint.memory.tracker import CATEGORIES, make_tracker


def _rss() -> Optional[int]:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except Exception:
        return None


class MemoryTracker:
    """The verifier's view of the shared tracker: phases, samples at phase boundaries, the peak, growth."""

    def __init__(self, limit: Optional[int] = None, max_samples: int = 4000) -> None:
        self.cuda = torch.cuda.is_available()
        self.device = "cuda" if self.cuda else "cpu"
        self.t = make_tracker(cuda_rounding=False)
        self.t.grad_aware = True
        self.t.limit = limit
        self.limit = limit
        self.samples: list[dict] = []
        self.max_samples = max_samples
        self.t0 = time.monotonic()
        self.phase: Optional[str] = "setup"
        self.cuda_phase_peaks: dict[str, int] = {}
        self.nvml: dict[str, Any] = {}
        self.installed = False
        self.pack_s = 0.0  # kept for the record's shape (time in the tracker is not separated from the script's)
        self._opts: list = []
        self.cuda_snapshot_path: Optional[str] = None
        self._thread = threading.get_ident()
        self._dis = None

    # ---- install / pause ---------------------------------------------------------------------------------
    def install(self) -> None:
        self._thread = threading.get_ident()
        self.t.set_phase("setup")
        self.t.__enter__()
        self.installed = True
        if self.cuda:
            try:
                torch.cuda.memory._record_memory_history(max_entries=100000)
            except Exception:
                pass

    def uninstall(self) -> None:
        while self.t.paused and self._dis is not None:
            self.resume()
        if self.installed:
            try:
                self.t.__exit__(None, None, None)
            except Exception:
                pass
            self.installed = False

    def pause(self) -> None:
        """Leave the verifier's own bookkeeping out: the mode is taken off the stack (inside it, even
        ``.item()`` of a wrapped number fails), nested calls counted. Only on the thread that installed it."""
        if threading.get_ident() != self._thread:
            return
        if self.t.paused == 0 and self.installed:
            try:
                from torch.utils._python_dispatch import _disable_current_modes

                self._dis = _disable_current_modes()
                self._dis.__enter__()
            except Exception:
                self._dis = None
        self.t.paused += 1

    def resume(self) -> None:
        if threading.get_ident() != self._thread or self.t.paused <= 0:
            return
        self.t.paused -= 1
        if self.t.paused == 0 and self._dis is not None:
            dis, self._dis = self._dis, None
            dis.__exit__(None, None, None)

    @property
    def enabled(self) -> bool:
        return not self.t.paused

    @enabled.setter
    def enabled(self, on: bool) -> None:
        if on:
            self.resume()
        else:
            self.pause()

    # ---- tracked objects -----------------------------------------------------------------------------
    def track_params(self, params) -> None:
        self.pause()
        try:
            self.t.track_parameters(params)
        finally:
            self.resume()

    def track_optimizer(self, opt) -> None:
        try:
            self.track_params(p for g in opt.param_groups for p in g["params"])
        except Exception:
            pass

    def update_opt_states(self, opt=None) -> None:
        self.pause()
        try:
            if opt is not None:
                self.t.mark_optimizer_states(opt)
        finally:
            self.resume()

    def activation_bytes(self) -> int:
        return self.t.live_by_category()["activations"]

    def categories(self) -> dict:
        return self.t.live_by_category()

    # ---- phases and samples -----------------------------------------------------------------------------
    def set_tag(self, mb: int, step: int) -> None:
        self.t.tag = (mb, step)

    def phase_begin(self, phase: str) -> None:
        self.phase = phase
        self.t.set_phase(phase)
        if self.cuda:
            try:
                torch.cuda.reset_peak_memory_stats()
            except Exception:
                pass

    def sample(self, event: str, mb: int, step: int, phase: Optional[str] = None) -> dict:
        cats = self.t.live_by_category()
        s = {"t": round(time.monotonic() - self.t0, 4), "event": event, "microbatch": mb, "step": step,
             "phase": phase or self.phase or "idle", **cats, "total": self.t.total}
        if self.cuda:
            try:
                s["allocated"] = torch.cuda.memory_allocated()
                s["reserved"] = torch.cuda.memory_reserved()
            except Exception:
                pass
        else:
            s["rss"] = _rss()
        if len(self.samples) < self.max_samples:
            self.samples.append(s)
        return s

    def phase_end(self, phase: str, mb: int, step: int, next_phase: str = "idle") -> dict:
        s = self.sample(phase + "-end", mb, step, phase)
        if self.cuda:
            try:
                peak = int(torch.cuda.max_memory_allocated())
                if peak > self.cuda_phase_peaks.get(phase, 0):
                    self.cuda_phase_peaks[phase] = peak
            except Exception:
                pass
        if next_phase is not None:
            self.phase = next_phase
            self.t.set_phase(next_phase)
        return s

    # ---- CUDA ----------------------------------------------------------------------------------------
    def cuda_snapshot(self, path: str) -> Optional[str]:
        if not self.cuda:
            return None
        try:
            import pickle

            snap = torch.cuda.memory._snapshot()
            with open(path, "wb") as f:
                pickle.dump(snap, f)
            self.cuda_snapshot_path = path
            return path
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

    # ---- results -------------------------------------------------------------------------------------
    def _snap(self, snap) -> Optional[dict]:
        if snap is None:
            return None
        tag = snap.tag or (None, None)
        return {"total": snap.total, "phase": snap.phase, "microbatch": tag[0], "step": tag[1],
                **snap.by_category()}

    def summary(self) -> dict:
        t = self.t
        out = {
            "device": self.device,
            "method": "dispatch-mode tracker (bertlint.memory.tracker): every storage allocation and free",
            "samples": self.samples,
            "peak": self._snap(t.peak),
            "phase_peaks": {ph: self._snap(s) for ph, s in t.phase_peaks.items()},
            "allocations": t.allocations,
            "live_now": t.total,
            "nvml": self.nvml,
        }
        if self.cuda:
            try:
                out["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated())
            except Exception:
                pass
            out["cuda_phase_peaks"] = self.cuda_phase_peaks
            out["cuda_snapshot"] = self.cuda_snapshot_path
        return out


__all__ = ["CATEGORIES", "MemoryTracker"]
