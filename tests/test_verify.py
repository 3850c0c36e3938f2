"""bertlint --verify end to end (CPU): the scripts in fixtures/verify/ and every fixture another area marks
`confirmable` run in child processes under the verifier; every run happens once (a module fixture runs them two at a
time) and the tests read the results."""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bertlint.types import Diagnostic, Position, Severity
from bertlint.verify import verify_script

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parent.parent
V = ROOT / "fixtures" / "verify"
os.environ["HF_HUB_OFFLINE"] = "1"


def diag(script: Path, code: str, row: int, sev: str = "E", **data) -> Diagnostic:
    return Diagnostic(code, code.lower(), Severity(sev), "static finding", str(script), Position(row, 1),
                      Position(row, 2), data=dict(data))


def confirmable_fixtures() -> list[Path]:
    out = []
    for p in sorted(ROOT.glob("fixtures/*/*.expect.json")):
        if p.parent.name == "verify":
            continue
        spec = json.loads(p.read_text())
        if any(f.get("confirmable") for f in spec.get("findings", [])):
            script = p.with_name(p.name[: -len(".expect.json")] + ".py")
            if script.exists():
                out.append(p)
    return out


def _jobs(tmp: Path) -> dict:
    j = {}

    def add(name, script, args=(), diags=(), **kw):
        j[name] = (V / script, list(args), list(diags), kw)

    s = V / "bl101_step_every_microbatch.py"
    add("bl101", s.name, diags=[diag(s, "BL101", 16, n=4)])
    s = V / "bl101_good.py"
    add("good", s.name, diags=[diag(s, "BL101", 19), diag(s, "BL102", 21), diag(s, "BL105", 20),
                               diag(s, "BL112", 18, "W"), diag(s, "BL103", 16, "W")])
    s = V / "bl102_zero_grad_every_microbatch.py"
    add("bl102", s.name, diags=[diag(s, "BL102", 14)])
    s = V / "bl105_scheduler_every_microbatch.py"
    add("bl105", s.name, diags=[diag(s, "BL105", 22)])
    s = V / "bl502_eval_with_grad.py"
    add("bl502", s.name, diags=[diag(s, "BL502", 18, "W"), diag(s, "BL501", 19, accumulator="total", evaluation=True)])
    s = V / "bl502_good.py"
    add("bl502_good", s.name, diags=[diag(s, "BL502", 19, "W")])
    add("trainer", "trainer_ga4.py", report_dir=str(tmp / "report"))
    s = V / "trainer_ga4.py"
    add("trainer_fixed", s.name, ["--fixed"], diags=[diag(s, "BL405", 40)])
    add("bl201", "bl201_clip_before_unscale.py")
    add("bl303", "bl303_reentrant_frozen.py")
    s = V / "bl303_reentrant_frozen.py"
    add("bl303_fixed", s.name, ["--fixed"], diags=[diag(s, "BL303", 23)])
    s = V / "crash_in_training.py"
    add("crash", s.name, diags=[diag(s, "BL101", 13)])
    s = V / "no_training.py"
    add("none", s.name, diags=[diag(s, "BL101", 6)])
    s = V / "ddp_accumulation.py"
    add("ddp_split", s.name, ["--mode", "split"], diags=[diag(s, "BL114", 36)], timeout=120)
    s = V / "bl502_good.py"
    add("oom", s.name, memory_limit=2500)
    s = V / "scaler_skips.py"
    add("skips", s.name, diags=[diag(s, "BL102", 22), diag(s, "BL112", 19, "W"), diag(s, "BL202", 21),
                                diag(s, "BL201", 19)])
    s = V / "accelerate_modes.py"
    add("acc_gate0", s.name, ["--mode", "gate0"], diags=[diag(s, "BL108", 28), diag(s, "BL109", 24)])
    add("acc_backward", s.name, ["--mode", "backward"], diags=[diag(s, "BL108", 28), diag(s, "BL109", 24)])
    s = V / "plain_modes.py"
    add("offbyone", s.name, ["--mode", "offbyone"], diags=[diag(s, "BL107", 28, "W"), diag(s, "BL113", 22, "W")])
    add("deferred", s.name, ["--mode", "deferred"], diags=[diag(s, "BL107", 28, "W"), diag(s, "BL113", 22, "W")])
    for p in confirmable_fixtures():
        from bertlint.engine import lint_python

        spec = json.loads(p.read_text())
        script = p.with_name(p.name[: -len(".expect.json")] + ".py")
        diags = lint_python(script.read_text(), str(script))
        j["fixture:" + str(script.relative_to(ROOT))] = (script, spec.get("argv", []), diags, {"timeout": 120})
    return j


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    jobs = _jobs(tmp)

    def one(item):
        name, (script, args, diags, kw) = item
        return name, verify_script(str(script), args, diags, **{"timeout": 90, **kw})

    folders = sorted({ROOT} | {script.parent for script, *_ in jobs.values()})
    before = _folder_state(folders)
    with ThreadPoolExecutor(2) as ex:
        res = dict(ex.map(one, jobs.items()))
    return res | {"_tmp": tmp, "_state": (folders, before, _folder_state(folders))}


def _folder_state(folders) -> dict:
    """The content hash of each file in fixtures/verify and its `git status`; in the other folders (edited by others
    while this runs) the names that are not sources or expectations: checkpoints, logs, lightning_logs, runs/,
    trainer_output, wandb, mlruns would show there."""
    import hashlib
    import subprocess

    out = {}
    for f in folders:
        key = str(f.relative_to(ROOT)) if f != ROOT else "."
        if f == V:
            out[key] = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
                        for p in sorted(f.iterdir())}
        else:  # what others add meanwhile (sources, expectations, caches) is not a side effect of --verify
            out[key] = sorted(x for x in os.listdir(f) if not x.startswith(".")
                              and not x.endswith((".py", ".json", ".md", ".yaml", ".yml", ".toml", ".ipynb", ".txt")))
    out["git status"] = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all", "--", str(V)],
                                       cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    return out


def test_verify_of_the_fixtures_leaves_their_folders_unchanged(runs):
    """ISSUE 15 part 1: ~25 --verify runs (Trainer, accelerate, DDP under torchrun, crashes, OOM) change no file
    in the fixtures' folders and leave nothing (lightning_logs, runs/, trainer_output, wandb) in the working
    directory."""
    folders, before, after = runs["_state"]
    assert len(folders) >= 3
    assert after == before


def ver(res, code, row=None):
    for d in res.diagnostics:
        if d.code == code and (row is None or d.start.row == row):
            return d.verification
    raise AssertionError(f"no {code} in {[(d.code, d.start.row) for d in res.diagnostics]}\n{res.report_text}")


def runtime_only(res):
    return [d for d in res.diagnostics if d.data.get("runtime_only")]


def test_bl101_step_every_microbatch_is_confirmed_with_counts(runs):
    v = ver(runs["bl101"], "BL101")
    assert v.status == "confirmed"
    # the linter's own invariant on the observed trace, with the run's numbers
    assert v.evidence.startswith("observed: micro-batches 1–4: backward, then `optimizer.step()` after each → each "
                                 "update sees one micro-batch weighted 1/N = 1/4 instead of 4"), v.evidence
    assert "[13 micro-batches, 13 optimizer steps" in v.evidence


def test_correct_loop_refutes_every_accumulation_finding_and_adds_none(runs):
    res = runs["good"]
    for code in ("BL101", "BL102", "BL105", "BL112", "BL103"):
        assert ver(res, code).status == "refuted", (code, ver(res, code).evidence)
    assert ver(res, "BL101").evidence.startswith("observed, the invariant holds: 13 micro-batches, 3 optimizer steps "
                                                 "(after micro-batches 4, 8, 12: windows of 4, 4, 4): one update every 4")
    assert "`scheduler.step()` ×3: at most one per update (LR 0.091 → 0.082 → 0.073)" in ver(res, "BL105").evidence
    assert "loss × 1/N = 1/4 at backward (0.25 observed) → a window of 4 weighs 1" in ver(res, "BL103").evidence
    assert runtime_only(res) == []
    # the default bound: three windows (the invariants' need) + 1 micro-batch, N = 4 from the static set-up
    assert res.report_json["optimizer_steps"] == 3 and res.report_json["microbatches"] == 13
    assert res.report_json["setup"]["accumulation"]["value"] == 4


def test_bl102_gradient_at_step_is_the_last_microbatch(runs):
    v = ver(runs["bl102"], "BL102")
    assert v.status == "confirmed"
    # the linter's own invariant (bertlint.trace) fails on the observed trace, quoted like the lint message
    assert "observed: micro-batches 1–4: backward ×4, `optimizer.zero_grad()` before each" in v.evidence
    assert "the gradients of 3 micro-batches are erased" in v.evidence


def test_bl105_lr_changes_between_steps(runs):
    v = ver(runs["bl105"], "BL105")
    assert v.status == "confirmed"
    assert "micro-batches 5–8: backward ×4, `scheduler.step()` ×4, `optimizer.step()` ×1 → the schedule advances 4 " \
        "steps per optimizer update (4× too fast)" in v.evidence


def test_eval_with_grad_and_kept_losses_are_confirmed(runs):
    res = runs["bl502"]
    v = ver(res, "BL502")
    assert v.status == "confirmed" and "ran with grad enabled" in v.evidence
    v = ver(res, "BL501")
    assert v.status == "confirmed" and "`total`" in v.evidence
    assert res.report_json["memory"]["phases"]["eval"]["activations"] > 0


def test_eval_under_no_grad_is_refuted(runs):
    res = runs["bl502_good"]
    v = ver(res, "BL502")
    assert v.status == "refuted" and "no_grad" in v.evidence
    assert runtime_only(res) == []


def test_trainer_bl405_found_at_runtime_with_probe_and_report_files(runs):
    res = runs["trainer"]
    found = [d for d in runtime_only(res) if d.code == "BL405"]
    assert found and found[0].verification.status == "confirmed"
    ev = found[0].verification.evidence
    assert "does not divide by current_gradient_accumulation_steps=4" in ev
    assert "unchanged when num_items_in_batch is ×1000" in ev
    rep = runs["_tmp"] / "report"
    data = json.loads((rep / "verify.json").read_text())
    assert data["trainer"]["gradient_accumulation_steps"] == 4
    assert set(data["memory"]["phases"]) >= {"forward", "backward", "optimizer"}
    ph = data["memory"]["phases"]["optimizer"]
    assert ph["parameters"] > 0 and ph["gradients"] == ph["parameters"]
    assert 2 * ph["parameters"] <= ph["optimizer_states"] < 2.01 * ph["parameters"]  # AdamW: exp_avg, exp_avg_sq
    png = rep / "memory_timeline.png"
    assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_trainer_with_the_fix_refutes_bl405(runs):
    v = ver(runs["trainer_fixed"], "BL405")
    assert v.status == "refuted"
    assert "divides the loss by current_gradient_accumulation_steps=4" in v.evidence
    assert runtime_only(runs["trainer_fixed"]) == []


def test_clip_before_unscale_found_at_runtime(runs):
    found = [d for d in runtime_only(runs["bl201"]) if d.code == "BL201"]
    assert found and found[0].start.row == 21
    assert "with no `unscale_` in between → the clip sees gradients × the loss scale" in found[0].verification.evidence


def test_reentrant_checkpoint_frozen_inputs(runs):
    found = [d for d in runtime_only(runs["bl303"]) if d.code == "BL303"]
    assert found and "4 of 4 trainable parameters inside checkpointed blocks had no gradient" in \
        found[0].verification.evidence
    v = ver(runs["bl303_fixed"], "BL303")
    assert v.status == "refuted" and "4 of 4 trainable parameters" in v.evidence


def test_crash_is_reported_with_what_was_seen_before(runs):
    res = runs["crash"]
    crash = res.report_json["crash"]
    assert crash["type"] == "RuntimeError" and "shapes cannot be multiplied" in crash["message"]
    assert crash["user_frame"][1] == 11
    assert "crash: RuntimeError" in res.report_text and "crash_in_training.py:11" in res.report_text
    v = ver(res, "BL101")
    assert v.status == "confirmed" and "[2 micro-batches, 2 optimizer steps" in v.evidence, v.evidence


def test_script_without_training_is_inconclusive(runs):
    v = ver(runs["none"], "BL101")
    assert v.status == "inconclusive"
    assert "finished without a training step" in v.evidence


def test_ddp_under_torchrun_two_ranks_diverging_replicas(runs):
    res = runs["ddp_split"]
    assert res.report_json["ranks"] == 2
    v = ver(res, "BL114")
    assert v.status == "confirmed" and "replicas diverge" in v.evidence


def test_simulated_out_of_memory_gives_breakdown_and_levers(runs):
    res = runs["oom"]
    oom = res.report_json["memory"]["oom"]
    assert res.report_json["crash"]["oom"] is True
    assert [lv["lever"].split()[0] for lv in oom["levers"]] == ["halve", "halve", "activation", "mixed", "optimizer"]
    assert "OUT OF MEMORY" in res.report_text


def test_steps_skipped_by_the_grad_scaler_still_end_windows(runs):
    res = runs["skips"]
    assert res.report_json["counts"]["scaler_step"] == 3 and res.report_json["optimizer_steps"] == 2
    for code in ("BL102", "BL112", "BL202", "BL201"):
        assert ver(res, code).status == "refuted", (code, ver(res, code).evidence)
    assert runtime_only(res) == []
    assert "1 skipped by the GradScaler" in res.report_text


def test_accelerate_hand_gate_inside_accumulate_never_steps(runs):
    res = runs["acc_gate0"]
    v = ver(res, "BL108")
    assert v.status == "confirmed", v.evidence
    assert "`optimizer.step()` runs 4× but never takes effect (off accelerate's sync step)" in v.evidence
    assert ver(res, "BL109").status == "refuted"


def test_accelerate_plain_backward_bypasses_the_division(runs):
    res = runs["acc_backward"]
    v = ver(res, "BL109")
    assert v.status == "confirmed" and "13 of 13 backward calls bypassed accelerator.backward" in v.evidence
    assert ver(res, "BL108").status == "refuted"


def test_off_by_one_gate_and_deferred_backward(runs):
    v = ver(runs["offbyone"], "BL107")
    assert v.status == "confirmed" and "`optimizer.step()` after the 1st micro-batch, then every 4" in v.evidence
    assert ver(runs["offbyone"], "BL113").status == "refuted"
    v = ver(runs["deferred"], "BL113")
    assert v.status == "confirmed" and v.evidence.startswith("observed: micro-batches 1–4: losses added with their "
                                                             "graphs, one backward after the 4th")
    v = ver(runs["deferred"], "BL107")
    assert v.status == "inconclusive" and v.evidence.startswith("not exercised: no full window of N = 4")


@pytest.mark.parametrize("expect", [pytest.param(p, id=str(p.relative_to(ROOT))) for p in confirmable_fixtures()])
def test_confirmable_fixture_findings_are_confirmed(runs, expect):
    spec = json.loads(expect.read_text())
    script = expect.with_name(expect.name[: -len(".expect.json")] + ".py")
    res = runs["fixture:" + str(script.relative_to(ROOT))]
    for f in spec["findings"]:
        if f.get("confirmable"):
            v = ver(res, f["code"], f["line"])
            assert v.status == "confirmed", (f, v.evidence, res.report_text)


def test_missing_script_never_raises(tmp_path):
    d = diag(tmp_path / "nope.py", "BL101", 3)
    res = verify_script(str(tmp_path / "nope.py"), [], [d])
    assert d.verification.status == "not-run" and "not a file" in res.report_text
