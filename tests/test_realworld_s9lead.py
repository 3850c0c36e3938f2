"""Regressions from session 9's false-positive sweep of public training code (token-normalised accumulation).

Each case is a small program written for this file, of the shape seen in public fine-tuning recipes: the loss of
each micro-batch is multiplied by its number of labelled tokens, the tokens are counted over the window, and the
gradients are divided by that total just before the step by a gradient-scaling helper (a function of the project's
own package, or a callable the recipe keeps on itself). No ``/ N`` is needed: the update is the token mean of the
window. The assertions are the exact (code, line) pairs reported, for the correct shape and for its wrong twin."""

from __future__ import annotations

import textwrap

from bertlint.api import lint_path, lint_text
from bertlint.config import Settings


def found(src: str, prefix: str = "BL1") -> list[tuple[str, int]]:
    diags = lint_text(textwrap.dedent(src), "train.py", Settings())
    return sorted((d.code, d.start.row) for d in diags if d.code.startswith(prefix))


SCALE_GRADS = """
    def scale_grads(model, scaler):
        for p in model.parameters():
            if p.grad is not None:
                p.grad *= scaler
"""

RECIPE = """
    import torch
    from mypkg.training import scale_grads


    class Recipe:
        def __init__(self, model, loader, accum_steps):
            self._model = model
            self._loader = loader
            self._accum = accum_steps
            self._optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def train(self):
            num_tokens = 0
            for idx, batch in enumerate(self._loader):
                current_num_tokens = (batch["labels"] != -100).sum()
                num_tokens += current_num_tokens
                loss = self._model(**batch).loss * current_num_tokens
                loss.backward()
                if (idx + 1) % self._accum == 0:
                    {rescale}
                    self._optimizer.step()
                    self._optimizer.zero_grad()
                    num_tokens = 0
"""


def _project(tmp_path, rescale: str) -> str:
    (tmp_path / ".git").mkdir()
    pkg = tmp_path / "mypkg" / "training"
    pkg.mkdir(parents=True)
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("from mypkg.training._grad_scaler import scale_grads\n")
    (pkg / "_grad_scaler.py").write_text(textwrap.dedent(SCALE_GRADS))
    (tmp_path / "recipes").mkdir()
    script = tmp_path / "recipes" / "finetune.py"
    script.write_text(textwrap.dedent(RECIPE).replace("{rescale}", rescale))
    return str(script)


def test_gradients_scaled_by_the_projects_own_helper_need_no_division(tmp_path):
    # the helper multiplies p.grad in place (``p.grad *= scaler``): followed into the project's package, it is a
    # gradient rescale before the step, so no BL103
    script = _project(tmp_path, "scale_grads(self._model, 1 / num_tokens)")
    assert [(d.code, d.start.row) for d in lint_path(script) if d.code.startswith("BL1")] == []


def test_without_the_rescale_the_missing_division_is_reported(tmp_path):
    script = _project(tmp_path, "pass")
    got = [(d.code, d.start.row) for d in lint_path(script) if d.code.startswith("BL1")]
    # (and the window left open when the loader's length is not a multiple of N: BL107 at the gate)
    assert got == [("BL103", 19), ("BL107", 20)]


KEPT_CALLABLE = """
    import torch
    from mypkg import build_grad_scaler


    class Recipe:
        def setup(self, model, loader, accum_steps):
            self._model = model
            self._loader = loader
            self._accum = accum_steps
            self._optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
            self._grad_scaler = build_grad_scaler()

        def train(self):
            num_tokens = 0
            for idx, batch in enumerate(self._loader):
                current_num_tokens = (batch["labels"] != -100).sum()
                num_tokens += current_num_tokens
                loss = self._model(**batch).loss * current_num_tokens
                loss.backward()
                if (idx + 1) % self._accum == 0:
                    self._grad_scaler({args})
                    self._optimizer.step()
                    self._optimizer.zero_grad()
                    num_tokens = 0
"""


def test_a_callable_kept_on_the_recipe_handed_the_parameters_and_a_quotient_rescales():
    src = KEPT_CALLABLE.replace("{args}", "list(self._model.parameters()), 8 / num_tokens")
    assert found(src) == []
    # handed the parameters but no quotient (a logger of gradient norms, say): not taken for a rescale
    src = KEPT_CALLABLE.replace("{args}", "list(self._model.parameters()), num_tokens")
    assert found(src) == [("BL103", 20), ("BL107", 21)]
