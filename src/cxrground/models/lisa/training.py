"""Training of the LISA model on an ILS dataset (ILS.md §17.3–17.4), resumable and deterministic for a seed.

- Start: ``tiny=True`` → random tiny architecture and tokenizer (seeded); otherwise ``base_model`` = a cxrground
  LISA checkpoint folder (e.g. from ``cxrground ils convert-lisa``) or a released-layout folder converted in memory
  (``sam_checkpoint`` / ``clip`` fill what it does not store).
- LoRA + trainable parts per :func:`~cxrground.models.lisa.model.prepare_for_training`; AdamW; linear warm-up from
  0 over ``warmup_steps`` then linear decay to 0 at the last step; gradient clipping; global batch
  ``batch_size`` by accumulation over ``micro_batch_size``; gradient checkpointing on CUDA.
- Precision (``dtype``; ``auto`` = bfloat16 on CUDA, float32 on CPU): float32 runs everything in float32. With a
  half dtype (bfloat16, float16), outside DeepSpeed, the frozen weights are stored in that dtype while the trainable
  parameters (LoRA, ``embed_tokens``, ``lm_head``, mask decoder, ``text_hidden_fcs``) and the AdamW state stay
  float32, and the forward passes (training and validation) run under ``torch.autocast`` in that dtype (CUDA or
  CPU): the standard mixed-precision recipe, so small updates are not rounded away (:func:`setup_precision`).
  DeepSpeed casts the whole model and keeps its own float32 master weights and AdamW state. float16 runs without
  loss scaling. Checkpoint folders store the merged weights in the training dtype.
- Mask losses: over each sample's un-padded region of the SAM canvas (its resized size travels with the batch),
  as in the reference.
- Sampling: :class:`~cxrground.models.sampling.BalancedSampler` seeded with ``seed`` (1:1, epoch = 2 × #positives);
  step ``s`` of epoch ``e`` takes positions ``[s·B, (s+1)·B)`` of that epoch's order. Histogram equalisation
  (p = ``hist_eq_p``) draws from a generator seeded by ``(seed, step, position)`` and dropout from one seeded by
  ``(seed, step, micro-batch)``, so a resumed run repeats the uninterrupted one.
- Data parallelism (:mod:`~cxrground.models.lisa.distributed`): launched by ``torchrun`` / ``accelerate launch``
  (``WORLD_SIZE`` > 1) or with ``distributed=ddp``, rank ``r`` of ``W`` computes micro-batches ``r, r+W, …`` of
  every global batch and the gradients are summed over the ranks before the one optimiser step, so ``W``
  processes give the one-process result (up to float summation order). Validation is sharded by micro-batch
  and gathered. Only rank 0 writes checkpoints and the resume state and shows the progress bar; every rank
  resumes from the same state.
- DeepSpeed ZeRO-2 (:mod:`~cxrground.models.lisa.zero`; ``distributed=deepspeed`` or a DeepSpeed launch): the same
  batches, order and seeding through a ZeRO-2 engine (gradients and AdamW state sharded over the ranks), each rank
  running the same number of micro-batches; the resume state is DeepSpeed's, under ``out/resume/ds/``, written
  by every rank (its own shard).
- Checkpoints: ``out/`` = last (written at the end), ``out/best/`` = best val positive gIoU (teacher-forced,
  native resolution) over the epoch ends, ``out/resume/state.pt`` = trainable weights (as trained: float32 under
  mixed precision; a state with bfloat16 weights and AdamW moments is cast to the parameters' dtype on loading)
  + optimiser + scheduler + step, written every ``save_every_steps`` steps and at each epoch end
  (``out/resume/ds/`` with DeepSpeed). A different dataset hash, seed or configuration than the saved state's, or
  the other kind of resume state (DeepSpeed or not), refuses to resume (:class:`ConfigError`); a run with
  ``resume=False`` removes the other kind.
- Unreadable images: before training, every image of the training split and of the validation split (up to
  ``val_limit`` usable pairs) is read once (:func:`~cxrground.io.image.read_image`, as training reads it; in a
  data-parallel run each rank reads its share and the results are gathered). One that is missing, empty, truncated
  or not an image is recorded and its pairs are left out, as the baseline does
  (:mod:`~cxrground.models.train_failures`): ``out/failures.jsonl`` (one line per image with its split, written when
  the run starts), ``data`` in ``checkpoint.json`` (pairs per split, pairs used, images failed, pairs left out) and
  one printed line. A split with no readable image is an :class:`~cxrground.errors.InputError` naming the dataset
  and the first failure. The resume state holds ``data`` (and its identity the sha256 of the pair ids used,
  ``pairs``), so a resume after an image became readable or unreadable is refused, naming the splits that changed.
"""

from __future__ import annotations

import contextlib
import math
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from cxrground.errors import ConfigError, Failure, InputError
from cxrground.ils.frames import read_native_mask
from cxrground.ils.schema import read_dataset
from cxrground.io.files import atomic_path, sha256_file, sha256_json
from cxrground.io.image import read_image
from cxrground.io.progress import progress_bar
from cxrground.models.base import CHECKPOINT_FILE
from cxrground.models.lisa.checkpoint import load_checkpoint, save_checkpoint
from cxrground.models.lisa.config import LisaConfig
from cxrground.models.lisa.distributed import (
    DistContext,
    all_reduce_gradients,
    all_reduce_sum,
    broadcast_parameters,
    gather_in_order,
    setup_distributed,
)
from cxrground.models.lisa.infer import model_inputs, teacher_forced_masks
from cxrground.models.lisa.model import LisaForSegmentation, prepare_for_training, tiny_arch
from cxrground.models.lisa.preprocess import equalize, gt_mask_canvas
from cxrground.models.lisa.text import encode, seg_token_id, tiny_tokenizer
from cxrground.models.lisa.zero import RESUME_DIR as ZERO_RESUME_DIR
from cxrground.models.lisa.zero import ZeroEngine, same_identity
from cxrground.models.sampling import BalancedSampler
from cxrground.models.torch_state import restores_torch_settings
from cxrground.models.train_failures import (
    FAILURES_FILE,
    SplitImages,
    check_same_pairs,
    failure_summary,
    image_failure,
    no_usable_pairs,
    usable_pairs,
    write_failures,
)

__all__ = ["FAILURES_FILE", "RESUME_FILE", "ZERO_RESUME_DIR", "Sample", "autocast", "build_model", "check_fit",
           "load_samples", "lr_factor", "setup_precision", "train", "validate"]

RESUME_FILE = "resume/state.pt"


@dataclass(frozen=True)
class Sample:
    """One instruction-answer pair of the dataset."""

    pair_id: str
    image: Path
    instruction: str
    answer: str
    mask: Path | None
    released_size: int | None = None
    """The side of the dataset's released-frame masks (its ``mask_frame.json`` says so), None otherwise."""


def _dataset_json(dataset: Path) -> Path:
    from cxrground.ils.layout import DATASET_FILE

    return dataset if dataset.is_file() else dataset / DATASET_FILE


def _studies(dataset: Path, images: Path, split: str) -> list[tuple[Path, list[Sample]]]:
    """Per study of ``split`` in file order: its image and its pairs (positives then negatives; a positive pair's mask
    is its ``seg_mask_path``). A dataset file the shared check (:func:`~cxrground.ils.schema.read_dataset`) refuses
    is an :class:`~cxrground.errors.InputError` naming it."""
    from cxrground.ils.frames import released_side
    from cxrground.ils.layout import MASK_DIR

    json_path = _dataset_json(dataset)
    data = read_dataset(json_path)
    mask_root = json_path.parent / MASK_DIR
    released = released_side(json_path)
    studies = []
    for study in data.get(split, {}).values():
        image = images / study["image_path"]
        pairs = study["instruction_answer_pairs"]
        studies.append((image, [Sample(pair["pair_id"], image, pair["instruction"], pair["answer"],
                                       mask_root / pair["seg_mask_path"] if positive else None, released)
                                for pair, positive in [(p, True) for p in pairs.get("positive_pairs", [])]
                                + [(p, False) for p in pairs.get("negative_pairs", [])]]))
    return studies


def _image_failures(paths: list[Path], ctx: DistContext, progress: bool) -> list[Failure | None]:
    """Per image: ``None`` when it can be read, else its failure. Each rank reads images ``r, r+W, …`` and every
    rank gets the whole list."""
    mine = {i: image_failure(paths[i]) for i in progress_bar(ctx.micro_batches(len(paths)), desc="check images",
                                                             unit="img", progress=progress and ctx.is_main)}
    return gather_in_order(ctx, mine, len(paths))


def _readable(studies: list[tuple[Path, list[Sample]]], split: str, limit: int | None, ctx: DistContext,
              progress: bool) -> tuple[list[Sample], SplitImages]:
    """The pairs of the studies whose image can be read (the first ``limit`` of them, reading no more images than
    that needs) and what the split could use (:class:`~cxrground.models.train_failures.SplitImages`)."""
    samples: list[Sample] = []
    failures: list[Failure] = []
    looked, start = 0, 0
    while start < len(studies) and (limit is None or len(samples) < limit):
        end, n = start, 0
        while end < len(studies) and (limit is None or len(samples) + n < limit):
            n += len(studies[end][1])
            end += 1
        chunk = studies[start:end]
        for (_, pairs), failure in zip(chunk, _image_failures([image for image, _ in chunk], ctx, progress),
                                       strict=True):
            looked += len(pairs)
            if failure is None:
                samples += pairs
            else:
                failures.append(failure)
        start = end
    if limit is not None:
        looked -= max(0, len(samples) - limit)
        samples = samples[:limit]
    return samples, SplitImages(split, looked, [s.pair_id for s in samples], failures)


def load_samples(dataset: Path, images: Path, split: str, *, limit: int | None = None, ctx: DistContext | None = None,
                 progress: bool = False) -> tuple[list[Sample], list[Failure]]:
    """Pairs of ``split`` (positives then negatives per study; a positive pair's mask is its ``seg_mask_path``)
    whose image can be read, the first ``limit`` of them; every image that cannot be read (missing, empty, truncated,
    not an image) is a failure and its pairs are left out. A dataset file the shared check
    (:func:`~cxrground.ils.schema.read_dataset`) refuses is an :class:`~cxrground.errors.InputError` naming it.
    ``ctx``: in a data-parallel run each rank reads its share of the images."""
    samples, used = _readable(_studies(dataset, images, split), split, limit, ctx or DistContext(), progress)
    return samples, list(used.failures)


def lr_factor(step: int, warmup: int, total: int) -> float:
    """LR multiplier of optimiser step ``step`` (0-based): 0→1 linearly over ``warmup`` steps, then →0 at ``total``."""
    if warmup > 0 and step < warmup:
        return step / warmup
    return max(0.0, (total - step) / max(1, total - warmup))


def build_model(config: LisaConfig, seed: int) -> tuple[LisaForSegmentation, Any, dict[str, Any]]:
    """The starting model, tokenizer and extra checkpoint info (see the module docstring)."""
    if config.tiny:
        torch.manual_seed(seed)
        tok = tiny_tokenizer()
        arch = tiny_arch(len(tok), config.sam_image_size)
        return LisaForSegmentation(arch, seg_token_id(tok), config.mm_vision_select_layer), tok, {"arch": arch}
    base = Path(str(config.base_model))
    if (base / CHECKPOINT_FILE).is_file():
        model, tok, info = load_checkpoint(base)
        return model, tok, {"arch": info["arch"]}
    from cxrground.models.lisa.convert import load_released_model

    model, tok, report = load_released_model(
        base, sam=Path(config.sam_checkpoint) if config.sam_checkpoint else None,
        clip=Path(config.clip) if config.clip else None,
        tokenizer=Path(config.tokenizer) if config.tokenizer else None)
    return model, tok, {"arch": report["arch"]}


def _dtype(config: LisaConfig, device: str) -> torch.dtype:
    if config.dtype != "auto":
        return getattr(torch, config.dtype)
    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def setup_precision(model: torch.nn.Module, config: LisaConfig, device: str, deepspeed: bool = False
                    ) -> torch.dtype | None:
    """Move ``model`` (trainable parts already set) to ``device`` in its training precision; returns the
    autocast dtype of its forward passes (None: none).

    float32: everything float32, no autocast. A half dtype with ``deepspeed``: the whole model in that dtype (the
    engine keeps float32 master weights and AdamW state). A half dtype otherwise: the frozen weights in that dtype,
    the trainable parameters in float32 (so AdamW updates and keeps its state in float32), forward under
    :func:`autocast` in that dtype.
    """
    dtype = _dtype(config, device)
    model.to(device=device, dtype=dtype)
    if deepspeed or dtype == torch.float32:
        return None
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.float()
    return dtype


def autocast(device: str, dtype: torch.dtype | None) -> contextlib.AbstractContextManager:
    """``torch.autocast`` on ``device``'s type in ``dtype`` (a no-op context for None)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=torch.device(device).type, dtype=dtype)


def _micro_seed(seed: int, step: int, micro: int) -> int:
    """Torch seed of micro-batch ``micro`` of optimiser step ``step`` (dropout), the same on any rank."""
    return int(np.random.SeedSequence((seed, step, micro)).generate_state(1)[0])


def _batch(model: LisaForSegmentation, tok: Any, config: LisaConfig, samples: list[Sample], seed: int, step: int,
           positions: range, device: str
           ) -> tuple[list, torch.Tensor, torch.Tensor, torch.Tensor, list[tuple[int, int]]]:
    """The model's inputs for ``samples``: encoded texts, CLIP and SAM pixels, GT canvases and each sample's resized
    size on the SAM canvas (the region the mask losses cover)."""
    enc, clips, sams, gts, valid = [], [], [], [], []
    max_text = config.max_length - (model.n_image_tokens - 1)
    for pos, s in zip(positions, samples, strict=True):
        grey = read_image(s.image).pixels
        rng = np.random.default_rng((seed, step, pos))
        if rng.random() < config.hist_eq_p:
            grey = equalize(grey)
        c, sp, box = model_inputs(model, config, grey)
        mask = read_native_mask(s.mask, grey.shape, s.released_size) if s.mask is not None else None
        enc.append(encode(tok, s.instruction, s.answer, max_text))
        clips.append(c)
        sams.append(sp)
        gts.append(gt_mask_canvas(mask, box))
        valid.append(box.resized_hw)
    as_t = lambda arrays: torch.as_tensor(np.stack(arrays), device=device)  # noqa: E731
    return enc, as_t(clips), as_t(sams), as_t(gts), valid


def check_fit(tok: Any, config: LisaConfig, n_image_tokens: int, samples: list[Sample], where: Path) -> None:
    """Refuse pairs whose [SEG] token falls beyond ``config.max_length`` (with the image tokens): the mask decoder
    reads the [SEG] embedding, so such a pair can be neither trained nor scored."""
    max_text = config.max_length - (n_image_tokens - 1)
    seg = seg_token_id(tok)
    texts = {(s.instruction, s.answer): s.pair_id for s in samples}
    cut = [pid for (ins, ans), pid in texts.items() if seg not in encode(tok, ins, ans, max_text).input_ids]
    if cut:
        raise InputError(f"{len(cut)} distinct instruction-answer texts lose their [SEG] token at max_length="
                         f"{config.max_length} ({n_image_tokens} image tokens), e.g. pair {cut[0]}; raise max_length "
                         f"(--set max_length=N)", where)


def _chunk_scores(model: LisaForSegmentation, tok: Any, config: LisaConfig, chunk: list[Sample], device: str
                  ) -> list[tuple[int, int] | bool]:
    """Per sample of one validation micro-batch: ``(intersection, union)`` for a positive, "mask empty" for a
    negative."""
    greys = [read_image(s.image).pixels for s in chunk]
    preds = teacher_forced_masks(model, tok, config, [(g, s.instruction, s.answer) for g, s in
                                                      zip(greys, chunk, strict=True)], device)
    scores: list[tuple[int, int] | bool] = []
    for s, g, p in zip(chunk, greys, preds, strict=True):
        if s.mask is None:
            scores.append(not bool(p.any()))
            continue
        gt = read_native_mask(s.mask, g.shape, s.released_size)
        scores.append((int((p & gt).sum()), int((p | gt).sum())))
    return scores


def validate(model: LisaForSegmentation, tok: Any, config: LisaConfig, samples: list[Sample], device: str,
             ctx: DistContext | None = None) -> dict[str, float | int | None]:
    """Teacher-forced validation at native resolution: positive gIoU, cIoU and negative N-Acc.

    ``ctx``: in a data-parallel run each rank scores micro-batches ``r, r+W, …`` and every rank gets the
    metrics of the whole set (the same micro-batches as in one process, hence the same numbers).
    """
    ctx = ctx or DistContext(device=device)
    was_training = model.training
    model.eval()
    mb = config.micro_batch_size
    n_chunks = math.ceil(len(samples) / mb)
    mine = {c: _chunk_scores(model, tok, config, samples[c * mb:(c + 1) * mb], device)
            for c in ctx.micro_batches(n_chunks)}
    model.train(was_training)
    scores = [x for chunk in gather_in_order(ctx, mine, n_chunks) for x in chunk]
    pos = [x for x in scores if isinstance(x, tuple)]
    negs = [x for x in scores if not isinstance(x, tuple)]
    ious = [inter / union if union else 1.0 for inter, union in pos]
    inter_sum, union_sum = sum(i for i, _ in pos), sum(u for _, u in pos)
    neg_ok, n_neg = sum(negs), len(negs)
    return {"giou": float(np.mean(ious)) if ious else None, "ciou": inter_sum / union_sum if union_sum else None,
            "n_acc": neg_ok / n_neg if n_neg else None, "n_pos": len(ious), "n_neg": n_neg}


def _trainable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def _accumulate(model: LisaForSegmentation, tok: Any, config: LisaConfig, samples: list[Sample], chosen: list[int],
                first: int, seed: int, step: int, ctx: DistContext, zero: ZeroEngine | None = None,
                amp: torch.dtype | None = None) -> torch.Tensor:
    """Forward/backward this rank's micro-batches of one global batch (gradients accumulate in ``.grad``, each
    micro-batch weighted by its share of the global batch); returns the summed ``len × (total, txt, bce, dice)``.
    ``amp``: the autocast dtype of the forward passes (:func:`setup_precision`).

    ``zero``: through the DeepSpeed ZeRO-2 engine, every rank running ``ctx.micro_rounds`` micro-batches, a rank short
    of one repeating micro-batch 0 with weight 0 (:mod:`~cxrground.models.lisa.zero`).
    """
    weights = (config.w_txt, config.w_bce, config.w_dice)
    mb = config.micro_batch_size
    n_micro = math.ceil(len(chosen) / mb)
    mine: list[int | None] = list(ctx.micro_batches(n_micro))
    if zero is not None:
        mine += [None] * (ctx.micro_rounds(n_micro) - len(mine))
    parts = torch.zeros(4, dtype=torch.float64)
    for k, micro in enumerate(mine):
        m0 = (micro or 0) * mb
        idx = chosen[m0:m0 + mb]
        torch.manual_seed(_micro_seed(seed, step, micro or 0))
        batch = _batch(model, tok, config, [samples[i] for i in idx], seed, step,
                       range(first + m0, first + m0 + len(idx)), ctx.device)
        if zero is None:
            with autocast(ctx.device, amp):
                loss = model(*batch, weights=weights)
            (loss.total * len(idx) / len(chosen)).backward()
        else:
            loss = zero.forward(batch, weights)
            share = len(idx) / len(chosen) if micro is not None else 0.0
            zero.backward(loss.total, share, last=k == len(mine) - 1)
        if micro is not None:
            parts += torch.tensor([float(t.detach()) for t in (loss.total, loss.txt, loss.bce, loss.dice)],
                                  dtype=torch.float64) * len(idx)
    return parts


def _check_resume_kind(out: Path, zero: bool, resume: bool, is_main: bool) -> None:
    """Refuse to resume from the other kind of resume state (DeepSpeed or not); without resuming, rank 0 removes it."""
    plain, ds = out / RESUME_FILE, out / ZERO_RESUME_DIR
    other = plain if zero else ds
    if not other.exists():
        return
    if resume:
        raise ConfigError(f"{other} is the resume state of a run {'without' if zero else 'with'} DeepSpeed; resume it "
                          f"with distributed={'auto/ddp' if zero else 'deepspeed'}, or use a new --out or --no-resume")
    if is_main and other.is_dir():
        shutil.rmtree(other)
    elif is_main:
        other.unlink()


@restores_torch_settings
def train(dataset: Path, out: Path, *, images: Path | None = None, seed: int = 0,
          overrides: dict[str, Any] | None = None, resume: bool = True, split: str = "train",
          val_split: str | None = "val", progress: bool = True, log: Callable[[str], None] | None = print) -> Path:
    """Train (or resume) and write the checkpoint folder ``out``; returns ``out`` (see the module docstring).

    ``progress``: show the progress bars (rank 0 only in a data-parallel run). ``log``: where rank 0 says how many
    images could not be read (None: nowhere).
    """
    config = LisaConfig.from_overrides(overrides)
    dataset, out = Path(dataset), Path(out)
    json_path = _dataset_json(dataset)
    if not json_path.is_file():
        raise InputError("dataset JSON not found", json_path)
    ctx = setup_distributed(config.distributed, torch.cuda.is_available())
    try:
        return _train(ctx, config, json_path, dataset, out, images=images, seed=seed, resume=resume, split=split,
                      val_split=val_split, progress=progress, log=log)
    finally:
        ctx.close()


def _train(ctx: DistContext, config: LisaConfig, json_path: Path, dataset: Path, out: Path, *, images: Path | None,
           seed: int, resume: bool, split: str, val_split: str | None, progress: bool,
           log: Callable[[str], None] | None) -> Path:
    """The training run of :func:`train` in this process (one rank of ``ctx``)."""
    images = Path(images) if images is not None else json_path.parent
    dataset_hash = sha256_file(json_path)
    samples, train_split = _readable(_studies(dataset, images, split), split, None, ctx, progress)
    splits = [train_split]
    if val_split == split:
        val_samples = samples[:config.val_limit] if config.val_limit is not None else samples
    elif val_split:
        val_samples, val_used = _readable(_studies(dataset, images, val_split), val_split, config.val_limit, ctx,
                                          progress)
        splits.append(val_used)
    else:
        val_samples = []
    data = usable_pairs(splits)
    # the process layout does not change the result, so a run may resume with another one
    config_id = {k: v for k, v in config.to_dict().items() if k != "distributed"}
    identity = {"dataset_hash": dataset_hash, "seed": seed, "config": config_id, "split": split,
                "pairs": sha256_json([s.pair_id for s in samples + val_samples])}
    state_path = out / RESUME_FILE
    _check_resume_kind(out, ctx.deepspeed, resume, ctx.is_main)
    state = None
    if resume and ctx.deepspeed:
        saved = ZeroEngine.saved_meta(out / ZERO_RESUME_DIR)
        check_same_pairs(saved.get("data") if saved else None, data, out)
    elif resume and state_path.is_file():
        try:
            state = torch.load(state_path, map_location="cpu", weights_only=False)
        except (RuntimeError, EOFError, OSError, ValueError, pickle.UnpicklingError) as exc:
            why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise InputError(f"the training state cannot be read ({why}); rerun with --no-resume to train afresh",
                             state_path) from None
        check_same_pairs(state.get("data"), data, out)
        if not same_identity(state["identity"], identity):
            raise ConfigError(f"{state_path} was written for another dataset/seed/configuration or another set of "
                              f"pairs with a readable image (see {out / FAILURES_FILE}); use a new --out or "
                              "--no-resume")
    if ctx.is_main:
        write_failures(out, splits)
        if log is not None and (line := failure_summary(data, out)):
            log(line)
    if not samples:
        raise no_usable_pairs(train_split, json_path, out)
    positives = [i for i, s in enumerate(samples) if s.mask is not None]
    negatives = [i for i, s in enumerate(samples) if s.mask is None]
    if not positives:
        raise InputError(f"split {split!r} has no positive pair with a readable image", json_path)
    if config.threads:
        torch.set_num_threads(config.threads)

    model, tok, extra = build_model(config, seed)
    check_fit(tok, config, model.n_image_tokens, samples + val_samples, json_path)
    targets = prepare_for_training(model, config.lora_r, config.lora_alpha, config.lora_dropout)
    device = ctx.device
    amp = setup_precision(model, config, device, ctx.deepspeed)
    save_dtype = _dtype(config, device)
    if config.gradient_checkpointing and device.startswith("cuda"):
        model.language_model.gradient_checkpointing_enable()
    params = [p for p in model.parameters() if p.requires_grad]
    broadcast_parameters(ctx, params)
    optim = torch.optim.AdamW(params, lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    sampler = BalancedSampler(positives, negatives, seed=seed)
    steps_per_epoch = math.ceil(len(sampler) / config.batch_size)
    total = config.max_steps or config.epochs * steps_per_epoch
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: lr_factor(s, config.warmup_steps, total))
    zero = ZeroEngine.create(model, optim, sched, config, ctx) if ctx.deepspeed else None
    step, best, history = 0, None, []
    if resume and zero is not None:
        trainer = zero.load(out / ZERO_RESUME_DIR, identity)
        if trainer is not None:
            step, best, history = trainer["step"], trainer["best"], trainer["history"]
    elif state is not None:
        # a state written with bfloat16 trainable weights and AdamW moments is cast to the parameters' dtype here
        model.load_state_dict(state["trainable"], strict=False)
        optim.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        step, best, history = state["step"], state["best"], state["history"]

    def info(at_step: int) -> dict[str, Any]:
        return {**extra, **identity, "config": config.to_dict(), "step": at_step, "total_steps": total,
                "select_layer": model.select_layer, "lora_targets": targets, "best_val": best, "history": history,
                "data": data, "train_pairs": len(samples),
                "world_size": ctx.world_size, "zero_stage": 2 if zero is not None else 0}

    def save_state() -> None:
        if zero is not None:
            trainer = {"step": step, "epoch": (step - 1) // steps_per_epoch, "best": best, "history": history}
            zero.save(out / ZERO_RESUME_DIR, step, trainer, identity, data)
            return
        if not ctx.is_main:
            return
        with atomic_path(state_path) as tmp:
            torch.save({"identity": identity, "data": data, "trainable": _trainable_state(model),
                        "optim": optim.state_dict(), "sched": sched.state_dict(), "step": step, "best": best,
                        "history": history}, tmp)

    model.train()
    model.visual_model.vision_encoder.eval()
    bar = progress_bar(total=total, initial=step, desc="lisa train", unit="step", dynamic_ncols=True,
                       progress=progress and ctx.is_main)
    while step < total:
        epoch, in_epoch = divmod(step, steps_per_epoch)
        order = sampler.indices(epoch)
        first = in_epoch * config.batch_size
        chosen = order[first:first + config.batch_size]
        if zero is None:
            optim.zero_grad(set_to_none=True)
            parts = _accumulate(model, tok, config, samples, chosen, first, seed, step, ctx, amp=amp)
            all_reduce_gradients(ctx, params)
            parts = (all_reduce_sum(ctx, parts) / len(chosen)).tolist()
            torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            optim.step()
            sched.step()
        else:
            parts = _accumulate(model, tok, config, samples, chosen, first, seed, step, ctx, zero)
            parts = (all_reduce_sum(ctx, parts) / len(chosen)).tolist()
            zero.step()
        step += 1
        bar.set_postfix(loss=f"{parts[0]:.4f}", txt=f"{parts[1]:.3f}", bce=f"{parts[2]:.3f}", dice=f"{parts[3]:.3f}")
        bar.update(1)
        end_of_epoch = step % steps_per_epoch == 0 or step == total
        if end_of_epoch and val_samples:
            with autocast(device, amp):
                metrics = validate(model, tok, config, val_samples, device, ctx)
            history.append({"step": step, "epoch": epoch, "loss": float(parts[0]), **metrics})
            if metrics["giou"] is not None and (best is None or metrics["giou"] > best["giou"]):
                best = {"step": step, **metrics}
                if ctx.is_main:
                    save_checkpoint(out / "best", model, tok, info(step), dtype=save_dtype)
        if end_of_epoch or step % config.save_every_steps == 0:
            save_state()
    bar.close()
    if ctx.is_main:
        save_checkpoint(out, model, tok, info(step), dtype=save_dtype)
    ctx.barrier()
    return out
