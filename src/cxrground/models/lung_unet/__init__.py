"""The built-in lung U-Net: training on the shippable rows of the data pack, and its evaluation.

Data: ONLY ``pack.cohen(shippable_only=True)`` (CC BY 3.0 / CC BY 4.0 / "authorized for everyone" images
with V7 Labs lung masks, CC BY 4.0) train and select the model; about ``val_count`` of them (whole patients)
are held out for early stopping. The CC BY-NC-SA rows are used for evaluation only, after training, and
never influence the weights. No heart channel is trained (the pack has no heart masks; synthetic phantoms
are too far from real images): the heart is estimated from the lungs (:mod:`.heart`).

Synthetic phantoms (``recipe.synthetic_count``; the project's own data from
:func:`cxrground.datasets.synthetic.generate_study`, no licence restriction) can join the *training* split
(:func:`synthetic_samples`: letterboxed like the real rows, loss weight 1 everywhere). Their lungs stop at
the heart border while the real annotations include the retrocardiac lung, so a model trained on real rows
alone over-segments the phantoms' left lung; mixing them in teaches both conventions (the image tells them
apart). Validation / model selection stays real-only. ``metrics.synthetic_eval`` is the Dice on
``synthetic_eval_count`` phantoms of ``synthetic_eval_seed`` (1000), a seed never used for training.
``recipe.init_weights`` fine-tunes an existing model instead of starting fresh.

Simulated dense bases (``recipe.lesion_copies``, :func:`lesioned_samples`): every real *training* film is added
again ``lesion_copies`` times with lesions from :func:`cxrground.lesions.lesion_sim.simulate_lesions` drawn inside
its annotated lungs on the 256-px canvas (:func:`~cxrground.models.lung_unet.config.dense_bases_params`: mostly
dense airspace consolidation in the lower zones and effusions with a laterally rising meniscus whose fluid spills
beyond the lung mask over the costophrenic angle and the hemidiaphragm), the lung labels unchanged: opacified lung
is still lung. Validation stays on the unmodified real films. Measured with ``bench/segment.py --only-real
--weights`` on the pack (docs: *Real films: anatomy*), a fine-tune of ``lung_unet_v1`` with ``--init
lung_unet_v1.safetensors --lr 1e-3 --synthetic 100 --lesion-copies 2 --epochs 12 --threads 1`` (12 min) is not
better at the bases than ``lung_unet_v1`` and is not shipped.

Texture augmentation (``Augment.texture_p``, ``train-lungs --texture-p``; default 0, off): per training image an
unsharp / high-pass filter and a local-contrast normalisation (:func:`.loop.texture_augment`), so that dense
basal opacity is not told from lung by brightness alone. A fine-tune of ``lung_unet_v1`` with ``--texture-p 0.5
--lesion-copies 2 --synthetic 100`` keeps more opacified bases but fails the heart/CTR checks of its
pre-registration (``bench/records/lung_unet_texture_preregistration.md``) and is not shipped.

Recipe (defaults of :class:`TrainRecipe`): images letterboxed to 256² (``zscore-valid`` normalisation);
on-the-fly augmentation per sample: random affine (rotation ±10°, scale 0.88–1.12, shift ±6 % of the
canvas; never a flip: right and left matter), then gamma 0.7–1.45, contrast 0.8–1.25, brightness ±0.08;
loss = BCE + soft Dice (per image and channel), the annotators' "ignore" regions weighted 0; AdamW
(lr 3e-3, weight decay 1e-4), one warm-up epoch then cosine decay to 1 %; batch 8; 40 epochs; keep the
weights of the epoch with the best validation Dice, stop after ``patience`` (15) epochs without improvement.
These defaults, seed 0 and 2 threads made the first ``lung_unet_v1`` (best epoch 27 of 40; about 8–10 s
per epoch on 2 idle cores, i.e. 5.5–7 min; slower when other processes share the cores).
``lung_unet_v1`` fine-tunes that model (``init_weights``, sha256 ``5de8d3e6…``) with lr 1e-3, warm-up 0.5
epoch, 16 epochs, seed 0, on the same 87 real training rows + 200 phantoms (seed 1, indices 0–199; ~27 s
per epoch, 8.3 min; best real-validation epoch 12): NC Dice 0.915 → 0.932, phantom (seed 1000) left-lung
Dice 0.771 → 0.986. The shipped ``lung_unet_v2`` fine-tunes ``lung_unet_v1`` on one GPU (``device="cuda"``)
with lr 1e-3, 100 phantoms, 3 copies of each real training film with simulated dense bases (lesion seed 0),
texture augmentation p 0.5, 60-epoch cosine schedule, 8 threads, at most 3.5 minutes (33 epochs run in 60 s,
stopped by ``patience``; best validation epoch 18), given only the shippable rows (``bench/devpack.py``), then
evaluated on the CPU (:func:`~cxrground.models.lung_unet.train.evaluate_weights`, ``segment eval-lungs``):
NC Dice median 0.953 (native size). Rule and results: ``bench/records/lung_unet_gpu_preregistration.md``.

Determinism: ``torch.manual_seed(seed)``, a seeded ``torch.Generator`` for augmentation, a seeded numpy
generator for the split, ``torch.use_deterministic_algorithms(True)`` (it works for these CPU ops) and a
fixed thread count: the same seed on the same machine and thread count gives identical weights (on the CPU; a
GPU run is not bit-for-bit repeatable).

The ``pack`` argument is duck-typed (anything with ``cohen(shippable_only=...)`` returning records with
``read()``, ``lungs(shape)``, ``ignore(shape)``, ``image_id``, ``patient_id``, ``license``, ``shippable``)
so that :mod:`cxrground.anatomy` does not import :mod:`cxrground.datasets` (a later stage).

Modules: :mod:`.config` (recipe), :mod:`.data` (rows, phantoms, samples, patient split), :mod:`.loop` (the
torch training loop), :mod:`.evaluate` (Dice), :mod:`.train` (:func:`train_lung_unet`, model + sidecar).
torch is imported only when training or evaluation runs.
"""

from cxrground.models.lung_unet.config import Augment, TrainRecipe
from cxrground.models.lung_unet.data import (
    PhantomRecord,
    Samples,
    concat_samples,
    lesioned_samples,
    phantom_records,
    prepare_samples,
    split_by_patient,
    synthetic_samples,
)
from cxrground.models.lung_unet.evaluate import dice, evaluate_records, evaluate_synthetic
from cxrground.models.lung_unet.loop import train_on_samples
from cxrground.models.lung_unet.train import TrainResult, train_lung_unet

__all__ = [
    "Augment",
    "PhantomRecord",
    "Samples",
    "TrainRecipe",
    "TrainResult",
    "concat_samples",
    "dice",
    "evaluate_records",
    "evaluate_synthetic",
    "lesioned_samples",
    "phantom_records",
    "prepare_samples",
    "split_by_patient",
    "synthetic_samples",
    "train_lung_unet",
    "train_on_samples",
]
