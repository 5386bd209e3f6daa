"""Plug-in modules reach the command line: from $CXRGROUND_PLUGINS and from entry points of ``cxrground.plugins``,
without editing the installed package; one that fails to import is named, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cxrground.doctor import plugin_checks
from cxrground.plugins import PLUGINS_ENV, Plugin, load_plugins, plugin_modules

SRC = Path(__file__).resolve().parents[1] / "src"

#: A plug-in module: a segmenter (two rectangles as lungs) and a structurer with an option.
PLUGIN = '''
import numpy as np
from cxrground.anatomy.segment import SEGMENTERS, LungHeartMasks
from cxrground.reports.structure import STRUCTURERS, RuleStructurer


class Boxes:
    name = "t-plugboxes"

    def segment(self, image):
        h, w = image.pixels.shape
        right, left = np.zeros((h, w), np.uint8), np.zeros((h, w), np.uint8)
        right[h // 5:4 * h // 5, w // 8:w // 2 - 4] = 1
        left[h // 5:4 * h // 5, w // 2 + 4:7 * w // 8] = 1
        return LungHeartMasks(right, left, None, "none", self.name)

    def provenance(self):
        return {"name": self.name, "n": np.int64(2)}


class Tagged(RuleStructurer):
    name = "t-plugtagged"

    def __init__(self, tag: str = "none") -> None:
        super().__init__()
        self.tag = tag

    def provenance(self):
        return {"name": self.name, "tag": self.tag}


SEGMENTERS.register("t-plugboxes", Boxes, help="plug-in test lungs")
STRUCTURERS.register("t-plugtagged", Tagged, help="plug-in test structurer")
'''


def _cli(args: list[str], path: Path, plugins: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m cxrground ARGS`` with ``path`` on PYTHONPATH and $CXRGROUND_PLUGINS set to ``plugins``."""
    env = {k: v for k, v in os.environ.items() if k != PLUGINS_ENV}
    env.update({"PYTHONPATH": os.pathsep.join([str(path), str(SRC)]), "OMP_NUM_THREADS": "1"})
    if plugins is not None:
        env[PLUGINS_ENV] = plugins
    return subprocess.run([sys.executable, "-m", "cxrground", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


@pytest.fixture
def plug(tmp_path: Path) -> Path:
    """A folder holding the plug-in module ``tplug``."""
    (tmp_path / "plug").mkdir()
    (tmp_path / "plug" / "tplug.py").write_text(PLUGIN)
    return tmp_path / "plug"


def test_a_plugin_named_by_the_environment_is_listed_and_used(plug, tmp_path):
    res = _cli(["segment", "lungs", "--help"], plug, "tplug")
    assert res.returncode == 0 and "t-plugboxes: plug-in test lungs" in " ".join(res.stdout.split()), res.stderr
    Image.fromarray(np.tile(np.arange(0, 256, 4, dtype=np.uint8), (64, 1))).save(tmp_path / "film.png")  # not blank
    res = _cli(["segment", "lungs", "--image", str(tmp_path / "film.png"), "--out-dir", str(tmp_path / "seg"),
                "--backend", "t-plugboxes"], plug, "tplug")
    assert res.returncode == 0, res.stderr
    assert json.loads((tmp_path / "seg" / "masks.json").read_text())["provenance"] == {"name": "t-plugboxes", "n": 2}
    report = tmp_path / "s1.txt"
    report.write_text("FINDINGS: Small left pleural effusion.\n")
    res = _cli(["reports", "structure", "--structurer", "t-plugtagged", "--structurer-opt", "tag=mine",
                str(report)], plug, "tplug")
    assert res.returncode == 0, res.stderr
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert rows and all(r["provenance"] == {"name": "t-plugtagged", "tag": "mine"} for r in rows)


def test_a_plugin_named_by_an_entry_point_is_listed(plug):
    info = plug / "tplug_dist-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: tplug-dist\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[cxrground.plugins]\nmine = tplug\n")
    res = _cli(["segment", "lungs", "--help"], plug)
    assert res.returncode == 0 and "t-plugboxes" in res.stdout, res.stderr


def test_a_plugin_that_fails_to_import_is_named_and_stops_commands_but_not_help(plug):
    (plug / "broken.py").write_text("raise RuntimeError('broken on purpose')\n")
    res = _cli(["reports", "structure", str(plug / "broken.py")], plug, "tplug, broken")
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert ("Error: plug-in module 'broken' (named by $CXRGROUND_PLUGINS) failed to import: RuntimeError: broken on "
            "purpose; fix the module, or leave it out of $CXRGROUND_PLUGINS") in res.stderr
    res = _cli(["segment", "lungs", "--help"], plug, "tplug,broken")
    assert res.returncode == 0 and "t-plugboxes" in res.stdout  # the plug-ins that imported are listed
    assert "Warning: plug-in module 'broken'" in res.stderr
    res = _cli(["reports", "structure", "x"], plug, "no_such_plugin_module")
    assert res.returncode == 1 and "'no_such_plugin_module' (named by $CXRGROUND_PLUGINS) failed to import: " \
                                   "ModuleNotFoundError" in res.stderr


def test_load_plugins_imports_each_module_once_and_doctor_lists_them(plug, monkeypatch):
    monkeypatch.syspath_prepend(str(plug))
    (plug / "tplug_other.py").write_text("")
    entry = [Plugin("tplug_other", "entry point 'x' of group 'cxrground.plugins'")]
    named = plugin_modules({PLUGINS_ENV: " tplug_other, ,missing_mod "}, lambda: entry)
    assert [p.module for p in named] == ["tplug_other", "missing_mod"] and named[0].source.startswith("entry point")
    plugins = load_plugins({PLUGINS_ENV: "tplug_other,missing_mod"}, lambda: [])
    assert [p.module for p in plugins.loaded] == ["tplug_other"]
    assert [f.plugin.module for f in plugins.failed] == ["missing_mod"]
    checks = plugin_checks(plugins)
    assert [(c.name, c.ok, c.required) for c in checks] == [("tplug_other", True, False), ("missing_mod", False, True)]
    assert plugin_checks(load_plugins({}, lambda: []))[0].name == "none"
