"""The ``algorithm1`` negative check: a Brixia zone is flagged exactly where Algorithm 1, asked to ground an opacity
reported in that zone, draws a mask (the chain's own anomaly map and boxes), and not where the mask would lie on
the heart or mediastinum the chain clips lung-lesion masks off, and zones the report explains do not count (the
``ils build`` run is in ``test_negative_placement.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from cxrground.anatomy.ils_locations import ils_location_masks
from cxrground.ils.config import NEGATIVE_CHECKS, IlsConfig
from cxrground.ils.negative_flags import ZONE_LABELS, algorithm1_flags
from cxrground.ils.spatial.base import Box
from cxrground.ils.zone_map import BRIXIA_OF


def _film(lesion_rows: slice, lesion_cols: slice):
    """A 200 x 200 canvas: right lung (image left) columns 20-89, left lung columns 110-179, rows 20-179; one
    bright patch (anomaly 0.3) and a detector box around it."""
    shape = (200, 200)
    right = np.zeros(shape, bool)
    left = np.zeros(shape, bool)
    right[20:180, 20:90] = True
    left[20:180, 110:180] = True
    canvas = np.full(shape, 60.0)
    anomaly = np.zeros(shape)
    anomaly[lesion_rows, lesion_cols] = 0.3
    canvas[lesion_rows, lesion_cols] += 0.3 * 255
    box = Box(lesion_cols.start - 2, lesion_rows.start - 2, lesion_cols.stop + 1, lesion_rows.stop + 1, 0.9,
              "lung opacity")
    return canvas, anomaly, right, left, [box]


def _flags(canvas, anomaly, locations, right, left, boxes, centre=None):
    from cxrground.ils.grounding import ground_finding

    return algorithm1_flags(
        lambda probe: ground_finding(probe, canvas, anomaly, locations, right, left, None, boxes, IlsConfig()),
        locations, centre)


def test_zone_labels_are_the_brixia_zones_of_the_placement():
    assert {BRIXIA_OF[label]: zone for zone, label in ZONE_LABELS.items()} == {z: z for z in "ABCDEF"}
    assert "algorithm1" in NEGATIVE_CHECKS
    IlsConfig(negative_check="algorithm1")  # accepted


@pytest.mark.parametrize(("rows", "cols", "zone"), [
    (slice(140, 175), slice(30, 80), "C"),   # right base
    (slice(30, 60), slice(120, 170), "D"),   # left upper zone
    (slice(85, 115), slice(120, 170), "E"),  # left mid zone
])
def test_a_zone_is_flagged_where_algorithm1_grounds_an_opacity(rows, cols, zone):
    canvas, anomaly, right, left, boxes = _film(rows, cols)
    locations = ils_location_masks(right, left)
    flags = _flags(canvas, anomaly, locations, right, left, boxes)
    assert flags == {z: z == zone for z in "ABCDEF"}


def test_no_box_or_no_anomaly_flags_nothing_and_the_centre_clip_is_applied():
    canvas, anomaly, right, left, boxes = _film(slice(140, 175), slice(30, 80))
    locations = ils_location_masks(right, left)
    assert not any(_flags(canvas, anomaly, locations, right, left, []).values())
    assert not any(_flags(canvas, np.zeros_like(anomaly), locations, right, left, boxes).values())
    centre = np.zeros_like(right)
    centre[130:180, 20:90] = True  # the whole patch lies in the region masks are clipped off
    assert not any(_flags(canvas, anomaly, locations, right, left, boxes, centre).values())


def test_a_mask_selected_through_a_zone_but_lying_outside_it_does_not_flag_it(monkeypatch):
    from cxrground.ils import negative_flags

    canvas, anomaly, right, left, _ = _film(slice(0, 0), slice(0, 0))
    locations = ils_location_masks(right, left)
    top = int(np.flatnonzero(locations["right lung base"].any(axis=1))[0])
    anomaly[top - 30 : top, 22:81] = 0.3  # in the right mid zone, ending one row above the base
    canvas = np.full(canvas.shape, 60.0) + anomaly * 255
    box = Box(20, top - 30, 80, top + 30, 0.9, "lung opacity")  # half mid zone, half base: passes c1 for the base
    flags = _flags(canvas, anomaly, locations, right, left, [box])
    assert flags["B"] and not flags["C"]
    monkeypatch.setattr(negative_flags, "MIN_ZONE_COVER", 0.0)  # any mask at all: Algorithm 1 did select it
    assert _flags(canvas, anomaly, locations, right, left, [box])["C"]


def test_zones_the_report_explains_do_not_count():
    from cxrground.ils.negative_flags import explained_zones, unexplained
    from cxrground.reports.findings import Finding

    def finding(lesion, assertion, *where):
        return Finding(entity=lesion, sent_idx=1, assertion=assertion, lesion=lesion, reported_location=where)

    report = [finding("edema", "present", "right lung"), finding("effusion", "uncertain", "left lung base"),
              finding("pneumonia", "absent", "left upper zone lung"), finding("cardiomegaly", "present", "heart")]
    assert explained_zones(report) == {"A", "B", "C", "F"}
    flags = {z: True for z in "ABCDEF"}
    assert unexplained(flags, report) == {"A": False, "B": False, "C": False, "D": True, "E": True, "F": False}
    assert explained_zones([finding("opacity", "present")]) == set("ABCDEF")  # no location: every zone
    assert unexplained(flags, []) == flags
