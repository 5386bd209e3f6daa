"""An output path below a file is a usage error naming that file, for every command that writes (not a traceback)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from cxrground.cli import main


@pytest.mark.parametrize("args", [
    ["ils", "build", "--images", "{dir}", "--out", "{out}"],
    ["ils", "gallery", "{dir}", "--html", "{out}/g.html"],
    ["segment", "lungs", "--image", "{film}", "--out-dir", "{out}"],
    ["anatomy", "zones", "--images", "{dir}", "--out", "{out}"],
    ["percept", "report", "{dir}", "--out", "{out}/r.html"],
    ["reports", "label", "{dir}", "--out", "{out}/labels.csv"],
])
def test_an_output_below_a_file_is_refused_naming_the_file(tmp_path, args):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "s1.txt").write_text("FINDINGS: Clear.")
    film = tmp_path / "film.png"
    film.write_bytes(b"not read")
    blocker = tmp_path / "afile"
    blocker.write_text("x")
    values = {"dir": str(tmp_path / "d"), "film": str(film), "out": str(blocker / "sub")}
    result = CliRunner().invoke(main, [a.format(**values) for a in args])
    assert result.exit_code == 2, result.output
    assert f"{blocker} is a file, not a folder" in result.output and "Traceback" not in result.output
