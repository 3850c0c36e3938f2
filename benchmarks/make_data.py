"""Generate benchmarks/data/train_large.py (~1,200 lines): the small training script plus the kind of code a
large multi-task training script carries (per-task preprocessing, metrics, callbacks, config dataclasses).

    python benchmarks/make_data.py      # rewrites benchmarks/data/train_large.py (deterministic)
"""

import os

HERE = os.path.dirname(os.path.abspath(__file__))
TASKS = [
    "cola", "sst2", "mrpc", "qqp", "stsb", "mnli", "qnli", "rte", "wnli", "boolq", "cb", "copa",
    "multirc", "record", "wic", "wsc", "axb",
]

BLOCK = '''

@dataclass
class {C}Config:
    max_length: int = {L}
    num_labels: int = {N}
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "{M}"
    eval_every: int = {E}


def preprocess_{t}(examples, tokenizer, cfg: {C}Config):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_{t}(preds, labels):
    preds = np.asarray(preds)
    labels = np.asarray(labels)
    if preds.ndim > 1:
        preds = preds.argmax(axis=-1)
    acc = float((preds == labels).mean()) if len(labels) else 0.0
    tp = float(((preds == 1) & (labels == 1)).sum())
    fp = float(((preds == 1) & (labels == 0)).sum())
    fn = float(((preds == 0) & (labels == 1)).sum())
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {{"{t}_accuracy": acc, "{t}_f1": f1, "{t}_precision": precision, "{t}_recall": recall}}


class {C}Callback:
    """Logs {t} metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience={P}):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("{t}_{M}", metrics.get("{t}_accuracy", 0.0))
        logger.info("step %d {t} %s=%.4f", step, "{M}", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_{t}.json"), "w") as f:
                json.dump({{"step": step, "score": score}}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience
'''


def main():
    with open(os.path.join(HERE, "data", "train_small.py")) as f:
        small = f.read()
    head, _, tail = small.partition("\n\ndef main():")
    parts = [head.replace("A typical hand-written", "A large multi-task hand-written")]
    for i, t in enumerate(TASKS):
        parts.append(
            BLOCK.format(
                t=t,
                C=t.capitalize(),
                L=128 + 32 * (i % 4),
                N=2 + (i % 3),
                M=("f1", "accuracy", "mcc")[i % 3],
                E=100 * (1 + i % 5),
                P=2 + i % 3,
            )
        )
    parts.append("\n\ndef main():" + tail)
    text = "".join(parts)
    with open(os.path.join(HERE, "data", "train_large.py"), "w") as f:
        f.write(text)
    print(len(text.splitlines()), "lines")


if __name__ == "__main__":
    main()
