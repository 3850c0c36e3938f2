"""Regressions from session 9's blind part s9nlp (hand-written NLP fine-tuning loops).

accelerate keeps one process-wide ``GradientState``; since accelerate 0.18.0 every ``Accelerator(...)`` hands it its
own ``gradient_accumulation_steps`` (default 1), so a plain ``Accelerator()`` built after the configured one (for a
progress bar, a logger, a main-process check) switches accumulation off: ``accumulate()`` then syncs on every
micro-batch and ``accelerator.backward`` divides by 1 (checked on accelerate 0.18.0, 0.21.0 and 1.16.0; 0.17.0 kept
the factor on each Accelerator). ``PartialState()`` does not touch it. Each case is a small program written for this
file; the assertions are the exact (code, line) pairs reported, for the wrong shape and its correct look-alike."""

from __future__ import annotations

import textwrap

from bertlint.api import lint_text
from bertlint.config import Settings


def diags(src: str, **settings):
    return [d for d in lint_text(textwrap.dedent(src), "train.py", Settings(**settings)) if d.code.startswith("BL1")]


def found(src: str, **settings) -> list[tuple[str, int]]:
    return sorted((d.code, d.start.row) for d in diags(src, **settings))


SAME_SCOPE_RESET = """
    import torch
    from accelerate import Accelerator


    def main(model, loader, epochs=3):
        accelerator = Accelerator(gradient_accumulation_steps=4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        printer = Accelerator()
        for epoch in range(epochs):
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
            printer.print(f"epoch {epoch} done")
"""


def test_plain_accelerator_after_the_configured_one_resets_accumulation():
    ds = diags(SAME_SCOPE_RESET)
    assert [(d.code, d.start.row) for d in ds] == [("BL109", 10)]
    assert "gradient_accumulation_steps 4 -> 1" in ds[0].message
    assert ds[0].severity.value == "W"  # (the accelerate version is the installed one, not the script's)


def test_reset_is_an_error_on_a_pinned_accelerate_that_shares_the_state():
    ds = diags(SAME_SCOPE_RESET, target_versions={"accelerate": "0.21.0"})
    assert [(d.code, d.start.row, d.severity.value) for d in ds] == [("BL109", 10, "E")]


def test_reset_is_silent_before_accelerate_0_18():
    # 0.17.0: ``self.step % self.gradient_accumulation_steps`` on each Accelerator; a second one changes nothing
    assert found(SAME_SCOPE_RESET, target_versions={"accelerate": "0.17.0"}) == []


HELPER_CLASS_RESET = """
    import torch
    from accelerate import Accelerator


    class ProgressBar:
        def __init__(self, total):
            self.accelerator = Accelerator()
            self.total = total

        def update(self, loss):
            if self.accelerator.is_main_process:
                print(loss)


    def train(model, loader, epochs=3):
        accelerator = Accelerator(gradient_accumulation_steps=8)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        bar = ProgressBar(len(loader))
        for epoch in range(epochs):
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                bar.update(loss.item())
"""


def test_helper_class_building_an_accelerator_resets_accumulation():
    ds = diags(HELPER_CLASS_RESET)
    assert [(d.code, d.start.row) for d in ds] == [("BL109", 8)]
    assert "ProgressBar.__init__" in ds[0].message and "line 20" in ds[0].message


HELPER_IN_LOOP_RESET = """
    import torch
    from accelerate import Accelerator


    def log_main(msg):
        if Accelerator().is_main_process:
            print(msg)


    def train(model, loader, epochs=3):
        accelerator = Accelerator(gradient_accumulation_steps=4)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for epoch in range(epochs):
            for step, batch in enumerate(loader):
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                if step % 100 == 0:
                    log_main(f"step {step}: {loss.item()}")
"""


def test_main_process_helper_called_in_the_loop_resets_accumulation():
    assert found(HELPER_IN_LOOP_RESET) == [("BL109", 7)]


def test_partial_state_helper_does_not_reset():
    src = HELPER_IN_LOOP_RESET.replace("from accelerate import Accelerator", "from accelerate import Accelerator, "
                                       "PartialState").replace("if Accelerator().is_main_process", "if PartialState()"
                                                               ".is_main_process")
    assert found(src) == []


def test_plain_accelerator_after_the_loop_does_not_matter():
    src = SAME_SCOPE_RESET.replace("        printer = Accelerator()\n", "").replace(
        '            printer.print(f"epoch {epoch} done")\n', "") + "    Accelerator().print('done')\n"
    assert found(src) == []


BRANCHES = """
    import torch
    from accelerate import Accelerator


    def main(model, loader, accum=1, epochs=3):
        if accum > 1:
            accelerator = Accelerator(gradient_accumulation_steps=accum)
        else:
            accelerator = Accelerator()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
        for epoch in range(epochs):
            for batch in loader:
                with accelerator.accumulate(model):
                    loss = model(**batch).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_accelerators_in_two_arms_of_an_if_are_one_accelerator():
    assert found(BRANCHES) == []


HANDED_IN = """
    import torch
    from accelerate import Accelerator


    class Bar:
        def __init__(self):
            self.accelerator = Accelerator()


    class Trainer:
        def __init__(self, model, loader, optimizer, accelerator):
            self.model = model
            self.loader = loader
            self.optimizer = optimizer
            self.accelerator = accelerator
            self.bar = Bar()

        def train(self, epochs=3):
            for epoch in range(epochs):
                for batch in self.loader:
                    with self.accelerator.accumulate(self.model):
                        loss = self.model(**batch).loss
                        self.accelerator.backward(loss)
                        self.optimizer.step()
                        self.optimizer.zero_grad()
"""


def test_handed_in_accelerator_names_the_reset_not_a_missing_setting():
    ds = diags(HANDED_IN)
    assert [(d.code, d.start.row, d.severity.value) for d in ds] == [("BL109", 22, "W")]
    assert "does not build" in ds[0].message and "Bar.__init__" in ds[0].message
    assert "configures no" not in ds[0].message


def test_handed_in_accelerator_is_silent_before_accelerate_0_18():
    assert found(HANDED_IN, target_versions={"accelerate": "0.17.0"}) == []


def test_handed_in_accelerator_reset_in_the_trainers_init_is_certain():
    # Trainer.__init__ stores the handed-in accelerator, then builds Bar(), whose __init__ builds Accelerator():
    # the plain one is built after the configured one, whatever the caller configured
    ds = diags(HANDED_IN, target_versions={"accelerate": "1.16.0"})
    assert [(d.code, d.start.row, d.severity.value) for d in ds] == [("BL109", 22, "E")]
    assert "builds it in `Trainer.__init__` (line 17)" in ds[0].message


def test_handed_in_accelerator_with_the_helper_built_elsewhere_stays_conditional():
    src = HANDED_IN.replace("            self.bar = Bar()\n", "")
    ds = diags(src, target_versions={"accelerate": "1.16.0"})
    assert [(d.code, d.start.row, d.severity.value) for d in ds] == [("BL109", 21, "W")]
    assert "when it is built after" in ds[0].message


# ------------------------------------------------------------------ a counter gate that resets its counter

RESET_COUNTER_GATE = """
    import torch
    from torch.utils.data import DataLoader


    def train(model, dataset, args):
        loader = DataLoader(dataset, batch_size=4, shuffle=True)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        for epoch in range(args.epochs):
            optimizer.zero_grad()
            step_cnt = 0
            for i, batch in enumerate(loader):
                step_cnt += 1
                loss = model(**batch).loss / args.accumulate_step
                loss.backward()
                if step_cnt == args.accumulate_step:
                    step_cnt = 0
                    optimizer.step()
                    optimizer.zero_grad()
"""


def test_equality_gate_with_a_counter_reset_is_the_accumulation_factor_by_usage():
    # ``step_cnt == N`` with ``step_cnt = 0`` under it fires every N-th micro-batch, like ``i % N == 0``: N is known
    # by usage, so the epoch-tail finding keeps BL107's own severity (was lowered to I as "by its name alone")
    ds = diags(RESET_COUNTER_GATE)
    assert [(d.code, d.start.row, d.severity.value) for d in ds] == [("BL107", 16, "W")]
    assert "by its name alone" not in ds[0].message


def test_equality_gate_without_a_reset_is_no_period():
    # without the reset ``step_cnt == N`` fires once: not a window gate, and nothing is reported for it
    src = RESET_COUNTER_GATE.replace("                    step_cnt = 0\n", "")
    assert found(src) == []


GAN_COUNTER_GATE = """
    import torch


    def train(gen, disc, loader, args):
        g_opt = torch.optim.Adam(gen.parameters(), lr=1e-4)
        d_opt = torch.optim.Adam(disc.parameters(), lr=1e-4)
        cnt = 0
        for epoch in range(args.epochs):
            for real in loader:
                cnt += 1
                d_opt.zero_grad()
                d_loss = disc(real).mean() - disc(gen(real).detach()).mean()
                d_loss.backward()
                d_opt.step()
                if cnt == args.n_critic:
                    cnt = 0
                    g_opt.zero_grad()
                    g_loss = -disc(gen(real)).mean()
                    g_loss.backward()
                    g_opt.step()
"""


def test_generator_every_n_critic_steps_is_not_accumulation():
    # a backward only under the counter gate is its own update every n-th batch (a WGAN's generator)
    assert found(GAN_COUNTER_GATE) == []


def test_configured_accelerator_built_again_after_the_plain_one_restores_accumulation():
    # the last Accelerator built before the loop decides N: here the configured one again
    src = SAME_SCOPE_RESET.replace(
        "        printer = Accelerator()\n",
        "        printer = Accelerator()\n        accelerator = Accelerator(gradient_accumulation_steps=4)\n")
    assert found(src) == []
