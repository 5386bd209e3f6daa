"""A tiny synthetic cohort and its ILS dataset, for the tests that train or read a model on one."""

from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner

from cxrground.cli import main
from cxrground.datasets.synthetic import write_cohort
from cxrground.datasets.synthetic.config import SynthConfig


def tiny_ils(root: Path, studies: int, width: int = 128) -> Path:
    """``root/cohort`` (``studies`` synthetic studies, ``width`` px wide, seed 0) and its ILS dataset ``root/ils``
    (pseudo-normal synthesizer, seed 0); returns ``root``."""
    write_cohort(root / "cohort", studies, seed=0, config=SynthConfig(width=width), progress=False)
    result = CliRunner().invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out",
                                       str(root / "ils"), "--quiet", "--seed", "0", "--synthesizer", "pseudo-normal"])
    assert result.exit_code == 0, result.output
    return root


#: A baseline configuration small enough to train in seconds on the CPU (``--set`` values).
TINY_BASELINE = {"size": "32", "channels": "8,16", "cond_hidden": "16", "head_hidden": "16", "batch_size": "8",
                 "warmup_steps": "2", "anatomy": "none"}
