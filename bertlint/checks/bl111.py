"""BL111 token-mean-loss-accumulated: a hand-written accumulation loop divides a per-micro-batch *token-mean*
loss (masked / causal LM, token classification) by N. Each token is then weighted 1/(N·c_k) instead of
1/T_window; micro-batches with different numbers of labelled tokens get a biased gradient (REFERENCE §6:
5.8–8.3 % loss error on uneven masks). Sequence-level losses (classification, QA) are not flagged.

From the dry run: a hand-written loop (plain PyTorch or Fabric) whose updates sum N backwards, each loss carrying
the user's ``1/N`` (the trace's scale factor, at the division that made it); the token-level task is a set-up
fact read from the file (collator / model class)."""

from __future__ import annotations

import re

from bertlint import trace as T
from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity

TOKEN_TASK = re.compile(
    r"DataCollatorForLanguageModeling|DataCollatorForWholeWordMask|DataCollatorForTokenClassification|"
    r"ForMaskedLM|ForCausalLM|ForTokenClassification|LMHeadModel|ForPreTraining"
)


# the task itself masks a varying number of tokens (random MLM masks, padded token labels)
UNEVEN_TASK = re.compile(r"DataCollatorForLanguageModeling|DataCollatorForWholeWordMask|DataCollatorForTokenClassification|"
                         r"ForMaskedLM|ForTokenClassification|ForPreTraining")
# padding / masking visible in the file: micro-batches may hold different numbers of labelled tokens
UNEVEN = re.compile(r"-100\b|pad_token|attention_mask|DataCollator|ignore_index\s*=\s*(?!-1\b)")


@rule("BL111", "token-mean-loss-accumulated", Severity.INFO,
      "per-micro-batch token-mean loss divided by N while micro-batches hold different numbers of tokens")
def check(ctx) -> None:
    src = ctx.source
    m = TOKEN_TASK.search(src)
    if not m or "num_items_in_batch" in src or 'reduction="sum"' in src or "reduction='sum'" in src:
        return
    if not UNEVEN.search(src) and not any(UNEVEN_TASK.search(x.group(0)) for x in TOKEN_TASK.finditer(src)):
        # a causal LM on fixed-length token streams (nanoGPT's B×T chunks): every micro-batch holds the same number
        # of tokens, so the mean of means is the window's token mean; no padding or mask is shown to make them differ
        return
    from bertlint.analysis import dryrun

    done: set = set()
    for run in dryrun.of(ctx):
        for tr in run.traces:
            got = _divided_by_n(tr)
            if got is None:
                continue
            f, b = got
            node = f.node if f.node is not None else b.node
            if node is None or id(node) in done:
                continue
            done.add(id(node))
            if f.kind == T.ACCUM_FRAMEWORK:
                # accelerate's backward divides each micro-batch's loss by N (REFERENCE §2.1): the same mean of means
                head = (f"`{_ga.code_of(node).strip()}` back-propagates a token-level loss ({m.group(0)}) averaged "
                        f"per micro-batch, and {_ga.fw(ctx, 'accelerate')} divides it by the Accelerator's "
                        f"`gradient_accumulation_steps` ({f.text})")
            else:
                head = (f"`{_ga.code_of(node).strip()}` averages a token-level loss ({m.group(0)}) per micro-batch and "
                        f"then divides by the number of micro-batches")
            _ga.treport(
                ctx, run, tr, node,
                f"{head}: tokens of a micro-batch with few labelled tokens weigh more than those of a full one, so the "
                f"update differs from the full-batch one (5–8 % on uneven masks, `exp_token_normalization.out`). Sum "
                f"the per-token losses and divide by the window's count of labels != -100.",
            )
            break  # one finding per loop


def _divided_by_n(tr):
    """(factor, backward): the ``/ N`` of the loss reaching the backwards of a loop that accumulates (its updates sum
    N backwards) — the user's in a hand-written loop, accelerate's in ``accelerator.backward`` — or None."""
    if not tr.complete or tr.owner not in ("plain", "fabric", "accelerate") or tr.n is None or tr.n <= 1:
        return None
    wins = tr.window_structure()
    if not wins or not any(len([b for b in w.backwards if b.certain]) == tr.n for w in wins):
        return None
    for b in tr.of("backward"):
        if b.certain and b.scale is not None and b.scale.n_power == -1:
            for f in b.scale.by(T.ACCUM_USER):
                if f.power == -1 and f.node is not None and tr.owner != "accelerate":
                    return f, b
            for f in b.scale.by(T.ACCUM_FRAMEWORK):
                if f.power == -1 and f.who == "accelerator.backward()" and tr.owner == "accelerate":
                    return f, b
    return None
