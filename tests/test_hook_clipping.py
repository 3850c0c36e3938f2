"""BL201 through gradient hooks (session 8, s8vis / allennlp's root cause): clipping installed as tensor hooks on the
parameters runs inside the scaled backward of a GradScaler, before any unscale_ can."""
from __future__ import annotations

import textwrap
from pathlib import Path

from bertlint.api import lint_path, lint_text
from bertlint.config import Settings


def bl201(src: str):
    return [(d.start.row, d.severity.name) for d in lint_text(textwrap.dedent(src), "train.py", Settings())
            if d.code == "BL201"]


_LOOP = """
    import torch
    from torch import nn

    def clip_hook(grad):
        return grad.clamp(-{c}, {c})

    model = nn.Linear(8, 2).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cuda")
    for p in model.parameters():
        p.register_hook({hook})
    for x, y in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
"""


def test_clamp_hooks_under_a_grad_scaler_are_reported():
    for hook in ("lambda g: torch.clamp(g, -1.0, 1.0)", "lambda grad: grad.clamp(-1.0, 1.0)", "clip_hook"):
        assert bl201(_LOOP.format(c="1.0", hook=hook)) == [(12, "ERROR")], hook


def test_hooks_that_do_not_clip_or_read_the_scale_are_silent():
    """A hook that unscales first (reads the scaler's scale), a hook that only logs, and clipping hooks without a
    GradScaler (or with one built disabled) are fine."""
    assert bl201(_LOOP.format(c="1.0", hook="lambda g: (g / scaler.get_scale()).clamp(-1, 1) * scaler.get_scale()")) == []
    assert bl201(_LOOP.format(c="1.0", hook="lambda g: print(g.norm())")) == []
    no_scaler = _LOOP.format(c="1.0", hook="clip_hook").replace('scaler = torch.amp.GradScaler("cuda")', "") \
        .replace("scaler.scale(loss).backward()", "loss.backward()").replace("scaler.step(optimizer)",
                                                                           "optimizer.step()") \
        .replace("scaler.update()", "")
    assert bl201(no_scaler) == []
    off = _LOOP.format(c="1.0", hook="clip_hook").replace('GradScaler("cuda")', 'GradScaler("cuda", enabled=False)')
    assert bl201(off) == []


def test_hooks_installed_by_a_project_helper(tmp_path: Path):
    """The hooks are registered by a function of another project module that the trainer calls (under an option):
    reported at the call, as a warning (both the scaler and the clipping are optional)."""
    (tmp_path / ".git").mkdir()
    (tmp_path / "train_util.py").write_text(textwrap.dedent("""
        import torch

        def enable_gradient_clipping(model, grad_clipping):
            if grad_clipping is not None:
                for parameter in model.parameters():
                    if parameter.requires_grad:
                        parameter.register_hook(lambda grad: torch.clamp(grad, -grad_clipping, grad_clipping))
        """))
    (tmp_path / "trainer.py").write_text(textwrap.dedent("""
        import torch
        import train_util

        class Trainer:
            def __init__(self, model, optimizer, use_amp, grad_clipping):
                self.model, self.optimizer, self.grad_clipping = model, optimizer, grad_clipping
                self.scaler = None
                if use_amp:
                    self.scaler = torch.amp.GradScaler("cuda")

            def train(self, loader):
                train_util.enable_gradient_clipping(self.model, self.grad_clipping)
                for x, y in loader:
                    loss = self.model(x, y)
                    self.optimizer.zero_grad()
                    if self.scaler is not None:
                        self.scaler.scale(loss).backward()
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                    else:
                        loss.backward()
                        self.optimizer.step()
        """))
    got = [(d.start.row, d.severity.name, "train_util.py" in d.message) for d in lint_path(str(tmp_path / "trainer.py"))
           if d.code == "BL201"]
    assert got == [(13, "WARNING", True)]


def test_project_helper_that_clips_after_backward_is_not_a_hook():
    """A helper that clips `.grad` directly (called after unscale_) registers no hook: nothing from this path."""
    assert bl201("""
        import torch

        def clip(model, c):
            for p in model.parameters():
                p.grad.clamp_(-c, c)

        scaler = torch.amp.GradScaler("cuda")
        for x in loader:
            scaler.scale(model(x)).backward()
            scaler.unscale_(optimizer)
            clip(model, 1.0)
            scaler.step(optimizer)
            scaler.update()
        """) == []
