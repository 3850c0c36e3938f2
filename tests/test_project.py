"""The project's own sibling modules (bertlint/analysis/project.py): resolution, bounds, unknowns, caches."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from bertlint.analysis import project
from bertlint.api import lint_text

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

LOOP = textwrap.dedent('''\
    import torch
    {imp}

    GRAD_ACCUM = 4


    def train(model, loader, optimizer):
        for step, (x, y) in enumerate(loader):
            loss = torch.nn.functional.cross_entropy(model(x), y)
            {call}
            if (step + 1) % GRAD_ACCUM == 0 or step + 1 == len(loader):
                optimizer.step()
                optimizer.zero_grad()
    ''')

HELPER = "def backward_micro_batch(loss):\n    loss.backward()\n"


def _write(folder, files: dict) -> None:
    for rel, text in files.items():
        p = os.path.join(str(folder), rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "w", encoding="utf-8") as fh:
            fh.write(text)


def _codes(path: str) -> list:
    with open(path, encoding="utf-8") as fh:
        return [(d.code, d.start.row) for d in lint_text(fh.read(), path)]


def test_relative_and_package_imports(tmp_path):
    _write(tmp_path, {
        "pyproject.toml": "",
        "pkg/__init__.py": "",
        "pkg/train.py": LOOP.format(imp="from .steps import backward_micro_batch",
                                    call="backward_micro_batch(loss)"),
        "pkg/steps.py": HELPER,
    })
    assert _codes(str(tmp_path / "pkg" / "train.py")) == [("BL103", 10)]
    # ``from pkg.steps import f`` from a script in a sub-folder: found in the parent (the project root)
    _write(tmp_path, {"scripts/run.py": LOOP.format(imp="from pkg.steps import backward_micro_batch",
                                                    call="backward_micro_batch(loss)")})
    assert _codes(str(tmp_path / "scripts" / "run.py")) == [("BL103", 10)]


def test_never_beyond_the_project_root(tmp_path):
    # the helper lies above the project root: not part of the project, the loop stays unknown (no finding)
    _write(tmp_path, {"steps.py": HELPER, "proj/setup.py": "",
                      "proj/train.py": LOOP.format(imp="from steps import backward_micro_batch",
                                                   call="backward_micro_batch(loss)")})
    assert _codes(str(tmp_path / "proj" / "train.py")) == []


def test_site_packages_and_frameworks_are_not_read(tmp_path):
    _write(tmp_path, {"venv/lib/site-packages/proj/train.py": LOOP.format(
        imp="from steps import backward_micro_batch", call="backward_micro_batch(loss)"),
        "venv/lib/site-packages/proj/steps.py": HELPER})
    assert _codes(str(tmp_path / "venv" / "lib" / "site-packages" / "proj" / "train.py")) == []
    # a project folder named like a framework is never taken for it
    _write(tmp_path, {"fw/torch/__init__.py": "", "fw/torch/steps.py": HELPER,
                      "fw/train.py": LOOP.format(imp="from torch.steps import backward_micro_batch",
                                                 call="backward_micro_batch(loss)")})
    assert _codes(str(tmp_path / "fw" / "train.py")) == []


def test_missing_unparsable_or_oversized_sibling_is_unknown(tmp_path, monkeypatch):
    call = "backward_micro_batch(loss)"
    _write(tmp_path, {
        "a/train.py": LOOP.format(imp="from nowhere import backward_micro_batch", call=call),
        "b/train.py": LOOP.format(imp="from broken import backward_micro_batch", call=call),
        "b/broken.py": "def backward_micro_batch(loss:\n    loss.backward()\n",
        "c/train.py": LOOP.format(imp="from big import backward_micro_batch", call=call),
        "c/big.py": HELPER + "#" * 200 + "\n",
        "d/train.py": LOOP.format(imp="from notdefined import backward_micro_batch", call=call),
        "d/notdefined.py": "def other(loss):\n    loss.backward()\n",
    })
    monkeypatch.setattr(project, "MAX_BYTES", 150)
    for d in "abcd":
        assert _codes(str(tmp_path / d / "train.py")) == [], d


def test_hops_are_bounded(tmp_path):
    # train -> mid1 (re-export) -> mid2 (re-export) -> steps: three hops, beyond MAX_HOPS = 2
    _write(tmp_path, {
        ".git/HEAD": "",
        "train.py": LOOP.format(imp="from mid1 import backward_micro_batch", call="backward_micro_batch(loss)"),
        "mid1.py": "from mid2 import backward_micro_batch\n",
        "mid2.py": "from steps import backward_micro_batch\n",
        "steps.py": HELPER,
        "near.py": LOOP.format(imp="from mid2 import backward_micro_batch", call="backward_micro_batch(loss)"),
    })
    assert _codes(str(tmp_path / "train.py")) == []
    assert _codes(str(tmp_path / "near.py")) == [("BL103", 10)]


def test_resolve_api(tmp_path):
    _write(tmp_path, {
        "setup.cfg": "",
        "train.py": "import helpers as hp\nfrom helpers import Scaler\n",
        "helpers.py": "class Base:\n    def step(self):\n        pass\n\n\nclass Scaler(Base):\n"
                      "    def __call__(self, loss):\n        loss.backward()\n",
    })
    import libcst as cst

    class Ctx:
        filename = str(tmp_path / "train.py")
        module = cst.parse_module(open(filename).read())

    xp = project.of(Ctx())
    t = xp.resolve("Scaler")
    assert t.kind == "class" and t.node.name.value == "Scaler"
    assert xp.resolve("hp.Scaler.step").node.name.value == "step"  # inherited from a class of the same module
    m = xp.resolve("Scaler.__call__").node
    assert project.where(m) == "helpers.py:7"
    assert xp.resolve("hp.nothing") is None and xp.resolve("os.path") is None


def test_result_cache_follows_the_sibling(tmp_path):
    _write(tmp_path, {
        "pyproject.toml": "",
        "train.py": LOOP.format(imp="import steps", call="steps.backward_micro_batch(loss)"),
        "steps.py": HELPER,
    })
    env = {**os.environ, "PYTHONPATH": ROOT, "HF_HUB_OFFLINE": "1"}
    env.pop("BERTLINT_NO_CACHE", None)

    def run():
        p = subprocess.run([sys.executable, "-m", "bertlint", "train.py", "--output-format", "concise"],
                           cwd=str(tmp_path), env=env, capture_output=True, text=True, timeout=120)
        return p.stdout

    assert "BL103" in run()
    assert "BL103" in run()  # from the cache
    # the sibling now divides by N: the cached result of train.py (unchanged) must not be served
    (tmp_path / "steps.py").write_text("def backward_micro_batch(loss):\n    (loss / 4).backward()\n")
    out = run()
    assert "BL103" not in out, out


def test_a_siblings_own_training_loop_is_reported_there_only(tmp_path):
    # engine.py holds the whole (buggy: loss never divided by N) training loop; train.py only calls it per epoch.
    # The mistake is engine.py's: reported when engine.py is linted, never a second time at train.py's call
    _write(tmp_path, {
        "pyproject.toml": "",
        "engine.py": LOOP.format(imp="", call="loss.backward()"),
        "train.py": "import torch\nfrom engine import train\n\n\ndef main(model, loader, opt):\n"
                    "    for epoch in range(3):\n        train(model, loader, opt)\n",
    })
    assert _codes(str(tmp_path / "engine.py")) == [("BL103", 10)]
    assert _codes(str(tmp_path / "train.py")) == []


def test_reads_tells_which_siblings_a_lint_read(tmp_path):
    # the language server re-lints an open file when a sibling its last lint read is saved
    _write(tmp_path, {"pyproject.toml": "", "steps.py": HELPER,
                      "train.py": LOOP.format(imp="import steps", call="steps.backward_micro_batch(loss)")})
    _codes(str(tmp_path / "train.py"))
    assert project.reads(str(tmp_path / "train.py"), str(tmp_path / "steps.py"))
    assert not project.reads(str(tmp_path / "train.py"), str(tmp_path / "other.py"))


def test_class_family_follows_a_base_class_in_a_sibling(tmp_path):
    # roles.class_family: a LightningModule / Trainer subclass whose base is a class of a sibling module
    _write(tmp_path, {
        "pyproject.toml": "",
        "base_module.py": "import lightning as L\nfrom transformers import Trainer\n\n\n"
                          "class BaseModule(L.LightningModule):\n    pass\n\n\nclass BaseTrainer(Trainer):\n    pass\n",
        "train.py": "from base_module import BaseModule, BaseTrainer\n\n\nclass Net(BaseModule):\n    pass\n\n\n"
                    "class MyTrainer(BaseTrainer):\n    pass\n\n\nclass Other(Unknown):\n    pass\n",
    })
    import libcst as cst

    from bertlint.context import FileContext

    path = str(tmp_path / "train.py")
    src = open(path).read()
    ctx = FileContext(path, src, cst.parse_module(src), None)
    cls = ctx.symbols.classes
    assert ctx.roles.class_family(cls["Net"]) == "lightning_module"
    assert ctx.roles.class_base(cls["Net"]) == "lightning.LightningModule"
    assert ctx.roles.class_family(cls["MyTrainer"]) == "trainer"
    assert ctx.roles.class_family(cls["Other"]) is None


def test_roles_of_values_built_by_a_siblings_factory(tmp_path):
    _write(tmp_path, {
        "pyproject.toml": "",
        "optim_utils.py": "import torch\nfrom timm.scheduler import CosineLRScheduler\n\n\n"
                          "def make(cfg, model):\n    return torch.optim.AdamW(model.parameters(), lr=cfg.lr)\n\n\n"
                          "def sched(cfg, opt):\n    return CosineLRScheduler(opt, t_initial=cfg.epochs)\n\n\n"
                          "def both(cfg, model):\n    opt = torch.optim.SGD(model.parameters(), lr=0.1)\n"
                          "    return model, opt\n",
        "train.py": "import optim_utils\nfrom optim_utils import make\n\n\ndef main(cfg, model):\n"
                    "    tool = make(cfg, model)\n    s = optim_utils.sched(cfg, tool)\n"
                    "    net, o2 = optim_utils.both(cfg, model)\n",
    })
    import libcst as cst

    from bertlint.context import FileContext

    path = str(tmp_path / "train.py")
    src = open(path).read()
    ctx = FileContext(path, src, cst.parse_module(src), None)
    fn = ctx.symbols.functions["main"][0]
    tool = ctx.roles.of("tool", fn)
    assert (tool.role, tool.qualname, tool.confident) == ("optimizer", "torch.optim.AdamW", True)
    assert "optim_utils.py" in tool.why
    assert ctx.roles.of("s", fn).qualname == "timm.scheduler.CosineLRScheduler"
    assert ctx.roles.of("o2", fn).qualname == "torch.optim.SGD"


def test_module_imported_from_its_package(tmp_path):
    # ``from . import steps`` / ``import pkg.steps as st`` then ``steps.f(...)``: the module's function is followed
    _write(tmp_path, {
        "setup.py": "",
        "pkg/__init__.py": "",
        "pkg/steps.py": HELPER,
        "pkg/a.py": LOOP.format(imp="from . import steps", call="steps.backward_micro_batch(loss)"),
        "b.py": LOOP.format(imp="import pkg.steps as st", call="st.backward_micro_batch(loss)"),
    })
    assert _codes(str(tmp_path / "pkg" / "a.py")) == [("BL103", 10)]
    assert _codes(str(tmp_path / "b.py")) == [("BL103", 10)]


def test_an_attribute_holding_a_sibling_instance_is_called(tmp_path):
    # ``self.scaler = Step()`` in __init__, ``self.scaler(loss)`` in the loop: Step.__call__ (in the sibling) runs
    _write(tmp_path, {
        "pyproject.toml": "",
        "amp_step.py": "class Step:\n    def __call__(self, loss):\n        loss.backward()\n",
        "train.py": textwrap.dedent('''\
            import torch
            from amp_step import Step

            GRAD_ACCUM = 4


            class Runner:
                def __init__(self, model, optimizer):
                    self.model = model
                    self.optimizer = optimizer
                    self.scaler = Step()

                def train(self, loader):
                    for step, (x, y) in enumerate(loader):
                        loss = torch.nn.functional.cross_entropy(self.model(x), y)
                        self.scaler(loss)
                        if (step + 1) % GRAD_ACCUM == 0 or step + 1 == len(loader):
                            self.optimizer.step()
                            self.optimizer.zero_grad()
            '''),
    })
    assert _codes(str(tmp_path / "train.py")) == [("BL103", 16)]


_MP = '''
import torch


class MixedPrecision:
    def __init__(self, model):
        self.model = model

    def zero_grad(self):
        for p in self.model.parameters():
            p.grad = None

    def backward(self, loss):
        loss.backward()

    def optimize(self, opt):
        opt.step()
'''

_TWO_LOOPS = '''
import torch
from mp_util import MixedPrecision


class Trainer:
    def __init__(self, model, microbatch):
        self.model = model
        self.mp = MixedPrecision(model)
        self.opt = torch.optim.AdamW(model.parameters())
        self.microbatch = microbatch

    def run_loop(self, data, steps):
        for _ in range(steps):
            self.run_step(next(data))

    def run_step(self, batch):
        self.forward_backward(batch)
        self.mp.optimize(self.opt)

    def forward_backward(self, batch):
        self.mp.zero_grad()
        for i in range(0, batch.shape[0], self.microbatch):
            loss = self.model(batch[i:i + self.microbatch]).mean(){div}
            self.mp.backward(loss)


class DistillTrainer(Trainer):
    def run_loop(self, data, steps):
        for _ in range(steps):
            self.run_step(next(data))

    def run_step(self, batch):
        self.forward_backward(batch)
        self.mp.optimize(self.opt)

    def forward_backward(self, batch):
        self.mp.zero_grad()
        for i in range(0, batch.shape[0], self.microbatch):
            micro = batch[i:i + self.microbatch]
            loss = (self.model(micro) - self.model(micro).detach()).pow(2).mean(){div}
            self.mp.backward(loss)
'''


def test_sibling_helper_reached_from_two_loops_is_two_findings(tmp_path):
    """The same sibling `backward` reached from two micro-batch loops of this file (a base trainer and a subclass
    overriding its driving loop and `forward_backward`): each loop's missing 1/N is its own finding, anchored at its own call (they used
    to be merged into the first call's line)."""
    _write(tmp_path, {"mp_util.py": _MP, "train.py": _TWO_LOOPS.format(div="")})
    got = [c for c in _codes(str(tmp_path / "train.py")) if c[0] == "BL103"]
    assert [row for _, row in got] == [25, 42]


def test_sibling_helper_two_loops_divided_stay_silent(tmp_path):
    """Both loops divide by the number of micro-batches: nothing."""
    div = " / (len(batch) // self.microbatch)"
    _write(tmp_path, {"mp_util.py": _MP, "train.py": _TWO_LOOPS.format(div=div)})
    assert [c for c in _codes(str(tmp_path / "train.py")) if c[0] == "BL103"] == []
