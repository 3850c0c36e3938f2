"""Regressions from session 9's blind part s9other (accumulation loops outside NLP: vision, detection, diffusion).

Each case is a small program written for this file, of the shape of code seen in public projects; the assertions
are the exact (code, line) pairs reported, for the wrong shape and for its correct look-alike."""

from __future__ import annotations

import textwrap

import libcst as cst

from bertlint.api import lint_text
from bertlint.config import Settings


def found(src: str, prefix: str = "BL1") -> list[tuple[str, int]]:
    diags = lint_text(textwrap.dedent(src), "train.py", Settings())
    return sorted((d.code, d.start.row) for d in diags if d.code.startswith(prefix))


# ------------------------------------------------------------------ evaluation passes called from the training loop
# A trainer whose loop calls sampling / evaluation methods under configuration flags: their bodies change nothing
# the trace records (images written, metrics printed), so they neither split the run into configurations nor
# spend its budget; the flag that matters (the AMP branch) is still decided per configuration.

_EVAL_METHODS = """
        def sample_images(self, model, steps=4):
            model.eval()
            images = []
            for k in range(steps):
                x = torch.randn(4, 3, 32, 32)
                for t in range(50):
                    x = x - model(x) / (t + 1)
                images.append(x)
            grid = torch.cat(images) / 2 + 0.5
            save_image(grid, "samples.png")
            model.train()

        def fid(self, model):
            feats = []
            for b in range(20):
                f = model(torch.randn(8, 3, 32, 32)).mean(0) / 8
                feats.append(f)
            return float(torch.stack(feats).var())

        def evaluate(self, model):
            score = self.fid(model)
            print("fid", score / 100)
            self.sample_images(model)
"""

EVAL_FLAGS_BAD = """
    import torch
    from torchvision.utils import save_image


    class Trainer:
        def __init__(self, model, data, args):
            self.model = model
            self.data = data
            self.args = args
            self.opt = torch.optim.Adam(model.parameters(), lr=1e-4)
            self.scaler = torch.cuda.amp.GradScaler()
            self.microbatch = args.microbatch

        def run_loop(self):
            step = 0
            while step < self.args.total_steps:
                batch = next(self.data)
                if self.args.sample_a:
                    self.sample_images(self.model)
                if self.args.sample_b:
                    self.sample_images(self.model, steps=2)
                if self.args.eval_a:
                    self.evaluate(self.model)
                if self.args.eval_b:
                    self.evaluate(self.model)
                if self.args.eval_c:
                    self.evaluate(self.model)
                self.opt.zero_grad()
                for i in range(0, batch.shape[0], self.microbatch):
                    micro = batch[i:i + self.microbatch]
                    loss = self.model(micro).mean()
                    if self.args.amp:
                        self.scaler.scale(loss).backward()
                    else:
                        loss.backward()
                if self.args.amp:
                    self.scaler.step(self.opt)
                    self.scaler.update()
                else:
                    self.opt.step()
                step += 1
""" + _EVAL_METHODS

EVAL_FLAGS_GOOD = EVAL_FLAGS_BAD.replace(
    "loss = self.model(micro).mean()", "loss = self.model(micro).mean() / n_micro").replace(
    "self.opt.zero_grad()\n", "self.opt.zero_grad()\n                n_micro = math.ceil(batch.shape[0] / self.microbatch)\n").replace(
    "import torch\n", "import math\n    import torch\n", 1)


def test_micro_batch_loop_behind_inert_evaluation_flags_is_still_run():
    # five flags in front of the micro-batch loop only call evaluation passes: the AMP flag is the one that splits,
    # and every micro-batch's backward is certain in each configuration -> the missing 1/K is seen
    got = found(EVAL_FLAGS_BAD)
    assert [c for c, _ in got] == ["BL103"], got


def test_micro_batch_loop_behind_inert_evaluation_flags_divided_is_silent():
    assert found(EVAL_FLAGS_GOOD) == []


# ------------------------------------------------------------------ what makes a called function inert


def _inert_of(src: str, name: str) -> bool:
    from bertlint.analysis import dryrun
    from bertlint.context import FileContext

    src = textwrap.dedent(src)
    dr = dryrun.of(FileContext("t.py", src, cst.parse_module(src), None))
    fns = dr.f.t.module_funcs.get(name, [])
    assert len(fns) == 1, name
    return dryrun._inert(dr, fns[0], None)


HELPERS = """
    import torch

    def writes_images(model, path):
        imgs = []
        for i in range(3):
            imgs.append(model(torch.randn(1, 3, 8, 8)) / 2)
        torch.save(torch.cat(imgs), path)

    def sets_an_attribute(trainer):
        trainer.best = 1.0

    def appends_to_its_argument(losses, loss):
        losses.append(loss)

    def steps(optimizer):
        optimizer.step()

    def scales_grads(model, f):
        for p in model.parameters():
            p.grad.mul_(f)

    def calls_a_stepping_helper(optimizer):
        steps(optimizer)

    def calls_an_image_writer(model):
        writes_images(model, "x.png")

    def train(model, loader, optimizer):
        for i, batch in enumerate(loader):
            loss = model(batch) / 2
            loss.backward()
            if (i + 1) % 2 == 0:
                optimizer.step()
                optimizer.zero_grad()
"""


def test_inert_functions():
    assert _inert_of(HELPERS, "writes_images") is True
    assert _inert_of(HELPERS, "calls_an_image_writer") is True
    for name in ("sets_an_attribute", "appends_to_its_argument", "steps", "scales_grads", "calls_a_stepping_helper"):
        assert _inert_of(HELPERS, name) is False, name


# ------------------------------------------------------------------ evaluation of a model whose forward takes gradients
# A gradient-step denoiser (D(x) = x - grad_x g(x)), an energy model's score: the forward calls torch.autograd.grad
# itself, so its evaluation loop needs autograd; under no_grad the forward raises. The same loop over a plain
# model is still reported.

GRAD_FORWARD = """
    import torch
    import torch.nn as nn


    class {cls}(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 16))

        def potential(self, x):
            x = x.detach().requires_grad_(True)
            energy = 0.5 * ((self.net(x) - x) ** 2).sum()
            return energy, {grad}

        def forward(self, x):
            _, g = self.potential(x)
            return x - g


    def evaluate(loader):
        model, _ = {cls}.restore("ckpt.pt")
        model.eval()
        total = 0.0
        for x, y in loader:
            out = model(x)
            total += float(((out - y) ** 2).mean())
        return total
"""

GRAD_FORWARD_GOOD = GRAD_FORWARD.format(
    cls="GradientStepDenoiser", grad="torch.autograd.grad(energy, x, create_graph=self.training)[0]")
GRAD_FORWARD_BAD = GRAD_FORWARD.format(cls="Denoiser", grad="x * 0")


def test_eval_of_a_model_whose_forward_takes_gradients_is_silent():
    assert found(GRAD_FORWARD_GOOD, "BL502") == []


def test_eval_of_a_plain_model_is_still_reported():
    assert found(GRAD_FORWARD_BAD, "BL502") == [("BL502", 26)]


# ------------------------------------------------------------------ a gate on the micro-batches since the last step
# ``if ni - last_opt_step >= accumulate: ... last_opt_step = ni`` with ``ni = i + nb * epoch`` counted across epochs
# (a nominal-batch detector trainer): the windows run over epoch boundaries, so a ``zero_grad`` that starts every
# epoch erases the micro-batches backpropagated since the epoch's last step. The factor may ramp up during a warm-up
# (``if ni <= nw: accumulate = ...``) and the first epoch may come from a checkpoint (``range(start_epoch, ...)``).

SINCE_GATE = """
    import os
    import numpy as np
    import torch
    from torch.utils.data import DataLoader

    WORLD_SIZE = int(os.getenv("WORLD_SIZE", 1))


    def train(model, dataset, batch_size, epochs, resume=None):
        loader = DataLoader(dataset, batch_size=batch_size, shuffle=True)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        nb = len(loader)
        nbs = 64
        accumulate = max(round(nbs / batch_size), 1)
        nw = max(3 * nb, 100)
        start_epoch = 0
        if resume:
            start_epoch = torch.load(resume)["epoch"] + 1
        last_opt_step = -1
        for epoch in range(start_epoch, epochs):
            model.train()
            {epoch_zero}
            for i, (imgs, targets) in enumerate(loader):
                ni = i + nb * epoch
                if ni <= nw:
                    accumulate = max(1, np.interp(ni, [0, nw], [1, nbs / batch_size]).round())
                loss = model(imgs, targets)
                {world}
                loss.backward()
                if ni - last_opt_step >= accumulate:
                    optimizer.step()
                    optimizer.zero_grad()
                    last_opt_step = ni
"""


def test_since_last_step_gate_with_an_epoch_start_zero_grad_drops_the_tail():
    src = SINCE_GATE.format(epoch_zero="optimizer.zero_grad()", world="pass")
    assert found(src) == [("BL103", 30), ("BL107", 31)]


def test_since_last_step_gate_carried_across_epochs_is_silent_on_the_tail():
    # no zero_grad at the epoch's start: the window goes on over the boundary with its N micro-batches
    src = SINCE_GATE.format(epoch_zero="pass", world="pass")
    assert found(src) == [("BL103", 30)]


def test_loss_multiplied_by_the_world_size_trains_on_sums():
    # ``loss *= WORLD_SIZE`` undoes DDP's averaging: the script trains on gradient sums (a per-image sum loss, the
    # learning rate tuned for the nominal batch), so no 1/N is missing; the dropped tail is still reported
    src = SINCE_GATE.format(epoch_zero="optimizer.zero_grad()", world="loss *= WORLD_SIZE")
    assert found(src) == [("BL107", 31)]


def test_loss_divided_by_the_window_count_written_out_is_silent():
    # the number of micro-batches of the window loop written out in the division itself
    # (``/ math.ceil(batch.shape[0] / self.microbatch)``): that is N, the window's weights sum to 1
    src = EVAL_FLAGS_BAD.replace(
        "loss = self.model(micro).mean()",
        "loss = self.model(micro).mean() / math.ceil(batch.shape[0] / self.microbatch)").replace(
        "import torch\n", "import math\n    import torch\n", 1)
    assert found(src) == []


def test_world_size_product_not_handed_to_backward_keeps_bl103():
    # the world size multiplies a count, not the loss the backward receives: the missing 1/N is still reported
    src = SINCE_GATE.format(epoch_zero="pass", world="seen = imgs.shape[0] * WORLD_SIZE")
    assert found(src) == [("BL103", 30)]


# ------------------------------------------------------------------ a criterion module built to sum
# ``loss_fn = nn.BCELoss(reduction="sum")`` and a batch split into N sub-batches, one backward each: the sub-batch
# sums add up to the whole batch's sum, the gradient of the unsplit batch, so no 1/N is missing. The same loop with a
# mean criterion is N times the batch mean.

SUB_BATCHES = """
    import torch


    def train(net, loader, accu_steps, sub_batch, epochs):
        loss_fn = torch.nn.BCELoss({red}).cuda()
        optim = torch.optim.Adam(net.parameters(), lr=1e-4)
        for epoch in range(epochs):
            for step, (x, y) in enumerate(loader):
                optim.zero_grad()
                for k in range(accu_steps):
                    sx = x[k * sub_batch:(k + 1) * sub_batch]
                    sy = y[k * sub_batch:(k + 1) * sub_batch]
                    loss = loss_fn(net(sx), sy)
                    loss.backward()
                optim.step()
"""


def test_sub_batches_with_a_mean_criterion_miss_the_division():
    assert found(SUB_BATCHES.format(red="")) == [("BL103", 15)]


def test_sub_batches_with_a_summing_criterion_are_silent():
    assert found(SUB_BATCHES.format(red='reduction="sum"')) == []
    assert found(SUB_BATCHES.format(red="size_average=False")) == []
