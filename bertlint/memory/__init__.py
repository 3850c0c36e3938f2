"""``bertlint memory``: simulate one training step under fake tensors and say where the memory goes.

Imports torch and transformers lazily (never on the lint path)."""

from __future__ import annotations

from bertlint.memory.spec import MemoryInputError, MemorySpec


def simulate(spec, device: str = "cuda", **kw):
    from bertlint.memory.simulate import simulate as _simulate

    return _simulate(spec, device, **kw)


def spec_from_setup(*args, **kw):
    from bertlint.memory.script import spec_from_setup as _f

    return _f(*args, **kw)


__all__ = ["MemoryInputError", "MemorySpec", "simulate", "spec_from_setup"]


def explain_estimator(setup, seq_len, world_size, versions=None, device: str = "cuda", *, ctx=None):
    """A memory estimator for ``bertlint.explain.register_memory_estimator``: simulates the set-up's step and
    returns explain's keys (bytes at the simulated peak, by category), or None when the set-up cannot be
    simulated (explain then keeps its first-order estimate). With the file's ``ctx`` the spec is built exactly as
    ``bertlint memory`` builds it (the same set-up model and memory scan of the script)."""
    from bertlint.memory.script import Overrides, spec_for_context
    from bertlint.memory.simulate import simulate as _simulate  # (importing the submodule rebinds the name simulate)

    try:
        ov = Overrides(seq_len=seq_len, world_size=world_size if world_size and world_size > 1 else None)
        spec = spec_for_context(setup, ctx, overrides=ov)
        res = _simulate(spec, device)
    except Exception:  # noqa: BLE001 - explain falls back to its first-order arithmetic
        return None
    out = dict(res.by_category)
    out["total"] = res.peak_bytes
    out["peak_phase"] = res.peak_phase
    out["source"] = f"simulated training step ({device} storage rules)"
    out["assumptions"] = list(res.assumptions)
    return out
