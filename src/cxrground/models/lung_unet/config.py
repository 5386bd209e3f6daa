"""The lung U-Net training recipe: optimisation settings (:class:`TrainRecipe`) and augmentation ranges."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cxrground.datasets.pack import PACK_HELP
from cxrground.errors import ConfigError
from cxrground.fields import option

__all__ = ["DENSE_BASES", "Augment", "TrainRecipe", "dense_bases_params"]


def dense_bases_params() -> Any:
    """:class:`~cxrground.lesions.lesion_sim.LesionSimParams` of dense basal disease as on portable ARDS films.

    Every film gets lesions, lower zones six times as likely as upper ones; opacities are mostly dense
    airspace (attenuation 0.5–1.3: aerated lung turns as dense as soft tissue), half the chosen bases get an
    effusion up to 40 % of the lung's height with a laterally rising meniscus and fluid spilling up to 15 % of
    the lung's height beyond the lung mask, so that the costophrenic angle and the hemidiaphragm disappear.
    """
    from cxrground.lesions.lesion_sim import LesionSimParams

    return LesionSimParams(**DENSE_BASES)


#: Keyword arguments of :func:`dense_bases_params` (recorded in the sidecar with the recipe).
DENSE_BASES: dict[str, Any] = {
    "p_negative": 0.0, "p_all_zones": 0.15, "lower_bias": 6.0, "p_effusion": 0.5, "p_ground_glass": 0.15,
    "ground_glass_attenuation": (0.2, 0.5), "airspace_attenuation": (0.5, 1.3), "effusion_attenuation": (0.7, 1.4),
    "airspace_cover": (0.5, 1.0), "effusion_height": (0.1, 0.4), "effusion_spill": (0.02, 0.15), "edge": 0.05,
}


@dataclass(frozen=True)
class Augment:
    """On-the-fly augmentation ranges (no flips: right and left matter)."""

    rotate_deg: float = 10.0
    scale: tuple[float, float] = (0.88, 1.12)
    shift: float = 0.06
    """Maximum shift as a fraction of the canvas side."""
    gamma: tuple[float, float] = (0.7, 1.45)
    contrast: tuple[float, float] = (0.8, 1.25)
    brightness: float = 0.08
    enabled: bool = True
    texture_p: float = 0.0
    """Probability per image of each texture augmentation (0: off, the batch's random stream unchanged):
    unsharp / high-pass filtering, then local-contrast normalisation (CLAHE-like), both before the gamma."""
    unsharp_sigma: tuple[float, float] = (0.03, 0.12)
    """Gaussian sigma of the unsharp mask, as a fraction of the canvas side."""
    unsharp_amount: tuple[float, float] = (0.5, 4.0)
    """``x + amount * (x - blur(x))``; at the top of the range the film is mostly its high-pass."""
    local_sigma: tuple[float, float] = (0.04, 0.12)
    """Gaussian sigma of the local mean / standard deviation, as a fraction of the canvas side."""
    local_mix: tuple[float, float] = (0.3, 1.0)
    """Blend of the local-contrast image into the film (1: the local-contrast image alone)."""


@dataclass(frozen=True)
class TrainRecipe:
    """Optimisation settings (see the module docstring)."""

    epochs: int = 40
    batch_size: int = 8
    lr: float = 3e-3
    weight_decay: float = 1e-4
    warmup_epochs: float = 1.0
    val_count: int = 10
    patience: int = 15
    bce_weight: float = 1.0
    dice_weight: float = 1.0
    threads: int = 2
    deterministic: bool = True
    augment: Augment = field(default_factory=Augment)
    max_minutes: float | None = None
    """Stop after the epoch that crosses this wall-clock budget (None: no limit)."""
    synthetic_count: int = 0
    """Synthetic phantoms (indices ``0..n-1`` of ``synthetic_seed``) mixed into the training set (not into
    the validation split, which stays real-only)."""
    synthetic_seed: int = 1
    synthetic_eval_seed: int = 1000
    """Seed of the phantoms the ``synthetic_eval`` metrics use; must differ from ``synthetic_seed``."""
    synthetic_eval_count: int = 40
    init_weights: str | None = None
    """Fine-tune from these weights (a model file name, recorded with its sha256) instead of a fresh init."""
    lesion_copies: int = 0
    """Copies of every real training film with simulated dense basal consolidation / effusion inserted
    (:func:`dense_bases_params`, lung labels unchanged), added to the training split (never to validation)."""
    lesion_seed: int = 0
    device: str = "cpu"
    """``cpu`` or a CUDA device (``cuda``, ``cuda:1``): the model and its batches run there; augmentation draws stay
    on the seeded CPU generator, so the same batches are drawn. Bit-for-bit reruns (``deterministic``) hold on the
    CPU only."""

    def __post_init__(self) -> None:
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ConfigError(f"device must be cpu or a CUDA device (cuda, cuda:N), got {self.device!r}")

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class LungTrainRequest:
    """One training of the lung U-Net: where it goes, how long, from which data and weights (each field documents
    itself, :func:`cxrground.fields.option`; ``cxrground segment train-lungs`` offers one option per field)."""

    out: Path = option(path="out_dir", help="Folder for NAME.safetensors + NAME.json.")
    epochs: int = option(40, low=1, help="Training epochs (the best validation epoch is kept).")
    seed: int = option(0, low=0, help="Seed of the split, the augmentations and the initial weights.")
    pack_dir: Path | None = option(None, flag="--pack", path="out_dir", help=PACK_HELP)
    name: str = option("lung_unet_v1", help="File name of the weights and their sidecar (NAME.safetensors).")
    threads: int = option(1, low=1, help="torch CPU threads (one per worker; the shipped lung_unet_v1 was trained "
                           "with 2, which a byte-identical rebuild needs).")
    no_eval: bool = option(False, help="Skip the evaluation on the CC BY-NC-SA rows.")
    synthetic: int = option(0, low=0, help="Synthetic phantoms mixed into the training split.")
    synthetic_seed: int = option(1, low=0, help="Seed of the training phantoms (the evaluation phantoms use seed "
                                 "1000).")
    init_weights: Path | None = option(None, flag="--init", path="out_file",
                                       help="Fine-tune from these weights (.safetensors with its .json).")
    lr: float = option(3e-3, low=0, low_open=True, help="Peak learning rate (AdamW, linear warm-up then cosine decay).")
    lesion_copies: int = option(0, low=0, help="Copies of each real training film with simulated dense basal "
                                "consolidation/effusion inside the annotated lungs (labels unchanged).")
    lesion_seed: int = option(0, low=0, help="Seed of the simulated lesions.")
    max_minutes: float | None = option(None, help="Stop after the epoch that crosses this many minutes.")
    texture_p: float = option(0.0, low=0, high=1, help="Probability per training image of each texture "
                              "augmentation (unsharp/high-pass filtering, local-contrast normalisation).")
    device: str = option("cpu", help="Where the network trains: cpu, or a CUDA device (cuda, cuda:1); bit-for-bit "
                         "reruns hold on the CPU only.")

    def recipe(self) -> TrainRecipe:
        """The optimisation settings (half a warm-up epoch when fine-tuning from ``init_weights``)."""
        return TrainRecipe(threads=self.threads, lr=self.lr, synthetic_count=self.synthetic,
                           synthetic_seed=self.synthetic_seed, warmup_epochs=0.5 if self.init_weights else 1.0,
                           init_weights=str(self.init_weights) if self.init_weights else None,
                           lesion_copies=self.lesion_copies, lesion_seed=self.lesion_seed,
                           max_minutes=self.max_minutes, augment=Augment(texture_p=self.texture_p),
                           device=self.device)
