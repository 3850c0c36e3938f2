"""The value evaluator with sources (``Resolver.fact`` / ``Resolver.call_kwargs``): unknown stays unknown."""

import textwrap

import libcst as cst

from bertlint.analysis import symbols
from bertlint.analysis.symbols import UNKNOWN


def _r(src: str):
    t = symbols.build(cst.parse_module(textwrap.dedent(src)))
    return t, symbols.Resolver(t)


def _fact(r, code, func=None):
    return r.fact(cst.parse_expression(code), func)


SCRIPT = """
import argparse, os
from dataclasses import dataclass, field
from accelerate import Accelerator
from transformers import HfArgumentParser, TrainingArguments

parser = argparse.ArgumentParser()
parser.add_argument("--grad-accum", type=int, default=4)
parser.add_argument("--fp16", action="store_true")
parser.add_argument("--no-cache", dest="use_cache", action="store_false")
parser.add_argument("--pbar_update_freq", type=int, default=10)
args = parser.parse_args()

@dataclass
class MyArgs:
    accum: int = field(default=8)

hp = HfArgumentParser((MyArgs, TrainingArguments))
my_args, training_args = hp.parse_args_into_dataclasses()

ACC = 2
kw = {"gradient_accumulation_steps": ACC * 2, "mixed_precision": "bf16" if args.fp16 else "no"}
accelerator = Accelerator(**kw)
env_acc = Accelerator(gradient_accumulation_steps=int(os.environ.get("GA", 3)))
plain = Accelerator()

def train(accelerator, n, args):
    return accelerator.gradient_accumulation_steps
"""


def test_argparse_defaults_and_flags_with_sources():
    t, r = _r(SCRIPT)
    f = _fact(r, "args.grad_accum")
    assert (f.value, f.kind) == (4, "default")
    assert f.source == "argparse default of --grad-accum"
    assert _fact(r, "args.fp16").value is False
    assert _fact(r, "args.use_cache").value is True  # store_false
    n = _fact(r, "not args.fp16")
    assert n.value is True and "store_true --fp16" in n.source


def test_pbar_update_freq_is_just_its_own_default():
    t, r = _r(SCRIPT)
    f = _fact(r, "args.pbar_update_freq")
    assert f.value == 10 and "--pbar_update_freq" in f.source


def test_accelerator_passed_in_as_parameter_is_unknown():
    t, r = _r(SCRIPT)
    train = t.module_funcs["train"][0]
    f = _fact(r, "accelerator.gradient_accumulation_steps", train)
    assert f.value is UNKNOWN and not f.known
    assert "parameter of train()" in f.source
    p = _fact(r, "n", train)
    assert p.value is UNKNOWN and p.source == "unknown: parameter of train()"
    # the file's own parser still gives ``args.x`` its (launch-overridable) default
    assert _fact(r, "args.grad_accum", train).kind == "default"


def test_accelerator_kwargs_from_dict_literal():
    t, r = _r(SCRIPT)
    f = _fact(r, "accelerator.gradient_accumulation_steps")
    assert f.value == 4 and f.kind == "literal" and "dict literal" in f.source
    mp = _fact(r, "accelerator.mixed_precision")
    assert mp.value == "no" and mp.kind == "default"
    call = t.assignments["accelerator"][0].value
    kws = r.call_kwargs(call)
    assert kws["gradient_accumulation_steps"].value == 4
    assert "**" not in kws


def test_unset_accelerator_setting_and_environment():
    t, r = _r(SCRIPT)
    f = _fact(r, "plain.gradient_accumulation_steps")
    assert f.value is UNKNOWN and "not passed" in f.source and f.kind == "unset"
    e = _fact(r, "env_acc.gradient_accumulation_steps")
    assert e.value == 3 and e.kind == "environment" and not e.definite


def test_hf_argument_parser_dataclasses():
    t, r = _r(SCRIPT)
    main_scope = None
    f = _fact(r, "my_args.accum", main_scope)
    assert (f.value, f.kind) == (8, "default") and "MyArgs.accum" in f.source
    ta = _fact(r, "training_args.gradient_accumulation_steps")
    assert ta.value is UNKNOWN  # TrainingArguments comes from the command line


def test_operators_and_builtins():
    t, r = _r("""
        import os
        N = 4
        M = max(N, 2) * 2
        FLAG = N > 2 and not False
        WS = int(os.environ.get("WORLD_SIZE", 1))
        X = N if FLAG else 1
    """)
    assert _fact(r, "M").value == 8
    assert _fact(r, "FLAG").value is True
    ws = _fact(r, "WS")
    assert ws.value == 1 and ws.kind == "environment" and "WORLD_SIZE" in ws.source
    assert _fact(r, "X").value == 4
    assert _fact(r, "N").source.startswith("literal")


def test_unknown_stays_unknown():
    t, r = _r("""
        from config import ACCUM
        def f(k=1):
            return k
        def g(d):
            kw = dict(gradient_accumulation_steps=2)
            kw.update(d)
            return Accelerator(**kw)
        n = 1
        n += 1
        for i in range(3):
            pass
    """)
    f = t.module_funcs["f"][0]
    assert _fact(r, "k", f).value is UNKNOWN  # a parameter, even with a default
    assert _fact(r, "ACCUM").value is UNKNOWN and "imported" in _fact(r, "ACCUM").source
    assert _fact(r, "n").value is UNKNOWN  # updated in place
    assert _fact(r, "i").value is UNKNOWN
    g = t.module_funcs["g"][0]
    call = [c for c, name, fn in t.calls if name == "Accelerator"][0]
    kws = r.call_kwargs(call, g)
    assert "**" in kws and kws["**"].value is UNKNOWN


def test_existing_value_api_unchanged():
    t, r = _r(SCRIPT)
    assert r.value(cst.parse_expression("args.grad_accum")) == 4
    assert r.int_value(cst.parse_expression("ACC * 2")) == 4


def test_set_defaults_self_reference_and_in_place_updates():
    t, r = _r("""
        import argparse
        parser = argparse.ArgumentParser()
        parser.add_argument("--accum", type=int, default=2)
        parser.add_argument("--epochs", type=int, default=3)
        parser.set_defaults(epochs=10)
        args = parser.parse_args()
        args.accum = args.accum * 2

        class Loop:
            def __init__(self):
                self.n = 4
                self.k = 0
            def run(self):
                self.k += 1
                return self.n, self.k
    """)
    assert _fact(r, "args.epochs").value == 10
    acc = _fact(r, "args.accum")
    assert acc.value == 4 and acc.kind == "default"
    run = t.functions["run"][0]
    assert _fact(r, "self.n", run).value == 4
    assert _fact(r, "self.k", run).value is UNKNOWN


def test_source_line_via_describe():
    from bertlint.context import FileContext

    src = "import argparse\np = argparse.ArgumentParser()\np.add_argument('--grad-accum', type=int, default=4)\nargs = p.parse_args()\n"
    ctx = FileContext("x.py", src, cst.parse_module(src), None)
    f = ctx.resolver.fact(cst.parse_expression("args.grad_accum"))
    assert f.describe(ctx) == "argparse default of --grad-accum (line 3)"


def test_plain_config_class_attributes():
    t, r = _r("""
        class CFG:
            GRAD_ACCUM = 4
            CLIP_GRAD = True
            lr = 0.1
        lr = 1e-3
        cfg = CFG()
        class Trainer:
            accum = 2
            def step(self):
                return self.accum
    """)
    assert _fact(r, "CFG.GRAD_ACCUM").value == 4
    assert _fact(r, "cfg.CLIP_GRAD").value is True
    assert "CFG.CLIP_GRAD" in _fact(r, "cfg.CLIP_GRAD").source
    assert _fact(r, "lr").value == 1e-3  # the class body's ``lr`` is not a module-level name
    assert _fact(r, "self.accum", t.functions["step"][0]).value == 2


def test_namespace_from_a_parse_helper_and_kwargs_from_a_dict_factory():
    t, r = _r("""
        import argparse
        from transformers import Trainer
        def _parse_args():
            parser = argparse.ArgumentParser()
            parser.add_argument("--grad-accum-steps", type=int, default=1)
            args = parser.parse_args()
            return args, "text"
        def make_data_module(tokenizer, data_args):
            train = load(data_args)
            return dict(train_dataset=train, eval_dataset=None)
        def main():
            args, args_text = _parse_args()
            n = args.grad_accum_steps
            trainer = Trainer(model=m, **make_data_module(tok, args))
    """)
    main = t.module_funcs["main"][0]
    f = _fact(r, "args.grad_accum_steps", main)
    assert (f.value, f.kind) == (1, "default")
    call = [c for c, n, fn in t.calls if n == "Trainer"][0]
    kws = r.call_kwargs(call, main)
    assert "**" not in kws and set(kws) == {"model", "train_dataset", "eval_dataset"}
    assert kws["eval_dataset"].value is None and kws["train_dataset"].value is UNKNOWN


def test_partial_kwargs_dicts():
    t, r = _r("""
        from accelerate import Accelerator
        def make(split_batches, accelerate_kwargs):
            a = Accelerator(**{"split_batches": split_batches, "mixed_precision": "fp16", **accelerate_kwargs,
                               "gradient_accumulation_steps": 2})
            b = Accelerator(**dict(mixed_precision="bf16", **accelerate_kwargs))
    """)
    make = t.module_funcs["make"][0]
    a, b = [c for c, n, f in t.calls if n == "Accelerator"]
    ka = r.call_kwargs(a, make)
    assert "**" in ka
    assert ka["mixed_precision"].value is UNKNOWN  # **accelerate_kwargs may override it
    assert ka["gradient_accumulation_steps"].value == 2  # written after it
    kb = r.call_kwargs(b, make)
    assert kb["mixed_precision"].value == "bf16" and "**" in kb


def test_attributes_through_self_and_aliases():
    t, r = _r("""
        import argparse
        from accelerate import Accelerator
        parser = argparse.ArgumentParser()
        parser.add_argument("--accum", type=int, default=8)
        class Runner:
            def __init__(self, args, accelerator):
                self.args = args
                self.acc = Accelerator(gradient_accumulation_steps=4)
                self.given = accelerator
            def train(self):
                a = self.acc
                return self.acc.gradient_accumulation_steps, a.gradient_accumulation_steps
    """)
    train = t.functions["train"][0]
    assert _fact(r, "self.acc.gradient_accumulation_steps", train).value == 4
    assert _fact(r, "a.gradient_accumulation_steps", train).value == 4
    g = _fact(r, "self.given.gradient_accumulation_steps", train)
    assert g.value is UNKNOWN and "parameter of __init__()" in g.source
    assert _fact(r, "self.args.accum", train).value == 8


def test_call_args_bind_a_same_file_call_to_its_parameters():
    t, r = _r("""
        def run_epoch(model, loader, train=True, n=4, *, log=False):
            pass
        class T:
            def step(self, batch, accum):
                pass
            def go(self):
                self.step(1, accum=8)
        def main(model, loader):
            run_epoch(model, loader, train=False)
            run_epoch(model, loader, True, log=True)
            run_epoch(*parts)
    """)
    main = t.module_funcs["main"][0]
    c1, c2, c3 = [c for c, n, f in t.calls if n == "run_epoch"]
    a1 = r.call_args(c1, main)
    assert a1["train"].value is False and a1["n"].value == 4 and "default of n=" in a1["n"].source
    assert a1["model"].value is UNKNOWN and "parameter of main()" in a1["model"].source
    a2 = r.call_args(c2, main)
    assert a2["train"].value is True and a2["log"].value is True
    assert r.call_args(c3, main)["train"].value is UNKNOWN
    go = t.functions["go"][0]
    step_call = [c for c, n, f in t.calls if n == "self.step"][0]
    a = r.call_args(step_call, go)
    assert a["batch"].value == 1 and a["accum"].value == 8 and "self" not in a


def test_result_attributes_and_none_keywords():
    t, r = _r("""
        import argparse
        from accelerate import Accelerator
        parser = argparse.ArgumentParser()
        parser.add_argument("--mixed_precision", default=None)
        parser.add_argument("--bs", type=int, default=32)
        parser.add_argument("--accum", type=int, default=4)
        args = parser.parse_args()
        accelerator = Accelerator(mixed_precision=args.mixed_precision)
        loss = criterion(out, y)
        per_device = args.bs // args.accum * 2
    """)
    d = _fact(r, "loss.data")
    assert d.value is UNKNOWN and d.kind == "unknown" and "result of `criterion" in d.source
    mp = _fact(r, "accelerator.mixed_precision")
    assert mp.value is UNKNOWN and mp.kind == "unset"
    pd = _fact(r, "per_device")
    assert pd.value == 16 and pd.source == "computed from argparse default of --bs and argparse default of --accum"


def test_containers_changed_in_place_are_unknown():
    t, r = _r("""
        out = {}
        out["train"] = 1.0
        xs = []
        xs.append(3)
        fixed = [1, 2]
    """)
    assert _fact(r, "out").value is UNKNOWN
    assert _fact(r, "xs").value is UNKNOWN
    assert _fact(r, "fixed").value == [1, 2]


def test_vars_of_the_argparse_namespace():
    t, r = _r("""
        import argparse
        from transformers import TrainingArguments
        parser = argparse.ArgumentParser()
        parser.add_argument("--output_dir", default="out")
        parser.add_argument("--gradient_accumulation_steps", type=int, default=8)
        args = parser.parse_args()
        targs = TrainingArguments(**vars(args))
    """)
    call = [c for c, n, f in t.calls if n == "TrainingArguments"][0]
    kws = r.call_kwargs(call)
    assert "**" not in kws and kws["gradient_accumulation_steps"].value == 8
    assert _fact(r, "targs.gradient_accumulation_steps").kind == "default"
