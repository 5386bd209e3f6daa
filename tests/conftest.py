"""Shared fixtures. The real-data pack is read from ``CXRGROUND_PACK`` or ``../shared/data/cxr-pack-v1``."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SPEC_DIR = REPO.parent / "shared" / "spec"
# plug-ins named in the developer's shell would join every command the tests run (tests that need them set it)
os.environ.pop("CXRGROUND_PLUGINS", None)


def _pack_path() -> Path:
    env = os.environ.get("CXRGROUND_PACK")
    return Path(env) if env else REPO.parent / "shared" / "data" / "cxr-pack-v1"


@pytest.fixture(scope="session")
def pack_dir() -> Path:
    """The cxr-pack-v1 folder; skips (outside CI) or fails (in CI) when it is missing."""
    path = _pack_path()
    if not (path / "README.md").is_file():
        msg = f"cxr-pack-v1 not found at {path}; set CXRGROUND_PACK to run real-data tests"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def spec_text() -> dict[str, str]:
    """The two specification files as text, keyed ``ils`` and ``percept``."""
    files = {"ils": SPEC_DIR / "ILS.md", "percept": SPEC_DIR / "CHEXPERCEPT.md"}
    if not all(p.is_file() for p in files.values()):
        msg = f"specs not found under {SPEC_DIR}"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    return {k: p.read_text(encoding="utf-8") for k, p in files.items()}


CHROMIUM = Path(os.environ.get("CXRGROUND_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@pytest.fixture(scope="session")
def tiny_ils_tasks(tmp_path_factory):
    """``(tasks, scan_failures)`` of a 4-study synthetic cohort (seed 7, 256 px wide) for quick ``ils build`` runs."""
    from cxrground.datasets.synthetic import SynthConfig, write_cohort
    from cxrground.ils.tasks import build_tasks

    cohort = tmp_path_factory.mktemp("tiny-ils-cohort")
    write_cohort(cohort, 4, seed=7, config=SynthConfig(width=256), progress=False)
    return build_tasks(cohort / "files")


@pytest.fixture(scope="session")
def build_tiny_ils(tiny_ils_tasks):
    """``build(out, **IlsConfig fields)``: ``ils build`` of the tiny cohort into ``out`` (pseudo-normal synthesizer,
    seed 0); returns ``out``."""
    from cxrground.ils.build import BackendSpec, build_dataset
    from cxrground.ils.config import IlsConfig

    def build(out, **config):
        tasks, failures = tiny_ils_tasks
        build_dataset(tasks, out, IlsConfig(seed=0, **config), BackendSpec(synthesizer="pseudo-normal"),
                      scan_failures=failures, progress=False)
        return out

    return build


@pytest.fixture(scope="module")
def browser():
    """A headless Debian Chromium driven by Playwright, one per test module; skips (outside CI) or fails (in CI)
    without it. Playwright's sync API keeps an event loop running in the main thread while it is open, so it is
    closed after each module: a later test's ``asyncio.run`` would otherwise be refused."""
    if not CHROMIUM.is_file():
        msg = f"chromium not found at {CHROMIUM} (apt-get install chromium)"
        if os.environ.get("CI"):
            pytest.fail(msg)
        pytest.skip(msg)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture()
def page(browser):
    """A fresh page (own context) in the shared headless browser; console errors are collected on it."""
    context = browser.new_context()
    pg = context.new_page()
    pg.console_errors = []
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    try:
        yield pg
    finally:
        context.close()


@pytest.fixture(scope="session", autouse=True)
def _ultralytics_settings_folder(tmp_path_factory):
    """One ultralytics settings folder for the whole session, as ``make test`` sets ``YOLO_CONFIG_DIR``: ultralytics
    reads it once, when first imported, so without it the first ``detector train`` of the process would fix the
    folder to that run's ``OUT/.ultralytics`` for every later test (a test run alone would find its own output folder
    made again after moving it)."""
    if "YOLO_CONFIG_DIR" not in os.environ:
        os.environ["YOLO_CONFIG_DIR"] = str(tmp_path_factory.mktemp("ultralytics"))


def pytest_collection_modifyitems(config, items):
    """Tests marked ``yolo`` need ultralytics and torchvision, which live in ``.venv-yolo`` (``make test`` runs
    them there and deselects them in ``.venv``); a plain ``pytest`` elsewhere skips them with that reason."""
    if all(importlib.util.find_spec(name) is not None for name in ("ultralytics", "torchvision")):
        return
    skip = pytest.mark.skip(reason="needs ultralytics + torchvision: make test runs it in .venv-yolo")
    for item in items:
        if "yolo" in item.keywords:
            item.add_marker(skip)
