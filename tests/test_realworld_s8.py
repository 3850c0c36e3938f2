"""Regressions from session 8's blind part s8nlp (hand-written NLP fine-tuning loops).

Each case is a small program written for this file, of the shape of code seen in public projects (a multi-task step
that runs one backward per task or head inside the micro-batch, an adversarial (FGM) second backward per
micro-batch); the assertions are the exact (code, line) pairs reported, for the wrong shape and for its correct
look-alike."""

from __future__ import annotations

import textwrap

from bertlint.api import lint_text
from bertlint.config import Settings


def found(src: str, prefix: str = "BL1") -> list[tuple[str, int]]:
    diags = lint_text(textwrap.dedent(src), "train.py", Settings())
    return sorted((d.code, d.start.row) for d in diags if d.code.startswith(prefix))


# ------------------------------------------------------------------ an adversarial second backward per micro-batch

FGM_LEAK_GOOD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, dataset, adversary, accum_steps=4, epochs=3):
        loader = DataLoader(dataset, batch_size=8, shuffle=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                loss = model(**batch).loss / accum_steps
                loss.backward()
                adversary.perturb_embeddings()
                adv_loss = model(**batch).loss / accum_steps
                adv_loss.backward()
                adversary.restore_embeddings()
                if (step + 1) % accum_steps == 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_adversarial_second_backward_is_not_a_second_micro_batch():
    # two backwards per micro-batch (the loss, then the perturbed-embedding loss), the step every 4 micro-batches:
    # the windows hold 4 micro-batches (8 backwards), the gate is right
    assert found(FGM_LEAK_GOOD) == []


FGM_GOOD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, dataset, adversary, accum_steps=4, epochs=3):
        loader = DataLoader(dataset, batch_size=8, shuffle=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                loss = model(**batch).loss / accum_steps
                loss.backward()
                adversary.perturb_embeddings()
                adv_loss = model(**batch).loss / accum_steps
                adv_loss.backward()
                adversary.restore_embeddings()
                if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_adversarial_second_backward_with_the_tail_stepped():
    assert found(FGM_GOOD) == []


FGM_INVERTED_BAD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, dataset, adversary, accum_steps=4, epochs=3):
        loader = DataLoader(dataset, batch_size=8, shuffle=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                loss = model(**batch).loss / accum_steps
                loss.backward()
                adversary.perturb_embeddings()
                adv_loss = model(**batch).loss / accum_steps
                adv_loss.backward()
                adversary.restore_embeddings()
                if (step + 1) % accum_steps != 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_adversarial_loop_with_an_inverted_gate_is_still_misplaced():
    assert found(FGM_INVERTED_BAD) == [("BL108", 21)]


# ------------------------------------------------------------------ one backward per task head inside the micro-batch

TASKS_CLIP_BAD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, heads, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                for head in heads:
                    loss = model(batch, head=head) / accum_steps
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_tasks_clip_bad():
    # clipping after every head's backward clips the window's partial sums
    assert found(TASKS_CLIP_BAD) == [("BL112", 15)]


TASKS_CLIP_GOOD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, heads, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                for head in heads:
                    loss = model(batch, head=head) / accum_steps
                    loss.backward()
                if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_tasks_clip_good():
    # clipping once under the gate of the outer (micro-batch) counter
    assert found(TASKS_CLIP_GOOD) == []


TASKS_SCHEDULE_BAD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, heads, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        total_steps = len(loader) * epochs
        scheduler = get_linear_schedule_with_warmup(optimizer, 100, total_steps)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                for head in heads:
                    loss = model(batch, head=head) / accum_steps
                    loss.backward()
                if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
"""


def test_tasks_schedule_bad():
    # the outer loop is the micro-batch loop: len(loader) * epochs counts micro-batches
    assert found(TASKS_SCHEDULE_BAD) == [("BL106", 10)]


TASKS_SCHEDULE_GOOD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, heads, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        total_steps = len(loader) // accum_steps * epochs
        scheduler = get_linear_schedule_with_warmup(optimizer, 100, total_steps)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                for head in heads:
                    loss = model(batch, head=head) / accum_steps
                    loss.backward()
                if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    optimizer.step()
                    scheduler.step()
                    optimizer.zero_grad()
"""


def test_tasks_schedule_good():
    # len(loader) // N * epochs counts optimizer steps
    assert found(TASKS_SCHEDULE_GOOD) == []


TASKS_STEP_INSIDE_BAD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, heads, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        optimizer.zero_grad()
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                for head in heads:
                    loss = model(batch, head=head) / accum_steps
                    loss.backward()
                    if (step + 1) % accum_steps == 0 or step + 1 == len(loader):
                        optimizer.step()
                        optimizer.zero_grad()
"""


def test_tasks_step_inside_bad():
    # the gate on the outer counter sits inside the head loop: one step per head on a boundary
    assert found(TASKS_STEP_INSIDE_BAD) == [("BL108", 16)]


TASKS_STEP_INSIDE_GOOD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, heads, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                for head in heads:
                    loss = model(batch, head=head)
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_tasks_step_inside_good():
    # no accumulation: one step per head is a deliberate round-robin
    assert found(TASKS_STEP_INSIDE_GOOD) == []


WINDOW_LOOP_GOOD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                optimizer.zero_grad()
                chunks = batch.chunk(accum_steps)
                for chunk in chunks:
                    loss = model(chunk) / len(chunks)
                    loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
"""


def test_window_loop_good():
    # a window loop (chunks of one batch) with an ungated step after it keeps the window model
    assert found(WINDOW_LOOP_GOOD) == []


WINDOW_LOOP_CLIP_BAD = """
    import torch
    from torch.utils.data import DataLoader
    from transformers import get_linear_schedule_with_warmup


    def train(model, loader, accum_steps=4, epochs=3):
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                optimizer.zero_grad()
                chunks = batch.chunk(accum_steps)
                for chunk in chunks:
                    loss = model(chunk) / len(chunks)
                    loss.backward()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
"""


def test_window_loop_clip_bad():
    # clip inside the chunk loop
    assert found(WINDOW_LOOP_CLIP_BAD) == [("BL112", 16)]


# ------------------------------------------------------------------ a micro-batch counter of a sibling module's class

LEARNER = """\
    import torch


    class MultiTaskLearner:
        def __init__(self, network, optimizer, accum_steps=4, max_norm=1.0):
            self.network = network
            self.optimizer = optimizer
            self.accum_steps = accum_steps
            self.max_norm = max_norm
            self.micro_steps = 0

        def update(self, batch):
            self.network.train()
            loss = self.network(batch) / self.accum_steps
            loss.backward()
            self.micro_steps += 1
            torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.max_norm)
            if self.micro_steps % self.accum_steps == 0:
                self.optimizer.step()
                self.optimizer.zero_grad()
"""

LEARNER_CLIP_IN_GATE = LEARNER.replace(
    "            torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.max_norm)\n"
    "            if self.micro_steps % self.accum_steps == 0:\n",
    "            if self.micro_steps % self.accum_steps == 0:\n"
    "                torch.nn.utils.clip_grad_norm_(self.network.parameters(), self.max_norm)\n")

DRIVER = """\
    import torch
    from torch.utils.data import DataLoader

    from learner.model import MultiTaskLearner


    def main(network, dataset, epochs=3):
        loader = DataLoader(dataset, batch_size=16, shuffle=True)
        optimizer = torch.optim.AdamW(network.parameters(), lr=5e-5)
        learner = MultiTaskLearner(network, optimizer, accum_steps=4)
        for epoch in range(epochs):
            for batch in loader:
                learner.update(batch)
"""


def _driver_findings(tmp_path, learner_src: str) -> list[tuple[str, int]]:
    files = {".git/HEAD": "", "learner/__init__.py": "", "learner/model.py": textwrap.dedent(learner_src),
             "train.py": textwrap.dedent(DRIVER)}
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    path = str(tmp_path / "train.py")
    with open(path, encoding="utf-8") as fh:
        return sorted((d.code, d.start.row) for d in lint_text(fh.read(), path) if d.code.startswith("BL1"))


def test_counter_of_a_sibling_class_starts_at_its_init_literal(tmp_path):
    # ``self.micro_steps = 0`` in the sibling class's __init__, ``+= 1`` per update(): the gate is decided on every
    # micro-batch of the driver's loop, so the clip outside it is seen at the call
    assert _driver_findings(tmp_path, LEARNER) == [("BL112", 13)]


def test_counter_of_a_sibling_class_with_the_clip_in_the_gate(tmp_path):
    assert LEARNER_CLIP_IN_GATE != LEARNER
    assert _driver_findings(tmp_path, LEARNER_CLIP_IN_GATE) == []


# ------------------------------------------------------------------ a dispatch on exclusive precision / engine modes

MODES_GOOD = """\
    import torch


    class MiniTrainer:
        def __init__(self, model, args, train_loader, optimizer, engine=None):
            self.args = args
            self.model = model
            self.train_loader = train_loader
            self.optimizer = optimizer
            self.engine = engine
            self.use_scaler = args.fp16 and engine is None
            self.scaler = torch.amp.GradScaler("cuda") if self.use_scaler else None

        def training_step(self, batch):
            loss = self.model(**batch).loss
            if self.args.gradient_accumulation_steps > 1 and not self.engine:
                loss = loss / self.args.gradient_accumulation_steps
            if self.use_scaler:
                self.scaler.scale(loss).backward()
            elif self.engine:
                self.engine.backward(loss)
            else:
                loss.backward()
            return loss.detach()

        def train(self):
            for epoch in range(self.args.epochs):
                for step, batch in enumerate(self.train_loader):
                    self.training_step(batch)
                    if self.engine:
                        self.engine.step()
                    elif (step + 1) % self.args.gradient_accumulation_steps == 0 or step + 1 == len(self.train_loader):
                        if self.use_scaler:
                            self.scaler.step(self.optimizer)
                            self.scaler.update()
                        else:
                            self.optimizer.step()
                        self.optimizer.zero_grad()
"""

MODES_NO_DIVISION_BAD = MODES_GOOD.replace(
    "            if self.args.gradient_accumulation_steps > 1 and not self.engine:\n"
    "                loss = loss / self.args.gradient_accumulation_steps\n", "")


def test_dispatch_chain_on_mode_flags_takes_one_mode_per_run():
    # ``if self.use_scaler: ... elif self.engine: engine.backward(loss)``: a run with the engine does not also take
    # the GradScaler arm (the constructor never sets both), so the undivided engine loss is not read as a
    # GradScaler loss with a hand gate (a vendored HF Trainer's training_step has this dispatch)
    assert found(MODES_GOOD) == []


def test_dispatch_chain_on_mode_flags_still_sees_a_missing_division():
    assert MODES_NO_DIVISION_BAD != MODES_GOOD
    assert found(MODES_NO_DIVISION_BAD) == [("BL103", 17)]
