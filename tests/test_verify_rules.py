"""The verifier's decision logic and its measuring pieces, in-process and fast: the loss-scale reading on real
autograd graphs, the saved-for-backward accounting, and the per-rule confirm/refute decisions on records shaped
exactly as the child process writes them (for the frameworks this CPU machine cannot run: DeepSpeed, CUDA fp16)."""

from __future__ import annotations

import pytest

from bertlint.types import Diagnostic, Position, Severity
from bertlint.verify._report import _growth, levers, memory_report
from bertlint.verify._rules import Run, runtime_findings, verify_diagnostic

torch = pytest.importorskip("torch")


def d(code, row=10, sev="E", **data):
    return Diagnostic(code, code.lower(), Severity(sev), "m", "/x/train.py", Position(row, 1), Position(row, 2),
                      data=data)


def rec(**kw):
    base = {"rank": 0, "status": "stopped", "stop_reason": "bound", "microbatches": 9, "optimizer_steps": 2,
            "counts": {"backward": 9}, "windows": [], "backwards": [], "script": "/x/train.py"}
    base.update(kw)
    return base


def win(index, mb, since, in_grad=None, **kw):
    return {"opt": 1, "index": index, "mb": mb, "since_step": since, "in_grad": since if in_grad is None else in_grad,
            **kw}


# ---- measuring pieces (real torch) ----------------------------------------------------------------------------


def test_loss_factor_reads_the_division_between_criterion_and_backward():
    from bertlint.verify._hooks import _loss_factor

    x = torch.randn(4, 3, requires_grad=True)
    y = torch.tensor([0, 1, 2, 0])
    crit = torch.nn.functional.cross_entropy(x, y)
    assert _loss_factor((crit / 4).grad_fn, [crit.grad_fn]) == (0.25, "NllLossBackward0")
    assert _loss_factor((crit * 0.5 / 4).grad_fn, [])[0] == pytest.approx(0.125)  # stops at the loss node
    assert _loss_factor(crit.grad_fn, [])[0] == 1.0
    # a sum-type "loss" with an unknown normaliser: not read
    assert _loss_factor((x.sum() / 7).grad_fn, [])[0] is None


def test_tracker_counts_activations_and_gradients_and_frees():
    from bertlint.verify._memory import MemoryTracker

    m = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    t = MemoryTracker()
    t.install()
    try:
        t.track_params(m.parameters())
        t.phase_begin("forward")
        out = m(torch.randn(32, 64)).sum()
        t.phase_begin("backward")  # the forward's live storages become activations
        cats = t.categories()
        # the input (saved by the first Linear) and the ReLU output (saved by ReLU and the second Linear); the
        # first Linear's output was freed inside the forward
        assert cats["activations"] >= 32 * 64 * 4 + 32 * 256 * 4
        assert cats["parameters"] == sum(p.numel() * 4 for p in m.parameters()) and cats["gradients"] == 0
        out.backward()
        del out
        after = t.categories()
        assert after["activations"] == 0  # the graph was freed by backward
        assert after["gradients"] == cats["parameters"]
        assert t.t.peak.total >= cats["parameters"] + cats["activations"]
    finally:
        t.uninstall()


def test_tracker_keeps_no_graph_alive_and_keeps_the_inplace_error():
    from bertlint.verify._memory import MemoryTracker

    m = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 2))
    t = MemoryTracker()
    t.install()
    try:
        t.track_params(m.parameters())
        t.phase_begin("eval")
        for _ in range(3):  # evaluation with grad on, nothing kept by the caller
            out = m(torch.randn(16, 8))
        t.phase_begin("idle")
        one = t.activation_bytes()
        assert 0 < one < 2 * (16 * 64 * 4 * 2 + 16 * 2 * 4 + 16 * 8 * 4)  # one forward's graph, not three
        del out
        assert t.activation_bytes() == 0
        y = torch.randn(3, requires_grad=True)
        z = y.exp()
        z.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            z.sum().backward()
    finally:
        t.uninstall()


# ---- decisions ---------------------------------------------------------------------------------------------------


def test_step_counter_counting_microbatches_bl110():
    lines = ["x"] * 9 + ["    global_step += 1"]
    watch = {"global_step": [[i, i // 4, i] for i in range(1, 10)]}
    run = Run([rec(watch=watch)], None)
    st, ev = verify_diagnostic(run, d("BL110", sev="W"), lines)
    assert st == "confirmed" and "`global_step` advanced 8 times over 8 micro-batches while 2 optimizer steps" in ev
    watch = {"global_step": [[i, i // 4, i // 4] for i in range(1, 10)]}
    assert verify_diagnostic(Run([rec(watch=watch)], None), d("BL110", sev="W"), lines)[0] == "refuted"


def test_deepspeed_engine_step_behind_a_gate_bl115():
    ds = {"backward": 9, "step": 2, "gas": 4, "global_steps": 0, "micro_steps": 2, "records": []}
    st, ev = verify_diagnostic(Run([rec(deepspeed=ds)], None), d("BL115"), [])
    assert st == "confirmed" and "9 engine.backward calls, 2 engine.step calls" in ev and "expected 2" in ev
    ds = {"backward": 9, "step": 9, "gas": 4, "global_steps": 2, "micro_steps": 9, "records": []}
    assert verify_diagnostic(Run([rec(deepspeed=ds)], None), d("BL115"), [])[0] == "refuted"


def test_fp16_weights_under_a_grad_scaler_bl204_and_the_crash_text():
    r = rec(dtypes={"trainable": {"float16": 1000}}, counts={"backward": 2, "scaler_scale": 2})
    assert verify_diagnostic(Run([r], None), d("BL204"), [])[0] == "confirmed"
    assert [f["code"] for f in runtime_findings(Run([dict(r, scaler=[{"k": "scaler_scale", "line": ["/x/train.py", 7]}])], None), set())] == ["BL204"]
    r = rec(dtypes={"trainable": {"float32": 1000}})
    assert verify_diagnostic(Run([r], None), d("BL204"), [])[0] == "refuted"
    crash = {"type": "ValueError", "message": "Attempting to unscale FP16 gradients.", "user_frame": ["/x/train.py", 30]}
    st, ev = verify_diagnostic(Run([rec(microbatches=1, crash=crash, status="crashed")], None), d("BL204"), [])
    assert st == "confirmed" and "Attempting to unscale FP16 gradients" in ev and "train.py:30" in ev


def test_pure_bf16_weights_bl205():
    ch = [{"elements": 1000, "unchanged": 720, "fraction_unchanged": 0.72}]
    st, ev = verify_diagnostic(Run([rec(bf16_changes=ch, windows=[win(1, 1, 1, lr=2e-5)])], None), d("BL205", sev="W"), [])
    assert st == "confirmed" and "72%" in ev
    ch = [{"elements": 1000, "unchanged": 10, "fraction_unchanged": 0.01}]
    assert verify_diagnostic(Run([rec(bf16_changes=ch)], None), d("BL205", sev="W"), [])[0] == "refuted"


def test_crash_texts_confirm_configuration_rules_and_others_stay_inconclusive():
    crash = {"type": "TypeError", "message": "MyTrainer.compute_loss() got an unexpected keyword argument "
             "'num_items_in_batch'", "user_frame": ["/x/train.py", 50]}
    run = Run([rec(microbatches=0, optimizer_steps=0, crash=crash, status="crashed")], None)
    assert verify_diagnostic(run, d("BL404"), [])[0] == "confirmed"
    st, ev = verify_diagnostic(run, d("BL101"), [])
    assert st == "inconclusive" and "crashed" in ev
    assert verify_diagnostic(run, d("BL406", sev="W"), [])[0] == "not-run"


def test_no_training_step_is_inconclusive_with_the_reason():
    run = Run([rec(microbatches=0, optimizer_steps=0, status="stopped", stop_reason="timeout")], None)
    st, ev = verify_diagnostic(run, d("BL102"), [])
    assert st == "inconclusive" and "--verify-timeout" in ev


def test_growth_rate_and_levers_order():
    samples = [{"event": "backward-end", "microbatch": i, "step": 0, "gradients": 10, "optimizer_states": 0,
                "activations": 1000 + 50000 * i, "total": 1010 + 50000 * i} for i in range(1, 8)]
    g = _growth(samples, [])
    assert "activations" in g["growing"] and g["growing"]["activations"]["bytes_per_unit"] == pytest.approx(50000)
    flat = [dict(s, activations=1000, total=1010) for s in samples]
    assert _growth(flat, [])["growing"] == {}
    lv = levers({"activations": 8 << 20, "parameters": 4 << 20, "gradients": 4 << 20, "optimizer_states": 8 << 20},
                Run([rec(accumulation=4, dtypes={"all": {"float32": 10}})], None))
    assert [x["saves_bytes"] for x in lv] == [4 << 20, 4 << 20, int((8 << 20) * 0.85), 4 << 20, 4 << 20]
    crash = {"type": "OutOfMemoryError", "message": "CUDA out of memory", "oom": True, "phase": "backward",
             "memory": {"activations": 8 << 20, "parameters": 1, "gradients": 1, "optimizer_states": 1}}
    m = memory_report(Run([rec(crash=crash, memory={"samples": samples, "phase_peaks": {}})], None))
    assert m["oom"]["phase"] == "backward" and m["oom"]["levers"][0]["lever"].startswith("halve the micro-batch")


# ---- one definition: the linter's invariants on the observed trace (bertlint.trace) -------------------------------


def _loop_record(n_mb=9, accumulation=4, sched_every_mb=False, zero_every_mb=False, factor=None, offset=0,
                 record_n=True, **kw):
    """A plain loop's record as the child writes it: backward on every micro-batch, the step when
    ``(i + 1 + offset) % accumulation == 0``."""
    ev, bws = [], []
    f = "/x/train.py"
    steps = 0
    for i in range(n_mb):
        if zero_every_mb:
            ev.append({"k": "zero_grad", "mb": i, "kind": "optimizer", "oid": "SGD@1", "line": [f, 9]})
        ev.append({"k": "backward", "mb": i, "line": [f, 11]})
        bws.append({"factor": 1 / accumulation if factor is None else factor, **kw.get("bw", {})})
        if sched_every_mb:
            ev.append({"k": "scheduler_step", "mb": i + 1, "cls": "LambdaLR", "line": [f, 12]})
        if (i + 1 + offset) % accumulation == 0:
            steps += 1
            ev.append({"k": "optimizer_step", "mb": i + 1, "opt": "SGD", "oid": "SGD@1", "line": [f, 14]})
            if not zero_every_mb:
                ev.append({"k": "zero_grad", "mb": i + 1, "kind": "optimizer", "oid": "SGD@1", "line": [f, 15]})
    extra = {k: v for k, v in kw.items() if k != "bw"}
    return rec(accumulation=accumulation if record_n else None, events=ev, backwards=bws, microbatches=n_mb,
               optimizer_steps=steps, **extra)


def test_double_division_by_the_script_and_accelerate_is_confirmed_and_single_refuted():
    acc = {"backward_calls": 12, "gradient_accumulation_steps": 4}
    r = _loop_record(13, factor=1 / 16, accelerate=acc, bw={"via_accelerate": True})
    st, ev = verify_diagnostic(Run([r], None), d("BL104"), [])
    assert st == "confirmed", ev
    assert "observed: micro-batch 1: backward with loss × 1/N² = 1/16" in ev and "accelerate's own" in ev
    assert "weighs 1/4 in all" in ev
    r = _loop_record(13, factor=1 / 4, accelerate=acc, bw={"via_accelerate": True})
    st, ev = verify_diagnostic(Run([r], None), d("BL104"), [])
    assert st == "refuted" and "divided by N once (N = 4)" in ev and "(0.25 observed)" in ev


def test_unscaled_loss_with_accumulation_confirms_bl103_quoting_the_windows():
    st, ev = verify_diagnostic(Run([_loop_record(13, factor=1.0)], None), d("BL103", sev="W"), [])
    assert st == "confirmed"
    assert "observed: micro-batches 1–4: backward ×4 with loss × 1 each" in ev and "4× the window's mean" in ev
    assert "[13 micro-batches, 3 optimizer steps (after micro-batches 4, 8, 12: windows of 4, 4, 4); loss × 1 at " \
        "backward (1 observed)]" in ev
    st, ev = verify_diagnostic(Run([_loop_record(13)], None), d("BL103", sev="W"), [])
    assert st == "refuted" and "a window of 4 weighs 1" in ev


def test_first_window_check_needs_three_windows_and_says_so():
    # `if i % N == 0` on a 0-based index: steps after micro-batches 1, 5, 9 ...
    short = _loop_record(9, offset=3, record_n=True)
    short["events"] = [e for e in short["events"] if not (e["k"] != "backward" and e["mb"] > 5)]
    short["backwards"], short["events"] = short["backwards"][:6], [e for e in short["events"] if e["mb"] <= 5]
    st, ev = verify_diagnostic(Run([short], None), d("BL107", sev="W"), [])
    assert st == "inconclusive" and ev.startswith("not exercised: the run stopped at the bound")
    assert "after 2 optimizer steps; the check needs 3 windows (the first window and two full ones" in ev
    st, ev = verify_diagnostic(Run([_loop_record(13, offset=3)], None), d("BL107", sev="W"), [])
    assert st == "confirmed" and "after the 1st micro-batch, then every 4" in ev
    st, ev = verify_diagnostic(Run([_loop_record(13)], None), d("BL107", sev="W"), [])
    assert st == "refuted" and "the first window has 4 micro-batches, like the next ones" in ev


def test_scaler_update_without_step_bl202():
    f = "/x/train.py"
    ev = []
    for i in range(8):
        ev += [{"k": "backward", "mb": i, "line": [f, 10]}, {"k": "scaler_update", "mb": i + 1, "line": [f, 12]}]
        if (i + 1) % 4 == 0:
            ev += [{"k": "optimizer_step", "mb": i + 1, "oid": "A", "line": [f, 13]},
                   {"k": "scaler_step", "mb": i + 1, "stepped": True, "oid": "A", "line": [f, 13]}]
    r = rec(events=ev, backwards=[{"factor": 0.25, "scaler_scale": 65536.0}] * 8, accumulation=4, microbatches=8)
    st, e = verify_diagnostic(Run([r], None), d("BL202"), [])
    assert st == "confirmed" and "No inf checks were recorded" in e
    ok = [x for x in ev if x["k"] != "scaler_update" or x["mb"] % 4 == 0]
    ok = sorted(ok, key=lambda x: (x["mb"], x["k"] == "scaler_update"))
    st, e = verify_diagnostic(Run([dict(r, events=ok)], None), d("BL202"), [])
    assert st == "refuted" and "one per optimizer step" in e


def test_unsynced_last_micro_batch_under_ddp_confirms_bl114_and_diverging_ranks_are_quoted():
    sync = [{"ddp_sync": (i + 1) % 4 == 0, "in_no_sync": (i + 1) % 4 != 0, "factor": 0.25} for i in range(13)]
    bad = [{"ddp_sync": False, "in_no_sync": True, "factor": 0.25} for _ in range(13)]
    ddp = {"world_size": 2, "no_sync_entries": 9}
    w0 = [win(1, 4, 4, grad_checksum=0.5)]
    w1 = [win(1, 4, 4, grad_checksum=0.4)]
    r0 = _loop_record(13, ddp=ddp, windows=w0)
    r1 = _loop_record(13, ddp=ddp, windows=w1, rank=1)
    r0["backwards"] = r1["backwards"] = bad
    st, ev = verify_diagnostic(Run([r0, r1], None), d("BL114"), [])
    assert st == "confirmed" and "no all-reduce before the update" in ev and "replicas diverge" in ev
    r0["backwards"] = r1["backwards"] = sync
    r1["windows"] = w0
    st, ev = verify_diagnostic(Run([r0, r1], None), d("BL114"), [])
    assert st == "refuted" and "forwarded with gradient sync on" in ev
    st, ev = verify_diagnostic(Run([_loop_record(13)], None), d("BL114"), [])
    assert st == "inconclusive" and "DistributedDataParallel was not initialised" in ev


def test_observed_trace_has_the_windows_and_scales_of_the_run():
    from bertlint.verify import _trace

    t = _trace.build(_loop_record(), 4)
    assert [len(w.backwards) for w in t.window_structure()] == [4, 4]
    assert t.of("backward")[0].scale.text(4) == "1/N = 1/4"
    assert t.of("step")[0].mb == 3 and t.of("step")[0].line == 14


def test_static_finding_is_confirmed_by_its_invariant_on_the_observed_trace():
    run = Run([_loop_record(zero_every_mb=True)], None)
    st, ev = verify_diagnostic(run, d("BL102", row=9), [])
    assert st == "confirmed"
    assert "observed: micro-batches 1–4: backward ×4" in ev and "gradients of" in ev and "erased" in ev
    # the correct loop: the invariant holds, the checker refutes
    st, ev = verify_diagnostic(Run([_loop_record()], None), d("BL102", row=9), [])
    assert st == "refuted" and ev.startswith("observed, the invariant holds: 9 micro-batches, 2 optimizer steps")


def test_violated_invariant_is_reported_at_runtime_without_a_static_finding():
    found = runtime_findings(Run([_loop_record(sched_every_mb=True)], None), set())
    (f,) = [x for x in found if x["code"] == "BL105"]
    assert f["line"] == ["/x/train.py", 12]
    assert f["evidence"].startswith("observed: micro-batches 5–8: backward ×4, `scheduler.step()` ×4, ")
    assert "4× too fast" in f["evidence"]
    # the scheduler check does not read N: found with no accumulation setting too
    r = _loop_record(sched_every_mb=True, record_n=False)
    assert [x["code"] for x in runtime_findings(Run([r], None), set())] == ["BL105"]
    # an invariant that reads N, with N known only from the loss scale (0.25 could be a loss weight): not reported
    r = _loop_record(13, offset=3, record_n=False)
    assert not [x for x in runtime_findings(Run([r], None), set()) if x["code"] == "BL107"]
    r = _loop_record(13, offset=3)
    (f,) = [x for x in runtime_findings(Run([r], None), set()) if x["code"] == "BL107"]
    assert f["line"] == ["/x/train.py", 14] and f["message"].endswith("Step when `(i + 1) % N == 0`.")


def test_epoch_tail_finding_is_confirmed_by_a_longer_window_and_never_refuted():
    tail = {"kind": "leaked"}
    r = _loop_record(13)
    st, ev = verify_diagnostic(Run([r], None), d("BL107", sev="W", tail=tail), [])
    assert st == "inconclusive" and ev.startswith("not exercised: 13 micro-batches, 3 optimizer steps") \
        and "needs an epoch's end with a partial window" in ev
    # the last 2 micro-batches of an epoch of 10 were not stepped: the next update sums 6
    f = "/x/train.py"
    ev_ = []
    for i in range(16):
        ev_.append({"k": "backward", "mb": i, "line": [f, 11]})
        if i + 1 in (4, 8, 14):
            ev_ += [{"k": "optimizer_step", "mb": i + 1, "oid": "A", "line": [f, 14]},
                    {"k": "zero_grad", "mb": i + 1, "kind": "optimizer", "oid": "A", "line": [f, 15]}]
    r = rec(accumulation=4, events=ev_, backwards=[{"factor": 0.25}] * 16, microbatches=16)
    st, ev = verify_diagnostic(Run([r], None), d("BL107", sev="W", tail=tail), [])
    assert st == "confirmed" and "micro-batches 9–14: backward ×6" in ev and "the other windows hold 4" in ev
