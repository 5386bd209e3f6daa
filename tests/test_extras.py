"""A missing optional extra: one table of which extra provides each library, the preflight of every backend a run
uses, and the clean ``... needs the 'models' extra: pip install 'cxrground[models]'`` error of the commands (no
traceback, no per-study failures). The no-torch behaviour is tested in this process with ``torch`` blocked in
``sys.modules``, and in the auditor's base-only environment when it is there."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.errors import BatchStopped, MissingExtraError
from cxrground.extras import (
    EXTRAS,
    Need,
    check_needs,
    extra_of,
    import_error_text,
    install_line,
    missing_extra,
    missing_modules,
)

ROOT = Path(__file__).resolve().parents[1]
NEEDS_MODELS = "needs the 'models' extra: pip install 'cxrground[models]'"
#: A Python environment with cxrground's base dependencies only (no torch), where one exists (not in CI).
BASE_ONLY = Path(os.environ.get("CXRGROUND_BASE_ONLY_PYTHON", "/tmp/audit_pkg/v0/bin/python"))


def _normalise(dist: str) -> str:
    return dist.split("[")[0].split(">")[0].split("=")[0].split("<")[0].strip().lower().replace("_", "-")


def test_the_extras_table_matches_the_optional_dependencies_of_pyproject():
    optional = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    first: dict[str, str] = {}
    for extra, requirements in optional.items():
        for requirement in requirements:
            first.setdefault(_normalise(requirement), extra)
    for spec in EXTRAS:
        assert first.get(spec.dist.lower()) == spec.extra, (spec.module, spec.dist, first.get(spec.dist.lower()))
    for module in ("torch", "safetensors", "transformers", "diffusers", "ray", "datasets", "highdicom", "fastapi"):
        assert extra_of(module) == first[module], module


def test_extra_of_and_install_line():
    assert extra_of("torch") == "models" and extra_of("torch.nn.functional") == "models"
    assert extra_of("ray") == "ray" and extra_of("lmms_eval") == "export" and extra_of("numpy") == "core"
    assert extra_of("not_a_library") is None
    assert install_line(["models"]) == "pip install 'cxrground[models]'"
    assert install_line(["models", "ray"]) == "pip install 'cxrground[models,ray]'"
    assert install_line(["models"], editable=True) == "pip install -e '.[models]'"


def _blocked_import(name: str) -> ImportError:
    try:
        __import__(name)
    except ImportError as exc:
        return exc
    raise AssertionError(f"{name} imported")


def test_a_blocked_library_is_missing_and_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    assert missing_modules(["torch", "numpy", "torch"]) == ["torch"]
    text = import_error_text(_blocked_import("torch"), "anatomy zones")
    assert text == f"anatomy zones {NEEDS_MODELS} (not installed here: torch)"
    err = missing_extra(_blocked_import("torch"), "x")
    assert isinstance(err, MissingExtraError) and isinstance(err, BatchStopped)
    assert err.modules == ("torch",) and err.extras == ("models",)


def test_check_needs_names_every_extra_and_every_part_at_once(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setitem(sys.modules, "ray", None)
    check_needs([Need("segmenter 'masks'", ())], "ils build")  # nothing lacking: nothing raised
    with pytest.raises(MissingExtraError) as caught:
        check_needs([Need("segmenter 'unet'", ("torch",)), Need("the pose warning", ("torch",), "or --no-pose-warning"),
                     Need("--engine ray", ("ray",))], "ils build")
    lines = str(caught.value).splitlines()
    assert lines[0] == ("ils build needs the 'models' and 'ray' extras: pip install 'cxrground[models,ray]' "
                        "(not installed here: torch, ray)")
    assert lines[1:] == ["  segmenter 'unet' needs torch", "  the pose warning needs torch (or --no-pose-warning)",
                         "  --engine ray needs ray"]
    assert caught.value.extras == ("models", "ray")


def test_a_library_that_is_installed_but_breaks_says_so():
    exc = ImportError("libtorch_cuda.so: cannot open shared object file", name="torch")
    text = import_error_text(exc, "ils train")
    assert "could not import torch" in text and "libtorch_cuda.so" in text and "cxrground[models]" in text


def test_a_backend_that_fails_on_an_import_names_the_extra(monkeypatch):
    from cxrground.registry import backend_errors

    monkeypatch.setitem(sys.modules, "torch", None)

    class Reader:
        name = "mine"

    with (pytest.raises(MissingExtraError, match=r"^segmenter 'mine' needs the 'models' extra"),
          backend_errors("segmenter", Reader(), "segment")):
        import torch  # noqa: F401


def test_registered_backends_declare_what_they_import():
    from cxrground.anatomy.segment import SEGMENTERS
    from cxrground.evaluation.percept.clients import CLIENTS
    from cxrground.ils.spatial import SYNTHESIZERS
    from cxrground.models.base import MODELS
    from cxrground.percept.deform.registry import DEFORMERS

    assert "torch" in SEGMENTERS.need("unet").modules and not SEGMENTERS.need("masks").modules
    assert "torch" in SYNTHESIZERS.need("lesion-unet").modules and not SYNTHESIZERS.need("pseudo-normal").modules
    assert "diffusers" in SYNTHESIZERS.need("radedit").modules
    assert "torch" in MODELS.need("baseline").modules and "transformers" in MODELS.need("lisa").modules
    assert "torch" in CLIENTS.need("ils").modules and not CLIENTS.need("random").modules
    assert "transformers" in DEFORMERS.need("sam").modules


# --- ils build: the preflight and a study's import error ---------------------------------------------------------


def test_ils_build_without_torch_stops_before_any_study_naming_every_part(monkeypatch, tmp_path, tiny_ils_tasks):
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig, QCConfig

    monkeypatch.setitem(sys.modules, "torch", None)
    tasks, _ = tiny_ils_tasks
    with pytest.raises(MissingExtraError) as caught:
        build_dataset(tasks, tmp_path / "out", IlsConfig(negative_check="zone_prior_v3"),
                      BackendSpec(synthesizer="lesion-unet"), progress=False)
    text = str(caught.value)
    assert text.startswith(f"ils build {NEEDS_MODELS}")
    for part in ("segmenter 'unet'", "synthesizer 'lesion-unet'", "negative check zone_prior_v3",
                 "zone guide zone_prior_v2", "pose warning"):
        assert part in text, part
    assert not (tmp_path / "out").exists()
    # without the parts that read torch the build goes on
    summary = build_dataset([], tmp_path / "out", IlsConfig(zone_guide="none", qc=QCConfig(pose_warning=False)),
                            BackendSpec(segmenter="masks", segmenter_kwargs={"root": str(tmp_path)},
                                        synthesizer="pseudo-normal"), progress=False)
    assert summary.studies_in_dataset == 0


def test_ils_build_engine_ray_without_ray_stops_before_any_study(monkeypatch, tmp_path):
    from cxrground.ils.build import BackendSpec, check_backends
    from cxrground.ils.config import IlsConfig, QCConfig

    monkeypatch.setitem(sys.modules, "ray", None)
    config = IlsConfig(zone_guide="none", qc=QCConfig(pose_warning=False))
    spec = BackendSpec(segmenter="masks", segmenter_kwargs={"root": str(tmp_path)}, synthesizer="pseudo-normal")
    check_backends(spec, config, "local")
    with pytest.raises(MissingExtraError, match=r"needs the 'ray' extra: pip install 'cxrground\[ray\]'"):
        check_backends(spec, config, "ray")


def test_an_import_error_inside_a_study_stops_the_build(monkeypatch, tmp_path, tiny_ils_tasks):
    from cxrground.ils import pipeline
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig, QCConfig

    def compose(*args, **kwargs):
        raise ModuleNotFoundError("No module named 'torch'", name="torch")

    monkeypatch.setattr(pipeline, "compose_pairs", compose)
    tasks, _ = tiny_ils_tasks
    with pytest.raises(MissingExtraError, match=re.escape("pip install 'cxrground[models]'")):
        build_dataset(tasks, tmp_path / "out", IlsConfig(zone_guide="none", qc=QCConfig(pose_warning=False)),
                      BackendSpec(synthesizer="pseudo-normal"), progress=False)
    assert not list((tmp_path / "out").rglob("failures.jsonl"))  # a stop, not a failure per study


# --- the commands: a clean error, exit 1, no traceback -----------------------------------------------------------


def _cli(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(main, [str(a) for a in args])
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    return res.exit_code, res.output


@pytest.fixture()
def no_torch(monkeypatch):
    """torch not importable in this process (as without the 'models' extra), for what imports it from now on."""
    from cxrground.anatomy.segment import unet

    monkeypatch.setitem(sys.modules, "torch", None)
    unet._unet_class.cache_clear()
    yield
    unet._unet_class.cache_clear()


@pytest.mark.parametrize("command", [
    ["anatomy", "zones", "--images", "{films}", "--out", "{out}"],
    ["anatomy", "pose", "--images", "{films}", "--out", "{out}"],
    ["anatomy", "fit-zones", "--images", "{films}", "--labels", "{labels}", "--out", "{out}"],
    ["ils", "build", "--images", "{films}", "--out", "{out}"],
    ["ils", "build", "--images", "{films}", "--out", "{out}", "--segmenter", "masks", "--segmenter-opt",
     "root={films}", "--no-pose-warning"],
    ["ils", "build", "--images", "{films}", "--out", "{out}", "--segmenter", "masks", "--segmenter-opt",
     "root={films}", "--no-pose-warning", "--zone-guide", "none", "--synthesizer", "lesion-unet"],
])
def test_commands_without_torch_name_the_extra(no_torch, tmp_path, tiny_ils_tasks, command):
    films = Path(tiny_ils_tasks[0][0].image_path).parents[3]
    labels = tmp_path / "labels.csv"
    labels.write_text("image,A\nx.png,0\n")
    args = [a.format(films=films, out=tmp_path / "out", labels=labels) for a in command]
    code, output = _cli(args)
    assert code == 1, output
    assert NEEDS_MODELS in output and "Traceback" not in output
    assert not (tmp_path / "out").exists()


def test_a_command_importing_torch_reports_the_extra(no_torch, tmp_path):
    """An import that fails inside a command (no preflight) is reported by the command group, naming the command."""
    code, output = _cli(["segment", "train-pose", "--images", tmp_path, "--out", tmp_path / "tp"])
    assert code == 1 and f"Error: segment train-pose {NEEDS_MODELS}" in output, output
    assert "No module named" not in output and "Traceback" not in output


def test_an_own_import_error_stays_a_traceback(monkeypatch):
    """A failed import of cxrground's own modules is a bug, not a missing extra."""
    from cxrground.cli import common

    exc = ModuleNotFoundError("No module named 'cxrground.nothing'", name="cxrground.nothing")
    assert common.is_own_import(exc)


# --- the base-only environment (no torch), when there ------------------------------------------------------------


@pytest.mark.skipif(not BASE_ONLY.is_file(), reason="no base-only environment (the wheel without extras) here")
@pytest.mark.parametrize("command", [
    ["anatomy", "zones", "--images", "{films}", "--out", "{out}"],
    ["ils", "build", "--images", "{films}", "--out", "{out}", "--segmenter", "masks", "--segmenter-opt",
     "root={films}", "--no-pose-warning"],
])
def test_base_only_environment(tmp_path, tiny_ils_tasks, command):
    films = Path(tiny_ils_tasks[0][0].image_path).parents[3]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    where = subprocess.run([str(BASE_ONLY), "-c", "import cxrground, sys; print(cxrground.__file__); "
                            "print(__import__('importlib').util.find_spec('torch'))"],
                           capture_output=True, text=True, env=env, timeout=120)
    file, torch_spec = where.stdout.split()
    assert Path(file).resolve().is_relative_to(ROOT / "src") and torch_spec == "None"
    args = [a.format(films=films, out=tmp_path / "out") for a in command]
    proc = subprocess.run([str(BASE_ONLY), "-m", "cxrground", *args], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert NEEDS_MODELS in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


# --- provenance code_version: git only in cxrground's own source tree --------------------------------------------


def _git_repo(root: Path, project: str) -> None:
    root.mkdir(parents=True)
    (root / "pyproject.toml").write_text(f'[project]\nname = "{project}"\nversion = "1.0"\n')
    for args in (["init", "-q"], ["add", "pyproject.toml"],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "first"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.mark.parametrize(("project", "under", "is_source"), [
    ("myproject", ".venv/lib/python3.11/site-packages/cxrground", False),  # installed in another project's repo
    ("cxrground", ".venv/lib/python3.11/site-packages/cxrground", False),  # installed beside a checkout
    ("cxrground", "src/cxrground", True),  # cxrground's own source tree
])
def test_code_version_uses_git_only_in_cxrgrounds_own_source_tree(tmp_path, project, under, is_source):
    from cxrground.ils import build

    repo = tmp_path / "repo"
    _git_repo(repo, project)
    package = repo / under
    package.mkdir(parents=True)
    assert (build.source_checkout(package) == repo.resolve()) is is_source


def test_code_version_of_an_installed_package_in_an_unrelated_repo_is_the_plain_version(tmp_path, monkeypatch):
    from cxrground import __version__
    from cxrground.ils import build

    repo = tmp_path / "repo"
    _git_repo(repo, "myproject")
    package = repo / ".venv" / "site-packages" / "cxrground"
    (package / "ils").mkdir(parents=True)
    monkeypatch.setattr(build, "__file__", str(package / "ils" / "build.py"))
    build._code_version.cache_clear()
    try:
        assert build._code_version() == __version__
    finally:
        build._code_version.cache_clear()


# --- progress bars: on a terminal as tqdm draws them, in a log at most every LOG_INTERVAL_S -----------------------


class _Stream:
    def __init__(self, tty: bool) -> None:
        self.tty, self.text = tty, ""

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> None:
        self.text += text

    def flush(self) -> None:
        pass


@pytest.mark.parametrize(("tty", "progress", "drawn"), [(True, True, True), (False, True, True),
                                                         (True, False, False), (False, False, False)])
def test_progress_bars_are_drawn_when_wanted(tty, progress, drawn):
    from cxrground.io.progress import progress_bar

    stream = _Stream(tty)
    assert list(progress_bar(range(3), desc="synth", file=stream, progress=progress)) == [0, 1, 2]
    assert ("synth" in stream.text) is drawn


def test_a_bar_written_to_a_log_is_updated_at_most_every_interval() -> None:
    from cxrground.io.progress import LOG_INTERVAL_S, progress_bar

    log, terminal = _Stream(False), _Stream(True)
    assert progress_bar(range(2), file=log).mininterval == LOG_INTERVAL_S
    assert progress_bar(range(2), file=terminal).mininterval < LOG_INTERVAL_S
    list(progress_bar(range(500), desc="films", file=log))
    assert 1 <= log.text.count("films:") <= 3  # the start and the end, not 500 updates


def test_a_command_writes_its_bar_to_a_log_without_flooding_it(tmp_path):
    res = CliRunner().invoke(main, ["synth", "--out", str(tmp_path / "c"), "--studies", "4", "--width", "128"])
    assert res.exit_code == 0, res.output
    assert res.output.count("%|") <= 3
