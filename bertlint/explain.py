"""``bertlint explain FILE``: what the frameworks will actually do with the training set-up(s) of a script.

For each set-up: framework, model (class, parameter count from the built-in table or a local config.json), micro-batch
per device, accumulation, world size, the effective batch as a formula, optimizer steps, the scheduler length,
precision, checkpointing (and whether reentrant on the target version), who divides the loss by N, a first-order memory
estimate by category with its assumptions, and the linter's findings. Text or ``--output-format json``.

The memory estimate is first-order arithmetic; a precise estimator can be plugged in with
:func:`register_memory_estimator` (a callable ``(setup, seq_len, world_size, versions) -> dict | None`` returning the
same keys as :func:`first_order_memory`; one that takes a ``ctx`` keyword also gets the file's context, so it reads the
same set-up model ``bertlint memory`` reads).

Nothing here imports torch or transformers.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, Callable, Optional

import libcst as cst

from bertlint.analysis.walk import walk

from bertlint.analysis.symbols import UNKNOWN, call_name, code_of, kwarg

_MEMORY_ESTIMATOR: Optional[Callable] = None


def register_memory_estimator(fn: Optional[Callable]) -> None:
    """Plug a memory estimator in (``None`` restores the first-order one)."""
    global _MEMORY_ESTIMATOR
    _MEMORY_ESTIMATOR = fn


def _takes_ctx(fn: Callable) -> bool:
    import inspect

    try:
        ps = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "ctx" or p.kind is p.VAR_KEYWORD for p in ps)


def _estimate(ctx, s, sl, world, versions) -> Optional[dict]:
    """The plugged estimator's memory for set-up ``s`` (given the file's context when it takes one), or None."""
    if _MEMORY_ESTIMATOR is None:
        return None
    try:
        if _takes_ctx(_MEMORY_ESTIMATOR):
            return _MEMORY_ESTIMATOR(s, sl, world, versions, ctx=ctx)
        return _MEMORY_ESTIMATOR(s, sl, world, versions)
    except Exception:  # noqa: BLE001 - explain keeps its first-order arithmetic
        return None


# ---------------------------------------------------------------------------------------------------------------
# helpers


def _v(x: Any) -> Any:
    return None if x is UNKNOWN else x


def _num(x: Any) -> Optional[int]:
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x is UNKNOWN:
        return None
    if isinstance(x, float) and not x.is_integer():
        return None
    return int(x)


def _bytes(n: Optional[float]) -> str:
    if n is None:
        return "unknown"
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def _params_text(n: Optional[int]) -> str:
    if not n:
        return "unknown"
    return f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n:,}"


# ---------------------------------------------------------------------------------------------------------------
# the pieces


def who_divides(setup, versions, fs) -> dict:
    """Who divides the loss by the accumulation steps N, on the target transformers version."""
    from bertlint.checks._trainer import loss_ignores_num_items

    tv = versions.transformers
    a, m, t = setup.args, setup.model, setup.trainer
    n = a.int("gradient_accumulation_steps") if a else None
    where = f"on {tv.describe()}"
    if n == 1:
        return {"who": "nobody needs to", "detail": "gradient_accumulation_steps=1: no accumulation", "inflated": False}
    if fs.disables_loss_kwargs or (t is not None and t.loss_scaling_override):
        how = fs.disables_loss_kwargs or t.loss_scaling_override
        return {"who": "the Trainer", "detail": f"`{how}`: the Trainer divides each micro-batch loss by the number "
                                                f"of micro-batches in the window ({where})", "inflated": False}
    if t is not None and t.compute_loss_func is not None:
        return {"who": "compute_loss_func", "detail": "`compute_loss_func` receives `num_items_in_batch` and is "
                                                      "expected to normalise by it; the Trainer does not divide",
                "inflated": None}
    if t is not None and t.compute_loss is not None:
        return {"who": "depends on the compute_loss override", "detail": "a `compute_loss` override decides (BL404 "
                                                                         "checks it)", "inflated": None}
    fam, head = (m.family, m.head) if m else (None, None)
    kind = loss_ignores_num_items(tv, fam, head)
    if kind is None and m is not None and m.local_class is not None:
        from bertlint.checks.bl405 import _custom_forward_ignores

        if _custom_forward_ignores(m, tv):
            return {"who": "nobody", "detail": f"{m.class_name}.forward takes `**kwargs` and `labels` but ignores "
                                               f"`num_items_in_batch`; the Trainer does not divide: loss and "
                                               f"gradients ×{n if n else 'N'} {where} (BL405)", "inflated": True}
        f = m.forward
        if f is not None and f.params.star_kwarg is None and tv.at_least("4.48.0"):
            return {"who": "the Trainer", "detail": f"{m.class_name}.forward takes no `**kwargs`: the Trainer "
                                                    f"divides each micro-batch loss by N {where}", "inflated": False}
    nn = n if n else "N"
    if n is None and kind is not None:
        return {"who": "nobody, if gradient_accumulation_steps > 1",
                "detail": f"the accumulation steps are not known statically; with N > 1, {m.class_name} ignores "
                          f"`num_items_in_batch` and the Trainer does not divide {where}: loss and gradients ×N",
                "inflated": None}
    if kind == "5x":
        return {"who": "nobody", "detail": f"{m.class_name} accepts `**kwargs` but ignores `num_items_in_batch`, so "
                                           f"the Trainer does not divide and the model returns a per-micro-batch mean: "
                                           f"loss and gradients ×{nn} {where} (BL405)", "inflated": True}
    if kind == "446":
        return {"who": "nobody", "detail": f"transformers 4.46.0–4.47.x do not divide the loss of models without "
                                           f"loss kwargs: gradients ×{nn} {where} (BL405)", "inflated": True}
    if m is None or fam is None:
        return {"who": "unknown", "detail": "the model's class is not known statically: the Trainer divides by N "
                                            "unless the model's forward accepts `**kwargs` (then the model must "
                                            "normalise by `num_items_in_batch`)", "inflated": None}
    if tv.at_least("5.0.0"):
        return {"who": "the model", "detail": f"{m.class_name} normalises its loss by `num_items_in_batch` "
                                              f"(token-exact) {where}", "inflated": False}
    if tv.at_least("4.48.0"):
        return {"who": "the Trainer", "detail": f"the Trainer divides each micro-batch loss by N before backward "
                                                f"{where}", "inflated": False}
    return {"who": "accelerate", "detail": f"accelerate's backward divides by N {where}", "inflated": False}


def checkpointing_info(setup, versions) -> dict:
    from bertlint.checks._trainer import checkpointing_sites

    tv = versions.transformers
    on = setup.checkpointing
    if on is False:
        prep = getattr(setup.model, "kbit_prep", None) if setup.model is not None else None
        if prep is not None:
            flag = next((a.value for a in prep.args if a.keyword is not None
                         and a.keyword.value == "use_gradient_checkpointing"), None)
            if flag is None or (isinstance(flag, cst.Name) and flag.value == "True"):
                return {"enabled": None, "reentrant": None,
                        "text": "on where prepare_model_for_kbit_training runs (it enables checkpointing by "
                                "default, with the input-grad hook that reentrant checkpointing needs)"}
            if not (isinstance(flag, cst.Name) and flag.value == "False"):
                return {"enabled": None, "text": "unknown (prepare_model_for_kbit_training's "
                                                 "use_gradient_checkpointing is not known statically)"}
        return {"enabled": False, "text": "off"}
    if on is UNKNOWN:
        launch = [x for x in checkpointing_sites(setup, tv, launch=True) if x[2] == "launch"]
        if launch:
            node, _kw, _via, r, why = launch[0]
            flag = node.attr.value if isinstance(node, cst.Attribute) else "gradient_checkpointing"
            how = "reentrant" if r is True else "non-reentrant" if r is False else "reentrant or not: unknown"
            return {"enabled": None, "reentrant": r,
                    "text": f"set on the command line (`--{flag}`, which the script checks); when on: {how} ({why})"}
        return {"enabled": None, "text": "unknown"}
    sites = checkpointing_sites(setup, tv)
    re = [s[3] for s in sites]
    why = sites[0][4] if sites else ""
    if any(r is True for r in re):
        text = f"on, reentrant ({why})"
        reentrant = True
    elif re and all(r is False for r in re):
        text = f"on, non-reentrant ({why})"
        reentrant = False
    else:
        text = "on (reentrant or not: unknown)"
        reentrant = None
    return {"enabled": True, "reentrant": reentrant, "text": text}


def _seq_len(ctx, setup, arg: Optional[int]) -> tuple[Optional[int], str]:
    if arg:
        return arg, "--seq-len"

    class V(cst.CSTVisitor):
        def __init__(self):
            self.found = []

        def visit_Call(self, node):
            e = kwarg(node, "max_length")
            name = (call_name(node) or "").lower()
            if e is not None and ("token" in name or name.endswith(("encode_plus", "encode"))):
                v = ctx.resolver.value(e)
                if isinstance(v, int) and not isinstance(v, bool):
                    self.found.append(v)

    v = V()
    walk(ctx.module, v)
    if v.found:
        return max(v.found), "tokenizer max_length in the script (an upper bound with dynamic padding)"
    arch = (setup.model.architecture if setup.model else None) or {}
    mp = arch.get("max_position_embeddings")
    if isinstance(mp, int):
        mp = min(mp, 512) if mp > 512 else mp
        return mp, "the model's maximum positions (an upper bound; pass --seq-len)"
    return None, "unknown (pass --seq-len)"


def first_order_memory(setup, seq_len: Optional[int], world: Optional[int], versions) -> dict:
    """Parameters, gradients, optimizer states and activations in bytes, with the assumptions stated."""
    m, a = setup.model, setup.args
    assumptions = []
    arch = (m.architecture if m else None) or {}
    P = m.parameters if m else None
    out: dict = {"parameters": None, "gradients": None, "optimizer_states": None, "activations": None,
                 "total": None, "assumptions": assumptions}
    if not P:
        assumptions.append("parameter count unknown: no memory estimate")
        return out
    assumptions.append(f"{P:,} parameters (bare encoder; the task head is small and not counted)")
    wd = m.weights_dtype
    wbytes = 2 if wd in ("float16", "bfloat16") else 4
    out["parameters"] = P * wbytes
    trainable = P
    if m.peft or m.kbit:
        trainable = 0
        assumptions.append("PEFT: only the adapters train; gradients and optimizer states of the frozen base are "
                           "counted as 0 (adapters are a fraction of a percent)")
    out["gradients"] = trainable * wbytes
    optim = a.get("optim") if a else UNKNOWN
    if isinstance(optim, str) and ("8bit" in optim or "bnb" in optim):
        out["optimizer_states"] = trainable * 2
        assumptions.append(f"optimizer {optim}: 2 bytes of state per trainable parameter")
    elif isinstance(optim, str) and optim.startswith("sgd"):
        out["optimizer_states"] = 0
        assumptions.append("SGD without momentum state assumed")
    else:
        out["optimizer_states"] = trainable * 8
        assumptions.append("AdamW: two float32 moments per trainable parameter (8 bytes)")
    assumptions.append(f"weights and gradients in {wd or 'float32'} ({wbytes} bytes each)")
    b = _num(setup.micro_batch)
    h, L, heads = arch.get("hidden_size"), arch.get("num_hidden_layers"), arch.get("num_attention_heads")
    if b and seq_len and h and L and heads:
        fp16 = a is not None and (a.get("fp16") is True or a.get("bf16") is True) or wd in ("float16", "bfloat16")
        # Korthikanti et al. 2022: s·b·h·(34 + 5·a·s/h) bytes per layer with 16-bit activations
        per_layer = seq_len * b * h * (34 + 5 * heads * seq_len / h)
        if not fp16:
            per_layer *= 2
            assumptions.append("activations in float32 (no mixed precision): twice the 16-bit figure")
        ckpt = setup.checkpointing is True
        if ckpt:
            act = L * (seq_len * b * h * (2 if fp16 else 4)) + per_layer
            assumptions.append("checkpointing: one layer input kept per layer plus one layer's activations "
                               "recomputed at a time")
        else:
            act = L * per_layer
        assumptions.append(f"activations per layer ≈ s·b·h·(34 + 5·heads·s/h) bytes (16-bit), s={seq_len}, "
                           f"b={b} (the micro-batch: accumulation does not add activations)")
        out["activations"] = int(act)
    else:
        assumptions.append("activations unknown (micro-batch, sequence length or architecture not known)")
    known = [out[k] for k in ("parameters", "gradients", "optimizer_states", "activations") if out[k] is not None]
    out["total"] = int(sum(known)) if known else None
    assumptions.append("first-order: no temporaries, allocator fragmentation or CUDA context (~0.5–1 GiB)")
    if setup.args is not None and setup.args.get("deepspeed") not in (None, UNKNOWN):
        assumptions.append("DeepSpeed ZeRO may shard optimizer states / gradients / parameters across processes")
    return out


def _steps(setup, world: Optional[int]) -> dict:
    a = setup.args
    if a is None:
        return {"text": "unknown"}
    n = a.int("gradient_accumulation_steps")
    max_steps = a.int("max_steps")
    epochs = _v(a.get("num_train_epochs"))
    if max_steps and max_steps > 0:
        return {"total": max_steps, "text": f"{max_steps} optimizer steps (max_steps; overrides num_train_epochs)"}
    nn = n if n else "N"
    ep = f"{epochs:g}" if isinstance(epochs, (int, float)) else "num_train_epochs"
    return {"total": None, "per_epoch_formula": f"ceil(len(train_dataloader) / {nn})",
            "text": f"ceil(len(train_dataloader) / {nn}) per epoch × {ep} epochs (the dataset size is not known "
                    f"statically); the last, partial window of each epoch also steps"}


def _scheduler(setup, ctx=None) -> str:
    t, a = setup.trainer, setup.args
    if t is not None and t.optimizers is not None:
        base = (f"given through `optimizers={code_of(t.optimizers)}`: the Trainer steps it once per optimizer step, "
                f"so its length must be counted in optimizer steps")
        length = _scheduler_length(ctx, t) if ctx is not None else None
        if length is not None:
            expr, in_micro = length
            n = a.int("gradient_accumulation_steps") if a is not None else None
            if in_micro and n and n > 1:
                return (base + f"; its length `{expr}` counts micro-batches, so with accumulation {n} it runs only "
                               f"1/{n} of its course (BL106)")
            return base + f"; its length: `{expr}`"
        return base
    if a is None:
        return "unknown"
    kind = _v(a.get("lr_scheduler_type")) or "linear"
    warm = _v(a.get("warmup_steps"))
    wtext = ""
    if isinstance(warm, (int, float)) and warm:
        wtext = f", warmup {warm:g} optimizer steps" if warm >= 1 else f", warmup {warm:g} × total steps"
    return f"the Trainer's own `{kind}` schedule over max_steps optimizer steps (matches the steps){wtext}"


def _launcher_world(filename: str) -> Optional[tuple[int, str]]:
    """``num_processes`` of the one accelerate launcher config beside the script, if there is exactly one."""
    d = os.path.dirname(os.path.abspath(filename))
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith((".yaml", ".yml")))
    except OSError:
        return None
    found = []
    for n in names[:20]:
        try:
            from bertlint.analysis.configfiles import load_config

            data, err = load_config(os.path.join(d, n))
        except Exception:
            continue
        if isinstance(data, dict) and "distributed_type" in data and isinstance(data.get("num_processes"), int) \
                and not isinstance(data.get("num_processes"), bool) and data["num_processes"] > 0:
            found.append((data["num_processes"], n))
    if len(found) == 1:
        return found[0][0], f"num_processes in the accelerate config {found[0][1]}"
    return None


def _scheduler_length(ctx, t) -> Optional[tuple[str, bool]]:
    """(length expression, counted in micro-batches?) of the scheduler passed in ``optimizers=(opt, sched)``."""
    opt = t.optimizers
    if not isinstance(opt, cst.Tuple) or len(opt.elements) != 2:
        return None
    sched = opt.elements[1].value
    call = sched
    if isinstance(sched, cst.Name):
        assigns = ctx.symbols.assignments_of(sched.value, t.func)
        call = assigns[0].value if len(assigns) == 1 else None
    if not isinstance(call, cst.Call):
        return None
    for key in ("num_training_steps", "T_max", "total_steps", "total_iters"):
        e = kwarg(call, key)
        if e is not None:
            text = code_of(e)
            if isinstance(e, cst.Name):
                for asg in ctx.symbols.assignments_of(e.value, t.func)[:1]:
                    text += f" = {code_of(asg.value)}"
            low = text.lower()
            micro = "len(" in text and "accum" not in low and "max_steps" not in low
            return text, micro
    return None


def _world(args_world: Optional[int], settings, filename: str = "") -> tuple[int, str, bool]:
    if args_world:
        return args_world, "from --world-size", True
    w = getattr(settings, "world_size", None)
    if isinstance(w, int) and w > 0:
        return w, "from [tool.bertlint] world-size", True
    if filename:
        lw = _launcher_world(filename)
        if lw:
            return lw[0], f"from {lw[1]}", True
    return 1, "per process: world size not known (pass --world-size)", False


# ---------------------------------------------------------------------------------------------------------------
# the report


def explain_source(source: str, filename: str, settings=None, *, world_size: Optional[int] = None,
                   seq_len: Optional[int] = None, findings: Optional[list] = None) -> dict:
    """The explanation of one Python file as a JSON-ready dict."""
    from bertlint.config import Settings
    from bertlint.context import FileContext

    settings = settings or Settings()
    out: dict = {"filename": filename, "setups": [], "loops": [], "findings": [], "versions": {}}
    try:
        module = cst.parse_module(source)
    except Exception as e:  # bad input: say so, no traceback
        out["error"] = f"could not parse: {getattr(e, 'message', e)}"
        return out
    ctx = FileContext(filename, source, module, settings)
    versions = ctx.versions
    out["versions"] = {k: {"version": v.text, "source": v.source} for k, v in versions.all().items()}
    if findings is None:
        findings = _lint(source, filename, settings)
    out["findings"] = [
        {"code": d.code, "severity": d.severity.value, "row": d.start.row, "column": d.start.column,
         "message": d.message} for d in findings
    ]
    fs = ctx.setup
    world, world_src, world_known = _world(world_size, settings, filename)
    for s in fs.setups:
        out["setups"].append(_explain_setup(ctx, fs, s, versions, world, world_src, world_known, seq_len, findings))
    try:
        from bertlint.analysis import dryrun

        for run in dryrun.of(ctx):
            if isinstance(run.loop, dryrun.ManualStep):
                continue  # a function some driver calls per micro-batch (Lightning's training_step, ...): not a loop
            out["loops"].append(_explain_loop(ctx, fs, run, versions, world, world_src, world_known, seq_len, out))
    except Exception:
        pass
    return out


class _LoopSetup:
    """A hand-written loop seen as a set-up (for the memory estimate)."""

    def __init__(self, framework, node, model, micro_batch, accumulation, checkpointing):
        self.framework, self.node, self.model = framework, node, model
        self.trainer, self.args = None, None
        self.micro_batch, self.accumulation, self.checkpointing = micro_batch, accumulation, checkpointing


def _loop_batch_size(ctx, lp) -> tuple[Optional[int], str]:
    try:  # the shared set-up fact (bertlint memory reads the same): the loader the training loop iterates
        from bertlint.analysis.setup import loop_micro_batch

        f = loop_micro_batch(ctx, lp)
        if f.known:
            return f.value, f.source
    except Exception:  # noqa: BLE001 - fall back on the older scan below
        pass
    vals = set()

    class V(cst.CSTVisitor):
        def visit_Call(self, node):
            if (call_name(node) or "").split(".")[-1] == "DataLoader":
                e = kwarg(node, "batch_size")
                if e is None and len(node.args) > 1 and node.args[1].keyword is None:
                    e = node.args[1].value
                vals.add(ctx.resolver.int_value(e) if e is not None else 1)

    walk(ctx.module, V())
    if len(vals) == 1 and None not in vals:
        return vals.pop(), "DataLoader batch_size"
    if not vals:  # no DataLoader: a batch-size constant of the script, by its name
        import re

        named = {}
        for name, assigns in ctx.symbols.assignments.items():
            if re.fullmatch(r"(micro_?|per_device_)?(train_)?batch(_size)?", name, re.IGNORECASE) and len(assigns) == 1:
                v = ctx.resolver.int_value(assigns[0].value, assigns[0].func)
                if v and v > 0:
                    named[name] = v
        if len(set(named.values())) == 1:
            name = sorted(named)[0]
            return named[name], f"`{name}` in the script"
    return None, "no single DataLoader batch_size"


def _explain_loop(ctx, fs, run, versions, world, world_src, world_known, seq_len_arg, out) -> dict:
    """One training loop as its dry run saw it (``run``: a dryrun.LoopRun)."""
    lp = run.loop
    acc = run.factor
    row = ctx.span(lp.node)[0].row
    n = acc.value if acc is not None and acc.value is not None else (None if acc is not None else 1)
    if acc is None and not any(t.complete for t in run.traces):
        n = None  # no factor before the run and no complete run: not known (never a default of 1)
    b, b_src = _loop_batch_size(ctx, lp)
    models = list(fs.models)
    model = models[0] if len(models) == 1 else None
    ck = bool(model is not None and model.checkpointing)
    d = {
        "framework": getattr(lp, "owner", "plain"),
        "row": row,
        "accumulation": (acc.value if acc is not None and acc.value is not None else (acc.text if acc else None)),
        "accumulation_source": acc.source if acc is not None else None,
        "optimizer_step": "unknown",  # what the dry run shows (below); unknown when it did not complete
        "loss_divided": None,
        "micro_batch": {"value": b, "origin": b_src},
        "model": None if model is None else {"class": model.class_name or model.declared_class,
                                             "parameters": model.parameters,
                                             "parameters_source": model.architecture_source},
        "findings": [f for f in out["findings"] if _in_node(ctx, lp.node, f["row"])],
    }
    try:
        d["dry_run"] = loop_timeline(ctx, run, b)
    except Exception:  # the timeline is an extra: never break explain
        d["dry_run"] = None
    dr = d["dry_run"]
    if dr and "drives another training loop" in (dr.get("notes") or []):
        d["optimizer_step"] = "in the training loop it calls (its own entry)"
    if dr and dr.get("complete"):
        # one model: the header states what the dry run found (the trace), not a second reading of the loop
        if dr.get("n") is not None:
            d["accumulation"] = dr["n"] if dr.get("n_source") == "resolved" else dr.get("n_text") or dr["n"]
            same = acc is not None and acc.text == dr.get("n_text")
            d["accumulation_source"] = ((acc.source if same else "dry run") if dr.get("n_source") == "resolved"
                                        else f"value not fixed by the script: the dry run uses N = {dr['n']}")
            n = dr["n"] if dr.get("n_source") == "resolved" else None
        sizes = dr.get("window_sizes") or []
        full = dr.get("window")
        if not sizes:
            d["optimizer_step"] = "not in the loop"
        elif all(k == 1 for k in sizes):
            d["optimizer_step"] = "every micro-batch"
        elif full:
            d["optimizer_step"] = f"once per window of {full} micro-batches"
        d["loss_divided"] = dr.get("loss_divided", d["loss_divided"])
    if b and isinstance(n, int) and d["optimizer_step"] == "every micro-batch":
        d["effective_batch"] = {"value": b * world, "formula": f"{b} × 1 × {world} = {b * world} — the optimizer "
                                f"steps on every micro-batch, so the accumulation of {n} does not happen"}
    elif b and isinstance(n, int):
        eff = b * n * world
        d["effective_batch"] = {"value": eff, "formula": f"{b} × {n} × {world} = {eff}"}
    else:
        d["effective_batch"] = {"value": None, "formula": None}
    pseudo = _LoopSetup(d["framework"], lp.node, model, b, n, ck)
    sl, sl_src = _seq_len(ctx, pseudo, seq_len_arg)
    mem = _estimate(ctx, pseudo, sl, world, versions)
    if mem is None:
        mem = dict(first_order_memory(pseudo, sl, world, versions))
        mem.setdefault("method", "first-order")
    else:
        mem = dict(mem)
        mem.setdefault("method", "simulated")
    mem["seq_len"], mem["seq_len_source"] = sl, sl_src
    d["memory"] = mem
    return d


# ------------------------------------------------------------------------------------------ per-loop dry run
# (owned by the loop analysis: bertlint/analysis/dryrun.py, bertlint/trace.py)


def loop_timeline(ctx, run, micro_batch: Optional[int] = None, limit: int = 12) -> Optional[dict]:
    """The dry run of one loop (``run``: a dryrun.LoopRun, or the loop it ran) as a short micro-batch timeline:
    which calls run on which micro-batch, the loss scale, when the optimizer really steps, and the effective batch
    that implies."""
    from bertlint.analysis import dryrun

    if not isinstance(run, dryrun.LoopRun):
        run = dryrun.of(ctx).run_of(run)
    if run is None:
        return None
    traces = [t for t in run.traces if t.complete and t.events]
    if not traces:
        notes = sorted({n for t in run.traces for n in t.notes})
        return {"complete": False, "timeline": [], "configurations": len(run.traces), "notes": notes}
    run.fill_lines()
    tr = traces[0]
    wins = tr.window_structure() or []
    steps = [w.step.mb + 1 for w in wins]
    sizes = [len(w.backwards) for w in wins]
    full = max(set(sizes), key=sizes.count) if sizes else None
    return {
        "complete": True,
        "n": tr.n,
        "n_text": tr.n_text,
        "n_source": tr.n_source,
        "owner": tr.owner,
        "configuration": tr.config_text() or None,
        "configurations": len(run.traces),
        "micro_batches": tr.micro_batches,
        "epoch_length": tr.epoch_len,
        "timeline": tr.timeline(limit=limit),
        "steps_after": steps[:8],
        "window_sizes": sizes[:8],
        "window": full,
        "effective_batch": (micro_batch * full) if (micro_batch and full) else None,
        "loss_divided": _loss_divided(tr),
    }


def _loss_divided(tr) -> Optional[bool]:
    """True when a backward's loss scale has a user ``1/N`` factor; False when every scale is known and none has;
    None (unknown) otherwise."""
    bws = tr.of("backward")
    if any(f.kind == "user" and f.power < 0 for e in bws if e.scale is not None for f in e.scale.factors):
        return True
    if bws and all(e.scale is not None and e.scale.known for e in bws):
        return False
    return None


def render_timeline(dr: Optional[dict]) -> list:
    """Text lines of :func:`loop_timeline` for ``explain``'s text output."""
    if not dr:
        return []
    if not dr.get("complete"):
        why = "; ".join(dr.get("notes") or []) or "not understood"
        return [f"  dry run:          no timeline ({why})"]
    n = dr.get("n")
    head = "  dry run:          "
    if n is not None:
        head += f"N = {n}" + (f" standing for `{dr['n_text']}`" if dr.get("n_source") == "representative" else "")
    else:
        head += "no accumulation factor found"
    head += f", {dr.get('epoch_length')} micro-batches per epoch"
    if dr.get("configuration"):
        head += f", {dr['configuration']}"
    if dr.get("configurations", 1) > 1:
        head += f" ({dr['configurations']} configurations run)"
    out = [head]
    out.extend("    " + r for r in dr.get("timeline", []))
    if dr.get("steps_after"):
        eff = f"; effective batch {dr['effective_batch']} per device" if dr.get("effective_batch") else ""
        out.append(f"    optimizer takes effect after micro-batches {', '.join(map(str, dr['steps_after']))} "
                   f"(windows of {', '.join(map(str, dr['window_sizes']))}){eff}")
    return out


def _in_node(ctx, node, row: int) -> bool:
    try:
        a, b = ctx.span(node)
        return a.row <= row <= b.row
    except Exception:
        return False


def _lint(source: str, filename: str, settings) -> list:
    try:
        from bertlint.api import lint_text

        return lint_text(source, filename, settings)
    except ImportError:
        from bertlint.engine import lint_python

        return lint_python(source, filename, settings)


def _explain_setup(ctx, fs, s, versions, world, world_src, world_known, seq_len_arg, findings) -> dict:
    a, m, t = s.args, s.model, s.trainer
    row = ctx.span(s.node)[0].row
    b, n = _num(s.micro_batch), _num(s.accumulation)
    d: dict = {"framework": s.framework, "row": row}
    if t is not None:
        d["trainer"] = {"class": t.class_name, "variable": t.var}
    if m is not None:
        d["model"] = {
            "class": m.class_name or m.declared_class, "declared": m.declared_class, "checkpoint": m.checkpoint,
            "parameters": m.parameters, "parameters_source": m.architecture_source, "peft": m.peft or m.kbit,
            "weights_dtype": m.weights_dtype or (m.dtype if m.dtype else None),
        }
    else:
        d["model"] = None
    d["micro_batch"] = {"value": b, "origin": a.origin("per_device_train_batch_size") if a else "unknown"}
    d["accumulation"] = {"value": n, "origin": a.origin("gradient_accumulation_steps") if a else "unknown"}
    d["world_size"] = {"value": world if world_known else None, "source": world_src}
    if b and n:
        eff = b * n * world
        formula = f"{b} × {n} × {world} = {eff}"
        d["effective_batch"] = {"value": eff, "formula": formula,
                                "text": f"{eff} = {b} (per device) × {n} (accumulation) × {world} (world size"
                                        + ("" if world_known else ": per process") + ")"}
    else:
        d["effective_batch"] = {"value": None, "formula": None,
                                "text": "per_device_train_batch_size × gradient_accumulation_steps × world size "
                                        "(values not all known statically)"}
    d["optimizer_steps"] = _steps(s, world)
    d["scheduler"] = _scheduler(s, ctx)
    d["precision"] = s.precision
    if d["precision"] == "unknown" and a is not None and a.runtime_cli:
        d["precision"] = "set on the command line (default: float32, no mixed precision)"
    d["checkpointing"] = checkpointing_info(s, versions)
    d["loss_division"] = who_divides(s, versions, fs)
    sl, sl_src = _seq_len(ctx, s, seq_len_arg)
    mem = _estimate(ctx, s, sl, world, versions)
    if mem is None:
        mem = dict(first_order_memory(s, sl, world, versions))
        mem.setdefault("method", "first-order")
    else:
        mem = dict(mem)
        mem.setdefault("method", "simulated")
    mem["seq_len"] = sl
    mem["seq_len_source"] = sl_src
    d["memory"] = mem
    d["transformers"] = versions.transformers.describe()
    d["findings"] = [f for f in (
        {"code": x.code, "severity": x.severity.value, "row": x.start.row, "column": x.start.column,
         "message": x.message} for x in findings)]
    return d


def render_text(rep: dict) -> str:
    lines = [f"{rep['filename']}"]
    if rep.get("error"):
        lines.append(f"  {rep['error']}")
        return "\n".join(lines) + "\n"
    if not rep["setups"] and not rep["loops"]:
        lines.append("  no training set-up found (no TrainingArguments / Trainer; no training loop)")
    for i, d in enumerate(rep["setups"], 1):
        lines.append(f"\nSet-up {i}: {d['framework']} (line {d['row']}), assuming {d['transformers']}")
        m = d["model"]
        if m:
            p = m.get("parameters")
            ptxt = f", {_params_text(p)} parameters ({m.get('parameters_source')})" if p else ", parameter count unknown"
            extra = " + PEFT adapters" if m.get("peft") else ""
            wd = f", weights {m['weights_dtype']}" if m.get("weights_dtype") else ""
            ck = f" from {m['checkpoint']!r}" if m.get("checkpoint") else ""
            lines.append(f"  model:            {m.get('class') or 'unknown'}{ck}{extra}{ptxt}{wd}")
        else:
            lines.append("  model:            unknown")
        mb, ac = d["micro_batch"], d["accumulation"]
        lines.append(f"  micro-batch:      {mb['value'] if mb['value'] is not None else 'unknown'} per device ({mb['origin']})")
        lines.append(f"  accumulation:     {ac['value'] if ac['value'] is not None else 'unknown'} ({ac['origin']})")
        ws = d["world_size"]
        lines.append(f"  world size:       {ws['value'] if ws['value'] is not None else 1}, {ws['source']}")
        lines.append(f"  effective batch:  {d['effective_batch']['text']}")
        lines.append(f"  optimizer steps:  {d['optimizer_steps']['text']}")
        lines.append(f"  scheduler:        {d['scheduler']}")
        lines.append(f"  precision:        {d['precision']}")
        lines.append(f"  checkpointing:    {d['checkpointing']['text']}")
        ld = d["loss_division"]
        lines.append(f"  loss ÷ N by:      {ld['who']} — {ld['detail']}")
        mem = d["memory"]
        lines.append(f"  memory ({mem.get('method', 'first-order')}, per device, seq_len {mem.get('seq_len') or 'unknown'}: "
                     f"{mem.get('seq_len_source')}):")
        for k in ("parameters", "gradients", "optimizer_states", "activations", "total"):
            lines.append(f"    {k.replace('_', ' '):<18}{_bytes(mem.get(k))}")
        for asm in mem.get("assumptions", []):
            lines.append(f"    - {asm}")
    for lp in rep.get("loops", []):
        lines.append(f"\nLoop (line {lp['row']}): {lp['framework']} training loop")
        m = lp.get("model")
        if m:
            p = m.get("parameters")
            lines.append(f"  model:            {m.get('class') or 'unknown'}"
                         + (f", {_params_text(p)} parameters ({m.get('parameters_source')})" if p else ""))
        mb = lp.get("micro_batch") or {}
        lines.append(f"  micro-batch:      {mb.get('value') if mb.get('value') is not None else 'unknown'} ({mb.get('origin')})")
        lines.append(f"  accumulation:     {lp['accumulation'] or 'none found'}"
                     + (f" ({lp['accumulation_source']})" if lp.get("accumulation_source") else ""))
        eff = lp.get("effective_batch") or {}
        if eff.get("formula"):
            suffix = "" if "—" in eff["formula"] else " (per device × accumulation × world size)"
            lines.append(f"  effective batch:  {eff['formula']}{suffix}")
        ld = lp['loss_divided']
        lines.append(f"  optimizer step:   {lp['optimizer_step']}; loss divided by N: "
                     f"{'unknown' if ld is None else ld}")
        lines.extend(render_timeline(lp.get("dry_run")))
        mem = lp.get("memory") or {}
        if mem.get("total"):
            lines.append(f"  memory ({mem.get('method', 'first-order')}, seq_len {mem.get('seq_len')}): "
                         + ", ".join(f"{k.replace('_', ' ')} {_bytes(mem.get(k))}" for k in
                                     ("parameters", "gradients", "optimizer_states", "activations")))
    lines.append("\nFindings:" if rep["findings"] else "\nFindings: none")
    for f in rep["findings"]:
        lines.append(f"  {rep['filename']}:{f['row']}:{f['column']}: {f['code']} {f['message']}")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list] = None) -> int:
    p = argparse.ArgumentParser(prog="bertlint explain", description="Explain the training set-up(s) of a script.")
    p.add_argument("files", nargs="+")
    p.add_argument("--output-format", choices=("text", "json"), default="text")
    p.add_argument("--world-size", type=int, default=None)
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--simulate", action="store_true",
                   help="replace the first-order memory estimate by a simulated training step "
                        "(bertlint memory; imports torch, takes seconds)")
    try:
        a = p.parse_args(argv)
    except SystemExit as e:
        return 2 if e.code else 0
    if a.simulate:
        try:
            from bertlint.memory import explain_estimator

            register_memory_estimator(explain_estimator)
        except ImportError as e:
            print(f"bertlint explain: --simulate needs the 'verify' extra (torch, transformers): {e}", file=sys.stderr)
            return 2
    reports = []
    rc = 0
    for path in a.files:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError as e:
            print(f"bertlint explain: {path}: {e.strerror}", file=sys.stderr)
            rc = 2
            continue
        try:
            from bertlint.api import load_settings

            settings = load_settings(path)
        except Exception:
            from bertlint.config import Settings

            settings = Settings()
        findings = None
        if path.endswith(".ipynb"):  # the cells joined into one Python source; findings keep their cell rows
            try:
                from bertlint.sources import read_notebook

                findings = _lint(text, path, settings)
                text = read_notebook(text).source
            except Exception:
                findings = findings or []
        reports.append(explain_source(text, path, settings, world_size=a.world_size, seq_len=a.seq_len,
                                      findings=findings))
    if a.output_format == "json":
        print(json.dumps(reports if len(reports) != 1 else reports[0], indent=2, default=str))
    else:
        sys.stdout.write("".join(render_text(r) for r in reports))
    return rc
