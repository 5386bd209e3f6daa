"""The ``ils:CHECKPOINT`` CheXpercept client (issue 12 item 7) on a rendered case with a stub ILS model and lungs."""

from __future__ import annotations

import asyncio
import base64
import io
import json

import numpy as np
import pytest
from PIL import Image

from cxrground.anatomy.overlap import (
    comparison_answer_index,
    component_overlap,
    distribution_answer_index,
    positive_subregions,
    positive_zones,
    severity_index,
    severity_ratio,
)
from cxrground.anatomy.percept_regions import SUBREGION_NAMES, percept_geometry
from cxrground.anatomy.segment.base import LungHeartMasks
from cxrground.errors import ConfigError, InputError
from cxrground.evaluation.percept.clients import make_client
from cxrground.evaluation.percept.clients.ils_agent import IlsAgentClient, point_centres, shown_mask
from cxrground.evaluation.percept.conversation import Question, user_message
from cxrground.models.base import IlsOutput
from cxrground.percept.render import draw_points, mask_overlay
from cxrground.vocab import percept_templates as pt
from masks_helpers import rect

H, W = 240, 200
RIGHT = rect((H, W), (30, 210), (15, 90))   # image left = right lung
LEFT = rect((H, W), (30, 210), (110, 185))
OWN = rect((H, W), (120, 200), (20, 80))    # the model's lesion: lower right lung
SHOWN = rect((H, W), (60, 150), (30, 95))   # the benchmark's shown mask: higher and shifted


def _grey() -> np.ndarray:
    yy, xx = np.mgrid[:H, :W]
    return (40 + (yy * 0.5 + xx * 0.3) % 150).astype(np.uint8)


def _url(rgb: np.ndarray) -> str:
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


class StubModel:
    name = "stub"

    def __init__(self, mask):
        self.mask = mask
        self.instructions: list[str] = []

    def predict(self, image, instruction):
        assert image.shape == (H, W)
        self.instructions.append(instruction)
        return IlsOutput(answer="[SEG]", mask=self.mask, presence=float(self.mask.any()), present=bool(self.mask.any()))


class StubLungs:
    name = "stub"

    def segment(self, image):
        return LungHeartMasks(RIGHT, LEFT, None, "estimate", "stub")


@pytest.fixture
def ckpt(tmp_path):
    (tmp_path / "checkpoint.json").write_text(json.dumps({"model": "baseline"}))
    return tmp_path


def _client(ckpt, mask) -> IlsAgentClient:
    client = IlsAgentClient(ckpt, segmenter=StubLungs())
    client._ils = StubModel(mask)
    return client


def _wrong_gt(n: int) -> tuple[int, ...]:
    return (n,)  # the client must not read it: always the last option


def _case(grey: np.ndarray):
    """(question, images) per turn of an RR case for edema, rendered as the benchmark renders them."""
    cxr = np.repeat(grey[:, :, None], 3, axis=2)
    overlay = mask_overlay(grey, SHOWN)
    # red: in own, not shown (expand); blue: shown, not own (contract); green: in neither
    points = draw_points(overlay, [((50, 185), "red"), ((60, 75), "blue"), ((150, 20), "green")])
    colours = ["red", "blue", "green"]
    point_opts = tuple(pt.point_options(colours))
    options = [SHOWN, OWN, rect((H, W), (10, 30), (120, 180))]
    lesion = "edema"
    loc_names = [SUBREGION_NAMES[i] for i in (2, 0, 15)]
    loc_opts = (*[pt.subregion_text(n) for n in loc_names], pt.LOCATION_NONE_OPTION)
    sev_opts = tuple(pt.severity_options("right lung"))
    turns = [
        (Question("detection", 1, pt.format_question(pt.detection_stem(lesion), pt.YES_NO), ("c",), pt.YES_NO,
                  _wrong_gt(2)), [cxr]),
        (Question("contour_eval", 2, pt.contour_eval_stem(lesion), ("o",), pt.YES_NO, _wrong_gt(2)), [overlay]),
        (Question("expansion", 3, pt.EXPANSION.format(lesion=lesion), ("p",), point_opts, _wrong_gt(4)), [points]),
        (Question("contraction", 3, pt.CONTRACTION.format(lesion=lesion), (), point_opts, _wrong_gt(4)), []),
        (Question("revision_result", 3, pt.REVISION_RESULT, ("a", "b", "c"), tuple(pt.mask_options(3)),
                  _wrong_gt(3)), [mask_overlay(grey, m) for m in options]),
        (Question("distribution", 4, pt.DISTRIBUTION.format(lesion=lesion), (), pt.DISTRIBUTION_OPTIONS,
                  _wrong_gt(4)), []),
        (Question("location", 4, pt.LOCATION.format(lesion=lesion), (), loc_opts, _wrong_gt(4)), []),
        (Question("severity", 4, pt.SEVERITY.format(lung="right lung", lesion=lesion), (), sev_opts, _wrong_gt(3)),
         []),
        (Question("comparison", 4, pt.COMPARISON, (), pt.COMPARISON_OPTIONS, _wrong_gt(4)), []),
    ]
    return turns, loc_names


def _run(client, turns) -> dict[str, str]:
    async def go():
        messages = [{"role": "system", "content": pt.SYSTEM_PROMPT}]
        answers = {}
        for q, imgs in turns:
            messages.append(user_message(q.user_text(), [_url(i) for i in imgs]))
            done = await client.complete(messages, q, "case")
            answers[q.qid] = done.content
            messages.append({"role": "assistant", "content": done.content})
        return answers

    return asyncio.run(go())


def test_overlay_and_points_are_read_back():
    grey = _grey()
    assert np.array_equal(shown_mask(mask_overlay(grey, SHOWN), grey), SHOWN)
    points = draw_points(np.repeat(grey[:, :, None], 3, axis=2), [((50, 185), "red"), ((150, 20), "green")])
    got = point_centres(points, ["red", "green", "blue"])
    assert got["red"] == (50, 185) and got["green"] == (150, 20) and got["blue"] is None


def test_every_stage_is_answered_from_the_own_mask_and_the_geometry(ckpt):
    grey = _grey()
    turns, loc_names = _case(grey)
    client = _client(ckpt, OWN)
    answers = _run(client, turns)
    assert client._ils.instructions == ["Segment the edema."]  # one prediction per case, global instruction
    assert answers["detection"] == "Answer: 1"  # Yes: the mask has pixels
    assert answers["contour_eval"] == "Answer: 1"  # Yes: IoU(own, shown) is low
    assert answers["expansion"] == "Answer: 1"  # red
    assert answers["contraction"] == "Answer: 2"  # blue
    assert answers["revision_result"] == "Answer: 2"  # the option equal to the own mask
    geometry = percept_geometry(RIGHT, LEFT)
    records = [component_overlap(OWN, geometry)]
    assert answers["distribution"] == f"Answer: {distribution_answer_index(len(positive_zones(records)))}"
    positive = set(positive_subregions(records))
    want = [i + 1 for i, n in enumerate(loc_names) if n in positive] or [4]
    assert answers["location"] == "Answer: " + ",".join(map(str, want))
    assert answers["severity"] == f"Answer: {severity_index(severity_ratio(records, 'right'))}"
    assert answers["comparison"] == f"Answer: {comparison_answer_index(records)}" == "Answer: 4"  # one lung only


def test_agreeing_mask_needs_no_revision_and_an_empty_mask_detects_nothing(ckpt):
    grey = _grey()
    turns, _ = _case(grey)
    answers = _run(_client(ckpt, SHOWN), turns[:2])
    assert answers == {"detection": "Answer: 1", "contour_eval": "Answer: 2"}
    answers = _run(_client(ckpt, np.zeros((H, W), bool)), turns[:1])
    assert answers == {"detection": "Answer: 2"}


def test_registry_entry_and_errors(ckpt, tmp_path):
    client = make_client(f"ils:{ckpt}")
    assert isinstance(client, IlsAgentClient) and client.identity["kind"] == "ils"
    assert len(client.identity["checkpoint_fingerprint"]) == 64
    with pytest.raises(ConfigError, match="needs a name"):
        make_client("ils")
    with pytest.raises(InputError, match="checkpoint"):
        make_client(f"ils:{tmp_path / 'nowhere'}")
