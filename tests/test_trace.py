"""The shared trace model (bertlint/trace.py): invariants over hand-built traces, as the verifier will record them."""

from __future__ import annotations

from fractions import Fraction

from bertlint import trace as T

USER = T.Factor(T.ACCUM_USER, "N", power=-1)
FW = T.Factor(T.ACCUM_FRAMEWORK, "gradient_accumulation_steps", power=-1, who="accelerate")


def loop(n, body, epochs=1, length=8):
    """Run ``body(tr, mb, i)`` for each micro-batch; it appends events."""
    tr = T.Trace(n=n, n_text="N", epoch_len=length, epochs=epochs)
    mb = 0
    for ep in range(epochs):
        for i in range(length):
            before = len(tr.events)
            body(tr, mb, i)
            for e in tr.events[before:]:
                e.mb, e.epoch = mb, ep
            mb += 1
    return tr


def ev(kind, line, **kw):
    return T.Event(kind, line, **kw)


def codes(tr):
    return sorted({(v.code, v.event.line) for v in T.check_all(tr)})


def test_correct_window_has_no_violation():
    def body(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale((USER,)), text="loss.backward()"))
        if (i + 1) % 4 == 0:
            tr.events.append(ev("step", 5, opt="opt", text="opt.step()"))
            tr.events.append(ev("zero_grad", 6, opt="opt", of="optimizer", text="opt.zero_grad()"))
    tr = loop(4, body)
    assert len(tr.windows("opt")) == 2 and [len(w.backwards) for w in tr.windows("opt")] == [4, 4]
    assert codes(tr) == []
    assert sum(b.scale.value(4) for b in tr.windows()[0].backwards) == 1


def test_zero_grad_each_micro_batch_quotes_the_window():
    def body(tr, mb, i):
        tr.events.append(ev("zero_grad", 2, opt="opt", of="optimizer", text="opt.zero_grad()"))
        tr.events.append(ev("backward", 3, scale=T.Scale((USER,)), text="loss.backward()"))
        if (i + 1) % 4 == 0:
            tr.events.append(ev("step", 5, opt="opt", text="opt.step()"))
    tr = loop(4, body)
    vs = T.check(tr, "BL102")
    assert [v.event.line for v in vs] == [2]
    assert "micro-batches 1–4: backward ×4" in vs[0].message and "micro-batch 4 only, weighted 1/N = 1/4" in vs[0].message


def test_step_every_micro_batch_with_divided_loss():
    def body(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale((USER,)), text="loss.backward()"))
        tr.events.append(ev("step", 4, opt="opt", text="opt.step()"))
        tr.events.append(ev("zero_grad", 5, opt="opt", of="optimizer", text="opt.zero_grad()"))
    assert codes(loop(4, body)) == [("BL101", 4)]
    assert codes(loop(1, body)) == []  # N = 1: nothing accumulates


def test_unscaled_and_doubly_scaled_windows():
    def plain(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale(), text="loss.backward()"))
        if (i + 1) % 4 == 0:
            tr.events.append(ev("step", 5, opt="opt", text="opt.step()"))
            tr.events.append(ev("zero_grad", 6, opt="opt", of="optimizer"))
    assert codes(loop(4, plain)) == [("BL103", 3)]

    def twice(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale((USER, FW)), text="accelerator.backward(loss)"))
        if (i + 1) % 4 == 0:
            tr.events.append(ev("step", 5, opt="opt"))
    vs = T.check(loop(4, twice), "BL104")
    assert vs and "weighs 1/4 in all" in vs[0].message
    assert T.Scale((USER, FW)).value(4) == Fraction(1, 16) and T.Scale((USER, FW)).text(4) == "1/N² = 1/16"


def test_unknown_factor_stays_unknown():
    other = T.Factor(T.OTHER, "num_tokens", power=-1)

    def body(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale((other,))))
        if (i + 1) % 4 == 0:
            tr.events.append(ev("step", 5, opt="opt"))
    assert codes(loop(4, body)) == []


def test_first_window_scheduler_clip_and_scaler():
    def body(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale((USER, T.Factor(T.SCALER))), scaled=True))
        tr.events.append(ev("sched_step", 4, target="sched", text="sched.step()"))
        tr.events.append(ev("clip", 5, scaled=True, text="clip_grad_norm_()"))
        tr.events.append(ev("update", 6, target="scaler", text="scaler.update()"))
        if i % 4 == 0:
            tr.events.append(ev("step", 8, opt="opt", via="scaler", text="scaler.step(opt)"))
            tr.events.append(ev("zero_grad", 9, opt="opt", of="optimizer"))
    got = codes(loop(4, body, length=10))
    assert ("BL107", 8) in got and ("BL105", 4) in got and ("BL112", 5) in got
    assert ("BL201", 5) in got and ("BL202", 6) in got


def test_two_optimizers_on_different_schedules_have_no_window():
    def body(tr, mb, i):
        tr.events.append(ev("backward", 3, scale=T.Scale()))
        tr.events.append(ev("step", 4, opt="d"))
        if i % 3 == 0:
            tr.events.append(ev("step", 5, opt="g"))
    tr = loop(4, body)
    assert tr.window_structure() is None and codes(tr) == []


def _gated_no_sync_backward(fwd_certain):
    """An undecided gate (uncertain events): the backward of the gated branch inside no_sync(), its forward with
    sync on; ``fwd_certain`` says whether that forward ran outside the undecided condition."""
    def body(tr, mb, i):
        tr.events.append(ev("backward", 7, scale=T.Scale((USER,)), text="loss.backward()", certain=False,
                            in_no_sync=True, fwd_no_sync=False, cond_text="accumulating"))
        tr.events[-1].meta["fwd_certain"] = fwd_certain
        tr.events.append(ev("backward", 9, scale=T.Scale((USER,)), text="loss.backward()", certain=False,
                            fwd_no_sync=False, cond_text="accumulating"))
        tr.events[-1].meta["fwd_certain"] = fwd_certain
        tr.events.append(ev("step", 12, opt="opt", text="opt.step()", certain=False, cond_text="not accumulating"))
    tr = loop(4, body)
    tr.ddp, tr.sync_control = True, True
    return tr


def test_backward_only_no_sync_under_undecided_gate():
    vs = [v for v in T.check_all(_gated_no_sync_backward(True)) if v.code == "BL114"]
    assert [(v.event.line, v.data["kind"]) for v in vs] == [(7, "backward-only")]
    assert "`accumulating`" in vs[0].message


def test_backward_only_silent_when_forward_itself_was_conditional():
    # the forward's own sync state on the path that reaches the gated backward is not known: stay silent
    assert not [v for v in T.check_all(_gated_no_sync_backward(False)) if v.code == "BL114"]


# ------------------------------------------------------------------------------------------------ the epoch's tail


def _tail_trace(zero_at_epoch_start: bool, counter_across_epochs: bool = False, flush: bool = False,
                rescale: bool = False):
    """Two epochs of 10 micro-batches, N = 4, backward on each, step on the window's last one."""
    tr = loop(4, lambda *a: None, epochs=0)
    tr.epochs, tr.epoch_len, tr.loader, tr.epochs_from = 2, 10, "loader", "loop"
    mb = 0
    seen = 0
    for ep in range(2):
        if zero_at_epoch_start:
            tr.events.append(ev("zero_grad", 2, opt="opt", of="optimizer", text="opt.zero_grad()", mb=mb - 1,
                                epoch=ep))
        for i in range(10):
            tr.events.append(ev("backward", 3, scale=T.Scale((USER,)), text="loss.backward()", mb=mb, epoch=ep))
            seen += 1
            k = seen if counter_across_epochs else i + 1
            if k % 4 == 0 or (flush and i == 9):
                if rescale:
                    tr.events.append(ev("rescale", 4, mb=mb, epoch=ep))
                tr.events.append(ev("step", 5, opt="opt", text="opt.step()", mb=mb, epoch=ep))
                tr.events.append(ev("zero_grad", 6, opt="opt", of="optimizer", text="opt.zero_grad()", mb=mb,
                                    epoch=ep))
            mb += 1
    return tr


def test_epoch_tail_dropped_by_the_next_epochs_zero_grad():
    tr = _tail_trace(zero_at_epoch_start=True)
    vs = T.check(tr, "BL107")
    assert [(v.event.line, v.data["kind"], v.data["tail"]) for v in vs] == [(5, "dropped", 2)]
    assert "micro-batches 9–10" in vs[0].message and "10 micro-batches per epoch = 2×4 + 2" in vs[0].message
    assert T.check(tr, "BL102") == []  # the epoch-start clear is the tail's mistake, not an erased window


def test_epoch_tail_leaked_into_the_next_epochs_first_update():
    tr = _tail_trace(zero_at_epoch_start=False)
    vs = T.check(tr, "BL107")
    assert [(v.data["kind"], v.data["tail"]) for v in vs] == [("leaked", 2)]
    assert "backward ×6 (2 from epoch 1 + 4) instead of 4, each weighted 1/4" in vs[0].message


def test_epoch_tail_not_reported_when_stepped_carried_or_unknown():
    assert T.check(_tail_trace(False, flush=True), "BL107") == []  # `or i + 1 == len(loader)` / a flush
    assert T.check(_tail_trace(True, flush=True), "BL107") == []
    assert T.check(_tail_trace(False, counter_across_epochs=True), "BL107") == []  # windows stay N long
    assert T.check(_tail_trace(False, rescale=True), "BL107") == []  # normalised by what the window holds
    for attr, value in (("loader", "range"), ("loader", "while"), ("epochs_from", "once"), ("undecided_skip", True)):
        tr = _tail_trace(False)
        setattr(tr, attr, value)
        assert T.check(tr, "BL107") == [], (attr, value)


def test_first_window_before_the_tail_one_finding_per_loop():
    tr = _tail_trace(False)
    # i % N == 0 on a 0-based index: steps after micro-batches 1, 5, 9 — the first window is the finding
    tr.events = [e for e in tr.events if e.kind == "backward"]
    out = []
    for b in tr.events:
        out.append(b)
        if (b.mb % 10) % 4 == 0:
            out.append(ev("step", 5, opt="opt", text="opt.step()", mb=b.mb, epoch=b.epoch))
            out.append(ev("zero_grad", 6, opt="opt", of="optimizer", mb=b.mb, epoch=b.epoch))
    tr.events = out
    vs = T.check(tr, "BL107")
    assert len(vs) == 1 and "first" in vs[0].data
