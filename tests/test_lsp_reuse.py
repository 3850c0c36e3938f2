"""What the language server reuses between two lints of a document (the incremental parse, the per-statement
tables of ``bertlint/stmtcache.py``) never changes a diagnostic: after every edit of a sequence (comments typed,
code changed inside and outside the training loop, lines inserted and deleted, the file broken and mended,
``# noqa`` added), the server's lint equals a fresh full lint of the same text."""

from __future__ import annotations

import random
import textwrap
from pathlib import Path

import libcst as cst

from bertlint.lsp import convert, server

ROOT = Path(__file__).resolve().parent.parent

SCRIPT = textwrap.dedent(
    '''\
    """Two training loops, one of them wrong (test input)."""

    import torch
    from torch.utils.data import DataLoader

    # the accumulation factor
    ACCUM = 4


    def build(model_name):
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        return model, optimizer


    def train_bad(model, loader, optimizer, accum_steps=8):
        # steps on every micro-batch
        for i, batch in enumerate(loader):
            loss = model(batch).sum() / accum_steps
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


    def train_good(model, loader, optimizer):
        model.train()
        for step, batch in enumerate(loader):
            loss = model(batch).sum() / ACCUM
            loss.backward()
            if (step + 1) % ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad()


    def train_amp(model, loader, optimizer, tokenizer, texts):
        enc = tokenizer(texts, padding="max_length", truncation=True)
        scaler = torch.cuda.amp.GradScaler()
        for batch in loader:
            with torch.cuda.amp.autocast():
                out = torch.utils.checkpoint.checkpoint(model, batch)
                loss = out.mean()
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
            torch.cuda.empty_cache()
        return enc


    def evaluate(model, loader):
        model.eval()
        total = 0.0
        for batch in loader:
            out = model(batch)
            total += out.sum().item()
        return total


    class Runner:
        def __init__(self, model):
            self.model = model

        def fit(self, loader, optimizer):
            for batch in loader:
                loss = self.model(batch).mean()
                loss.backward()
                optimizer.step()


    def main():
        model, optimizer = build("m")
        loader = DataLoader(list(range(10)), batch_size=2)
        train_bad(model, loader, optimizer)
        train_good(model, loader, optimizer)
        print(evaluate(model, loader))


    if __name__ == "__main__":
        main()
    '''
)


def _edit(text: str, rng: random.Random) -> str:
    lines = text.splitlines(keepends=True)
    if not lines:
        return "import torch\n"
    i = rng.randrange(len(lines))
    line = lines[i]
    body = line.rstrip("\r\n")
    indent = body[: len(body) - len(body.lstrip(" "))]
    op = rng.randrange(12)
    if op == 0:  # type into a comment (or start one at the end of the line)
        new = body + ("x" if "#" in body else "  # note") + "\n"
        lines[i] = new
    elif op == 1:  # a comment line, indented like this one or at column 0
        lines.insert(i, rng.choice([indent, ""]) + "# typed\n")
    elif op == 2:  # a blank line in, or one out
        if not body.strip():
            del lines[i]
        else:
            lines.insert(i, "\n")
    elif op == 3:  # the optimizer step inside a loop: gone, or back
        steps = [k for k, ln in enumerate(lines) if "optimizer.step()" in ln]
        if steps and rng.random() < 0.5:
            del lines[rng.choice(steps)]
        else:
            loops = [k for k, ln in enumerate(lines) if "loss.backward()" in ln]
            if loops:
                k = rng.choice(loops)
                ind = lines[k][: len(lines[k]) - len(lines[k].lstrip(" "))]
                lines.insert(k + 1, ind + "optimizer.step()\n")
    elif op == 4:  # a constant changes (the accumulation factor, a batch size)
        for k, ln in enumerate(lines):
            if "ACCUM = " in ln or "accum_steps=" in ln or "batch_size=" in ln:
                lines[k] = ln.replace("4", "1").replace("8", "4").replace("2)", "8)")
                break
    elif op == 5:  # a new top-level statement
        lines.insert(i, f"value_{rng.randrange(100)} = {rng.randrange(10)}\n")
    elif op == 6:  # a line deleted (may break the file)
        del lines[i]
    elif op == 7:  # a character deleted (may break the file)
        if body:
            j = rng.randrange(len(body))
            lines[i] = body[:j] + body[j + 1 :] + "\n"
    elif op == 8:  # a noqa on a line, or taken away
        lines[i] = (body.split("  # noqa")[0] if "# noqa" in body else body + "  # noqa") + "\n"
    elif op == 9:  # a name typed into
        lines[i] = line.replace("loss", "loss_", 1) if "loss" in line else line.replace("batch", "batch2", 1)
    elif op == 10:  # an unclosed bracket, mended by the next edit of the same kind
        lines[i] = body + "(\n" if not body.endswith("(") else body[:-1] + "\n"
    else:  # a zero_grad after the backward, or the whole loop body duplicated
        loops = [k for k, ln in enumerate(lines) if "loss.backward()" in ln]
        if loops:
            k = rng.choice(loops)
            ind = lines[k][: len(lines[k]) - len(lines[k].lstrip(" "))]
            lines.insert(k + 1, ind + rng.choice(["optimizer.zero_grad()\n", "loss = loss * 2\n"]))
    return "".join(lines)


def _sequence(tmp_path: Path, text: str, seed: int, n: int) -> int:
    filename = str(tmp_path / "train.py")
    server.forget(filename)
    rng = random.Random(seed)
    reused = 0
    for _ in range(n):
        text = _edit(text, rng)
        got = server.run_lint(text, filename, filename)
        fresh = convert.lint(text, filename, convert.load_settings(filename))
        assert got.crash is None and not got.rule_errors, (got.crash, got.rule_errors)
        assert got.diagnostics == fresh, text
        last = server._stmt_cache.last_reused.get("index") if server._stmt_cache is not None else None
        reused += bool(last and last[0])
    return reused


def test_edit_sequences_equal_a_fresh_lint(tmp_path):
    base = convert.lint(SCRIPT, str(tmp_path / "train.py"))
    assert {d.code for d in base}, "the script must have findings for the comparison to mean something"
    reused = 0
    for seed in range(6):
        reused += _sequence(tmp_path, SCRIPT, seed, 25)
    assert reused > 50  # the statement tables were reused, not rebuilt


def test_edit_sequence_on_the_benchmark_script(tmp_path):
    text = (ROOT / "benchmarks" / "data" / "train_small.py").read_text() + "\n" + SCRIPT.split("\n", 1)[1]
    assert _sequence(tmp_path, text, 99, 15) > 5


def test_reused_index_equals_one_walk():
    """The merged per-statement tables are the tables of one walk of the whole module: the same node lists (by
    identity, in order, and the types in the order they first appear) and the same parents."""
    from bertlint.context import NodeIndex
    from bertlint.incremental import Reparser
    from bertlint.stmtcache import StatementCache

    rp, cache = Reparser(), StatementCache()
    text = SCRIPT
    rng = random.Random(7)
    hits = 0
    for _ in range(30):
        new = _edit(text, rng)
        module = rp.parse("k", new)
        if not isinstance(module, cst.Module):
            continue  # an edit that breaks the file: the next one starts from the text before it
        text = new
        mine = NodeIndex(module, cache, "k")
        hits += cache.last_reused["index"][0] > 0
        ref = NodeIndex(module)
        assert list(mine._by_type) == list(ref._by_type)
        for tp, nodes in ref._by_type.items():
            got = mine._by_type[tp]
            assert len(got) == len(nodes) and all(a is b for a, b in zip(got, nodes)), tp
        assert mine._parents.keys() == ref._parents.keys()
        assert all(mine._parents[k] is v for k, v in ref._parents.items())
    assert hits > 10


def test_reused_evalflow_walk_equals_one_walk():
    """The evaluation flow's tables merged from per-statement walks are those of one walk of the module: the same
    pre-order and end numbers, parents, scopes, and node lists (by identity, in order, keys in the same order)."""
    from bertlint.analysis import evalflow, symbols
    from bertlint.incremental import Reparser
    from bertlint.stmtcache import StatementCache

    rp, cache = Reparser(), StatementCache()
    text = SCRIPT
    rng = random.Random(11)
    hits = 0

    def same(a, b) -> bool:
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))

    for _ in range(30):
        new = _edit(text, rng)
        module = rp.parse("k", new)
        if not isinstance(module, cst.Module):
            continue
        text = new
        table = symbols.build(module)
        mine = evalflow.EvalFlow(module, table, "k", cache)
        hits += cache.last_reused["evalflow"][0] > 0
        ref = evalflow.EvalFlow(module, table, "k")
        for name in ("order", "end", "parent", "scope"):
            a, b = getattr(mine, name).d, getattr(ref, name).d
            assert list(a) == list(b), name
            assert all(a[k] is v or a[k] == v for k, v in b.items()), name
        assert mine.order.d == ref.order.d and mine.end.d == ref.end.d
        for name in ("calls", "loops", "withs", "functions"):
            assert same(getattr(mine, name), getattr(ref, name)), name
        for name in ("calls_by_final", "assigns", "names", "returns"):
            a, b = getattr(mine, name), getattr(ref, name)
            assert list(a) == list(b) and all(same(a[k], b[k]) for k in b), name
        assert mine._call_orders == ref._call_orders
    assert hits > 10


def _same(a, b) -> bool:
    """Structural equality with libcst nodes compared by identity, sets and dicts in the same iteration order."""
    import dataclasses

    if isinstance(a, cst.CSTNode) or isinstance(b, cst.CSTNode):
        return a is b
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (set, frozenset)):
        return list(a) == list(b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if dataclasses.is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a is b or a == b


def test_reused_symbol_table_equals_one_walk():
    """The symbol table merged from per-statement tables is the table of one walk: every attribute, with binding
    numbers, key and set orders, and node identities; the records in it are not the cached pieces' objects."""
    from bertlint.analysis import symbols
    from bertlint.incremental import Reparser
    from bertlint.stmtcache import StatementCache

    rp, cache = Reparser(), StatementCache()
    text = SCRIPT + textwrap.dedent(
        '''
        import argparse
        from dataclasses import dataclass, field
        p = argparse.ArgumentParser()
        p.add_argument("--accum", type=int, default=4)
        p.add_argument("--layers", default=[1, 2])
        a, b = build("x")
        d = {}
        d["k"] = 3
        n = 0
        n += 1


        @dataclass
        class Args:
            lr: float = 1e-3
            steps: int = field(default=10)
        '''
    )
    rng = random.Random(5)
    hits = 0
    for _ in range(30):
        new = _edit(text, rng)
        module = rp.parse("k", new)
        if not isinstance(module, cst.Module):
            continue
        text = new
        mine = symbols.build(module, cache, "k")
        hits += cache.last_reused["symbols"][0] > 0
        ref = symbols.build(module)
        assert list(vars(mine)) == list(vars(ref))
        for name in vars(ref):
            assert _same(getattr(mine, name), getattr(ref, name)), name
        assert ref.assignments and ref.argparse and ref.dataclass_fields and ref.unpack_seq
        pieces = [p for _st, p in cache._files["k"]["symbols"].values()]
        held = {id(a) for p in pieces for v in p.assignments.values() for a in v}
        assert not any(id(a) in held for v in mine.assignments.values() for a in v)
    assert hits > 10


# ------------------------------------------------------------------------------------------------ the dry run taken
# again (bertlint/dryreuse.py): only when the edit changed nothing the run could read

LOOP_SCRIPT = textwrap.dedent(
    '''\
    """Accumulation with a helper the loop inlines and an argparse factor (test input)."""
    import argparse

    import torch


    def parse_args():
        p = argparse.ArgumentParser()
        p.add_argument("--grad_accum", type=int, default=4)
        return p.parse_args()


    def compute_loss(model, batch):
        return model(batch).sum()


    def main():
        args = parse_args()
        note = "x"
        model = torch.nn.Linear(8, 2)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2)
        for step, batch in enumerate(loader):
            loss = compute_loss(model, batch)
            loss.backward()
            label = "y"
            if (step + 1) % args.grad_accum == 0:
                optimizer.step()
                optimizer.zero_grad()
        torch.save(model.state_dict(), "model.pt")


    if __name__ == "__main__":
        main()
    '''
)


def _after_edit(filename: str, before: str, after: str):
    """Lint ``before`` afresh in the server, then ``after`` (one edit): (diagnostics of both, what the dry run
    did, the fresh lint of ``after``)."""
    server.forget(filename)
    first = server.run_lint(before, filename, filename)
    got = server.run_lint(after, filename, filename)
    fresh = convert.lint(after, filename, convert.load_settings(filename))
    assert got.crash is None and not got.rule_errors, (got.crash, got.rule_errors)
    return first.diagnostics, got.diagnostics, server._dry_memo.last, fresh


def test_dry_run_reused_for_an_edit_nothing_reads(tmp_path):
    """Typing into the string of a variable nothing reads (before the loop, or inside it), or into the module's
    header comment: the loop's run is taken again, and the diagnostics are the fresh lint's."""
    filename = str(tmp_path / "train.py")
    Path(filename).write_text(LOOP_SCRIPT)
    base = convert.lint(LOOP_SCRIPT, filename)
    assert [d.code for d in base] == ["BL103"]  # the loss is not divided by the factor
    for after in (LOOP_SCRIPT.replace('note = "x"', 'note = "xq"'),
                  LOOP_SCRIPT.replace('note = "x"', 'note = "x qq"'),
                  LOOP_SCRIPT.replace('label = "y"', 'label = "yq"'),
                  "#!/usr/bin/env python\n" + LOOP_SCRIPT):
        _first, got, last, fresh = _after_edit(filename, LOOP_SCRIPT, after)
        assert last == "reused", (last, after)
        assert got == fresh and [d.code for d in got] == ["BL103"]


def test_dry_run_reused_for_an_edit_of_a_snake_case_variable(tmp_path):
    """The same for a variable with an underscore in its name (``run_note``): no analysis looks for the character
    ``_`` in a word (an in-place method test reads call names, which the shape check compares)."""
    filename = str(tmp_path / "train.py")
    before = LOOP_SCRIPT.replace('note = "x"', 'run_note = "x"')
    Path(filename).write_text(before)
    _first, got, last, fresh = _after_edit(filename, before, before.replace('run_note = "x"', 'run_note = "xq"'))
    assert last == "reused"
    assert got == fresh and [d.code for d in got] == ["BL103"]


def test_dry_run_runs_again_when_the_edit_may_change_it(tmp_path):
    """Each edit here reaches something the run reads (the loop, the function before the loop, the helper it
    inlines, the argparse default of the factor, a name used elsewhere, a word the analyses search the text
    for): the run is made again, and the diagnostics are the fresh lint's (several differ from before the edit:
    the old run would have been wrong)."""
    filename = str(tmp_path / "train.py")
    Path(filename).write_text(LOOP_SCRIPT)
    s = LOOP_SCRIPT
    cases = {
        "in the loop": s.replace("loss = compute_loss(model, batch)", "loss = compute_loss(model, batch) / args.grad_accum"),
        "before the loop": s.replace('note = "x"', "args.grad_accum = 1"),
        "the helper": s.replace("return model(batch).sum()", "return model(batch).sum() / 4"),
        "argparse default": s.replace("default=4", "default=1"),
        "a name used elsewhere": s.replace('note = "x"', 'note = "x"\n    print(note)'),
        "the string of a name used elsewhere": s.replace('note = "x"', 'step = "x"'),
        "a literal the loop reads": s.replace("batch_size=2", "batch_size=3"),
        "a word text searches look for": "# no_sync\n" + s,
    }
    changed = 0
    for what, after in cases.items():
        first, got, last, fresh = _after_edit(filename, s, after)
        assert last != "reused", what
        assert got == fresh, what
        changed += got != first
    assert changed >= 3


def test_dry_run_not_reused_with_a_sibling_module(tmp_path):
    """A script that imports a module of its project runs again on every edit: the sibling may have changed."""
    (tmp_path / "helpers.py").write_text("def compute_loss(model, batch):\n    return model(batch).sum()\n")
    s = LOOP_SCRIPT.replace("import torch\n", "import torch\n\nfrom helpers import compute_loss\n", 1)
    s = s.replace("def compute_loss(model, batch):\n    return model(batch).sum()\n\n\n", "")
    filename = str(tmp_path / "train.py")
    Path(filename).write_text(s)
    _first, got, last, fresh = _after_edit(filename, s, s.replace('note = "x"', 'note = "xq"'))
    assert last != "reused" and got == fresh
    (tmp_path / "helpers.py").write_text("def compute_loss(model, batch):\n    return model(batch).sum() / 4\n")
    again = server.run_lint(s.replace('note = "x"', 'note = "xqq"'), filename, filename)
    assert again.diagnostics == convert.lint(s.replace('note = "x"', 'note = "xqq"'), filename,
                                             convert.load_settings(filename))


def test_edit_sequence_with_reuse_equals_a_fresh_lint(tmp_path):
    """Keystrokes into dead strings mixed with the random edits: every lint equals a fresh one, and the run was
    taken again for some of them."""
    filename = str(tmp_path / "train.py")
    server.forget(filename)
    rng = random.Random(3)
    rest = SCRIPT.split("\n", 1)[1].rsplit("\n\nif __name__", 1)[0].replace("def main():", "def main2():")
    text = LOOP_SCRIPT + rest + "\n"
    reused = 0
    for k in range(40):
        if k % 2:
            text = _edit(text, rng)
        else:
            text = text.replace('note = "x', 'note = "xq', 1) if 'note = "x' in text else text
        got = server.run_lint(text, filename, filename)
        fresh = convert.lint(text, filename, convert.load_settings(filename))
        assert got.crash is None and not got.rule_errors
        assert got.diagnostics == fresh, text
        reused += server._dry_memo.last == "reused"
    assert reused >= 5
