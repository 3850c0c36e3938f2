"""The dry run (bertlint/analysis/dryrun.py): what it records for small loops of each shape."""

from __future__ import annotations

import textwrap

import libcst as cst

from bertlint import trace as T
from bertlint.analysis import dryrun
from bertlint.context import FileContext


def runs(src: str):
    src = textwrap.dedent(src)
    ctx = FileContext("t.py", src, cst.parse_module(src), None)
    return list(dryrun.of(ctx))


def test_windows_scale_and_epochs():
    (run,) = runs("""
    import torch
    N = 4
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        for i, b in enumerate(loader):
            (model(b) / N).backward()
            if (i + 1) % N == 0 or i == len(loader) - 1:
                opt.step()
                opt.zero_grad()
    """)
    tr = run.main
    assert tr.n == 4 and tr.epoch_len == 10 and tr.epochs == 2
    sizes = [len(w.backwards) for w in tr.windows("opt")]
    assert sizes == [4, 4, 2, 4, 4, 2]  # the tail is stepped at the epoch's last micro-batch
    assert all(b.scale.text(4) == "1/N = 1/4" for b in tr.of("backward"))


def test_invariant_condition_splits_configurations_and_n_one_arm():
    (run,) = runs("""
    import torch
    def train(args, model, loader):
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, b in enumerate(loader):
            loss = model(b)
            if args.clip:
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if args.accum > 1:
                (loss / args.accum).backward()
                if (i + 1) % args.accum == 0:
                    opt.step()
                    opt.zero_grad()
            else:
                loss.backward()
                opt.step()
                opt.zero_grad()
    """)
    configs = {(t.n, tuple(sorted(t.config.items()))) for t in run.traces}
    assert (4, (("args.clip", True),)) in configs and (1, (("args.clip", False),)) in configs
    n1 = next(t for t in run.traces if t.n == 1)
    assert all(len(w.backwards) == 1 for w in n1.windows("opt"))  # the N = 1 arm steps every micro-batch: right
    assert run.violations("BL101") == []


def test_guard_ends_the_loop_and_unknown_accelerator_stays_unknown():
    (run,) = runs("""
    def train(accelerator, model, optimizer, loader, eval_only):
        for step, b in enumerate(loader):
            if step == 0 and eval_only:
                break
            accelerator.backward(model(b) / 4)
            if (step + 1) % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
    """)
    tr = run.main  # `step == 0 and eval_only` changes with step: undecided, its break is not taken
    bws = tr.of("backward")
    assert len(bws) == tr.micro_batches and all(b.certain for b in bws)  # the guard gates nothing
    assert not bws[0].scale.known  # the Accelerator's N is not known: 1/4 × unknown, never 1/16
    assert run.violations("BL104") == []


def test_accumulate_makes_the_prepared_optimizer_a_no_op_off_the_sync_step():
    (run,) = runs("""
    from accelerate import Accelerator
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for b in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(b))
            optimizer.step()
            optimizer.zero_grad()
    """)
    tr = run.main
    steps = tr.of("step")
    assert [s.effective for s in steps[:4]] == [False, False, False, True]
    assert [len(w.backwards) for w in tr.windows()][:2] == [4, 4]
    assert tr.of("backward")[0].scale.text(4) == "1/N = 1/4"  # accelerator.backward divides


def test_ddp_sync_decided_at_forward():
    (run,) = runs("""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, b in enumerate(loader):
        with model.no_sync():
            loss = model(b) / 4
        loss.backward()
        if (i + 1) % 4 == 0:
            opt.step()
            opt.zero_grad()
    """)
    bws = run.main.of("backward")
    assert all(b.fwd_no_sync is True and not b.in_no_sync for b in bws)
    (v, _), = run.violations("BL114")
    assert v.data["kind"] == "unsynced"


# ------------------------------------------------------------------ DDP sync state and model identity (issue 11)


def _lint(src: str, world_size=None):
    from bertlint.config import Settings
    from bertlint.engine import lint_python

    return [d for d in lint_python(textwrap.dedent(src), "t.py", Settings(world_size=world_size)) if d.code == "BL114"]


def test_sync_gate_chosen_in_a_variable_is_evaluated_per_micro_batch():
    # FunASR #3472 class: the no_sync context picked with the gate inverted against the step gate
    src = """
    from contextlib import nullcontext
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    def train(model, loader, use_ddp, N):
        model = DDP(model) if use_ddp else model
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, b in enumerate(loader):
            ctx = nullcontext
            if use_ddp:
                ctx = model.no_sync if i % N != 0 else ctx
            with ctx():
                (model(b) / N).backward()
            if (i + 1) % N == 0:
                opt.step()
                opt.zero_grad()
    """
    (run,) = runs(src)
    tr = next(t for t in run.traces if t.config.get("use_ddp") is True)
    off = [b.fwd_no_sync for b in tr.of("backward")][:4]
    assert off == [False, True, True, True]  # micro-batch 1 syncs, the last one (before the step) does not
    (d,) = _lint(src)
    assert d.severity.name == "ERROR" and "`use_ddp` is set" in d.message
    fixed = _lint(src.replace("i % N != 0", "(i + 1) % N != 0"))
    assert fixed == []


def test_invariant_operand_of_a_sync_condition_selects_a_configuration():
    # open_lm class: `isinstance(model, FSDP) and ii != N` — the type test is the configuration, ii the micro-batch
    src = """
    from contextlib import nullcontext
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def train(args, model, optimizer, loader):
        for step, batch in enumerate(loader):
            optimizer.zero_grad()
            for ii in range(args.accum):
                maybe = nullcontext
                if isinstance(model, FSDP) and ii != args.accum:
                    maybe = model.no_sync
                with maybe():
                    (model(batch).mean() / args.accum).backward()
            optimizer.step()
    """
    (run,) = runs(src)
    on = next(t for t in run.traces if t.config.get("isinstance(model, FSDP)") is True)
    assert all(b.fwd_no_sync is True for b in on.of("backward"))  # ii != N holds for every ii in range(N)
    (d,) = _lint(src)
    assert d.severity.name == "ERROR"
    assert _lint(src.replace("ii != args.accum:", "ii != args.accum - 1:")) == []
    # the same right gate in a file that imports DDP: a DDP model never takes it -> a warning naming the condition
    ddp_src = src.replace("from contextlib", "from torch.nn.parallel import DistributedDataParallel\n    from contextlib")
    (w,) = _lint(ddp_src.replace("ii != args.accum:", "ii != args.accum - 1:"))
    assert w.severity.name == "WARNING" and "turns sync off only when `isinstance(model, FSDP)`" in w.message


def test_conditional_wrapping_names_its_condition_and_unknown_process_count_stays_silent():
    ddp = """
    import torch
    from torch.nn.parallel import DistributedDataParallel
    def train(args, model, loader):
        if args.distributed:
            if args.nccl:
                model = DistributedDataParallel(model, device_ids=[args.rank])
            else:
                model = DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i, b in enumerate(loader):
            (model(b) / 4).backward()
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
    """
    (d,) = _lint(ddp)
    assert d.severity.name == "WARNING" and "(when `args.distributed`)" in d.message
    acc = """
    from accelerate import Accelerator
    import torch
    def main(model, loader):
        accelerator = Accelerator()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for i, b in enumerate(loader):
            accelerator.backward(model(b) / 4)
            if (i + 1) % 4 == 0:
                opt.step()
                opt.zero_grad()
    """
    assert _lint(acc) == []  # how many processes `accelerate launch` starts is not in the file
    (w,) = _lint(acc, world_size=2)
    assert w.severity.name == "WARNING" and "accelerator.no_sync(model)" in w.message
    every = acc.replace("accelerator.backward(model(b) / 4)", "with accelerator.no_sync(model):\n"
                        "                accelerator.backward(model(b) / 4)")
    (e,) = _lint(every, world_size=2)  # no_sync on every micro-batch, the last one included
    assert e.severity.name == "ERROR"
    right = every.replace("with accelerator.no_sync(model):",
                          "with accelerator.no_sync(model) if (i + 1) % 4 != 0 else nullcontext():")
    assert _lint("from contextlib import nullcontext\n" + textwrap.dedent(right), world_size=2) == []


def test_step_gate_on_a_counter_advanced_by_the_gate_stops_firing():
    # Fabric's build-your-own-trainer class: `global_step % N == 0` where global_step += int(stepped); the closure
    # handed to optimizer.step(partial(...)) runs the training step (its backward) before the update
    src = """
    from functools import partial
    import torch
    class Trainer:
        def __init__(self, model, n):
            self.model, self.n, self.global_step = model, n, 0
            self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def load(self, state):
            self.global_step = state["global_step"]
        def training_step(self, batch):
            loss = self.model(batch).mean()
            loss.backward()
            return loss
        def fit(self, loader):
            for epoch in range(3):
                for batch_idx, batch in enumerate(loader):
                    should_step = self.global_step % self.n == 0
                    if should_step:
                        self.opt.step(partial(self.training_step, batch=batch))
                        self.opt.zero_grad()
                    else:
                        self.training_step(batch)
                    self.global_step += int(should_step)
    """
    (run,) = runs(src)
    fresh = next(t for t in run.traces if any(k.startswith("!when `self.global_step` starts at 0") and v
                                              for k, v in t.config.items()))
    assert len(fresh.effective_steps()) == 1 and len(fresh.of("backward")) == fresh.micro_batches
    assert fresh.of("backward")[0].mb == fresh.of("step")[0].mb == 0  # the closure's backward, then the step
    (v, tr), = run.violations("BL108")
    assert v.data["kind"] == "stops" and "starts at 0, not resumed" in tr.config_text()
    resumed = [t for t in run.traces if t is not fresh and t.n == fresh.n]
    assert resumed and all(_check(t, "BL108") == [] for t in resumed)  # a resumed start stays unknown
    good = src.replace("self.global_step % self.n == 0", "(batch_idx + 1) % self.n == 0")
    assert all(r.violations("BL108") == [] for r in runs(good))


def _check(tr, code):
    from bertlint import trace as T

    return T.check(tr, code)


def test_micro_batch_loop_in_a_helper_of_the_step_loop():
    """run_step() -> forward_backward(): the chunk loop in the helper is the window, N = ceil(B / m)."""
    rs = runs("""
    import torch
    class T:
        def __init__(self, model, microbatch):
            self.model = model
            self.microbatch = microbatch
            self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
        def run(self, data, steps):
            for _ in range(steps):
                batch = next(data)
                self.forward_backward(batch)
                self.opt.step()
        def forward_backward(self, batch):
            self.opt.zero_grad()
            for i in range(0, batch.shape[0], self.microbatch):
                self.model(batch[i : i + self.microbatch]).mean().backward()
    """)
    run = next(r for r in rs if r.main is not None and r.main.of("step"))
    tr = run.main
    assert tr.n == 4 and tr.n_text == "math.ceil(batch.shape[0] / self.microbatch)"
    assert {len(w.backwards) for w in tr.windows("self.opt")} == {4}
    assert len(run.violations("BL103")) == 1


def test_ignite_process_function_runs_once_per_iteration():
    """Engine(update): engine.state.iteration counts from 1, so `% N == 0` steps after micro-batches N, 2N, ..."""
    (run,) = [r for r in runs("""
    import torch
    from ignite.engine import Engine
    def main(model, loader):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def update(engine, batch):
            (model(batch) / 4).backward()
            if engine.state.iteration % 4 == 0:
                optimizer.step()
                optimizer.zero_grad()
        Engine(update).run(loader)
    """) if getattr(r.loop, "kind", None) == "ignite"]
    tr = run.main
    assert [s.mb + 1 for s in tr.effective_steps()][:2] == [4, 8]
    assert run.violations("BL103") == [] and run.violations("BL101") == []


def test_undecided_if_keeps_a_value_both_arms_leave_alike():
    """`if last: out = f() else: with no_sync(): out = f()`: the loss keeps its scale after the if."""
    (run,) = runs("""
    import torch
    N = 4
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, b in enumerate(loader):
        if b.last:
            out = model(b)
        else:
            with model.no_sync():
                out = model(b)
        (out / N).backward()
        if (i + 1) % N == 0:
            opt.step()
            opt.zero_grad()
    """)
    assert all(b.scale is not None and b.scale.n_power == -1 for b in run.main.of("backward"))


def test_sum_over_an_inner_loop_marks_the_backward_after_it():
    # the window shape: the inner loop's body runs once in the dry run, so the sum made in it carries the loop
    src = """
    import torch
    opt = torch.optim.AdamW(model.parameters())
    for window in windows:
        total = 0
        for batch in window:
            total = total + model(**batch).loss
        (total / len(window)).backward()
        opt.step()
        opt.zero_grad()
    """
    (run,) = runs(src)
    (bw,) = {b.line: b for b in run.main.of("backward")}.values()
    assert bw.graph_loop == "for batch in window"
    assert [v.data.get("loop") for v in T.check(run.main, "BL113")] == ["for batch in window"]
    # the backward inside the inner loop frees each iteration's graph: nothing marked
    (run,) = runs("""
    import torch
    opt = torch.optim.AdamW(model.parameters())
    for window in windows:
        for batch in window:
            loss = model(**batch).loss
            (loss / len(window)).backward()
        opt.step()
        opt.zero_grad()
    """)
    assert all(not b.graph_loop for b in run.main.of("backward")) and not T.check(run.main, "BL113")
    # a float running total (``.item()``) carries no graph
    (run,) = runs(src.replace("model(**batch).loss\n", "model(**batch).loss.item()\n"))
    assert all(not b.graph_loop for b in run.main.of("backward"))


def test_accumulation_factor_by_usage_from_the_probe_run():
    # N is what gates the optimizer step, whatever it is called and however large (the probe run is shorter than
    # the window: a period of known value is left undecided there)
    (run,) = runs("""
    import torch
    every = 8
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, b in enumerate(loader):
        (model(b) / every).backward()
        if (i + 1) % every == 0:
            opt.step()
            opt.zero_grad()
    """)
    assert (run.factor.text, run.factor.value, run.factor.source) == ("every", 8, "gate")
    assert run.main.n == 8 and {len(w.backwards) for w in run.main.windows("opt")} >= {8}
    # a GAN's generator: its own backward and step every n_critic micro-batches is not accumulation
    (run,) = runs("""
    import torch
    n_critic = 5
    opt_d = torch.optim.Adam(disc.parameters())
    opt_g = torch.optim.Adam(gen.parameters())
    for i, b in enumerate(loader):
        opt_d.zero_grad()
        disc_loss(b).backward()
        opt_d.step()
        if i % n_critic == 0:
            opt_g.zero_grad()
            gen_loss(b).backward()
            opt_g.step()
    """)
    assert run.factor is None and run.main.n is None


def test_optimizer_named_receiver_of_unknown_role_is_kept_at_low_confidence():
    # names are a hint, never a veto: `self_optim_state` has no role by usage (never stepped, built elsewhere) nor by
    # its name (roles.name_hint: a ``_state`` is about a thing): its zero_grad() may clear the model's gradients, and
    # is recorded as such at low confidence (what rests on it is lowered), not dropped
    src = """
    import torch
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, (x, y) in enumerate(loader):
        loss = model(x, y)
        loss.backward()
        self_optim_state.zero_grad()
        opt.step()
        opt.zero_grad()
    """
    (run,) = runs(src)
    zs = [z for z in run.main.of("zero_grad") if "self_optim_state" in (z.opt, z.target)]
    assert zs and all(z.of == "model" and z.meta.get("confident") is False for z in zs)
    # the model's own clear, known by usage, is confident
    assert all(z.meta.get("confident") is True for z in run.main.of("zero_grad") if z.target == "model")
