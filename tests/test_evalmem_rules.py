"""Evaluation and memory rules: BL206, BL501, BL502, BL506 (and the shared ``ctx.evalflow`` analysis).

Cases are whole small scripts; each asserts the exact (code, line) pairs reported for these four codes, so a new
false positive or a lost finding fails. Fixes are applied and re-linted. Weird code must give no exception and no
finding."""

from __future__ import annotations

import json
import textwrap
import warnings
from pathlib import Path

import libcst as cst
import pytest

from bertlint.api import apply_fixes, fix_text, lint_text
from bertlint.config import Settings

ROOT = Path(__file__).resolve().parent.parent
CODES = ("BL206", "BL501", "BL502", "BL506")


def lint(src: str, filename: str = "train.py", codes=CODES):
    return [d for d in lint_text(textwrap.dedent(src), filename, Settings()) if d.code in codes]


def found(src: str, filename: str = "train.py", codes=CODES) -> list[tuple[str, int]]:
    return sorted((d.code, d.start.row) for d in lint(src, filename, codes))


def marked(src: str) -> list[tuple[str, int]]:
    """(code, line) pairs marked with ``# expect: CODE`` in ``src``."""
    out = []
    for i, line in enumerate(textwrap.dedent(src).splitlines(), start=1):
        if "# expect:" in line:
            for c in line.split("# expect:")[1].split(","):
                out.append((c.strip().split()[0], i))
    return sorted(out)


def check(src: str, filename: str = "train.py", codes=CODES) -> None:
    assert found(src, filename, codes) == [m for m in marked(src) if m[0] in codes]


# ---------------------------------------------------------------------------------------------------- fixtures
def _fixtures():
    return sorted((ROOT / "fixtures" / "evalmem").glob("*.py"))


@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.name)
def test_evalmem_fixture(path: Path):
    expect = json.loads(path.with_suffix("").with_suffix(".expect.json").read_text()) if False else json.loads(
        (path.parent / (path.stem + ".expect.json")).read_text())
    want = sorted((f["code"], f["line"]) for f in expect["findings"])
    got = sorted((d.code, d.start.row) for d in lint_text(path.read_text(), str(path), Settings())
                 if d.code in CODES)
    mine = sorted((c, l) for c, l in want if c in CODES)
    assert got == mine, f"{path.name}: expected {mine}, got {got}"
    for f in expect["findings"]:
        if f.get("confirmable"):
            assert "bad" in path.stem, "only buggy scripts carry confirmable findings"


def test_fixture_set_shape():
    names = [p.stem for p in _fixtures()]
    assert len(names) >= 8
    confirmable = set()
    for p in _fixtures():
        for f in json.loads((p.parent / (p.stem + ".expect.json")).read_text())["findings"]:
            if f.get("confirmable"):
                confirmable.add(f["code"])
    assert {"BL501", "BL502", "BL506"} <= confirmable


# ---------------------------------------------------------------------------------------------------- BL502
def test_bl502_eval_mode_and_function_name():
    check("""
        import torch

        def evaluate(model, loader):
            model.eval()
            for batch in loader:
                out = model(**batch)  # expect: BL502

        def run(net, loader):
            net.eval()
            for x in loader:
                net(x)  # expect: BL502

        def predict(model, loader):
            preds = []
            for batch in loader:
                preds.append(model(**batch).logits.argmax(-1))  # expect: BL502
            return preds
        """)


def test_bl502_not_under_no_grad_any_level():
    check("""
        import torch
        from torch import no_grad
        import torch as th

        @torch.no_grad()
        def evaluate(model, loader):
            for b in loader:
                model(**b)

        @torch.inference_mode()
        def validate(model, loader):
            for b in loader:
                model(**b)

        def test_loop(model, loader):
            model.eval()
            with no_grad():
                for b in loader:
                    model(**b)

        def predict(model, loader):
            with th.inference_mode():
                if True:
                    for b in loader:
                        model(**b)

        def evaluation(model, loader):
            torch.set_grad_enabled(False)
            for b in loader:
                model(**b)

        def infer(model, loader, train):
            with torch.set_grad_enabled(train):
                for b in loader:
                    model(**b)
        """)


def test_bl502_caller_under_no_grad_and_callbacks():
    check("""
        import torch

        def evaluate(model, loader):
            model.eval()
            for b in loader:
                model(**b)

        def validate(model, loader):
            model.eval()
            for b in loader:
                model(**b)

        def main(model, loader):
            with torch.no_grad():
                evaluate(model, loader)
            hooks = [validate]
            return hooks
        """)


def test_bl502_enable_grad_inside_no_grad_is_reported():
    check("""
        import torch

        @torch.no_grad()
        def evaluate(model, loader):
            model.eval()
            with torch.enable_grad():
                for b in loader:
                    model(**b)  # expect: BL502
        """)


def test_bl502_training_loops_and_frameworks_not_reported():
    check("""
        import torch
        import lightning as L
        from transformers import Trainer

        def evaluate(model, loader, optimizer):
            model.eval()
            for b in loader:
                loss = model(**b).loss
                loss.backward()

        def validate(model, loader, scaler, optimizer):
            for b in loader:
                scaler.scale(model(**b).loss).backward()

        def eval_saliency(model, loader):
            model.eval()
            for x in loader:
                out = model(x)
                g = torch.autograd.grad(out.sum(), x)

        def step(model, batch, opt):
            model(**batch).loss.backward()
            opt.step()

        def test(model, loader, opt):
            model.eval()
            for b in loader:
                step(model, b, opt)

        class Lit(L.LightningModule):
            def validation_step(self, batch, idx):
                for c in batch:
                    self.model(c)

        class MyTrainer(Trainer):
            def evaluate_chunks(self, loader):
                for b in loader:
                    self.model(**b)

        def hf(trainer):
            return trainer.evaluate()

        def generate(model, loader):
            model.eval()
            for b in loader:
                model.generate(**b)
        """)


def test_bl502_deferred_backward_after_loop_not_reported():
    check("""
        import torch

        def evaluate_then_learn(model, loader):
            model.eval()
            total = 0
            for b in loader:
                total = total + model(**b).loss
            total.backward()
        """)


def test_bl502_train_then_eval_in_epoch_loop():
    check("""
        import torch
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
        opt = torch.optim.AdamW(model.parameters())

        for epoch in range(3):
            model.train()
            for batch in train_loader:
                model(**batch).loss.backward()
                opt.step()
                opt.zero_grad()
            model.eval()
            for batch in val_loader:
                out = model(**batch)  # expect: BL502
            model.train()
            for batch in val_loader:
                out = model(**batch)
        """)


def test_bl502_not_models_not_reported():
    check("""
        import torch
        from transformers import pipeline, AutoTokenizer

        classifier = pipeline("sentiment-analysis")
        tokenizer = AutoTokenizer.from_pretrained("bert-base-uncased")

        def predict(texts):
            out = []
            for t in texts:
                out.append(classifier(t))
                tokenizer(t)
            return out

        def evaluate(loader, metric_fn):
            for b in loader:
                metric_fn(b)
        """)


def test_bl502_frozen_model_not_reported():
    check("""
        import torch

        def evaluate(model, loader):
            model.requires_grad_(False)
            model.eval()
            for b in loader:
                model(**b)
        """)


def test_bl502_other_frameworks_not_reported():
    check("""
        import tensorflow as tf
        import torch

        def evaluate(model, ds):
            for x in ds:
                model(x, training=False)
        """)


def test_bl502_fix_wraps_loop_and_reindents():
    src = textwrap.dedent("""\
        import torch


        def evaluate(model, loader):
            model.eval()
            correct = 0
            for batch in loader:
                logits = model(**batch).logits
                # count hits
                correct += (logits.argmax(-1) == batch["labels"]).sum().item()
            return correct
        """)
    diags = lint(src)
    assert [d.code for d in diags] == ["BL502"]
    assert diags[0].fix is not None and diags[0].fix.applicability.value == "safe"
    res = apply_fixes(src, diags)
    assert res.applied
    assert "    with torch.no_grad():\n        for batch in loader:\n            logits = model" in res.text
    assert "            # count hits\n" in res.text
    cst.parse_module(res.text)
    assert lint(res.text) == []


def test_bl502_no_fix_when_multiline_string_in_loop():
    src = '''
        import torch

        def evaluate(model, loader):
            model.eval()
            for b in loader:
                model(**b)
                print("""a
        b""")
        '''
    diags = lint(src)
    assert [d.code for d in diags] == ["BL502"] and diags[0].fix is None


def test_bl502_fix_with_torch_alias():
    src = textwrap.dedent("""\
        import torch as th

        def validate(net, loader):
            net.eval()
            while True:
                net(next(loader))
        """)
    diags = lint(src)
    assert [d.code for d in diags] == ["BL502"]
    res = apply_fixes(src, diags)
    assert "    with th.no_grad():\n        while True:\n            net(next(loader))\n" in res.text


# ---------------------------------------------------------------------------------------------------- BL501
def test_bl501_forms_in_eval_are_errors():
    src = """
        import torch
        import torch.nn.functional as F

        def evaluate(model, loader):
            model.eval()
            total = 0
            tot2 = 0.0
            losses, outs = [], []
            acc = torch.empty(0)
            for x, y in loader:
                logits = model(x)
                loss = F.cross_entropy(logits, y)
                total += loss  # expect: BL501
                tot2 = tot2 + loss * 2  # expect: BL501
                losses.append(loss)  # expect: BL501
                outs.extend(logits)  # expect: BL501
                acc = torch.cat([acc, logits.softmax(-1)])  # expect: BL501
            return total, tot2, losses, outs, acc
        """
    diags = lint(src, codes=("BL501",))
    assert sorted((d.code, d.start.row) for d in diags) == marked(src)
    assert {d.severity.value for d in diags} == {"E"}


def test_bl501_training_is_warning():
    src = """
        import torch

        def train(model, loader, optimizer, criterion):
            running = 0
            for x, y in loader:
                out = model(x)
                loss = criterion(out, y)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
                running += loss  # expect: BL501
            print(running / len(loader))
        """
    diags = lint(src, codes=("BL501",))
    assert sorted((d.code, d.start.row) for d in diags) == marked(src)
    assert diags[0].severity.value == "W"
    assert "graph" in diags[0].message and "417" in diags[0].message


def test_bl501_sanitised_values_not_reported():
    check("""
        import torch

        def train(model, loader, optimizer):
            running, preds, floats, detached, n = 0.0, [], 0.0, [], 0
            for batch in loader:
                out = model(**batch)
                loss = out.loss
                loss.backward()
                optimizer.step()
                running += loss.item()
                preds.append(out.logits.argmax(-1))
                floats += float(loss)
                detached.append(out.logits.detach().cpu())
                n += (out.logits.argmax(-1) == batch["labels"]).sum()
                preds.append(out.logits.cpu().numpy())
                preds.append(loss.tolist())
        """)


def test_bl501_under_no_grad_not_reported():
    check("""
        import torch

        def evaluate(model, loader):
            total = 0
            with torch.no_grad():
                for b in loader:
                    total += model(**b).loss
            return total

        def evaluate2(model, loader):
            total = 0
            for b in loader:
                with torch.no_grad():
                    out = model(**b)
                total += out.loss
            return total
        """)


def test_bl501_deferred_backward_is_bl113_not_bl501():
    check("""
        import torch

        def train(model, loader, optimizer, N=4):
            total = 0
            for i, b in enumerate(loader):
                total = total + model(**b).loss / N
                if (i + 1) % N == 0:
                    total.backward()
                    optimizer.step()
                    optimizer.zero_grad()
                    total = 0

        def train2(model, loader, optimizer):
            losses = []
            for b in loader:
                losses.append(model(**b).loss)
            loss = torch.stack(losses).mean()
            loss.backward()

        def train3(model, loader, accelerator):
            total = 0
            for b in loader:
                total += model(**b).loss
            accelerator.backward(total)
        """)


def test_bl501_reinitialised_in_loop_not_reported():
    check("""
        import torch

        def train(model, loader, optimizer):
            window = []
            for step, b in enumerate(loader):
                loss = model(**b).loss
                loss.backward()
                window.append(loss)
                if step % 10 == 0:
                    print(sum(window))
                    window = []

        def train2(model, loader, optimizer):
            for b in loader:
                total = 0
                loss = model(**b).loss
                total += loss
                total.backward()
        """)


def test_bl501_unclear_intent_not_reported():
    check("""
        import torch

        def compute(model, batches):
            total = 0
            for b in batches:
                total = total + model(**b).loss
            return total

        def main(model, batches):
            loss = compute(model, batches)
            loss.backward()
        """)


def test_bl501_non_tensor_metrics_not_reported():
    check("""
        import torch

        def evaluate(model, loader, metric):
            total = 0
            names = []
            for b in loader:
                total += len(b)
                names.append(b["id"])
                metric.add_batch(predictions=model(**b).logits.argmax(-1), references=b["labels"])
            return total
        """, codes=("BL501",))


def test_bl501_fix_item_and_detach():
    src = textwrap.dedent("""\
        import torch


        def train(model, loader, optimizer):
            total_loss = 0
            logits = []
            for batch in loader:
                out = model(**batch)
                out.loss.backward()
                optimizer.step()
                total_loss += out.loss
                logits.append(out.logits)
            print(total_loss / len(loader))
        """)
    diags = lint(src, codes=("BL501",))
    assert [d.start.row for d in diags] == [11, 12]
    fixes = {d.start.row: d.fix for d in diags}
    assert fixes[11].edits[0].content == "out.loss.item()" and fixes[11].applicability.value == "safe"
    assert fixes[12].edits[0].content == "out.logits.detach()" and fixes[12].applicability.value == "safe"
    res = apply_fixes(src, diags)
    assert len(res.applied) == 2
    assert lint(res.text, codes=("BL501",)) == []


def test_bl501_item_fix_unsafe_when_used_as_tensor_later():
    src = """
        import torch

        def evaluate(model, loader):
            model.eval()
            total_loss = 0
            for b in loader:
                total_loss += model(**b).loss
            return total_loss.item() / len(loader)
        """
    diags = lint(src, codes=("BL501",))
    assert len(diags) == 1 and diags[0].fix.applicability.value == "unsafe"


# ---------------------------------------------------------------------------------------------------- BL506
def test_bl506_sources_and_sinks():
    check("""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from transformers import AutoModelForSequenceClassification

        model = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")
        emb = nn.Embedding(100, 8)
        clf = nn.Sequential(nn.Linear(8, 2), nn.ReLU())
        opt = torch.optim.AdamW(list(model.parameters()) + list(clf.parameters()))

        with torch.inference_mode():
            ids = torch.randint(0, 100, (32, 16))
            feats = torch.randn(32, 8)
            y = torch.randint(0, 2, (32,))

        for i in range(0, 32, 8):
            loss = model(input_ids=ids[i:i + 8]).loss  # expect: BL506
            loss.backward()
        for row, label in zip(feats, y):
            out = clf(row)  # expect: BL506
            F.cross_entropy(out.unsqueeze(0), label.unsqueeze(0)).backward()  # expect: BL506
        """)


def test_bl506_not_reported_for_new_tensors_and_no_grad():
    check("""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F

        head = nn.Linear(8, 2)

        def a(encoder, ids, labels, opt):
            with torch.inference_mode():
                f = encoder(ids).last_hidden_state[:, 0]
            g = f * 1
            loss = F.cross_entropy(head(g), labels)
            loss.backward()

        def b(encoder, ids, labels, opt):
            with torch.no_grad():
                f = encoder(ids).last_hidden_state[:, 0]
            F.cross_entropy(head(f), labels).backward()

        def c(encoder, ids, labels, opt, idx):
            with torch.inference_mode():
                f = encoder(ids).last_hidden_state[:, 0]
            F.cross_entropy(head(f[idx]), labels).backward()  # advanced index: a new tensor

        def d(encoder, ids, labels):
            with torch.inference_mode():
                f = encoder(ids).last_hidden_state[:, 0]
                p = head(f)  # inside the block: no autograd
            return p

        def e(encoder, ids, labels):
            with torch.inference_mode():
                f = encoder(ids).last_hidden_state[:, 0]
            return F.cross_entropy(head(f), labels).item()  # no backward anywhere

        def f2(encoder, ids, labels):
            with torch.inference_mode(False):
                f = encoder(ids).last_hidden_state[:, 0]
            F.cross_entropy(head(f), labels).backward()

        def g(encoder, ids, labels):
            with torch.inference_mode():
                f = encoder(ids).last_hidden_state[:, 0]
            f = f.clone()
            F.cross_entropy(head(f), labels).backward()
        """)


def test_bl506_fix_replaces_inference_mode():
    src = textwrap.dedent("""\
        import torch
        import torch.nn.functional as F

        head = torch.nn.Linear(4, 2)
        with torch.inference_mode():
            x = torch.randn(8, 4)
        F.cross_entropy(head(x), torch.zeros(8, dtype=torch.long)).backward()
        """)
    diags = lint(src, codes=("BL506",))
    assert [d.start.row for d in diags] == [7]
    res = apply_fixes(src, diags)
    assert "with torch.no_grad():" in res.text
    assert lint(res.text, codes=("BL506",)) == []
    # and the fixed script runs where the original raises
    import torch

    ns: dict = {}
    with pytest.raises(RuntimeError, match="Inference tensors"):
        exec(compile(src, "bad.py", "exec"), ns)
    exec(compile(res.text, "good.py", "exec"), {})


# ---------------------------------------------------------------------------------------------------- BL206
def test_bl206_spellings_and_fix():
    src = textwrap.dedent("""\
        import torch
        from torch.cuda.amp import autocast, GradScaler
        import torch.cuda.amp as amp

        scaler = torch.cuda.amp.GradScaler(enabled=False)
        s2 = GradScaler(2.0 ** 10, enabled=False)
        with autocast(False):
            pass
        with amp.autocast(enabled=False, dtype=torch.bfloat16):
            pass
        with torch.autocast("cpu", enabled=False):
            pass
        """)
    diags = lint(src, codes=("BL206",))
    assert [d.start.row for d in diags] == [5, 6, 7, 9]
    assert all(d.severity.value == "I" for d in diags)
    res = apply_fixes(src, diags)
    assert len(res.applied) == 4
    assert 'torch.amp.GradScaler("cuda", enabled=False)' in res.text
    assert 'torch.amp.GradScaler("cuda", 2.0 ** 10, enabled=False)' in res.text
    assert 'torch.amp.autocast("cuda", enabled=False)' in res.text
    assert 'torch.amp.autocast("cuda", enabled=False, dtype=torch.bfloat16)' in res.text
    assert lint(res.text, codes=("BL206",)) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        exec(compile(res.text, "fixed.py", "exec"), {})


def test_bl206_import_only_and_old_torch_not_reported(tmp_path):
    assert found("""
        import torch
        from torch.cuda.amp import GradScaler
        x = torch.amp.GradScaler("cuda")
        """) == []
    from bertlint.api import lint_path
    from bertlint.config import clear_caches, load_settings

    (tmp_path / "pyproject.toml").write_text('[tool.bertlint]\ntarget-versions = { torch = "2.2.0" }\n')
    p = tmp_path / "train.py"
    p.write_text("import torch\nscaler = torch.cuda.amp.GradScaler()\n")
    clear_caches()
    assert [d for d in lint_path(str(p), load_settings(str(p))) if d.code == "BL206"] == []


def test_bl206_no_fix_without_torch_module_name():
    src = "from torch.cuda.amp import GradScaler\nscaler = GradScaler()\n"
    diags = lint(src, codes=("BL206",))
    assert len(diags) == 1 and diags[0].fix is None


# ---------------------------------------------------------------------------------------------------- weird code
WEIRD = [
    "",
    "import torch\n",
    "import torch\nexec('for b in loader: model(b)')\n",
    "import torch\nfor _ in []: pass\n",
    "import torch\nf = lambda model, xs: [model(x) for x in xs]\n",
    """
import torch
def evaluate(model, loader):
    model.eval()
    for batch in loader:
        getattr(model, "forward")(batch)
        models[0](batch)
        model.module.layers[0](batch)
""",
    """
import torch
async def evaluate(model, loader):
    model.eval()
    async for b in loader:
        total = 0
        total += await model(b)
""",
    """
import torch
def evaluate(model, loader):
    while (b := next(loader, None)) is not None:
        match b:
            case {"x": x}:
                pass
""",
    """
import torch
def evaluate(*args, **kwargs):
    total = 0
    for b in args[1]:
        total += args[0](**b).loss.item()
    return total
def evaluate(model):
    return evaluate(model)
""",
    """
import torch
class A:
    def evaluate(self):
        self.evaluate()
        for b in self.loader:
            self.model(b).loss.backward()
def predict(x):
    return predict(x)
""",
    """
import torch
with torch.inference_mode():
    a, *b = torch.randn(3, 2)
    c = d = torch.zeros(1)
    e[0] = torch.ones(1)
for x in b:
    print(x)
del a
""",
    """
import torch
from torch.cuda.amp import *
scaler = GradScaler()
with torch.cuda.amp.autocast(*args):
    pass
torch.cuda.amp.custom_fwd(device_type="cuda")
""",
    """
import torch
def evaluate(model, loader):
    model.eval()
    for b in loader:
        global total
        total += model(b)
        nonlocal_thing = lambda: model(b)
""",
]


@pytest.mark.parametrize("src", WEIRD, ids=[f"weird{i}" for i in range(len(WEIRD))])
def test_weird_code_no_exception(src):
    diags = lint_text(src, "weird.py", Settings())
    assert not [d for d in diags if d.code == "BL001"]
    mine = [(d.code, d.start.row) for d in diags if d.code in ("BL501", "BL502", "BL506")]
    if "global total" in src:  # an evaluation forward after model.eval(): BL502 is right; BL501 must stay silent
        assert mine == [("BL502", 7)]
    else:
        assert mine == []


def test_weird_bl206_star_args_reported_without_fix():
    src = "import torch\nwith torch.cuda.amp.autocast(*args):\n    pass\n"
    diags = lint(src, codes=("BL206",))
    assert len(diags) == 1 and diags[0].fix is None


def test_fix_text_rounds_converge_on_bad_fixture():
    path = ROOT / "fixtures" / "evalmem" / "eval_no_grad_bad.py"
    out = fix_text(path.read_text(), str(path), Settings())
    text = out[0] if isinstance(out, tuple) else getattr(out, "text", out)
    assert isinstance(text, str)
    cst.parse_module(text)
    assert [d for d in lint_text(text, str(path), Settings()) if d.code in ("BL501", "BL502")] == []


def test_bl502_computed_context_managers_and_train_false():
    check("""
        import contextlib
        import torch

        def run_epoch(model, loader, train):
            model.train(train)
            ctx = torch.no_grad() if not train else contextlib.nullcontext()
            with ctx:
                for b in loader:
                    model(**b)

        def evaluate(model, loader, train=False):
            with torch.no_grad() if not train else contextlib.nullcontext():
                for b in loader:
                    model(**b)

        def validate(model, loader):
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                for b in loader:
                    model(**b)

        def score(model, loader):
            model.train(False)
            for b in loader:
                model(**b)  # expect: BL502
        """)


def test_bl206_version_guarded_fallbacks_not_reported():
    check("""
        import torch
        from packaging import version

        def make_scaler(**kwargs):
            if version.parse(torch.__version__) >= version.parse("2.3"):
                return torch.amp.GradScaler("cuda", **kwargs)
            else:
                return torch.cuda.amp.GradScaler(**kwargs)

        def make_autocast():
            try:
                return torch.amp.autocast("cuda")
            except AttributeError:
                return torch.cuda.amp.autocast()

        ctx = torch.amp.autocast("cuda") if hasattr(torch, "amp") else torch.cuda.amp.autocast()
        scaler = torch.cuda.amp.GradScaler()  # expect: BL206
        """)


def test_bl502_same_file_decorators_and_managers():
    check("""
        import contextlib
        import functools
        import torch

        def no_grad_eval(fn):
            @functools.wraps(fn)
            def wrapper(*a, **k):
                with torch.no_grad():
                    return fn(*a, **k)
            return wrapper

        @contextlib.contextmanager
        def evaluating(model):
            model.eval()
            with torch.no_grad():
                yield

        @no_grad_eval
        def evaluate(model, loader):
            model.eval()
            for b in loader:
                model(**b)

        def validate(model, loader):
            with evaluating(model):
                for b in loader:
                    model(**b)

        def predict(model, loader):
            with maybe_no_grad(True):
                for b in loader:
                    model(**b)
        """)


def test_real_world_correct_patterns_are_silent():
    check("""
        import torch
        import torch.nn.functional as F
        from accelerate import Accelerator

        accelerator = Accelerator()

        def no_trainer_eval(model, eval_dataloader, metric):
            model.eval()
            losses = []
            for step, batch in enumerate(eval_dataloader):
                with torch.no_grad():
                    outputs = model(**batch)
                loss = outputs.loss
                losses.append(accelerator.gather_for_metrics(loss.repeat(8)))
                predictions = outputs.logits.argmax(dim=-1)
                predictions, references = accelerator.gather_for_metrics((predictions, batch["labels"]))
                metric.add_batch(predictions=predictions, references=references)
            return torch.cat(losses)

        def no_trainer_train(model, train_dataloader, optimizer, lr_scheduler):
            model.train()
            total_loss = 0
            for step, batch in enumerate(train_dataloader):
                with accelerator.accumulate(model):
                    outputs = model(**batch)
                    loss = outputs.loss
                    total_loss += loss.detach().float()
                    accelerator.backward(loss)
                    optimizer.step()
                    lr_scheduler.step()
                    optimizer.zero_grad()
            return total_loss

        def repackage_hidden(h):
            if isinstance(h, torch.Tensor):
                return h.detach()
            return tuple(repackage_hidden(v) for v in h)

        def word_lm_train(model, data, optimizer, criterion):
            model.train()
            total_loss = 0.
            hidden = model.init_hidden(20)
            for i, (x, y) in enumerate(data):
                hidden = repackage_hidden(hidden)
                model.zero_grad()
                output, hidden = model(x, hidden)
                loss = criterion(output, y)
                loss.backward()
                optimizer.step()
                total_loss += loss.item()

        def mnist_test(model, device, test_loader):
            model.eval()
            test_loss = 0
            correct = 0
            with torch.no_grad():
                for data, target in test_loader:
                    data, target = data.to(device), target.to(device)
                    output = model(data)
                    test_loss += F.nll_loss(output, target, reduction='sum').item()
                    pred = output.argmax(dim=1, keepdim=True)
                    correct += pred.eq(target.view_as(pred)).sum().item()
            return test_loss, correct

        def kaggle_eval_fn(data_loader, model, device):
            model.eval()
            fin_targets, fin_outputs = [], []
            with torch.no_grad():
                for bi, d in enumerate(data_loader):
                    outputs = model(ids=d["ids"], mask=d["mask"])
                    fin_targets.extend(d["targets"].cpu().detach().numpy().tolist())
                    fin_outputs.extend(torch.sigmoid(outputs).cpu().detach().numpy().tolist())
            return fin_outputs, fin_targets

        def old_bert_eval(model, eval_dataloader):
            model.eval()
            eval_loss = 0
            for input_ids, input_mask, segment_ids, label_ids in eval_dataloader:
                with torch.no_grad():
                    tmp_eval_loss = model(input_ids, segment_ids, input_mask, label_ids)
                    logits = model(input_ids, segment_ids, input_mask)
                logits = logits.detach().cpu().numpy()
                eval_loss += tmp_eval_loss.mean().item()
            return eval_loss

        def reinforce(policy, env, optimizer):
            policy.eval()
            log_probs, rewards = [], []
            obs = env.reset()
            for t in range(100):
                dist = policy(obs)
                action = dist.sample()
                log_probs.append(dist.log_prob(action))
                obs, r, done, _ = env.step(action)
                rewards.append(r)
            loss = -(torch.stack(log_probs) * torch.tensor(rewards)).sum()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        """)


def test_bl506_frozen_module_not_reported():
    check("""
        import torch
        import torch.nn as nn
        import torch.nn.functional as F
        from transformers import AutoModel

        encoder = AutoModel.from_pretrained("bert-base-uncased")
        encoder.requires_grad_(False)
        head = nn.Linear(768, 2)
        opt = torch.optim.AdamW(head.parameters())

        with torch.inference_mode():
            ids = torch.randint(0, 100, (32, 16))
        for i in range(0, 32, 8):
            feats = encoder(input_ids=ids[i:i + 8]).pooler_output
            loss = head(feats).sum()
            loss.backward()
        """)


def test_bl501_returned_result_differentiated_by_caller_not_reported():
    check("""
        import torch

        def validation_loss(model, batches):
            total = 0
            for b in batches:
                total = total + model(**b).loss
            return total / len(batches)

        def meta_step(model, batches, hyper_opt):
            vloss = validation_loss(model, batches)
            vloss.backward()
            hyper_opt.step()

        def evaluate(model, batches):
            model.eval()
            total = 0
            for b in batches:
                total = total + model(**b).loss  # expect: BL501
            return total / len(batches)

        def report(model, batches):
            print(float(evaluate(model, batches)))
        """, codes=("BL501",))


def test_bl502_comprehensions():
    src = textwrap.dedent("""\
        import torch


        def evaluate(model, loader):
            model.eval()
            preds = [model(**b).logits.argmax(-1) for b in loader]  # expect: BL502
            return torch.cat(preds)


        def predict(model, batches):
            return torch.cat([model(x) for x in batches])  # expect: BL502


        def fine(model, loader):
            model.eval()
            with torch.no_grad():
                preds = [model(**b).logits for b in loader]
            return preds


        def train(model, loader, opt):
            for batch in loader:
                losses = [model(**mb).loss for mb in batch]
                sum(losses).backward()
                opt.step()


        def evaluate_window(model, loader):
            model.eval()
            losses = [model(**b).loss for b in loader]
            torch.stack(losses).mean().backward()
        """)
    diags = lint(src, codes=("BL502",))
    assert sorted((d.code, d.start.row) for d in diags) == marked(src)
    res = apply_fixes(src, diags)
    assert "    with torch.no_grad():\n        preds = [model(**b).logits.argmax(-1) for b in loader]" in res.text
    assert "    with torch.no_grad():\n        return torch.cat([model(x) for x in batches])" in res.text
    assert lint(res.text, codes=("BL502",)) == []


def test_bl501_item_fix_safe_only_for_scalar_losses():
    src = """
        import torch
        import torch.nn as nn

        crit = nn.CrossEntropyLoss(reduction="none")

        def train(model, loader, optimizer):
            a = 0.0
            b = 0.0
            for x, y in loader:
                out = model(x)
                hf_loss = out.loss
                per_item_loss = crit(out.logits, y)
                hf_loss.backward()
                optimizer.step()
                a += hf_loss
                b += per_item_loss
            print(a / 10, b / 10)
        """
    diags = {d.start.row: d for d in lint(src, codes=("BL501",))}
    assert sorted(diags) == [16, 17]
    assert diags[16].fix.applicability.value == "safe" and diags[16].fix.edits[0].content == "hf_loss.item()"
    assert diags[17].fix.applicability.value == "unsafe"


def test_bl502_gradient_users_not_reported():
    check("""
        import torch
        from captum.attr import Saliency

        def evaluate_saliency(model, loader):
            model.eval()
            sal = Saliency(model)
            for x, y in loader:
                x.requires_grad_()
                out = model(x)
                maps = sal.attribute(x, target=y)

        def test_jacobian(model, loader):
            model.eval()
            for x in loader:
                out = model(x)
                j = torch.autograd.functional.jacobian(model, x)
        """)


# ------------------------------------------------------------------- evaluation flow across calls (issue 14)
def test_function_handed_to_a_thread_or_partial_starts_with_grad_on():
    check("""
        import threading
        from functools import partial
        import torch

        model = torch.nn.Linear(4, 2)

        def score(loader):
            model.eval()
            for x in loader:
                print(model(x))  # expect: BL502

        def score_later(tag, loader):
            model.eval()
            for x in loader:
                print(model(x))  # expect: BL502

        threading.Thread(target=score, args=([torch.randn(2, 4)],)).start()
        run = partial(score_later, "val")
        run([torch.randn(2, 4)])
    """)


def test_function_handed_to_a_hook_or_called_under_no_grad_stays_unknown():
    check("""
        import torch

        model = torch.nn.Linear(4, 2)

        def probe(loader):
            model.eval()
            for x in loader:
                print(model(x))

        def hook(module, inp, out):
            model.eval()
            for x in inp:
                print(model(x))

        model.register_forward_hook(hook)
        with torch.no_grad():
            list(map(probe, [[torch.randn(2, 4)]]))
    """)


def test_evaluate_method_is_framework_owned_only_in_a_framework_class():
    check("""
        import torch
        from transformers import Trainer

        class MyTrainer(Trainer):
            def evaluate(self, loader=None):
                self.model.eval()
                for b in loader:
                    print(self.model(**b))
                return {}

        class Runner:
            def __init__(self):
                self.model = torch.nn.Linear(4, 2)

            def evaluate(self, loader):
                self.model.eval()
                for x in loader:
                    print(self.model(x))  # expect: BL502
    """)


def test_shared_epoch_function_judged_per_call_site():
    check('''
        import torch

        model = torch.nn.Linear(4, 2)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)

        def run_epoch(loader, optimizer=None):
            for x in loader:
                loss = model(x).sum()  # expect: BL502
                if optimizer is not None:
                    loss.backward()
                    optimizer.step()
                    optimizer.zero_grad()

        def run_mode(loader, mode):
            for x in loader:
                loss = model(x).sum()
                if mode == "train":
                    loss.backward()
                    opt.step()

        run_epoch([torch.randn(2, 4)], opt)
        run_epoch([torch.randn(2, 4)])
        run_mode([torch.randn(2, 4)], "train")
        with torch.no_grad():
            run_mode([torch.randn(2, 4)], "eval")
    ''')


def test_framework_class_through_a_project_base(tmp_path):
    """`class MyTrainer(BaseTrainer)` with BaseTrainer from the project: framework-owned only when the project's class
    derives from a framework's (read from the project's file)."""
    from bertlint.api import lint_path

    (tmp_path / ".git").mkdir()
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "__init__.py").write_text("")
    base = tmp_path / "proj" / "base.py"
    script = tmp_path / "train.py"
    script.write_text("import torch\nfrom proj.base import BaseTrainer\n\n\nclass MyTrainer(BaseTrainer):\n"
                      "    def evaluate(self, loader=None):\n        self.model.eval()\n        for b in loader:\n"
                      "            print(self.model(**b))\n        return {}\n")
    base.write_text("from transformers import Trainer\n\n\nclass BaseTrainer(Trainer):\n    pass\n")
    assert [d.code for d in lint_path(str(script)) if d.code == "BL502"] == []
    base.write_text("class BaseTrainer:\n    pass\n")
    import os
    st = base.stat()
    os.utime(base, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert [(d.code, d.start.row) for d in lint_path(str(script)) if d.code == "BL502"] == [("BL502", 9)]


def test_evalflow_derived_follows_long_chains_and_subscript_targets():
    # BL501's "the accumulator reaches the returned loss" reads EvalFlow.derived: a chain longer than a few
    # assignments (cat -> activation -> sort -> differences -> log -> mean) and a scatter into a matrix
    # (``matrix[rows, cols] = logits``) both carry the accumulated logits to the returned loss.
    import libcst as cst

    from bertlint.context import FileContext

    src = (
        "import torch\n"
        "def listwise(chunks, rows, cols):\n"
        "    logits_list = []\n"
        "    for c in chunks:\n"
        "        logits_list.append(c)\n"
        "    logits = torch.cat(logits_list)\n"
        "    matrix = torch.full((4, 8), -1e4)\n"
        "    matrix[rows, cols] = logits\n"
        "    ranked, order = matrix.sort(descending=True)\n"
        "    diffs = ranked[:, None] - ranked[None, :]\n"
        "    probas = torch.sigmoid(diffs)\n"
        "    losses = torch.log(probas)\n"
        "    masked = losses[losses > -10]\n"
        "    loss = -torch.mean(masked)\n"
        "    return loss\n"
    )
    ctx = FileContext("t.py", src, cst.parse_module(src), None)
    flow = ctx.evalflow
    scope = next(f for f in flow.functions if f.name.value == "listwise")
    got = flow.derived({"logits_list"}, scope)
    assert {"logits", "matrix", "ranked", "diffs", "probas", "losses", "masked", "loss"} <= got
    assert "rows" not in got and "chunks" not in got


def test_bl501_metric_piece_of_an_output_is_info_and_a_loss_tensor_is_not():
    """A forward output's piece named for a metric (`out["accuracy"]`) is usually computed by comparisons without a
    graph: reported as info; the loss tensor itself keeps its graph: a warning."""
    src = """
        import torch

        def train(model, loader, optimizer):
            total_accuracy = 0
            total_loss = 0
            for batch in loader:
                loss, output_dict = model.forward(batch)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total_accuracy += output_dict["accuracy"]
                total_loss += loss
            return total_accuracy, total_loss
    """
    got = {(d.code, d.start.row, d.severity.name) for d in lint(src, codes=("BL501",))}
    assert got == {("BL501", 12, "INFO"), ("BL501", 13, "WARNING")}


_OWN_MODEL = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Scorer(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = nn.Linear(8, 8)

        def forward(self, x, y):
            logits = self.enc(x)
            loss = F.cross_entropy(logits, y)
            {acc_line}
            return {{"loss": loss, "accuracy": acc, "logits_mean": logits.mean()}}

    def train(model, loader, optimizer):
        history = []
        total = 0.0
        for x, y in loader:
            out = model(x, y)
            out["loss"].backward()
            optimizer.step()
            optimizer.zero_grad()
            history.append(out["accuracy"])
            total += out["logits_mean"]
        return history, total
"""


def test_bl501_own_model_returns_a_python_number_under_the_key():
    """The script's own nn.Module returns `accuracy` as `.item()` (a Python float): appending it keeps no graph, so
    nothing is reported for it; `logits_mean` is a graph-carrying tensor of the same dict and stays a warning."""
    src = _OWN_MODEL.format(acc_line="acc = (logits.argmax(-1) == y).float().mean().item()")
    got = {(d.code, d.start.row, d.severity.name) for d in lint(src, codes=("BL501",))}
    assert got == {("BL501", 26, "WARNING")}


def test_bl501_own_model_returns_a_tensor_under_the_key():
    """Same script, but the model returns the accuracy tensor itself: the key is not known to be a number, so the
    metric-named piece stays reported (info, as for a model that is not in view)."""
    src = _OWN_MODEL.format(acc_line="acc = (logits.argmax(-1) == y).float().mean()")
    got = {(d.code, d.start.row, d.severity.name) for d in lint(src, codes=("BL501",))}
    assert got == {("BL501", 25, "INFO"), ("BL501", 26, "WARNING")}


# ------------------------------------------------------------------ session 8 (s8vis): `model.train()` is no caller
def test_bl502_function_named_train_is_not_called_by_model_train():
    """A module-level `def train(...)` drives a training helper (which calls `model.train()`) and an evaluation
    helper. `model.train()` is nn.Module's method, not a call of this `train`: it must not make the evaluation
    helper's callers unknown (the grad state used to chase itself through train -> train_epoch -> model.train() ->
    train and give up)."""
    check("""
        import torch
        import torch.nn.functional as F

        def train_epoch(loader, model, optimizer):
            model.train()
            for batch in loader:
                optimizer.zero_grad()
                pred, true = model(batch)
                F.mse_loss(pred, true).backward()
                optimizer.step()

        def eval_epoch(loader, model):
            model.eval()
            for batch in loader:
                pred, true = model(batch)  # expect: BL502
                print(F.mse_loss(pred, true).item())

        def train(loaders, model, optimizer, epochs):
            for epoch in range(epochs):
                train_epoch(loaders[0], model, optimizer)
                for i in range(1, len(loaders)):
                    eval_epoch(loaders[i], model)
        """)


def test_bl502_function_named_train_caller_under_no_grad_stays_silent():
    """The same shape with the evaluation helper called under `torch.no_grad()` by `train`, and by `train` through a
    module alias elsewhere: every visible caller disables grad, nothing is reported."""
    check("""
        import torch
        import torch.nn.functional as F

        def train_epoch(loader, model, optimizer):
            model.train()
            for batch in loader:
                optimizer.zero_grad()
                pred, true = model(batch)
                F.mse_loss(pred, true).backward()
                optimizer.step()

        def eval_epoch(loader, model):
            model.eval()
            for batch in loader:
                pred, true = model(batch)
                print(F.mse_loss(pred, true).item())

        def train(loaders, model, optimizer, epochs):
            for epoch in range(epochs):
                train_epoch(loaders[0], model, optimizer)
                with torch.no_grad():
                    for i in range(1, len(loaders)):
                        eval_epoch(loaders[i], model)
        """)


def test_bl502_validation_forward_after_the_step_in_a_training_function():
    """A full-batch training function steps, then switches to eval mode for a validation metric and runs the model
    again with grad on: that forward comes after every backward / step of the function and feeds none, so it is an
    evaluation forward (reported with a fix that wraps only the forwards, not the training function)."""
    src = """
        import torch
        import torch.nn.functional as F

        def train(model, optimizer, features, labels, idx_train, idx_val, fast):
            model.train()
            optimizer.zero_grad()
            output = model(features)
            loss = F.nll_loss(output[idx_train], labels[idx_train])
            loss.backward()
            optimizer.step()
            if not fast:
                model.eval()
                output = model(features)  # expect: BL502
            print(F.nll_loss(output[idx_val], labels[idx_val]).item())
        """
    check(src)
    (d,) = lint(src, codes=("BL502",))
    assert "after the function's last backward and optimizer step" in d.message
    assert "decorate `train`" not in d.message and "not the whole function" in d.message


def test_bl502_eval_mode_forward_before_the_backward_stays_silent():
    """Look-alikes: the eval-mode forward whose output a later backward of the same function uses (a frozen-BN
    fine-tuning step), and one followed by a second optimizer step in the same function: not evaluations."""
    check("""
        import torch
        import torch.nn.functional as F

        def step_frozen_bn(model, optimizer, x, y):
            model.eval()
            out = model(x)
            loss = F.cross_entropy(out, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()

        def two_steps(model, optimizer, x, y):
            optimizer.zero_grad()
            F.cross_entropy(model(x), y).backward()
            optimizer.step()
            model.eval()
            out = model(x)
            optimizer.zero_grad()
            F.cross_entropy(out, y).backward()
            optimizer.step()
        """)


_DICT_TOTAL = """
    import torch
    import torch.nn.functional as F
    from torch import nn

    def train(loader, epochs):
        model = nn.Linear(4, 1)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        stats = {{"loss": 0.0, "out": 0.0}}
        for epoch in range(epochs):
            for x, y in loader:
                out = model(x)
                loss = F.mse_loss(out, y)
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                stats["loss"] += loss.item()
                stats["out"] += {value}
        return stats
"""


def test_bl501_running_total_in_a_dict_entry():
    """`stats["out"] += out.mean()` is a running total like `total += ...`, kept in a dict entry made before the
    loop (PPO / detection loggers keep their totals that way): the graph-carrying mean is reported."""
    got = {(d.code, d.start.row) for d in lint(_DICT_TOTAL.format(value="out.mean()"), codes=("BL501",))}
    assert got == {("BL501", 18)}


def test_bl501_dict_entry_total_of_numbers_stays_silent():
    """The same dict totals of `.item()` / detached values keep no graph: nothing is reported."""
    for value in ("out.mean().item()", "out.detach().mean()"):
        assert lint(_DICT_TOTAL.format(value=value), codes=("BL501",)) == []
