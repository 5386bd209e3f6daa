"""``cxrground detector evaluate``: the detector on a held-out split, as a detector and as ILS §8 uses it.

The detector runs through the pipeline's own adapter (:class:`~cxrground.ils.spatial.boxes.YOLOBoxDetector`) on
the split's letterboxed films; ground truth is the fused reader boxes on the same canvas (IoU does not change under
the letterbox's uniform scaling).

- **Detector view**: average precision at IoU 0.5 per class (pycocotools' COCO evaluation with one IoU threshold,
  101-point interpolated precision, up to 100 boxes per image); mAP@0.5 = mean over the classes that have ground
  truth in the split.
- **ILS view**: Algorithm 1 takes a box when its confidence is at least τ_conf and at least τ_signal of it is
  lesion (c2, c3; ILS Table 7, general column: 0.20 and 0.20). Each ground-truth box stands for a reported
  lesion; a predicted box of a kept class *grounds* it when ``conf ≥ τ_conf`` and ``|P ∩ G| / |P| ≥ τ_signal``.
  Per class and per ILS lesion (the lesions each class may ground, :data:`BOX_CLASS_LESIONS`): the *hit rate*
  (share of lesions grounded by at least one box), *boxes per lesion* (mean number of grounding boxes), and the
  *false boxes per film* (boxes with ``conf ≥ τ_conf`` that ground no lesion).

The predictions are the adapter's (NMS IoU ``iou``, default 0.6, integer pixel boxes), so the figures differ a
little from ultralytics' own validator, whose val mAP ``detector train`` reports (NMS IoU 0.7, its AP).

With ``annotations``, exactly the films that file names are prepared into ``data`` (all in ``split``) and scored;
``data`` must then be a folder of its own, not a training output folder, and one prepared from other annotations,
films or settings is refused unless ``overwrite``. ultralytics runs offline
(:func:`~cxrground.ils.detector.needs.ultralytics_offline`).
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from cxrground.errors import ConfigError
from cxrground.fields import option
from cxrground.ils.config import GENERAL_THRESHOLDS
from cxrground.ils.detector.prepare import WEIGHTS_NAME, canvas_array, load_manifest
from cxrground.ils.spatial.base import Box
from cxrground.ils.spatial.boxes import BOX_CLASS_LESIONS, KEPT_CLASSES, normalize_class_name
from cxrground.io.files import atomic_write_text, finite_json

__all__ = ["DetectionReport", "DetectorEvalRequest", "average_precision_50", "evaluate_detector", "ils_view",
           "metric_text"]


@dataclass(frozen=True, kw_only=True)
class DetectorEvalRequest:
    """One evaluation (``cxrground detector evaluate`` offers one option per field)."""

    weights: Path = option(path="file", help="The detector checkpoint (vindr_yolo.pt).")
    data: Path = option(path="out_dir", help="The prepared dataset: the training output folder or its data/; with "
                        "--annotations, a folder of its own to prepare the evaluation films in (not a training "
                        "output folder).")
    annotations: Path | None = option(None, path="file", help="Evaluate on these annotations instead (e.g. VinDr-CXR's "
                                      "annotations_test.csv): all their films form the split, prepared like the "
                                      "training films.")
    images: Path | None = option(None, path="dir", help="Film folder of --annotations.")
    workers: int = option(2, low=1, help="Processes that prepare the --annotations films.")
    split: str = option("test", choices=("test", "val", "train"), help="Split of the prepared dataset to score.")
    imgsz: int | None = option(None, low=32, help="Prediction size (default: the training size of data/).")
    device: str | None = option(None, help="cpu, 0, 0,1... (default: ultralytics' choice).")
    conf: float = option(0.001, low=0, high=1, help="Confidence floor of the predictions scored by mAP.")
    iou: float = option(0.6, low=0, high=1, low_open=True, help="NMS IoU of the predictions.")
    out: Path | None = option(None, path="out_file", help="Write the report as JSON here.")
    overwrite: bool = option(False, help="With --annotations: prepare --data again when it was prepared from other "
                             "annotations, films or settings.")


@dataclass
class DetectionReport:
    """mAP@0.5 per class and the ILS view of one split."""

    split: str
    images: int
    classes: list[str]
    ap50: dict[str, float | None]
    map50: float | None
    """Mean AP@0.5 over the classes with ground truth in the split (``None`` when none has)."""
    ils: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {"split": self.split, "images": self.images, "classes": self.classes, "mAP50": self.map50,
                "AP50": self.ap50, "ils": self.ils}

    def lines(self) -> list[str]:
        """Markdown tables of both views."""
        gt = self.ils.get("per_class", {})
        out = [f"## Detector on the {self.split} split ({self.images} films): mAP@0.5 {metric_text(self.map50)}", "",
               "| class | boxes | AP@0.5 | hit rate | boxes per lesion |", "|---|---|---|---|---|"]
        for c in self.classes:
            row = gt.get(c, {})
            out.append(f"| {c} | {row.get('lesions', 0)} | {metric_text(self.ap50.get(c))} | "
                       f"{metric_text(row.get('hit_rate'))} | {metric_text(row.get('boxes_per_lesion'))} |")
        tau = self.ils.get("thresholds", {})
        out += ["", f"## ILS view (τ_conf {tau.get('tau_conf')}, τ_signal {tau.get('tau_signal')}): "
                f"{metric_text(self.ils.get('false_boxes_per_film'))} false boxes per film", "",
                "| ILS lesion | lesions | hit rate | boxes per lesion |", "|---|---|---|---|"]
        for lesion, row in self.ils.get("per_lesion", {}).items():
            out.append(f"| {lesion} | {row['lesions']} | {metric_text(row['hit_rate'])} | "
                       f"{metric_text(row['boxes_per_lesion'])} |")
        total = self.ils.get("total", {})
        out.append(f"| all | {total.get('lesions', 0)} | {metric_text(total.get('hit_rate'))} | "
                   f"{metric_text(total.get('boxes_per_lesion'))} |")
        return out


def metric_text(v: float | None) -> str:
    """A metric as printed: three decimals, ``–`` when there is none (no film, no box, NaN)."""
    return "–" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"


def average_precision_50(gt: list[list[dict[str, Any]]], pred: list[list[Box]],
                         classes: list[str], shape: tuple[int, int]) -> dict[str, float | None]:
    """AP at IoU 0.5 per class with pycocotools (``None`` for a class without ground truth).

    ``gt[i]``: dicts with ``class_name, x0, y0, x1, y1`` (pixel edges); ``pred[i]``: boxes with inclusive
    pixel bounds, labels normalised; image ``i`` is ``shape`` pixels.
    """
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    index = {normalize_class_name(c): k + 1 for k, c in enumerate(classes)}
    h, w = shape
    images = [{"id": i + 1, "width": w, "height": h} for i in range(len(gt))]
    anns = []
    for i, boxes in enumerate(gt):
        for b in boxes:
            bw, bh = b["x1"] - b["x0"], b["y1"] - b["y0"]
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": index[normalize_class_name(
                b["class_name"])], "bbox": [b["x0"], b["y0"], bw, bh], "area": bw * bh, "iscrowd": 0})
    dets = [{"image_id": i + 1, "category_id": index[b.label], "bbox": [b.x0, b.y0, b.x1 - b.x0 + 1, b.y1 - b.y0 + 1],
             "score": b.confidence} for i, boxes in enumerate(pred) for b in boxes if b.label in index]
    with_gt = {a["category_id"] for a in anns}
    out: dict[str, float | None] = {c: (0.0 if index[normalize_class_name(c)] in with_gt else None) for c in classes}
    if not anns or not dets:
        return out
    coco = COCO()
    coco.dataset = {"images": images, "annotations": anns,
                    "categories": [{"id": k + 1, "name": c} for k, c in enumerate(classes)]}
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
        found = coco.loadRes(dets)
        ev = COCOeval(coco, found, "bbox")
        ev.params.iouThrs = np.array([0.5])
        ev.evaluate()
        ev.accumulate()
    precision = ev.eval["precision"]  # [iou, recall, class, area, max dets]
    for k, c in enumerate(classes):
        if index[normalize_class_name(c)] not in with_gt:
            continue
        p = precision[0, :, k, 0, -1]
        p = p[p > -1]
        out[c] = float(p.mean()) if p.size else 0.0
    return out


def _grounds(p: Box, g: dict[str, Any], tau_signal: float) -> bool:
    """``|P ∩ G| / |P| ≥ τ_signal`` with P in inclusive pixel bounds, G in pixel edges."""
    px0, py0, px1, py1 = p.x0, p.y0, p.x1 + 1, p.y1 + 1
    iw = min(px1, g["x1"]) - max(px0, g["x0"])
    ih = min(py1, g["y1"]) - max(py0, g["y0"])
    return iw > 0 and ih > 0 and iw * ih >= tau_signal * (px1 - px0) * (py1 - py0)


def ils_view(gt: list[list[dict[str, Any]]], pred: list[list[Box]], tau_conf: float = GENERAL_THRESHOLDS.tau_conf,
             tau_signal: float = GENERAL_THRESHOLDS.tau_signal) -> dict[str, Any]:
    """Hit rate, boxes per lesion and false boxes per film as Algorithm 1 would take the boxes (module docstring)."""
    kept = {normalize_class_name(k) for k in KEPT_CLASSES}
    by_class: dict[str, list[int]] = defaultdict(list)
    by_lesion: dict[str, list[int]] = defaultdict(list)
    false_boxes = 0
    for g_boxes, p_boxes in zip(gt, pred, strict=True):
        taken = [p for p in p_boxes if p.label in kept and p.confidence >= tau_conf]
        lesions = [g for g in g_boxes if normalize_class_name(g["class_name"]) in kept]
        false_boxes += sum(not any(_grounds(p, g, tau_signal) for g in lesions) for p in taken)
        for g in lesions:
            n = sum(_grounds(p, g, tau_signal) for p in taken)
            by_class[g["class_name"]].append(n)
            for lesion in BOX_CLASS_LESIONS.get(normalize_class_name(g["class_name"]), ()):
                by_lesion[lesion].append(n)

    def row(counts: list[int]) -> dict[str, Any]:
        a = np.asarray(counts, dtype=float)
        return {"lesions": int(a.size), "hit_rate": float((a > 0).mean()) if a.size else None,
                "boxes_per_lesion": float(a.mean()) if a.size else None}

    every = [n for counts in by_class.values() for n in counts]
    return {"thresholds": {"tau_conf": tau_conf, "tau_signal": tau_signal},
            "per_class": {c: row(v) for c, v in sorted(by_class.items())},
            "per_lesion": {le: row(v) for le, v in sorted(by_lesion.items())},
            "total": row(every), "false_boxes_per_film": false_boxes / max(1, len(gt))}


def _data_folder(path: Path) -> Path:
    return path / "data" if (path / "data" / "manifest.jsonl").is_file() else path


def _check_evaluation_folder(folder: Path) -> None:
    """Refuse a training output folder, or a training dataset, as the folder to prepare ``--annotations`` in."""
    from cxrground.ils.detector.prepare import read_prepared_settings

    if (folder / "data").is_dir() or (folder / WEIGHTS_NAME).is_file() or (folder / "run").is_dir():
        raise ConfigError(f"{folder} is a training output folder (it holds data/, run/ or {WEIGHTS_NAME}): with "
                          "--annotations, --data names a folder of its own to prepare those films in (e.g. "
                          f"{folder.parent / (folder.name + '_eval')})")
    recorded = read_prepared_settings(folder)
    if recorded is not None and recorded.get("only_split") is None:
        raise ConfigError(f"{folder} holds a prepared training dataset: with --annotations, --data names a folder "
                          "of its own to prepare those films in")


def _prepare_evaluation_set(request: DetectorEvalRequest) -> Path:
    """Prepare ``--annotations`` films into ``--data``, all in ``--split``, with the weights' training settings."""
    from cxrground.ils.detector.prepare import PrepareSettings, prepare_dataset

    if request.images is None:
        raise ConfigError("--annotations needs --images (the folder of its films)")
    assert request.annotations is not None
    _check_evaluation_folder(request.data)
    sidecar = request.weights.with_suffix(".json")
    trained = json.loads(sidecar.read_text()) if sidecar.is_file() else {}
    settings = trained.get("data", {}).get("settings", {})
    prepared = prepare_dataset(request.annotations, request.images, request.data, PrepareSettings(
        classes=settings.get("classes", "kept"), imgsz=request.imgsz or int(settings.get("imgsz", 1024)),
        fusion_iou=settings.get("fusion_iou", 0.4), min_readers=settings.get("min_readers", 1),
        only_split=request.split), workers=request.workers, overwrite=request.overwrite,
        hint="use another --data folder or --overwrite")
    return prepared.folder


def evaluate_detector(request: DetectorEvalRequest) -> DetectionReport:
    """Both views of the detector on ``request.split`` of a prepared dataset (module docstring)."""
    from cxrground.ils.detector.needs import check_ultralytics, ultralytics_offline
    from cxrground.ils.spatial.boxes import YOLOBoxDetector

    check_ultralytics()  # before any film of --annotations is prepared
    ultralytics_offline()
    folder = _prepare_evaluation_set(request) if request.annotations is not None else _data_folder(request.data)
    settings = json.loads((folder / "settings.json").read_text()) if (folder / "settings.json").is_file() else {}
    records = [m for m in load_manifest(folder) if m["split"] == request.split]
    if not records:
        raise ConfigError(f"{folder}: no films in the {request.split} split")
    from cxrground.ils.detector.vindr import class_list

    classes = list(class_list(settings.get("classes", "kept")))
    imgsz = request.imgsz or int(settings.get("imgsz", 1024))
    detector = YOLOBoxDetector(request.weights, imgsz=imgsz, predict_conf=request.conf, iou=request.iou,
                               device=request.device, kept=classes)
    gt, pred = [], []
    for meta in records:
        canvas = canvas_array(folder, meta)
        pred.append(detector.detect(canvas))
        gt.append(meta["boxes"])
    shape = tuple(records[0]["letterbox"]["canvas_hw"])
    ap = average_precision_50(gt, pred, classes, shape)  # type: ignore[arg-type]
    scored = [v for v in ap.values() if v is not None]
    report = DetectionReport(request.split, len(records), classes, ap,
                             float(np.mean(scored)) if scored else None, ils_view(gt, pred))
    if request.out is not None:

        atomic_write_text(request.out, json.dumps(finite_json(report.to_dict()), indent=1, allow_nan=False) + "\n")
    return report
