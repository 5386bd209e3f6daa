"""``cxrground detector train``: the VinDr-CXR YOLO lesion detector of ILS §8, trained with ultralytics.

Steps: prepare the dataset folder (:mod:`cxrground.ils.detector.prepare`: class mapping, reader fusion, split,
letterbox, labels, ``data.yaml``), train an ultralytics model from a model yaml (from scratch: nothing is
downloaded) or from a local ``.pt`` (e.g. COCO-pretrained weights you downloaded), evaluate on the held-out
``test`` split, then write ``OUT/vindr_yolo.pt`` with its provenance ``OUT/vindr_yolo.json``.

Output folder ``OUT``::

    data/                  the prepared dataset (see prepare.py)
    run/                   ultralytics' run folder (weights/last.pt, weights/best.pt, results.csv)
    vindr_yolo.pt          the best checkpoint (by ultralytics' fitness on ``val``), for ``--detector yolo``
    vindr_yolo.json        provenance: data hash, classes, split, training settings, val and test metrics

Resumable: a run stopped part-way continues from ``run/weights/last.pt`` (ultralytics' resume, same settings);
a finished one (``vindr_yolo.pt`` present) is reported, not redone, unless ``overwrite``.

ultralytics runs offline here (:func:`ultralytics_offline`): ``YOLO_OFFLINE=1`` (no update, telemetry or hub
calls), its font (``Arial.ttf``, which it downloads when missing) is matplotlib's DejaVu Sans copied into its
settings folder, ``plots=False`` by default, and on a GPU AMP is asked as ``bf16`` (``amp=True`` makes
ultralytics download ``yolo26n.pt`` for its AMP self-check).
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from cxrground.errors import ConfigError, InputError
from cxrground.fields import option
from cxrground.ils.detector.needs import NEEDS_ULTRALYTICS, check_ultralytics
from cxrground.ils.detector.prepare import PreparedData, PrepareSettings, prepare_dataset
from cxrground.io.files import atomic_write_text, sha256_file

__all__ = ["MANAGED_ARGS", "NEEDS_ULTRALYTICS", "WEIGHTS_NAME", "DetectorTrainRequest", "TrainedDetector",
           "check_ultralytics", "train_detector", "ultralytics_args", "ultralytics_offline"]

WEIGHTS_NAME = "vindr_yolo.pt"


@dataclass(frozen=True, kw_only=True)
class DetectorTrainRequest:
    """One training of the VinDr-CXR lesion detector (``cxrground detector train`` offers one option per field)."""

    annotations: Path = option(path="file", help="VinDr-CXR box annotations CSV (image_id, class_name, x_min, "
                               "y_min, x_max, y_max, rad_id; 'No finding' rows for films without boxes).")
    images: Path = option(path="dir", help="Folder searched recursively for <image_id>.dicom/.dcm/.png/.jpg.")
    out: Path = option(path="out_dir", help="Output folder (data/, run/, vindr_yolo.pt, vindr_yolo.json).")
    patients: Path | None = option(None, path="file", help="CSV image_id,patient_id: split by patient "
                                   "(default: by image).")
    classes: str = option("kept", choices=("kept", "all"), help="kept: the ten hyperintense classes of ILS §8; "
                          "all: the fourteen VinDr-CXR box classes.")
    imgsz: int = option(1024, low=32, help="Training size: films letterboxed to imgsz² (a multiple of 32).")
    epochs: int = option(50, low=1, help="Training epochs.")
    batch: int = option(16, low=1, help="Films per batch.")
    model: str = option("yolov8s.yaml", help="ultralytics model yaml (built from scratch) or a local .pt to "
                        "fine-tune (e.g. COCO-pretrained yolov8s.pt).")
    device: str | None = option(None, help="cpu, 0, 0,1... (default: ultralytics' choice).")
    workers: int = option(2, low=0, help="Data-loader workers (also the preparation processes).")
    threads: int = option(1, low=1, help="torch CPU threads (one per worker).")
    val: float = option(0.1, low=0, high=0.9, help="Share of groups in the validation split.")
    test: float = option(0.1, low=0, high=0.9, help="Share of groups in the held-out test split.")
    seed: int = option(0, low=0, help="Seed of the split and of training.")
    fusion_iou: float = option(0.4, low=0, high=1, low_open=True, help="Weighted boxes fusion: IoU at which a "
                               "reader's box joins a fused box.")
    min_readers: int = option(1, low=1, help="Keep a fused box marked by at least this many readers.")
    patience: int = option(50, low=1, help="Stop after this many epochs without a better val fitness.")
    amp: str = option("auto", choices=("auto", "bf16", "fp16", "off"), help="Mixed precision on a GPU (auto: "
                      "bf16; fp16 runs ultralytics' AMP self-check, which downloads yolo26n.pt).")
    plots: bool = option(False, help="Let ultralytics draw its training plots.")
    train_set: dict[str, str] = option(default_factory=dict, flag="--set", metavar="KEY=VALUE",
                                       help="Another ultralytics training argument (repeatable), e.g. lr0=0.01, "
                                       "mosaic=0, cos_lr=true.")
    max_images: int | None = option(None, low=1, help="Use only the first N images by id (quick runs).")
    overwrite: bool = option(False, help="Delete OUT's run and weights and train again (data/ is reused when "
                             "its settings match).")

    def prepare_settings(self) -> PrepareSettings:
        """The dataset settings of this request."""
        classes: Literal["kept", "all"] = "all" if self.classes == "all" else "kept"
        return PrepareSettings(classes=classes, imgsz=self.imgsz, val=self.val, test=self.test, seed=self.seed,
                               fusion_iou=self.fusion_iou, min_readers=self.min_readers)


#: ultralytics arguments that ``detector train`` sets itself (a ``--set`` of one of these is refused).
MANAGED_ARGS = frozenset({"data", "epochs", "imgsz", "batch", "device", "workers", "seed", "project", "name",
                          "exist_ok", "resume", "pretrained", "amp", "plots", "patience", "model", "mode", "task"})


def ultralytics_args(pairs: dict[str, str]) -> dict[str, Any]:
    """``--set`` values typed as YAML would type them (int, float, true/false, none, else the string)."""
    bad = sorted(set(pairs) & MANAGED_ARGS)
    if bad:
        raise ConfigError(f"--set {', '.join(bad)}: set by detector train itself (use its own option)")
    out: dict[str, Any] = {}
    for key, text in pairs.items():
        low = text.lower()
        if low in ("true", "false"):
            out[key] = low == "true"
        elif low in ("none", "null"):
            out[key] = None
        else:
            try:
                out[key] = int(text)
            except ValueError:
                try:
                    out[key] = float(text)
                except ValueError:
                    out[key] = text
    return out


@dataclass
class TrainedDetector:
    """Where the weights are and what was recorded about them."""

    weights: Path
    provenance: dict[str, Any]
    resumed: bool = False
    already_done: bool = False

    def summary_lines(self) -> list[str]:
        """Human-readable summary (printed by the command)."""
        p = self.provenance
        test = p["metrics"].get("test") or {}
        lines = [f"weights: {self.weights}" + (" (already trained; --overwrite to train again)"
                                               if self.already_done else ""),
                 f"provenance: {self.weights.with_suffix('.json')}",
                 f"classes: {', '.join(p['classes'])}",
                 "images: " + ", ".join(f"{k} {v}" for k, v in p["data"]["images"].items())
                 + f" ({p['data']['failures']} failed; data sha256 {p['data']['data_sha256'][:12]})",
                 f"epochs: {p['training']['epochs_done']} of {p['training']['epochs']}"
                 + (" (resumed)" if self.resumed else "")]
        val = p["metrics"].get("val") or {}
        if val:
            lines.append(f"val mAP@0.5: {val.get('mAP50', float('nan')):.3f}")
        if test:
            lines.append(f"test mAP@0.5: {test['mAP50']:.3f} ({test['images']} images)")
        lines.append(f"use: {p['use']}")
        return lines


def ultralytics_offline(config_dir: Path | None = None) -> None:
    """Set ultralytics up to run without a network (see the module docstring); call before importing it."""
    os.environ["YOLO_OFFLINE"] = "1"
    if config_dir is not None and "YOLO_CONFIG_DIR" not in os.environ:
        os.environ["YOLO_CONFIG_DIR"] = str(config_dir)
    from ultralytics.utils import USER_CONFIG_DIR

    font = Path(USER_CONFIG_DIR) / "Arial.ttf"
    if not font.is_file():
        import matplotlib

        font.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(matplotlib.get_data_path()) / "fonts" / "ttf" / "DejaVuSans.ttf", font)


def _import_yolo() -> Any:
    try:
        from ultralytics import YOLO
    except ImportError as exc:
        raise ConfigError(NEEDS_ULTRALYTICS) from exc
    return YOLO


def _amp(request: DetectorTrainRequest) -> bool | str:
    if request.device == "cpu" or (request.device is None and not _cuda()):
        return False
    return {"auto": "bf16", "bf16": "bf16", "fp16": True, "off": False}[request.amp]


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _val_metrics(trainer: Any) -> dict[str, float]:
    raw = dict(getattr(trainer, "metrics", None) or {})
    keys = {"metrics/precision(B)": "precision", "metrics/recall(B)": "recall", "metrics/mAP50(B)": "mAP50",
            "metrics/mAP50-95(B)": "mAP50-95"}
    return {new: round(float(raw[old]), 5) for old, new in keys.items() if old in raw}


def train_detector(request: DetectorTrainRequest) -> TrainedDetector:
    """Prepare, train, evaluate and write the detector (see the module docstring)."""
    out = Path(request.out).absolute()  # ultralytics puts a relative project under its own runs/ folder
    weights = out / WEIGHTS_NAME
    prov_file = weights.with_suffix(".json")
    run_dir = out / "run"
    if request.overwrite:
        for path in (weights, prov_file):
            path.unlink(missing_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    extra = ultralytics_args(request.train_set)
    if weights.is_file() and prov_file.is_file():
        try:
            return TrainedDetector(weights, json.loads(prov_file.read_text(encoding="utf-8")), already_done=True)
        except (UnicodeDecodeError, ValueError) as exc:
            raise InputError(f"provenance of the trained detector is not JSON ({exc}); --overwrite trains again",
                             prov_file) from exc
    check_ultralytics()
    data = prepare_dataset(request.annotations, request.images, out / "data", request.prepare_settings(),
                           patients=request.patients, workers=max(1, request.workers),
                           max_images=request.max_images)
    if data.images["train"] == 0 or data.images["val"] == 0:
        raise ConfigError(f"the train and val splits need images, got {data.images} (check --val/--test and the "
                          f"image folder; failures in {data.folder / 'failures.jsonl'})")
    ultralytics_offline(out / ".ultralytics")
    import torch

    torch.set_num_threads(request.threads)
    YOLO = _import_yolo()
    last = run_dir / "weights" / "last.pt"
    start = time.perf_counter()
    resumed = last.is_file()
    if resumed:
        model = YOLO(str(last))
        try:
            model.train(resume=str(last), device=request.device, workers=request.workers, verbose=False)
        except AssertionError as exc:  # ultralytics: the run in last.pt already reached its epochs
            if "nothing to resume" not in str(exc):
                raise
            model = YOLO(str(last))
    else:
        model = YOLO(request.model)
        model.train(data=str(data.yaml), epochs=request.epochs, imgsz=request.imgsz, batch=request.batch,
                    device=request.device, workers=request.workers, seed=request.seed, deterministic=True,
                    project=str(out), name="run", exist_ok=True, pretrained=request.model.endswith(".pt"),
                    amp=_amp(request), plots=request.plots, patience=request.patience, verbose=False, **extra)
    seconds = time.perf_counter() - start
    trainer = getattr(model, "trainer", None)
    best = run_dir / "weights" / "best.pt"
    shutil.copyfile(best if best.is_file() else last, weights)
    return TrainedDetector(weights, _finish(request, data, weights, trainer, seconds, resumed), resumed=resumed)


def _epochs_done(run_dir: Path) -> int:
    results = run_dir / "results.csv"
    if not results.is_file():
        return 0
    return max(0, len([line for line in results.read_text().splitlines() if line.strip()]) - 1)


def _finish(request: DetectorTrainRequest, data: PreparedData, weights: Path, trainer: Any, seconds: float,
            resumed: bool) -> dict[str, Any]:
    """Evaluate on the test split and write the provenance sidecar."""
    import torch
    import ultralytics

    from cxrground.ils.detector.evaluate import DetectorEvalRequest, evaluate_detector
    from cxrground.ils.spatial.boxes import BOX_CLASS_LESIONS, normalize_class_name

    test = None
    if data.images["test"]:
        report = evaluate_detector(DetectorEvalRequest(weights=weights, data=data.folder, split="test",
                                                       imgsz=request.imgsz, device=request.device))
        test = {"images": report.images, "mAP50": report.map50, "per_class": report.ap50}
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(request).items()}
    prov = {
        "name": "vindr_yolo",
        "weights": weights.name,
        "weights_sha256": sha256_file(weights),
        "classes": list(data.classes),
        "class_lesions": {c: sorted(BOX_CLASS_LESIONS.get(normalize_class_name(c), ())) for c in data.classes},
        "data": {**data.to_dict(), "annotations": str(request.annotations), "images_folder": str(request.images)},
        "split": {"by": "patient" if request.patients else "image", "seed": request.seed, "val": request.val,
                  "test": request.test, "rule": "sha256(seed:group) → test | val | train"},
        "fusion": {"rule": "weighted boxes fusion, equal reader weights, per image and class",
                   "iou": request.fusion_iou, "min_readers": request.min_readers},
        "training": {"model": request.model, "epochs": request.epochs, "epochs_done": _epochs_done(weights.parent
                                                                                                  / "run"),
                     "imgsz": request.imgsz, "batch": request.batch, "device": str(getattr(trainer, "device",
                                                                                           request.device)),
                     "seed": request.seed, "amp": str(_amp(request)), "seconds": round(seconds, 1),
                     "resumed": resumed, "ultralytics": ultralytics.__version__, "torch": torch.__version__,
                     "request": settings},
        "metrics": {"val": _val_metrics(trainer) if trainer is not None else {}, "test": test},
        "use": f"--detector yolo --detector-opt weights_path={weights} --detector-opt imgsz={request.imgsz}",
    }
    atomic_write_text(weights.with_suffix(".json"), json.dumps(prov, indent=1) + "\n")
    return prov
