"""DeepSpeed ZeRO-2 LISA training (issue 12 item 6, ILS.md §17.4) on the tiny random model, on the CPU
(``DS_ACCELERATOR=cpu``, gloo): 2 processes under torchrun take the one-process steps (weights and AdamW moments),
a ZeRO-2 run killed after step 2 resumes to the uninterrupted result, only rank 0 exports weights and every rank
writes only its own ZeRO shard of the resume state."""

from __future__ import annotations

import copy
import json
import math
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")

import test_models_lisa_distributed as dist_tests  # noqa: E402
from cxrground.errors import ConfigError  # noqa: E402
from cxrground.models.lisa.config import LisaConfig  # noqa: E402
from cxrground.models.lisa.distributed import check_deepspeed, setup_distributed  # noqa: E402
from cxrground.models.lisa.training import RESUME_FILE, ZERO_RESUME_DIR, train  # noqa: E402
from cxrground.models.lisa.zero import STATE_FILE, zero_config  # noqa: E402

# 22 samples per epoch → global batches 8, 8, 6 in micro-batches of 2: with 2 ranks ZeRO-2 accumulates 2 micro-batches
# per rank, and in step 3 rank 1 has 1 and repeats micro-batch 0 with weight 0. grad_clip 1.15 clips step 1 (gradient
# norm 1.19) but not steps 2-3 (1.14, 1.08), so a wrong loss scale shows in the weights and the AdamW moments.
PLAIN = {"tiny": "true", "batch_size": "8", "micro_batch_size": "2", "grad_clip": "1.15", "save_every_steps": "1",
         "val_limit": "5", "threads": "1"}
ZERO = {**PLAIN, "distributed": "deepspeed"}
# what rank != 0 may write under the output folder: the step folders (DeepSpeed creates them on every rank) and its
# own optimiser shard
ALLOW = r"resume/ds(/step_\d{8}(/zero_pp_rank_{rank}_mp_rank_00_optim_states\.pt)?)?"
ils_dataset = dist_tests.ils_dataset  # the tiny synthetic ILS dataset fixture (4 studies, 11 positives)
_rank_log, _torchrun, _weights = dist_tests._rank_log, dist_tests._torchrun, dist_tests._weights
TOL = 1e-5  # weights (float32, lr 1e-3): ZeRO-2 differs from one process by summation order only (measured 1.5e-8)
RTOL = 1e-4  # AdamW moments, relative to the tensor's largest value


@pytest.fixture(scope="module")
def plain(ils_dataset, tmp_path_factory):
    """The uninterrupted one-process run without DeepSpeed: (output folder, its resume state after step 2)."""
    dataset, images = ils_dataset
    out = tmp_path_factory.mktemp("zero_plain") / "ckpt"
    states, real_save = {}, torch.save

    def spy(obj, f, *args, **kwargs):  # keep the resume state of step 2 (the file is overwritten each step)
        if isinstance(obj, dict) and obj.get("step") == 2 and "optim" in obj:
            states[2] = copy.deepcopy(obj)
        return real_save(obj, f, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(torch, "save", spy)
        train(dataset, out, images=images, seed=0, overrides=PLAIN, val_split="train", progress=False)
    return out, states[2]


@pytest.fixture(scope="module")
def zero_killed(ils_dataset, tmp_path_factory):
    """A 2-process ZeRO-2 run whose rank 0 was SIGKILLed when step 3 started: (output folder, exit code, logs)."""
    dataset, images = ils_dataset
    tmp = tmp_path_factory.mktemp("zero_killed")
    rc, logs = _torchrun(tmp, tmp / "ckpt", dataset, images, kill_at=2, settings=ZERO, allow=ALLOW)
    return tmp / "ckpt", rc, logs


@pytest.fixture(scope="module")
def zero_resumed(ils_dataset, zero_killed):
    """The killed run resumed to the end with the same command: (output folder, logs)."""
    dataset, images = ils_dataset
    out = zero_killed[0]
    _, logs = _torchrun(out.parent, out, dataset, images, settings=ZERO, allow=ALLOW)
    return out, logs


def _zero_state(folder: Path) -> dict:
    """The saved ZeRO-2 state ``latest`` points at: trainer state, trainable weights, LR schedule and the AdamW moments
    per parameter name (fragments of the rank shards joined in rank order)."""
    tag = (folder / "latest").read_text().strip()
    model_states = torch.load(folder / tag / "mp_rank_00_model_states.pt", map_location="cpu", weights_only=False)
    moments: dict[str, dict[str, list]] = {}
    for shard in sorted((folder / tag).glob("zero_pp_rank_*_optim_states.pt"), key=lambda p: int(p.name.split("_")[3])):
        opt = torch.load(shard, map_location="cpu", weights_only=False)["optimizer_state_dict"]
        (mapping,), state = opt["param_slice_mappings"], opt["base_optimizer_state"]["state"][0]
        for name, frag in mapping.items():
            for key in ("exp_avg", "exp_avg_sq"):
                flat = state[key].narrow(0, frag.start, frag.numel)
                moments.setdefault(name, {}).setdefault(key, []).append(flat)
        steps = float(state["step"])
    return {**model_states["cxrground"], "module": model_states["module"], "sched": model_states["lr_scheduler"],
            "adam_step": steps, "tag": tag, "moments": {n: {k: torch.cat(v) for k, v in m.items()}
                                                        for n, m in moments.items()}}


def _assert_close(a: dict, b: dict, tol: float = TOL) -> None:
    worst = max(float((a[k].double() - b[k].double()).abs().max()) for k in b)
    assert worst <= tol, f"weights differ by {worst}"


def _assert_moments(zero: dict, ref: dict) -> None:
    """ZeRO-2's AdamW moments equal the one-process optimiser's (a parameter without gradient has zero moments), within
    RTOL of the tensor's largest value plus 1e-6 of the largest over all tensors (for gradients 0 up to rounding)."""
    names = list(ref["trainable"])
    assert set(zero["moments"]) == set(names)
    for key in ("exp_avg", "exp_avg_sq"):
        want = {n: ref["optim"]["state"][i][key].reshape(-1) if i in ref["optim"]["state"]
                else torch.zeros_like(zero["moments"][n][key]) for i, n in enumerate(names)}
        top = max(float(w.abs().max()) for w in want.values())
        for name in names:
            worst = float((zero["moments"][name][key].double() - want[name].double()).abs().max())
            scale = float(want[name].abs().max())
            assert worst <= RTOL * scale + 1e-6 * top, f"{name} {key} differs by {worst} (largest value {scale})"
    assert zero["adam_step"] == float(ref["optim"]["state"][0]["step"])


def test_zero2_two_processes_take_the_one_process_steps(zero_killed, plain):
    out, rc, logs = zero_killed
    assert "WRITE-GUARD" not in _rank_log(logs, 1), _rank_log(logs, 1)[-2000:]
    assert rc != 0 and not (out / "checkpoint.json").exists()  # killed before the end: only the resume state
    assert not (out / RESUME_FILE).exists()
    mine, ref = _zero_state(out / ZERO_RESUME_DIR), plain[1]
    assert mine["step"] == ref["step"] == 2 and mine["tag"] == "step_00000002"
    assert set(ref["trainable"]) <= set(mine["module"])
    _assert_close(mine["module"], ref["trainable"])
    _assert_moments(mine, ref)
    assert mine["sched"]["last_epoch"] == ref["sched"]["last_epoch"] == 2


def test_killed_zero2_run_resumes_to_the_uninterrupted_result(zero_resumed, plain):
    out, _ = zero_resumed
    ref_out = plain[0]
    info, ref_info = (json.loads((o / "checkpoint.json").read_text()) for o in (out, ref_out))
    assert info["step"] == 3 and info["world_size"] == 2 and info["zero_stage"] == 2 and ref_info["zero_stage"] == 0
    _assert_close(_weights(out), _weights(ref_out))
    _assert_close(_weights(out / "best"), _weights(ref_out / "best"))
    ref_state = torch.load(ref_out / RESUME_FILE, map_location="cpu", weights_only=False)
    mine = _zero_state(out / ZERO_RESUME_DIR)
    assert mine["step"] == 3 and mine["epoch"] == 0
    _assert_close(mine["module"], ref_state["trainable"])
    _assert_moments(mine, ref_state)
    # the sharded validation gathers the one-process metrics. The weights agree to float rounding, so a mask pixel
    # on the threshold can flip: counts match exactly, the loss to 1e-6 and the mask scores to 1e-4
    assert [h.keys() for h in mine["history"]] == [h.keys() for h in ref_state["history"]]
    scores = ("giou", "ciou")
    for got, want in zip(mine["history"], ref_state["history"], strict=True):
        assert {k: v for k, v in got.items() if k not in ("loss", *scores)} == \
            {k: v for k, v in want.items() if k not in ("loss", *scores)}
        assert math.isclose(got["loss"], want["loss"], rel_tol=1e-6)
        assert all(math.isclose(got[k], want[k], rel_tol=1e-4) for k in scores if got[k] is not None)


def test_only_rank_0_exports_and_every_rank_writes_only_its_own_shard(zero_killed, zero_resumed):
    out, logs = zero_resumed
    for log in (logs, zero_killed[2]):  # rank 1's write guard allowed only ALLOW (it ends the run otherwise)
        assert "WRITE-GUARD" not in _rank_log(log, 1), _rank_log(log, 1)[-2000:]
    assert "lisa train" in _rank_log(logs, 0) and "lisa train" not in _rank_log(logs, 1)
    ds = out / ZERO_RESUME_DIR
    assert sorted(p.name for p in ds.glob("step_*")) == ["step_00000003"]  # older steps removed
    assert sorted(p.name for p in (ds / "step_00000003").iterdir()) == [
        STATE_FILE, "mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "zero_pp_rank_1_mp_rank_00_optim_states.pt"]
    assert json.loads((ds / "step_00000003" / STATE_FILE).read_text())["world_size"] == 2


def _one_process_env(monkeypatch) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for var, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port), "DS_ACCELERATOR": "cpu"}.items():
        monkeypatch.setenv(var, value)


def test_resume_refuses_another_process_count_identity_or_kind(ils_dataset, zero_resumed, monkeypatch):
    dataset, images = ils_dataset
    out = zero_resumed[0]
    before = sorted(str(p) for p in out.rglob("*"))
    with pytest.raises(ConfigError, match="resume state of a run with DeepSpeed"):  # a run without DeepSpeed
        train(dataset, out, images=images, seed=0, overrides=PLAIN, val_split="train", progress=False)
    _one_process_env(monkeypatch)
    with pytest.raises(ConfigError, match="sharded over 2 processes"):
        train(dataset, out, images=images, seed=0, overrides=ZERO, val_split="train", progress=False)
    with pytest.raises(ConfigError, match="another dataset/seed/configuration"):
        train(dataset, out, images=images, seed=1, overrides=ZERO, val_split="train", progress=False)
    assert sorted(str(p) for p in out.rglob("*")) == before  # nothing written or removed


def test_zero_config_and_deepspeed_detection(monkeypatch):
    cfg = LisaConfig.tiny_defaults(batch_size=8, micro_batch_size=2, grad_clip=0.5)
    ds = zero_config(cfg, 2, torch.float32)
    assert (ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"]) == (8, 2)
    assert ds["gradient_accumulation_steps"] == 2
    assert ds["zero_optimization"]["stage"] == 2 and ds["gradient_clipping"] == 0.5 and not ds["bf16"]["enabled"]
    assert zero_config(cfg, 4, torch.bfloat16)["bf16"]["enabled"]
    with pytest.raises(ConfigError, match="float16"):
        zero_config(cfg, 2, torch.float16)
    with pytest.raises(ConfigError, match="multiple"):
        zero_config(cfg, 3, torch.float32)
    for var in ("ACCELERATE_USE_DEEPSPEED", "CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE", "RANK", "WORLD_SIZE",
                "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR"):
        monkeypatch.delenv(var, raising=False)
    assert check_deepspeed("deepspeed") and not check_deepspeed("auto") and not check_deepspeed("ddp")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # accelerate launch with the DeepSpeed config
    assert check_deepspeed("auto") and not check_deepspeed("ddp")
    monkeypatch.delenv("ACCELERATE_USE_DEEPSPEED")
    for var in ("CROSS_RANK", "CROSS_SIZE", "LOCAL_SIZE"):  # the deepspeed launcher
        monkeypatch.setenv(var, "1" if var != "CROSS_RANK" else "0")
    assert check_deepspeed("auto")
    # without CUDA: DS_ACCELERATOR=cpu is set (then the launcher's environment is missing), another value refused
    with pytest.raises(ConfigError, match="torchrun"):
        setup_distributed("deepspeed", cuda=False)
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with pytest.raises(ConfigError, match="DS_ACCELERATOR='cuda'"):
        setup_distributed("deepspeed", cuda=False)
