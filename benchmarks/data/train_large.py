"""Fine-tune a BERT-family encoder for sequence classification with gradient accumulation and mixed precision.

A large multi-task hand-written training script (argparse, datasets, AdamW, linear warm-up, AMP, checkpoints).
Benchmark input for bertlint: only parsed and linted, never run.
"""

import argparse
import json
import logging
import math
import os
import random
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset
from transformers import AutoModelForSequenceClassification, AutoTokenizer, get_linear_schedule_with_warmup

logger = logging.getLogger(__name__)


def parse_args():
    parser = argparse.ArgumentParser(description="Fine-tune a sequence classifier")
    parser.add_argument("--model_name_or_path", type=str, default="bert-base-uncased")
    parser.add_argument("--train_file", type=str, required=True)
    parser.add_argument("--validation_file", type=str, default=None)
    parser.add_argument("--output_dir", type=str, default="out")
    parser.add_argument("--max_length", type=int, default=128)
    parser.add_argument("--per_device_train_batch_size", type=int, default=8)
    parser.add_argument("--per_device_eval_batch_size", type=int, default=32)
    parser.add_argument("--gradient_accumulation_steps", type=int, default=4)
    parser.add_argument("--learning_rate", type=float, default=5e-5)
    parser.add_argument("--weight_decay", type=float, default=0.01)
    parser.add_argument("--num_train_epochs", type=int, default=3)
    parser.add_argument("--warmup_ratio", type=float, default=0.06)
    parser.add_argument("--max_grad_norm", type=float, default=1.0)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--fp16", action="store_true")
    parser.add_argument("--logging_steps", type=int, default=50)
    parser.add_argument("--save_steps", type=int, default=500)
    return parser.parse_args()


def set_seed(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


@dataclass
class Example:
    text: str
    label: int


class JsonlDataset(Dataset):
    def __init__(self, path, tokenizer, max_length):
        self.examples = []
        with open(path) as f:
            for line in f:
                row = json.loads(line)
                self.examples.append(Example(row["text"], int(row["label"])))
        self.tokenizer = tokenizer
        self.max_length = max_length

    def __len__(self):
        return len(self.examples)

    def __getitem__(self, idx):
        ex = self.examples[idx]
        enc = self.tokenizer(ex.text, truncation=True, max_length=self.max_length)
        enc["labels"] = ex.label
        return enc


def collate(tokenizer):
    def fn(features):
        labels = torch.tensor([f.pop("labels") for f in features])
        batch = tokenizer.pad(features, return_tensors="pt")
        batch["labels"] = labels
        return batch

    return fn


def evaluate(model, loader, device):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            out = model(**batch)
            loss_sum += out.loss.item() * batch["labels"].size(0)
            preds = out.logits.argmax(dim=-1)
            correct += (preds == batch["labels"]).sum().item()
            total += batch["labels"].size(0)
    model.train()
    return {"loss": loss_sum / max(total, 1), "accuracy": correct / max(total, 1)}


def save_checkpoint(model, tokenizer, optimizer, scheduler, output_dir, step):
    path = os.path.join(output_dir, f"checkpoint-{step}")
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    torch.save({"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}, os.path.join(path, "state.pt"))
    logger.info("saved %s", path)


def build_optimizer(model, args):
    no_decay = ["bias", "LayerNorm.weight"]
    groups = [
        {
            "params": [p for n, p in model.named_parameters() if not any(nd in n for nd in no_decay)],
            "weight_decay": args.weight_decay,
        },
        {
            "params": [p for n, p in model.named_parameters() if any(nd in n for nd in no_decay)],
            "weight_decay": 0.0,
        },
    ]
    return torch.optim.AdamW(groups, lr=args.learning_rate)


@dataclass
class ColaConfig:
    max_length: int = 128
    num_labels: int = 2
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "f1"
    eval_every: int = 100


def preprocess_cola(examples, tokenizer, cfg: ColaConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_cola(preds, labels):
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
    return {"cola_accuracy": acc, "cola_f1": f1, "cola_precision": precision, "cola_recall": recall}


class ColaCallback:
    """Logs cola metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=2):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("cola_f1", metrics.get("cola_accuracy", 0.0))
        logger.info("step %d cola %s=%.4f", step, "f1", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_cola.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class Sst2Config:
    max_length: int = 160
    num_labels: int = 3
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "accuracy"
    eval_every: int = 200


def preprocess_sst2(examples, tokenizer, cfg: Sst2Config):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_sst2(preds, labels):
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
    return {"sst2_accuracy": acc, "sst2_f1": f1, "sst2_precision": precision, "sst2_recall": recall}


class Sst2Callback:
    """Logs sst2 metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=3):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("sst2_accuracy", metrics.get("sst2_accuracy", 0.0))
        logger.info("step %d sst2 %s=%.4f", step, "accuracy", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_sst2.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class MrpcConfig:
    max_length: int = 192
    num_labels: int = 4
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "mcc"
    eval_every: int = 300


def preprocess_mrpc(examples, tokenizer, cfg: MrpcConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_mrpc(preds, labels):
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
    return {"mrpc_accuracy": acc, "mrpc_f1": f1, "mrpc_precision": precision, "mrpc_recall": recall}


class MrpcCallback:
    """Logs mrpc metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=4):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("mrpc_mcc", metrics.get("mrpc_accuracy", 0.0))
        logger.info("step %d mrpc %s=%.4f", step, "mcc", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_mrpc.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class QqpConfig:
    max_length: int = 224
    num_labels: int = 2
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "f1"
    eval_every: int = 400


def preprocess_qqp(examples, tokenizer, cfg: QqpConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_qqp(preds, labels):
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
    return {"qqp_accuracy": acc, "qqp_f1": f1, "qqp_precision": precision, "qqp_recall": recall}


class QqpCallback:
    """Logs qqp metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=2):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("qqp_f1", metrics.get("qqp_accuracy", 0.0))
        logger.info("step %d qqp %s=%.4f", step, "f1", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_qqp.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class StsbConfig:
    max_length: int = 128
    num_labels: int = 3
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "accuracy"
    eval_every: int = 500


def preprocess_stsb(examples, tokenizer, cfg: StsbConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_stsb(preds, labels):
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
    return {"stsb_accuracy": acc, "stsb_f1": f1, "stsb_precision": precision, "stsb_recall": recall}


class StsbCallback:
    """Logs stsb metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=3):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("stsb_accuracy", metrics.get("stsb_accuracy", 0.0))
        logger.info("step %d stsb %s=%.4f", step, "accuracy", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_stsb.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class MnliConfig:
    max_length: int = 160
    num_labels: int = 4
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "mcc"
    eval_every: int = 100


def preprocess_mnli(examples, tokenizer, cfg: MnliConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_mnli(preds, labels):
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
    return {"mnli_accuracy": acc, "mnli_f1": f1, "mnli_precision": precision, "mnli_recall": recall}


class MnliCallback:
    """Logs mnli metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=4):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("mnli_mcc", metrics.get("mnli_accuracy", 0.0))
        logger.info("step %d mnli %s=%.4f", step, "mcc", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_mnli.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class QnliConfig:
    max_length: int = 192
    num_labels: int = 2
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "f1"
    eval_every: int = 200


def preprocess_qnli(examples, tokenizer, cfg: QnliConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_qnli(preds, labels):
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
    return {"qnli_accuracy": acc, "qnli_f1": f1, "qnli_precision": precision, "qnli_recall": recall}


class QnliCallback:
    """Logs qnli metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=2):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("qnli_f1", metrics.get("qnli_accuracy", 0.0))
        logger.info("step %d qnli %s=%.4f", step, "f1", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_qnli.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class RteConfig:
    max_length: int = 224
    num_labels: int = 3
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "accuracy"
    eval_every: int = 300


def preprocess_rte(examples, tokenizer, cfg: RteConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_rte(preds, labels):
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
    return {"rte_accuracy": acc, "rte_f1": f1, "rte_precision": precision, "rte_recall": recall}


class RteCallback:
    """Logs rte metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=3):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("rte_accuracy", metrics.get("rte_accuracy", 0.0))
        logger.info("step %d rte %s=%.4f", step, "accuracy", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_rte.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class WnliConfig:
    max_length: int = 128
    num_labels: int = 4
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "mcc"
    eval_every: int = 400


def preprocess_wnli(examples, tokenizer, cfg: WnliConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_wnli(preds, labels):
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
    return {"wnli_accuracy": acc, "wnli_f1": f1, "wnli_precision": precision, "wnli_recall": recall}


class WnliCallback:
    """Logs wnli metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=4):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("wnli_mcc", metrics.get("wnli_accuracy", 0.0))
        logger.info("step %d wnli %s=%.4f", step, "mcc", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_wnli.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class BoolqConfig:
    max_length: int = 160
    num_labels: int = 2
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "f1"
    eval_every: int = 500


def preprocess_boolq(examples, tokenizer, cfg: BoolqConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_boolq(preds, labels):
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
    return {"boolq_accuracy": acc, "boolq_f1": f1, "boolq_precision": precision, "boolq_recall": recall}


class BoolqCallback:
    """Logs boolq metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=2):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("boolq_f1", metrics.get("boolq_accuracy", 0.0))
        logger.info("step %d boolq %s=%.4f", step, "f1", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_boolq.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class CbConfig:
    max_length: int = 192
    num_labels: int = 3
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "accuracy"
    eval_every: int = 100


def preprocess_cb(examples, tokenizer, cfg: CbConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_cb(preds, labels):
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
    return {"cb_accuracy": acc, "cb_f1": f1, "cb_precision": precision, "cb_recall": recall}


class CbCallback:
    """Logs cb metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=3):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("cb_accuracy", metrics.get("cb_accuracy", 0.0))
        logger.info("step %d cb %s=%.4f", step, "accuracy", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_cb.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class CopaConfig:
    max_length: int = 224
    num_labels: int = 4
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "mcc"
    eval_every: int = 200


def preprocess_copa(examples, tokenizer, cfg: CopaConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_copa(preds, labels):
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
    return {"copa_accuracy": acc, "copa_f1": f1, "copa_precision": precision, "copa_recall": recall}


class CopaCallback:
    """Logs copa metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=4):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("copa_mcc", metrics.get("copa_accuracy", 0.0))
        logger.info("step %d copa %s=%.4f", step, "mcc", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_copa.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class MultircConfig:
    max_length: int = 128
    num_labels: int = 2
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "f1"
    eval_every: int = 300


def preprocess_multirc(examples, tokenizer, cfg: MultircConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_multirc(preds, labels):
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
    return {"multirc_accuracy": acc, "multirc_f1": f1, "multirc_precision": precision, "multirc_recall": recall}


class MultircCallback:
    """Logs multirc metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=2):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("multirc_f1", metrics.get("multirc_accuracy", 0.0))
        logger.info("step %d multirc %s=%.4f", step, "f1", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_multirc.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class RecordConfig:
    max_length: int = 160
    num_labels: int = 3
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "accuracy"
    eval_every: int = 400


def preprocess_record(examples, tokenizer, cfg: RecordConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_record(preds, labels):
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
    return {"record_accuracy": acc, "record_f1": f1, "record_precision": precision, "record_recall": recall}


class RecordCallback:
    """Logs record metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=3):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("record_accuracy", metrics.get("record_accuracy", 0.0))
        logger.info("step %d record %s=%.4f", step, "accuracy", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_record.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class WicConfig:
    max_length: int = 192
    num_labels: int = 4
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "mcc"
    eval_every: int = 500


def preprocess_wic(examples, tokenizer, cfg: WicConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_wic(preds, labels):
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
    return {"wic_accuracy": acc, "wic_f1": f1, "wic_precision": precision, "wic_recall": recall}


class WicCallback:
    """Logs wic metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=4):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("wic_mcc", metrics.get("wic_accuracy", 0.0))
        logger.info("step %d wic %s=%.4f", step, "mcc", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_wic.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class WscConfig:
    max_length: int = 224
    num_labels: int = 2
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "f1"
    eval_every: int = 100


def preprocess_wsc(examples, tokenizer, cfg: WscConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_wsc(preds, labels):
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
    return {"wsc_accuracy": acc, "wsc_f1": f1, "wsc_precision": precision, "wsc_recall": recall}


class WscCallback:
    """Logs wsc metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=2):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("wsc_f1", metrics.get("wsc_accuracy", 0.0))
        logger.info("step %d wsc %s=%.4f", step, "f1", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_wsc.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


@dataclass
class AxbConfig:
    max_length: int = 128
    num_labels: int = 3
    text_fields: tuple = ("sentence", "premise", "hypothesis")
    label_field: str = "label"
    metric: str = "accuracy"
    eval_every: int = 200


def preprocess_axb(examples, tokenizer, cfg: AxbConfig):
    fields = [f for f in cfg.text_fields if f in examples]
    if len(fields) == 1:
        enc = tokenizer(examples[fields[0]], truncation=True, max_length=cfg.max_length)
    else:
        enc = tokenizer(examples[fields[0]], examples[fields[1]], truncation=True, max_length=cfg.max_length)
    labels = examples.get(cfg.label_field, [])
    enc["labels"] = [int(x) if cfg.num_labels > 1 else float(x) for x in labels]
    return enc


def metric_axb(preds, labels):
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
    return {"axb_accuracy": acc, "axb_f1": f1, "axb_precision": precision, "axb_recall": recall}


class AxbCallback:
    """Logs axb metrics and keeps the best checkpoint."""

    def __init__(self, output_dir, patience=3):
        self.output_dir = output_dir
        self.best = -math.inf
        self.patience = patience
        self.bad_epochs = 0

    def on_evaluate(self, step, metrics):
        score = metrics.get("axb_accuracy", metrics.get("axb_accuracy", 0.0))
        logger.info("step %d axb %s=%.4f", step, "accuracy", score)
        if score > self.best:
            self.best = score
            self.bad_epochs = 0
            with open(os.path.join(self.output_dir, "best_axb.json"), "w") as f:
                json.dump({"step": step, "score": score}, f)
            return True
        self.bad_epochs += 1
        return self.bad_epochs < self.patience


def main():
    args = parse_args()
    logging.basicConfig(level=logging.INFO)
    set_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, num_labels=2)
    model.to(device)

    train_ds = JsonlDataset(args.train_file, tokenizer, args.max_length)
    train_loader = DataLoader(
        train_ds, batch_size=args.per_device_train_batch_size, shuffle=True, collate_fn=collate(tokenizer)
    )
    eval_loader = None
    if args.validation_file:
        eval_ds = JsonlDataset(args.validation_file, tokenizer, args.max_length)
        eval_loader = DataLoader(eval_ds, batch_size=args.per_device_eval_batch_size, collate_fn=collate(tokenizer))

    optimizer = build_optimizer(model, args)
    updates_per_epoch = math.ceil(len(train_loader) / args.gradient_accumulation_steps)
    total_updates = updates_per_epoch * args.num_train_epochs
    scheduler = get_linear_schedule_with_warmup(optimizer, int(args.warmup_ratio * total_updates), total_updates)
    scaler = torch.amp.GradScaler("cuda", enabled=args.fp16)

    global_step = 0
    start = time.time()
    model.train()
    for epoch in range(args.num_train_epochs):
        for step, batch in enumerate(train_loader):
            batch = {k: v.to(device) for k, v in batch.items()}
            with torch.autocast(device_type=device.type, dtype=torch.float16, enabled=args.fp16):
                outputs = model(**batch)
                loss = outputs.loss / args.gradient_accumulation_steps
            scaler.scale(loss).backward()

            if (step + 1) % args.gradient_accumulation_steps == 0 or step + 1 == len(train_loader):
                scaler.unscale_(optimizer)
                torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                scaler.step(optimizer)
                scaler.update()
                scheduler.step()
                optimizer.zero_grad(set_to_none=True)
                global_step += 1

                if global_step % args.logging_steps == 0:
                    elapsed = time.time() - start
                    logger.info(
                        "epoch %d step %d loss %.4f lr %.2e (%.1fs)",
                        epoch,
                        global_step,
                        loss.item() * args.gradient_accumulation_steps,
                        scheduler.get_last_lr()[0],
                        elapsed,
                    )
                if global_step % args.save_steps == 0:
                    save_checkpoint(model, tokenizer, optimizer, scheduler, args.output_dir, global_step)

        if eval_loader is not None:
            metrics = evaluate(model, eval_loader, device)
            logger.info("epoch %d eval %s", epoch, metrics)

    save_checkpoint(model, tokenizer, optimizer, scheduler, args.output_dir, global_step)


if __name__ == "__main__":
    main()
