"""The dry run (bertlint/analysis/dryrun.py): what it records for small loops of each shape."""

from __future__ import annotations

import textwrap

import libcst as cst

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
