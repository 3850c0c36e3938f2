"""BL105 reads the schedule length of a LambdaLR from its lambda (`1 - s / total_steps`)."""

from bertlint.engine import lint_python

TEMPLATE = """\
import torch
from torch import nn

ACCUM = 4
EPOCHS = 1
model = nn.Linear(8, 2)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(40)]
total_steps = {length}
scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: max(0.0, 1 - s / total_steps))
criterion = nn.CrossEntropyLoss()
for i, (x, y) in enumerate(data):
    loss = criterion(model(x), y) / ACCUM
    loss.backward()
    if (i + 1) % ACCUM == 0:
        optimizer.step()
        optimizer.zero_grad()
    scheduler.step()
"""


def _bl105(length):
    return [(d.code, d.start.row) for d in lint_python(TEMPLATE.format(length=length), "t.py") if d.code == "BL105"]


def test_lambda_schedule_in_optimizer_steps_stepped_per_micro_batch():
    assert _bl105("len(data) * EPOCHS // ACCUM") == [("BL105", 18)]


def test_lambda_schedule_in_micro_batches_is_consistent():
    # a schedule counted in micro-batches and stepped per micro-batch: consistent, not reported
    assert _bl105("len(data) * EPOCHS") == []


def test_lambda_without_a_visible_length_is_not_guessed():
    src = TEMPLATE.format(length="100").replace("1 - s / total_steps", "0.95 ** s")
    assert [d for d in lint_python(src, "t.py") if d.code == "BL105"] == []
