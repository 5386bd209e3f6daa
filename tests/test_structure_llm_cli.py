"""``reports structure`` / ``reports label`` with the LLM structurer on the command line: the exit status of a run
in which some reports failed (``--strict``), and the decoding flags ``--seed`` / ``--max-tokens``."""

from __future__ import annotations

import importlib
import json
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


# -- --seed and --max-tokens ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["structure", "label"])
def test_seed_and_max_tokens_reach_every_request_and_the_provenance(tmp_path: Path, command: str) -> None:
    folder = _reports(tmp_path / "in", {"a": "Right lower lobe opacity concerning for pneumonia.",
                                        "b": "No pleural effusion."})
    out = tmp_path / f"{command}.out"
    with FakeLLM() as fake:
        result = CliRunner().invoke(main, ["reports", command, str(folder), "--out", str(out), "--seed", "7",
                                           "--max-tokens", "321", *_llm_args(fake)])
        assert result.exit_code == 0, result.output
        assert len(fake.bodies) == 3  # a: structure + location; b: structure
        assert {(body["seed"], body["max_tokens"]) for body in fake.bodies} == {(7, 321)}
        if command == "structure":
            rows = [json.loads(line) for line in out.read_text().splitlines()]
            assert rows and all(r["provenance"]["decoding"] == {"temperature": 0.0, "max_tokens": 321, "seed": 7}
                                for r in rows)
        fake.bodies.clear()
        same = CliRunner().invoke(main, ["reports", command, str(folder), "--seed", "7", "--structurer-opt", "seed=7",
                                         "--structurer-opt", "max_tokens=300", *_llm_args(fake)])
        assert same.exit_code == 0, same.output  # the same value twice, and a key given once: no conflict
        assert {(body["seed"], body["max_tokens"]) for body in fake.bodies} == {(7, 300)}
        fake.bodies.clear()
        plain = CliRunner().invoke(main, ["reports", command, str(folder), *_llm_args(fake)])
        assert plain.exit_code == 0 and {(b["seed"], b["max_tokens"]) for b in fake.bodies} == {(0, 2048)}


def test_a_flag_and_a_structurer_opt_that_disagree_are_refused_naming_both(tmp_path: Path) -> None:
    folder = _reports(tmp_path / "in", {"a": "No pleural effusion."})
    runner = CliRunner()
    with FakeLLM() as fake:
        for flag, value, opt in (("--seed", "7", "seed=8"), ("--max-tokens", "300", "max_tokens=301"),
                                 ("--concurrency", "2", "concurrency=3"), ("--temperature", "0.5", "temperature=0.7")):
            for command in ("structure", "label"):
                result = runner.invoke(main, ["reports", command, str(folder), flag, value, "--structurer-opt", opt,
                                              *_llm_args(fake)])
                assert result.exit_code == 2, result.output
                key, raw = opt.split("=")
                assert f"{flag} {value} and --structurer-opt {key}={raw} give the structurer two values of {key}: " \
                       "give one of them" in result.output, result.output
        model = runner.invoke(main, ["reports", "structure", str(folder), "--structurer", "llm", "--base-url",
                                     fake.base_url, "--model", "a", "--structurer-opt", "model=b"])
        assert model.exit_code == 2 and "--model a and --structurer-opt model=b give" in model.output, model.output
        assert fake.requests == 0
        agree = runner.invoke(main, ["reports", "structure", str(folder), "--temperature", "0.5", "--structurer-opt",
                                     "temperature=0.50", *_llm_args(fake)])
        assert agree.exit_code == 0, agree.output
        # a value from the environment is overridden by --structurer-opt, as documented
        env = runner.invoke(main, ["reports", "structure", str(folder), "--structurer", "llm", "--base-url",
                                   fake.base_url, "--structurer-opt", "model=m2", "--no-progress"],
                            env={"CXRGROUND_LLM_MODEL": "m1"})
        assert env.exit_code == 0 and fake.bodies[-1]["model"] == "m2", env.output
    for flag, value in (("--seed", "1"), ("--max-tokens", "10")):
        rules = runner.invoke(main, ["reports", "structure", str(folder), flag, value])
        assert rules.exit_code == 2 and f"{flag} applies to the llm structurer only" in rules.output, rules.output
