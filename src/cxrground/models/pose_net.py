"""Training recipe of the pose reader (:mod:`cxrground.anatomy.segment.pose_net`).

Data: the pack's NIH ChestX-ray14 films and the COVID-19 collection films whose licence allows shipping derived
weights (the rows the lung U-Net trains on). NIH patients (the first 8 characters of the image name) are split with
a seeded generator: ``1 - holdout_fraction`` of them train; the COVID-19 collection's patients likewise by
``cohen_holdout_fraction``, the shippable films of the others train. The held-out films are for validation
(``bench/pose_net.py``) and never read here. Every training film is upright; each
epoch shows it once in each of the eight poses of :data:`~cxrground.anatomy.segment.pose_net.POSE_CLASSES`, the
pose being the label. Per sample, before the pose: with probability ``crop_p`` a crop to a height/width ratio in
``aspect`` (so the letterbox's padding bands are seen: NIH films are square, other sources are not), gamma,
contrast and brightness on [0, 1], grey levels inverted with probability ``invert_p``, the reader's canvas
(letterbox, z-score), then a random affine (rotation, scale, shift). Cross-entropy, AdamW, one warm-up epoch then
cosine decay; the last epoch's weights are kept (nothing is selected on held-out films). Seeded and
deterministic on the CPU for a fixed thread count. The pre-registration that fixed this recipe:
``bench/records/pose_net_preregistration.md``.

Own films (:func:`train_from_folder`, ``cxrground segment train-pose --images DIR``): the same recipe on the frontal
films under a folder, taken to be stored upright. Films that cannot be read, whose view (DICOM header, else the
metadata table) is not PA/AP, or that are no chest film (too small, too elongated, blank) are left out and listed in
``OUT.failures.jsonl``. A seeded split holds out ``holdout_fraction`` of the patients (a ``patient`` / ``patientid``
/ ``subject_id`` column of the table) or, without one, of the films. The current reader screens every film first:
training films it reads as not upright are left out of training (a film stored mirrored and trained as upright
teaches the wrong pose); held-out films are all kept. At the end every held-out film is read upright and in the
seven other poses (:func:`pose_check`, as ``bench/pose_net.py`` reads the pack's held-out films), and the share
flagged per pose goes to the sidecar.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Final

import numpy as np

from cxrground.anatomy.segment.pose_net import (
    POSE_CLASSES,
    PoseNetConfig,
    PoseReader,
    PoseReading,
    apply_pose,
    build_pose_net,
    correction_name,
    pose_canvas,
    read_pose_sidecar,
    save_pose_net,
)
from cxrground.errors import CXRGroundError, Failure, InputError, OptionError
from cxrground.models.torch_state import restores_torch_settings

__all__ = ["FOLDER_HOLDOUT_FRACTION", "MIN_FOLDER_FILMS", "STORED_AS", "CheckRow", "FilmTable", "FolderFilms",
           "FolderTraining", "PoseRecipe", "augment_film", "nih_patient", "pose_check", "pose_check_lines",
           "pose_check_summary", "read_film_table", "read_folder_films", "split_patients", "train_from_folder",
           "train_from_pack", "train_pose_net"]

#: Films are shrunk to this longest side before augmentation (the reader's canvas is 128 px).
WORK_SIDE = 256


@dataclass(frozen=True)
class PoseRecipe:
    """The pose reader's training settings (defaults: the shipped ``pose_net_v1``)."""

    epochs: int = 20
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 1e-4
    warmup_epochs: float = 1.0
    final_lr_fraction: float = 0.01
    seed: int = 0
    threads: int = 2
    holdout_fraction: float = 1 / 3
    #: Share of the COVID-19 collection's patients held out; the shippable films of the others train (None: none
    #: of that collection's films train).
    cohen_holdout_fraction: float | None = 0.5
    crop_p: float = 0.5
    aspect: tuple[float, float] = (0.7, 1.3)
    gamma: tuple[float, float] = (0.7, 1.4)
    contrast: tuple[float, float] = (0.8, 1.25)
    brightness: float = 0.08
    invert_p: float = 0.2
    rotation_deg: float = 10.0
    scale: tuple[float, float] = (0.9, 1.1)
    shift: float = 0.05


def nih_patient(image_name: str) -> str:
    """The NIH ChestX-ray14 patient id of an image name (``00000100_002.png`` → ``00000100``)."""
    return Path(image_name).name[:8]


def split_patients(names: Sequence[str], holdout_fraction: float, seed: int,
                   patient: Callable[[str], str] = nih_patient) -> tuple[list[str], list[str]]:
    """``names`` split by ``patient`` (default: the NIH patient of the name) into (training, held out), seeded;
    each list in the order given."""
    patients = sorted({patient(n) for n in names})
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(patients))
    n_held = round(len(patients) * holdout_fraction)
    held = {patients[i] for i in order[:n_held]}
    return [n for n in names if patient(n) not in held], [n for n in names if patient(n) in held]


def _shrink(pixels: np.ndarray, side: int = WORK_SIDE) -> np.ndarray:
    """Grey uint8 pixels with the longest side at most ``side`` (area resampling)."""
    from PIL import Image

    h, w = pixels.shape
    scale = side / max(h, w)
    if scale >= 1:
        return pixels
    size = (max(1, round(w * scale)), max(1, round(h * scale)))
    return np.asarray(Image.fromarray(pixels).resize(size, Image.Resampling.BOX))


def augment_film(pixels: np.ndarray, recipe: PoseRecipe, rng: np.random.Generator, size: int) -> np.ndarray:
    """One augmented, upright canvas of a grey uint8 film (crop, grey-level changes, letterbox, z-score)."""
    img = pixels
    if rng.random() < recipe.crop_p:
        h, w = img.shape
        ratio = rng.uniform(*recipe.aspect)
        if ratio < h / w:  # keep every column, fewer rows
            rows = max(8, min(h, round(ratio * w)))
            top = int(rng.integers(0, h - rows + 1))
            img = img[top:top + rows]
        else:
            cols = max(8, min(w, round(h / ratio)))
            left = int(rng.integers(0, w - cols + 1))
            img = img[:, left:left + cols]
    x = img.astype(np.float32) / 255.0
    x = np.power(x, rng.uniform(*recipe.gamma))
    mean = float(x.mean())
    x = (x - mean) * rng.uniform(*recipe.contrast) + mean + rng.uniform(-recipe.brightness, recipe.brightness)
    x = np.clip(x, 0.0, 1.0)
    if rng.random() < recipe.invert_p:
        x = 1.0 - x
    return pose_canvas((x * 255.0 + 0.5).astype(np.uint8), size)


def _affine(batch: Any, recipe: PoseRecipe, gen: Any) -> Any:
    """``batch`` (N, 1, S, S) after a random rotation, scale and shift per sample (zero padding)."""
    import torch
    import torch.nn.functional as F

    n = batch.shape[0]
    u = torch.rand((n, 4), generator=gen)
    angle = (u[:, 0] * 2 - 1) * math.radians(recipe.rotation_deg)
    scale = recipe.scale[0] + u[:, 1] * (recipe.scale[1] - recipe.scale[0])
    tx, ty = ((u[:, 2:] * 2 - 1) * recipe.shift * 2).unbind(1)  # grid units: the canvas spans 2
    cos, sin = torch.cos(angle) / scale, torch.sin(angle) / scale
    theta = torch.stack([torch.stack([cos, -sin, tx], 1), torch.stack([sin, cos, ty], 1)], 1)
    grid = F.affine_grid(theta, list(batch.shape), align_corners=False)
    return F.grid_sample(batch, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def _posed(batch: Any, labels: Sequence[int]) -> Any:
    """Each canvas of ``batch`` (N, 1, S, S) stored in the pose of its label."""
    import torch

    out = []
    for canvas, label in zip(batch, labels, strict=True):
        turns, mirrored = POSE_CLASSES[label]
        c = torch.flip(canvas, dims=(2,)) if mirrored else canvas
        out.append(torch.rot90(c, turns, dims=(1, 2)))
    return torch.stack(out)


@restores_torch_settings
def train_pose_net(films: Sequence[tuple[str, np.ndarray]], out: str | Path, recipe: PoseRecipe | None = None,
                   config: PoseNetConfig | None = None, sidecar: dict[str, Any] | None = None,
                   progress: bool = True) -> dict[str, Any]:
    """Train the pose reader on upright grey films ``(name, pixels)``, all of which are training films; write
    ``out.safetensors`` + ``out.json``; return the training record stored in the sidecar."""
    import torch

    from cxrground.io.progress import progress_bar

    recipe = recipe or PoseRecipe()
    config = config or PoseNetConfig()
    if not films:
        raise InputError("pose reader training: no training films")
    torch.set_num_threads(recipe.threads)
    torch.manual_seed(recipe.seed)
    torch.use_deterministic_algorithms(True)
    rng = np.random.default_rng(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    shrunk = [_shrink(p) for _, p in films]
    model = build_pose_net(config)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    pairs = [(i, c) for i in range(len(shrunk)) for c in range(len(POSE_CLASSES))]
    steps_per_epoch = math.ceil(len(pairs) / recipe.batch_size)
    total = steps_per_epoch * recipe.epochs
    warm = max(1, round(steps_per_epoch * recipe.warmup_epochs))

    def lr_at(step: int) -> float:
        if step < warm:
            return recipe.lr * (step + 1) / warm
        t = (step - warm) / max(1, total - warm)
        return recipe.lr * (recipe.final_lr_fraction + (1 - recipe.final_lr_fraction) * 0.5 * (1 + math.cos(
            math.pi * t)))

    history = []
    started = time.monotonic()
    step = 0
    model.train()
    for epoch in range(recipe.epochs):
        order = rng.permutation(len(pairs))
        losses, correct = [], 0
        bar = progress_bar(range(steps_per_epoch), desc=f"pose reader epoch {epoch + 1}/{recipe.epochs}",
                           progress=progress, leave=False)
        for b in bar:
            chosen = [pairs[j] for j in order[b * recipe.batch_size:(b + 1) * recipe.batch_size]]
            canvases = np.stack([augment_film(shrunk[i], recipe, rng, config.input_size) for i, _ in chosen])
            labels = [c for _, c in chosen]
            x = _posed(_affine(torch.from_numpy(canvases)[:, None], recipe, gen), labels)
            y = torch.tensor(labels)
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
            losses.append(loss.item())
            correct += int((logits.argmax(1) == y).sum())
            bar.set_postfix(loss=f"{np.mean(losses):.3f}")
        history.append({"epoch": epoch + 1, "loss": round(float(np.mean(losses)), 4),
                        "train_accuracy": round(correct / len(pairs), 4)})
        if progress:
            print(f"epoch {epoch + 1}: loss {history[-1]['loss']}, training accuracy {history[-1]['train_accuracy']}",
                  flush=True)
    model.eval()
    record = {"recipe": asdict(recipe), "history": history, "seconds": round(time.monotonic() - started, 1),
              "software": {"torch": torch.__version__}}
    save_pose_net(model, config, out, {"training": record, **(sidecar or {})})
    return record


def train_from_pack(pack: Any, out: str | Path, recipe: PoseRecipe | None = None, progress: bool = True
                    ) -> dict[str, Any]:
    """Train the pose reader on the training patients of ``pack``'s NIH films (``pack.nih()``: records with
    ``image_path`` and ``read()``) and, unless ``recipe.cohen_holdout_fraction`` is None, on the shippable COVID-19
    collection films of that collection's training patients (``pack.cohen()``: also ``patient_id``, ``shippable``,
    ``license``); the sidecar lists the training and held-out images of both."""
    recipe = recipe or PoseRecipe()
    records = pack.nih()
    names = [r.image_path.name for r in records]
    train_names, held_names = split_patients(names, recipe.holdout_fraction, recipe.seed)
    chosen = set(train_names)
    films = [(r.image_path.name, r.read().pixels) for r in records if r.image_path.name in chosen]
    data: dict[str, Any] = {
        "source": "NIH ChestX-ray14 films of cxr-pack-v1 (NIH Clinical Center, see the pack's ATTRIBUTION.md)",
        "train_images": train_names, "heldout_images": held_names,
        "train_patients": len({nih_patient(n) for n in train_names}),
        "heldout_patients": len({nih_patient(n) for n in held_names})}
    if recipe.cohen_holdout_fraction is not None:
        cohen = pack.cohen()
        patients = sorted({r.patient_id for r in cohen})
        order = np.random.default_rng(recipe.seed).permutation(len(patients))
        held = {patients[i] for i in order[:round(len(patients) * recipe.cohen_holdout_fraction)]}
        used = [r for r in cohen if r.patient_id not in held and r.shippable]
        films += [(r.image_path.name, r.read().pixels) for r in used]
        data["cohen_train_images"] = [r.image_path.name for r in used]
        data["cohen_heldout_images"] = [r.image_path.name for r in cohen if r.patient_id in held]
        data["cohen_train_licences"] = sorted({r.license for r in used})
        data["cohen_source"] = ("COVID-19 image data collection films of cxr-pack-v1 whose licence allows shipping "
                                "derived weights (see the pack's ATTRIBUTION.md)")
    return train_pose_net(films, out, recipe, sidecar={"data": data}, progress=progress)


# --- the held-out check: films shown in each of the eight poses -------------------------------------------------

#: The poses by the name of the wrong storage (the correction names what puts it right).
STORED_AS: Final[dict[tuple[int, bool], str]] = {
    (0, False): "upright",
    (1, False): "turned 90° counter-clockwise",
    (2, False): "turned 180°",
    (3, False): "turned 90° clockwise",
    (0, True): "mirrored left-right",
    (1, True): "mirrored, turned 90° counter-clockwise",
    (2, True): "flipped top-bottom",
    (3, True): "mirrored, turned 90° clockwise",
}

#: One film's reading in the check: (film, pose read, probability of upright).
CheckRow = tuple[str, tuple[int, bool], float]


def pose_check(reader: PoseReader, films: Sequence[tuple[str, np.ndarray]], batch: int = 16, progress: bool = False,
               label: str = "pose check") -> dict[tuple[int, bool], list[CheckRow]]:
    """Every upright film ``(name, pixels)`` stored in each of the eight poses and read by ``reader``: per true
    pose, (film, pose read, upright probability) of every film, in film order."""
    from cxrground.io.progress import progress_bar

    out: dict[tuple[int, bool], list[CheckRow]] = {p: [] for p in POSE_CLASSES}
    for start in progress_bar(range(0, len(films), batch), desc=label, leave=False, progress=progress):
        chunk = films[start:start + batch]
        for pose in POSE_CLASSES:
            readings = reader.read_many([apply_pose(px, pose) for _, px in chunk])
            out[pose] += [(name, r.pose, r.probabilities[0]) for (name, _), r in zip(chunk, readings, strict=True)]
    return out


def pose_check_summary(results: Mapping[tuple[int, bool], Sequence[CheckRow]]) -> list[dict[str, Any]]:
    """Per true pose of :func:`pose_check`'s results: films, flagged (read as not upright: false alarms for the
    upright films), their share, and (other poses) flagged with the right correction."""
    rows = []
    for pose, readings in results.items():
        flagged = sum(1 for _, read, _ in readings if read != (0, False))
        rows.append({"stored": STORED_AS[pose], "turns_ccw": pose[0], "mirrored": pose[1], "films": len(readings),
                     "flagged": flagged, "flagged_share": round(flagged / max(1, len(readings)), 4),
                     "right_correction": (sum(1 for _, read, _ in readings if read == pose)
                                          if pose != (0, False) else None)})
    return rows


def pose_check_lines(summary: Sequence[Mapping[str, Any]]) -> list[str]:
    """:func:`pose_check_summary` as a Markdown table."""
    lines = ["| stored | films | flagged | share | right correction |", "|---|---:|---:|---:|---:|"]
    for r in summary:
        right = "" if r["right_correction"] is None else r["right_correction"]
        lines.append(f"| {r['stored']} | {r['films']} | {r['flagged']} | "
                     f"{100 * r['flagged'] / max(1, r['films']):.1f} % | {right} |")
    return lines


# --- own films: a folder -----------------------------------------------------------------------------------------

#: Fewest readable frontal films a folder must hold for the reader to be trained on it.
MIN_FOLDER_FILMS: Final[int] = 20
#: Share of a folder's patients (or films) held out by default.
FOLDER_HOLDOUT_FRACTION: Final[float] = 0.2
#: The stage named in the failure records.
STAGE: Final[str] = "train-pose"
#: Columns of a metadata table: the film (its path under the folder or its file name; MIMIC-CXR's ``dicom_id`` is
#: the file name's stem), its view (as the view tables ``anatomy pose --metadata`` reads) and its patient.
_KEY_COLUMNS: Final[tuple[str, ...]] = ("image", "dicom_id")
_VIEW_COLUMNS: Final[tuple[str, ...]] = ("ViewPosition", "view", "view_position")
_PATIENT_COLUMNS: Final[tuple[str, ...]] = ("patient", "patientid", "subjectid")


@dataclass(frozen=True)
class FilmTable:
    """A metadata table's views and patients by film key (the ``image`` or ``dicom_id`` column's value)."""

    path: Path
    views: dict[str, str]
    patients: dict[str, str]
    #: The table's patient column (None: the split is by film).
    patient_column: str | None = None

    @staticmethod
    def _find(values: Mapping[str, str], name: str) -> str | None:
        """The value of the film at ``name`` (its path under the folder): by that path, its file name or its stem."""
        p = PurePosixPath(name)
        return next((values[k] for k in (name, p.name, p.stem) if k in values), None)

    def view(self, name: str) -> str | None:
        """The view the table gives the film at ``name``, or None."""
        return self._find(self.views, name)

    def patient(self, name: str) -> str | None:
        """The patient the table gives the film at ``name``, or None."""
        return self._find(self.patients, name)


def read_film_table(path: str | Path) -> FilmTable:
    """A CSV, plain or gzipped, with an ``image`` column (the film's path under the folder, or its file name) or a
    ``dicom_id`` column (the file name's stem: MIMIC-CXR-JPG's ``mimic-cxr-2.0.0-metadata.csv.gz``), a view column
    (``ViewPosition``, ``view`` or ``view_position``) and optionally a patient column (``patient``, ``patientid``,
    ``patient_id``, ``Patient ID``, ``subject_id``)."""
    from cxrground.datasets.views import read_view_table
    from cxrground.io.files import read_csv_text

    path = Path(path)
    reader = csv.DictReader(io.StringIO(read_csv_text(path, "metadata table")))
    columns = reader.fieldnames or []
    key = next((c for c in _KEY_COLUMNS if c in columns), None)
    view_col = next((c for c in _VIEW_COLUMNS if c in columns), None)
    if key is None or view_col is None:
        raise InputError(f"metadata table needs an image (or dicom_id) column and a view column "
                         f"({', '.join(_VIEW_COLUMNS)}); it has {', '.join(columns) or 'no header'}", path)
    patient_col = next((c for c in columns if re.sub(r"[^a-z]", "", c.lower()) in _PATIENT_COLUMNS), None)
    views: dict[str, str] = {}
    patients: dict[str, str] = {}
    for row in reader:
        film = (row.get(key) or "").strip()
        if not film:
            continue
        view = (row.get(view_col) or "").strip().upper()
        if view and key != "dicom_id":  # MIMIC-CXR's views are read below, as `anatomy pose --metadata` reads them
            views[film] = view
        patient = (row.get(patient_col) or "").strip() if patient_col else ""
        if patient:
            patients[film] = patient
    if key == "dicom_id":
        views = read_view_table(path)
    return FilmTable(path, views, patients, patient_col)


@dataclass
class FolderFilms:
    """The usable films of a folder and what was left out."""

    #: (path under the folder, grey pixels shrunk to :data:`WORK_SIDE`), in path order.
    films: list[tuple[str, np.ndarray]]
    #: Films that were not used, with the reason.
    failures: list[Failure]
    #: The screening reader's reading of each film (empty when not screened).
    screen: dict[str, PoseReading] = field(default_factory=dict)
    #: Image files found in the folder.
    found: int = 0
    #: Why films were left out: ``unreadable``, ``not frontal``, ``view unknown``.
    left_out: Counter[str] = field(default_factory=Counter)


def read_folder_films(images: Path, table: FilmTable | None = None, screen: PoseReader | None = None,
                      max_films: int | None = None, seed: int = 0, progress: bool = True) -> FolderFilms:
    """The frontal films under ``images`` (:func:`~cxrground.io.image.find_images`), each read by the toolkit's image
    reader and screened by ``screen``. A film's view is its DICOM header's, else the ``table``'s; with a table a
    film of unknown view is left out. With ``max_films``, films are tried in a seeded order until that many are
    usable. Problems are :class:`~cxrground.errors.Failure` records, never raised."""
    from cxrground.anatomy.segment.pose_run import film_problem
    from cxrground.datasets.views import is_frontal
    from cxrground.io.image import find_images, read_image
    from cxrground.io.progress import progress_bar

    paths = find_images(images)
    if max_films is not None and max_films < len(paths):
        paths = [paths[i] for i in np.random.default_rng(seed).permutation(len(paths))]
    result = FolderFilms([], [], found=len(paths))
    for path in progress_bar(paths, desc="films", unit="film", progress=progress, leave=False):
        if max_films is not None and len(result.films) >= max_films:
            break
        name = path.relative_to(images).as_posix()
        why = "unreadable"
        try:
            image = read_image(path)
            view = image.view or (table.view(name) if table is not None else None)
            if table is not None and not view:
                why = "view unknown"
                raise InputError(f"no view in the metadata table {table.path.name} or the file: only frontal films "
                                 "train the pose reader", path)
            if view and not is_frontal(view):
                why = "not frontal"
                raise InputError(f"view {view.upper()} is not frontal (PA/AP): the pose reader trains on frontal films",
                                 path)
            problem = film_problem(image.pixels)
            if problem:
                raise InputError(problem, path)
            reading = screen.read(image.pixels) if screen is not None else None
        except (CXRGroundError, OSError) as exc:
            result.failures.append(Failure.from_exception(path, STAGE, exc))
            result.left_out[why] += 1
            continue
        result.films.append((name, _shrink(image.pixels)))
        if reading is not None:
            result.screen[name] = reading
    result.films.sort(key=lambda f: f[0])
    return result


def _reading_record(name: str, reading: PoseReading) -> dict[str, Any]:
    return {"image": name, "correction": reading.correction, "p": round(reading.confidence, 4),
            "p_upright": round(reading.probabilities[0], 4)}


@dataclass
class FolderTraining:
    """What :func:`train_from_folder` did: the sidecar's ``data`` and ``training`` records and the weights."""

    out: Path
    data: dict[str, Any]
    record: dict[str, Any]

    def summary_lines(self) -> list[str]:
        """The training's last epoch and the held-out check, for the command line."""
        last = self.record["history"][-1]
        lines = [f"wrote {self.out}.safetensors: {len(self.record['history'])} epochs in {self.record['seconds']} s "
                 f"on {len(self.data['train_images'])} films, last loss {last['loss']}, training accuracy "
                 f"{last['train_accuracy']}"]
        check = self.data["heldout_check"]
        if not check["films"]:
            return [*lines, "held-out check: no held-out film (--holdout-fraction 0 or too few patients)"]
        rows = {(r["turns_ccw"], r["mirrored"]): r for r in check["poses"]}
        up, mirrored = rows[(0, False)], rows[(0, True)]
        lines += ["", f"held-out check: {check['films']} held-out films, each shown upright and in the seven other "
                      "poses; flagged = read as not upright", *pose_check_lines(check["poses"]), "",
                  f"upright films flagged (false alarms): {up['flagged']} of {up['films']} "
                  f"({100 * up['flagged_share']:.1f} %); mirrored films found: {mirrored['flagged']} of "
                  f"{mirrored['films']} ({100 * mirrored['flagged_share']:.1f} %), "
                  f"{mirrored['right_correction']} read as mirrored left-right"]
        flagged = check["upright_flagged"]
        lines += [f"  upright film flagged: {f['image']} (read as needing '{f['correction']}', P(upright) "
                  f"{f['p_upright']:.3f}{'; the screening reader flags it too' if f['screening_flagged'] else ''})"
                  for f in flagged[:20]]
        if len(flagged) > 20:
            lines.append(f"  ... {len(flagged) - 20} more in {self.out}.json")
        both = sum(1 for f in flagged if f["screening_flagged"])
        if both:
            lines.append(f"{both} of the {len(flagged)} flagged upright films are flagged by the screening reader "
                         "too: look at them, a film stored in a wrong pose counts here as a false alarm")
        return lines


def train_from_folder(images: str | Path, out: str | Path, recipe: PoseRecipe | None = None,
                      table: FilmTable | None = None, screen: PoseReader | None = None,
                      max_films: int | None = None, progress: bool = True,
                      echo: Callable[[str], None] | None = None) -> FolderTraining:
    """Train the pose reader on the frontal films under ``images``, taken to be stored upright (see the module):
    ``recipe.holdout_fraction`` of the patients (``table``'s patient column) or films held out by a seeded split,
    training films ``screen`` reads as not upright left out; write ``out.safetensors``, ``out.json`` and
    ``out.failures.jsonl``; read the held-out films in the eight poses with the new weights and add the result to
    the sidecar. ``echo`` gets a line per step (films, split, screening) before training starts."""
    from cxrground.io.files import atomic_write_text, model_paths, sha256_file

    recipe = recipe or PoseRecipe(holdout_fraction=FOLDER_HOLDOUT_FRACTION, cohen_holdout_fraction=None)
    say = echo or (lambda _line: None)
    images = Path(images)
    weights_path, json_path = model_paths(out)
    stem = weights_path.with_suffix("")
    failures_path = stem.with_name(stem.name + ".failures.jsonl")
    for folder in (weights_path.parent, *weights_path.parent.parents):
        if folder.exists() and not folder.is_dir():
            raise OptionError(f"--out {out}: {folder} is a file, not a folder")
    if screen is not None:
        screen.load()  # weights that cannot be read stop the run before any film is read
    got = read_folder_films(images, table, screen, max_films, recipe.seed, progress)
    why = ", ".join(f"{n} {k}" for k, n in sorted(got.left_out.items()))
    say(f"films: {got.found} found under {images}, {len(got.films)} used"
        + (f" (at most {max_films}, tried in a seeded order)" if max_films is not None else "")
        + (f", {len(got.failures)} left out ({why}; listed in {failures_path})" if got.failures else ""))
    if len(got.films) < MIN_FOLDER_FILMS:
        raise OptionError(f"{images}: {len(got.films)} readable frontal films used"
                          + (f" (--max-films {max_films})" if max_films is not None else "")
                          + f"; training the pose reader needs {MIN_FOLDER_FILMS} at least"
                          + (f" ({len(got.failures)} left out: {why})" if got.failures else ""))

    names = [n for n, _ in got.films]
    by_patient = table is not None and table.patient_column is not None
    patient_of: Callable[[str], str] = (
        (lambda n: table.patient(n) or f"film {n}") if by_patient and table is not None else (lambda n: n))
    train_names, held_names = split_patients(names, recipe.holdout_fraction, recipe.seed, patient=patient_of)
    n_train_p = len({patient_of(n) for n in train_names})
    n_held_p = len({patient_of(n) for n in held_names})
    say(f"split by {'patient' if by_patient else 'film'} (seed {recipe.seed}, held out {recipe.holdout_fraction:g}): "
        f"{len(train_names)} training films"
        + (f" ({n_train_p} patients)" if by_patient else "")
        + f", {len(held_names)} held out" + (f" ({n_held_p} patients)" if by_patient else ""))

    data: dict[str, Any] = {
        "source": "own films (cxrground segment train-pose --images)", "images": str(images),
        "metadata": {"path": str(table.path), "sha256": sha256_file(table.path),
                     "patient_column": table.patient_column} if table is not None else None,
        "films_found": got.found, "max_films": max_films,
        "left_out": {"films": len(got.failures), **dict(sorted(got.left_out.items())),
                     "listed_in": failures_path.name},
        "split": {"by": "patient" if by_patient else "film", "holdout_fraction": recipe.holdout_fraction,
                  "seed": recipe.seed},
    }
    if by_patient:
        data["split"].update(train_patients=n_train_p, heldout_patients=n_held_p)
    if screen is not None:
        meta = read_pose_sidecar(screen.path)
        flagged_train = [n for n in train_names if not got.screen[n].upright]
        flagged_held = [n for n in held_names if not got.screen[n].upright]
        data["screening"] = {
            "weights": meta.get("name"), "sha256": meta.get("sha256"),
            "rule": "training films the reader reads as not upright are left out of training; held-out films are "
                    "all kept",
            "train_flagged": [_reading_record(n, got.screen[n]) for n in flagged_train],
            "heldout_flagged": [_reading_record(n, got.screen[n]) for n in flagged_held]}
        say(f"screening with {meta.get('name')}: {len(flagged_train)} of {len(train_names)} training films read as "
            f"not upright, left out of training (listed in {json_path.name}); {len(flagged_held)} of "
            f"{len(held_names)} held-out films read as not upright (kept for the held-out check)")
    else:
        flagged_train = []
        data["screening"] = None
        say("screening: off (--no-screen), every training film trains")
    left = set(flagged_train)
    data["train_images"] = [n for n in train_names if n not in left]
    data["heldout_images"] = held_names
    pixels = dict(got.films)
    train_films = [(n, pixels[n]) for n in data["train_images"]]
    if not train_films:
        raise OptionError(f"{images}: no training film left after the split and the screening")
    failures_path.parent.mkdir(parents=True, exist_ok=True)  # written once training goes ahead, beside its weights
    atomic_write_text(failures_path, "".join(json.dumps(asdict(f)) + "\n" for f in got.failures))
    record = train_pose_net(train_films, out, recipe, sidecar={"data": data}, progress=progress)

    reader = PoseReader(weights_path, threads=recipe.threads)
    results = pose_check(reader, [(n, pixels[n]) for n in held_names], progress=progress, label="held-out check")
    data["heldout_check"] = {
        "films": len(held_names),
        "read_at": f"longest side {WORK_SIDE} px (as the training films), upright and in the seven other poses",
        "poses": pose_check_summary(results),
        "upright_flagged": [{"image": n, "correction": correction_name(read), "p_upright": round(p, 4),
                             "screening_flagged": None if screen is None else not got.screen[n].upright}
                            for n, read, p in results[(0, False)] if read != (0, False)]}
    meta = read_pose_sidecar(weights_path)
    meta["data"] = data
    atomic_write_text(json_path, json.dumps(meta, indent=2) + "\n")
    return FolderTraining(stem, data, record)
