"""Request dataclasses as command options (cxrground.fields.option + cli.common.request_options) and the usage
errors library code raises through OptionError / OptionValueError."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from cxrground.cli import main
from cxrground.cli.common import group, request_options
from cxrground.errors import OptionError, OptionValueError
from cxrground.fields import key_values, option


@dataclass(frozen=True, kw_only=True)
class _Toy:
    """A request with one field of each kind the option builder handles."""

    src: Path = option(path="dir", help="An existing folder.")
    count: int = option(3, low=1, high=9, help="How many.")
    mode: str = option("a", choices=("a", "b"))
    label: str | None = option(None, flag="--name", envvar="TOY_NAME")
    tags: tuple[str, ...] = option((), flag="--tag")
    extra: dict[str, str] = option(default_factory=dict, help="KEY=VALUE (repeatable).")
    dry: bool = option(False, help="Do nothing.")
    loud: bool = option(True, flag="--loud/--quiet")


@group("toy")
def _toy() -> None:
    """Toy group."""


@_toy.command("run")
@request_options(_Toy)
@click.option("--after", default="x")
def _run(request: _Toy, after: str) -> None:
    """Echo the request."""
    if request.mode == "b" and request.label is None:
        raise OptionError("--mode b needs --name")
    if request.count == 9:
        raise OptionValueError(f"nine is too many, got {request.count}")
    click.echo(f"{request!r} {after}")


def test_fields_become_options_in_field_order_and_build_the_request(tmp_path: Path):
    names = [p.name for p in _run.params]
    assert names == ["src", "count", "mode", "label", "tags", "extra", "dry", "loud", "after"]
    result = CliRunner().invoke(_toy, ["run", "--src", str(tmp_path), "--count", "2", "--mode", "b", "--name", "n",
                                       "--tag", "t1", "--tag", "t2", "--extra", "k = v", "--dry", "--quiet"])
    assert result.exit_code == 0, result.output
    expected = _Toy(src=tmp_path, count=2, mode="b", label="n", tags=("t1", "t2"), extra={"k": "v"}, dry=True,
                    loud=False)
    assert result.output == f"{expected!r} x\n"


def test_defaults_required_ranges_paths_and_envvars(tmp_path: Path):
    runner = CliRunner()
    missing = runner.invoke(_toy, ["run"])
    assert missing.exit_code == 2 and "Missing option '--src'" in missing.output
    ok = runner.invoke(_toy, ["run", "--src", str(tmp_path)], env={"TOY_NAME": "from-env"})
    assert ok.output == f"{_Toy(src=tmp_path, label='from-env')!r} x\n"
    for args, message in ((["--count", "0"], "0 is not in the range 1<=x<=9"),
                          (["--mode", "c"], "'c' is not one of 'a', 'b'"),
                          (["--extra", "novalue"], "Invalid value for '--extra': expected KEY=VALUE, got 'novalue'")):
        bad = runner.invoke(_toy, ["run", "--src", str(tmp_path), *args])
        assert bad.exit_code == 2 and message in bad.output, bad.output
    not_dir = runner.invoke(_toy, ["run", "--src", str(tmp_path / "nope")])
    assert not_dir.exit_code == 2 and "does not exist" in not_dir.output
    help_text = runner.invoke(_toy, ["run", "--help"]).output
    assert "--count INTEGER RANGE" in help_text and "[default: 3; 1<=x<=9]" in help_text
    assert "--loud / --quiet" in help_text and "KEY=VALUE (repeatable)." in help_text


def test_option_errors_are_usage_errors_of_the_command(tmp_path: Path):
    runner = CliRunner()
    combo = runner.invoke(_toy, ["run", "--src", str(tmp_path), "--mode", "b"])
    assert combo.exit_code == 2
    assert combo.output.startswith("Usage: toy run [OPTIONS]")
    assert combo.output.endswith("Error: --mode b needs --name\n")
    value = runner.invoke(_toy, ["run", "--src", str(tmp_path), "--count", "9"])
    assert value.exit_code == 2 and value.output.endswith("Error: Invalid value: nine is too many, got 9\n")


def test_real_commands_keep_their_usage_errors(tmp_path: Path):
    runner = CliRunner()
    per_lesion = runner.invoke(main, ["percept", "build", "--ils", str(tmp_path), "--images", str(tmp_path), "--out",
                                      str(tmp_path / "b"), "--per-lesion", "1,2"])
    assert per_lesion.exit_code == 2
    assert per_lesion.output.endswith("Error: Invalid value: expected LF,RF,RR (three non-negative integers), "
                                      "got '1,2'\n")
    review = runner.invoke(main, ["review", "import", "--db", str(tmp_path / "r.sqlite")])
    assert review.exit_code == 2 and "Usage: main review import [OPTIONS]" in review.output
    assert review.output.endswith("Error: give exactly one of --ils DATASET or --bench DIR\n")


def test_key_values():
    assert key_values(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(OptionValueError, match="expected KEY=VALUE, got 'c'"):
        key_values(["a=1", "c"])


def _commands(cmd: click.Command, path: tuple[str, ...] = ()) -> list[tuple[str, click.Command]]:
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        return [pair for name in cmd.list_commands(ctx)
                for pair in _commands(cmd.get_command(ctx, name), (*path, name))]
    return [(" ".join(path), cmd)]


def test_every_option_of_every_command_says_what_it_is_for():
    """`--help` explains each option (the command-line reference is generated from these texts)."""
    bare = [f"{name} {param.opts[0]}" for name, cmd in _commands(main) for param in cmd.params
            if isinstance(param, click.Option) and param.name != "help" and not (param.help or "").strip()]
    assert bare == []


@pytest.mark.parametrize("args", [["scan", "--images", "."], ["synth", "--out", "cohort"]])
def test_ctrl_c_exits_130_with_one_line_in_every_command(args, monkeypatch, tmp_path: Path):
    """A command stopped by Ctrl-C exits with status 130 (not click's "Aborted!" and 1, the status of an input
    error) and says so in one line, whichever command it was."""
    import cxrground.cli.data_cmds as data_cmds

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(data_cmds, "_scan_with_reports", interrupted)
    monkeypatch.setattr(data_cmds, "write_requested_cohort", interrupted)
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 130, result.output
    assert result.output.strip() == "Interrupted (Ctrl-C); the batch commands resume where they stopped when rerun"
