"""Roles from usage (bertlint/analysis/roles.py): small programs of our own, bad/good shapes."""

import textwrap

import libcst as cst

from bertlint.analysis import roles, symbols


def _roles(src: str):
    t = symbols.build(cst.parse_module(textwrap.dedent(src)))
    return t, roles.Roles(t)


def _fn(t, name):
    return t.functions[name][0]


def test_optimizer_from_same_file_factory():
    t, r = _roles("""
        import torch
        def make_optimizer(model, lr):
            return torch.optim.AdamW(model.parameters(), lr=lr)
        def main():
            model = torch.nn.Linear(2, 2)
            opt = make_optimizer(model, 1e-3)
    """)
    role = r.of("opt", _fn(t, "main"))
    assert role.role == "optimizer" and role.confident
    assert role.qualname == "torch.optim.AdamW"
    assert "make_optimizer" in role.why


def test_optimizer_class_held_in_variable():
    t, r = _roles("""
        import torch
        from transformers import Adafactor
        def main(args, model):
            optimizer_cls = torch.optim.AdamW if args.adamw else Adafactor
            opt = optimizer_cls(model.parameters(), lr=1e-4)
            other = getattr(torch.optim, args.name)(model.parameters(), lr=1e-4)
    """)
    main = _fn(t, "main")
    assert r.role("opt", main) == "optimizer" and r.of("opt", main).confident
    assert r.role("other", main) == "optimizer"


def test_fairseq_style_build_optimizer_stepped_near_backward():
    t, r = _roles("""
        from myproject.utils import build_optimizer
        def train(cfg, model, loader):
            params = list(filter(lambda p: p.requires_grad, model.parameters()))
            optimizer = build_optimizer(cfg, params)
            for batch in loader:
                loss = model(batch)
                loss.backward()
                optimizer.step()
                optimizer.zero_grad()
    """)
    role = r.of("optimizer", _fn(t, "train"))
    assert role.role == "optimizer" and role.confident
    assert any(e.kind == "usage" for e in role.evidence)


def test_self_optimizer_set_in_init_and_read_in_another_method():
    t, r = _roles("""
        import torch
        from transformers import get_scheduler
        class Runner:
            def __init__(self, model):
                self.model = model
                self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
                self.sched = get_scheduler("linear", self.opt, 10, 100)
            def train_step(self, batch):
                loss = self.model(batch).loss
                loss.backward()
                self.opt.step()
                self.sched.step()
    """)
    step = _fn(t, "train_step")
    assert r.role("self.opt", step) == "optimizer"
    assert r.role("self.sched", step) == "scheduler"
    assert r.role("self.model", step) == "model"  # produces the loss that reaches backward


def test_scheduler_from_project_helper_built_on_optimizer():
    t, r = _roles("""
        import torch
        from myproject.lr import build_lr_scheduler
        def main(model):
            opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
            s = build_lr_scheduler(opt, warmup=100)
    """)
    assert r.role("s", _fn(t, "main")) == "scheduler"


def test_pipeline_is_not_a_model():
    t, r = _roles("""
        from diffusers import StableDiffusionPipeline, UNet2DConditionModel
        from transformers import AutoTokenizer
        def main():
            pipe = StableDiffusionPipeline.from_pretrained("x")
            unet = UNet2DConditionModel.from_pretrained("x", subfolder="unet")
            tok = AutoTokenizer.from_pretrained("x")
            images = pipe("a prompt")
            out = unet(1, 2, 3)
    """)
    main = _fn(t, "main")
    assert r.role("pipe", main) == "pipeline"
    assert r.role("unet", main) == "model"
    assert r.role("tok", main) == "other"
    calls = {symbols.call_name(c): c for c, n, f in t.calls}
    assert r.is_forward(calls["pipe"], main) is False
    assert r.is_forward(calls["unet"], main) is True


def test_self_call_in_module_method_is_a_forward():
    t, r = _roles("""
        import torch.nn as nn
        class Base(nn.Module):
            pass
        class Net(Base):
            def forward(self, x):
                return x
            def training_loss(self, x):
                return self(x).sum() + self.forward(x).sum()
        class NotAModule:
            def run(self, x):
                return self(x)
    """)
    fwd = _fn(t, "training_loss")
    calls = [c for c, n, f in t.calls if n in ("self", "self.forward") and f is fwd]
    assert len(calls) == 2 and all(r.is_forward(c, fwd) is True for c in calls)
    assert r.class_family(t.classes["Net"]) == "module"
    assert r.class_base(t.classes["Net"]) == "torch.nn.Module"
    run = _fn(t, "run")
    bad = [c for c, n, f in t.calls if n == "self" and f is run]
    assert r.is_forward(bad[0], run) is None


def test_trainer_family_through_own_classes_and_imports():
    t, r = _roles("""
        from trl import SFTTrainer
        import pytorch_lightning as pl
        from transformers import Trainer
        class MyBase(SFTTrainer):
            pass
        class Mine(MyBase):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                return model(**inputs).loss
        class Lit(pl.LightningModule):
            pass
        class Plain:
            pass
    """)
    assert r.class_family(t.classes["Mine"]) == "trainer"
    assert r.class_base(t.classes["Mine"]) == "trl.SFTTrainer"
    assert r.class_family(t.classes["Lit"]) == "lightning_module"
    assert r.class_family(t.classes["Plain"]) is None


def test_accelerate_prepare_unpacks_by_position():
    t, r = _roles("""
        import torch
        from accelerate import Accelerator
        from torch.utils.data import DataLoader
        def main(model, ds):
            accelerator = Accelerator()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
            dl = DataLoader(ds)
            model, opt, dl = accelerator.prepare(model, opt, dl)
    """)
    main = _fn(t, "main")
    o = r.of("opt", main)
    assert o.role == "optimizer"
    assert r.role("dl", main) == "dataloader"
    assert r.role("accelerator", main) == "accelerator"


def test_deepspeed_initialize_positions():
    t, r = _roles("""
        import deepspeed
        def main(model, opt):
            engine, optimizer, _, lr_sched = deepspeed.initialize(model=model, optimizer=opt, config="ds.json")
            engine.backward(loss)
            engine.step()
    """)
    main = _fn(t, "main")
    assert r.role("engine", main) == "deepspeed_engine"
    assert r.of("optimizer", main).wrapped_by == "deepspeed"
    assert r.role("lr_sched", main) == "scheduler"
    assert r.role("opt", main) == "optimizer"  # handed to deepspeed.initialize(optimizer=)


def test_scaler_step_argument_is_an_optimizer():
    t, r = _roles("""
        import torch
        def main(model, thing, loader):
            scaler = torch.cuda.amp.GradScaler()
            for x in loader:
                scaler.scale(model(x)).backward()
                scaler.step(thing)
                scaler.update()
    """)
    main = _fn(t, "main")
    assert r.role("scaler", main) == "grad_scaler"
    assert r.role("thing", main) == "optimizer"


def test_parameters_take_their_call_site_arguments_roles():
    t, r = _roles("""
        import torch
        def train(m, o, data):
            for x in data:
                m(x).backward()
                o.step()
        def main():
            model = torch.nn.Linear(2, 2)
            train(model, torch.optim.SGD(model.parameters(), lr=0.1), [])
    """)
    tr = _fn(t, "train")
    assert r.role("o", tr) == "optimizer"
    assert r.role("m", tr) == "model"


def test_name_is_the_last_hint_and_never_a_veto():
    t, r = _roles("""
        import torch
        def main(opt_g, model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            noise_scheduler = None
            optimizer = make_thing()
    """)
    main = _fn(t, "main")
    g = r.of("opt_g", main)
    assert g.role == "optimizer" and not g.confident and g.evidence[0].kind == "name"
    assert r.of("opt", main).confident
    # a name hint alone stays low confidence
    assert not r.of("optimizer", main).confident


def test_diffusers_noise_scheduler_is_not_an_lr_scheduler():
    t, r = _roles("""
        from diffusers import DDPMScheduler
        def main():
            noise_scheduler = DDPMScheduler.from_pretrained("x", subfolder="scheduler")
            lr_scheduler = DDPMScheduler(num_train_timesteps=10)
    """)
    main = _fn(t, "main")
    assert r.role("noise_scheduler", main) == "other"
    assert r.role("lr_scheduler", main) == "other"  # a constructor beats the name


def test_for_loop_over_optimizers_list():
    t, r = _roles("""
        import torch
        def main(g, d):
            opt_g = torch.optim.Adam(g.parameters(), lr=2e-4)
            opt_d = torch.optim.Adam(d.parameters(), lr=2e-4)
            for o in [opt_g, opt_d]:
                o.step()
    """)
    assert r.role("o", _fn(t, "main")) == "optimizer"
    assert r.of("o", _fn(t, "main")).confident


def test_all_lists_every_binding_of_a_role():
    t, r = _roles("""
        import torch
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        class A:
            def __init__(self):
                self.optimizer = torch.optim.Adam(self.parameters())
    """)
    paths = {p for _, p, _r in r.all("optimizer")}
    assert {"opt", "self.optimizer"} <= paths


def test_reference_before_rewrap_keeps_the_unwrapped_role():
    t, r = _roles("""
        import torch
        def main(net):
            model = net.cuda()
            model = torch.nn.Linear(2, 2)
            model_without_ddp = model
            model = torch.nn.parallel.DistributedDataParallel(model)
    """)
    main = _fn(t, "main")
    assert r.role("model", main) == "ddp_model"
    assert r.role("model_without_ddp", main) == "model"


def test_generic_helper_takes_no_role_from_disagreeing_call_sites():
    t, r = _roles("""
        import torch
        def exists(x):
            return x is not None
        def main(model):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            scaler = torch.cuda.amp.GradScaler()
            exists(opt)
            exists(scaler)
    """)
    assert r.role("x", _fn(t, "exists")) is None


def test_metric_accumulate_is_not_an_accelerator():
    t, r = _roles("""
        def evaluate(meter, scores):
            meter.accumulate(scores)
        def train(accelerator, model, batch):
            with accelerator.accumulate(model):
                loss = model(batch)
                accelerator.backward(loss)
    """)
    assert r.role("meter", _fn(t, "evaluate")) is None
    assert r.role("accelerator", _fn(t, "train")) == "accelerator"
    assert r.of("accelerator", _fn(t, "train")).confident
    assert r.role("model", _fn(t, "train")) == "model"


def test_factory_method_of_a_same_file_class_instance():
    t, r = _roles("""
        import torch
        import torch.nn as nn
        class GPT(nn.Module):
            def configure_optimizers(self, lr):
                return torch.optim.AdamW(self.parameters(), lr=lr)
        model = GPT()
        raw_model = model.module if ddp else model
        optimizer = raw_model.configure_optimizers(3e-4)
    """)
    o = r.of("optimizer")
    assert o.role == "optimizer" and o.qualname == "torch.optim.AdamW"


def test_names_about_a_thing_are_not_the_thing():
    assert roles.name_hint("save_optimizer") is None
    assert roles.name_hint("model_path") is None
    assert roles.name_hint("optimizer_grouped_parameters") is None
    assert roles.name_hint("pbar_update_freq") is None
    assert roles.name_hint("opt_g") == "optimizer"
    assert roles.name_hint("lr_scheduler") == "scheduler"
    assert roles.name_hint("teacher_model") == "model"


def test_loss_walk_finds_the_model_not_the_label_transform():
    t, r = _roles("""
        import torch.nn as nn
        def train(model, loader, mixup_fn):
            criterion = nn.CrossEntropyLoss()
            for samples, targets in loader:
                samples, targets = mixup_fn(samples, targets)
                outputs = model(samples)
                loss = criterion(outputs, targets)
                loss.backward()
    """)
    tr = _fn(t, "train")
    assert r.role("model", tr) == "model" and r.of("model", tr).confident
    assert r.role("mixup_fn", tr) is None
    assert r.role("criterion", tr) == "other"


def test_origin_follows_parameters_to_the_constructor():
    t, r = _roles("""
        from accelerate import Accelerator
        def train(accelerator, model):
            accelerator.backward(model(1))
        def main(model):
            acc = Accelerator(gradient_accumulation_steps=4)
            train(acc, model)
    """)
    role = r.of("accelerator", _fn(t, "train"))
    assert role.role == "accelerator"
    assert symbols.call_name(role.origin) == "Accelerator"
    assert r.legacy_kind("accelerator", _fn(t, "train")) == ("accelerator", True)


def test_legacy_kinds_for_the_loop_model():
    t, r = _roles("""
        import torch, deepspeed
        def main(model):
            scaler = torch.cuda.amp.GradScaler()
            engine, opt, _, sched = deepspeed.initialize(model=model, config="ds.json")
    """)
    main = _fn(t, "main")
    assert r.legacy_kind("scaler", main) == ("scaler", True)
    assert r.legacy_kind("engine", main) == ("engine", True)
    assert r.legacy_kind("opt", main) == ("ds_optimizer", True)
    assert r.legacy_kind("sched", main) == ("ds_scheduler", True)


def test_callback_and_dataset_families():
    t, r = _roles("""
        from transformers import TrainerCallback
        from torch.utils.data import Dataset
        class CB(TrainerCallback):
            pass
        class DS(Dataset):
            pass
    """)
    assert r.class_family(t.classes["CB"]) == "callback"
    assert r.class_family(t.classes["DS"]) == "dataset"


def test_handed_to_a_scheduler_or_fabric_setup():
    t, r = _roles("""
        import torch
        from transformers import get_scheduler
        from lightning import Fabric
        from myproj import build
        def main(model):
            opt = build(model)
            sched = get_scheduler("linear", opt, num_warmup_steps=0, num_training_steps=10)
            fabric = Fabric()
            thing = build(model)
            model, thing = fabric.setup(model, thing)
    """)
    main = _fn(t, "main")
    assert r.role("opt", main) == "optimizer" and r.of("opt", main).confident
    assert r.role("sched", main) == "scheduler"
    assert r.role("thing", main) == "optimizer"


def test_latest_rebinding_wins_a_tie_and_factories_by_import():
    t, r = _roles("""
        from diffusers import UNet2DConditionModel
        from diffusers.training_utils import EMAModel
        from optimizer import build_optimizer
        def main(cfg, model):
            ema_unet = UNet2DConditionModel.from_pretrained("x")
            ema_unet = EMAModel(ema_unet.parameters())
            optimizer = build_optimizer(cfg, model)
    """)
    main = _fn(t, "main")
    assert r.role("ema_unet", main) == "other"
    o = r.of("optimizer", main)
    assert o.role == "optimizer" and o.confident and o.evidence[0].kind == "import"


def test_loop_elements_zip_enumerate_comprehensions_and_appends():
    t, r = _roles("""
        import torch
        def main(models, get_lr):
            optimizers = [torch.optim.AdamW(m.parameters(), lr=1e-3) for m in models]
            schedulers = [torch.optim.lr_scheduler.LambdaLR(o, get_lr) for o in optimizers]
            for opt, sched in zip(optimizers, schedulers):
                opt.step()
                sched.step()
            extra = []
            extra.append(torch.optim.lr_scheduler.StepLR(optimizers[0], 10))
            for i, s in enumerate(extra):
                s.step()
            one = extra[0]
    """)
    main = _fn(t, "main")
    assert r.role("opt", main) == "optimizer" and r.of("opt", main).confident
    assert r.role("sched", main) == "scheduler" and r.of("sched", main).confident
    assert r.role("s", main) == "scheduler" and r.of("s", main).confident
    assert r.role("one", main) == "scheduler"


def test_lightning_manual_optimization_and_generic_instantiate():
    t, r = _roles("""
        import torch
        import lightning as L
        from omegaconf import instantiate
        class Lit(L.LightningModule):
            def training_step(self, batch, idx):
                g_opt, d_opt = self.optimizers()
                g_sch, d_sch = self.lr_schedulers()
                g_opt.step()
                g_sch.step()
        class Runner:
            def __init__(self, model, cfg):
                self.opt = torch.optim.SGD(model.parameters(), lr=0.1)
                self.sched = self._setup_sched(cfg)
            def _setup_sched(self, cfg):
                s = instantiate(cfg, self.opt)
                return s
            def step(self):
                self.opt.step()
                self.sched.step()
    """)
    ts = _fn(t, "training_step")
    assert r.role("g_opt", ts) == "optimizer" and r.of("g_opt", ts).wrapped_by == "lightning"
    assert r.role("d_sch", ts) == "scheduler"
    assert r.role("self.sched", _fn(t, "step")) == "scheduler"


def test_literals_and_string_parameters_are_not_the_thing():
    t, r = _roles("""
        from transformers import AutoModel
        def main(optimizer="adamw", scheduler: str = None):
            model = "bert-base-uncased"
            model = AutoModel.from_pretrained(model)
            model_name = "x"
            opt = optimizer
    """)
    main = _fn(t, "main")
    assert r.role("optimizer", main) == "other"
    assert r.role("scheduler", main) == "other"
    assert r.role("model", main) == "model"


def test_param_groups_from_filtered_named_parameters_unknown_constructor():
    t, r = _roles("""
        from myproject.optim import make_it
        from lamb import Lamb
        def main(model, args):
            no_decay = ["bias", "LayerNorm.weight"]
            grouped = [
                {"params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
                 "weight_decay": args.wd},
                {"params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
                 "weight_decay": 0.0},
            ]
            opt = Lamb(grouped, lr=args.lr)
            n = sum(p.numel() for p in model.parameters())
            clip = make_it(model.parameters())
    """)
    main = _fn(t, "main")
    o = r.of("opt", main)
    assert o.role == "optimizer" and o.confident and "model parameters" in o.why
    assert r.role("n", main) is None
    assert r.role("clip", main) is None  # built from parameters, but nothing says it optimizes


def test_without_a_scope_the_role_wherever_bound_when_all_agree():
    t, r = _roles("""
        import torch
        def a(model):
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        def b(model):
            optimizer = torch.optim.Adam(model.parameters())
            sched = torch.optim.lr_scheduler.StepLR(optimizer, 1)
        def c():
            sched = "linear"
    """)
    assert r.role("optimizer") == "optimizer"
    assert r.role("sched") is None  # a scheduler in b(), a string in c()


def test_pipeline_components_are_models():
    t, r = _roles("""
        from diffusers import StableDiffusionPipeline
        def main():
            pipe = StableDiffusionPipeline.from_pretrained("x")
            out = pipe.unet(1, 2, 3)
            img = pipe("prompt")
    """)
    main = _fn(t, "main")
    calls = {n: c for c, n, f in t.calls}
    assert r.is_forward(calls["pipe.unet"], main) is True
    assert r.is_forward(calls["pipe"], main) is False


def test_single_target_fabric_setup_and_prepare():
    t, r = _roles("""
        import torch
        from lightning.fabric import Fabric
        from accelerate import Accelerator
        def main():
            fabric = Fabric()
            model = fabric.setup(torch.nn.Linear(2, 2))
            acc = Accelerator()
            opt = acc.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    """)
    main = _fn(t, "main")
    m = r.of("model", main)
    assert m.role == "model" and m.wrapped_by == "fabric"
    o = r.of("opt", main)
    assert o.role == "optimizer" and o.wrapped_by == "accelerator"


def test_generate_is_not_a_graph_recording_forward():
    t, r = _roles("""
        from transformers import AutoModelForCausalLM
        def main(ids):
            model = AutoModelForCausalLM.from_pretrained("gpt2")
            out = model.generate(ids)
            logits = model(ids).logits
    """)
    main = _fn(t, "main")
    calls = {n: c for c, n, f in t.calls}
    assert r.is_forward(calls["model.generate"], main) is False
    assert r.is_forward(calls["model"], main) is True


def test_iterated_by_the_training_loop_is_a_loader():
    t, r = _roles("""
        from tqdm import tqdm
        def train(model, opt, batches, epochs):
            for epoch in range(epochs):
                for step, batch in enumerate(tqdm(batches)):
                    model(batch).backward()
    """)
    tr = _fn(t, "train")
    b = r.of("batches", tr)
    assert b.role == "dataloader" and b.confident
    assert r.role("epochs", tr) is None


def test_a_list_of_optimizers_iterated_in_the_loop_is_not_a_loader():
    t, r = _roles("""
        def train(model, optimizers, loader, opts2):
            for batch in loader:
                model(batch).backward()
                for opt in optimizers:
                    opt.step()
                for o in opts2:
                    o.zero_grad()
    """)
    tr = _fn(t, "train")
    assert r.role("loader", tr) == "dataloader"
    assert r.role("optimizers", tr) != "dataloader"
    assert r.role("opts2", tr) != "dataloader"


def test_own_optimizer_and_scheduler_classes():
    t, r = _roles("""
        import torch
        from torch.optim.lr_scheduler import LambdaLR
        class MyAdam(torch.optim.Optimizer):
            pass
        class Warmup(LambdaLR):
            pass
        def main(model):
            opt = MyAdam(model.parameters())
            sched = Warmup(opt, lambda s: 1.0)
    """)
    main = _fn(t, "main")
    assert r.class_family(t.classes["MyAdam"]) == "optimizer"
    assert r.role("opt", main) == "optimizer" and r.of("opt", main).confident
    assert r.role("sched", main) == "scheduler"


def test_class_attributes_do_not_leak_into_module_names():
    t, r = _roles("""
        import torch
        class Config:
            optimizer = "adamw"
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    """)
    assert r.role("optimizer") == "optimizer"
    assert not r.of("optimizer").conflicts


def test_training_arguments_datamodule_and_modeling_classes():
    t, r = _roles("""
        from dataclasses import dataclass
        import transformers
        import lightning.pytorch as pl
        from transformers.models.roberta.modeling_roberta import RobertaLMHead
        @dataclass
        class TrainingArguments(transformers.TrainingArguments):
            cache_dir: str = None
        class DM(pl.LightningDataModule):
            pass
        class Head(RobertaLMHead):
            pass
    """)
    assert r.class_family(t.classes["TrainingArguments"]) == "training_args"
    assert r.class_family(t.classes["DM"]) == "dataset"
    assert r.class_family(t.classes["Head"]) == "module"


def test_by_constructor_tells_a_known_class_from_usage_alone():
    t, r = _roles("""
        import torch
        from mmengine.optim import build_optim_wrapper
        def main(model, cfg, loader):
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            wrapper = build_optim_wrapper(model, cfg)
            for x in loader:
                model(x).backward()
                wrapper.step()
                wrapper.zero_grad()
                opt.step()
                opt.zero_grad()
    """)
    main = _fn(t, "main")
    assert r.of("opt", main).by_constructor
    w = r.of("wrapper", main)
    assert w.role == "optimizer" and w.confident and not w.by_constructor


def test_an_argparse_namespace_called_opt_is_not_an_optimizer():
    t, r = _roles("""
        import argparse
        def train(hyp, opt):
            return opt.epochs
        def main():
            parser = argparse.ArgumentParser()
            opt = parser.parse_args()
            train({}, opt)
    """)
    assert r.role("opt", _fn(t, "main")) == "other"
    assert r.role("opt", _fn(t, "train")) == "other"


def test_partial_classes_and_plain_module_results():
    t, r = _roles("""
        import json, functools
        import torch
        from omegaconf import OmegaConf
        def main(model):
            make = functools.partial(torch.optim.AdamW, lr=1e-4)
            opt = make(model.parameters())
            config = OmegaConf.load("x.yaml")
            sched = json.load(open("s.json"))
    """)
    main = _fn(t, "main")
    o = r.of("opt", main)
    assert o.role == "optimizer" and o.by_constructor
    assert r.role("config", main) == "other"
    assert r.role("sched", main) == "other"


def test_a_deep_copy_keeps_the_role():
    t, r = _roles("""
        import copy
        import torch
        def main():
            model = torch.nn.Linear(2, 2)
            model_avg = copy.deepcopy(model).to(torch.float64)
    """)
    assert r.role("model_avg", _fn(t, "main")) == "model"


def test_trainer_compute_loss_model_argument_and_name_only_forwards():
    t, r = _roles("""
        from trl import SFTTrainer
        class Mine(SFTTrainer):
            def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
                out = model(**inputs)
                return out.loss
        def helper(model, x):
            return model(x)
    """)
    cl = _fn(t, "compute_loss")
    m = r.of("model", cl)
    assert m.role == "model" and m.confident and "SFTTrainer.compute_loss" in m.why
    calls = {(n, id(f)): c for c, n, f in t.calls}
    assert r.is_forward(calls[("model", id(cl))], cl) is True
    h = _fn(t, "helper")
    assert r.is_forward(calls[("model", id(h))], h) is None  # named model, nothing else known


def test_loss_forwards_of_a_backward():
    t, r = _roles("""
        import torch.nn.functional as F
        def compute(model, batch):
            return F.cross_entropy(model(batch["x"]), batch["y"])
        def train(model, scaler, loader):
            for batch in loader:
                loss = compute(model, batch)
                scaler.scale(loss).backward()
    """)
    bw = t.backward_calls[0][0]
    fw = r.loss_forwards(bw)
    assert len(fw) == 1 and symbols.call_name(fw[0]) == "model"
    assert r.role("model", _fn(t, "train")) == "model"


def test_unwrapped_or_wrapped_is_a_model_either_way():
    t, r = _roles("""
        import torch
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(torch.nn.Linear(2, 2))
        raw_model = model.module if isinstance(model, DistributedDataParallel) else model
    """)
    assert r.role("raw_model") == "model" and r.of("raw_model").confident
