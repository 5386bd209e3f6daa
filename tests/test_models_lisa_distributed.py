"""Data-parallel LISA training (issue 12 item 6) on a tiny random model: 2 CPU processes (torchrun, gloo) give
the one-process result, only rank 0 writes, and a killed 2-process run resumes to the uninterrupted result."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("peft")
if not (torch.distributed.is_available() and torch.distributed.is_gloo_available()):
    pytest.skip("this torch build has no torch.distributed gloo backend", allow_module_level=True)

import cxrground  # noqa: E402
from cxrground.errors import ConfigError  # noqa: E402
from cxrground.models.lisa.config import LisaConfig  # noqa: E402
from cxrground.models.lisa.distributed import check_deepspeed, setup_distributed  # noqa: E402
from cxrground.models.lisa.training import RESUME_FILE, train  # noqa: E402

# 11 positives + 1 negative → 22 samples per epoch; batches of 10, 10, 2 in micro-batches of 2: with 2 ranks the
# micro-batches split 3/2, 3/2 and 1/0 (rank 1 has nothing in the last step); validation: 3 micro-batches.
SETTINGS = {"tiny": "true", "batch_size": "10", "micro_batch_size": "2", "save_every_steps": "1", "val_limit": "5",
            "threads": "1"}
TOL = 1e-5

# Runs the `ils train` command in a torchrun worker. Rank != 0 may not write under the output folder (an audit
# hook, and a wrapper of torch.save, whose zip writer is C++, end the process on any write there) except the paths
# the regex TEST_ALLOW matches (relative to the output folder, "{rank}" = the worker's rank); with KILL_AT set,
# rank 0 kills itself (SIGKILL) when it starts that step, i.e. after the resume state of the previous step is on disk.
WORKER = r'''
import os, re, signal, sys
out = os.path.realpath(os.environ["TEST_OUT"])
rank = int(os.environ["RANK"])
allow = os.environ.get("TEST_ALLOW", "").replace("{rank}", str(rank))

def _inside(path):
    try:
        return os.path.realpath(os.fsdecode(path)).startswith(out)
    except (TypeError, ValueError):
        return False

def _deny(path, what):
    if not _inside(path):
        return
    rel = os.path.relpath(os.path.realpath(os.fsdecode(path)), out)
    if not (allow and re.fullmatch(allow, rel)):
        os.write(2, f"WRITE-GUARD: rank {rank} {what} {path}\n".encode())
        os._exit(17)

def _guard(event, args):
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    if event == "open" and not isinstance(args[0], int):
        mode, flags = args[1], args[2]
        wrote = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
            isinstance(flags, int) and flags & writes)
        if wrote:
            _deny(args[0], "wrote")
    elif event in ("os.rename", "os.remove", "os.mkdir", "os.rmdir", "os.truncate"):
        _deny(args[0], f"changed ({event})")

if rank != 0:
    sys.addaudithook(_guard)
    import torch
    real_save = torch.save
    def _save(obj, f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            _deny(f, "torch.save")
        return real_save(obj, f, *args, **kwargs)
    torch.save = _save
kill_at = int(os.environ.get("KILL_AT", "0"))
if kill_at and rank == 0:
    import importlib
    T = importlib.import_module("cxrground.models.lisa.training")
    real = T._micro_seed
    def _micro_seed(seed, step, micro):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(seed, step, micro)
    T._micro_seed = _micro_seed
from cxrground.cli import main
main(sys.argv[1:])
'''


@pytest.fixture(scope="module")
def ils_dataset(tmp_path_factory):
    from click.testing import CliRunner

    from cxrground.cli import main

    root = tmp_path_factory.mktemp("lisa_dist_ils")
    runner = CliRunner()
    r = runner.invoke(main, ["synth", "--out", str(root / "cohort"), "--studies", "4", "--seed", "0"])
    assert r.exit_code == 0, r.output
    # pseudo-normal pins the pair counts the step layout below relies on (the normative default fits a 4-study
    # cohort with too few normals and falls back to a model that grounds fewer phantom lesions)
    r = runner.invoke(main, ["ils", "build", "--images", str(root / "cohort" / "files"), "--out", str(root / "ils"),
                             "--seed", "0", "--synthesizer", "pseudo-normal"])
    assert r.exit_code == 0, r.output
    return root / "ils", root / "cohort" / "files"


@pytest.fixture(scope="module")
def single(ils_dataset, tmp_path_factory):
    """The uninterrupted one-process run (in this process) every 2-process run must reproduce."""
    dataset, images = ils_dataset
    return train(dataset, tmp_path_factory.mktemp("single") / "ckpt", images=images, seed=0, overrides=SETTINGS,
                 val_split="train", progress=False)


@pytest.fixture(scope="module")
def single_at_2(ils_dataset, tmp_path_factory):
    """The one-process resume state after 2 steps (the run stopped by an error when step 3 starts)."""
    train_module = sys.modules["cxrground.models.lisa.training"]

    def stop(seed, step, micro):
        if step == 2:
            raise KeyboardInterrupt
        return real(seed, step, micro)

    dataset, images = ils_dataset
    out = tmp_path_factory.mktemp("single2") / "ckpt"
    real = train_module._micro_seed
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_module, "_micro_seed", stop)
        with pytest.raises(KeyboardInterrupt):
            train(dataset, out, images=images, seed=0, overrides=SETTINGS, val_split="train", progress=False)
    return _state(out)


@pytest.fixture(scope="module")
def killed(ils_dataset, tmp_path_factory):
    """A 2-process run whose rank 0 was SIGKILLed when step 3 started: (output folder, exit code, log folder)."""
    dataset, images = ils_dataset
    tmp = tmp_path_factory.mktemp("killed")
    rc, logs = _torchrun(tmp, tmp / "ckpt", dataset, images, kill_at=2)
    return tmp / "ckpt", rc, logs


def _torchrun(tmp: Path, out: Path, dataset: Path, images: Path, kill_at: int = 0, settings: dict | None = None,
              allow: str = "") -> tuple[int, Path]:
    """Launch ``ils train`` in 2 gloo processes (``settings``: the ``--set`` options, default :data:`SETTINGS`;
    ``allow``: the worker's ``TEST_ALLOW``); returns the exit code and the per-rank log folder."""
    worker = tmp / "worker.py"
    worker.write_text(WORKER, encoding="utf-8")
    logs = tmp / f"logs-{out.name}-{kill_at}"
    src = str(Path(cxrground.__file__).resolve().parents[1])
    env = {**os.environ, "TEST_OUT": str(out), "KILL_AT": str(kill_at), "OMP_NUM_THREADS": "1", "TEST_ALLOW": allow,
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "ACCELERATE_USE_DEEPSPEED",
                "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE"):
        env.pop(var, None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "--monitor-interval", "0.2", "--log-dir", str(logs), "--redirects", "3", str(worker),
           "ils", "train", "--model", "lisa", "--dataset", str(dataset), "--images", str(images), "--out", str(out),
           "--seed", "0", "--val-split", "train"]
    for key, value in (SETTINGS if settings is None else settings).items():
        cmd += ["--set", f"{key}={value}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    if kill_at == 0:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + _rank_log(logs, 0) + _rank_log(logs, 1)
    return proc.returncode, logs


def _rank_log(logs: Path, rank: int) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted(logs.rglob(f"{rank}/stderr.log")))


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def _assert_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in a)
    assert worst <= TOL, f"weights differ by {worst}"


def _state(folder: Path) -> dict:
    return torch.load(folder / RESUME_FILE, map_location="cpu", weights_only=False)


def test_two_processes_take_the_one_process_steps(killed, single_at_2):
    out, rc, logs = killed
    assert "WRITE-GUARD" not in _rank_log(logs, 1), _rank_log(logs, 1)[-2000:]  # the write guard did not fire
    assert rc != 0 and not (out / "checkpoint.json").exists()  # killed before the end: only the resume state
    mine, ref = _state(out), single_at_2
    assert mine["step"] == ref["step"] == 2
    _assert_close(mine["trainable"], ref["trainable"])
    assert mine["optim"]["state"].keys() == ref["optim"]["state"].keys()
    for k, v in ref["optim"]["state"].items():  # AdamW moments of every trainable tensor
        got = mine["optim"]["state"][k]
        _assert_close({"m": got["exp_avg"], "v": got["exp_avg_sq"]}, {"m": v["exp_avg"], "v": v["exp_avg_sq"]})
        assert float(got["step"]) == float(v["step"]) == 2


def test_killed_two_process_run_resumes_to_the_uninterrupted_result(ils_dataset, single, killed):
    dataset, images = ils_dataset
    out = killed[0]
    _, logs = _torchrun(out.parent, out, dataset, images)
    info = json.loads((out / "checkpoint.json").read_text())
    assert info["step"] == 3 and info["world_size"] == 2
    _assert_close(_weights(out), _weights(single))
    _assert_close(_weights(out / "best"), _weights(single / "best"))
    _assert_close(_state(out)["trainable"], _state(single)["trainable"])
    # sharded validation gathers the one-process metrics. The weights agree to float rounding, so a mask pixel on
    # the threshold can flip: counts match exactly, the loss to 1e-6 and the mask scores to 1e-4
    history, got = _state(single)["history"], _state(out)["history"]
    assert history[0]["n_pos"] == 5 and [h.keys() for h in got] == [h.keys() for h in history]
    close = {"loss": 1e-6, "giou": 1e-4, "ciou": 1e-4}
    for mine, want in zip(got, history, strict=True):
        assert {k: v for k, v in mine.items() if k not in close} == {k: v for k, v in want.items() if k not in close}
        assert all(math.isclose(mine[k], want[k], rel_tol=tol) for k, tol in close.items() if want[k] is not None)
    # rank 1 never wrote under the output folder (its audit hook would have failed the run); rank 0's bar only
    assert "lisa train" in _rank_log(logs, 0) and "lisa train" not in _rank_log(logs, 1)


def test_deepspeed_is_a_clear_config_error(monkeypatch):
    import importlib.util

    real_find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "deepspeed"
                        else real_find(name, *a))
    with pytest.raises(ConfigError, match="deepspeed is not importable"):
        check_deepspeed("deepspeed")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # accelerate launch with the DeepSpeed config
    with pytest.raises(ConfigError, match="deepspeed is not importable"):
        check_deepspeed("auto")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    check_deepspeed("auto")
    with pytest.raises(ConfigError, match="distributed must be one of"):
        LisaConfig.tiny_defaults(distributed="mpi")


def test_one_process_without_launcher_and_ddp_needs_the_launcher_environment(monkeypatch):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    ctx = setup_distributed("auto", cuda=False)
    assert (ctx.world_size, ctx.rank, ctx.active, ctx.device) == (1, 0, False, "cpu")
    assert list(ctx.micro_batches(3)) == [0, 1, 2]
    with pytest.raises(ConfigError, match="torchrun"):
        setup_distributed("ddp", cuda=False)



def test_package_train_is_the_function_after_the_training_module_is_imported():
    import importlib

    import cxrground.models.lisa as lisa

    module = importlib.import_module("cxrground.models.lisa.training")
    assert callable(lisa.train) and lisa.train is not module and module.train is train
