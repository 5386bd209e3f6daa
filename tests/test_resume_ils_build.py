"""Resume safety of ``ils build``: --max-pixels and --limit are settings, stale temporaries of killed runs are
removed, unit files do not depend on the output folder, and failures.jsonl paths are absolute."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from cxrground.errors import ConfigError
from cxrground.ils.build import BackendSpec, build_dataset
from cxrground.ils.config import IlsConfig
from cxrground.io.image import DEFAULT_MAX_PIXELS

SPEC = BackendSpec(synthesizer="pseudo-normal")


def _build(tasks_failures, out, **kwargs):
    tasks, failures = tasks_failures
    return build_dataset(tasks, out, IlsConfig(seed=0), SPEC, scan_failures=failures, progress=False, **kwargs)


def test_a_changed_max_pixels_or_limit_is_refused_on_resume(tiny_ils_tasks, tmp_path):
    tasks, failures = tiny_ils_tasks
    out = tmp_path / "ils"
    _build((tasks[:1], failures), out)  # as a killed run would: one study done
    with pytest.raises(ConfigError, match=f"--max-pixels {DEFAULT_MAX_PIXELS} then, 1000 now"):
        _build(tiny_ils_tasks, out, max_pixels=1000)
    _build(tiny_ils_tasks, out, max_pixels=1000, overwrite=True)
    assert json.loads((out / "settings.json").read_text())["max_pixels"] == 1000
    with pytest.raises(ConfigError, match=f"--max-pixels 1000 then, {DEFAULT_MAX_PIXELS} now"):
        _build(tiny_ils_tasks, out)
    limited = tmp_path / "limited"
    _build((tasks[:2], failures), limited, limit=2)
    with pytest.raises(ConfigError, match="--limit 2 then, none now"):
        _build(tiny_ils_tasks, limited)


def _dead_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(proc.stdout)


def test_a_rerun_removes_the_temporaries_of_killed_runs_only(tiny_ils_tasks, tmp_path):
    out = _build(tiny_ils_tasks, tmp_path / "ils") and tmp_path / "ils"
    dead, alive = _dead_pid(), os.getppid()
    left = [out / f".assemble.{dead}" / "train.part", out / f".findings.jsonl.{dead}.tmp",
            out / "units" / f".s1.json.{dead}.tmp"]
    kept = [out / f".assemble.{alive}" / "train.part", out / f".masks.jsonl.{alive}.tmp",
            out / ".assemble.notapid" / "x"]
    for path in left + kept:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("partial")
    before = (out / "mimic_ils_instruction_answer.json").read_bytes()
    _build(tiny_ils_tasks, out)
    assert not any(p.exists() for p in left) and not (out / f".assemble.{dead}").exists()
    assert all(p.exists() for p in kept)
    assert (out / "mimic_ils_instruction_answer.json").read_bytes() == before


def test_units_do_not_depend_on_the_output_folder_and_failure_paths_are_absolute(tiny_ils_tasks, tmp_path,
                                                                                   monkeypatch):
    tasks, _ = tiny_ils_tasks
    a, b = (build_dataset(tasks[:2], tmp_path / name, IlsConfig(seed=0), BackendSpec(), progress=False).out_dir
            for name in ("a", "b"))  # the default synthesizer: a normative model fitted in each folder
    units = sorted(p.name for p in (tmp_path / "a" / "units").glob("*.json"))
    assert units and all((tmp_path / "a" / "units" / n).read_bytes() == (tmp_path / "b" / "units" / n).read_bytes()
                         for n in units), (a, b)
    from cxrground.errors import Failure

    monkeypatch.chdir(tmp_path)
    _build((tasks[:1], [Failure("rel/img.jpg", "scan", "unreadable", "InputError")]), "rel")
    lines = [json.loads(line) for line in (tmp_path / "rel" / "failures.jsonl").read_text().splitlines()]
    assert [f["path"] for f in lines] == [str(tmp_path / "rel" / "img.jpg")]


def test_a_refusal_for_other_options_names_them(tiny_ils_tasks, tmp_path):
    """A resume with other options is refused naming each option that differs, not only the hashes."""
    tasks, failures = tiny_ils_tasks
    out = tmp_path / "ils"
    _build((tasks[:1], failures), out)
    other = IlsConfig(seed=0, negative_check="zone_prior_v1", ctr_negative_max=0.5)
    with pytest.raises(ConfigError) as refused:
        build_dataset(tasks, out, other, SPEC, scan_failures=failures, progress=False)
    message = str(refused.value)
    assert "options (config hash)" in message
    assert "negative_check none then, zone_prior_v1 now" in message and "ctr_negative_max 0.45 then, 0.5 now" in message
    with pytest.raises(ConfigError, match="synthesizer pseudo-normal then, normative now"):
        build_dataset(tasks, out, IlsConfig(seed=0), BackendSpec(), scan_failures=failures, progress=False)


def test_a_killed_overwrite_leaves_no_card_or_dataset_of_the_build_it_was_removing(tiny_ils_tasks, tmp_path,
                                                                                    monkeypatch):
    out = tmp_path / "ils"
    _build(tiny_ils_tasks, out)
    assert (out / "card.md").is_file() and (out / "mimic_ils_instruction_answer.json").is_file()

    def killed(*args, **kwargs):
        raise KeyboardInterrupt  # the kill: while the old units and masks are removed

    monkeypatch.setattr("cxrground.ils.build.shutil.rmtree", killed)
    with pytest.raises(KeyboardInterrupt):
        build_dataset(tiny_ils_tasks[0], out, IlsConfig(seed=1), SPEC, progress=False, overwrite=True)
    left = {p.name for p in out.iterdir()}
    assert not left & {"card.md", "mimic_ils_instruction_answer.json", "masks.jsonl", "findings.jsonl",
                       "provenance.json"}, left
    from cxrground.errors import InputError
    from cxrground.ils.schema import load_dataset

    with pytest.raises(InputError, match=r"unfinished ils build.*rerun the same ils build"):
        load_dataset(out)
