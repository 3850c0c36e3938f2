"""The micro-batch trace of one training loop, and the loop rules as invariants over it.

One data model for both sides of bertlint:

- the linter's dry run (``bertlint/analysis/dryrun.py``) executes a loop's body abstractly over a few epochs of
  micro-batches and records what it would do;
- the runtime verifier (``bertlint/verify``) records what the script really did, into the same model.

Both then run the same invariants (:data:`INVARIANTS`), so each rule has one definition. This module is plain
Python: no libcst, no torch.

A :class:`Trace` is an ordered list of :class:`Event` s. Each event knows the micro-batch it happened in (``mb``,
0-based, ``-1`` before the first), its epoch, its source line, and for a backward the loss scale as a symbolic
product (:class:`Scale`: ``1/N``, ``1/N²``, ``× scaler scale``). A step records whether it *takes effect* (a
prepared optimizer off the sync step, or a DeepSpeed engine off its boundary, is called but does nothing).

Event kinds (:data:`KINDS`)::

    forward      a model forward whose loss reaches a backward
    backward     scale=Scale; scaled=True when it ran through ``scaler.scale(loss)``
    zero_grad    target="optimizer"|"model" (``of`` tells which), effective
    unscale      scaler.unscale_(opt)
    clip         scaled=True|False|None (on scaled / unscaled gradients)
    rescale      gradients multiplied / divided in place (``p.grad /= N``), factor in ``scale``
    step         opt=..., effective=True|False|None, why=... ; via="scaler" for scaler.step(opt)
    update       scaler.update()
    sched_step   scheduler.step(), effective
    no_sync      entering a no_sync()/accumulate() non-sync region (info)
    counter      a hand counter changed (name in ``target``, value in ``value``)
    keep_loss    a loss kept with its graph across micro-batches (``total += loss``)
    boundary_set the script sets a DeepSpeed engine's accumulation boundary itself (opt=the engine)

A violation (:class:`Violation`) carries the rule code, the event it is reported at and the arithmetic quoted from
the trace ("micro-batches 1–4: backward ×4, zero_grad() before each, step after the 4th → the update sees
micro-batch 4 only, weighted 1/4"). Rules add the framework, version and fix.
"""

from __future__ import annotations

from bertlint._dataclass import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Iterable, Optional

KINDS = ("forward", "backward", "zero_grad", "unscale", "clip", "rescale", "step", "update", "sched_step",
         "no_sync", "counter", "keep_loss", "boundary_set")

# ------------------------------------------------------------------------------------------------ scales

ACCUM_USER = "user"  # the script divides by the accumulation factor
ACCUM_FRAMEWORK = "framework"  # accelerate / DeepSpeed divide by it
SCALER = "scaler"  # GradScaler's loss scale (always undone by unscale_ / step)
CONST = "const"  # a known number
OTHER = "other"  # a factor whose value is not known (``loss / num_tokens``)
WEIGHT = "weight"  # a loss weight that does not change with N (``loss * args.alpha``, a weighted sum of losses)


@dataclass(frozen=True)
class Factor:
    """One multiplicative factor of a loss scale: ``kind`` (see the constants above), the value as a power of N for
    accumulation factors (``power=-1`` is ``1/N``), or ``value`` for a constant."""

    kind: str
    text: str = ""
    power: int = 0  # for user / framework factors: N ** power
    value: Optional[Fraction] = None  # for const factors
    who: str = ""  # "accelerate", "deepspeed", ... for framework factors
    node: Any = field(default=None, compare=False, hash=False)  # where the producer saw it (static: the ``/ N``)


@dataclass(frozen=True)
class Scale:
    """A symbolic product of factors. ``Scale()`` is 1."""

    factors: tuple = ()

    def times(self, f: Factor) -> "Scale":
        return Scale(self.factors + (f,))

    @property
    def known(self) -> bool:
        """No factor of unknown value (the scaler's scale counts as known: it is always undone)."""
        return not any(f.kind in (OTHER, WEIGHT) for f in self.factors)

    @property
    def n_free(self) -> bool:
        """No accumulation factor and no unknown normalisation: only constants and N-independent weights."""
        return not any(f.kind in (OTHER, ACCUM_USER, ACCUM_FRAMEWORK) for f in self.factors)

    @property
    def n_power(self) -> int:
        return sum(f.power for f in self.factors if f.kind in (ACCUM_USER, ACCUM_FRAMEWORK))

    def by(self, kind: str) -> list:
        return [f for f in self.factors if f.kind == kind]

    def value(self, n: Optional[int]) -> Optional[Fraction]:
        """The numeric weight of the loss with the scaler's scale left out; None when a factor is unknown."""
        if not self.known:
            return None
        v = Fraction(1)
        for f in self.factors:
            if f.kind in (ACCUM_USER, ACCUM_FRAMEWORK):
                if n is None:
                    return None
                v *= Fraction(n) ** f.power
            elif f.kind == CONST and f.value is not None:
                v *= f.value
        return v

    def text(self, n: Optional[int] = None) -> str:
        """``1/N`` / ``1/N²`` (with ``= 1/16`` when N is known) / ``1`` / ``× scaler scale``."""
        parts = []
        p = self.n_power
        if p:
            sym = "N" if p == -1 else f"N{_sup(-p)}" if p < 0 else (f"N{_sup(p)}" if p > 1 else "N")
            s = f"1/{sym}" if p < 0 else sym
            v = self.value(n) if n is not None else None
            if v is not None and n is not None and n > 1 and not self.by(CONST):
                s += f" = {_frac(Fraction(n) ** p)}"
            parts.append(s)
        for f in self.factors:
            if f.kind == CONST and f.value is not None and f.value != 1:
                parts.append(_frac(f.value))
            elif f.kind in (OTHER, WEIGHT):
                parts.append(f"÷ {f.text}" if f.power < 0 else f"× {f.text}")
        if not parts or parts[0].startswith(("×", "÷")):
            parts.insert(0, "1")
        if self.by(SCALER):
            parts.append("× scaler scale")
        return " ".join(parts)


def _sup(k: int) -> str:
    return "".join("⁰¹²³⁴⁵⁶⁷⁸⁹"[int(c)] for c in str(k))


def _frac(v: Fraction) -> str:
    return str(v.numerator) if v.denominator == 1 else f"{v.numerator}/{v.denominator}"


# ------------------------------------------------------------------------------------------------ events


@dataclass
class Event:
    kind: str
    line: int = 0
    target: str = ""  # the receiver as written: "optimizer", "scaler", "model", "lr_scheduler", counter name
    opt: str = ""  # the optimizer acted on (step, zero_grad of an optimizer, unscale_, scaler.step(opt))
    of: str = ""  # zero_grad: "optimizer" | "model"
    scale: Optional[Scale] = None  # backward / rescale
    scaled: Optional[bool] = None  # backward through the scaler; clip on scaled gradients
    effective: Optional[bool] = True  # takes effect (False: a no-op; None: unknown)
    why: str = ""  # why it is not effective ("off the sync step", "off the DeepSpeed boundary")
    via: str = ""  # "scaler" for scaler.step(opt); "engine" for a DeepSpeed engine; "accelerator" ...
    certain: bool = True  # False: under a condition the dry run could not decide (it may or may not run)
    in_no_sync: bool = False
    fwd_no_sync: Optional[bool] = None  # backward: its loss's forward ran with gradient sync off (DDP decides there)
    graph_from: Optional[int] = None  # backward: the earliest micro-batch whose forward its graph holds
    graph_loop: str = ""  # backward: the loop (as written) each of whose iterations added its loss to this graph
    value: Any = None  # counter value
    text: str = ""  # the call as written
    mb: int = -1  # micro-batch (0-based) the event happened in; -1 before the first
    epoch: int = 0
    cond_line: int = 0  # line of the innermost condition it ran under (0: none)
    cond_text: str = ""
    node: Any = None  # the static analysis's node (never read by the invariants)
    meta: dict = field(default_factory=dict)  # producer-specific facts (statement, block, callees ...)

    @property
    def name(self) -> str:
        return self.text or self.kind

    @property
    def key(self):
        """Identifies the place (the same call on every micro-batch): the source line, else the producer's node."""
        return self.line or id(self.node) if self.node is not None else self.line


@dataclass
class Violation:
    code: str
    event: Event
    message: str  # the invariant and the arithmetic, quoted from the trace
    data: dict = field(default_factory=dict)
    related: list = field(default_factory=list)  # other events involved


@dataclass
class Window:
    """The events of one optimizer update: after the previous effective step, up to and including this one."""

    step: Event
    events: list
    first_mb: int
    last_mb: int
    steps: list = field(default_factory=list)  # every optimizer stepped at the end of this window

    def __post_init__(self) -> None:
        if not self.steps:
            self.steps = [self.step]

    @property
    def backwards(self) -> list:
        return [e for e in self.events if e.kind == "backward"]

    def of(self, *kinds: str) -> list:
        return [e for e in self.events if e.kind in kinds]

    @property
    def n_mbs(self) -> int:
        """How many micro-batches ran a backward in this window (one may run several: an adversarial (FGM / PGD)
        second loss, one backward per task or dataset of a multi-task step)."""
        return len({(e.epoch, e.mb) for e in self.events if e.kind == "backward"})

    @property
    def mbs(self) -> str:
        """``micro-batches 1–4`` (1-based for people)."""
        b = sorted({e.mb for e in self.backwards})
        if not b:
            return f"micro-batch {self.step.mb + 1}"
        if len(b) == 1:
            return f"micro-batch {b[0] + 1}"
        return f"micro-batches {b[0] + 1}–{b[-1] + 1}"


@dataclass
class Trace:
    events: list = field(default_factory=list)
    n: Optional[int] = None  # the accumulation factor the run used (None: unknown)
    n_text: str = "N"  # how the script spells it
    n_source: str = ""  # "resolved" | "representative" | "observed" | ...
    n_intended: bool = False  # the script asks for accumulation (a factor > 1 or a symbol) — not a guess
    config: dict = field(default_factory=dict)  # condition text -> bool fixed for this run
    owner: str = "plain"  # plain | accelerate | accelerate-manual | deepspeed | fabric | lightning | trainer
    epoch_len: Optional[int] = None  # micro-batches per epoch in the run
    epochs: int = 1
    complete: bool = True  # the producer understood every relevant statement
    ddp: Optional[bool] = None  # the model is wrapped in DistributedDataParallel (None: not known)
    fsdp_possible: bool = False  # the file (or a sibling module the run entered) uses torch's FSDP: a module's
    # no_sync() may be FSDP's, which decides at backward time (not at the forward, as DDP does)
    ddp_when: str = ""  # the condition of that wrapping ("when `args.distributed`"; "": unconditional)
    sync_control: bool = False  # the loop turns gradient sync off somewhere (no_sync, require_backward_grad_sync)
    line: int = 0  # the loop's line
    notes: list = field(default_factory=list)
    loader: str = ""  # what the micro-batch loop iterates: "loader" (length not known), "range", "while", "" (unknown)
    loader_text: str = ""  # the loader as written (``train_dataloader``), for messages
    index_text: str = ""  # the micro-batch index as written (``step`` of ``enumerate``), for messages
    epochs_from: str = ""  # "loop" (an epoch loop), "call" (the loop's function, once per epoch), "once" (no epochs)
    sites: dict = field(default_factory=dict)  # the producer's nodes by role ("accumulate": the accumulate() calls)
    undecided_skip: bool = False  # a ``continue`` / ``break`` under a condition the run could not decide
    driver: str = ""  # how the run called a function some caller outside the file drives ("`step()` called ...")
    after_loop: bool = False  # the statements after the loop ran at each epoch's end (the loop's function is one epoch)
    raised: bool = False  # the run reached a ``raise`` it could not avoid (this configuration stops the script)

    # ---------------------------------------------------------------- queries
    def of(self, *kinds: str) -> list:
        return [e for e in self.events if e.kind in kinds]

    @property
    def micro_batches(self) -> int:
        return max((e.mb for e in self.events), default=-1) + 1

    def optimizers(self) -> list:
        out: list = []
        for e in self.of("step"):
            if e.opt not in out:
                out.append(e.opt)
        return out

    def effective_steps(self, opt: Optional[str] = None) -> list:
        return [e for e in self.of("step") if e.effective is True and e.certain and (opt is None or e.opt == opt)]

    def windows(self, opt: Optional[str] = None) -> list:
        """One :class:`Window` per effective step of ``opt`` (the only optimizer when None)."""
        out = []
        start = 0
        prev_mb = -1
        for i, e in enumerate(self.events):
            if e.kind == "step" and e.effective is True and e.certain and (opt is None or e.opt == opt):
                evs = self.events[start:i + 1]
                bws = [x.mb for x in evs if x.kind == "backward"]
                out.append(Window(e, evs, min(bws) if bws else prev_mb + 1, e.mb))
                start = i + 1
                prev_mb = e.mb
        return out

    def window_structure(self) -> Optional[list]:
        """The windows every stepped optimizer shares, or None when optimizers step on different schedules
        (a GAN critic every k micro-batches): window rules then cannot tell which backward feeds which update."""
        opts = self.optimizers()
        if not opts:
            return None
        if any(not e.certain or e.effective is None for e in self.of("step")):
            return None  # a step that may or may not happen: window boundaries unknown
        ref = [e.mb for e in self.effective_steps(opts[0])]
        for o in opts[1:]:
            if [e.mb for e in self.effective_steps(o)] != ref:
                return None
        if len(opts) == 1:
            return self.windows(opts[0])
        # several optimizers stepped together (GAN, prompt + model): a window ends at any of their steps, so each
        # update owns the backwards since the previous one; steps with no backward between them share one window
        out: list = []
        start = 0
        prev_mb = -1
        for i, e in enumerate(self.events):
            if e.kind == "step" and e.effective is True:
                evs = self.events[start:i + 1]
                bws = [x.mb for x in evs if x.kind == "backward"]
                if out and not bws:
                    out[-1].events.extend(evs)
                    out[-1].steps.append(e)
                else:
                    out.append(Window(e, evs, min(bws) if bws else prev_mb + 1, e.mb))
                start = i + 1
                prev_mb = e.mb
        return out

    def lines_of(self, kind: str) -> list:
        return sorted({e.line for e in self.of(kind)})

    def config_text(self) -> str:
        """``when `args.fp16` is set and `config.CLIP` is not`` — the configuration a finding needs."""
        if not self.config:
            return ""
        parts = [(k[6:] if v else f"not {k[6:]}") if k.startswith("!when ") else
                 f"`{k}` is {'set' if v else 'not set'}" if not k.startswith("(") else f"{k} is {v}"
                 for k, v in self.config.items()]  # "!when ...": a configuration the producer words itself
        return "when " + " and ".join(parts)

    def timeline(self, limit: int = 12) -> list:
        """Short text lines: which calls run on which micro-batch (for ``explain``)."""
        rows: list = []
        pre = [e for e in self.events if e.mb < 0 and e.kind not in ("counter",)]
        if pre:
            rows.append("before the loop: " + ", ".join(_short(e, self.n) for e in pre))
        for mb in range(min(self.micro_batches, limit)):
            evs = [e for e in self.events if e.mb == mb and e.kind not in ("counter", "forward")]
            if not evs:
                continue
            ep = evs[0].epoch
            rows.append(f"mb {mb + 1:>2} (epoch {ep + 1}): " + ", ".join(_short(e, self.n) for e in evs))
        if self.micro_batches > limit:
            rows.append(f"… ({self.micro_batches} micro-batches simulated)")
        return rows


def _short(e: Event, n: Optional[int]) -> str:
    t = e.text or e.kind
    if e.kind == "backward" and e.scale is not None:
        t += f" [loss × {e.scale.text(n)}]"
    if e.kind in ("step", "zero_grad", "sched_step") and e.effective is False:
        t += " (no-op" + (f": {e.why}" if e.why else "") + ")"
    if e.kind == "clip" and e.scaled:
        t += " [on scaled grads]"
    if not e.certain:
        t += "?"
    return t


# ------------------------------------------------------------------------------------------------ helpers


def ordinal(k: int) -> str:
    if 10 <= k % 100 <= 20:
        suf = "th"
    else:
        suf = {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suf}"


def _first_unique(vs: Iterable[Violation]) -> list:
    seen = set()
    out = []
    for v in vs:
        key = (v.code, v.event.key)
        if key in seen:
            continue
        seen.add(key)
        out.append(v)
    return out


def _n(trace: Trace) -> str:
    return str(trace.n) if trace.n is not None else "N"


def accumulates(trace: Trace) -> Optional[str]:
    """Why the trace shows accumulation intent (a phrase), or None: a backward's loss carries 1/N with N > 1, or a
    call that belongs to the update (zero_grad, scaler.update, scheduler) runs once per N micro-batches."""
    if trace.n is None or trace.n <= 1:
        return None
    for b in trace.of("backward"):
        if b.certain and b.scale is not None and b.scale.n_power < 0:
            src = b.scale.by(ACCUM_USER) or b.scale.by(ACCUM_FRAMEWORK)
            f = src[0]
            if f.kind == ACCUM_USER:
                return f"the loss is divided by `{f.text}`"
            return f"{f.who or 'the framework'} divides the loss by `{f.text}`"
    return None


def full_windows(trace: Trace) -> Optional[list]:
    """The windows of the shared window structure, when the loop has one."""
    return trace.window_structure()


# ------------------------------------------------------------------------------------------------ invariants
# Each takes a Trace and returns a list of Violations. They read only events, never the program text.


def steps_delayed(trace: Trace) -> list:
    """BL101: in a loop that accumulates (1/N in the loss, N > 1), the optimizer steps once per N backwards — not
    after every backward."""
    why = accumulates(trace)
    if why is None:
        return []
    wins = trace.window_structure()
    mbs = trace.micro_batches
    if not wins or mbs < 2:
        return []
    bws = [b for b in trace.of("backward") if b.certain]
    if len({b.mb for b in bws}) < mbs:  # backward not on every micro-batch: not this mistake
        return []
    if not all(len(w.backwards) == 1 for w in wins) or len(wins) < mbs:
        return []
    out = []
    n = _n(trace)
    w = wins[0]
    scale = w.backwards[0].scale.text(trace.n) if w.backwards[0].scale else "1"
    for s in {id(x.step): x.step for x in wins}.values():
        msg = (f"micro-batches 1–{min(mbs, trace.n or 4)}: backward, then `{s.name}` after each "
               f"→ each update sees one micro-batch weighted {scale} instead of {n} micro-batches summing to 1 "
               f"({why})")
        out.append(Violation("BL101", s, msg, {"window": 1, "n": trace.n}))
    return _first_unique(out)


def grads_not_cleared_in_window(trace: Trace) -> list:
    """BL102: between two effective steps of an optimizer, no ``zero_grad`` of it erases the gradients that earlier
    micro-batches of the window accumulated (each optimizer has its own windows: a GAN's critic and generator)."""
    if trace.window_structure() is None and not _per_opt_ok(trace):
        return []
    opts = trace.optimizers()
    out = []
    for opt in opts:
        for w in trace.windows(opt):
            bws = [b for b in w.backwards if b.certain]
            if len({b.mb for b in bws}) < 2:
                continue
            first = w.events.index(bws[0])
            clears = [e for e in w.events[first + 1:] if e.kind == "zero_grad" and e.effective is True and e.certain
                      and ((e.of == "optimizer" and e.opt == opt) or (e.of != "optimizer" and len(opts) == 1))]
            if len(opts) > 1:
                # several optimizers: a backward followed by another optimizer's step (before the next backward)
                # fed that optimizer (a GAN's critic); only the others can be erased for this one
                bws = [b for b in bws if not _claimed(trace, b, opt)]
                if len({b.mb for b in bws}) < 2:
                    continue
            # a clear erases the backwards that ran before it (in this micro-batch too: ``backward(); zero_grad()``)
            # and that no other optimizer's update consumed in between: a GAN step function whose critic loop
            # steps ``d_opt`` and then clears the generator's gradients before the generator's own loop erases
            # nothing the generator's window owns
            clears = [e for e in clears if any(_erased_by(w, b, e, opt) for b in bws)]
            # a clear at the start of an epoch, before its first backward, after the previous epoch's tail: the tail
            # is dropped (BL107's epoch_tail), the window's own micro-batches are not erased
            clears = [e for e in clears if not _epoch_start_clear(w, e, bws)]
            if not clears:
                continue
            e = clears[-1]
            pos = w.events.index(e)
            before = [b for b in bws if _erased_by(w, b, e, opt)]
            kept = [b for b in bws if w.events.index(b) > pos]
            lost = len({b.mb for b in before})
            mbs = sorted({b.mb for b in bws})
            each = len(clears) >= len(mbs) - 1
            where = "before each" if each else f"after micro-batch {before[-1].mb + 1}"
            kmbs = sorted({b.mb for b in kept})
            scale = kept[0].scale.text(trace.n) if kept and kept[0].scale else "1"
            seen = (f"micro-batch {kmbs[-1] + 1} only" if len(kmbs) == 1 else
                    f"micro-batches {kmbs[0] + 1}–{kmbs[-1] + 1} only") if kept else "no backward"
            msg = (f"{w.mbs}: backward ×{len(bws)}, `{clears[0].name}` {where}, `{w.step.name}` after the "
                   f"{ordinal(len(mbs))} micro-batch → the update sees {seen}, weighted {scale}; the gradients of "
                   f"{lost} micro-batch{'es' if lost != 1 else ''} are erased")
            out.append(Violation("BL102", clears[0], msg, {"lost": lost, "window": len(mbs)}, [w.step]))
            break
    return _first_unique(_merge_adjacent(trace, out))


def _epoch_start_clear(w: Window, z: Event, bws: list) -> bool:
    """``z`` separates epochs: every backward of the window before it ran in an earlier epoch than every backward
    after it (a clear at the start of an epoch, before its first backward, or one after the epoch's loop that drops
    an incomplete tail: ``if i % N != N - 1: optimizer.zero_grad()``), and it runs in neither epoch's middle."""
    pos = w.events.index(z)
    before = [b for b in bws if w.events.index(b) < pos]
    if not before:
        return False
    if all(b.epoch < z.epoch for b in before):
        return True
    after = [b for b in bws if w.events.index(b) > pos]
    last = max(b.epoch for b in before)
    return bool(after) and z.epoch == last and all(b.epoch > last for b in after)


def _merge_adjacent(trace: Trace, vs: list) -> list:
    """Several optimizers cleared together (``opt_a.zero_grad(); opt_b.zero_grad()`` before the same backward) are
    one mistake: one violation at the first, naming the others."""
    if len(vs) < 2:
        return vs
    pos = {id(v): trace.events.index(v.event) for v in vs}
    vs = sorted(vs, key=lambda v: pos[id(v)])
    out = [vs[0]]
    for v in vs[1:]:
        prev = out[-1]
        between = trace.events[pos[id(prev)] + 1:pos[id(v)]]
        if not any(e.kind == "backward" for e in between):
            prev.related.append(v.event)
            prev.message += f" (the same for `{v.event.name}`)"
        else:
            out.append(v)
    return out


def _claimed(trace: Trace, b: Event, opt: str) -> bool:
    """Another optimizer's step is called after ``b`` and before the next backward, and ``opt``'s is not: the
    backward fed that optimizer. A call that is a no-op off accelerate's sync step counts too (under
    ``accumulate()`` a GAN's critic window calls ``discr_optimizer.step()`` on every micro-batch, effective on the
    last): the micro-batch belongs to the critic's window, not to the generator's."""
    i = trace.events.index(b)
    others = False
    for e in trace.events[i + 1:]:
        if e.kind == "backward":
            break
        if e.kind == "step":
            if e.opt == opt:
                return False  # stepped together with the others: the backward fed them all
            others = True
    return others


def _erased_by(w, b: Event, clear: Event, opt: str) -> bool:
    """``clear`` (a zero_grad of ``opt``'s gradients) erases what backward ``b`` accumulated: ``b`` ran before it
    and no effective step of another optimizer came in between (that update took ``b``'s gradients: which
    parameters a backward reaches is not known, so the one that stepped on them is taken to own them)."""
    i, j = w.events.index(b), w.events.index(clear)
    if not (b.mb < clear.mb or (b.mb == clear.mb and i < j)) or i > j:
        return False
    return not any(x.kind == "step" and x.effective is True and x.opt != opt for x in w.events[i + 1:j])


def _per_opt_ok(trace: Trace) -> bool:
    """Every step is certain and its effect known (each optimizer's own windows are then exact)."""
    steps = trace.of("step")
    return bool(steps) and all(e.certain and e.effective is not None for e in steps)


def _between(events: list, a: Event, b: Event) -> list:
    i, j = events.index(a), events.index(b)
    return events[i + 1:j]


def scaled_twice(trace: Trace) -> list:
    """BL104: the loss is divided by N once: a user ``/ N`` on top of the framework's own ``/ N`` (accelerate's
    ``accelerator.backward``, the DeepSpeed engine) weights each micro-batch 1/N²."""
    out = []
    for b in trace.of("backward"):
        if b.scale is None or not b.certain:
            continue
        user = [f for f in b.scale.by(ACCUM_USER) if f.power < 0]
        fw = [f for f in b.scale.by(ACCUM_FRAMEWORK) if f.power < 0]
        if not user or not fw or b.scale.n_power > -2:
            continue  # (``loss * N`` undoing the framework's ``/ N`` — a window-token normalisation — is no 1/N²)
        f = fw[0]
        n = trace.n
        total = b.scale.value(n) * n if n and b.scale.value(n) is not None else None
        msg = (f"micro-batch {b.mb + 1}: backward with loss × {b.scale.text(n)} (`/ {user[0].text}` by hand and "
               f"{f.who or 'the framework'}'s own `/ {f.text}`) → a window of {n or 'N'} micro-batches weighs "
               f"{_frac(total) if total is not None else '1/N'} in all, not 1")
        out.append(Violation("BL104", b, msg, {"sum": str(total) if total is not None else None,
                                               "factor": user[0]}))
    return _first_unique(out)


def window_weights(trace: Trace) -> list:
    """BL103: the loss scales of one full window sum to 1, or the gradients are rescaled before the step (N
    backwards with the raw loss sum to N)."""
    wins = trace.window_structure()
    if not wins or trace.n is None or trace.n <= 1:
        return []
    opts = trace.optimizers()
    if len(opts) > 1:
        # several optimizers stepped on the same micro-batches (a GAN's generator and discriminator, each stepped
        # every N): each optimizer's own windows, over the backwards no other optimizer's step claimed
        groups = [(w, [b for b in w.backwards if not _claimed(trace, b, opt)]) for opt in opts
                  for w in trace.windows(opt)]
    else:
        groups = [(w, w.backwards) for w in wins]
    out = []
    for w, cand in groups:
        bws = [b for b in cand if b.certain]
        if any(not b.certain for b in w.backwards) or any(e.kind == "rescale" for e in w.events):
            continue
        mbs = {b.mb for b in bws}
        if len(mbs) != trace.n or any(b.scale is None for b in bws):
            continue
        vals = [b.scale.value(trace.n) for b in bws]
        if len(bws) == len(mbs) and all(v is not None for v in vals) and len(set(vals)) > 1:
            # every weight known, and they differ by position in the window (``loss / accum_n_steps`` with the
            # running count 1, 2, 3, ...): the update is not the window's mean, whatever the weights sum to
            ws = ", ".join(_frac(v) for v in vals)
            msg = (f"{w.mbs}: backward ×{len(bws)} with loss × {ws} (by position in the window), "
                   f"`{w.step.name}` after the {ordinal(len(bws))} → the micro-batches of one update weigh "
                   f"differently (the weights sum to {_frac(sum(vals))}; the window's mean weighs each "
                   f"1/{trace.n}), so the update is not the window's mean gradient")
            out.append(Violation("BL103", bws[0], msg, {"kind": "uneven", "weights": vals}))
            continue
        if any(not b.scale.n_free for b in bws):
            continue
        if all(all(f.kind != CONST or f.value == 1 for f in b.scale.factors) for b in bws):
            k = len(mbs)
            count = f"backward ×{len(bws)}" + (f" over {k} micro-batches" if len(bws) != k else "")
            msg = (f"{w.mbs}: {count} with loss × {bws[0].scale.text(trace.n)} each (nothing divides by "
                   f"{trace.n_text}), `{w.step.name}` after the "
                   f"{ordinal(k)} → the update is the sum of {k} micro-batch gradients, "
                   f"{k}× the window's mean")
            out.append(Violation("BL103", bws[-1] if len(opts) > 1 else bws[0], msg, {"sum": k}))
    return _first_unique(out)


def scheduler_per_step(trace: Trace) -> list:
    """BL105: scheduler steps = optimizer steps (a scheduler stepped on every micro-batch of an N-window runs N× too
    fast)."""
    wins = trace.window_structure()
    if not wins:
        return []
    out = []
    for w in wins[1:] or wins:
        bws = w.backwards
        if len(bws) < 2:
            continue
        by: dict = {}
        for e in w.of("sched_step"):
            if e.effective is True and e.certain:
                by.setdefault(e.target, []).append(e)
        for tgt, evs in by.items():
            if len(evs) < 2 or len(evs) < len(bws):
                continue
            msg = (f"{w.mbs}: backward ×{len(bws)}, `{evs[0].name}` ×{len(evs)}, `{w.step.name}` ×1 → the "
                   f"schedule advances {len(evs)} steps per optimizer update ({len(evs)}× too fast)")
            out.append(Violation("BL105", evs[0], msg, {"per_update": len(evs)}))
    return _first_unique(out)


def first_window_complete(trace: Trace) -> list:
    """BL107: the first window is as long as the others (``i % N == 0`` on a 0-based index steps after the first
    micro-batch alone)."""
    wins = trace.window_structure()
    if not wins or len(wins) < 3 or trace.n is None or trace.n <= 1:
        return []
    sizes = [len(w.backwards) for w in wins]
    first = wins[0]
    # the windows of the first epoch after the first one have N backwards
    e0 = [w for w in wins[1:] if w.step.epoch == first.step.epoch]
    if not e0 or sizes[0] >= trace.n or any(len(w.backwards) != trace.n for w in e0[:1]):
        return []
    if len(first.backwards) == 0:
        return []
    msg = (f"{first.mbs}: `{first.step.name}` after the {ordinal(len(first.backwards))} micro-batch, then every "
           f"{trace.n} (after micro-batches "
           + ", ".join(str(w.step.mb + 1) for w in wins[:3])
           + f", …) → the first update is made from {len(first.backwards)} micro-batch"
           f"{'es' if len(first.backwards) != 1 else ''} instead of {trace.n}, and every later window is shifted")
    return [Violation("BL107", first.step, msg, {"first": len(first.backwards), "n": trace.n})]


def epoch_tail(trace: Trace) -> list:
    """BL107 (tail): the epoch's last, partial window is stepped (or carried on with its scale) — not discarded by a
    ``zero_grad`` at the next epoch's start, and not silently added to the next epoch's first window.

    Only where the run shows it: the micro-batch loop iterates a loader (its length is not known, so it may leave a
    remainder), every epoch-1 window holds N backwards, the backwards after the epoch's last step are not stepped at
    its end (no ``or i + 1 == len(loader)``, no flush after the loop), and the next epoch's first update either
    starts from cleared gradients (dropped) or sums a window of another length than N (leaked). A counter carried
    across epochs and never cleared keeps every window N long: no violation."""
    wins = trace.window_structure()
    n = trace.n
    if not wins or n is None or n <= 1 or trace.loader != "loader" or trace.epochs_from not in ("loop", "call"):
        return []
    if trace.undecided_skip:
        return []  # a guard may skip micro-batches or end the epoch early (on a multiple of N): tail not known
    ev = trace.events
    if any(not e.certain for e in ev if e.kind in ("backward", "zero_grad", "step")):
        return []
    if any(e.via == "engine" for e in ev if e.kind in ("backward", "step")):
        return []  # a DeepSpeed engine keeps its own boundary
    bws = [e for e in ev if e.kind == "backward"]
    if len({b.mb for b in bws}) < trace.micro_batches or len(bws) != trace.micro_batches:
        return []  # not one backward per micro-batch
    e0 = [w for w in wins if w.step.epoch == 0]
    if len(e0) < 2 or any(len(w.backwards) != n for w in e0):
        return []  # the epoch's own windows are not N long: another rule's mistake (BL107 first window, BL108)
    for w in e0:
        first = w.events.index(w.backwards[0])
        if any(e.kind == "zero_grad" and e.effective is True for e in w.events[first + 1:-1]):
            return []  # gradients cleared inside a window: BL102's mistake
    last = ev.index(e0[-1].step)
    for w in e0:
        last = max(last, ev.index(w.steps[-1]))
    tail = [e for e in ev[last + 1:] if e.kind == "backward" and e.epoch == 0]
    k = len(tail)
    if not tail or k >= n:
        return []
    first_step = e0[-1].step
    nxt = next((i for i in range(last + 1, len(ev)) if ev[i].kind == "step" and ev[i].effective is True), None)
    if nxt is None:
        return []
    tail_end = ev.index(tail[-1])
    b1 = next((i for i in range(tail_end + 1, len(ev)) if ev[i].kind == "backward"), None)
    if b1 is None or b1 > nxt or ev[b1].epoch == 0:
        return []
    opts = set(trace.optimizers())
    zeros = [e for e in ev[tail_end + 1:nxt] if e.kind == "zero_grad" and e.effective is True
             and (e.of != "optimizer" or e.opt in opts)]
    if any(ev.index(z) > b1 for z in zeros):
        return []  # cleared inside the next epoch's window: not this mistake
    span_bws = [e for e in ev[last + 1:nxt] if e.kind == "backward"]
    nk = len([e for e in span_bws if e.epoch >= 1])
    mbs = f"micro-batch{'es' if k > 1 else ''} {tail[0].mb + 1}" + (f"–{tail[-1].mb + 1}" if k > 1 else "")
    ep_len = trace.epoch_len or (tail[-1].mb + 1)
    arith = f"dry run: {ep_len} micro-batches per epoch = {ep_len // n}×{n} + {k}"
    data = {"tail": k, "n": n, "epoch_len": ep_len, "next": nk}
    if zeros:
        z = zeros[0]
        rest = (f"; the next update then sums {nk} micro-batch{'es' if nk != 1 else ''} instead of {n}"
                if nk != n else "")
        msg = (f"{mbs} (the last {k} of epoch 1, after its last step at micro-batch {first_step.mb + 1}): "
               f"backward ×{k}, then `{z.name}` at the start of epoch 2 before any step → the partial window's "
               f"gradients are discarded{rest} ({arith})")
        return [Violation("BL107", first_step, msg, {**data, "kind": "dropped"}, [z])]
    if len(span_bws) == n:
        return []  # a counter carried across epochs: the window goes on over the boundary with N backwards
    # a rescale in the span counts only where the windows rescale too (``scale_grads(1 / num_tokens)`` before each
    # step); a helper of another module handed the model once at the epoch's end (``utils.save_model(model, ...)``)
    # normalises no window
    per_window = any(e.kind == "rescale" for w in e0 for e in w.events)
    if (per_window and any(e.kind == "rescale" for e in ev[last + 1:nxt])) or any(
            b.scale is not None and any(f.kind == OTHER for f in b.scale.factors) for b in span_bws):
        return []  # normalised by what the window really holds (``scale_grads(1 / num_tokens)``): carried on
        # with its scale, one longer window
    msg = (f"{mbs} (the last {k} of epoch 1, after its last step at micro-batch {first_step.mb + 1}) are not "
           f"stepped: the first update of epoch 2 sums backward ×{len(span_bws)} ({k} from epoch 1 + {nk}) instead "
           f"of {n}" + (f", each weighted 1/{n}" if all(b.scale is not None and b.scale.n_power == -1
                                                         for b in span_bws) else "") + f" ({arith})")
    return [Violation("BL107", first_step, msg, {**data, "kind": "leaked"})]


def partial_window(trace: Trace) -> list:
    """BL107: the first window is complete, else the epoch's tail is stepped (one finding per loop)."""
    return first_window_complete(trace) or epoch_tail(trace)


def window_length(trace: Trace) -> list:
    """BL108: every full window has N backwards — the step is not inverted (N - 1 steps per window), not nested
    under a second gate (every lcm(N, M)), and, inside ``accumulate()``, every sync step is stepped (a hand gate
    that misses accelerate's sync steps makes no update, or leaks the epoch's last window)."""
    n = trace.n
    if n is None or n <= 1:
        return []
    steps = [e for e in trace.of("step") if e.via != "engine"]
    if not steps or any(not e.certain or e.effective is None for e in steps):
        return []
    bws = [b for b in trace.of("backward")]
    if any(not b.certain for b in bws) or len({b.mb for b in bws}) < trace.micro_batches or len(bws) < 2 * n:
        return []
    eff = [s for s in steps if s.effective is True]
    if not eff:
        s = steps[0]
        msg = (f"micro-batches 1–{trace.micro_batches}: `{s.name}` runs {len(steps)}× but never takes effect "
               f"({s.why or 'no-op'}) → no update in {trace.epochs} epochs; the gradients keep growing")
        return [Violation("BL108", s, msg, {"kind": "never", "at": "cond"})]
    # the step stops for good: backwards go on for more than two windows and into the next epoch, none reaches a
    # step (a gate on a counter that only advances when the gate fires: ``global_step % N == 0`` with
    # ``global_step += int(stepped)`` holds once, then never again)
    last = eff[-1]
    after = [b for b in trace.events[trace.events.index(last) + 1:] if b.kind == "backward"]
    if len(after) >= 2 * n and any(b.epoch > last.epoch for b in after) and len(eff) * n < len(bws):
        msg = (f"`{last.name}` takes effect on micro-batch {last.mb + 1}, then never again: micro-batches "
               f"{after[0].mb + 1}–{after[-1].mb + 1} (backward ×{len(after)}, into epoch {after[-1].epoch + 1}) "
               f"reach no step → {len(eff)} update{'s' if len(eff) > 1 else ''} for {len(bws)} micro-batches "
               f"instead of one per `{trace.n_text}`; the gradients keep growing")
        return [Violation("BL108", last, msg, {"kind": "stops", "at": "call"})]
    syncs = [e for e in trace.of("counter") if e.target == "sync" and e.value is True]
    for sy in syncs:
        # accelerate synchronised this micro-batch (its gradients are final), but nothing stepped on it
        later = [e for e in trace.events[trace.events.index(sy):] if e.mb == sy.mb]
        if any(x.kind == "backward" for x in later) and not any(x.kind == "step" and x.effective for x in later):
            msg = (f"micro-batch {sy.mb + 1}: accelerate's sync step (end of the loader or every "
                   f"{trace.n_text}), but the hand gate skips `{eff[0].name}` there → that window is never "
                   f"stepped and its gradients leak into the next one")
            return [Violation("BL108", eff[0], msg, {"kind": "missed-sync", "at": "cond"})]
    wins = trace.window_structure()
    if not wins:
        return []
    e0 = [w for w in wins if w.step.epoch == 0]
    last_mb = max((b.mb for b in bws if b.epoch == 0), default=-1)
    if e0 and e0[-1].step.mb == last_mb and len(e0[-1].backwards) < n:
        e0 = e0[:-1]  # the epoch's tail, stepped at its end: right
    sizes = [w.n_mbs for w in e0]  # micro-batches, not backwards: FGM / one backward per task run several
    if not sizes or all(k == 1 for k in sizes):
        return []  # steps every micro-batch: BL101's case
    if len(trace.optimizers()) != 1:
        return []  # several optimizers: which backward feeds which update is not known
    body = sizes[1:] if sizes[0] < n else sizes
    if body and all(k == n for k in body):
        return []
    short = [k for k in body if k < n]
    if not (len(short) >= 2 or (body and len(set(body)) == 1 and body[0] > n)):
        return []  # one odd window (a leaked tail, a restart): not a misplaced gate
    bad = next((w for w in e0 if w.n_mbs != n and not (w is e0[0] and w.n_mbs < n)), None)
    if bad is None or trace.n_text not in (bad.step.cond_text or ""):
        return []  # the step is not gated on N itself: N may not be this loop's window
    msg = (f"windows of {', '.join(map(str, sizes))} micro-batches in epoch 1 (steps after micro-batches "
           f"{', '.join(str(w.step.mb + 1) for w in e0[:5])}) → not {n} (`{trace.n_text}`): the step runs on the "
           f"wrong micro-batches")
    twice = next((a for a, b in zip(e0, e0[1:]) if a.step.mb == b.step.mb), None)
    if twice is not None:
        k = sum(1 for w in e0 if w.step.mb == twice.step.mb)
        msg += (f"; `{twice.step.name}` runs {k}× after micro-batch {twice.step.mb + 1}: the gate tests the "
                f"micro-batch counter inside a loop that runs several backwards per micro-batch (one per task), so "
                f"a boundary steps once per pass and the later updates hold one backward each")
    return [Violation("BL108", bad.step, msg, {"kind": "sizes", "sizes": sizes, "at": "call",
                                               "per_pass": twice is not None})]


def engine_owns_boundary(trace: Trace) -> list:
    """BL115: with a DeepSpeed engine, ``engine.step()`` runs once per micro-batch that ran ``engine.backward()``
    (the engine counts micro-steps in ``step()`` and updates at its own boundary; several backwards of one
    micro-batch — a GAN critic's real and fake losses — are one micro-step) and nobody else zeroes the gradients
    it is accumulating. A script that sets the boundary itself (``set_gradient_accumulation_boundary``) owns it."""
    out = []
    bws = [b for b in trace.of("backward") if b.via == "engine" and b.certain]
    steps = [s for s in trace.of("step") if s.via == "engine"]
    own_boundary = bool(trace.of("boundary_set"))
    mbs = sorted({b.mb for b in bws})
    if bws and steps and not own_boundary and all(s.certain for s in steps) and len(steps) < len(mbs):
        s = steps[0]
        k = len(mbs) // max(1, len(steps))
        msg = (f"micro-batches 1–{len(mbs)}: `engine.backward()` on each, `{s.name}` ×{len(steps)}"
               + (f" (under `{s.cond_text}`)" if s.cond_text else "")
               + f" → the engine counts one micro-step per {k} micro-batches and updates once per "
               f"{k} × its own accumulation steps")
        out.append(Violation("BL115", s, msg, {"kind": "gated"}))
    if bws:
        n_known = trace.n is not None and trace.n_source == "resolved"
        for z in trace.of("zero_grad"):
            if not (z.certain and (z.of == "engine" or z.via == "ds")):
                continue
            # with one micro-step per update (gradient_accumulation_steps = 1) every step is a boundary: a hand
            # zero_grad before the micro-batch's backward or after its step clears nothing the engine still needs
            i = trace.events.index(z)
            between = any(e.kind == "backward" and e.via == "engine" and e.mb == z.mb for e in trace.events[:i]) and \
                any(e.kind == "step" and e.via == "engine" and e.mb == z.mb for e in trace.events[i + 1:])
            if trace.n == 1 and not between:
                continue
            msg = (f"micro-batch {z.mb + 1}: `{z.name}` by hand → it clears the gradients the engine is "
                   f"accumulating (engine.step() zeroes them itself at the boundary)")
            out.append(Violation("BL115", z, msg, {"kind": "zero", "n_unknown": not (n_known or between),
                                                   "between": between}))
    return _first_unique(out)


def backward_each_micro_batch(trace: Trace) -> list:
    """BL113: each micro-batch's graph is back-propagated (and freed) in its own micro-batch — not summed over the
    window and back-propagated once, which keeps every micro-batch's activations alive until then."""
    out = []
    for b in trace.of("backward"):
        if b.certain and b.graph_from is not None and 0 <= b.graph_from < b.mb:
            k = b.mb - b.graph_from + 1
            msg = (f"micro-batches {b.graph_from + 1}–{b.mb + 1}: losses added with their graphs, one backward after "
                   f"the {ordinal(k)} → the activations of all {k} micro-batches are alive at once (the peak of one "
                   f"{k}× larger batch)")
            out.append(Violation("BL113", b, msg, {"span": k}))
        elif b.certain and b.graph_loop:
            msg = (f"every iteration of `{b.graph_loop}` adds its loss with its graph, one backward after the loop → "
                   f"the activations of all its iterations are alive at once (the peak of one batch as large as all of "
                   f"them)")
            out.append(Violation("BL113", b, msg, {"span": None, "loop": b.graph_loop}))
    return _first_unique(out)


def clip_once_per_step(trace: Trace) -> list:
    """BL112: one clip per update, after the window's last backward (clipping each micro-batch clips partial sums)."""
    wins = trace.window_structure()
    if not wins:
        return []
    out = []
    for w in wins:
        bws = w.backwards
        clips = [c for c in w.of("clip") if c.certain]
        if len(bws) < 2 or len(clips) < 2:
            continue
        last_bw = w.events.index(bws[-1])
        early = [c for c in clips if w.events.index(c) < last_bw]
        if not early:
            continue
        msg = (f"{w.mbs}: backward ×{len(bws)}, `{clips[0].name}` ×{len(clips)}, `{w.step.name}` ×1 → "
               f"clipping acts on partial sums of the window's gradient")
        out.append(Violation("BL112", clips[0], msg, {"clips": len(clips)}))
    return _first_unique(out)


def _arms_in(a: tuple, b: tuple) -> bool:
    """Every undecided condition (and the side taken) of ``a`` is one of ``b``'s."""
    have = set(b) if b else set()  # (condition text, side, last store of a name it reads): the same decision
    return all(x in have for x in a)


def _runs_before_every(c: Event, trace: Trace) -> bool:
    """A clip under conditions the dry run could not decide (a helper's ``if do_step:`` on a counter it cannot
    follow) that still runs before each scaler step of its micro-batch: the step's undecided conditions include all of
    the clip's, so whenever that step runs the clip ran before it, on the same scaled gradients."""
    arms = c.meta.get("arms")
    if not arms:
        return False
    at = trace.events.index(c)
    later = [s for s in trace.events[at + 1:] if s.kind == "step" and s.via == "scaler" and s.mb == c.mb]
    return bool(later) and all(_arms_in(tuple(arms), tuple(s.meta.get("arms") or ())) for s in later)


def unscale_before_clip(trace: Trace) -> list:
    """BL201: gradients clipped after a scaled backward are unscaled first (one ``unscale_`` per step, before any
    clip)."""
    out = []
    for c in trace.of("clip"):
        if c.scaled is True and (c.certain or _runs_before_every(c, trace)):
            steps = [s for s in trace.of("step") if s.via == "scaler" and s.mb >= c.mb]
            if not steps:
                continue
            msg = (f"micro-batch {c.mb + 1}: `scaler.scale(loss).backward()`, then `{c.name}` with no "
                   f"`unscale_` in between → the clip sees gradients × the loss scale (65 536 at the start)")
            out.append(Violation("BL201", c, msg, {}))
    return _first_unique(out)


def scaler_calls_per_step(trace: Trace) -> list:
    """BL202: ``scaler.update()`` only after a ``scaler.step()`` (else: "No inf checks were recorded"), one
    ``unscale_`` per optimizer per update, and no scaled backward added to gradients already unscaled."""
    out = []
    stepped = False
    unscaled: dict = {}  # optimizers unscaled since the last update (for "unscale_ twice")
    pending: dict = {}  # ... and not stepped since: their gradients are unscaled and still to be used
    for e in trace.events:
        if not e.certain:
            if e.kind in ("step", "unscale"):
                stepped = True  # it may have run: no claim that nothing stepped
                pending.pop(e.opt, None)
            if e.kind == "update":
                stepped, unscaled, pending = False, {}, {}
            continue
        if e.kind == "step" and e.via == "scaler":
            stepped = True
            # the step consumed this optimizer's unscaled gradients; a later scaled backward (another optimizer's
            # loss reaching these parameters, as in a GAN's generator pass) lands on gradients that the next
            # zero_grad clears before this optimizer uses them again
            pending.pop(e.opt, None)
        elif e.kind == "unscale":
            if unscaled.get(e.opt) is not None:
                first = unscaled[e.opt]
                msg = (f"micro-batches {first.mb + 1} and {e.mb + 1}: `{e.name}` twice before `update()` → "
                       f"RuntimeError: unscale_() has already been called on this optimizer since the last update()")
                out.append(Violation("BL202", first, msg, {"error": "unscale twice"}))
            else:
                unscaled[e.opt] = e
                pending[e.opt] = e
            stepped = True
        elif e.kind == "update":
            if not stepped:
                msg = (f"micro-batch {e.mb + 1}: `{e.name}` with no `scaler.step()` since the last update → "
                       f"AssertionError: No inf checks were recorded prior to update.")
                out.append(Violation("BL202", e, msg, {"error": "no inf checks"}))
            stepped = False
            unscaled, pending = {}, {}
        elif e.kind == "backward" and e.scaled and pending:
            first = next(iter(pending.values()))
            msg = (f"micro-batch {first.mb + 1}: `{first.name}`, then micro-batch {e.mb + 1}'s scaled backward adds "
                   f"gradients × the loss scale to unscaled ones before the step")
            out.append(Violation("BL202", first, msg, {"error": "mixed scaled"}))
            unscaled, pending = {}, {}
    return _first_unique(out)


def update_on_every_path(trace: Trace) -> list:
    """BL202: after ``scaler.unscale_(opt)``, ``scaler.update()`` runs on every path before the next ``unscale_`` of
    that optimizer. A path without it: every update after the unscale_ sits under a condition that reads a value set
    *after* the unscale_ (``skip = grad_norm > limit`` ... ``if not skip: scaler.step(opt); scaler.update()``) and no
    update runs on its other side; taking it, the next window's ``unscale_`` raises. Conditions the dry run decided,
    or that read only values set before the unscale_ (the same gate written twice), make no such path."""
    out = []
    evs = trace.events
    for i, u in enumerate(evs):
        if u.kind != "unscale":
            continue
        ua = {(k, p) for k, p, _ in u.meta.get("arms", ())}
        useq = u.meta.get("seq", 0)
        nxt, updates = None, []
        for e in evs[i + 1:]:
            if e.kind == "unscale" and e.opt == u.opt:
                nxt = e
                break
            if e.kind == "update":
                updates.append(e)
        if nxt is None or nxt.mb == u.mb or not updates:
            continue
        extras = [{(k, p) for k, p, _ in e.meta.get("arms", ()) if (k, p) not in ua} for e in updates]
        if any(not x for x in extras):
            continue  # an update that runs whenever the unscale_ did
        found = None
        for e in updates:
            for k, p, seq in e.meta.get("arms", ()):
                if (k, p) in ua or seq <= useq:
                    continue
                if any(x <= {(k, not p)} for x in extras):
                    continue  # the other side updates too
                found = (e, k, p)
                break
            if found:
                break
        if found is None:
            continue
        e, k, p = found
        side = f"`{k}` is {'false' if p else 'true'}"
        msg = (f"`{u.name}`, then `{e.name}` only when `{k}` holds, a condition on a value set after the unscale_ → "
               f"when {side}, nothing calls `update()` and the next `{nxt.name}` raises RuntimeError: unscale_() has "
               f"already been called on this optimizer since the last update()")
        out.append(Violation("BL202", u, msg, {"error": "update skipped", "update": e, "cond": k}, [e]))
    return _first_unique(out)


def ddp_sync(trace: Trace) -> list:
    """BL114: under DDP, one all-reduce per update: the forwards and backwards of a window's first N-1 micro-batches
    run with sync off, the last one's with sync on (DDP decides at forward time)."""
    out = []
    wins = trace.window_structure()
    # where the forward ran matters only to DDP; FSDP's no_sync() is read by its post-backward hooks (torch
    # distributed/fsdp/_runtime_utils.py): with an FSDP model possible and DDP not known, no verdict on it
    by_forward = not (trace.fsdp_possible and not trace.ddp)
    for w in wins or []:
        bws = [b for b in w.backwards if b.certain]
        if not bws:
            continue
        last = bws[-1]
        if last.fwd_no_sync is True and (by_forward or last.in_no_sync):  # (both inside: no sync for FSDP either)
            how = "outside" if not last.in_no_sync else "inside"
            msg = (f"{w.mbs}: the last micro-batch's forward runs with gradient sync off (backward {how} "
                   f"`no_sync()`), then `{w.step.name}` → no all-reduce before the update: the replicas step with "
                   f"their local gradients and silently diverge")
            out.append(Violation("BL114", last, msg, {"severity": "E", "kind": "unsynced"}))
            return _first_unique(out)
    for b in trace.of("backward") if by_forward else []:
        if b.certain and b.in_no_sync and b.fwd_no_sync is False:
            msg = (f"micro-batch {b.mb + 1}: forward with sync on, backward inside `no_sync()` → DDP prepared the "
                   f"all-reduce at the forward, so the micro-batch still all-reduces (no saving)")
            out.append(Violation("BL114", b, msg, {"kind": "backward-only"}))
            return _first_unique(out)
    for b in trace.of("backward") if by_forward else []:
        # the backward sits under a gate the dry run could not decide (a step counter resumed from a checkpoint),
        # but its forward ran unconditionally with sync on: whichever micro-batches take that branch, the
        # `no_sync()` around the backward alone saves nothing
        if not b.certain and b.in_no_sync and b.fwd_no_sync is False and b.meta.get("fwd_certain") is True:
            gate = f" (taken when `{b.cond_text}`)" if b.cond_text else ""
            msg = (f"the backward inside `no_sync()`{gate} belongs to a forward that ran outside it, with sync on "
                   f"→ DDP prepared the all-reduce at the forward, so that micro-batch still all-reduces (no saving)")
            out.append(Violation("BL114", b, msg, {"kind": "backward-only"}))
            return _first_unique(out)
    if trace.ddp and not trace.sync_control and wins and trace.n and trace.n > 1:
        full = [w for w in wins if len([b for b in w.backwards if b.certain]) >= 2]
        if full and not any(b.fwd_no_sync is True or b.in_no_sync for w in full for b in w.backwards):
            w = full[0]
            k = len(w.backwards)
            msg = (f"{w.mbs}: backward ×{k} with gradient sync on, `{w.step.name}` after the {ordinal(k)} → {k} "
                   f"all-reduces per update instead of 1")
            out.append(Violation("BL114", w.backwards[0], msg, {"kind": "no-no_sync", "allreduces": k}))
    elif trace.ddp and not trace.sync_control and not wins and accumulates(trace):
        # the step's gate could not be decided (an index offset of unknown value), but the loss is divided by N and
        # every step is conditional while every backward runs: the loop accumulates, with sync on throughout
        bws = [b for b in trace.of("backward") if b.certain]
        steps = trace.of("step")
        if bws and steps and len({b.mb for b in bws}) == trace.micro_batches and all(s.cond_text for s in steps) \
                and not any(b.fwd_no_sync is True or b.in_no_sync for b in bws):
            msg = (f"micro-batches 1–{trace.micro_batches}: backward on each with gradient sync on, "
                   f"`{steps[0].name}` only when `{steps[0].cond_text}` → up to {trace.n_text} all-reduces per "
                   f"update instead of 1")
            out.append(Violation("BL114", bws[0], msg, {"kind": "no-no_sync"}))
    if not out and trace.ddp and not trace.sync_control and not wins and trace.n and trace.n > 1:
        out.extend(_ddp_cleared_windows(trace))
    return _first_unique(out)


def _ddp_cleared_windows(trace: Trace) -> list:
    """The step may or may not run (``if step != config.steps``), but the optimizer's ``zero_grad`` runs for
    certain: between two of them, k ≥ 2 backwards with sync on and the step (if any) after the last → k
    all-reduces for that update."""
    zeros = [e for e in trace.of("zero_grad") if e.of == "optimizer" and e.certain and e.effective is True]
    steps = trace.of("step")
    if len(zeros) < 2 or not steps:
        return []
    idx = [trace.events.index(z) for z in zeros]
    for a, b in zip(idx, idx[1:]):
        seg = trace.events[a + 1:b]
        bws = [e for e in seg if e.kind == "backward"]
        if len(bws) < 2 or not all(e.certain for e in bws):
            continue
        if any(e.fwd_no_sync is True or e.in_no_sync for e in bws):
            return []
        last = seg.index(bws[-1])
        if any(e.kind == "step" for e in seg[:last]) or not any(e.kind == "step" for e in seg[last:]):
            continue
        st = next(e for e in seg[last:] if e.kind == "step")
        k = len(bws)
        gate = f" (when `{st.cond_text}`)" if not st.certain and st.cond_text else ""
        msg = (f"micro-batches {bws[0].mb + 1}–{bws[-1].mb + 1}: backward ×{k} with gradient sync on between two "
               f"`{zeros[0].name}`, then `{st.name}`{gate} → {k} all-reduces per update instead of 1")
        return [Violation("BL114", bws[0], msg, {"kind": "no-no_sync", "allreduces": k})]
    return []


# ``epoch_tail`` is part of BL107 (``partial_window``); kept under its own name for ``explain`` and the verifier.
EXTRA_INVARIANTS: dict = {"BL107-tail": epoch_tail}

INVARIANTS: dict = {
    "BL101": steps_delayed,
    "BL102": grads_not_cleared_in_window,
    "BL103": window_weights,
    "BL104": scaled_twice,
    "BL105": scheduler_per_step,
    "BL107": partial_window,
    "BL108": window_length,
    "BL112": clip_once_per_step,
    "BL113": backward_each_micro_batch,
    "BL115": engine_owns_boundary,
    "BL114": ddp_sync,
    "BL201": unscale_before_clip,
    "BL202": lambda tr: scaler_calls_per_step(tr) + update_on_every_path(tr),
}


def check(trace: Trace, code: str) -> list:
    """The violations of one rule on one trace."""
    fn: Optional[Callable] = INVARIANTS.get(code)
    if fn is None:
        return []
    return [v for v in fn(trace) if v.code == code]


def check_all(trace: Trace) -> list:
    out = []
    seen = set()
    for code, fn in INVARIANTS.items():
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        out.extend(fn(trace))
    return _first_unique(out)
