"""Hugging Face ``datasets`` exports: Parquet shards per split and the dataset card with the Hub's YAML header.

Shared by ``ils export --format hf`` and ``percept export --format hf``. Rows are written in shards of at most
``shard_rows`` rows, ``data/{split}-{i:05d}-of-{n:05d}.parquet`` (the Hub's naming), through
:meth:`datasets.Dataset.to_parquet`, so images and masks are stored as the ``Image`` feature stores them
(``{"bytes", "path"}``). The card's header (``configs``, ``dataset_info`` with features and splits) is made by
``datasets`` itself; the ``license`` field is left empty for the user. ``datasets`` is imported only here, inside
the functions (the ``export`` extra).
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

from cxrground.errors import ConfigError
from cxrground.extras import missing_extra

__all__ = ["ARROW_DIR", "DATA_DIR", "HF_NAMES", "image_cell", "png_cell", "require_datasets", "write_card",
           "write_splits"]

#: Folder of the Parquet shards inside an export.
DATA_DIR: Final[str] = "data"
#: Folder of the optional ``save_to_disk`` copy (for :func:`datasets.load_from_disk`).
ARROW_DIR: Final[str] = "arrow"
#: What an hf export writes at its top (what ``--overwrite`` may replace, :mod:`cxrground.io.export_dir`).
HF_NAMES: Final[tuple[str, ...]] = (DATA_DIR, ARROW_DIR, "README.md")
_LICENSE_NOTE: Final[str] = ("# license: fill in the licence of the source images and reports (a Hub licence id) "
                             "before publishing\n")


def require_datasets(what: str = "the hf export") -> Any:
    """The ``datasets`` module, or a :class:`~cxrground.errors.MissingExtraError` naming ``what`` needs it and the
    extra that installs it."""
    try:
        import datasets
    except ImportError as exc:
        raise missing_extra(exc, what) from exc
    return datasets


def image_cell(path: Path) -> dict[str, Any]:
    """An ``Image`` feature value holding the file's bytes as stored (PNG/JPEG) under its file name."""
    return {"bytes": path.read_bytes(), "path": path.name}


def png_cell(pixels: Any, name: str) -> dict[str, Any]:
    """An ``Image`` feature value holding ``pixels`` (uint8 grey or RGB) encoded as PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return {"bytes": buf.getvalue(), "path": name}


def _chunks(rows: Iterable[dict[str, Any]], size: int) -> Iterator[list[dict[str, Any]]]:
    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def write_splits(out: Path, features: Any, splits: dict[str, tuple[int, Callable[[], Iterable[dict[str, Any]]]]],
                 shard_rows: int = 500, arrow: bool = False) -> dict[str, dict[str, int]]:
    """Write each split ``name -> (row count, rows())`` as Parquet shards under ``out/data``; returns
    ``{split: {"num_examples", "num_bytes", "shards"}}`` of the splits with rows (an empty split is left out).
    ``arrow``: also ``save_to_disk`` under ``out/arrow``."""
    datasets = require_datasets()
    if shard_rows < 1:
        raise ConfigError(f"shard_rows must be >= 1, got {shard_rows}")
    data = out / DATA_DIR
    data.mkdir(parents=True, exist_ok=True)
    for old in data.glob("*.parquet"):
        old.unlink()
    quiet = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()
    try:
        return _write(datasets, out, data, features, splits, shard_rows, arrow)
    finally:
        if quiet:
            datasets.enable_progress_bars()


def _write(datasets: Any, out: Path, data: Path, features: Any,
           splits: dict[str, tuple[int, Callable[[], Iterable[dict[str, Any]]]]], shard_rows: int,
           arrow: bool) -> dict[str, dict[str, int]]:
    info: dict[str, dict[str, int]] = {}
    for split, (count, rows) in splits.items():
        n = max(1, -(-count // shard_rows))
        written = size = shard = 0
        for shard, chunk in enumerate(_chunks(rows(), shard_rows)):
            ds = datasets.Dataset.from_list(chunk, features=features)
            path = data / f"{split}-{shard:05d}-of-{n:05d}.parquet"
            ds.to_parquet(str(path))
            written += len(chunk)
            size += path.stat().st_size
        if written == 0:  # an empty split is left out (datasets' Parquet reader refuses an empty shard)
            continue
        if written != count or shard + 1 != n:
            raise ConfigError(f"split {split}: {written} rows written, {count} expected")
        info[split] = {"num_examples": written, "num_bytes": size, "shards": n}
    if arrow:
        import pyarrow as pa
        import pyarrow.parquet as pq

        tables = {s: pa.concat_tables([pq.read_table(p) for p in sorted(data.glob(f"{s}-*.parquet"))])
                  for s in info}
        datasets.DatasetDict({s: datasets.Dataset(t, info=datasets.DatasetInfo(features=features))
                              for s, t in tables.items()}).save_to_disk(str(out / ARROW_DIR))
    return info


def write_card(out: Path, features: Any, info: dict[str, dict[str, int]], pretty_name: str, body: str,
               tags: Iterable[str] = ()) -> Path:
    """``out/README.md``: the Hub YAML header (configs, features, splits; an empty ``license`` for the user),
    then ``body`` (Markdown)."""
    datasets = require_datasets()
    from datasets.info import DatasetInfosDict
    from datasets.utils.metadata import MetadataConfigs
    from huggingface_hub import DatasetCardData

    split_dict = datasets.SplitDict()
    for split, s in info.items():
        split_dict.add(datasets.SplitInfo(split, num_bytes=s["num_bytes"], num_examples=s["num_examples"]))
    card = DatasetCardData(pretty_name=pretty_name, tags=list(tags) or None)
    DatasetInfosDict({"default": datasets.DatasetInfo(features=features, splits=split_dict)}
                     ).to_dataset_card_data(card)
    MetadataConfigs({"default": {"data_files": [{"split": s, "path": f"{DATA_DIR}/{s}-*.parquet"} for s in info]}}
                    ).to_dataset_card_data(card)
    header = _LICENSE_NOTE + "license:\n" + card.to_yaml()
    path = out / "README.md"
    path.write_text(f"---\n{header.rstrip()}\n---\n\n{body.strip()}\n", encoding="utf-8")
    return path
