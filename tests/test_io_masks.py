"""Mask codecs: COCO RLE, CheXmask RLE, PNG; shape and dtype checks."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from cxrground.errors import MaskError, MaskShapeError
from cxrground.io.masks import (
    as_mask,
    check_same_shape,
    check_shape,
    column_major_runs,
    decode_chexmask_rle,
    decode_rle,
    encode_chexmask_rle,
    encode_rle,
    read_mask_png,
    rle_counts,
    rle_overlap,
    rle_string_counts,
    write_mask_png,
)


@pytest.fixture
def blob() -> np.ndarray:
    rng = np.random.default_rng(3)
    m = np.zeros((37, 53), dtype=bool)
    m[5:20, 7:30] = True
    m[25:, 40:] = True
    m ^= rng.random(m.shape) > 0.97
    return m


def test_coco_rle_round_trip(blob):
    rle = encode_rle(blob)
    assert rle["size"] == [37, 53]
    assert isinstance(rle["counts"], str)
    np.testing.assert_array_equal(decode_rle(rle), blob)


def test_coco_rle_uncompressed_counts_and_column_major_order():
    # column-major: a mask with only the top-left pixel of the second column set
    m = np.zeros((3, 2), dtype=bool)
    m[0, 1] = True
    rle = {"size": [3, 2], "counts": [3, 1, 2]}
    np.testing.assert_array_equal(decode_rle(rle), m)
    np.testing.assert_array_equal(decode_rle(encode_rle(m)), m)


def test_coco_rle_empty_and_full():
    for m in (np.zeros((4, 5), bool), np.ones((4, 5), bool)):
        np.testing.assert_array_equal(decode_rle(encode_rle(m)), m)


def test_rle_shape_check_names_both_shapes(blob):
    with pytest.raises(MaskShapeError) as info:
        decode_rle(encode_rle(blob), shape=(53, 37))
    assert "(37, 53)" in str(info.value) and "(53, 37)" in str(info.value)


def test_rle_bad_counts():
    with pytest.raises(MaskError, match="sum to"):
        decode_rle({"size": [2, 2], "counts": [1, 1]})
    with pytest.raises(MaskError, match="not a COCO RLE"):
        decode_rle({"counts": "abc"})


def _counts_one_by_one(data: bytes) -> list[int] | str:
    """pycocotools' rleFrString written out character by character (the reference), or the fault it meets."""
    runs: list[int] = []
    p = 0
    while p < len(data):
        x, k, more = 0, 0, True
        while more:
            if p >= len(data):
                return "ends inside a run length"
            c = data[p] - 48
            if not 0 <= c < 64:
                return "outside '0'..'o'"
            x |= (c & 0x1F) << (5 * k)
            more = bool(c & 0x20)
            p, k = p + 1, k + 1
            if not more and c & 0x10:
                x |= -1 << (5 * k)
        runs.append(x + runs[-2] if len(runs) > 2 else x)
    return runs


def test_rle_string_counts_match_pycocotools_reading_on_masks_and_on_any_string(blob):
    rng = np.random.default_rng(0)
    masks = [blob, np.zeros((4, 5), bool), np.ones((4, 5), bool), rng.random((60, 45)) > 0.5]
    big = np.zeros((900, 700), bool)
    big[100:800:3, 50:650] = True  # long and many runs: several characters per value, large deltas
    for m in [*masks, big]:
        counts = encode_rle(m)["counts"]
        assert rle_string_counts(counts) == _counts_one_by_one(counts.encode()) == column_major_runs(m).tolist()
        np.testing.assert_array_equal(rle_counts({"size": list(m.shape), "counts": counts}), column_major_runs(m))
    for data in [bytes(rng.integers(40, 120, int(rng.integers(0, 25)))) for _ in range(3000)] + [b"o" * 30 + b"0"]:
        expected = _counts_one_by_one(data)
        if isinstance(expected, str):
            with pytest.raises(MaskError, match=expected.replace(".", r"\.")):
                rle_string_counts(data)
        else:
            assert rle_string_counts(data) == expected, data


def test_rle_counts_are_checked_as_decode_checks_them(blob):
    with pytest.raises(MaskShapeError):
        rle_counts(encode_rle(blob), (53, 37))
    with pytest.raises(MaskError, match="sum to"):
        rle_counts({"size": [2, 2], "counts": [1, 1]})
    with pytest.raises(MaskError, match="negative"):
        rle_counts({"size": [2, 2], "counts": [5, -1]})
    with pytest.raises(MaskError, match="sum to"):
        rle_counts({"size": [2, 2], "counts": "o" * 12 + "0"})  # one run far too long (as a string)
    with pytest.raises(MaskError, match="a string or a list"):
        rle_counts({"size": [2, 2], "counts": 4})


def test_rle_overlap_counts_pixels_without_decoding():
    rng = np.random.default_rng(1)
    for i in range(200):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        a, b = rng.random((h, w)) < rng.random(), rng.random((h, w)) < rng.random()
        a[:] = False if i % 7 == 0 else a
        b[:] = True if i % 11 == 0 else b
        ra = encode_rle(a) if i % 2 else {"size": [h, w], "counts": column_major_runs(a).tolist()}
        assert rle_overlap(ra, encode_rle(b), (h, w)) == (int(a.sum()), int(b.sum()), int((a & b).sum()))
    with pytest.raises(MaskShapeError):
        rle_overlap(encode_rle(a), encode_rle(b), (h + 1, w))


def test_chexmask_rle_known_string():
    # 2x3 mask, row-major: pixels 2,3 (1-indexed) and 6
    m = np.array([[0, 1, 1], [0, 0, 1]], dtype=bool)
    assert encode_chexmask_rle(m) == "2 2 6 1"
    np.testing.assert_array_equal(decode_chexmask_rle("2 2 6 1", (2, 3)), m)


def test_chexmask_rle_round_trip_and_empty(blob):
    np.testing.assert_array_equal(decode_chexmask_rle(encode_chexmask_rle(blob), blob.shape), blob)
    assert encode_chexmask_rle(np.zeros((3, 3), bool)) == ""
    assert not decode_chexmask_rle("-1", (3, 3)).any()


def test_chexmask_rle_errors():
    with pytest.raises(MaskError, match="odd number"):
        decode_chexmask_rle("1 2 3", (3, 3))
    with pytest.raises(MaskError, match="outside"):
        decode_chexmask_rle("8 5", (3, 3))
    with pytest.raises(MaskError, match="non-integer"):
        decode_chexmask_rle("1 x", (3, 3))


def test_png_round_trip_values(tmp_path, blob):
    path = write_mask_png(tmp_path / "m.png", blob)
    raw = np.asarray(Image.open(path))
    assert raw.dtype == np.uint8 and set(np.unique(raw)) <= {0, 255}
    np.testing.assert_array_equal(read_mask_png(path, blob.shape), blob)


def test_png_wrong_size_names_file_and_shapes(tmp_path, blob):
    path = write_mask_png(tmp_path / "m.png", blob)
    with pytest.raises(MaskShapeError) as info:
        read_mask_png(path, (10, 10))
    msg = str(info.value)
    assert str(path) in msg and "(37, 53)" in msg and "(10, 10)" in msg


def test_png_corrupt_and_missing(tmp_path):
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\nnot really")
    with pytest.raises(MaskError, match=str(bad)):
        read_mask_png(bad)
    with pytest.raises(MaskError, match="not found"):
        read_mask_png(tmp_path / "none.png")


def test_as_mask_validation():
    assert as_mask(np.array([[0, 255]], np.uint8)).tolist() == [[False, True]]
    assert as_mask(np.array([[0, 1]], np.int64)).tolist() == [[False, True]]
    with pytest.raises(MaskError, match="not binary"):
        as_mask(np.array([[0, 7]], np.uint8))
    with pytest.raises(MaskError, match="2-D"):
        as_mask(np.zeros((2, 2, 2), bool))
    with pytest.raises(MaskError, match="dtype"):
        as_mask(np.array([["a"]]))


def test_shape_checks():
    a, b = np.zeros((2, 3), bool), np.zeros((3, 2), bool)
    assert check_same_shape(("a", a), ("c", a.copy())) == (2, 3)
    with pytest.raises(MaskShapeError, match=r"\(3, 2\).*\(2, 3\)"):
        check_same_shape(("a", a), ("b", b))
    with pytest.raises(MaskShapeError):
        check_shape(a, (3, 2))


def test_encode_rle_matches_pycocotools_on_random_and_edge_masks():
    """The bounding-box RLE encoder gives pycocotools' own string: random masks, boxes, runs that go on from the
    bottom of one column to the top of the next, masks ending in a 1-run, empty and full masks."""
    from pycocotools import mask as coco_mask

    from cxrground.io.masks import column_major_runs, encode_rle

    rng = np.random.default_rng(3)
    cases = [np.zeros((4, 6), bool), np.ones((4, 6), bool), np.ones((1, 1), bool)]
    for _ in range(60):
        h, w = (int(v) for v in rng.integers(1, 30, 2))
        cases.append(rng.random((h, w)) < rng.random())
        box = np.zeros((h, w), bool)
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, 2))
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, 2))
        box[y0 : y1 + 1, x0 : x1 + 1] = True
        edges = box.copy()
        edges[0], edges[-1] = True, True
        cases += [box, edges]
    for m in cases:
        ref = coco_mask.encode(np.asfortranarray(m.view(np.uint8)))["counts"].decode("ascii")
        assert encode_rle(m)["counts"] == ref
        assert int(column_major_runs(m).sum()) == m.size


def test_read_mask_png_refuses_a_colour_image_and_a_film(tmp_path):
    rgb = np.zeros((20, 30, 3), np.uint8)
    rgb[5:10, 5:10, 0] = 255  # a red square
    Image.fromarray(rgb).save(tmp_path / "red.png")
    with pytest.raises(MaskError, match="colour image") as raised:
        read_mask_png(tmp_path / "red.png")
    assert "red.png" in str(raised.value)
    grey_rgb = np.repeat((rgb[..., :1] > 0).astype(np.uint8) * 255, 3, axis=2)  # a mask saved as RGB: accepted
    Image.fromarray(grey_rgb).save(tmp_path / "grey_rgb.png")
    assert read_mask_png(tmp_path / "grey_rgb.png").sum() == 25
    film = np.random.default_rng(0).integers(0, 256, (20, 30), dtype=np.uint8)
    Image.fromarray(film).save(tmp_path / "film.png")
    with pytest.raises(MaskError, match=r"not a mask: .* grey levels"):
        read_mask_png(tmp_path / "film.png")
    soft = np.zeros((20, 30), np.uint8)
    soft[5:15, 5:15] = 255
    soft[5:15, 15] = 128  # an anti-aliased edge: a few per cent of the pixels, accepted
    Image.fromarray(soft).save(tmp_path / "soft.png")
    assert read_mask_png(tmp_path / "soft.png").sum() == 100
    half = (soft == 255).astype(np.uint8) * 128  # a 0/128 mask: refused rather than read as empty
    Image.fromarray(half).save(tmp_path / "half.png")
    with pytest.raises(MaskError, match=r"values go from 0 to 128, and none reaches 255") as raised:
        read_mask_png(tmp_path / "half.png")
    assert "half.png" in str(raised.value)
    Image.fromarray(np.zeros((20, 30), np.uint8)).save(tmp_path / "empty.png")
    assert not read_mask_png(tmp_path / "empty.png").any()


def test_overlay_names_the_image_shape_for_a_mask_of_another_size():
    from cxrground.io.overlay import overlay_masks

    with pytest.raises(MaskShapeError, match=r"overlay mask 0 has shape \(10, 512\), expected \(562, 512\)"):
        overlay_masks(np.zeros((562, 512), np.uint8), [np.zeros((10, 512), bool)])


def test_as_cxr_image_takes_a_path_or_pixels_and_names_anything_else(tmp_path):
    from cxrground.errors import InputError
    from cxrground.io.image import CXRImage, as_cxr_image

    px = np.full((8, 9), 100, np.uint8)
    Image.fromarray(px).save(tmp_path / "f.png")
    assert as_cxr_image(str(tmp_path / "f.png")).shape == (8, 9)
    assert as_cxr_image(px).shape == (8, 9)
    im = CXRImage(px)
    assert as_cxr_image(im) is im
    with pytest.raises(InputError, match="2-D uint8"):
        as_cxr_image(np.zeros((8, 9, 3)))
    with pytest.raises(InputError, match="expected a CXRImage, a file path or a 2-D uint8 array, got int"):
        as_cxr_image(3)
