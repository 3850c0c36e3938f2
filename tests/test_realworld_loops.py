"""Regressions from a false-positive hunt on public training scripts (hand-written loops, accelerate, Fabric,
DeepSpeed, DDP no_sync, GradScaler).  Each example is a small loop written for this test that keeps only the shape
which misled (or nearly misled) a rule; the `*_still_flagged` twins keep the true positive next to it."""

from __future__ import annotations

import textwrap

from bertlint.engine import lint_python

LOOP_CODES = {f"BL1{n:02d}" for n in range(1, 16)} | {"BL201", "BL202"}


def codes(src: str) -> list[str]:
    return sorted(d.code for d in lint_python(textwrap.dedent(src), "t.py") if d.code in LOOP_CODES)


# --- BL106: the schedule length is divided by the *global* batch size, the quantity N itself is computed from.
GLOBAL_BATCH_DIVISOR = """
import torch

def fit(fabric, model, optimizer, samples, cfg):
    total_iters = len(samples) * cfg.epochs
    accum = cfg.global_batch // cfg.micro_batch
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_iters // cfg.global_batch)
    updates = 0
    for it in range(1, total_iters + 1):
        x, y = draw(samples, cfg.micro_batch)
        accumulating = it % accum != 0
        with fabric.no_backward_sync(model, enabled=accumulating):
            fabric.backward(model(x, y) / accum)
        if not accumulating:
            optimizer.step()
            optimizer.zero_grad()
            sched.step()
            updates += 1
"""


def test_bl106_length_divided_by_the_global_batch_n_is_derived_from_is_silent():
    assert "BL106" not in codes(GLOBAL_BATCH_DIVISOR)


def test_bl106_length_divided_by_the_micro_batch_still_flagged():
    # ``len(samples) // micro_batch`` counts micro-batches: N's *denominator* is not a multiple of N.
    src = GLOBAL_BATCH_DIVISOR.replace("total_iters // cfg.global_batch", "total_iters // cfg.micro_batch")
    assert "BL106" in codes(src)


PRODUCT_DIVISOR = """
import torch
from transformers import get_linear_schedule_with_warmup

def train(model, dl, args, world_size):
    optimizer = torch.optim.AdamW(model.parameters())
    total = len(dl) * args.epochs // (args.gradient_accumulation_steps * world_size)
    sched = get_linear_schedule_with_warmup(optimizer, 100, total)
    for epoch in range(args.epochs):
        for step, batch in enumerate(dl):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                sched.step()
                optimizer.zero_grad()
"""


def test_bl106_length_divided_by_a_product_containing_n_is_silent():
    assert "BL106" not in codes(PRODUCT_DIVISOR)


# --- No window at all: the backward sits under the step's own gate, so skipped micro-batches never reach autograd
# and nothing accumulates.  Window rules (BL107 first-window, BL102, BL103, BL112 ...) have nothing to say.
BACKWARD_UNDER_STEP_GATE = """
import torch

def train(model, loader, optimizer, scheduler, args):
    model.zero_grad()
    for epoch in range(args.epochs):
        for step, batch in enumerate(loader):
            loss = model(**batch).loss
            if step % args.gradient_accumulation_steps == 0:
                loss = loss / args.gradient_accumulation_steps
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                scheduler.step()
                model.zero_grad()
"""


def test_backward_under_the_step_gate_has_no_window():
    assert codes(BACKWARD_UNDER_STEP_GATE) == []


def test_backward_outside_the_gate_still_flagged_bl107():
    src = BACKWARD_UNDER_STEP_GATE.replace(
        "            if step % args.gradient_accumulation_steps == 0:\n"
        "                loss = loss / args.gradient_accumulation_steps\n"
        "                loss.backward()\n",
        "            loss = loss / args.gradient_accumulation_steps\n"
        "            loss.backward()\n"
        "            if step % args.gradient_accumulation_steps == 0:\n",
    )
    assert "BL107" in codes(src)


# --- BL109: an apex-style ``with amp.scale_loss(loss, opt) as scaled: scaled.backward()`` branch (the vendored HF
# Trainer's ``use_apex`` path) is that framework's own scaled backward, not a bypassed Accelerator.
APEX_BRANCH = """
from accelerate import Accelerator

accelerator = Accelerator(gradient_accumulation_steps=4)

def fit(model, optimizer, loader, use_apex):
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(**batch).loss
            if use_apex:
                with amp.scale_loss(loss, optimizer) as scaled:
                    scaled.backward()
            else:
                accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_bl109_apex_scale_loss_branch_is_silent():
    assert "BL109" not in codes(APEX_BRANCH)


def test_bl109_plain_backward_beside_it_still_flagged():
    src = APEX_BRANCH.replace("accelerator.backward(loss)", "loss.backward()")
    assert codes(src).count("BL109") == 1


# --- BL113: an inner loop over *tasks* (multi-task training) sums the step's objective; it is not a window of
# micro-batches whose backward was deferred, even though its items are called ``batch``.
MULTITASK_SUM = """
import torch

def train(model, loaders, optimizer):
    for step, batches in enumerate(zip(*loaders)):
        objective = 0
        for task_id, batch in enumerate(batches):
            objective = objective + model(batch, task=task_id).loss
        objective.backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_bl113_sum_over_tasks_is_silent():
    assert "BL113" not in codes(MULTITASK_SUM)


def test_bl113_sum_over_micro_batches_by_usage_only():
    # the names alone (``for micro, batch in ...`` over one batch of each loader) never make a finding; a loop over a
    # batch's chunks is over micro-batches by usage, whatever it is called
    src = MULTITASK_SUM.replace("for task_id, batch in enumerate(batches):", "for micro, batch in enumerate(batches):")
    src = src.replace("task=task_id", "task=0")
    assert "BL113" not in codes(src)
    src = MULTITASK_SUM.replace("for task_id, batch in enumerate(batches):", "for task_id, batch in enumerate(batches[0].chunk(4)):")
    assert "BL113" in codes(src)


# --- BL106: the schedule length divides the samples by a global batch that is *defined* as a product containing
# N (train_batch_size = per_gpu * n_gpu * N, in both arms of an if/else): it counts optimizer steps.
GLOBAL_BATCH_CHAIN = """
import torch
from transformers import get_linear_schedule_with_warmup

def train(args, model, features, loader):
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if args.n_gpu == 0:
        per_node_batch = args.per_gpu_train_batch_size * args.gradient_accumulation_steps
    else:
        per_node_batch = args.per_gpu_train_batch_size * args.n_gpu * args.gradient_accumulation_steps
    train_batch_size = per_node_batch * (torch.distributed.get_world_size() if args.local_rank != -1 else 1)
    if args.num_training_steps == -1:
        args.num_training_steps = int(args.num_train_epochs * len(features) / train_batch_size)
    scheduler = get_linear_schedule_with_warmup(optimizer, args.warmup, num_training_steps=args.num_training_steps)
    for epoch in range(int(args.num_train_epochs)):
        for step, batch in enumerate(loader):
            loss = model(**batch).loss / args.gradient_accumulation_steps
            loss.backward()
            if (step + 1) % args.gradient_accumulation_steps == 0:
                optimizer.step()
                scheduler.step()
                model.zero_grad()
"""


def _units_of_schedule_length(src: str) -> str:
    import libcst as cst

    from bertlint.context import FileContext

    src = textwrap.dedent(src)
    ctx = FileContext("t.py", src, cst.parse_module(src), None)
    f = ctx.loops
    train = next(d for d in ctx.module.body if isinstance(d, cst.FunctionDef) and d.name.value == "train")
    call = next(c for c, _n, _f in f.t.calls if (_n or "").endswith("get_linear_schedule_with_warmup"))
    length = next(a.value for a in call.args if a.keyword is not None and a.keyword.value == "num_training_steps")
    return f.units_of(length, train, "args.gradient_accumulation_steps")


def test_bl106_length_divided_by_a_global_batch_defined_with_n_is_silent():
    # the divisor's definition multiplies by N: the length is divided by N (optimizer steps)
    assert _units_of_schedule_length(GLOBAL_BATCH_CHAIN) == "optimizer-steps"
    assert "BL106" not in codes(GLOBAL_BATCH_CHAIN)


def test_bl106_length_divided_by_the_per_gpu_batch_still_flagged():
    # the same chain without N in the divisor's definition: the length counts micro-batches
    src = GLOBAL_BATCH_CHAIN.replace(" * args.gradient_accumulation_steps\n    else", "\n    else").replace(
        "args.n_gpu * args.gradient_accumulation_steps\n", "args.n_gpu\n")
    assert _units_of_schedule_length(src) == "micro-batches"
    assert "BL106" in codes(src)


# --- BL113: what an optimizer wrapper's backward(loss) returns carries no graph (the backward freed it).
WRAPPER_BACKWARD_RESULT = """
import torch


class Trainer:
    def __init__(self, model, optimizer, loss_fn, parts):
        self.model, self.optimizer, self.loss_fn, self.parts = model, optimizer, loss_fn, parts

    def train(self, loader):
        for batch in loader:
            self.step(batch)

    def step(self, data):
        chunks = [data[i::self.parts] for i in range(self.parts)]
        self.optimizer.zero_grad()
        total = 0
        for i, sub in enumerate(chunks):
            loss = self.loss_fn(self.model, sub) / len(chunks)
            if i == 0:
                loss_scale, value = self.optimizer.backward(loss)
            else:
                value = loss.float().detach().item()
                loss = loss.float() * loss_scale
                loss.backward()
            total += value
        self.optimizer.step()
"""


def test_wrapper_backward_result_carries_no_graph():
    assert codes(WRAPPER_BACKWARD_RESULT) == []


def test_loss_summed_over_chunks_then_one_backward_still_flagged():
    src = WRAPPER_BACKWARD_RESULT.replace(
        """            if i == 0:
                loss_scale, value = self.optimizer.backward(loss)
            else:
                value = loss.float().detach().item()
                loss = loss.float() * loss_scale
                loss.backward()
            total += value
        self.optimizer.step()""",
        """            total = total + loss
        total.backward()
        self.optimizer.step()""").replace("[data[i::self.parts] for i in range(self.parts)]", "data.chunk(self.parts)")
    assert "BL113" in codes(src)


# --- BL103: a loss normalised by its own micro-batch's token count is still a mean: N of them sum to N means.
TOKEN_MEAN_LOSS = """
import torch


def token_loss(model, input_ids, label_mask):
    logits = model(input_ids).logits
    losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids, reduction="none") * label_mask
    return torch.sum(losses, axis=1) / torch.sum(label_mask, axis=1)


def train(model, optimizer, loader, accum_steps):
    step = 0
    for input_ids, label_mask in loader:
        step += 1
        loss = token_loss(model, input_ids, label_mask).mean()
        loss.backward()
        if step % accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_per_micro_batch_token_mean_without_one_over_n_is_flagged():
    assert "BL103" in codes(TOKEN_MEAN_LOSS)


def test_per_micro_batch_token_mean_divided_by_n_is_silent():
    src = TOKEN_MEAN_LOSS.replace("loss.backward()", "(loss / accum_steps).backward()")
    assert "BL103" not in codes(src)


def test_loss_over_the_windows_token_count_is_not_taken_for_a_mean():
    # the divisor counts the tokens of the whole window, computed before its micro-batches: a correct normalisation
    src = """
import torch


def train(model, optimizer, windows):
    for window in windows:
        n_tokens = sum(int(m.sum()) for _, m in window)
        for input_ids, label_mask in window:
            logits = model(input_ids).logits
            losses = torch.nn.functional.cross_entropy(logits.transpose(1, 2), input_ids, reduction="none")
            loss = (losses * label_mask).sum() / n_tokens
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
"""
    assert "BL103" not in codes(src)


# --- the accumulation factor read from a notebook's plain config class (``class CFG: accum_steps = 1``)
CFG_CLASS = """
import torch


class CFG:
    batch_size = 16
    accum_steps = 1


def train(model, optimizer, loader):
    for step, batch in enumerate(loader):
        loss = model(batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if (step + 1) % CFG.accum_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_config_class_attribute_of_one_means_no_accumulation():
    assert codes(CFG_CLASS) == []
    # the same through an instance made with no arguments
    inst = CFG_CLASS.replace("% CFG.accum_steps", "% cfg.accum_steps").replace(
        "def train(", "cfg = CFG()\n\n\ndef train(")
    assert codes(inst) == []


def test_config_class_attribute_above_one_is_read_as_n():
    assert {"BL103", "BL112"} <= set(codes(CFG_CLASS.replace("accum_steps = 1", "accum_steps = 4")))


def test_loss_divided_by_its_own_batch_size_is_still_a_mean():
    src = """
import torch


def train(model, optimizer, loader, args):
    for step, batch in enumerate(loader):
        pre_loss = model(**batch)[0]
        loss = pre_loss.sum() / pre_loss.shape[0]
        loss.backward()
        if (step + 1) % args.accum == 0:
            optimizer.step()
            optimizer.zero_grad()
"""
    assert "BL103" in codes(src)
    assert "BL103" in codes(src.replace("pre_loss.shape[0]", "pre_loss.size(0)"))
    assert "BL103" not in codes(src.replace("pre_loss.shape[0]", "(pre_loss.shape[0] * args.accum)"))


# --- a dataclass instance the script makes itself (``config = TrainingConfig()``): its defaults are the values
DC_CONFIG = """
from dataclasses import dataclass
from accelerate import Accelerator


@dataclass
class TrainingConfig:
    train_batch_size: int = 16
    gradient_accumulation_steps: int = 1


config = TrainingConfig()


def train_loop(config, model, optimizer, train_dataloader):
    accelerator = Accelerator(gradient_accumulation_steps=config.gradient_accumulation_steps)
    model, optimizer, train_dataloader = accelerator.prepare(model, optimizer, train_dataloader)
    for batch in train_dataloader:
        with accelerator.accumulate(model):
            loss = model(batch).loss
            accelerator.backward(loss)
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
"""


def test_dataclass_made_by_the_script_fixes_its_defaults():
    assert codes(DC_CONFIG) == []


def test_dataclass_handed_to_a_parser_keeps_its_default_open():
    # the command line may set gradient_accumulation_steps: 1 is only a default, the dry run stands in N
    src = DC_CONFIG.replace("config = TrainingConfig()", "import tyro\nconfig = TrainingConfig()\ncli = tyro.cli(TrainingConfig)")
    assert "BL112" in codes(src)


# --- an fp16 optimizer wrapper's backward(loss) (apex FP16_Optimizer, fairseq / OpenNMT optimizers) is a backward
FP16_OPTIMIZER_BACKWARD = """
import torch
from apex.optimizers import FP16_Optimizer


def train(model, loader, args):
    optimizer = FP16_Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-4), dynamic_loss_scale=True)
    for step, batch in enumerate(loader):
        loss = model(batch).loss
        optimizer.backward(loss)
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
"""


def test_fp16_optimizer_backward_without_one_over_n_is_flagged():
    assert "BL103" in codes(FP16_OPTIMIZER_BACKWARD)


def test_fp16_optimizer_backward_of_loss_over_n_is_silent():
    src = FP16_OPTIMIZER_BACKWARD.replace("optimizer.backward(loss)",
                                          "optimizer.backward(loss / args.gradient_accumulation_steps)")
    assert codes(src) == []
