"""Regressions from the false-positive hunt on public training / evaluation scripts (BL206, BL501, BL502, BL506).

Each case is a small script written for this file that reproduces the shape of code seen in public projects; the
assertion is the exact set of (code, line) pairs these four rules report."""

from __future__ import annotations

import textwrap

from bertlint.api import lint_text
from bertlint.config import Settings

CODES = ("BL206", "BL501", "BL502", "BL506")


def found(src: str) -> list[tuple[str, int]]:
    diags = lint_text(textwrap.dedent(src), "train.py", Settings())
    return sorted((d.code, d.start.row) for d in diags if d.code in CODES)


def test_ultralytics_yolo_call_is_not_a_graph_recording_forward():
    # YOLO.__call__ runs its predictor under inference mode: no graph, nothing kept
    src = """
        import torch
        from ultralytics import YOLO

        detector_model = YOLO("weights/best.pt")

        def evaluate(frames):
            kept = []
            for f in frames:
                res = detector_model(f, verbose=False)
                kept.append(res)
            return kept
    """
    assert found(src) == []


def test_yolov5_hub_model_is_not_a_graph_recording_forward():
    src = """
        import torch

        model = torch.hub.load("ultralytics/yolov5", "yolov5s")

        def predict(paths):
            out = []
            for p in paths:
                out.append(model(p))
            return out
    """
    assert found(src) == []


def test_spacy_pipeline_named_model_is_not_torch():
    src = """
        import torch
        import spacy

        ner_model = spacy.load("en_core_web_sm")

        def evaluate(sentences):
            docs = []
            for s in sentences:
                docs.append(ner_model(s))
            return docs
    """
    assert found(src) == []


def test_lambda_named_model_without_a_forward_inside():
    src = """
        import numpy as np
        import torch

        def validate(xs):
            model = lambda v: np.tanh(v) * 2
            ys = []
            for x in xs:
                ys.append(model(x))
            return ys
    """
    assert found(src) == []


def test_lambda_wrapping_a_real_model_still_reported():
    src = """
        import torch
        from transformers import AutoModelForSequenceClassification

        net = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")

        def validate(batches):
            model = lambda b: net(**b).logits
            net.eval()
            kept = []
            for b in batches:
                kept.append(model(b))
            return kept
    """
    assert found(src) == [("BL501", 12), ("BL502", 12)]


def test_torch_model_in_same_shape_still_reported():
    # the look-alike with a real torch model: kept
    src = """
        import torch

        model = torch.jit.load("scripted.pt")

        def evaluate(batches):
            model.eval()
            outs = []
            for b in batches:
                outs.append(model(b))
            return outs
    """
    assert found(src) == [("BL501", 10), ("BL502", 10)]


def test_realworld_shapes_stay_silent():
    # set_grad_enabled(phase == "train") phase loops, helpers run under a caller's no_grad, gathered eval losses
    src = """
        import numpy as np
        import torch

        def make_val_step(model, loss_fn):
            def step(x, y):
                model.eval()
                return loss_fn(model(x), y).item()
            return step

        def mini_batch(loader, step_fn):
            losses = []
            for x, y in loader:
                losses.append(step_fn(x, y))
            return np.mean(losses)

        def fit(model, optimizer, criterion, loaders, epochs):
            for epoch in range(epochs):
                for phase in ["train", "val"]:
                    model.train() if phase == "train" else model.eval()
                    running = 0.0
                    for x, y in loaders[phase]:
                        optimizer.zero_grad()
                        with torch.set_grad_enabled(phase == "train"):
                            out = model(x)
                            loss = criterion(out, y)
                            if phase == "train":
                                loss.backward()
                                optimizer.step()
                        running += loss.item() * x.size(0)

        def evaluate(model, loader, accelerator, bs):
            model.eval()
            losses = []
            for batch in loader:
                with torch.no_grad():
                    outputs = model(**batch)
                loss = outputs.loss
                losses.append(accelerator.gather_for_metrics(loss.repeat(bs)))
            return torch.cat(losses).mean()

        def run(model, loss_fn, val_loader):
            with torch.no_grad():
                return mini_batch(val_loader, make_val_step(model, loss_fn))
    """
    assert found(src) == []


def test_cuda_amp_import_only_as_fallback_is_not_reported():
    src = """
        import torch

        try:
            from torch.amp import GradScaler, autocast
        except ImportError:
            from torch.cuda.amp import GradScaler, autocast

        scaler = GradScaler("cuda")

        def step(model, x):
            with autocast("cuda"):
                return model(x).sum()
    """
    assert found(src) == []


def test_cuda_amp_fallback_under_version_test_is_not_reported():
    src = """
        import torch

        if torch.__version__ < "2.4":
            from torch.cuda.amp import autocast as amp_autocast
        else:
            from torch.amp import autocast as amp_autocast

        def step(model, x):
            with amp_autocast("cuda"):
                return model(x).sum()
    """
    assert found(src) == []


def test_cuda_amp_primary_import_still_reported():
    # the deprecated import is the one used on a current torch: kept
    src = """
        import torch
        from torch.cuda.amp import GradScaler, autocast

        scaler = GradScaler()

        def step(model, x):
            with autocast():
                return model(x).sum()
    """
    assert found(src) == [("BL206", 5), ("BL206", 8)]


def test_guarded_plain_torch_import_does_not_hide_cuda_amp_uses():
    src = """
        from transformers.utils import is_torch_available

        if is_torch_available():
            import torch

        scaler = torch.cuda.amp.GradScaler()
    """
    assert found(src) == [("BL206", 7)]


def test_file_criterion_returning_item_is_not_graph():
    src = """
        import torch
        import torch.nn.functional as F

        def criterion(pred, y):
            return F.l1_loss(pred, y).item()

        def train(model, loader, opt):
            model.train()
            total = 0.0
            for x, y in loader:
                pred = model(x)
                F.l1_loss(pred, y).backward()
                opt.step()
                opt.zero_grad()
                total += criterion(pred, y)
            return total
    """
    assert found(src) == []


def test_file_criterion_returning_tensor_still_reported():
    src = """
        import torch
        import torch.nn.functional as F

        def criterion(pred, y):
            return F.l1_loss(pred, y)

        def train(model, loader, opt, scale):
            model.train()
            total = 0.0
            for x, y in loader:
                pred = model(x)
                loss = criterion(pred, y) * scale
                loss.backward()
                opt.step()
                opt.zero_grad()
                total += loss
            return total
    """
    assert found(src) == [("BL501", 17)]


def test_parameter_named_criterion_shadows_the_file_function():
    src = """
        import torch
        import torch.nn.functional as F

        def criterion(pred, y):
            return F.l1_loss(pred, y).item()

        def train(model, loader, opt, criterion):
            model.train()
            total = 0.0
            for x, y in loader:
                loss = criterion(model(x), y)
                loss.backward()
                opt.step()
                opt.zero_grad()
                total += loss
            return total
    """
    assert found(src) == [("BL501", 16)]


def test_own_method_returning_item_is_not_graph():
    src = """
        import torch
        import torch.nn.functional as F

        class Fitter:
            def __init__(self, model, opt):
                self.model = model
                self.opt = opt

            def loss_value(self, logits, labels):
                return F.cross_entropy(logits, labels).item()

            def fit(self, loader):
                self.model.train()
                total = 0.0
                for x, y in loader:
                    logits = self.model(x)
                    F.cross_entropy(logits, y).backward()
                    self.opt.step()
                    self.opt.zero_grad()
                    total += self.loss_value(logits, y)
                return total
    """
    assert found(src) == []


def test_own_method_returning_loss_tensor_still_reported():
    src = """
        import torch
        import torch.nn.functional as F

        class Fitter:
            def __init__(self, model, opt):
                self.model = model
                self.opt = opt

            def compute_loss(self, logits, labels):
                return F.cross_entropy(logits, labels)

            def fit(self, loader):
                self.model.train()
                total = 0.0
                for x, y in loader:
                    loss = self.compute_loss(self.model(x), y)
                    loss.backward()
                    self.opt.step()
                    self.opt.zero_grad()
                    total += loss
                return total
    """
    assert found(src) == [("BL501", 21)]


def test_eval_mode_forwards_returned_to_a_caller_that_backpropagates():
    # model.eval() only to switch dropout / batch-norm off; the caller back-propagates the returned outputs
    src = """
        import torch

        def chunk_logits(model, chunks):
            model.eval()
            kept = []
            for c in chunks:
                kept.append(model(c).logits)
            return kept

        def chunk_losses(model, batches):
            model.eval()
            return [model(**b).loss for b in batches]

        def update(model, chunks, batches, opt, weight):
            logits = chunk_logits(model, chunks)
            objective = -(torch.cat(logits).log_softmax(-1).mean() * weight)
            objective.backward()
            torch.stack(chunk_losses(model, batches)).sum().backward()
            opt.step()
            opt.zero_grad()
    """
    assert found(src) == []


def test_returned_eval_outputs_without_backward_in_callers_still_reported():
    src = """
        import torch

        def chunk_logits(model, chunks):
            model.eval()
            kept = []
            for c in chunks:
                kept.append(model(c).logits)
            return kept

        def chunk_losses(model, batches):
            model.eval()
            return [model(**b).loss for b in batches]

        def report(model, chunks, batches):
            logits = chunk_logits(model, chunks)
            losses = chunk_losses(model, batches)
            print(len(logits), torch.stack(losses).mean().item())
    """
    assert found(src) == [("BL501", 8), ("BL502", 8), ("BL502", 13)]


def test_teacher_eval_does_not_make_the_student_loop_an_evaluation():
    src = """
        import torch
        from transformers import AutoModelForSequenceClassification
        from distil_utils import distill_loss, apply_update

        teacher = AutoModelForSequenceClassification.from_pretrained("bert-large-uncased")
        student = AutoModelForSequenceClassification.from_pretrained("bert-base-uncased")

        def distill(loader, teacher_logits):
            teacher.eval()
            kept = []
            for i, batch in enumerate(loader):
                s_logits = student(**batch).logits
                kept.append(distill_loss(s_logits, teacher_logits[i]))
            return kept
    """
    assert found(src) == []


def test_eval_of_the_same_model_through_an_alias_still_reported():
    src = """
        import torch
        from torch.nn.parallel import DistributedDataParallel as DDP

        def validate(net, loader, rank):
            ddp_model = DDP(net, device_ids=[rank])
            net.eval()
            hits = 0
            for x, y in loader:
                hits += (ddp_model(x).argmax(-1) == y).sum().item()
            return hits
    """
    assert found(src) == [("BL502", 10)]


def test_loop_handing_the_optimizer_to_an_imported_helper_is_not_evaluation():
    src = """
        import torch
        from train_utils import optimize

        def finetune_with_frozen_bn(model, loader, optimizer):
            model.eval()
            for batch in loader:
                loss = model(**batch).loss
                optimize(loss, optimizer)
    """
    assert found(src) == []


def test_frozen_model_outputs_carry_no_graph():
    src = """
        import torch
        from transformers import AutoModel

        text_encoder = AutoModel.from_pretrained("bert-base-uncased").eval().requires_grad_(False)
        image_model = AutoModel.from_pretrained("openai/clip-vit-base-patch32").to("cuda")
        image_model.requires_grad_(False)

        def evaluate(loader):
            kept, scores = [], []
            for batch in loader:
                kept.append(text_encoder(**batch).last_hidden_state[:, 0])
                scores.append(image_model(**batch).logits_per_image)
            return torch.cat(kept), scores
    """
    assert found(src) == []


def test_module_level_grad_switch_off_covers_functions():
    src = """
        import torch

        torch.autograd.set_grad_enabled(False)
        model = torch.load("model.pt")

        def evaluate(loader):
            model.eval()
            preds = []
            for x in loader:
                preds.append(model(x))
            return preds
    """
    assert found(src) == []


def test_pytest_test_function_single_forward_is_not_an_evaluation():
    # a unit test compares two forwards of an eval-mode model: the graph dies when the test returns
    src = """
        import torch
        from mylib import build_model

        def test_padding_matches():
            model = build_model()
            model.eval()
            a = model(torch.ones(2, 4, dtype=torch.long)).logits
            b = model(torch.ones(2, 4, dtype=torch.long)).logits
            assert torch.allclose(a, b)

        def assert_forward_matches(model, x):
            model.eval()
            a = model(x)
            assert a is not None

        class TestForward:
            def test_cache(self):
                model = build_model()
                model.eval()
                out = model(torch.ones(1, 3, dtype=torch.long))
                assert out.logits.shape[1] == 3
    """
    diags = lint_text(textwrap.dedent(src), "test_model.py", Settings())
    assert [(d.code, d.start.row) for d in diags if d.code in CODES] == []
    # the same functions in a script that is not a test module: reported, one per function
    assert found(src) == [("BL502", 8), ("BL502", 14), ("BL502", 21)]
    # a test* method of a class pytest does not collect (no Test prefix) stays reported
    diags = lint_text(textwrap.dedent(src).replace("class TestForward", "class Forward"), "test_model.py",
                      Settings())
    assert [(d.code, d.start.row) for d in diags if d.code in CODES] == [("BL502", 21)]


def test_tensors_collected_in_a_module_forward_are_the_models_computation():
    # a multi-scale block's forward collects each scale's output and combines them into its result
    src = """
        import torch
        from torch import nn

        class MixBlock(nn.Module):
            def __init__(self, d):
                super().__init__()
                self.decomp = nn.Linear(d, d)
                self.mix = nn.Linear(d, d)

            def forward(self, xs):
                parts = []
                for x in xs:
                    y = self.decomp(x)
                    parts.append(y.permute(0, 2, 1))
                mixed = self.combine(parts)
                result = []
                for x, m in zip(xs, mixed):
                    result.append(x + m)
                return result

            def combine(self, parts):
                outs = []
                for p in parts:
                    outs.append(self.mix(p))
                return outs

        def collect(model, batches):
            kept = []
            for b in batches:
                kept.append(model(b))
            print(len(kept))
    """
    # the free function that keeps every batch's output is still reported; the model's own loops are not
    assert found(src) == [("BL501", 31)]


def test_tiles_collected_in_a_diffusers_model_method_are_the_models_computation():
    # a VAE built on diffusers' ModelMixin (an nn.Module) encodes tile by tile and blends the tiles into its output
    src = """
        import torch
        from diffusers.models.modeling_utils import ModelMixin

        class TiledVAE(ModelMixin):
            def tiled_encode(self, x, size):
                rows = []
                for i in range(0, x.shape[-2], size):
                    row = []
                    for j in range(0, x.shape[-1], size):
                        tile = self.encoder(x[..., i:i + size, j:j + size])
                        row.append(tile)
                    rows.append(row)
                out = []
                for row in rows:
                    out.append(torch.cat(row, dim=-1))
                return torch.cat(out, dim=-2)
    """
    assert found(src) == []
    # the same class on a base that is not known to be a module: its loops are judged as before
    assert found(src.replace("from diffusers.models.modeling_utils import ModelMixin", "from mylib import ModelMixin"))


def test_unittest_cases_and_their_tester_helpers_are_test_code():
    # the transformers-style model test module: a tester helper builds the model, puts it in eval mode and checks the
    # output shapes of forwards with autograd on; a unittest.TestCase uses it. Test code, not an evaluation.
    src = """
        import unittest
        import torch
        from mylib import TinyConfig, TinyModel

        class TinyModelTester:
            def __init__(self, parent):
                self.parent = parent

            def create_and_check_model(self, config, input_ids):
                model = TinyModel(config)
                model.eval()
                result = model(input_ids)
                self.parent.assertEqual(result.shape[0], 2)

        class ForwardChecker:
            def check(self, model, x):
                model.eval()
                out = model(x)
                print(out.shape)

        class TinyModelTest(unittest.TestCase):
            def setUp(self):
                self.model_tester = TinyModelTester(self)
                self.checker = ForwardChecker()

            def test_model(self):
                self.model_tester.create_and_check_model(TinyConfig(), torch.ones(2, 4, dtype=torch.long))

        class CommonModelChecks:
            def forward_once(self, model, x):
                model.eval()
                out = model(x)
                print(out.shape)
    """
    diags = lint_text(textwrap.dedent(src), "test_modeling_tiny.py", Settings())
    # the tester (its name, and the test case uses it) and the checker (the test case uses it) are silent; a class
    # of the module no test uses is judged as before
    assert [(d.code, d.start.row) for d in diags if d.code in CODES] == [("BL502", 33)]
    # outside a test module every one of them is reported
    assert [r for _c, r in found(src)] == [13, 19, 33]


def test_a_test_helpers_loop_of_forwards_is_test_code():
    # batched output against one sample at a time: a loop of eval-mode forwards in a tester helper
    src = """
        import torch
        from mylib import TinyModel

        class TinyModelTester:
            def check_batching(self, config, inputs):
                model = TinyModel(config)
                model.eval()
                batched = model(inputs)
                for i in range(inputs.shape[0]):
                    single = model(inputs[i : i + 1])
                    assert torch.allclose(single, batched[i : i + 1], atol=1e-3)
    """
    diags = lint_text(textwrap.dedent(src), "test_modeling_tiny.py", Settings())
    assert [d.code for d in diags if d.code in CODES] == []
    assert [c for c, _r in found(src)] == ["BL502", "BL502"]  # in a script: the single forward and the loop


def test_a_numerics_test_keeping_its_losses_is_test_code():
    # a unittest case trains a few steps and keeps the loss tensors to compare two implementations
    src = """
        import unittest
        import torch

        class TestNumerics(unittest.TestCase):
            def run_steps(self, model, inputs, labels, steps=5):
                optim = torch.optim.SGD(model.parameters(), lr=1e-3)
                losses = []
                for _ in range(steps):
                    optim.zero_grad()
                    loss = torch.nn.functional.mse_loss(model(inputs), labels)
                    loss.backward()
                    optim.step()
                    losses.append(loss)
                return losses

            def test_same_losses(self):
                a = self.run_steps(torch.nn.Linear(4, 4), torch.randn(2, 4), torch.randn(2, 4))
                b = self.run_steps(torch.nn.Linear(4, 4), torch.randn(2, 4), torch.randn(2, 4))
                self.assertEqual(len(a), len(b))
    """
    diags = lint_text(textwrap.dedent(src), "test_numerics.py", Settings())
    assert [d.code for d in diags if d.code in CODES] == []
    assert [c for c, _r in found(src)] == ["BL501"]  # the same loop outside a test module keeps the graphs


def test_a_getter_named_like_a_model_is_no_forward():
    # an inference server collects messages; `model_message()` / `model_dump()` are methods of plain objects
    src = """
        import torch

        def serve(requests, controller):
            msgs = []
            dumps = []
            for req in requests:
                completion = controller.record(req)
                msgs.append(completion.model_message())
                dumps.append(req.model_dump())
            print(len(msgs), len(dumps))

        def evaluate(loader, net):
            net.eval()
            outs = []
            for x in loader:
                outs.append(net.model(x))
            print(len(outs))
    """
    # the getters are silent; a model attribute called with an input is still a forward
    assert [c for c, _r in found(src)] == ["BL501", "BL502"]


def test_a_model_method_cutting_its_input_into_chunks_is_the_models_computation():
    # a localizer's forward_test (called by its base class's forward dispatch, under the framework's no_grad) runs
    # the backbone over chunks of its one input: one call of the model, grad mode the caller's
    src = """
        import torch
        from torch import nn


        class Localizer(nn.Module):
            def __init__(self, backbone, chunk):
                super().__init__()
                self.backbone = backbone
                self.pool = nn.AdaptiveAvgPool2d(1)
                self.chunk = chunk

            def forward_test(self, imgs):
                output = []
                for idx in range(0, imgs.shape[1], self.chunk):
                    x = self.backbone(imgs[:, idx:idx + self.chunk])
                    x = self.pool(x)
                    output.append(x)
                return torch.cat(output, dim=1)
    """
    assert found(src) == []
    # the same method called by this file's own loop with autograd on: judged at its caller as before
    called = src + """
        def evaluate(model, loader):
            outs = []
            for imgs in loader:
                outs.append(model.forward_test(imgs))
            print(len(outs))
    """
    assert found(called) == [("BL501", 18), ("BL502", 16)]
