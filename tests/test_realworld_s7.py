"""Regressions from session 7's blind part (hand-written loops of recommendation / speech / vision trainers).

Each case is a small program written for this file, of the shape of code seen in public projects; the assertions
are the exact (code, line) pairs reported, for the wrong shape and for its correct look-alike."""

from __future__ import annotations

import os
import textwrap

from bertlint.api import lint_text
from bertlint.config import Settings

MEM = ("BL501", "BL502")


def found(src: str, codes=MEM, name: str = "train.py") -> list[tuple[str, int]]:
    diags = lint_text(textwrap.dedent(src), name, Settings())
    return sorted((d.code, d.start.row) for d in diags if d.code in codes)


# ------------------------------------------------------------------ a model's own per-hop loop in a predict method

HOPS = """
    import torch
    import torch.nn as nn


    class HopRecommender(nn.Module):
        def __init__(self, n_items, dim, n_hop):
            super().__init__()
            self.n_hop = n_hop
            self.item_embedding = nn.Embedding(n_items, dim)

        def forward(self, items):
            return self.item_embedding(items).sum(-1)

        def full_sort_predict(self, items):
            self.hops = []
            for i in range(self.n_hop):
                self.hops.append(self.item_embedding(items + i))
            return torch.stack(self.hops).sum(0)
"""


def test_per_hop_list_in_a_model_predict_method_is_the_models_computation():
    # the loop walks the model's hops inside one call: its grad mode is the caller's, whatever the method is named
    assert found(HOPS) == []


def test_a_model_predict_method_looping_over_data_is_still_an_evaluation_loop():
    src = """
        import torch
        import torch.nn as nn


        class Scorer(nn.Module):
            def __init__(self, n, dim):
                super().__init__()
                self.emb = nn.Embedding(n, dim)

            def forward(self, items):
                return self.emb(items).sum(-1)

            def predict(self, loader):
                scores = []
                for batch in loader:
                    scores.append(self(batch))
                return torch.cat(scores)

            def predict_cached(self):
                scores = []
                for batch in self.val_loader:
                    scores.append(self(batch))
                return torch.cat(scores)
    """
    # a loader handed in, or one the object holds, is data: one graph per batch kept
    assert found(src) == [("BL501", 17), ("BL501", 23), ("BL502", 17), ("BL502", 23)]


def test_per_hop_loop_of_a_class_whose_module_base_is_in_a_sibling_module(tmp_path):
    files = {
        ".git/HEAD": "",
        "lib/__init__.py": "",
        "lib/base.py": textwrap.dedent("""\
            import torch.nn as nn


            class KnowledgeRecommender(AbstractRecommender):
                pass


            class AbstractRecommender(nn.Module):
                pass
        """),
        "lib/ripple.py": textwrap.dedent(HOPS).replace("class HopRecommender(nn.Module):",
                                                       "class HopRecommender(KnowledgeRecommender):")
                                                 .replace("import torch.nn as nn\n",
                                                          "import torch.nn as nn\nfrom lib.base import KnowledgeRecommender\n"),
    }
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text, encoding="utf-8")
    path = str(tmp_path / "lib" / "ripple.py")
    with open(path, encoding="utf-8") as fh:
        got = sorted((d.code, d.start.row) for d in lint_text(fh.read(), path) if d.code in MEM)
    assert got == []
    # the same class on a base that is nowhere to be read: unknown, judged by the method's name as before
    os.remove(str(tmp_path / "lib" / "base.py"))
    with open(path, encoding="utf-8") as fh:
        got = sorted((d.code, d.start.row) for d in lint_text(fh.read(), path) if d.code in MEM)
    assert got == [("BL501", 19), ("BL502", 19)]


# ------------------------------------------------------------------ an evaluation-named helper of the training loss

def test_predict_named_helper_called_by_the_training_loss_is_not_an_evaluation():
    src = """
        import torch
        import torch.nn as nn


        class LabelSmooth(nn.Module):
            def __init__(self, n, dim, n_iter):
                super().__init__()
                self.n_iter = n_iter
                self.emb = nn.Embedding(n, dim)
                self.rel = nn.Embedding(n, dim)

            def forward(self, users, items):
                return (self.emb(users) * self.emb(items)).sum(-1)

            def label_predict(self, users, relations, labels):
                rel_vectors = [self.rel(r) for r in relations]
                for i in range(self.n_iter):
                    nxt = []
                    for hop in range(self.n_iter - i):
                        nxt.append(labels[hop] * torch.sigmoid((self.emb(users) * rel_vectors[hop]).sum(-1)))
                    labels = nxt
                return labels[0]

            def calculate_loss(self, users, items, relations, labels, target):
                rec = nn.functional.binary_cross_entropy_with_logits(self(users, items), target)
                ls = nn.functional.binary_cross_entropy(self.label_predict(users, relations, labels), target)
                return rec + ls
    """
    assert found(src) == []


def test_predict_named_helper_called_only_by_an_evaluation_is_still_reported():
    src = """
        import torch


        def predict_all(model, batches):
            outs = []
            for b in batches:
                outs.append(model(b))
            return outs


        def evaluate(model, batches):
            return sum(o.sum().item() for o in predict_all(model, batches))
    """
    assert found(src) == [("BL501", 8)]


# ------------------------------------------------------------------ what the backward-ed loss is made of

def test_loss_parts_kept_across_a_training_loop():
    src = """
        import torch


        class Trainer:
            def __init__(self, model, optimizer):
                self.model = model
                self.optimizer = optimizer

            def train_epoch(self, loader):
                self.model.train()
                losses_list = []
                for batch in loader:
                    self.optimizer.zero_grad()
                    losses = self.model.calculate_loss(batch)
                    loss = sum(losses) if isinstance(losses, tuple) else losses
                    loss.backward()
                    self.optimizer.step()
                    losses_list.append(losses)
                return sum(losses_list).item()
    """
    # `loss` is backward-ed and made of `losses` alone: `losses` carries the graph
    assert found(src) == [("BL501", 19)]


def test_loss_parts_kept_as_numbers_or_a_label_kept_are_fine():
    src = """
        import torch


        class Trainer:
            def __init__(self, model, optimizer, criterion):
                self.model = model
                self.optimizer = optimizer
                self.criterion = criterion

            def train_epoch(self, loader):
                self.model.train()
                total, labels = 0.0, []
                for x, y in loader:
                    self.optimizer.zero_grad()
                    losses = self.model.calculate_loss(x)
                    loss = sum(losses) if isinstance(losses, tuple) else losses
                    loss.backward()
                    self.optimizer.step()
                    total += loss.item()
                    target = y
                    weighted = self.criterion(self.model(x), target)
                    weighted.backward()
                    labels.append(target)
                return total, labels
    """
    # `weighted` comes from two inputs (the forward and the label): the label is not taken for a graph
    assert found(src) == []


# ------------------------------------------------------------------ a step gate in a helper handed N by the caller

GATE_HELPER = """
    import torch


    def update(model, optimizer, scheduler, batch_idx, accum{extra_param}):
        if (batch_idx + 1) % accum == 0{extra_test}:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
            optimizer.step()
            optimizer.zero_grad()
            scheduler.step()


    def train(model, optimizer, scheduler, loader, accum_grad, epochs):
        for epoch in range(epochs):
            for batch_idx, batch in enumerate(loader):
                loss = model(batch) / accum_grad
                loss.backward()
                update(model, optimizer, scheduler, batch_idx, accum_grad{extra_arg})
"""


def test_helper_gate_on_the_callers_factor_leaks_the_epoch_tail():
    src = GATE_HELPER.format(extra_param="", extra_test="", extra_arg="")
    assert found(src, codes=("BL107", "BL103", "BL101", "BL108")) == [("BL107", 6)]


def test_helper_gate_that_also_steps_the_epochs_last_micro_batch_is_fine():
    src = GATE_HELPER.format(extra_param=", n_batches", extra_test=" or batch_idx + 1 == n_batches",
                             extra_arg=", len(loader)")
    assert found(src, codes=("BL107", "BL103", "BL101", "BL108")) == []


# ------------------------------------------------------------------ a ``while`` window inside the step loop

WHILE_WINDOW = """
    import math

    import torch


    def train(model, optimizer, loader, total_batch_size, micro_batch_size, max_steps):
        it = iter(loader)
        n_accum = math.ceil(total_batch_size / micro_batch_size)
        for step in range(max_steps):
            {init}
            while {test}:
                x, y = next(it)
                loss = torch.nn.functional.cross_entropy(model(x), y)
                {backward}
                {count}
                {stop}
            optimizer.step()
            optimizer.zero_grad()
"""


def _while(init, test, backward, count, stop=""):
    return found(WHILE_WINDOW.format(init=init, test=test, backward=backward, count=count, stop=stop),
                 codes=("BL101", "BL102", "BL103", "BL107", "BL108"))


def test_while_window_counted_to_n_without_dividing_the_loss():
    assert _while("n = 0", "n < n_accum", "loss.backward()", "n += 1") == [("BL103", 15)]
    assert _while("n = 0", "True", "loss.backward()", "n += 1", "if n >= n_accum: break") == [("BL103", 15)]


def test_while_window_counted_by_a_fixed_micro_batch_size_without_dividing_the_loss():
    assert _while("seen = 0", "True", "loss.backward()", "seen += micro_batch_size",
                  "if seen >= total_batch_size: break") == [("BL103", 15)]


def test_while_window_with_the_loss_divided_is_fine():
    assert _while("n = 0", "n < n_accum", "(loss / n_accum).backward()", "n += 1") == []
    assert _while("n = 0", "True", "(loss / n_accum).backward()", "n += 1", "if n >= n_accum: break") == []
    assert _while("seen = 0", "True", "(loss / n_accum).backward()", "seen += micro_batch_size",
                  "if seen >= total_batch_size: break") == []


def test_while_window_of_unknown_length_is_left_alone():
    # the size comes from the batch itself (varies per micro-batch): the window's length is not known here
    assert _while("seen = 0", "True", "loss.backward()", "seen += x.size(0)",
                  "if seen >= total_batch_size: break") == []


def test_validation_called_by_a_training_driver_is_still_an_evaluation():
    # `fit` trains (a backward in `train`) and calls `validate`, whose result is no loss: the name still counts
    src = """
        import torch


        class Runner:
            def fit(self, module, optimizer, train_loader, val_loader, epochs):
                for epoch in range(epochs):
                    self.train(module, optimizer, train_loader)
                    metrics = self.validate(module, val_loader)
                    print(metrics)

            def train(self, module, optimizer, loader):
                module.train()
                for batch in loader:
                    optimizer.zero_grad()
                    module.training_step(batch)["loss"].backward()
                    optimizer.step()

            def validate(self, module, loader):
                outputs = []
                for batch in loader:
                    outputs.append(module.validation_step(batch))
                return outputs
    """
    assert found(src) == [("BL502", 22)]
