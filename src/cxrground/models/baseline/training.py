"""Training of the baseline ILS model: balanced sampling, ILS.md §17.3 losses plus head losses, resumable.

Loss per batch: ``w_bce · sigmoid_bce`` (all samples, negatives with an all-zero target) ``+ w_dice ·
dice_loss`` (positives only) ``+ w_presence · BCE(presence)`` ``+ w_lesion · CE(lesion type)`` and ``+
w_certainty · CE(certainty)`` on lesion-inference positives ``+ w_location · BCE(location labels)`` on
positives with a grounded location (every positive teaches the labels of its mask; the head is used only
for global answers). Sampling: :class:`~cxrground.models.sampling.BalancedSampler` (1:1, seeded per epoch).
AdamW, linear warm-up then cosine decay to 1 % of ``lr`` (a pure function of the step, so resuming needs no
scheduler state), gradient clipping.

Determinism: ``torch.manual_seed(seed)`` before building the network, a fixed intra-op thread count
(``config.threads``), ``torch.use_deterministic_algorithms(True)``, data order from the sampler only (no
augmentation, no dropout): the same dataset, configuration and seed give identical weights on one machine.

Checkpoint folder (written atomically after every epoch):

- ``checkpoint.json``: ``{"model": "baseline", "config", "dataset": {"path", "sha256"}, "seed", "split",
  "val_split", "data", "epoch", "step", "history", "best", "created_by"}``; ``data`` gives, per split, the
  pairs in the dataset, those used (their image could be read) and the sha256 of the used pair ids, and in all
  the unreadable images (``failures``) and the pairs they leave out (``pairs_left_out``);
- ``failures.jsonl``: one line per unreadable image (``path``, ``stage`` ``train-images``, ``reason``, ``error``,
  ``split``), rewritten by every run (empty when every image was read);
- ``weights.safetensors``: the selected weights (best validation positive gIoU on the working canvas, or the
  last epoch when there is no validation split) — what :func:`~cxrground.models.baseline.load_model` loads;
- ``weights_last.safetensors``: the weights after the last finished epoch;
- ``train_state.pt``: what a re-run with the same arguments resumes from (the checkpoint record, the last
  weights, optimizer state, torch RNG state). It continues after the last finished epoch and ends with the
  same tensors as an uninterrupted run. A different dataset file (sha256), configuration, seed or split is
  refused (fields an older checkpoint lacks take their defaults; the inference-only ``global_location`` may
  differ), and so is a different set of usable pairs (an image that became readable or unreadable since; a
  checkpoint without ``data`` is resumed without this check).
- ``cache/<split>/``: the films of each split prepared at the working size (memory-mapped ``.npy`` arrays, so a
  split larger than memory trains from disk), kept until every epoch has run: a resumed run over the same pairs
  and films reads them instead of the films (:class:`~cxrground.models.baseline.data.PairTensors`).

Kill safety: an epoch is committed by one atomic write, ``train_state.pt`` (it holds everything a resume
needs); the other three files are derived from it and written after it. A resume first rewrites them from
the committed state, so a kill between any two writes (or inside one) resumes to the same tensors as an
uninterrupted run. A ``train_state.pt`` from before this rule (no record inside) resumes from
``checkpoint.json`` and ``weights_last.safetensors`` as it used to.
"""

from __future__ import annotations

import json
import math
import pickle
import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from cxrground import __version__
from cxrground.errors import ConfigError, InputError
from cxrground.io.files import atomic_path, sha256_file, sha256_json
from cxrground.io.progress import progress_bar
from cxrground.io.weights import load_safetensors
from cxrground.models.base import CHECKPOINT_FILE
from cxrground.models.baseline.config import BaselineConfig
from cxrground.models.baseline.data import (
    PairTensors,
    check_lungs,
    dataset_paths,
    load_pairs,
    lungs_identity,
    make_segmenter,
)
from cxrground.models.baseline.net import CondUNet, build_net, count_parameters
from cxrground.models.losses import dice_loss, sigmoid_bce
from cxrground.models.sampling import BalancedSampler
from cxrground.models.torch_state import restores_torch_settings
from cxrground.models.train_failures import (
    FAILURES_FILE,
    SplitImages,
    check_same_pairs,
    failure_summary,
    no_usable_pairs,
    usable_pairs,
    write_failures,
)

__all__ = ["BEST_WEIGHTS", "CACHE_DIR", "FAILURES_FILE", "LAST_WEIGHTS", "MODEL_NAME", "TRAIN_STATE", "compute_loss",
           "lr_at", "train", "validate"]

#: The folder of the checkpoint where a training keeps its prepared films (:class:`PairTensors` caches, one per
#: split) until it has run all its epochs: a resumed run reads them instead of the films.
CACHE_DIR = "cache"

MODEL_NAME = "baseline"
BEST_WEIGHTS = "weights.safetensors"
LAST_WEIGHTS = "weights_last.safetensors"
TRAIN_STATE = "train_state.pt"


def lr_at(step: int, total: int, config: BaselineConfig) -> float:
    """Learning rate of optimizer step ``step`` (0-based) of ``total``: linear warm-up, cosine to 1 %."""
    if step < config.warmup_steps:
        return config.lr * (step + 1) / config.warmup_steps
    span = max(1, total - config.warmup_steps)
    frac = min(1.0, (step - config.warmup_steps) / span)
    return config.lr * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * frac)))


def compute_loss(out: dict[str, torch.Tensor], batch: dict[str, torch.Tensor],
                 config: BaselineConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """The weighted training loss of one batch and its parts (module docstring)."""
    zero = out["presence"].sum() * 0.0
    parts = {
        "bce": sigmoid_bce(out["mask"], batch["mask"]),
        "dice": dice_loss(out["mask"], batch["mask"]),
        "presence": F.binary_cross_entropy_with_logits(out["presence"], batch["presence"]),
    }
    li = batch["li_lesion"] >= 0
    parts["lesion"] = F.cross_entropy(out["lesion"][li], batch["li_lesion"][li]) if bool(li.any()) else zero
    cert = batch["certainty"] >= 0
    parts["certainty"] = (F.cross_entropy(out["certainty"][cert], batch["certainty"][cert])
                          if bool(cert.any()) else zero)
    loc = batch["location_valid"]
    parts["location"] = (F.binary_cross_entropy_with_logits(out["location"][loc], batch["location"][loc])
                         if bool(loc.any()) else zero)
    weights = {"bce": config.w_bce, "dice": config.w_dice, "presence": config.w_presence,
               "lesion": config.w_lesion, "certainty": config.w_certainty, "location": config.w_location}
    total = sum(weights[k] * v for k, v in parts.items())
    return total, {k: float(v.detach()) for k, v in parts.items()}


@torch.no_grad()
def validate(net: CondUNet, data: PairTensors, batch_size: int) -> dict[str, float | None]:
    """Canvas-level positive gIoU (presence-gated masks), N-Acc and presence accuracy on ``data``."""
    net.eval()
    ious: list[float] = []
    empty_neg: list[bool] = []
    correct = 0
    for start in range(0, len(data), batch_size):
        batch = data.batch(np.arange(start, min(len(data), start + batch_size)))
        out = net(batch["image"], batch["anatomy"], batch["cond"])
        present = out["presence"] > 0
        pred = (out["mask"] > 0) & present[:, None, None]
        gt = batch["mask"] > 0.5
        for p, g, pos in zip(pred, gt, batch["presence"] > 0.5, strict=True):
            if pos:
                union = int((p | g).sum())
                ious.append(int((p & g).sum()) / (union + 1e-5) if union else 1.0)
            else:
                empty_neg.append(not bool(p.any()))
        correct += int((present == (batch["presence"] > 0.5)).sum())
    net.train()
    return {
        "val_gIoU": float(np.mean(ious)) if ious else None,
        "val_N-Acc": float(np.mean(empty_neg)) if empty_neg else None,
        "val_presence_acc": correct / len(data) if len(data) else None,
    }


def _atomic(path: Path, write: Callable[[Path], None]) -> None:
    """Write ``path`` atomically: ``write`` fills a temporary path (:func:`cxrground.io.files.atomic_path`)."""
    with atomic_path(path) as tmp:
        write(tmp)


def _save_weights(state: dict[str, torch.Tensor], path: Path) -> None:
    _atomic(path, lambda p: save_file(state, str(p), metadata={"model": MODEL_NAME}))


def _commit_epoch(out: Path, net: CondUNet, opt: torch.optim.Optimizer, meta: dict[str, Any]) -> None:
    """Commit a finished epoch (one atomic write of the resume state), then write the files derived from it."""
    state = {
        "meta": json.loads(json.dumps(meta)),
        "net": {k: v.detach().contiguous().clone() for k, v in net.state_dict().items()},
        "optimizer": opt.state_dict(), "torch_rng": torch.get_rng_state(), "epoch": meta["epoch"],
    }
    _atomic(out / TRAIN_STATE, lambda p: torch.save(state, p))
    _write_derived(out, state["meta"], state["net"])


def _write_derived(out: Path, meta: dict[str, Any], weights: dict[str, torch.Tensor]) -> None:
    """The selected and last weights and ``checkpoint.json`` of the committed epoch ``meta["epoch"]``."""
    best = meta.get("best")
    if best is not None and best.get("epoch") == meta["epoch"]:
        _save_weights(weights, out / BEST_WEIGHTS)
    _save_weights(weights, out / LAST_WEIGHTS)
    _atomic(out / CHECKPOINT_FILE, lambda p: p.write_text(json.dumps(meta, indent=2), encoding="utf-8"))


def _load_resume_state(out: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor], dict[str, Any]] | None:
    """The committed record, weights and train state of ``out`` (``None`` when there is nothing to resume)."""
    if not (out / TRAIN_STATE).is_file():
        return None
    try:
        state = torch.load(out / TRAIN_STATE, weights_only=True)
    except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"the training state cannot be read ({why}); rerun with --no-resume to train afresh",
                         out / TRAIN_STATE) from None
    if "meta" in state:
        return state["meta"], state["net"], state
    # written before the state held the record: checkpoint.json and weights_last are the committed epoch
    meta_path = out / CHECKPOINT_FILE
    if not meta_path.is_file():
        return None
    return json.loads(meta_path.read_text(encoding="utf-8")), load_safetensors(out / LAST_WEIGHTS), state


#: Configuration fields that only affect inference (a resumed run may change them).
INFERENCE_ONLY = ("global_location",)


def _check_resume(info: dict[str, Any], expect: dict[str, Any], path: Path) -> None:
    if info.get("model") != MODEL_NAME:
        raise ConfigError(f"{path} holds a {info.get('model')!r} checkpoint, not {MODEL_NAME!r}; "
                          "use another --out or --no-resume")
    for key, what in (("dataset", "dataset file (sha256)"), ("config", "configuration"), ("seed", "seed"),
                      ("split", "training split"), ("val_split", "validation split")):
        have, want = info.get(key), expect[key]
        if key == "dataset":
            have, want = (have or {}).get("sha256"), want["sha256"]
        if key == "config" and isinstance(have, dict):
            # older checkpoints lack newer fields (defaults apply); inference-only settings do not matter
            have = {k: v for k, v in BaselineConfig.from_dict(have).to_dict().items() if k not in INFERENCE_ONLY}
            want = {k: v for k, v in want.items() if k not in INFERENCE_ONLY}
        if have != want:
            if key == "config" and isinstance(have, dict):  # name the settings that differ, not two whole records
                keys = sorted(k for k in set(have) | set(want) if have.get(k) != want.get(k))
                have = {k: have.get(k) for k in keys}
                want = {k: want.get(k) for k in keys}
            raise ConfigError(f"cannot resume {path}: the {what} differs from the checkpoint's "
                              f"({have!r} then, {want!r} now); use another --out or --no-resume")


def _splits(split: str, train_pairs: list, train_data: PairTensors, val_split: str | None, val_pairs: list,
            val_data: PairTensors | None) -> list[SplitImages]:
    """The pairs a run trains and validates on, per split, for the shared record of unreadable images
    (:mod:`cxrground.models.train_failures`)."""
    return [SplitImages(name, len(pairs), [p.pair_id for p in data.pairs] if data is not None else [],
                        data.failures if data is not None else [])
            for name, pairs, data in ((split, train_pairs, train_data), (val_split, val_pairs, val_data))
            if name is not None]


def _cache_folder(out: Path, split: str) -> Path:
    """The cache folder of ``split`` under ``out`` (a split name that is no plain word by its hash)."""
    name = split if re.fullmatch(r"[A-Za-z0-9_-]+", split) else sha256_json(split)[:16]
    return out / CACHE_DIR / name


@restores_torch_settings
def train(
    dataset: Path,
    out: Path,
    *,
    images: Path | None = None,
    seed: int = 0,
    overrides: dict[str, Any] | None = None,
    resume: bool = True,
    split: str = "train",
    val_split: str | None = "val",
    progress: bool = True,
    stop_after_epoch: int | None = None,
    log: Callable[[str], None] | None = print,
) -> Path:
    """Train the baseline on ``split`` of ``dataset`` into the checkpoint folder ``out``; returns ``out``.

    ``images``: root the pairs' ``image_path`` is relative to (default: the dataset folder).
    ``overrides``: :class:`BaselineConfig` fields (strings are parsed). ``resume``: continue a checkpoint
    with the same dataset, configuration, seed and splits (else start from scratch, overwriting it).
    ``stop_after_epoch``: stop once that many epochs are finished, as a kill would (the run can be resumed).
    """
    say = log or (lambda _m: None)
    json_path, _ = dataset_paths(dataset)
    if not json_path.is_file():
        raise InputError("is a folder, not the dataset JSON file" if json_path.is_dir() else "dataset JSON not found",
                         json_path)
    config = BaselineConfig().with_overrides(overrides)
    out = Path(out)
    images_root = Path(images) if images is not None else json_path.parent
    meta: dict[str, Any] = {
        "model": MODEL_NAME, "config": config.to_dict(),
        "dataset": {"path": str(json_path.resolve()), "sha256": sha256_file(json_path)},
        "seed": seed, "split": split, "val_split": val_split, "epoch": 0, "step": 0, "history": [],
        "best": None, "created_by": f"cxrground {__version__}",
    }
    segmenter = make_segmenter(config)
    meta["lungs"] = lungs_identity(segmenter)
    saved = _load_resume_state(out) if resume else None
    if saved is not None:
        info, saved_weights, saved_state = saved
        _check_resume(info, meta, out)
        check_lungs(info.get("lungs"), segmenter, f"the checkpoint in {out}")
        if "meta" in saved_state:
            _write_derived(out, info, saved_weights)  # repairs a kill after the commit
        if info["epoch"] >= config.epochs:
            say(f"{out}: training already finished ({info['epoch']} epochs)")
            return out
    out.mkdir(parents=True, exist_ok=True)

    torch.set_num_threads(config.threads)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    train_pairs = load_pairs(json_path, split)  # the split as a stream: memory holds its pair records only
    identity = {"dataset": meta["dataset"]["sha256"], "lungs": meta["lungs"]}
    if not resume:  # --no-resume: the films are prepared afresh too
        shutil.rmtree(out / CACHE_DIR, ignore_errors=True)
    train_data = PairTensors(train_pairs, images_root, config, segmenter, progress, say,
                             cache=_cache_folder(out, split), identity=identity)
    val_pairs = load_pairs(json_path, val_split) if val_split else []
    val_data = PairTensors(val_pairs, images_root, config, segmenter, progress, say,
                           cache=_cache_folder(out, str(val_split)), identity=identity) if val_pairs else None
    if train_data.from_cache:
        say(f"films read from the cache in {out / CACHE_DIR} (made by an earlier run from the same pairs and films)")
    splits = _splits(split, train_pairs, train_data, val_split, val_pairs, val_data)
    meta["data"] = usable_pairs(splits)
    if saved is not None:
        check_same_pairs(info.get("data"), meta["data"], out)
    write_failures(out, splits)
    if summary := failure_summary(meta["data"], out):
        say(summary)
    if not train_data.pairs:
        raise no_usable_pairs(splits[0], json_path, out)
    if not train_data.positives:
        raise InputError(f"split {split!r} has no usable positive pair to train on", json_path)
    sampler = BalancedSampler(train_data.positives, train_data.negatives, seed=seed)
    steps_per_epoch = math.ceil(len(sampler) / config.batch_size)
    total_steps = steps_per_epoch * config.epochs

    net = build_net(config)
    opt = torch.optim.AdamW(net.parameters(), lr=config.lr, betas=(0.9, 0.95), weight_decay=config.weight_decay)
    if saved is not None:
        net.load_state_dict(saved_weights)
        opt.load_state_dict(saved_state["optimizer"])
        torch.set_rng_state(saved_state["torch_rng"])
        meta.update({k: info[k] for k in ("epoch", "step", "history", "best")})
        say(f"resuming {out} after epoch {meta['epoch']}")
    say(f"baseline: {count_parameters(net):,} parameters; {len(train_data)} {split} pairs "
        f"({len(train_data.positives)} positive); {len(sampler)} samples/epoch; "
        f"{len(val_data) if val_data else 0} {val_split or '-'} pairs")
    net.train()
    step = meta["step"]
    for epoch in range(meta["epoch"], config.epochs):
        order = sampler.indices(epoch)
        sums: dict[str, float] = {}
        bar = progress_bar(total=len(order), desc=f"epoch {epoch + 1}/{config.epochs}", unit="sample",
                           progress=progress, leave=False)
        start = time.perf_counter()
        for b in range(0, len(order), config.batch_size):
            batch = train_data.batch(order[b:b + config.batch_size])
            for group in opt.param_groups:
                group["lr"] = lr_at(step, total_steps, config)
            result = net(batch["image"], batch["anatomy"], batch["cond"])
            loss, parts = compute_loss(result, batch, config)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), config.grad_clip)
            opt.step()
            step += 1
            n = len(batch["cond"])
            for k, v in {"loss": float(loss.detach()), **parts}.items():
                sums[k] = sums.get(k, 0.0) + v * n
            bar.update(n)
            bar.set_postfix(loss=f"{float(loss.detach()):.3f}")
        bar.close()
        record: dict[str, Any] = {"epoch": epoch + 1, "step": step, "seconds": round(time.perf_counter() - start, 2)}
        record.update({k: v / len(order) for k, v in sums.items()})
        if val_data is not None:
            record.update(validate(net, val_data, config.batch_size))
        meta["history"].append(record)
        meta["epoch"], meta["step"] = epoch + 1, step
        score = record.get("val_gIoU")
        best = meta["best"]
        if best is None or score is None or (best.get("val_gIoU") is not None and score > best["val_gIoU"]):
            meta["best"] = {"epoch": epoch + 1, "val_gIoU": score}
        _commit_epoch(out, net, opt, meta)
        val = f", val gIoU {score:.3f}" if score is not None else ""
        say(f"epoch {epoch + 1}/{config.epochs}: loss {record['loss']:.4f}{val} ({record['seconds']:.1f} s)")
        if stop_after_epoch is not None and epoch + 1 >= stop_after_epoch and epoch + 1 < config.epochs:
            break
    if meta["epoch"] >= config.epochs:
        del train_data, val_data  # their arrays map the cache's files
        shutil.rmtree(out / CACHE_DIR, ignore_errors=True)  # a finished training needs no prepared films
    return out
