"""An ILS dataset's instruction-answer pairs as a map-style dataset, for training from Python.

:class:`IlsPairs` reads the pairs of the splits asked for from an ``ils build`` folder (or its JSON file, or an ``ils
export --frame`` folder) as a stream and keeps only a small record per pair (:class:`PairRef`); ``pairs[i]`` reads
that pair's film and mask from disk and returns a dict that ``torch.utils.data.DataLoader`` batches as it is (torch
is not needed here): numpy arrays, strings, booleans and integers, no ``None``. A negative pair's mask is all False.
With ``size``, the film and the mask are letterboxed onto a ``size`` × ``size`` canvas (the film bilinear, the mask
nearest neighbour, centred, padding 0) so that pairs of films of any size batch together; ``box`` then says where
the film sits (:class:`~cxrground.io.transform.Letterbox` as ``[src_h, src_w, resized_h, resized_w, offset_y,
offset_x]``). Masks are read on their film's grid in whichever frame the dataset declares
(:func:`cxrground.ils.frames.mask_on_image`).

Nothing is random and nothing is cached between items: the order is the file's (positives, then negatives, study by
study, split by split in the order asked), ``pairs[i]`` is the same in every process, and the object pickles small, so
DataLoader worker processes (``num_workers``) and a seeded sampler give the same batches run after run. A film or mask
that cannot be read is an :class:`~cxrground.errors.InputError` naming the file; :meth:`IlsPairs.check` reads every
pair once and returns the failures instead, so a bad film can be found before training.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import numpy as np

from cxrground.errors import Failure, InputError
from cxrground.ils.frames import MaskFrame, mask_on_image, read_frame
from cxrground.ils.layout import DATASET_FILE, MASK_DIR
from cxrground.ils.schema import check_splits, dataset_splits, iter_dataset
from cxrground.io.image import Window, read_image
from cxrground.io.masks import read_mask_png
from cxrground.io.transform import Letterbox

__all__ = ["ITEM_KEYS", "IlsPairs", "PairRef"]

#: The keys of an item (``pairs[i]``); ``box`` only with ``size``.
ITEM_KEYS: Final[tuple[str, ...]] = ("index", "image", "mask", "instruction", "answer", "positive", "type", "target",
                                     "certainty", "split", "study_key", "pair_id", "image_path")


@dataclass(frozen=True)
class PairRef:
    """One pair as :class:`IlsPairs` keeps it: where its film and mask are and what it says (no pixels)."""

    split: str
    study_key: str
    pair_id: str
    image_path: str
    instruction: str
    answer: str
    type: str
    target: str
    positive: bool
    mask_path: str | None
    location: tuple[str, ...]
    grounded_location: tuple[str, ...]
    certainty: str | None


class IlsPairs:
    """The pairs of ``splits`` of the ILS dataset ``dataset`` (a folder or its JSON file), films under ``images``
    (default: the dataset folder, as ``ils train``); ``positives`` / ``negatives``: which pairs to keep; ``size``:
    letterbox each item to a square canvas; ``transform``: called on each item dict, its result returned (augment,
    tokenise, make tensors); ``window``: how DICOM films are windowed (:func:`~cxrground.io.image.read_image`).

    A split the dataset does not have is an :class:`~cxrground.errors.InputError` naming the file and the splits it
    has; so is a dataset file readers cannot use.
    """

    def __init__(self, dataset: str | Path, images: str | Path | None = None, splits: str | Iterable[str] = "train",
                 *, positives: bool = True, negatives: bool = True, size: int | None = None,
                 transform: Callable[[dict[str, Any]], Any] | None = None, window: Window = "auto") -> None:
        path = Path(dataset)
        self.json_path = path if path.is_file() else path / DATASET_FILE
        self.mask_root = self.json_path.parent / MASK_DIR
        self.images = Path(images) if images is not None else self.json_path.parent
        self.splits = (splits,) if isinstance(splits, str) else tuple(splits)
        if size is not None and size < 1:
            raise ValueError(f"size must be a positive number of pixels, got {size}")
        self.size = size
        self.transform = transform
        self.window = window
        check_splits(self.json_path)
        self._check_split_names()
        self.frame: MaskFrame = read_frame(self.json_path)
        self.pairs: list[PairRef] = list(self._read_pairs(positives, negatives))

    def _check_split_names(self) -> None:
        present = dataset_splits(self.json_path)
        missing = [s for s in self.splits if s not in present]
        if missing or not self.splits:
            raise InputError(f"the dataset has no split {', '.join(missing) or '(none asked for)'}; it has "
                             f"{', '.join(present) or 'none'}", self.json_path)

    def _read_pairs(self, positives: bool, negatives: bool) -> Iterator[PairRef]:
        for split, key, study in iter_dataset(self.json_path, splits=self.splits):
            found = study["instruction_answer_pairs"]
            chosen = ([(p, True) for p in found.get("positive_pairs", [])] if positives else []) + \
                     ([(p, False) for p in found.get("negative_pairs", [])] if negatives else [])
            for pair, positive in chosen:
                yield PairRef(split=split, study_key=key, pair_id=str(pair["pair_id"]),
                              image_path=str(study["image_path"]), instruction=pair["instruction"],
                              answer=pair["answer"], type=pair["type"], target=pair["target"], positive=positive,
                              mask_path=str(pair["seg_mask_path"]) if positive else None,
                              location=tuple(pair.get("location") or ()),
                              grounded_location=tuple(pair.get("grounded_location") or ()),
                              certainty=pair.get("certainty"))

    def __len__(self) -> int:
        return len(self.pairs)

    def __getitem__(self, index: int) -> Any:
        if not -len(self.pairs) <= index < len(self.pairs):
            raise IndexError(f"pair {index} of {len(self.pairs)}")
        index = index % len(self.pairs)
        item = self.item(index)
        return self.transform(item) if self.transform is not None else item

    def item(self, index: int) -> dict[str, Any]:
        """Pair ``index`` as a dict (:data:`ITEM_KEYS`) without ``transform``: ``image`` ``(H, W)`` uint8, ``mask``
        ``(H, W)`` bool (``size`` × ``size`` with ``size``), ``positive``, ``certainty`` ("" when the pair has
        none) and the pair's text and identity."""
        ref = self.pairs[index]
        image = read_image(self.images / ref.image_path, window=self.window)
        if ref.mask_path is None:
            mask = np.zeros(image.shape, dtype=bool)
        else:
            mask_path = self.mask_root / ref.mask_path
            mask = mask_on_image(read_mask_png(mask_path), image.shape, self.frame, mask_path)
        # own, writable copies: torch makes tensors of them without a warning, and a transform may change them
        item: dict[str, Any] = {"index": index, "image": np.array(image.pixels, dtype=np.uint8),
                                "mask": np.array(mask, dtype=bool)}
        if self.size is not None:
            box = Letterbox.fit(image.shape, self.size)
            item["image"] = box.image_to_canvas(image.pixels).astype(np.uint8)
            item["mask"] = box.mask_to_canvas(mask)
            item["box"] = np.array([*box.src_hw, *box.resized_hw, *box.offset_yx], dtype=np.int64)
        item.update(instruction=ref.instruction, answer=ref.answer, positive=ref.positive, type=ref.type,
                    target=ref.target, certainty=ref.certainty or "", split=ref.split, study_key=ref.study_key,
                    pair_id=ref.pair_id, image_path=ref.image_path)
        return item

    def check(self, progress: bool = False) -> list[Failure]:
        """Read every pair's film and mask once; the ones that cannot be read, as failures (one per file)."""
        from cxrground.io.progress import progress_bar

        failures: list[Failure] = []
        seen: set[str] = set()
        for index in progress_bar(range(len(self.pairs)), desc="pairs", unit="pair", progress=progress):
            ref = self.pairs[index]
            try:
                self.item(index)
            except InputError as exc:
                where = str(exc.path) if getattr(exc, "path", None) else ref.image_path
                if where not in seen:
                    seen.add(where)
                    failures.append(Failure.from_exception(where, "pairs", exc))
        return failures

    def __repr__(self) -> str:
        positives = sum(p.positive for p in self.pairs)
        return (f"IlsPairs({self.json_path.parent}, splits={list(self.splits)}: {len(self.pairs)} pairs, "
                f"{positives} positive, {len(self.pairs) - positives} negative)")

