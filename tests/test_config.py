"""[tool.bertlint] configuration: discovery, validation (exact messages, file and key named), selection."""

from __future__ import annotations

import os
import textwrap

import pytest

from bertlint.cli import main
from bertlint.config import ConfigError, Settings, clear_caches, find_config, load_settings, path_matches, read_config_file


@pytest.fixture(autouse=True)
def _fresh():
    clear_caches()
    yield
    clear_caches()


def write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_reads_all_keys(tmp_path):
    cfg = write(
        tmp_path / "pyproject.toml",
        """
        [project]
        name = "x"

        [tool.bertlint]
        select = ["BL1", "bl2"]
        ignore = ["BL105"]
        extend-select = ["BL503"]
        exclude = ["data/*"]
        world-size = 8

        [tool.bertlint.per-file-ignores]
        "scripts/*.py" = ["BL101"]

        [tool.bertlint.target-versions]
        transformers = "4.46.3"
        accelerate = "1.15.0"
        """,
    )
    s = read_config_file(str(cfg))
    assert s.select == ["BL1", "BL2"]
    assert s.ignore == ["BL105"]
    assert s.extend_select == ["BL503"]
    assert s.exclude == ["data/*"]
    assert s.world_size == 8
    assert s.per_file_ignores == {"scripts/*.py": ["BL101"]}
    assert s.target_versions == {"transformers": "4.46.3", "accelerate": "1.15.0"}
    assert s.config_path == str(cfg)


def test_nearest_config_wins_and_pyproject_without_table_is_skipped(tmp_path):
    write(tmp_path / "pyproject.toml", '[tool.bertlint]\nignore = ["BL1"]\n')
    write(tmp_path / "pkg" / "pyproject.toml", '[project]\nname = "pkg"\n')  # no [tool.bertlint]: skipped
    write(tmp_path / "pkg" / "sub" / "bertlint.toml", 'ignore = ["BL2"]\n')
    f1 = write(tmp_path / "pkg" / "train.py", "")
    f2 = write(tmp_path / "pkg" / "sub" / "train.py", "")
    assert find_config(str(f1)) == str(tmp_path / "pyproject.toml")
    assert load_settings(str(f1)).ignore == ["BL1"]
    assert load_settings(str(f2)).ignore == ["BL2"]
    assert load_settings(str(f2)).config_path == str(tmp_path / "pkg" / "sub" / "bertlint.toml")


def test_bertlint_toml_accepts_tool_table(tmp_path):
    cfg = write(tmp_path / "bertlint.toml", '[tool.bertlint]\nworld-size = 4\n')
    assert read_config_file(str(cfg)).world_size == 4


def test_no_config_gives_defaults(tmp_path):
    f = write(tmp_path / "a" / "train.py", "")
    s = load_settings(str(f))
    assert s == Settings()


@pytest.mark.parametrize(
    "body, message",
    [
        ('selct = ["BL1"]', '[tool.bertlint] unknown key "selct" (did you mean "select"?)'),
        ("select = \"BL101\"", '[tool.bertlint] "select" must be an array of rule codes (strings), got a string'),
        ('ignore = ["E501"]', '[tool.bertlint] "ignore": "E501" is not a rule code or prefix'),
        ("world-size = \"8\"", '[tool.bertlint] "world-size" must be an integer, got a string'),
        ("world-size = true", '[tool.bertlint] "world-size" must be an integer, got a boolean'),
        ("world-size = 0", '[tool.bertlint] "world-size" must be >= 1, got 0'),
        ('target-versions = "4.46"', '[tool.bertlint] "target-versions" must be a table'),
        ('target-versions = {transformer = "4.46.3"}', '"target-versions": unknown package "transformer"'),
        ('target-versions = {transformers = 4.46}', '"target-versions.transformers" must be a version string'),
        ('per-file-ignores = ["x"]', '"per-file-ignores" must be a table of glob = [codes], got an array'),
        ('exclude = "data"', '[tool.bertlint] "exclude" must be an array of strings, got a string'),
    ],
)
def test_invalid_values_name_file_and_key(tmp_path, body, message):
    cfg = write(tmp_path / "pyproject.toml", f"[tool.bertlint]\n{body}\n")
    with pytest.raises(ConfigError) as e:
        read_config_file(str(cfg))
    assert str(e.value).startswith(f"{cfg}: ")
    assert message in str(e.value)


def test_invalid_toml_is_a_config_error(tmp_path):
    cfg = write(tmp_path / "pyproject.toml", "[tool.bertlint]\nselect = [\n")
    with pytest.raises(ConfigError, match="invalid TOML"):
        read_config_file(str(cfg))
    cfg.write_bytes(b"[tool.bertlint]\nselect = ['\xff']\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_config_file(str(cfg))


def test_cli_config_error_exits_2_without_traceback(tmp_path, capsys):
    write(tmp_path / "pyproject.toml", '[tool.bertlint]\nworld_size = 8\n')
    f = write(tmp_path / "train.py", "import torch\n")
    assert main([str(f)]) == 2
    err = capsys.readouterr().err
    assert err == (
        f'bertlint: error: {tmp_path / "pyproject.toml"}: [tool.bertlint] unknown key "world_size" '
        '(did you mean "world-size"?); known keys: select, ignore, extend-select, per-file-ignores, exclude, '
        "extend-exclude, target-versions, world-size\n"
    )
    assert "Traceback" not in err


def test_cli_explicit_config_and_isolated(tmp_path, capsys):
    write(tmp_path / "pyproject.toml", '[tool.bertlint]\nwolrd = 1\n')
    other = write(tmp_path / "other.toml", 'ignore = ["BL"]\n')
    f = write(tmp_path / "train.py", "import torch\nx = (\n")
    assert main(["--isolated", "--output-format", "concise", str(f)]) == 1  # syntax error reported
    assert "BL001" in capsys.readouterr().out
    assert main(["--config", str(other), str(f)]) == 0  # BL ignored entirely
    capsys.readouterr()
    assert main(["--config", str(tmp_path / "missing.toml"), str(f)]) == 2
    assert "configuration file not found" in capsys.readouterr().err


@pytest.mark.parametrize(
    "select, ignore, extend, code, default, enabled",
    [
        (None, [], [], "BL101", True, True),
        (None, [], [], "BL101", False, False),
        (None, [], ["BL101"], "BL101", False, True),
        (["BL1"], [], [], "BL201", True, False),
        (["BL1"], ["BL101"], [], "BL101", True, False),
        (["BL101"], ["BL1"], [], "BL101", True, True),  # the more specific selector wins
        (["ALL"], ["BL2"], [], "BL205", True, False),
        (["ALL"], [], [], "BL999", False, False),  # off-by-default rules need their exact code
        (["BL9"], [], [], "BL999", False, False),
        (["BL999"], ["BL9"], [], "BL999", False, True),
        (None, ["BL"], ["BL301"], "BL301", True, True),
    ],
)
def test_selection(select, ignore, extend, code, default, enabled):
    s = Settings(select=select, ignore=ignore, extend_select=extend)
    assert s.is_enabled(code, default) is enabled


def test_cli_options_override_config():
    base = Settings(select=["BL1"], ignore=["BL105"], extend_select=["BL5"])
    s = base.with_cli(select=["BL2"], ignore=["BL201"], extend_select=["BL3"])
    assert s.select == ["BL2"] and s.extend_select == ["BL3"] and s.ignore == ["BL105", "BL201"]
    assert base.select == ["BL1"]  # not modified


def test_per_file_ignores_and_exclude_globs(tmp_path):
    s = Settings(
        per_file_ignores={"scripts/*.py": ["BL101"], "legacy.py": ["BL2"]},
        exclude=["data", "*.gen.py"],
        config_path=str(tmp_path / "pyproject.toml"),
    )
    assert s.for_file(str(tmp_path / "scripts" / "train.py")).ignore == ["BL101"]
    assert s.for_file(str(tmp_path / "deep" / "legacy.py")).ignore == ["BL2"]
    assert s.for_file(str(tmp_path / "train.py")) is s
    assert s.is_excluded(str(tmp_path / "data" / "x.py"))
    assert s.is_excluded(str(tmp_path / "a" / "b.gen.py"))
    assert not s.is_excluded(str(tmp_path / "train.py"))
    assert path_matches(os.path.join("a", "b", "c.py"), "b/*.py", None)


def test_settings_are_reread_when_the_file_changes(tmp_path):
    cfg = write(tmp_path / "pyproject.toml", '[tool.bertlint]\nignore = ["BL1"]\n')
    f = write(tmp_path / "train.py", "")
    assert load_settings(str(f)).ignore == ["BL1"]
    cfg.write_text('[tool.bertlint]\nignore = ["BL2", "BL3"]\n')
    os.utime(cfg, ns=(1, 10**18))
    assert load_settings(str(f)).ignore == ["BL2", "BL3"]
