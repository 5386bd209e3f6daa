"""Training of the built-in lung U-Net on the pack's shippable rows (:func:`train_lung_unet`), with provenance.

Writes ``NAME.safetensors`` and its sidecar ``NAME.json`` (recipe, data with licences, history, metrics of
the weights as stored); see :mod:`cxrground.models.lung_unet` for the data rules and the recipe.
"""

from __future__ import annotations

import dataclasses
import platform
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cxrground.anatomy.segment.unet import UNetConfig
from cxrground.errors import ConfigError
from cxrground.models.lung_unet.config import DENSE_BASES, LungTrainRequest, TrainRecipe, dense_bases_params
from cxrground.models.lung_unet.data import (
    LungPack,
    LungRecord,
    concat_samples,
    lesioned_samples,
    prepare_samples,
    split_by_patient,
    synthetic_samples,
)
from cxrground.models.lung_unet.evaluate import evaluate_records, evaluate_synthetic, without_per_image
from cxrground.models.lung_unet.loop import train_on_samples

__all__ = ["TrainResult", "train_lung_unet", "train_request"]


@dataclass
class TrainResult:
    """What :func:`train_lung_unet` produced."""

    weights_path: Path
    sidecar_path: Path
    metrics: dict[str, Any]
    history: list[dict[str, float]]
    train_seconds: float
    sidecar: dict[str, Any]

    def summary_lines(self) -> list[str]:
        """What was written, the training time and the Dice figures (validation, NC rows, phantoms)."""
        m = self.metrics
        lines = [f"wrote {self.weights_path} and {self.sidecar_path}",
                 f"training: {len(self.history)} epochs, {self.train_seconds:.0f} s",
                 f"validation (shippable hold-out) canvas Dice: {m.get('val_canvas_dice_best')}"]
        nc = m.get("nc_eval")
        if nc:
            lines.append(f"NC evaluation rows ({nc['n']}): Dice mean {nc['dice_mean']:.4f} "
                         f"(right {nc['dice_right_mean']:.4f}, left {nc['dice_left_mean']:.4f})")
        syn = m.get("synthetic_eval")
        if syn:
            lines.append(f"synthetic phantoms ({syn['n']}, never trained on): Dice mean {syn['dice_mean']:.4f} "
                         f"(right {syn['dice_right_mean']:.4f}, left {syn['dice_left_mean']:.4f})")
        return lines


def _synthetic_entry(seed: int, n: int, config: Any, use: str) -> dict[str, Any]:
    from cxrground.datasets.synthetic import SynthConfig
    from cxrground.datasets.synthetic.config import GENERATOR_NAME, GENERATOR_VERSION

    cfg = config or SynthConfig()
    return {"generator": GENERATOR_NAME, "generator_version": GENERATOR_VERSION, "config_hash": cfg.config_hash(),
            "config": "SynthConfig() defaults" if config is None else "custom SynthConfig",
            "seed": int(seed), "indices": f"0..{int(n) - 1}", "count": int(n),
            "license": "the project's own synthetic phantoms (no licence restriction)", "use": use}


def _record_entry(rec: LungRecord) -> dict[str, str]:
    return {"image": rec.image_id, "patient": rec.patient_id, "license": rec.license,
            "source_url": rec.source_url, "doi": rec.doi}


def _licence_counts(records: Iterable[LungRecord]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in records:
        out[r.license] = out.get(r.license, 0) + 1
    return dict(sorted(out.items()))


def train_lung_unet(
    pack: LungPack,
    out_dir: str | Path,
    epochs: int = 40,
    seed: int = 0,
    *,
    recipe: TrainRecipe | None = None,
    config: UNetConfig | None = None,
    name: str = "lung_unet_v1",
    evaluate: bool = True,
    progress: bool = True,
    storage_dtype: str = "float16",
    limit: int | None = None,
    synth_config: Any = None,
) -> TrainResult:
    """Train the lung U-Net on the pack's shippable rows, evaluate on the NC rows, write model + sidecar.

    ``epochs`` overrides ``recipe.epochs``. ``limit`` (tests) caps the number of training images.
    ``recipe.synthetic_count`` phantoms of ``recipe.synthetic_seed`` (``synth_config``, default
    ``SynthConfig()``) join the training split; ``recipe.synthetic_eval_count`` phantoms of
    ``recipe.synthetic_eval_seed`` are evaluated (``metrics.synthetic_eval``). ``recipe.init_weights``
    fine-tunes from an existing model file. Writes ``out_dir/NAME.safetensors`` and ``out_dir/NAME.json``.
    """
    import torch

    from cxrground.anatomy.segment.heart import HEART_METHOD
    from cxrground.anatomy.segment.unet import save_model, update_sidecar

    recipe = recipe or TrainRecipe()
    recipe = dataclasses.replace(recipe, epochs=int(epochs))
    config = config or UNetConfig()
    if recipe.synthetic_count and recipe.synthetic_eval_count and recipe.synthetic_seed == recipe.synthetic_eval_seed:
        raise ConfigError(f"synthetic training seed {recipe.synthetic_seed} is also the evaluation seed")
    init_state, init_info = None, None
    if recipe.init_weights:
        from cxrground.anatomy.segment.unet import load_model

        init_model, init_meta = load_model(recipe.init_weights)
        if UNetConfig.from_dict(init_meta["architecture"]) != config:
            raise ConfigError(f"{recipe.init_weights}: architecture differs from the training config")
        init_state = {k: v.clone() for k, v in init_model.state_dict().items()}
        init_training = init_meta.get("training", {})
        init_info = {"name": init_meta.get("name"), "sha256": init_meta.get("sha256"),
                     "training": {k: init_training[k] for k in ("recipe", "seed", "epochs_run", "train_seconds", "init")
                                  if k in init_training},
                     "metrics": {k: without_per_image(v) if isinstance(v, dict) else v
                                 for k, v in init_meta.get("metrics", {}).items()}}
    shippable = [r for r in pack.cohen(shippable_only=True) if r.shippable]
    if limit is not None:
        shippable = shippable[: int(limit)]
    if len(shippable) < 2:
        raise ConfigError(f"need at least 2 shippable training images, found {len(shippable)}")
    train_idx, val_idx = split_by_patient(shippable, min(recipe.val_count, len(shippable) // 2), seed)
    t0 = time.perf_counter()
    samples = prepare_samples(shippable, config.input_size, progress=progress)
    train_s, val_s = samples.subset(train_idx), samples.subset(val_idx)
    if recipe.lesion_copies:
        train_s = concat_samples(train_s, lesioned_samples(train_s, recipe.lesion_copies, recipe.lesion_seed,
                                                           dense_bases_params()))
    if recipe.synthetic_count:
        synth = synthetic_samples(recipe.synthetic_count, recipe.synthetic_seed, synth_config, config.input_size,
                                  progress=progress)
        train_s = concat_samples(train_s, synth)
    load_seconds = time.perf_counter() - t0
    model, history = train_on_samples(train_s, val_s, config, recipe, seed=seed, progress=progress,
                                      init_state=init_state)
    train_seconds = history[-1]["seconds"] if history else 0.0
    best = max((h for h in history if "val_dice" in h), key=lambda h: h["val_dice"], default=None)
    eval_records: list[LungRecord] = []
    if evaluate:
        eval_records = [r for r in pack.cohen(shippable_only=False) if not r.shippable]
        if limit is not None:
            eval_records = eval_records[: int(limit)]

    sidecar = {
        "name": name,
        "training": {
            "recipe": recipe.to_dict(),
            "seed": seed,
            "epochs_run": len(history),
            "train_seconds": round(train_seconds, 1),
            "load_seconds": round(load_seconds, 1),
            "history": [{k: round(v, 5) for k, v in h.items()} for h in history],
            "loss": "BCE + soft Dice (per image and channel), ignore regions weighted 0",
            "selection": "weights of the epoch with the best validation Dice (canvas, logit > 0)",
            "deterministic": recipe.deterministic and recipe.device == "cpu",
            "hardware": _hardware(recipe),
            "init": init_info or "fresh initialisation (torch defaults, seeded)",
        },
        "data": {
            "summary": (f"{len(train_idx)} train + {len(val_idx)} validation images from cxr-pack-v1 cohen/ "
                        f"rows with licences {sorted(_licence_counts(shippable))}"
                        + (f" + {recipe.synthetic_count} synthetic phantoms (train only)" if recipe.synthetic_count
                           else "")
                        + (f" + {recipe.lesion_copies} lesioned copies of each real training film (train only)"
                           if recipe.lesion_copies else "")
                        + "; NC rows for evaluation only"),
            "collection": "COVID-19 image data collection, Cohen, Morrison, Dao, arXiv:2003.11597 (2020)",
            "masks": "V7 Labs COVID-19 X-ray annotations (lung masks), CC BY 4.0; split into right/left lungs",
            "train": [_record_entry(shippable[i]) for i in train_idx],
            "validation": [_record_entry(shippable[i]) for i in val_idx],
            "train_licences": _licence_counts(shippable),
            "evaluation": {
                "rows": len(eval_records),
                "licences": _licence_counts(eval_records),
                "use": "evaluation only (non-commercial licences); never used for training or model selection",
            },
            "lesion_augment": ({
                "copies": recipe.lesion_copies, "seed": recipe.lesion_seed,
                "simulator": "cxrground.lesions.lesion_sim.simulate_lesions on the 256-px canvas",
                "params": {k: list(v) if isinstance(v, tuple) else v for k, v in DENSE_BASES.items()},
                "use": "training split only: the real training films again with simulated dense basal "
                       "consolidation / effusion inside the annotated lungs, lung labels unchanged",
            } if recipe.lesion_copies else None),
            "synthetic_train": (_synthetic_entry(recipe.synthetic_seed, recipe.synthetic_count, synth_config,
                                                 "training split only (not validation / model selection)")
                                if recipe.synthetic_count else None),
            "synthetic_eval": (_synthetic_entry(recipe.synthetic_eval_seed, recipe.synthetic_eval_count,
                                                synth_config, "evaluation only (metrics.synthetic_eval)")
                               if evaluate and recipe.synthetic_eval_count else None),
        },
        "metrics": {},
        "heart": f"not predicted; estimated from the lungs ({HEART_METHOD}), heart_source='estimate'",
        "software": {"torch": torch.__version__, "python": platform.python_version()},
    }
    out = Path(out_dir)
    weights_path, json_path = save_model(model, config, out / name, sidecar, storage_dtype=storage_dtype)

    metrics: dict[str, Any] = {
        "val_canvas_dice_best": round(best["val_dice"], 4) if best else None,
        "best_epoch": int(best["epoch"]) if best else None,
    }
    if evaluate:
        metrics.update(_evaluation(weights_path, [shippable[i] for i in val_idx], eval_records, recipe,
                                   synth_config, progress))
    final = update_sidecar(json_path, {"metrics": metrics})
    return TrainResult(weights_path, json_path, metrics, history, train_seconds, final)


def _evaluation(weights_path: Path, val_records: Sequence[LungRecord], eval_records: Sequence[LungRecord],
                recipe: TrainRecipe, synth_config: Any, progress: bool) -> dict[str, Any]:
    """``val_native``, ``nc_eval`` and ``synthetic_eval`` of the weights as stored (float16 storage), through the
    segmenter users get."""
    from cxrground.anatomy.segment.builtin import UNetLungSegmenter

    segmenter = UNetLungSegmenter(weights_path, estimate_heart=False)
    metrics: dict[str, Any] = {"val_native": without_per_image(evaluate_records(segmenter, val_records))}
    t1 = time.perf_counter()
    nc = evaluate_records(segmenter, eval_records, progress=progress)
    nc["seconds"] = round(time.perf_counter() - t1, 1)
    metrics["nc_eval"] = nc
    if recipe.synthetic_eval_count:
        t1 = time.perf_counter()
        syn = evaluate_synthetic(segmenter, recipe.synthetic_eval_count, recipe.synthetic_eval_seed, synth_config,
                                 progress=progress)
        syn["seconds"] = round(time.perf_counter() - t1, 1)
        metrics["synthetic_eval"] = syn
    return metrics


def evaluate_weights(pack: LungPack, weights: str | Path, progress: bool = True,
                     synth_config: Any = None) -> dict[str, Any]:
    """Evaluate trained lung weights as training does (a run with ``--no-eval``, e.g. on a GPU machine without the
    CC BY-NC-SA rows) and add the metrics to their sidecar; returns the metrics.

    The validation films are the training run's own (same split, seed and ``val_count`` from the sidecar's
    recipe); the evaluation films are the pack's rows whose licence forbids training (``nc_eval``); the phantoms
    are ``synthetic_eval_count`` of ``synthetic_eval_seed``. Metrics already in the sidecar are kept unless
    recomputed."""
    from cxrground.anatomy.segment.unet import read_sidecar, update_sidecar

    weights_path = Path(weights)
    json_path = weights_path.with_suffix(".json")
    meta = read_sidecar(json_path)
    training = meta.get("training", {})
    fields = {f.name for f in dataclasses.fields(TrainRecipe)}
    raw = {k: v for k, v in training.get("recipe", {}).items() if k in fields and k != "augment"}
    recipe = TrainRecipe(**raw)
    shippable = [r for r in pack.cohen(shippable_only=True) if r.shippable]
    seed = int(training.get("seed", 0))
    _, val_idx = split_by_patient(shippable, min(recipe.val_count, len(shippable) // 2), seed)
    eval_records = [r for r in pack.cohen(shippable_only=False) if not r.shippable]
    metrics = {**meta.get("metrics", {}),
               **_evaluation(weights_path, [shippable[i] for i in val_idx], eval_records, recipe, synth_config,
                             progress)}
    update_sidecar(json_path, {"metrics": metrics})
    return metrics


def train_request(request: LungTrainRequest) -> TrainResult:
    """Train (and, unless ``no_eval``, evaluate) the lung U-Net as the request says, on the pack it names."""
    from cxrground.datasets.pack import Pack

    return train_lung_unet(Pack(request.pack_dir), request.out, epochs=request.epochs, seed=request.seed,
                           name=request.name, recipe=request.recipe(), evaluate=not request.no_eval)


def _hardware(recipe: TrainRecipe) -> str:
    """Where the network trained, for the sidecar."""
    import torch

    if recipe.device == "cpu":
        return f"CPU, {recipe.threads} threads, {platform.machine()}"
    return f"{torch.cuda.get_device_name(torch.device(recipe.device))} ({recipe.device}), torch {torch.__version__}"
