"""The training-loop discovery (bertlint/analysis/loops.py: loops, index, calls, owners) and what the dry run makes of
them (bertlint/analysis/dryrun.py: N, the windows each call runs in); and code neither understands gives no finding
and no exception."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from bertlint.analysis import loops as L
from bertlint.analysis.symbols import Resolver, build
from bertlint.engine import lint_python

LOOP_CODES = {f"BL1{n:02d}" for n in range(1, 16)} | {"BL201", "BL202"}


def model(src: str) -> L.FileLoops:
    m = cst.parse_module(textwrap.dedent(src))
    t = build(m)
    return L.FileLoops(m, t, Resolver(t))


def dry(src: str) -> list:
    """The dry run's loops (LoopRun: .loop, .factor, .traces)."""
    from bertlint.analysis import dryrun
    from bertlint.context import FileContext

    src = textwrap.dedent(src)
    return list(dryrun.of(FileContext("t.py", src, cst.parse_module(src), None)))


def sizes(tr) -> list:
    return [len(w.backwards) for w in tr.windows()]


def codes(src: str) -> list[tuple[str, int]]:
    return sorted((d.code, d.start.row) for d in lint_python(textwrap.dedent(src), "t.py") if d.code in LOOP_CODES)


PLAIN = """
import argparse
import torch
p = argparse.ArgumentParser()
p.add_argument("--gradient_accumulation_steps", type=int, default=8)
args = p.parse_args()
def train(model, dl):
    optimizer = torch.optim.AdamW(model.parameters())
    for epoch in range(3):
        for step, batch in enumerate(dl, 1):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if step % args.gradient_accumulation_steps == 0 or step == len(dl):
                optimizer.step()
                optimizer.zero_grad()
"""


def test_inner_loop_is_the_training_loop_with_index_and_n():
    f = model(PLAIN)
    assert len(f) == 1
    loop = f.loops[0]
    assert isinstance(loop.node, cst.For) and loop.outer  # the epoch loop is recorded as outer
    assert loop.index.name == "step" and loop.index.start == 1
    assert loop.owner == "plain"
    kinds = [e.kind for e in loop.events]
    assert kinds == ["backward", "opt_step"]  # (the clears, clips and scaler calls are the dry run's)
    (run,) = dry(PLAIN)
    acc = run.factor
    assert acc.value == 8 and acc.text == "args.gradient_accumulation_steps" and acc.source == "gate"
    # the step once per window of 8, and on the epoch's last micro-batch (``or step == len(dl)``): a tail of 2
    assert run.main.epoch_len == 18 and sizes(run.main) == [8, 8, 2, 8, 8, 2]
    assert codes(PLAIN) == []


def test_backward_through_same_file_function_and_method():
    src = """
    import torch
    ACCUM_STEPS = 4
    class T:
        def __init__(self, model):
            self.model = model
            self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def _inner(self, batch):
            loss = self.model(batch).loss / ACCUM_STEPS
            loss.backward()
        def fit(self, dl):
            for i, b in enumerate(dl):
                self._inner(b)
                self.optimizer.step()
    """
    f = model(src)
    assert len(f) == 1
    loop = f.loops[0]
    bw = loop.backwards[0]
    assert bw.via == ("_inner",)
    (run,) = dry(src)
    assert (run.factor.text, run.factor.source) == ("ACCUM_STEPS", "division")
    assert run.main.of("backward")[0].scale.text(4) == "1/N = 1/4" and set(sizes(run.main)) == {1}
    assert codes(src) == [("BL101", 14)]


def test_hand_counter_before_and_after_the_test():
    before = """
    import torch
    N = 4
    opt = torch.optim.SGD([], lr=1)
    step = 0
    for batch in dl:
        (model(batch) / N).backward()
        step += 1
        if step % N == 0:
            opt.step(); opt.zero_grad()
    """
    after = before.replace("        step += 1\n", "").replace("            opt.step(); opt.zero_grad()\n",
                                                              "            opt.step(); opt.zero_grad()\n        step += 1\n")
    # where the counter is advanced decides the first window: the dry run's BL107, not a pattern
    assert codes(before) == []
    assert [c for c, _ in codes(after)] == ["BL107"]


def test_flag_gate_continue_gate_and_else_branch():
    src = """
    import torch
    GA = 4
    optimizer = torch.optim.AdamW([])
    for i, b in enumerate(dl):
        (model(b).loss / GA).backward()
        do_step = (i + 1) % GA == 0
        if not do_step:
            continue
        optimizer.step()
        optimizer.zero_grad()
    """
    (run,) = dry(src)  # the flag and the ``continue`` guard: the step runs once per window of GA
    assert (run.factor.text, run.factor.value) == ("GA", 4) and sizes(run.main) == [4, 4, 6, 4]
    assert codes(src) == []
    inverted = """
    import torch
    GA = 4
    optimizer = torch.optim.AdamW([])
    for i, b in enumerate(dl):
        (model(b).loss / GA).backward()
        if (i + 1) % GA == 0:
            pass
        else:
            optimizer.step()
    """
    assert [c for c, _ in codes(inverted)] == ["BL108"]


def test_receivers_from_prepare_and_deepspeed_initialize():
    src = """
    import deepspeed, torch
    from accelerate import Accelerator
    from transformers import get_scheduler
    acc = Accelerator(gradient_accumulation_steps=4)
    opt = torch.optim.AdamW([])
    sch = get_scheduler("linear", opt, 0, 100)
    m, o, d, s = acc.prepare(model, opt, dl, sch)
    engine, dsopt, _, dssched = deepspeed.initialize(model=model, config={})
    """
    f = model(src)
    kind = {n: f.receiver_kind(n) for n in ("acc", "o", "s", "engine", "dsopt", "m")}
    assert kind["acc"] == ("accelerator", True) and kind["o"] == ("optimizer", True)
    assert kind["s"] == ("scheduler", True)
    assert {"m", "o", "d", "s"} <= f.prepared
    assert kind["engine"] == ("engine", True) and kind["dsopt"] == ("ds_optimizer", True)
    assert kind["m"] == (None, False)  # a model: none of the training machinery's kinds
    assert f.accelerator_ga.value == 4


def test_accelerate_accumulate_owner_and_sync_gate():
    src = """
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator(gradient_accumulation_steps=2)
    model, optimizer, dl = accelerator.prepare(model, torch.optim.AdamW([]), dl)
    for batch in dl:
        with accelerator.accumulate(model):
            accelerator.backward(model(**batch).loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
    """
    loop = model(src).loops[0]
    assert loop.owner == "accelerate"
    (run,) = dry(src)  # N is the Accelerator's; the clip runs on the sync micro-batches only, with the step
    assert (run.factor.value, run.factor.source) == (2, "accelerator") and run.main.owner == "accelerate"
    assert [e.mb for e in run.main.of("clip")] == [e.mb for e in run.main.effective_steps()] == [1, 3, 5, 7, 9, 11]
    assert codes(src) == []


def test_name_fallback_is_low_confidence():
    src = """
    def train(model, dl, opt, accum_steps=4):
        for i, b in enumerate(dl):
            (model(b) / accum_steps).backward()
            opt.step()
    """
    loop = model(src).loops[0]
    assert loop.steps and not loop.steps[0].confident
    diags = [d for d in lint_python(textwrap.dedent(src), "t.py") if d.code == "BL101"]
    assert len(diags) == 1 and diags[0].severity.value == "W"


WEIRD = [
    # dynamic dispatch
    """
    import torch
    for i, b in enumerate(dl):
        getattr(model(b), "back" + "ward")()
        getattr(optimizer, "step")()
    """,
    # exec
    """
    import torch
    for i, b in enumerate(dl):
        loss = model(b) / 4
        exec("loss.backward()")
        optimizer.step()
    """,
    # backward through an unknown callback, step via a lambda table
    """
    import torch
    ops = {"s": lambda: optimizer.step()}
    for b in dl:
        loss = model(b) / 4
        callbacks.on_batch(loss)
        ops["s"]()
    """,
    # recursion, nested defs, match, walrus, while True with break, try/finally
    """
    import torch
    def f(x):
        return f(x)
    while True:
        try:
            match x:
                case 1:
                    (y := model(x)).backward()
                case _:
                    break
        finally:
            def g():
                optimizer.step()
    """,
    # deeply nested and odd
    """
    import torch
    for a in range(2):
        for b in range(2):
            for c in range(2):
                with ctx() as (p, q):
                    if (lambda: 1)():
                        [x.backward() for x in losses]
                        optimizer.step() if c else None
    """,
    # loops with backward but no optimizer at all, gates on arbitrary calls
    """
    import torch
    for i, b in enumerate(dl):
        (model(b) / accumulation_steps).backward()
        if should_step(i):
            optimizer.step()
            optimizer.zero_grad()
    """,
    # self-referential assignments and unresolvable N
    """
    import torch
    N = N + 1
    k = k
    for i, b in enumerate(dl, start=k):
        loss = model(b).loss
        loss.backward()
        if i % N == 0:
            optimizer.step()
    """,
    "import torch\nfor x in y: pass\n",
    "import torch\nx = " + "(" * 50 + "1" + ")" * 50 + "\n",
]


@pytest.mark.parametrize("src", WEIRD)
def test_weird_code_gives_no_finding_and_no_exception(src):
    f = model(src)  # must not raise
    for loop in f:
        loop.owner, loop.steps, loop.backwards
    dry(src)  # nor the dry run
    assert codes(src) == []


def test_units_of_schedule_lengths():
    src = """
    import math
    ga = 4
    a = len(dl) * 3
    b = math.ceil(len(dl) / ga) * 3
    c = args.max_steps
    """
    f = model(src)
    mod = cst.parse_module(textwrap.dedent(src))
    assert f.units_of(cst.parse_expression("a"), None) == "micro-batches"
    assert f.units_of(cst.parse_expression("b"), None, "ga") == "optimizer-steps"
    assert f.units_of(cst.parse_expression("c"), None) == "unknown"
    assert mod is not None


@pytest.mark.parametrize(
    "setup, expr, value",
    [
        ('import argparse\np = argparse.ArgumentParser()\np.add_argument("--grad_accum", type=int, default=8)\n'
         "args = p.parse_args()\n", "args.grad_accum", 8),
        ("from dataclasses import dataclass, field\n@dataclass\nclass Cfg:\n    gradient_accumulation_steps: int = 4\n"
         "cfg = Cfg()\n", "cfg.gradient_accumulation_steps", 4),
        ('cfg = {"train": {"accum": 16}}\n', 'cfg["train"]["accum"]', 16),
        ("from transformers import TrainingArguments\nta = TrainingArguments('o', gradient_accumulation_steps=2)\n",
         "ta.gradient_accumulation_steps", 2),
        ("N = 3\nM = N * 2\n", "M", 6),
        # a command-line default of 1 is what the user passes at launch: unknown, keep the symbol
        ('import argparse\np = argparse.ArgumentParser()\np.add_argument("--gradient_accumulation_steps", '
         "type=int, default=1)\nargs = p.parse_args()\n", "args.gradient_accumulation_steps", None),
    ],
)
def test_accumulation_factor_sources(setup, expr, value):
    f = model(setup)
    acc = f.factor(cst.parse_expression(expr), "test", None)
    assert acc.value == value
    assert acc.text == expr


def test_accelerator_factor_from_plugins():
    f = model(
        """
        from accelerate import Accelerator
        from accelerate.utils import GradientAccumulationPlugin
        plugin = GradientAccumulationPlugin(num_steps=6, sync_with_dataloader=False)
        accelerator = Accelerator(gradient_accumulation_plugin=plugin)
        """
    )
    assert f.accelerator_ga.value == 6 and f.accelerator_ga.source == "plugin"
    g = model(
        """
        from accelerate import Accelerator
        from accelerate.utils import DeepSpeedPlugin
        accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(zero_stage=2, gradient_accumulation_steps=4))
        """
    )
    assert g.accelerator_ga.value == 4 and g.accelerator_deepspeed is not None
    h = model("from accelerate import Accelerator\naccelerator = Accelerator(**kwargs)\n")
    assert h.accelerator_ga is None and h.accelerator_ga_unknown


@pytest.mark.parametrize(
    "name, code, unsafe",
    [
        ("amp_clip_bad.py", "BL201", False),
        ("ga_step_every_batch_bad.py", "BL101", True),
        ("zero_grad_each_batch_bad.py", "BL102", True),
        ("scheduler_per_microbatch_bad.py", "BL105", True),
        ("accelerate_double_division_bad.py", "BL104", True),
        ("scaler_update_each_batch_bad.py", "BL202", True),
    ],
)
def test_fixes_remove_the_finding_and_keep_valid_code(name, code, unsafe):
    import ast
    import os

    from bertlint.api import apply_fixes, lint_text

    path = os.path.join(os.path.dirname(os.path.dirname(__file__)), "fixtures", "loops", name)
    src = open(path, encoding="utf-8").read()
    diags = [d for d in lint_text(src, path) if d.code == code]
    assert diags and diags[0].fix is not None
    assert diags[0].fix.applicability.value == ("unsafe" if unsafe else "safe")
    res = apply_fixes(src, diags, unsafe=unsafe)
    assert res.applied and not res.failed
    ast.parse(res.text)
    after = {d.code for d in lint_text(res.text, path) if d.code in LOOP_CODES}
    assert code not in after and not after


def test_window_loop_style():
    src = """
    import torch
    GA = 8
    optimizer = torch.optim.AdamW(model.parameters())
    while True:
        for micro in range(GA):
            loss = model(next(it)).loss / GA
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    """
    f = model(src)
    assert len(f) == 1
    w = f.loops[0]
    assert isinstance(w.node, cst.While) and w.window_of is not None
    (run,) = dry(src)  # N is the window loop's length; the step and zero_grad run once per window
    assert (run.factor.value, run.factor.source) == (8, "window") and set(sizes(run.main)) == {8}
    assert [e.mb for e in run.main.of("zero_grad")] == [e.mb for e in run.main.effective_steps()]
    assert codes(src) == []


def test_truthy_modulo_gates():
    src = """
    import torch
    accum_steps = 4
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for i, b in enumerate(dl):
        (model(b).loss / accum_steps).backward()
        if not (i + 1) % accum_steps:
            opt.step()
            opt.zero_grad()
    """
    (run,) = dry(src)  # ``not (i + 1) % N``: the step after micro-batches 4, 8 and the epoch's last
    assert (run.factor.text, run.factor.value) == ("accum_steps", 4)
    assert [e.mb + 1 for e in run.main.effective_steps()] == [4, 8, 14, 18]
    assert codes(src) == []
    assert [c for c, _ in codes(src.replace("(i + 1) % accum_steps", "i % accum_steps"))] == ["BL107"]


def test_units_divided_and_multiplied_back_is_unknown():
    f = model("t_total = len(dl) // args.gradient_accumulation_steps * 3\nmicro = t_total * args.gradient_accumulation_steps\n")
    assert f.units_of(cst.parse_expression("t_total"), None) == "optimizer-steps"
    assert f.units_of(cst.parse_expression("micro"), None) == "unknown"
    assert f.units_of(cst.parse_expression("args.max_steps * args.gradient_accumulation_steps"), None) == "micro-batches"


# ------------------------------------------------------------------------------------------------ the epoch's tail

_EPOCH_FN = """
import torch

N = 4


def train_one_epoch(model, loader, optimizer, steps_per_epoch):
    optimizer.zero_grad()
    for i, (x, y) in enumerate(loader):
        {guard}
        (model(x).sum() / N).backward()
        if (i + 1) % N == 0:
            optimizer.step()
            optimizer.zero_grad()
    {after}
"""


def test_epoch_tail_of_a_function_handed_its_optimizer():
    src = _EPOCH_FN.format(guard="pass", after="pass")
    assert codes(src) == [("BL107", 12)]  # the gate
    d = next(d for d in lint_python(textwrap.dedent(src), "t.py") if d.code == "BL107")
    assert "when `len(loader)` is not a multiple of `N` (= 4)" in d.message
    assert "or i + 1 == len(loader)" in d.message and d.data["tail"]["kind"] == "dropped"


def test_epoch_tail_silent_with_flush_guard_or_own_optimizer():
    # a flush after the loop (the function is one epoch: its last statements run at each epoch's end)
    assert codes(_EPOCH_FN.format(guard="pass", after="optimizer.step()")) == []
    # a guard that may cut the epoch on a multiple of N (ConvNeXt's `if i // N >= steps_per_epoch: continue`)
    assert codes(_EPOCH_FN.format(guard="if i // N >= steps_per_epoch:\n            continue", after="pass")) == []
    # the function builds the optimizer it steps: each call is a training of its own, there is no next epoch
    own = _EPOCH_FN.replace("    optimizer.zero_grad()\n    for",
                            "    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n    for", 1)
    assert codes(own.format(guard="pass", after="pass")) == []


_INHERITED = """
import torch
from torch import nn


class BaseTrainer:
    def __init__(self, model, accum):
        self.model = model
        self.accum = accum
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def backward_micro(self, x, y):
        loss = nn.functional.mse_loss(self.model(x), y){div}
        loss.backward()

    def step(self):
        self.opt.step()
        self.opt.zero_grad()


class Trainer({base}):
    def fit(self, loader):
        for i, (x, y) in enumerate(loader):
            self.backward_micro(x, y)
            if (i + 1) % self.accum == 0:
                self.step()
        self.step()
"""


def test_method_inherited_from_a_same_file_base_class_is_run():
    """`self.backward_micro(...)` / `self.step()` in a subclass's loop are the base class's methods (this file):
    the accumulation window they make is followed (the missing / N is reported at the base's backward)."""
    got = [c for c in codes(_INHERITED.format(div="", base="BaseTrainer")) if c[0] in ("BL103", "BL101", "BL102")]
    assert got == [("BL103", 14)]


def test_inherited_methods_divided_or_unknown_base_stay_silent():
    """The same loop with the loss divided by N is fine; a class whose base is imported (its methods unknown) keeps
    the calls unknown: nothing is claimed about a window it cannot see."""
    assert [c for c in codes(_INHERITED.format(div=" / self.accum", base="BaseTrainer"))
            if c[0].startswith("BL1")] == []
    src = _INHERITED.format(div="", base="ImportedTrainer").replace("from torch import nn",
                                                                   "from torch import nn\nfrom lib import ImportedTrainer")
    assert [c for c in codes(src) if c[0].startswith("BL1")] == []
