"""Tensor accounting: a ``TorchDispatchMode`` that follows every storage an op creates, by category, and
records the peak. The same tracker runs under ``FakeTensorMode`` (the simulation: nothing is allocated) and
on real tensors (the benchmark's reference measurement), so the two are compared like for like.

Categories (resolved when the step is over, so a storage's role is known when it is reported):
- ``parameters``: model parameters and buffers;
- ``gradients``: the ``.grad`` of parameters (marked by post-accumulate-grad hooks);
- ``optimizer_states``: storages created by ``optimizer.step()`` that the optimizer keeps in ``.state``;
- ``activations``: the batch, and storages created in the forward that are still alive when it ends
  (saved for backward, or held by checkpointing);
- ``temporaries``: everything else (transients of forward, backward and step; recomputed activations).

``bertlint --verify`` runs the same tracker on the real tensors of the bounded run (``grad_aware``: only what a
grad-enabled forward or evaluation creates can become ``activations``; ``tag`` marks each peak with the
micro-batch and step; ``limit`` raises a simulated out-of-memory error; ``paused`` leaves the verifier's own
bookkeeping out of the count).
"""

from __future__ import annotations

import math
import weakref
CATEGORIES = ("parameters", "gradients", "optimizer_states", "activations", "temporaries")
CUDA_BLOCK = 512  # the CUDA caching allocator rounds every block up to a multiple of 512 bytes


class _Info:
    __slots__ = ("nbytes", "cat", "__weakref__")

    def __init__(self, nbytes: int, cat: str) -> None:
        self.nbytes = nbytes
        self.cat = cat  # final category, or provisional "fwd" / "opt" / "bwd"


def _make_mode_base():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


class _Snapshot:
    __slots__ = ("total", "infos", "phase", "tag")

    def __init__(self, total: int, infos: tuple, phase: str, tag=None) -> None:
        self.total, self.infos, self.phase, self.tag = total, infos, phase, tag

    def by_category(self) -> dict[str, int]:
        out = dict.fromkeys(CATEGORIES, 0)
        for i in self.infos:
            out[_final(i.cat)] += i.nbytes
        return out


def _final(cat: str) -> str:
    if cat in CATEGORIES:
        return cat
    return "temporaries"


def make_tracker(cuda_rounding: bool):
    """Return a tracker instance (the class is built lazily so importing this module costs no torch)."""
    import torch
    from torch.utils._pytree import tree_flatten
    from torch.utils.weak import WeakIdKeyDictionary

    Base = _make_mode_base()

    class StorageTracker(Base):
        def __init__(self) -> None:
            super().__init__()
            self.cuda_rounding = cuda_rounding
            self._known = WeakIdKeyDictionary()  # storage -> (_Info, weakref)
            self.live: dict[int, _Info] = {}
            self.total = 0
            self.phase = "setup"
            self.peak: _Snapshot | None = None
            self.phase_peaks: dict[str, _Snapshot] = {}
            self._hooks: list = []
            self._hooked: set = set()  # ids of parameters with a gradient hook
            self.grad_aware = False  # verify: a forward under no_grad creates temporaries, not activations
            self.tag = None  # copied into each peak snapshot (verify: micro-batch and optimizer step)
            self.limit: int | None = None  # bytes; passing it raises torch.OutOfMemoryError once
            self.paused = 0  # > 0: storages created now are not followed (the verifier's own bookkeeping)
            self.allocations = 0

        # ---- sizes and registration
        def _size(self, st) -> int:
            n = int(st.nbytes())
            if self.cuda_rounding and n:
                n = math.ceil(n / CUDA_BLOCK) * CUDA_BLOCK
            return n

        def _gone(self, info: _Info, _ref) -> None:
            if self.live.pop(id(info), None) is not None:
                self.total -= info.nbytes

        def register(self, t, cat: str, override: bool = False) -> None:
            if not isinstance(t, torch.Tensor):
                return
            try:
                st = t.untyped_storage()
            except Exception:  # tensors without storage (sparse, nested): not followed
                return
            entry = self._known.get(st)
            if entry is not None:
                info = entry[0]
                n = self._size(st)
                if n != info.nbytes and id(info) in self.live:
                    self.total += n - info.nbytes
                    info.nbytes = n
                if override:
                    info.cat = cat
                return
            info = _Info(self._size(st), cat)
            ref = weakref.ref(st, lambda r, info=info: self._gone(info, r))
            self._known[st] = (info, ref)
            self.live[id(info)] = info
            self.total += info.nbytes
            self.allocations += 1
            self._note_peak()
            if self.limit is not None and self.total > self.limit:
                limit, self.limit = self.limit, None  # raise once
                raise torch.OutOfMemoryError(
                    f"simulated out of memory: {self.total} bytes of tensors alive passed the memory limit of "
                    f"{limit} bytes (--memory-limit)")

        def category_of(self, t) -> str | None:
            entry = self._known.get(t.untyped_storage())
            return entry[0].cat if entry else None

        def _note_peak(self) -> None:
            pp = self.phase_peaks.get(self.phase)
            if pp is None or self.total > pp.total:
                snap = _Snapshot(self.total, tuple(self.live.values()), self.phase, self.tag)
                self.phase_peaks[self.phase] = snap
                if self.peak is None or self.total > self.peak.total:
                    self.peak = snap

        # ---- phases
        def set_phase(self, phase: str) -> None:
            if self.phase in ("forward", "eval") and phase != self.phase:
                # what the forward leaves alive is what backward needs: activations
                for info in self.live.values():
                    if info.cat == "fwd":
                        info.cat = "activations"
            self.phase = phase

        def track_model(self, model) -> None:
            self.track_parameters(model.parameters())
            for b in model.buffers():
                self.register(b, "parameters", override=True)

        def track_parameters(self, params) -> None:
            for p in params:
                if not isinstance(p, torch.Tensor):
                    continue
                self.register(p, "parameters", override=True)
                if p.requires_grad and id(p) not in self._hooked and p.is_leaf:
                    self._hooked.add(id(p))
                    self._hooks.append(p.register_post_accumulate_grad_hook(self._on_grad))
                if p.grad is not None:
                    self.register(p.grad, "gradients", override=True)

        def _on_grad(self, p) -> None:
            if p.grad is not None:
                self.register(p.grad, "gradients", override=True)

        def mark_optimizer_states(self, optimizer) -> None:
            for state in optimizer.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        self.register(v, "optimizer_states", override=True)

        def remove_hooks(self) -> None:
            for h in self._hooks:
                h.remove()
            self._hooks.clear()
            self._hooked.clear()

        def live_by_category(self) -> dict[str, int]:
            """Bytes alive now by category (provisional categories as they stand: "fwd" → activations after the
            forward ended, else temporaries)."""
            out = dict.fromkeys(CATEGORIES, 0)
            for i in list(self.live.values()):
                c = i.cat
                out["activations" if c == "fwd" else _final(c)] += i.nbytes
            return out

        # ---- dispatch
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if self.paused:
                return out
            cat = {"forward": "fwd", "eval": "fwd", "optimizer": "opt"}.get(self.phase, "bwd")
            if cat == "fwd" and self.grad_aware and not torch.is_grad_enabled():
                cat = "bwd"
            if isinstance(out, torch.Tensor):  # the common case, without flattening
                self.register(out, cat)
                return out
            flat = out if isinstance(out, (tuple, list)) else tree_flatten(out)[0]
            for t in flat:
                if isinstance(t, torch.Tensor):
                    self.register(t, cat)
                elif isinstance(t, (tuple, list)):
                    for x in tree_flatten(t)[0]:
                        if isinstance(x, torch.Tensor):
                            self.register(x, cat)
            return out

        # ---- results
        def breakdown(self, snap: _Snapshot | None = None) -> dict[str, int]:
            snap = snap or self.peak
            return snap.by_category() if snap else dict.fromkeys(CATEGORIES, 0)

    return StorageTracker()


__all__ = ["CATEGORIES", "CUDA_BLOCK", "make_tracker"]
