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

Resumable: a run stopped part-way continues from ``run/weights/last.pt`` (ultralytics' resume) where ``OUT`` is
now, with the training settings it was started with, recorded in ``run/started_with.json`` before ultralytics
starts (:func:`started_with`: epochs, seed, model, amp, every ``--set`` argument). A resume asking for other values,
or leaving out or adding a ``--set``, is refused naming each (:func:`started_changes`; a run started before that
record existed is compared with ultralytics' ``args.yaml`` on the arguments asked for); ``--batch`` and
``--patience`` are applied. A finished one (``vindr_yolo.pt`` present) is reported, not redone, unless
``overwrite``, and refused the same way when asked for with other training settings. A run whose data/ was
prepared from other annotations, patients, films or settings is refused; ``overwrite`` checks everything first,
then prepares data/ again where it differs, then deletes the old run and weights.

ultralytics runs offline (:func:`~cxrground.ils.detector.needs.ultralytics_offline`, shared with ``detector
evaluate`` and ``ils build --detector yolo``); here its settings and font live in ``OUT/.ultralytics``,
``plots=False`` by default, ``--model`` is a model yaml or a local ``.pt`` (never a name to download), and on a
GPU AMP is asked as ``bf16`` (``amp=True`` makes ultralytics download ``yolo26n.pt`` for its AMP self-check).
"""

from __future__ import annotations

import csv
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from cxrground.errors import ConfigError, InputError
from cxrground.fields import option
from cxrground.ils.detector.evaluate import metric_text
from cxrground.ils.detector.needs import NEEDS_ULTRALYTICS, check_ultralytics, ultralytics_offline
from cxrground.ils.detector.prepare import (
    WEIGHTS_NAME,
    PreparedData,
    PreparedInputs,
    PrepareSettings,
    prepare_dataset,
    prepared_changes,
)
from cxrground.io.files import atomic_write_text, finite_json, read_json_object, sha256_file

__all__ = ["MANAGED_ARGS", "NEEDS_ULTRALYTICS", "STARTED_FILE", "WEIGHTS_NAME", "DetectorTrainRequest",
           "TrainedDetector", "check_ultralytics", "started_changes", "started_with", "train_detector",
           "ultralytics_args", "ultralytics_offline"]

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
    model: str = option("yolov8s.yaml", help="ultralytics model yaml (built from scratch) or the path of a local "
                        ".pt to fine-tune (e.g. COCO-pretrained yolov8s.pt you downloaded; nothing is downloaded).")
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
    overwrite: bool = option(False, help="Train again: once the inputs are checked, prepare data/ again if its "
                             "annotations, patients, films or settings differ (else reuse it), then delete OUT's "
                             "run and weights.")

    def prepare_settings(self) -> PrepareSettings:
        """The dataset settings of this request."""
        classes: Literal["kept", "all"] = "all" if self.classes == "all" else "kept"
        return PrepareSettings(classes=classes, imgsz=self.imgsz, val=self.val, test=self.test, seed=self.seed,
                               fusion_iou=self.fusion_iou, min_readers=self.min_readers,
                               by_patient=self.patients is not None)


#: ultralytics arguments that ``detector train`` sets itself (a ``--set`` of one of these is refused).
MANAGED_ARGS = frozenset({"data", "epochs", "imgsz", "batch", "device", "workers", "seed", "project", "name",
                          "exist_ok", "resume", "pretrained", "amp", "plots", "patience", "model", "mode", "task",
                          "verbose", "save_dir"})
#: ultralytics arguments ``detector train`` sets unless ``--set`` gives them.
DEFAULT_ARGS: dict[str, Any] = {"deterministic": True}
#: What ultralytics takes from the command on a resume (the other training arguments come from the checkpoint).
RESUME_APPLIED = frozenset({"batch", "patience", "plots", "device", "workers"})
#: The training settings a run keeps when it is resumed, as ``detector train`` recorded them in ``OUT/run/`` before
#: ultralytics started: epochs, seed, model (a local ``.pt`` by its sha256), mixed precision and the ``--set``
#: arguments (with the defaults :data:`DEFAULT_ARGS` adds).
STARTED_FILE = "started_with.json"
#: How the two metric lines are computed (the summary and the provenance say it).
METRIC_METHODS = {"val": "ultralytics' validator, NMS IoU 0.7",
                  "test": "detector evaluate: the ils build adapter, NMS IoU 0.6, pycocotools"}


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

    warnings: list[str] = field(default_factory=list)
    """What the command should print as a warning (boxes outside their film, films without a patient id)."""

    def summary_lines(self) -> list[str]:
        """Human-readable summary (printed by the command)."""
        p = self.provenance
        test = p["metrics"].get("test") or {}
        data = p["data"]
        lines = [f"weights: {self.weights}" + (" (already trained; --overwrite to train again)"
                                               if self.already_done else ""),
                 f"provenance: {self.weights.with_suffix('.json')}",
                 f"classes: {', '.join(p['classes'])}",
                 "images: " + ", ".join(f"{k} {v}" for k, v in data["images"].items())
                 + f" ({data['failures']} failed; data sha256 {data['data_sha256'][:12]})"]
        if "outside" in data:
            outside = data["outside"].values()
            lines.append("boxes: " + ", ".join(f"{k} {sum(v.values())}" for k, v in data["boxes"].items())
                         + f" (outside the film: {sum(o['clipped'] for o in outside)} clipped, "
                         f"{sum(o['dropped'] for o in outside)} dropped; per split in the provenance)")
        lines.append(f"split: by {p['split']['by']}")
        lines.append(f"epochs: {p['training']['epochs_done']} of {p['training']['epochs']}"
                     + (" (resumed)" if self.resumed else ""))
        val = p["metrics"].get("val") or {}
        if val:
            lines.append(f"val mAP@0.5: {metric_text(val.get('mAP50'))} ({METRIC_METHODS['val']})")
        if test:
            lines.append(f"test mAP@0.5: {metric_text(test['mAP50'])} ({test['images']} images; "
                         f"{METRIC_METHODS['test']})")
        lines.append(f"use: {p['use']}")
        return lines



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


_METRIC_KEYS = {"metrics/precision(B)": "precision", "metrics/recall(B)": "recall", "metrics/mAP50(B)": "mAP50",
                "metrics/mAP50-95(B)": "mAP50-95"}


def _val_metrics(trainer: Any, run_dir: Path) -> dict[str, float]:
    """ultralytics' val metrics of the best checkpoint: the trainer's, else the best epoch of ``results.csv``."""
    raw = dict(getattr(trainer, "metrics", None) or {}) or _best_epoch_metrics(run_dir / "results.csv")
    return {new: round(float(raw[old]), 5) for old, new in _METRIC_KEYS.items() if old in raw}


def _best_epoch_metrics(results: Path) -> dict[str, float]:
    """The ``results.csv`` row of the best epoch by ultralytics' fitness (0.1 mAP50 + 0.9 mAP50-95)."""
    if not results.is_file():
        return {}
    rows = []
    for row in csv.DictReader(results.read_text().splitlines()):
        try:
            rows.append({k.strip(): float(v) for k, v in row.items() if k and v not in (None, "")})
        except ValueError:
            continue
    scored = [r for r in rows if "metrics/mAP50(B)" in r and "metrics/mAP50-95(B)" in r]
    if not scored:
        return {}
    return max(scored, key=lambda r: 0.1 * r["metrics/mAP50(B)"] + 0.9 * r["metrics/mAP50-95(B)"])


def _model_source(model: str) -> tuple[str, str | None]:
    """The model to build (a yaml) or fine-tune (a local ``.pt``, as an absolute path, with its sha256)."""
    path = Path(model).expanduser()
    if path.suffix == ".pt":
        if not path.is_file():
            raise ConfigError(f"--model {model}: not found: download it yourself and pass its path (nothing is "
                              "downloaded at run time)")
        return str(path.resolve()), sha256_file(path)
    if path.suffix not in (".yaml", ".yml"):
        raise ConfigError(f"--model {model}: expected an ultralytics model yaml (e.g. yolov8s.yaml) or the path of "
                          "a local .pt file")
    return model, None


def _check_finished(prov: dict[str, Any], request: DetectorTrainRequest, inputs: PreparedInputs, out: Path) -> None:
    """Refuse to report a finished run as this request's when it was trained on other inputs or data settings."""
    data = prov.get("data", {})
    if "inputs" not in data:  # written before inputs were recorded: reported as it is
        return
    changes = prepared_changes({**data.get("settings", {}), "inputs": data["inputs"]}, request.prepare_settings(),
                               inputs)
    if changes:
        raise ConfigError(f"{out} holds a detector trained on other inputs or settings ({'; '.join(changes)}); "
                          "use another --out or --overwrite to train again")


def _started_args(run_dir: Path) -> dict[str, Any]:
    """The ultralytics arguments of the run in ``run_dir`` (its ``args.yaml``; empty when there is none)."""
    path = run_dir / "args.yaml"
    if not path.is_file():
        return {}
    import yaml

    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError) as exc:
        raise InputError(f"arguments of the interrupted run are not YAML ({exc}); --overwrite trains again",
                         path) from exc
    return loaded if isinstance(loaded, dict) else {}


def started_with(request: DetectorTrainRequest, train_args: dict[str, Any], model: str,
                 model_sha256: str | None) -> dict[str, Any]:
    """The training settings a run started by ``request`` keeps on a resume (what :data:`STARTED_FILE` holds)."""
    return {"epochs": request.epochs, "seed": request.seed, "model": model, "model_sha256": model_sha256,
            "amp": request.amp, "set": dict(sorted(train_args.items()))}


def started_changes(then: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """The settings of ``now`` (:func:`started_with`) that differ from those a run was started with, as
    ``key=value then (asked: value now)``; a ``--set`` argument given on one side only says ``not set`` on the
    other. A local ``.pt`` model is compared by its sha256 (a moved file is the same model)."""
    changes = [f"{key}={then[key]!r} (asked: {now[key]!r})" for key in ("epochs", "seed", "amp")
               if key in then and then[key] != now[key]]
    same_model = (then.get("model_sha256") == now["model_sha256"] if then.get("model_sha256") or now["model_sha256"]
                  else then.get("model", now["model"]) == now["model"])
    if not same_model:
        changes.append(f"model={then.get('model')!r} (asked: {now['model']!r})")
    was, asked = then.get("set") or {}, now["set"]
    for key in sorted(was.keys() | asked.keys()):
        if key not in asked:
            changes.append(f"{key}={was[key]!r} (asked: not set)")
        elif key not in was:
            changes.append(f"{key} not set (asked: {asked[key]!r})")
        elif was[key] != asked[key] or isinstance(was[key], bool) != isinstance(asked[key], bool):
            changes.append(f"{key}={was[key]!r} (asked: {asked[key]!r})")
    return changes


def _read_started(run_dir: Path) -> dict[str, Any] | None:
    """What :data:`STARTED_FILE` in ``run_dir`` holds (None: a run started before it was written)."""
    path = run_dir / STARTED_FILE
    if not path.is_file():
        return None
    what = "training settings the run was started with (--overwrite trains again)"
    record = read_json_object(path, what)
    if not isinstance(record.get("set", {}), dict):
        raise InputError(f"unreadable {what} ('set' is not a JSON object)", path)
    return record


def _check_resume(run_dir: Path, started: dict[str, Any]) -> None:
    """Refuse a resume that asks for other training settings than the run was started with (ultralytics keeps the
    run's): all of them against :data:`STARTED_FILE`, or, for a run started before that record was written, the
    epochs, seed and ``--set`` arguments asked for against ultralytics' ``args.yaml``."""
    then = _read_started(run_dir)
    if then is not None:
        differ = started_changes(then, started)
    else:
        args = _started_args(run_dir)
        wanted = {"epochs": started["epochs"], "seed": started["seed"], **started["set"]}
        differ = [f"{k}={args[k]!r} (asked: {v!r})" for k, v in wanted.items()
                  if k not in RESUME_APPLIED and k in args and args[k] != v]
    if differ:
        raise ConfigError(f"{run_dir} was started with {', '.join(differ)}; a resume keeps them: rerun with "
                          "those values, use another --out, or --overwrite to train again")


def train_detector(request: DetectorTrainRequest, warn: Callable[[str], None] | None = None) -> TrainedDetector:
    """Prepare, train, evaluate and write the detector (see the module docstring); ``warn`` hears the preparation's
    warnings as soon as they are known (they are also in :attr:`TrainedDetector.warnings`)."""
    out = Path(request.out).absolute()  # ultralytics puts a relative project under its own runs/ folder
    weights = out / WEIGHTS_NAME
    prov_file = weights.with_suffix(".json")
    run_dir = out / "run"
    train_args = {**DEFAULT_ARGS, **ultralytics_args(request.train_set)}
    model, model_sha256 = _model_source(request.model)
    inputs = PreparedInputs.of(request.annotations, request.images, request.patients)
    started = started_with(request, train_args, model, model_sha256)
    if not request.overwrite and weights.is_file() and prov_file.is_file():
        prov = read_json_object(prov_file, "provenance of the trained detector (--overwrite trains again)")
        _check_finished(prov, request, inputs, out)
        then = _read_started(run_dir)
        differ = started_changes(then, started) if then is not None else []
        if differ:
            raise ConfigError(f"{out} holds a detector trained with {', '.join(differ)}; use another --out or "
                              "--overwrite to train again")
        return TrainedDetector(weights, prov, already_done=True)
    check_ultralytics()
    last = run_dir / "weights" / "last.pt"
    resumed = last.is_file() and not request.overwrite
    if resumed:
        _check_resume(run_dir, started)
    data = prepare_dataset(request.annotations, request.images, out / "data", request.prepare_settings(),
                           patients=request.patients, workers=max(1, request.workers),
                           max_images=request.max_images, overwrite=request.overwrite)
    for text in data.warnings if warn is not None else ():
        warn(text)
    if data.images["train"] == 0 or data.images["val"] == 0:
        raise ConfigError(f"the train and val splits need images, got {data.images} (check --val/--test and the "
                          f"image folder; failures in {data.folder / 'failures.jsonl'})")
    if request.overwrite:  # everything is checked: the old run goes only now
        for path in (weights, prov_file):
            path.unlink(missing_ok=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    ultralytics_offline(out / ".ultralytics")
    import torch

    torch.set_num_threads(request.threads)
    YOLO = _import_yolo()
    start = time.perf_counter()
    if resumed:
        model_obj = YOLO(str(last))
        try:  # data and save_dir: where OUT is now (the checkpoint holds the paths of the first run)
            model_obj.train(resume=str(last), data=str(data.yaml), save_dir=str(run_dir), device=request.device,
                            workers=request.workers, batch=request.batch, patience=request.patience,
                            plots=request.plots, verbose=False)
        except AssertionError as exc:  # ultralytics: the run in last.pt already reached its epochs
            if "nothing to resume" not in str(exc):
                raise
            model_obj = YOLO(str(last))
    else:
        run_dir.mkdir(parents=True, exist_ok=True)  # what a resume must keep, before ultralytics writes anything
        atomic_write_text(run_dir / STARTED_FILE, json.dumps(started, indent=1) + "\n")
        model_obj = YOLO(model)
        model_obj.train(data=str(data.yaml), epochs=request.epochs, imgsz=request.imgsz, batch=request.batch,
                        device=request.device, workers=request.workers, seed=request.seed, project=str(out),
                        name="run", exist_ok=True, pretrained=model.endswith(".pt"), amp=_amp(request),
                        plots=request.plots, patience=request.patience, verbose=False, **train_args)
    seconds = time.perf_counter() - start
    trainer = getattr(model_obj, "trainer", None)
    best = run_dir / "weights" / "best.pt"
    shutil.copyfile(best if best.is_file() else last, weights)
    prov = _finish(request, data, weights, trainer, seconds, resumed, model, model_sha256)
    return TrainedDetector(weights, prov, resumed=resumed, warnings=data.warnings)


def _epochs_done(run_dir: Path) -> int:
    results = run_dir / "results.csv"
    if not results.is_file():
        return 0
    return max(0, len([line for line in results.read_text().splitlines() if line.strip()]) - 1)


def _finish(request: DetectorTrainRequest, data: PreparedData, weights: Path, trainer: Any, seconds: float,
            resumed: bool, model: str, model_sha256: str | None) -> dict[str, Any]:
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
    settings = {k: (str(v.absolute()) if isinstance(v, Path) else v) for k, v in asdict(request).items()}
    run_dir = weights.parent / "run"
    used = _started_args(run_dir)  # what ultralytics trained with (a resume keeps the first run's arguments)
    prov = {
        "name": "vindr_yolo",
        "weights": weights.name,
        "weights_sha256": sha256_file(weights),
        "classes": list(data.classes),
        "class_lesions": {c: sorted(BOX_CLASS_LESIONS.get(normalize_class_name(c), ())) for c in data.classes},
        "data": {**data.to_dict(), "annotations": str(request.annotations.absolute()),
                 "images_folder": data.inputs.images,
                 "patients": str(request.patients.absolute()) if request.patients else None},
        "split": {"by": _split_by(data), "films_without_patient": data.films_without_patient, "seed": request.seed,
                  "val": request.val, "test": request.test, "rule": "sha256(seed:group) → test | val | train"},
        "fusion": {"rule": "weighted boxes fusion, equal reader weights, per image and class",
                   "iou": request.fusion_iou, "min_readers": request.min_readers},
        "training": {"model": model,
                     "model_sha256": model_sha256, "epochs": used.get("epochs", request.epochs),
                     "epochs_done": _epochs_done(run_dir), "imgsz": used.get("imgsz", request.imgsz),
                     "batch": used.get("batch", request.batch),
                     "device": str(getattr(trainer, "device", request.device)), "seed": used.get("seed", request.seed),
                     "amp": str(used.get("amp", _amp(request))), "seconds": round(seconds, 1), "resumed": resumed,
                     "ultralytics": ultralytics.__version__, "torch": torch.__version__, "request": settings,
                     "ultralytics_args": {k: (str(v) if isinstance(v, Path) else v) for k, v in used.items()}},
        "metrics": {"val": _val_metrics(trainer, run_dir), "test": test, "methods": METRIC_METHODS},
        "use": f"--detector yolo --detector-opt weights_path={weights} --detector-opt imgsz={request.imgsz}",
    }
    prov = finite_json(prov)
    atomic_write_text(weights.with_suffix(".json"), json.dumps(prov, indent=1, allow_nan=False) + "\n")
    return prov


def _split_by(data: PreparedData) -> str:
    """How the groups of the split were made: by patient, by image, or by patient where the file gives one."""
    if data.films_without_patient is None:
        return "image"
    return "patient" if data.films_without_patient == 0 else "patient, else image (films without a patient id)"
