"""A training run killed during an atomic write leaves a ``.{name}.{pid}.tmp``; the next ``ils train`` into the
same folder removes it (and leaves a running writer's file alone)."""

from __future__ import annotations

import os
import subprocess
import sys
from types import SimpleNamespace

from cxrground.io.files import remove_stale_temps, temp_path
from cxrground.models import base

_KILLED_WRITER = """
import os, signal, sys
from pathlib import Path
from cxrground.io.files import atomic_path
with atomic_path(Path(sys.argv[1]) / "state.pt") as tmp:
    tmp.write_bytes(b"half a checkpoint")
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rerun_removes_the_temporary_file_a_killed_run_left(tmp_path, monkeypatch) -> None:
    out = tmp_path / "ckpt"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(out)], capture_output=True)
    assert done.returncode == -9
    left = [p for p in out.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].name.startswith(".state.pt.")
    mine = temp_path(out / "sub" / "live.pt")  # this process's own write in progress: kept
    mine.parent.mkdir()
    mine.write_bytes(b"x")
    calls = []
    monkeypatch.setattr(base, "model_module", lambda name: SimpleNamespace(
        train=lambda dataset, o, **kw: calls.append(sorted(p.name for p in o.rglob("*.tmp"))) or o))
    base.train_model("baseline", tmp_path / "ils", out, resume=True)
    assert calls == [[mine.name]]  # the backend starts with the stale file gone
    assert not left[0].exists() and mine.exists()
    assert remove_stale_temps(tmp_path / "missing") == []
    assert os.getpid() == int(mine.name[:-4].rsplit(".", 1)[-1])
