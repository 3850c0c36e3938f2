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
