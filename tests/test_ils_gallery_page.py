"""`ils gallery` page: small JPEG thumbnails, each study named by its film with a descriptive alt text, anchors with a
table of contents and a split/finding filter, and masks that stay visible when another mask covers them."""

from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cxrground.ils.build import DATASET_FILE
from cxrground.ils.gallery import render_gallery
from cxrground.ils.layout import MASK_DIR
from cxrground.ils.schema import SPLITS
from cxrground.io.overlay import PALETTE


def _images(tasks) -> Path:
    task = tasks[0][0]
    return Path(task.image_path[: -len(task.relative_image_path)])


@pytest.fixture
def dataset(build_tiny_ils, tmp_path) -> Path:
    """The tiny dataset with its 4 studies spread over the splits (2 train, 1 val, 1 test)."""
    ds = build_tiny_ils(tmp_path / "ils")
    data = json.loads((ds / DATASET_FILE).read_text())
    studies = [(key, study) for split in SPLITS for key, study in data.get(split, {}).items()]
    assert len(studies) == 4
    data.update(train=dict(studies[:2]), val=dict(studies[2:3]), test=dict(studies[3:]))
    (ds / DATASET_FILE).write_text(json.dumps(data))
    return ds


def _studies(ds: Path) -> list[tuple[str, str, dict]]:
    data = json.loads((ds / DATASET_FILE).read_text())
    return [(split, key, study) for split in SPLITS for key, study in data.get(split, {}).items()]


def _decoded(url: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))


def test_thumbnails_are_small_jpegs_and_each_study_names_its_film(dataset, tiny_ils_tasks, tmp_path):
    images = tmp_path / "films"
    shutil.copytree(_images(tiny_ils_tasks), images)
    studies = _studies(dataset)
    split, key, study = studies[0]
    odd = "sub dir/odd <b>'q' & é.png"
    (images / "sub dir").mkdir()
    shutil.copy(images / study["image_path"], images / odd)
    data = json.loads((dataset / DATASET_FILE).read_text())
    data[split][key]["image_path"] = odd
    (dataset / DATASET_FILE).write_text(json.dumps(data))
    page = tmp_path / "g.html"
    result = render_gallery(dataset, images, page, limit=10)
    text = page.read_text()
    assert result.shown == len(studies)
    imgs = re.findall(r"<img [^>]*alt='([^']*)' src='([^']*)'>", text)
    assert len(imgs) == len(studies) and "data:image/png" not in text
    for _alt, url in imgs:
        im = _decoded(url)
        assert url.startswith("data:image/jpeg;base64,") and im.format == "JPEG" and im.width <= 360
        assert len(url) < 40_000  # a 256-px synthetic film: a few KB, not a base64 PNG
    assert f"film <code>{html.escape(odd)}</code>" in text and "<b>'q'" not in text
    for _split, _key, s in studies[1:]:
        assert f"film <code>{html.escape(s['image_path'])}</code>" in text
    alts = dict((html.unescape(alt).split(":", 1)[0], html.unescape(alt)) for alt, _url in imgs)
    for _split, k, s in studies:
        lesions = list(dict.fromkeys(p["target"] for p in s["instruction_answer_pairs"]["positive_pairs"]))
        if not lesions:
            assert alts[k] == f"{k}: film without masks"
            continue
        assert alts[k].startswith(f"{k}: film with {lesions[0]} (cyan")
        assert alts[k].endswith(" masks" if len(lesions) > 1 else " mask")
        for lesion in lesions:
            assert lesion in alts[k]
    assert f"Films under <code>{html.escape(str(images))}</code>" in text


def test_studies_have_anchors_a_table_of_contents_and_a_filter(dataset, tiny_ils_tasks, tmp_path):
    studies = _studies(dataset)
    page = tmp_path / "g.html"
    render_gallery(dataset, _images(tiny_ils_tasks), page, limit=10)
    text = page.read_text()
    for split, key, study in studies:
        findings = list(dict.fromkeys(p["target"] for p in study["instruction_answer_pairs"]["positive_pairs"]))
        words = " ".join(findings) or "no-mask"
        assert f"<div class='study' id='{key}' data-split='{split}' data-findings='{words}'>" in text
        assert f"<a href='#{key}' data-split='{split}' data-findings='{words}'" in text
        for finding in findings:
            assert f"<option value='{finding}'>{finding}</option>" in text
    assert text.count("<details class='toc' open><summary>Contents</summary>") == 1
    assert "<p id='filters' hidden>" in text  # shown by the script: without it every study shows, no dead controls
    assert text.count("<script>") == 1 and "src=" not in text.split("<script>", 1)[1]
    assert "http://" not in text and "https://" not in text
    assert " hidden" not in text.replace("<p id='filters' hidden>", "")


def test_the_filter_in_a_browser(dataset, tiny_ils_tasks, tmp_path, page):
    studies = _studies(dataset)
    out = tmp_path / "g.html"
    render_gallery(dataset, _images(tiny_ils_tasks), out, limit=10)
    page.goto(out.as_uri())
    assert page.console_errors == []
    assert page.locator(".study:visible").count() == len(studies)
    assert page.locator("#f-count").inner_text() == f"{len(studies)} of {len(studies)} studies shown"
    page.select_option("#f-split", "val")
    want = [k for s, k, _ in studies if s == "val"]
    assert page.locator(".study:visible").count() == len(want) == 1
    assert page.locator(".toc a:visible").count() == len(want)
    assert page.locator("#f-count").inner_text() == f"1 of {len(studies)} studies shown"
    page.select_option("#f-split", "all")
    finding = next(p["target"] for _s, _k, st in studies for p in st["instruction_answer_pairs"]["positive_pairs"])
    page.select_option("#f-finding", finding)
    with_it = [k for _s, k, st in studies
               if any(p["target"] == finding for p in st["instruction_answer_pairs"]["positive_pairs"])]
    assert page.locator(".study:visible").count() == len(with_it) > 0
    page.click(f".toc a[href='#{with_it[-1]}']")
    assert page.url.endswith(f"#{with_it[-1]}")
    assert page.console_errors == []


def _near(rgb: np.ndarray, colour: tuple[float, float, float], tol: float = 60.0) -> int:
    """Pixels of an RGB thumbnail within ``tol`` of a palette colour."""
    want = np.asarray(colour) * 255
    return int((np.linalg.norm(rgb.astype(float) - want, axis=2) < tol).sum())


def _gallery_with_second_mask(dataset, tiny_ils_tasks, tmp_path, name: str, instruction: str,
                              draw) -> tuple[str, dict, str, str]:
    """The gallery of ``dataset`` after the first study with positives keeps the pairs of its first mask and gains
    one finding ``name`` whose mask ``draw(first mask image, path)`` writes; (study key, the first pair, the whole
    page, the study's block)."""
    data = json.loads((dataset / DATASET_FILE).read_text())
    split, key, study = next((s, k, st) for s, k, st in _studies(dataset)
                             if st["instruction_answer_pairs"]["positive_pairs"])
    pairs = study["instruction_answer_pairs"]["positive_pairs"]
    first = pairs[0]
    path = first["seg_mask_path"].replace(".png", f"_{name}.png")
    draw(dataset / MASK_DIR / first["seg_mask_path"], dataset / MASK_DIR / path)
    extra = {**first, "target": name, "seg_mask_path": path, "pair_id": f"{key}_positive_{name}",
             "instruction": instruction}
    data[split][key]["instruction_answer_pairs"]["positive_pairs"] = [
        p for p in pairs if p["seg_mask_path"] == first["seg_mask_path"]] + [extra]
    (dataset / DATASET_FILE).write_text(json.dumps(data))
    page = tmp_path / "g.html"
    render_gallery(dataset, _images(tiny_ils_tasks), page, limit=10)
    text = page.read_text()
    return key, first, text, text.split(f"id='{key}'", 1)[1].split("<div class='study", 1)[0]


def test_a_mask_identical_to_an_earlier_one_stays_visible_and_says_so(dataset, tiny_ils_tasks, tmp_path):
    """Two findings whose masks have the same pixels (files of their own): the first is filled in its colour, the
    second ringed just outside it in its own, so both colours show; the second's pair rows say "same mask as"."""
    key, first, text, block = _gallery_with_second_mask(dataset, tiny_ils_tasks, tmp_path, "twinlesion",
                                                        "Segment the twin.", shutil.copy)
    lesion = first["target"]
    row = block.split("Segment the twin.", 1)[0].rsplit("<tr>", 1)[1]
    assert f"same mask as {lesion} (cyan): drawn as an outer outline" in row
    assert "border:2px solid #ff3333" in row
    alt = html.unescape(re.search(r"alt='([^']*)'", block).group(1))
    assert alt == f"{key}: film with {lesion} (cyan) and twinlesion (red, outer outline) masks"
    rgb = np.asarray(_decoded(re.search(r"src='([^']*)'", block).group(1)).convert("RGB"))
    cyan, red = _near(rgb, PALETTE[0]), _near(rgb, PALETTE[1])
    assert cyan >= 20 and red >= 20, (cyan, red)
    assert "same mask as" not in text.replace(block, "")  # no note on studies without shared masks


def test_a_later_mask_that_would_hide_an_earlier_one_is_drawn_as_an_outline(dataset, tiny_ils_tasks, tmp_path):
    """A later finding whose mask covers an earlier one (here: the earlier mask grown by a few pixels) is not filled
    over it: it is ringed in its own colour, the earlier mask keeps its fill, and its rows say "covers the mask of"."""
    from PIL import ImageFilter

    def grown(src, dst) -> None:
        Image.open(src).filter(ImageFilter.MaxFilter(9)).save(dst)

    _key, first, _text, block = _gallery_with_second_mask(dataset, tiny_ils_tasks, tmp_path, "biglesion",
                                                          "Segment the big one.", grown)
    small = Image.open(dataset / MASK_DIR / first["seg_mask_path"])
    row = block.split("Segment the big one.", 1)[0].rsplit("<tr>", 1)[1]
    assert f"covers the mask of {first['target']} (cyan): drawn as an outer outline" in row
    rgb = np.asarray(_decoded(re.search(r"src='([^']*)'", block).group(1)).convert("RGB"))
    assert _near(rgb, PALETTE[0]) >= 20 and _near(rgb, PALETTE[1]) >= 20
    mask = np.asarray(small.resize((rgb.shape[1], rgb.shape[0]))) > 127
    inside = rgb[mask].astype(float)
    assert inside[:, 2].mean() - inside[:, 0].mean() > 20  # the earlier mask keeps its cyan fill, not tinted red
