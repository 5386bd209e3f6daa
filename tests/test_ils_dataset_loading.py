"""Loading an ILS dataset from Python: the folder or its JSON file, plain or typed."""

from __future__ import annotations

import json

import pytest

from cxrground.errors import InputError
from cxrground.ils.layout import DATASET_FILE
from cxrground.ils.schema import DatasetFile, PositivePair, Study, load_dataset, load_dataset_file


def test_folder_or_file_plain_or_typed(build_tiny_ils, tmp_path):
    out = build_tiny_ils(tmp_path / "ils")
    assert load_dataset(out) == load_dataset(out / DATASET_FILE)
    typed = load_dataset_file(out)
    assert isinstance(typed, DatasetFile) and typed == load_dataset_file(out / DATASET_FILE)
    studies = [s for split in (typed.train, typed.val, typed.test) for s in split.values()]
    assert studies and all(isinstance(s, Study) for s in studies)
    positives = [p for s in studies for p in s.instruction_answer_pairs.positive_pairs]
    assert positives and all(isinstance(p, PositivePair) for p in positives)


def test_a_file_off_the_schema_is_named_with_its_problems(build_tiny_ils, tmp_path):
    out = build_tiny_ils(tmp_path / "ils")
    data = json.loads((out / DATASET_FILE).read_text())
    pairs = next(p for split in data.values() for s in split.values()
                 if (p := s["instruction_answer_pairs"]["positive_pairs"]))
    pairs[0]["instruction"] = 5
    (out / DATASET_FILE).write_text(json.dumps(data))
    with pytest.raises(InputError, match=r"not a MIMIC-ILS dataset: .*instruction") as raised:
        load_dataset_file(out)
    assert DATASET_FILE in str(raised.value)
    with pytest.raises(InputError, match="is a folder, not the dataset JSON file"):
        load_dataset(tmp_path)  # a folder without the dataset file
