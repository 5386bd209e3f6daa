"""``reports structure`` / ``reports label`` with the LLM structurer on the command line: the exit status of a run
in which some reports failed (``--strict``), and the decoding flags ``--seed`` / ``--max-tokens``."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from click.testing import CliRunner

from test_structure_llm import FakeLLM

importlib.import_module("cxrground.cli.structure_cmds")  # attaches `reports structure` / `reports label`
from cxrground.cli import main  # noqa: E402


def _reports(folder: Path, texts: dict[str, str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in texts.items():
        (folder / f"{name}.txt").write_text(f"FINDINGS: {text}\n", encoding="utf-8")
    return folder


def _llm_args(fake: FakeLLM, *more: str) -> list[str]:
    return ["--structurer", "llm", "--base-url", fake.base_url, "--model", "m", "--max-retries", "0",
            "--no-progress", *more]


# -- the exit status of a run that finished with failures -------------------------------------------------------------


@pytest.mark.parametrize("command", ["structure", "label"])
def test_strict_exits_3_when_some_reports_failed_and_1_when_all_did(tmp_path: Path, command: str) -> None:
    folder = _reports(tmp_path / "in", {"a": "The lungs are clear.", "b": "Boom: the lungs are clear.",
                                        "c": "No pleural effusion."})
    out = tmp_path / f"{command}.out"
    runner = CliRunner()
    with FakeLLM() as fake:
        fake.fail_if = lambda body: "boom" in body["messages"][1]["content"].lower()
        plain = runner.invoke(main, ["reports", command, str(folder), "--out", str(out), *_llm_args(fake)])
        assert plain.exit_code == 0, plain.output  # finished: the failure is recorded, the others are done
        strict = runner.invoke(main, ["reports", command, str(folder), "--out", str(out), "--strict",
                                      *_llm_args(fake)])
        assert strict.exit_code == 3, strict.output
        assert strict.stderr.splitlines()[-1] == (f"Error: 1 of 3 reports failed; the reasons are in {out}.failures"
                                                  ".jsonl (--strict: exit status 3)")
        assert out.read_text().strip() and len(Path(f"{out}.failures.jsonl").read_text().splitlines()) == 1
        assert "LLM structurer: 3 requests" in strict.stderr  # the run's summary is printed first
        fake.fail_if = None
        clean = runner.invoke(main, ["reports", command, str(folder), "--out", str(out), "--strict",
                                     *_llm_args(fake)])
        assert clean.exit_code == 0 and "Error" not in clean.output, clean.output
        fake.fail_if = lambda body: True
        every = runner.invoke(main, ["reports", command, str(folder), "--out", str(out), "--strict",
                                     *_llm_args(fake)])
        assert every.exit_code == 1 and "--strict" not in every.output, every.output  # nothing done: 1, as before


def test_strict_names_the_failure_lines_without_out_and_holds_for_the_rules_structurer(tmp_path: Path) -> None:
    folder = _reports(tmp_path / "in", {"a": "Small left pleural effusion."})
    (folder / "empty.txt").write_text("", encoding="utf-8")
    runner = CliRunner()
    structure = runner.invoke(main, ["reports", "structure", str(folder), "--strict", "--no-progress"])
    assert structure.exit_code == 3, structure.output
    assert '"failure"' in structure.stdout and structure.stderr.splitlines()[-1] == (
        "Error: 1 of 2 reports failed; the reasons are in the failure lines above (--strict: exit status 3)")
    label = runner.invoke(main, ["reports", "label", str(folder), "--strict", "--no-progress"])
    assert label.exit_code == 3 and "failure lines on stderr (--strict" in label.stderr, label.output
    assert runner.invoke(main, ["reports", "label", str(folder), "--no-progress"]).exit_code == 0
