"""Every stage that calls a lung/heart segmenter checks what it returned (a BackendError naming it)."""

from __future__ import annotations

import pytest

from cxrground.errors import BackendError
from cxrground.models.lung_unet.data import phantom_records
from cxrground.models.lung_unet.evaluate import evaluate_records


class _Broken:
    name = "broken-test"

    def segment(self, image):
        return {"right_lung": None}  # not LungHeartMasks


class _Raises:
    name = "raises-test"

    def segment(self, image):
        raise RuntimeError("weights not loaded")


@pytest.mark.parametrize(("segmenter", "words"), [(_Broken(), "LungHeartMasks"), (_Raises(), "weights not loaded")])
def test_lung_evaluation_names_a_segmenter_that_fails(segmenter, words):
    with pytest.raises(BackendError, match=words) as raised:
        evaluate_records(segmenter, phantom_records(1, seed=0))
    assert "segment" in str(raised.value)
