"""Fine-tune a tiny BERT classifier with gradient accumulation — and the most common accumulation mistake.

The loss is divided by ACCUM (the script means to accumulate 4 micro-batches of 8 = 32 examples per update), but
`optimizer.step()`, `scheduler.step()` and `optimizer.zero_grad()` run on every micro-batch: every update sees 8
examples, each 4x too small, and the warm-up schedule runs 4x too fast.

Runs on CPU in seconds (the model is built from a config; nothing is downloaded):

    bertlint examples/train_bert_accum.py            # static findings
    bertlint explain examples/train_bert_accum.py    # what the set-up amounts to
    bertlint --verify examples/train_bert_accum.py   # run it with runtime checks that confirm the findings
"""

import torch
from transformers import BertConfig, BertForSequenceClassification, get_linear_schedule_with_warmup

torch.manual_seed(0)

ACCUM = 4  # micro-batches per optimizer update
MICRO_BATCH = 8
EPOCHS = 2
NUM_BATCHES = 16

config = BertConfig(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37, vocab_size=100, num_labels=2
)
model = BertForSequenceClassification(config)
data = [
    (torch.randint(0, 100, (MICRO_BATCH, 16)), torch.randint(0, 2, (MICRO_BATCH,)))
    for _ in range(NUM_BATCHES)
]

optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
updates = EPOCHS * NUM_BATCHES // ACCUM
scheduler = get_linear_schedule_with_warmup(optimizer, num_warmup_steps=updates // 10, num_training_steps=updates)

model.train()
for epoch in range(EPOCHS):
    for step, (input_ids, labels) in enumerate(data):
        outputs = model(input_ids=input_ids, labels=labels)
        loss = outputs.loss / ACCUM
        loss.backward()
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad()
    print(f"epoch {epoch}: last loss {loss.item() * ACCUM:.4f}")
