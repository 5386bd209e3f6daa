"""``percept build`` into a finished folder: the settings stay with the benchmark (a build with other settings is
refused without --overwrite, the same settings are a no-op), and a killed --overwrite leaves no benchmark file
pointing at deleted cases; ``percept eval`` refuses a benchmark whose case files are missing."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.runner import EvalSettings, run_eval
from cxrground.percept import build as build_mod
from cxrground.percept.build import build_benchmark
from cxrground.percept.request import build_lines
from cxrground.percept.validate import validate_benchmark
from percept_build_helpers import synthetic_bench


@pytest.fixture(scope="session")
def synth_bench(tmp_path_factory):
    return synthetic_bench(tmp_path_factory)


def _finished_copy(src: Path, dst: Path) -> Path:
    """A copy of the finished benchmark ``src`` as a build without --keep-work leaves it (no ``.work``)."""
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns(".work"))
    return dst


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_finished_benchmark_keeps_its_settings_and_other_settings_are_refused(synth_bench, tmp_path) -> None:
    src, opts = synth_bench
    bench = _finished_copy(src, tmp_path / "bench")
    stamp = json.loads((bench / "build_settings.json").read_text())
    assert stamp["settings"]["seed"] == opts.seed and stamp["settings_hash"] == opts.settings_hash()
    assert "build_settings.json" in (bench / "MANIFEST.sha256").read_text()
    before = _files(bench)
    with pytest.raises(ConfigError, match=r"other settings.*seed 3 -> 4.*--overwrite"):
        build_benchmark(replace(opts, seed=4), bench, progress=False)
    assert _files(bench) == before
    again = build_benchmark(opts, bench, progress=False)  # same settings: nothing to do
    assert again.already_built and again.planned == 0 and again.cases >= 1
    assert "films are unchanged" in build_lines(again)[0]
    assert _files(bench) == before
    assert validate_benchmark(bench) == []


def test_a_changed_dataset_is_not_taken_for_the_finished_build_and_another_path_to_it_is(synth_bench, tmp_path
                                                                                           ) -> None:
    src, opts = synth_bench
    bench = _finished_copy(src, tmp_path / "bench")
    before = _files(bench)
    ils = Path(opts.ils)
    moved = shutil.copytree(ils, tmp_path / "ils-elsewhere")  # the same dataset under another path: the same build
    again = build_benchmark(replace(opts, ils=str(moved)), bench, progress=False)
    assert again.already_built and _files(bench) == before
    data_file = moved / "mimic_ils_instruction_answer.json"
    data = json.loads(data_file.read_text())
    split = next(name for name, studies in data.items() if studies)
    data[split].pop(next(iter(data[split])))  # one study less: another dataset
    data_file.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"from other input files \(SHA-256 changed: ils .* --overwrite"):
        build_benchmark(replace(opts, ils=str(moved)), bench, progress=False)
    assert _files(bench) == before
    rebuilt = build_benchmark(replace(opts, ils=str(moved)), bench, progress=False, overwrite=True)
    assert not rebuilt.already_built and validate_benchmark(bench) == []
    films = shutil.copytree(opts.images, tmp_path / "films")  # another image folder: the folder is a setting
    with pytest.raises(ConfigError, match=r"other settings.*images"):
        build_benchmark(replace(opts, ils=str(moved), images=str(films)), bench, progress=False)


def _killed_overwrite(src: Path, opts, bench: Path, monkeypatch):
    """A finished copy of ``src`` at ``bench``, then an ``--overwrite`` build with seed 4 killed during its planning;
    returns the new build's options."""
    _finished_copy(src, bench)
    new = replace(opts, seed=4)
    with monkeypatch.context() as patch:
        def killed(*args, **kwargs):
            raise KeyboardInterrupt  # the kill: during the new build's planning

        patch.setattr(build_mod, "_run_pool", killed)
        with pytest.raises(KeyboardInterrupt):
            build_benchmark(new, bench, progress=False, overwrite=True)
    return new


def test_killed_overwrite_leaves_no_stale_benchmark_and_resumes(synth_bench, tmp_path, monkeypatch) -> None:
    src, opts = synth_bench
    bench = tmp_path / "bench"
    new = _killed_overwrite(src, opts, bench, monkeypatch)
    for name in ("chexpercept.json", "MANIFEST.sha256", "build_settings.json", "card.md", "cases"):
        assert not (bench / name).exists(), name
    from cxrground.percept.validate import records_note

    note = records_note(bench)
    assert "an unfinished percept build" in note and "rerun the same percept build" in note
    with pytest.raises(InputError, match="benchmark file not found"):
        run_eval(EvalSettings(bench, "first-option"), tmp_path / "run", progress=False)
    with pytest.raises(ConfigError, match="unfinished build with other settings"):
        build_benchmark(opts, bench, progress=False)  # the old settings: refused, the new build is kept
    done = build_benchmark(new, bench, progress=False)  # resumes the new build
    assert not done.already_built and validate_benchmark(bench) == []
    assert json.loads((bench / "build_settings.json").read_text())["settings"]["seed"] == 4


def test_an_unfinished_build_of_another_version_is_not_resumed(synth_bench, tmp_path, monkeypatch) -> None:
    src, opts = synth_bench
    bench = tmp_path / "bench"
    new = _killed_overwrite(src, opts, bench, monkeypatch)
    stamp = bench / ".work" / "settings.json"
    stamp.write_text(json.dumps({**json.loads(stamp.read_text()), "code": "0.0.1"}))
    with pytest.raises(ConfigError, match=r"unfinished build of cxrground version 0\.0\.1"):
        build_benchmark(new, bench, progress=False)
    done = build_benchmark(new, bench, progress=False, overwrite=True)
    assert not done.already_built and validate_benchmark(bench) == []


def test_eval_refuses_a_benchmark_whose_case_files_are_missing(synth_bench, tmp_path) -> None:
    src, _ = synth_bench
    bench = _finished_copy(src, tmp_path / "bench")
    shutil.rmtree(bench / "cases")  # what an interrupted build of an earlier version left
    with pytest.raises(InputError, match=r"incomplete benchmark: \d+ file\(s\) it names are missing \(cases/c"):
        run_eval(EvalSettings(bench, "first-option"), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()
    partial = _finished_copy(src, tmp_path / "partial")
    listed = [line.split("  ", 1)[1] for line in (partial / "MANIFEST.sha256").read_text().splitlines()]
    (partial / "deformation_results.json").unlink()  # not an image: found through the manifest
    assert "deformation_results.json" in listed
    with pytest.raises(InputError, match=r"1 file\(s\) it names are missing \(deformation_results.json\)"):
        run_eval(EvalSettings(partial, "first-option"), tmp_path / "run2", progress=False)


def _swap_film(films: Path, rel: str) -> None:
    """Replace the film ``rel`` under ``films`` by another film of the folder (a film changed in place)."""
    other = next(p for p in sorted(films.rglob("*" + Path(rel).suffix)) if p.relative_to(films).as_posix() != rel)
    shutil.copyfile(other, films / rel)


def test_films_changed_since_the_build_read_them_are_noticed(synth_bench, tmp_path) -> None:
    _src, opts = synth_bench
    films = shutil.copytree(opts.images, tmp_path / "films")
    opts = replace(opts, images=str(films))
    bench = tmp_path / "bench"
    build_benchmark(opts, bench, progress=False, keep_work=True)
    recorded = json.loads((bench / "build_settings.json").read_text())["films"]
    assert recorded and all(len(digest) == 64 for digest in recorded.values())
    ledger = [json.loads(line)["film"] for line in (bench / ".work" / "films.jsonl").read_text().splitlines()]
    assert sorted(set(ledger)) == sorted(recorded)
    # an unfinished build (the finished files gone, .work kept) resumes: the cases of a changed film are made again
    for name in ("MANIFEST.sha256", "build_settings.json", "chexpercept.json"):
        (bench / name).unlink()
    cases = _files(bench / "cases")
    _swap_film(films, sorted(recorded)[0])
    resumed = build_benchmark(opts, bench, progress=False, keep_work=True)
    assert resumed.films_changed == 1 and "1 film(s) changed, went or appeared" in "\n".join(build_lines(resumed))
    redrawn = [name for name, data in _files(bench / "cases").items() if cases.get(name) != data]
    assert redrawn and len({name.split("/")[0] for name in redrawn}) < len({n.split("/")[0] for n in cases})
    assert validate_benchmark(bench) == []
    # a finished build: the same films are nothing to do, a changed film is refused until --overwrite
    build_benchmark(opts, bench, progress=False)  # .work kept above: finishes again and drops it
    again = build_benchmark(opts, bench, progress=False)
    assert again.already_built and again.films_compared == len(recorded)
    before = _files(bench)
    _swap_film(films, sorted(recorded)[-1])
    with pytest.raises(ConfigError, match=r"from other films \(1 of .* differ or are gone.*--overwrite"):
        build_benchmark(opts, bench, progress=False)
    assert _files(bench) == before
    assert not build_benchmark(opts, bench, progress=False, overwrite=True).already_built


def test_a_film_gone_and_back_is_made_again_and_an_older_unfinished_build_keeps_its_work(tmp_path) -> None:
    from types import SimpleNamespace

    from cxrground.io.film_ledger import FilmLedger
    from cxrground.percept.build import FILMS_LEDGER, _refresh_films

    images = tmp_path / "films"
    images.mkdir()
    (images / "a.png").write_bytes(b"film a")
    work = tmp_path / ".work"
    (work / "plans").mkdir(parents=True)
    task = SimpleNamespace(cand=SimpleNamespace(image_path="a.png"), case_id="c1")
    plan = work / "plans" / "c1.json"

    def refresh(recorded: bool) -> int:  # one resumed build: its ledger as read at the start
        return _refresh_films(work, FilmLedger(work / FILMS_LEDGER), images, [task], False, recorded)

    plan.write_text("{}")  # planned by a version that kept no film ledger: its films are recorded as they are
    assert refresh(recorded=False) == 0 and plan.is_file()
    (images / "a.png").unlink()  # the film goes: its plan is made again (a failure)
    assert refresh(recorded=True) == 1 and not plan.exists()
    plan.write_text('{"status": "failed"}')
    assert refresh(recorded=True) == 0 and plan.is_file()  # still gone
    (images / "a.png").write_bytes(b"film a")  # back, with the same content: made again from the film
    assert refresh(recorded=True) == 1 and not plan.exists()
