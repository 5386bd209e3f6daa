"""The shared backend registry (:mod:`cxrground.registry`), every registry built on it, and the CLI choices."""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner

from cxrground.anatomy.segment import SEGMENTERS, WEIGHTS_OPTION, weights_options
from cxrground.cli import main
from cxrground.errors import ConfigError, Failure
from cxrground.evaluation.percept.clients import CLIENTS, HARNESS_OPTIONS, make_client, spec_forms
from cxrground.ils.spatial import DETECTORS, SYNTHESIZERS
from cxrground.models.base import MODELS, model_module
from cxrground.percept.deform import DEFORMERS
from cxrground.registry import Registry

# --- the helper -------------------------------------------------------------------------------------------


class _Widget:
    def __init__(self, size: int, colour: str = "red", *, shiny: bool = False) -> None:
        self.size, self.colour, self.shiny = size, colour, shiny


def _registry() -> Registry[object]:
    reg: Registry[object] = Registry("widget")
    reg.register("plain", _Widget, help="a widget")

    @reg.register("lazy", help="imports its heavy library only when created", options=("level",))
    def _lazy(**opts: object) -> object:
        import colorsys  # stands in for a heavy import inside the factory

        return (colorsys.__name__, opts)

    return reg


def test_names_help_and_options_come_from_the_registrations():
    reg = _registry()
    assert reg.names() == ("plain", "lazy") and list(reg) == ["plain", "lazy"] and len(reg) == 2
    assert "plain" in reg and "other" not in reg
    assert reg.help() == "plain: a widget\nlazy: imports its heavy library only when created"
    assert reg.help("; ").count("; ") == 1
    assert reg.options("plain") == ("size", "colour", "shiny")
    assert reg.get("plain").required == ("size",)
    assert reg.options("lazy") == ("level",)


def test_create_checks_options_with_one_wording():
    reg = _registry()
    w = reg.create("plain", size=3, shiny=True)
    assert isinstance(w, _Widget) and (w.size, w.colour, w.shiny) == (3, "red", True)
    assert reg.create("lazy", level=2) == ("colorsys", {"level": 2})
    with pytest.raises(ConfigError, match=r"^unknown widget 'gadget'; choose one of: plain, lazy$"):
        reg.create("gadget")
    with pytest.raises(ConfigError, match=r"^widget 'plain' does not accept option 'weight'; "
                                          r"accepted: size, colour, shiny$"):
        reg.create("plain", size=1, weight=2)
    with pytest.raises(ConfigError, match=r"^widget 'lazy' does not accept option 'size'; accepted: level$"):
        reg.create("lazy", size=1)
    with pytest.raises(ConfigError, match=r"^widget 'plain' needs option 'size'$"):
        reg.create("plain", colour="blue")
    reg.check("plain", ["size"])  # check alone builds nothing


def test_registration_mistakes_are_programming_errors():
    reg = _registry()
    with pytest.raises(ConfigError, match="'plain' is already registered; pass replace=True"):
        reg.register("plain", _Widget, help="again")
    reg.register("plain", _Widget, help="replaced", replace=True)  # a notebook cell run again
    assert reg.get("plain").help == "replaced" and reg.names()[0] == "plain"
    with pytest.raises(TypeError, match=r"\*\*kwargs"):
        reg.register("loose", lambda **kw: kw, help="options not declared")
    empty: Registry[object] = Registry("thing")
    empty.register("bare", lambda: object(), help="takes nothing")
    with pytest.raises(ConfigError, match="does not accept option 'x'; accepted: no options"):
        empty.create("bare", x=1)


# --- every registry of the project -------------------------------------------------------------------------

REGISTRIES = {
    "segmenter": (SEGMENTERS, {"unet", "given", "masks", "cxas", "hybridgnet"}),
    "synthesizer": (SYNTHESIZERS, {"pseudo-normal", "normative", "radedit", "lesion-unet"}),
    "detector": (DETECTORS, {"anomaly", "yolo"}),
    "deformer": (DEFORMERS, {"builtin", "sam"}),
    "model": (MODELS, {"baseline", "lisa"}),
    "model client": (CLIENTS, {"openai", "hf", "ils", "replay", "random", "first-option", "always-yes", "oracle"}),
}


@pytest.mark.parametrize("kind", sorted(REGISTRIES))
def test_each_registry_names_help_and_errors(kind: str):
    registry, names = REGISTRIES[kind]
    assert registry.kind == kind and set(registry.names()) == names
    assert len(registry.help().splitlines()) == len(names)
    assert all(registry.get(n).help for n in names)
    with pytest.raises(ConfigError, match=rf"^unknown {kind} 'nope'; choose one of: {', '.join(registry.names())}$"):
        registry.create("nope")
    first = registry.names()[0]
    with pytest.raises(ConfigError, match=rf"^{kind} '{first}' does not accept option 'bogus'; accepted: "):
        registry.check(first, ["bogus"])


def test_backends_are_built_through_their_registries(tmp_path: Path):
    assert SEGMENTERS.create("unet").name == "unet"  # lazy: nothing is loaded yet
    with pytest.raises(ConfigError, match="segmenter 'masks' needs option 'root'"):
        SEGMENTERS.create("masks")
    assert SEGMENTERS.create("masks", root=tmp_path).name == "masks"
    assert DEFORMERS.create("builtin").name == "builtin"
    assert model_module("baseline").__name__ == "cxrground.models.baseline"
    for name, option in WEIGHTS_OPTION.items():
        assert option in SEGMENTERS.options(name)
        assert weights_options(name, "w") == {option: "w"}
    assert weights_options("given", None) == {}
    with pytest.raises(ConfigError, match="takes no weights"):
        weights_options("given", "w")


def test_model_clients_accept_the_harness_options_and_refuse_others():
    client = make_client("random", **{o: None for o in HARNESS_OPTIONS if o != "seed"}, seed=3)
    assert client.kind == "random" and client.seed == 3
    with pytest.raises(ConfigError, match="model client 'oracle' does not accept option 'temprature'"):
        make_client("oracle", temprature=0.5)
    with pytest.raises(ConfigError, match="unknown model client 'gpt'"):
        make_client("gpt:4")
    with pytest.raises(ConfigError, match="needs a name"):
        make_client("hf:")
    assert spec_forms() == ("openai:MODEL | hf:MODEL_DIR | ils:CHECKPOINT | replay:ALL_RESULTS | random | "
                            "first-option | always-yes | oracle")


# --- CLI choices and help come from the registries -------------------------------------------------------


def _option(command: click.Command, flag: str) -> click.Option:
    return next(p for p in command.params if isinstance(p, click.Option) and flag in p.opts)


@pytest.mark.parametrize(("path", "flag", "registry"), [
    (("segment", "lungs"), "--backend", SEGMENTERS),
    (("ils", "build"), "--segmenter", SEGMENTERS),
    (("ils", "build"), "--qc-segmenter", SEGMENTERS),
    (("ils", "build"), "--synthesizer", SYNTHESIZERS),
    (("ils", "build"), "--detector", DETECTORS),
    (("ils", "train"), "--model", MODELS),
    (("percept", "build"), "--deformer", DEFORMERS),
])
def test_cli_backend_choices_are_the_registry(path: tuple[str, str], flag: str, registry: Registry[object]):
    group = main.commands[path[0]]
    assert isinstance(group, click.Group)
    option = _option(group.commands[path[1]], flag)
    assert isinstance(option.type, click.Choice) and tuple(option.type.choices) == registry.names()
    assert all(f"{name}: {registry.get(name).help}" in (option.help or "") for name in registry.names())


def test_percept_eval_model_help_lists_every_client():
    group = main.commands["percept"]
    assert isinstance(group, click.Group)
    assert spec_forms() in (_option(group.commands["eval"], "--model").help or "")


@pytest.fixture(scope="module")
def study(tmp_path_factory) -> dict[str, Path]:
    from cxrground.datasets.synthetic import SynthConfig, generate_study
    from cxrground.io.image import write_image
    from cxrground.io.masks import write_mask_png

    tmp = tmp_path_factory.mktemp("registry-cli")
    s = generate_study(0, 2, SynthConfig(width=192))
    files = {"image": write_image(tmp / "s1" / "image.png", s.image)}
    for name, mask in s.anatomy_masks.items():
        files[name] = write_mask_png(tmp / "masks" / "s1" / f"{name}.png", mask)
    return files


def test_segment_lungs_backend_options_are_checked_by_the_registry(study: dict[str, Path], tmp_path: Path):
    image, root = study["image"], study["right_lung"].parent.parent
    res = CliRunner().invoke(main, ["segment", "lungs", "--image", str(image), "--out-dir", str(tmp_path / "m"),
                                    "--backend", "masks", "--backend-opt", f"root={root}"])
    assert res.exit_code == 0, res.output
    assert json.loads((tmp_path / "m" / "masks.json").read_text())["heart_source"] == "truth"
    assert "heart: given" in res.output
    res = CliRunner().invoke(main, ["segment", "lungs", "--image", str(image), "--out-dir", str(tmp_path / "x"),
                                    "--backend", "masks", "--backend-opt", f"root={root}",
                                    "--backend-opt", "nonsense=1"])
    assert res.exit_code == 1 and "segmenter 'masks' does not accept option 'nonsense'" in res.output
    res = CliRunner().invoke(main, ["segment", "lungs", "--image", str(image), "--out-dir", str(tmp_path / "x"),
                                    "--backend", "given", "--right", str(study["right_lung"]),
                                    "--left", str(study["left_lung"]), "--weights", str(image)])
    assert res.exit_code == 1 and "segmenter 'given' takes no weights" in res.output
    res = CliRunner().invoke(main, ["segment", "lungs", "--image", str(image), "--out-dir", str(tmp_path / "x"),
                                    "--backend", "sam"])
    assert res.exit_code == 2 and "'sam' is not one of" in res.output
    assert not (tmp_path / "x").exists()


def test_ils_build_refuses_a_bad_backend_option_before_any_study(study: dict[str, Path], tmp_path: Path):
    res = CliRunner().invoke(main, ["ils", "build", "--images", str(study["image"].parent.parent), "--out",
                                    str(tmp_path / "ils"), "--detector-opt", "level=0.1", "--quiet"])
    assert res.exit_code == 1
    assert "detector 'anomaly' does not accept option 'level'; accepted: levels," in res.output
    assert not (tmp_path / "ils" / "units").exists()
    res = CliRunner().invoke(main, ["ils", "build", "--images", str(study["image"].parent.parent), "--out",
                                    str(tmp_path / "ils"), "--segmenter-opt", "novalue", "--quiet"])
    assert res.exit_code == 2 and "expected KEY=VALUE" in res.output


def test_anatomy_show_draws_the_geometry(study: dict[str, Path], tmp_path: Path):
    from cxrground.io.image import read_image
    from cxrground.io.masks import write_mask_png

    out = tmp_path / "sheet.png"
    res = CliRunner().invoke(main, ["anatomy", "show", "--image", str(study["image"]), "--right",
                                    str(study["right_lung"]), "--left", str(study["left_lung"]), "--heart",
                                    str(study["heart"]), "--out", str(out), "--width", "128"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0] == f"wrote {out}" and len([ln for ln in lines if ln.endswith(" px")]) == 20
    assert lines[-1].startswith("  CTR = ")
    assert 5 * 128 <= read_image(out).shape[1] < 6 * 128  # five panels with a heart
    small = write_mask_png(tmp_path / "small.png", np.ones((8, 8), bool))
    res = CliRunner().invoke(main, ["anatomy", "show", "--image", str(study["image"]), "--right", str(small),
                                    "--left", str(study["left_lung"]), "--out", str(out)])
    assert res.exit_code == 1 and f"Error: {small}" in res.output and "shape" in res.output


# --- library homes of former CLI logic ---------------------------------------------------------------------


def test_finding_rows_and_their_files(tmp_path: Path):
    from cxrground.reports import expand_report_paths, parse_report_text
    from cxrground.reports.findings import finding_lines, write_finding_lines
    from cxrground.reports.structure import get_structurer, structure_report

    report = parse_report_text("FINDINGS: Small left pleural effusion. No pneumothorax.", report_id="s9")
    structured = structure_report(report, get_structurer("rules"))
    assert structured is not None
    rows = structured.finding_rows({"model": "m"})
    assert rows and all(r["report_id"] == "s9" and r["section"] == "findings" and r["provenance"] == {"model": "m"}
                        for r in rows)
    assert rows[0]["sentence"] == "Small left pleural effusion."
    failure = Failure(path="bad.txt", stage="reports", reason="empty", error="ReportError")
    assert json.loads(finding_lines(rows, [failure])[-1]) == {"failure": failure.to_dict()}
    out = tmp_path / "f.jsonl"
    assert write_finding_lines(out, rows, [failure]) == tmp_path / "f.jsonl.failures.jsonl"
    assert len(out.read_text().splitlines()) == len(rows)
    assert write_finding_lines(out, rows, []) is None and not (tmp_path / "f.jsonl.failures.jsonl").exists()
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "b.txt").write_text("x")
    (tmp_path / "r" / "a.xml").write_text("x")
    assert expand_report_paths([tmp_path / "r", out]) == [tmp_path / "r" / "a.xml", tmp_path / "r" / "b.txt", out]


def test_cohort_of_images(tmp_path: Path):
    from cxrground.datasets.synthetic import cohort_of_images

    (tmp_path / "files").mkdir()
    assert cohort_of_images(tmp_path / "files") is None
    (tmp_path / "truth").mkdir()
    (tmp_path / "cohort.json").write_text("{}")
    assert cohort_of_images(tmp_path / "files") == tmp_path



def test_text_options_are_converted_to_the_factorys_annotated_types():
    reg: Registry[dict] = Registry("widget")

    @reg.register("w", help="test widget")
    def make(size: int = 1, scale: float | None = None, fast: bool = False, name: str = "x") -> dict:
        return {"size": size, "scale": scale, "fast": fast, "name": name}

    got = reg.create("w", size="3", scale="0.5", fast="true", name="7")
    assert got == {"size": 3, "scale": 0.5, "fast": True, "name": "7"}
    assert reg.create("w", size=4, fast=False) == {"size": 4, "scale": None, "fast": False, "name": "x"}
    with pytest.raises(ConfigError, match="widget 'w': option 'size' must be int, got 'big'"):
        reg.create("w", size="big")
    with pytest.raises(ConfigError, match="option 'fast' must be bool"):
        reg.create("w", fast="maybe")


def test_llm_structurer_options_from_the_command_line_are_typed():
    from cxrground.reports.structure import STRUCTURERS

    s = STRUCTURERS.create("llm", base_url="http://127.0.0.1:9/v1", model="m", concurrency="3", temperature="0.5")
    assert s.concurrency == 3 and s.decoding["temperature"] == 0.5
