"""BL109 with an accelerate launcher config beside the script (the config-dependent part)."""

import textwrap

from bertlint.api import lint_path
from bertlint.types import Severity

YAML_DS = textwrap.dedent(
    """\
    compute_environment: LOCAL_MACHINE
    distributed_type: DEEPSPEED
    deepspeed_config:
      gradient_accumulation_steps: 4
      zero_stage: 2
    mixed_precision: bf16
    num_processes: 2
    """
)

ACCUMULATE = textwrap.dedent(
    """\
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dl = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)
    model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
    for batch in dl:
        with accelerator.accumulate(model):
            loss = model(batch).sum()
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    """
)

GATED = textwrap.dedent(
    """\
    import torch
    from accelerate import Accelerator

    accelerator = Accelerator()
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    dl = torch.utils.data.DataLoader(torch.randn(64, 4), batch_size=8)
    model, optimizer, dl = accelerator.prepare(model, optimizer, dl)
    for step, batch in enumerate(dl):
        loss = model(batch).sum()
        accelerator.backward(loss)
        if (step + 1) % 4 == 0:
            optimizer.step()
            optimizer.zero_grad()
    """
)


def _codes(tmp_path, script, yaml_text):
    (tmp_path / "train.py").write_text(script)
    if yaml_text is not None:
        (tmp_path / "default_config.yaml").write_text(yaml_text)
    return [(d.code, d.start.row) for d in lint_path(str(tmp_path / "train.py")) if d.code == "BL109"]


def test_accumulate_without_ga_is_reported_without_launcher_config(tmp_path):
    assert _codes(tmp_path, ACCUMULATE, None) == [("BL109", 10)]


def test_launcher_deepspeed_accumulation_configures_accumulate(tmp_path):
    # `accelerate launch` turns deepspeed_config.gradient_accumulation_steps into
    # ACCELERATE_GRADIENT_ACCUMULATION_STEPS, which configures accumulate(): not a misuse.
    assert _codes(tmp_path, ACCUMULATE, YAML_DS) == []


def test_hand_gate_under_launcher_deepspeed_is_reported(tmp_path):
    found = _codes(tmp_path, GATED, YAML_DS)
    assert found == [("BL109", 12)]


def test_hand_gate_without_deepspeed_is_not_bl109(tmp_path):
    assert _codes(tmp_path, GATED, None) == []


def _bl109(path):
    return [(d.start.row, d.severity, d.message) for d in lint_path(str(path)) if d.code == "BL109"]


def test_hand_gate_when_deepspeed_is_only_expected_is_a_warning():
    # No DeepSpeedPlugin in the code and no launcher config: DeepSpeed is an assumption about the launch, so the
    # finding is a warning that says so; a plugin built in the code keeps it an error.
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "fixtures" / "loops"
    [(row, sev, msg)] = _bl109(root / "accelerate_ds_expected_gate_bad.py")
    assert (row, sev) == (21, Severity.WARNING)
    assert "when launched with DeepSpeed" in msg
    [(row, sev, _)] = _bl109(root / "accelerate_deepspeed_gate_bad.py")
    assert (row, sev) == (21, Severity.ERROR)
