"""The documentation cannot rot: the site builds with ``--strict``, the README's links resolve, and the runnable
blocks of the pages (Getting started and every guide's laptop path) run on the synthetic cohort.

Runnable blocks: a fenced ``bash`` block right after a line ``<!-- runnable -->`` (or ``<!-- runnable: pack -->``
for a block that needs the real-data pack; it is skipped without one). The runnable blocks of one page run in
order, in one ``bash -euo pipefail`` shell, with ``cxrground`` and ``python`` being the interpreter running the
tests (this checkout's package first) and one thread per library. The demo page (:data:`DEMO`) runs in an empty
folder; every other page runs in a copy of the folder the demo left, so a guide's laptop path starts from the
demo's ``demo/cohort``, ``demo/ils``, ``demo/baseline`` and ``demo/percept``.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
RUNNABLE = re.compile(r"^<!-- runnable(?::\s*(\w+))? -->\n```(?:bash|sh|console)?\n(.*?)^```", re.DOTALL | re.MULTILINE)

#: The page whose blocks make the folders the guides start from.
DEMO = "getting-started/demo.md"
#: Pages whose commands a new user follows first: each must keep runnable blocks.
MUST_RUN = ["getting-started/demo.md", "guides/ils-dataset.md", "guides/ils-model.md", "guides/chexpercept.md",
            "guides/evaluate-vlm.md", "guides/expert-review.md", "guides/label-reports.md",
            "guides/own-films.md"]


def runnable_blocks(markdown: str) -> list[tuple[str | None, str]]:
    """The (tag, code) of every runnable block of a page, in order (tag ``None`` or ``"pack"``)."""
    return [(m.group(1), m.group(2)) for m in RUNNABLE.finditer(markdown)]


def _pages_with_blocks() -> list[str]:
    return sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")
                  if runnable_blocks(p.read_text(encoding="utf-8")))


def test_marker_parsing():
    text = ("x\n<!-- runnable -->\n```bash\necho a\n```\n\n```bash\necho not-run\n```\n"
            "<!-- runnable: pack -->\n```bash\necho b\n```\n")
    assert runnable_blocks(text) == [(None, "echo a\n"), ("pack", "echo b\n")]


@pytest.mark.parametrize("page", MUST_RUN)
def test_first_pages_keep_runnable_blocks(page):
    assert runnable_blocks((DOCS / page).read_text(encoding="utf-8")), f"docs/{page} lost its runnable blocks"


def _shell_env(bin_dir: Path) -> dict[str, str]:
    bin_dir.mkdir()
    for name, target in (("cxrground", f'exec "{sys.executable}" -m cxrground "$@"'),
                         ("python", f'exec "{sys.executable}" "$@"')):
        shim = bin_dir / name
        shim.write_text(f"#!/bin/sh\n{target}\n")
        shim.chmod(0o755)
    env = dict(os.environ)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = "1"
    return env


def _run_page(page: str, work: Path, bin_dir: Path) -> None:
    from cxrground.datasets.pack import find_pack

    env = _shell_env(bin_dir)
    try:
        env["CXRGROUND_PACK"] = str(find_pack())
    except Exception:  # no pack here: its blocks are left out
        env.pop("CXRGROUND_PACK", None)
    blocks = runnable_blocks((DOCS / page).read_text(encoding="utf-8"))
    code = [c for tag, c in blocks if tag != "pack" or "CXRGROUND_PACK" in env]
    script = "set -euo pipefail\n" + "\n".join(code)
    proc = subprocess.run(["bash", "-c", script], cwd=work, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, f"docs/{page}: a runnable block failed\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def demo_folder(tmp_path_factory) -> Path:
    """The folder after the demo page's runnable blocks ran in it."""
    base = tmp_path_factory.mktemp("docs-demo")
    (base / "work").mkdir()
    _run_page(DEMO, base / "work", base / "bin")
    return base / "work"


@pytest.mark.parametrize("page", _pages_with_blocks())
def test_runnable_blocks(page, demo_folder, tmp_path):
    if page == DEMO:
        assert (demo_folder / "demo" / "runs" / "report.html").is_file()
        return
    work = tmp_path / "work"
    shutil.copytree(demo_folder, work, symlinks=True)
    _run_page(page, work, tmp_path / "bin")


def test_readme_links_resolve():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    inside = [link for link in links if "://" not in link and (ROOT / link).resolve().is_relative_to(ROOT)]
    missing = [link for link in inside if not (ROOT / link).exists()]
    assert inside and not missing, f"README.md links to missing files: {missing}"
    assert len(text.splitlines()) <= 220, "README.md is the front door: at most 220 lines (the rest goes to docs/)"
    for command in ("make demo", "make test"):
        assert command in text


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
def test_site_builds_strict(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src"), "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    cli = (tmp_path / "site" / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--negative-check" in cli and "Sentinel" not in cli
    assert "see description" in cli and "<code>2048</code>" in cli  # the Default column (cli_defaults hook)


@pytest.mark.skipif(importlib.util.find_spec("mkdocs") is None, reason="the docs extra is not installed")
@pytest.mark.parametrize("link", ["missing.md", "other.md#no-such-heading"])
def test_site_validation_fails_on_a_broken_link(tmp_path, link):
    import yaml

    ours = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nhooks:")[0])
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text(f"# Home\n\nSee [there]({link}).\n")
    (tmp_path / "docs" / "other.md").write_text("# Other\n\n## A heading\n")
    config = {"site_name": "t", "strict": True, "validation": ours["validation"], "nav": ["index.md", "other.md"]}
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert proc.returncode != 0 and link.split("#")[0] in proc.stderr


def _cli_options():
    """(command path, option, its click context) for every option of every ``cxrground`` command."""
    import click

    from cxrground.cli import main

    def walk(cmd, path, parent):
        ctx = click.Context(cmd, info_name=path[-1] if path else "cxrground", parent=parent)
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name], ctx)
        else:
            yield from ((" ".join(path), p, ctx) for p in cmd.params if isinstance(p, click.Option))

    return list(walk(main, [], None))


@pytest.mark.skipif(importlib.util.find_spec("mkdocs_click") is None, reason="the docs extra is not installed")
def test_cli_reference_defaults_agree_with_help():
    """The command reference's Default column shows the default ``--help`` prints, and never "None" for an option
    whose help text states a default."""
    import click
    from mkdocs_click import _docs

    if not hasattr(click.Option, "get_help_extra"):
        pytest.skip("click < 8.2 has no Option.get_help_extra")
    sys.path.insert(0, str(DOCS / "_hooks"))
    try:
        import cli_defaults
    finally:
        sys.path.pop(0)
    row = cli_defaults._wrap(_docs._format_table_option_row)
    cells, wrong = {}, []
    for command, option, ctx in _cli_options():
        cell = row(option).rstrip(" |").rpartition(" | ")[2]
        cells[command, option.opts[0]] = cell
        shown = option.get_help_extra(ctx).get("default")
        if shown and isinstance(option.show_default, str):
            shown = shown.removeprefix("(").removesuffix(")")
        if shown and cell.strip("`") != shown:
            wrong.append(f"{command} {option.opts[0]}: --help {shown!r}, reference {cell!r}")
        if "Sentinel" in cell or (cell == "None" and cli_defaults.STATES_DEFAULT.search(option.help or "")):
            wrong.append(f"{command} {option.opts[0]}: reference {cell!r}, help {option.help!r}")
    assert not wrong, "\n".join(wrong)
    assert len(cells) > 300
    for command in ("ils build", "reports label", "reports structure"):
        assert cells[command, "--max-tokens"] == "`2048`" and cells[command, "--alternatives"] == "`uncertain`"
    assert cells["reports label", "--seed"] == "`0`"
    assert cells["segment train-pose", "--holdout-fraction"] == "`0.2`"
    assert cells["ils train", "--threads"] == cli_defaults.SEE_DESCRIPTION
    assert cells["ils build", "--overwrite"] == "`False`" and cells["ils build", "--out"] == "required"


def test_configuration_tables_come_from_the_dataclasses():
    sys.path.insert(0, str(DOCS / "_hooks"))
    try:
        import config_tables
    finally:
        sys.path.pop(0)
    page = (DOCS / "reference" / "configuration.md").read_text(encoding="utf-8")
    markers = config_tables.MARKER.findall(page)
    assert len(markers) >= 10
    expanded = config_tables.expand(page)
    assert "<!-- config-table" not in expanded
    rows = {r[0]: r for r in config_tables.config_rows("cxrground.percept.config", "DeformConfig")}
    assert rows["`kernel`"][2] == "`32`" and "§7.2" in rows["`kernel`"][3]
    ils = {r[0]: r for r in config_tables.config_rows("cxrground.ils.config", "IlsConfig")}
    assert ils["`ctr_negative_max`"][2] == "`0.45`" and "§9.4" in ils["`ctr_negative_max`"][3]
    qc = {r[0]: r for r in config_tables.config_rows("cxrground.ils.config", "QCConfig")}
    shape = qc["`lung_shape_min_iou`"]
    assert shape[2] == "`0.5`" and "`cxrground.anatomy.segment.plausibility`" in shape[3]
    assert ":mod:" not in shape[3]  # a docstring's cross-reference role is shown as plain code
    build = {r[0]: r for r in config_tables.config_rows("cxrground.ils.request", "BuildRequest")}
    assert "choices: `local`, `ray`" in build["`engine`"][3]
