"""Target versions: settings > pins near the script > installed > current release, each with its source text."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import libcst as cst

from bertlint.analysis import versions as V
from bertlint.config import Settings
from bertlint.context import FileContext


def _resolve(path: Path, settings=None, use_installed=True):
    V.pins_near.cache_clear()
    return V.resolve(str(path), settings, use_installed=use_installed)


def _repo(tmp_path: Path) -> Path:
    (tmp_path / ".git").mkdir(parents=True)
    return tmp_path


def test_settings_win_over_pins(tmp_path):
    root = _repo(tmp_path)
    (root / "requirements.txt").write_text("transformers==4.46.3\n")
    vs = _resolve(root / "train.py", Settings(target_versions={"transformers": "5.0.0"}))
    assert vs.transformers.text == "5.0.0"
    assert vs.transformers.source == "[tool.bertlint] target-versions"


def test_exact_pin_in_requirements_names_file_and_line(tmp_path):
    root = _repo(tmp_path)
    (root / "requirements.txt").write_text("# training\ntorch>=2.1\ntransformers==4.46.3  # pinned\naccelerate\n")
    vs = _resolve(root / "train.py", use_installed=False)
    tv = vs.transformers
    assert (tv.text, tv.exact, tv.source) == ("4.46.3", True, "pinned in requirements.txt:3")
    assert tv.describe() == "transformers 4.46.3 (pinned in requirements.txt:3)"
    assert vs.accelerate.source == "assumed current release"  # a bare name pins nothing


def test_range_resolves_to_newest_allowed_release_and_says_so(tmp_path):
    root = _repo(tmp_path)
    (root / "requirements-train.txt").write_text("transformers>=4.46,<4.48\n")
    tv = _resolve(root / "train.py", use_installed=False).transformers
    assert tv.text == "4.47.1" and not tv.exact
    assert tv.lowest == (4, 46, 0)
    assert "newest release allowed by `transformers>=4.46,<4.48` in requirements-train.txt:1" == tv.source
    assert tv.between("4.46.0", "4.48.0")


def test_specifier_forms():
    assert V.resolve_spec("transformers", "~=4.46.0", "x").text == "4.46.3"
    assert V.resolve_spec("transformers", "==4.46.*", "x").text == "4.46.3"
    assert V.resolve_spec("transformers", "<5", "x").text == "4.57.1"
    assert V.resolve_spec("transformers", ">=4.30", "x").text == "5.24.0"
    assert V.resolve_spec("transformers", "4.57.1", "x").exact
    assert V.resolve_spec("transformers", "", "x") is None


def test_pyproject_setup_cfg_and_environment_yml(tmp_path):
    root = _repo(tmp_path)
    (root / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = [\n  "transformers[torch]==4.57.1",\n  "torch>=2.4,<2.6",\n]\n')
    (root / "setup.cfg").write_text("[options]\ninstall_requires =\n    accelerate==1.2.1\n")
    (root / "environment.yml").write_text(
        "name: t\ndependencies:\n  - python=3.11\n  - pytorch-lightning=2.4.0\n  - pip:\n    - deepspeed==0.15.4\n")
    vs = _resolve(root / "train.py", use_installed=False)
    assert vs.transformers.text == "4.57.1" and vs.transformers.source == "pinned in pyproject.toml:4"
    assert vs.torch.text == "2.5.0" and "pyproject.toml:5" in vs.torch.source
    assert vs.accelerate.text == "1.2.1" and vs.accelerate.source == "pinned in setup.cfg:3"
    assert vs.lightning.text == "2.4.0" and vs.lightning.source == "pinned in environment.yml:4"
    assert vs.deepspeed.text == "0.15.4" and vs.deepspeed.source == "pinned in environment.yml:6"


def test_nearest_file_wins_and_search_stops_at_repo_root(tmp_path):
    outer = tmp_path / "outer"
    (outer / "repo" / "examples" / "glue").mkdir(parents=True)
    (outer / "requirements.txt").write_text("transformers==4.30.0\n")  # above the repository: ignored
    repo = outer / "repo"
    (repo / ".git").mkdir()
    (repo / "requirements.txt").write_text("transformers==4.57.1\ntorch==2.3.0\n")
    (repo / "examples" / "glue" / "requirements.txt").write_text("transformers==5.0.0\n")
    vs = _resolve(repo / "examples" / "glue" / "run.py", use_installed=False)
    assert vs.transformers.text == "5.0.0"
    assert vs.torch.text == "2.3.0"  # the parent's pin for a package the nearer file does not name
    vs2 = _resolve(repo / "train.py", use_installed=False)
    assert vs2.transformers.text == "4.57.1"


def test_installed_then_current_release(tmp_path):
    root = _repo(tmp_path)
    vs = _resolve(root / "train.py")
    want = importlib.metadata.version("transformers")
    assert vs.transformers.source == "installed"
    assert vs.transformers.text == ".".join(want.split("+")[0].split(".")[:3])
    cur = _resolve(root / "train.py", use_installed=False)
    assert cur.transformers.text == "5.24.0" and cur.transformers.source == "assumed current release"
    assert cur.lightning.text == "2.6.6" and cur.deepspeed.text == "0.19.8" and cur.accelerate.text == "1.15.0"


def test_ctx_versions_is_cached_and_reads_settings(tmp_path):
    src = "import transformers\n"
    ctx = FileContext(str(tmp_path / "t.py"), src, cst.parse_module(src),
                      Settings(target_versions={"transformers": "4.46.0"}))
    assert ctx.versions is ctx.versions
    assert ctx.versions.transformers.between("4.46.0", "4.48.0")


def test_unreadable_specs_do_not_raise(tmp_path):
    root = _repo(tmp_path)
    (root / "requirements.txt").write_text("transformers @ git+https://github.com/x/y\n-e .\ntransformers[\n\x00\n")
    vs = _resolve(root / "t.py", use_installed=False)
    assert vs.transformers.source == "assumed current release"


def test_an_edited_requirements_file_is_read_again(tmp_path):
    import os

    root = _repo(tmp_path)
    req = root / "requirements.txt"
    req.write_text("transformers==4.46.3\n")
    assert V.resolve(str(root / "t.py"), use_installed=False).transformers.text == "4.46.3"
    req.write_text("transformers==4.57.1\n")
    st = req.stat()
    os.utime(req, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert V.resolve(str(root / "t.py"), use_installed=False).transformers.text == "4.57.1"


def test_setup_py_requirement_strings_count_as_pins(tmp_path):
    root = _repo(tmp_path)
    (root / "setup.py").write_text(
        "from setuptools import setup\n# transformers==9.9 in a comment is not a pin\n"
        "setup(name='x', install_requires=[\n    'torch>=2.1',\n    \"transformers==4.45.2\",\n])\n")
    (root / "src").mkdir()
    vs = _resolve(root / "src" / "train.py", use_installed=False)
    assert (vs.transformers.text, vs.transformers.source) == ("4.45.2", "pinned in setup.py:5")
    assert not vs.transformers.assumed


def test_fallback_versions_say_so_and_never_make_an_error(tmp_path):
    from bertlint.types import Severity

    root = _repo(tmp_path)
    vs = _resolve(root / "train.py")
    tv = vs.transformers
    assert tv.assumed and "no pin near the script" in tv.describe() and "installed beside bertlint" in tv.describe()
    assert V.severity_for(Severity.ERROR, tv) == Severity.WARNING
    assert V.severity_for(Severity.INFO, tv) == Severity.INFO
    (root / "requirements.txt").write_text("transformers==4.46.3\n")
    pinned = _resolve(root / "train.py").transformers
    assert not pinned.assumed and V.severity_for(Severity.ERROR, pinned) == Severity.ERROR
    current = _resolve(root / "other.py", use_installed=False).transformers
    assert current.source == "pinned in requirements.txt:1"


def test_removed_argument_without_pin_is_a_warning_that_names_the_assumption(tmp_path):
    from bertlint.api import lint_path

    root = _repo(tmp_path)
    script = root / "train.py"
    script.write_text(
        "from transformers import TrainingArguments\n"
        "args = TrainingArguments('out', evaluation_strategy='epoch')\n")
    V.pins_near.cache_clear()
    found = [d for d in lint_path(str(script)) if d.code == "BL407"]
    assert len(found) == 1 and found[0].severity.value == "W"
    assert "no pin near the script" in found[0].message
    assert found[0].fix is not None and found[0].fix.applicability.value == "unsafe"
    (root / "requirements.txt").write_text("transformers==4.57.1\n")
    V.pins_near.cache_clear()
    pinned = [d for d in lint_path(str(script)) if d.code == "BL407"]
    assert len(pinned) == 1 and pinned[0].severity.value == "E" and "pinned in requirements.txt:1" in pinned[0].message


def test_git_source_install_at_a_release_tag_pins_that_release(tmp_path):
    root = _repo(tmp_path)
    (root / "requirements.txt").write_text(
        "torch\ntransformers @ git+https://github.com/huggingface/transformers.git@v4.28.1#egg=transformers\n"
        "git+https://github.com/huggingface/accelerate@main\n")
    vs = _resolve(root / "train.py", use_installed=False)
    assert (vs.transformers.text, vs.transformers.source) == ("4.28.1", "pinned in requirements.txt:2")
    # a branch pins a source install but says nothing about the release: a pin of unknown release, on which no
    # version comparison is decided (both at_least and below are False) and nothing is an error
    acc = vs.accelerate
    assert acc.known is False and acc.assumed
    assert "requirements.txt:3" in acc.source and "`main`" in acc.source
    assert not acc.at_least("0.1.0") and not acc.below("999.0.0")
    assert "unknown release" in acc.describe()


def test_removed_trainer_keyword_is_silent_on_a_source_commit_pin(tmp_path):
    """BL407 rests on the targeted release; a project that installs transformers from a commit does not say which
    release it runs, so `Trainer(tokenizer=...)` is not reported there (it is, as a warning, with no pin at all)."""
    from bertlint.api import lint_path

    root = _repo(tmp_path)
    (root / "train.py").write_text(
        "from transformers import Trainer, TrainingArguments\n"
        "args = TrainingArguments(output_dir='o')\n"
        "trainer = Trainer(model=model, args=args, tokenizer=tok)\n")
    no_pin = [f.code for f in lint_path(str(root / "train.py"))]
    (root / "requirements.txt").write_text(
        "git+https://github.com/huggingface/transformers@a6e6b1c622d8d08e2510a82cb6266d7b654f1cbf\n")
    pinned = [f.code for f in lint_path(str(root / "train.py"))]
    assert "BL407" in no_pin
    assert "BL407" not in pinned


def test_pin_files_of_one_folder_that_disagree(tmp_path):
    root = _repo(tmp_path)
    (root / "requirements.txt").write_text("transformers==4.45.1\naccelerate==1.2.1\n")
    (root / "pyproject.toml").write_text(
        '[project]\nname = "x"\ndependencies = [\n  "transformers>=4.57.1",\n  "accelerate>=1.0",\n]\n')
    vs = _resolve(root / "train.py", use_installed=False)
    tv = vs.transformers
    assert tv.text == "4.45.1" and tv.disagrees is not None and tv.disagrees.text == "5.24.0"
    assert "the project's pin files disagree" in tv.describe()
    assert V.reaching(tv, lambda t: t.at_least("4.46.0")) is tv.disagrees
    assert V.reaching(tv, lambda t: t.at_least("6.0.0")) is None
    assert getattr(V.severity_for("E", tv), "value", None) == "W"
    assert vs.accelerate.disagrees is None  # 1.2.1 satisfies >=1.0: no disagreement


# --------------------------------------------------------------------------- a project that builds the package itself


_FORK_SETUP = '''from setuptools import find_packages, setup

_deps = ["tokenizers>=0.10.1", "torch>=1.0", "deepspeed>=0.4.0"]

setup(
    name="transformers",
    version="4.9.0.dev0",  # expected format is x.y.z.dev0
    package_dir={"": "src"},
    packages=find_packages("src"),
    install_requires=_deps,
)
'''

_TRAINER_SCRIPT = '''from transformers import Trainer, TrainingArguments

args = TrainingArguments("out", evaluation_strategy="epoch", gradient_accumulation_steps=4)
trainer = Trainer(model=model, args=args, train_dataset=ds, tokenizer=tok)
trainer.train()
'''


def test_a_fork_of_the_package_is_the_version_its_scripts_run_on(tmp_path):
    # a research fork of transformers (its own setup.py builds "transformers" 4.9.0.dev0 from src/) with its
    # example scripts beside it: they run on the fork, not on whatever is installed beside bertlint
    root = _repo(tmp_path)
    (root / "setup.py").write_text(_FORK_SETUP)
    (root / "examples").mkdir()
    vs = _resolve(root / "examples" / "run.py")
    tv = vs.transformers
    assert (tv.text, tv.exact, tv.assumed) == ("4.9.0", True, False)
    assert tv.source == "the project builds transformers itself: setup.py:7"
    assert vs.torch.source == "newest release allowed by `torch>=1.0` in setup.py:3"  # its dependencies still pin


def test_fork_silences_keywords_removed_only_later(tmp_path):
    from bertlint import api

    root = _repo(tmp_path)
    (root / "setup.py").write_text(_FORK_SETUP)
    (root / "examples").mkdir()
    script = root / "examples" / "run.py"
    script.write_text(_TRAINER_SCRIPT)
    V.pins_near.cache_clear()
    codes = [d.code for d in api.lint_path(str(script))]
    assert "BL407" not in codes  # evaluation_strategy / tokenizer= exist in 4.9
    # the same script in a project that only depends on transformers: the removed keywords are reported
    other = _repo(tmp_path / "plain")
    (other / "requirements.txt").write_text("transformers==5.2.0\n")
    s2 = other / "run.py"
    s2.write_text(_TRAINER_SCRIPT)
    V.pins_near.cache_clear()
    assert "BL407" in [d.code for d in api.lint_path(str(s2))]


def test_a_project_that_only_names_the_package_or_builds_something_else_is_not_a_fork(tmp_path):
    root = _repo(tmp_path)
    (root / "setup.py").write_text('setup(\n    name="my-trainer",\n    version="0.1.0",\n'
                                   '    install_requires=["transformers==4.46.3"],\n)\n')
    tv = _resolve(root / "train.py", use_installed=False).transformers
    assert tv.source == "pinned in setup.py:4"
    other = _repo(tmp_path / "dyn")
    (other / "pyproject.toml").write_text('[project]\nname = "transformers"\ndynamic = ["version"]\n')
    tv = _resolve(other / "train.py", use_installed=False).transformers
    assert tv.source == "assumed current release"  # the version is read at build time: not known here
    pp = _repo(tmp_path / "pp")
    (pp / "pyproject.toml").write_text('[project]\nname = "accelerate"\nversion = "0.20.3"\n\n[tool.x]\nname = "y"\n')
    tv = _resolve(pp / "train.py", use_installed=False).accelerate
    assert (tv.text, tv.source) == ("0.20.3", "the project builds accelerate itself: pyproject.toml:3")


def test_a_singular_requirement_txt_is_a_pin_file(tmp_path):
    # setup.py reads install_requires from `requirement.txt` (the singular spelling): its pins are the project's
    root = _repo(tmp_path)
    (root / "requirement.txt").write_text("peft==0.7.1\ntransformers==4.36.2\n")
    (root / "setup.py").write_text("from setuptools import setup\nsetup(name='less', version='0.1')\n")
    (root / "less" / "train").mkdir(parents=True)
    tv = _resolve(root / "less" / "train" / "train.py", use_installed=False).transformers
    assert (tv.text, tv.source) == ("4.36.2", "pinned in requirement.txt:2")
    assert V._is_pin_file("requirement.txt") and V._is_pin_file("requirements-dev.in")
    assert not V._is_pin_file("my_requirements.txt")
