"""BL111 token-mean-loss-accumulated: a hand-written accumulation loop divides a per-micro-batch *token-mean*
loss (masked / causal LM, token classification) by N. Each token is then weighted 1/(N·c_k) instead of
1/T_window; micro-batches with different numbers of labelled tokens get a biased gradient (REFERENCE §6:
5.8–8.3 % loss error on uneven masks). Sequence-level losses (classification, QA) are not flagged."""

from __future__ import annotations

import re

from bertlint.checks import _ga
from bertlint.registry import rule
from bertlint.types import Severity

TOKEN_TASK = re.compile(
    r"DataCollatorForLanguageModeling|DataCollatorForWholeWordMask|DataCollatorForTokenClassification|"
    r"ForMaskedLM|ForCausalLM|ForTokenClassification|LMHeadModel|ForPreTraining"
)


@rule("BL111", "token-mean-loss-accumulated", Severity.INFO,
      "per-micro-batch token-mean loss divided by N while micro-batches hold different numbers of tokens")
def check(ctx) -> None:
    src = ctx.source
    m = TOKEN_TASK.search(src)
    if not m or "num_items_in_batch" in src or 'reduction="sum"' in src or "reduction='sum'" in src:
        return
    f = ctx.loops
    for loop in f:
        if loop.owner not in ("plain", "fabric") or not _ga.accum_gated(loop):
            continue
        divs = loop.loss_divisions()
        if not divs:
            continue
        d = divs[0]
        _ga.report(
                ctx, loop,
            d.node,
            f"`{_ga.code_of(d.node).strip()}` averages a token-level loss ({m.group(0)}) per micro-batch and then "
            f"divides by the number of micro-batches: tokens of a micro-batch with few labelled tokens weigh more "
            f"than those of a full one, so the update differs from the full-batch one (5–8 % on uneven masks). "
            f"Sum the per-token losses and divide by the window's count of labels != -100.",
        )
