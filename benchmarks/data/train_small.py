"""Fine-tune a BERT-family encoder for sequence classification with gradient accumulation and mixed precision.

A typical hand-written training script (argparse, datasets, AdamW, linear warm-up, AMP, checkpoints).
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
