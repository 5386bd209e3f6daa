"""Image reading: PNG/JPEG/16-bit PNG/DICOM (MONOCHROME1, 12/16-bit, windows, compressed), bad input."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from cxrground.errors import ImageReadError, MaskError
from cxrground.io.dicom import apply_window, write_dicom
from cxrground.io.image import CXRImage, read_image, read_images, to_uint8, write_image


def _ramp(h: int = 40, w: int = 64, high: int = 4095) -> np.ndarray:
    return np.tile(np.linspace(0, high, w).round().astype(np.uint16), (h, 1))


def test_png_and_jpeg(tmp_path):
    rng = np.random.default_rng(0)
    px = rng.integers(0, 256, (30, 50), dtype=np.uint8)
    png = write_image(tmp_path / "a.png", px)
    im = read_image(png)
    assert isinstance(im, CXRImage) and im.shape == (30, 50) and im.source_format == "png"
    np.testing.assert_array_equal(im.pixels, px)
    jpg = write_image(tmp_path / "a.jpg", np.full((30, 50), 120, np.uint8))
    im = read_image(jpg)
    assert im.source_format == "jpeg" and abs(int(im.pixels.mean()) - 120) <= 1


def test_rgb_png_becomes_grey(tmp_path):
    rgb = np.zeros((10, 12, 3), np.uint8)
    rgb[..., :] = 200
    Image.fromarray(rgb).save(tmp_path / "rgb.png")
    im = read_image(tmp_path / "rgb.png")
    assert im.pixels.shape == (10, 12) and im.pixels[0, 0] == 200


def test_16bit_png_is_scaled_to_8bit(tmp_path):
    arr = _ramp(high=60000)
    Image.fromarray(arr).save(tmp_path / "a16.png")
    im = read_image(tmp_path / "a16.png")
    assert im.bits_stored == 16
    assert im.pixels[0, 0] == 0 and im.pixels[0, -1] == 255
    assert np.all(np.diff(im.pixels[0].astype(int)) >= 0)


def test_dicom_monochrome2_window(tmp_path):
    arr = _ramp()
    path = write_dicom(tmp_path / "m2.dcm", arr, bits_stored=12, window=(2048, 1024), spacing=(0.139, 0.14))
    im = read_image(path)
    assert im.source_format == "dicom" and im.bits_stored == 12
    assert im.spacing == (0.139, 0.14) and im.view == "PA" and im.orientation == ("L", "F")
    # below the window -> 0, above -> 255, centre -> about 128
    assert im.pixels[0, 0] == 0 and im.pixels[0, -1] == 255
    # inside the window: DICOM linear formula ((x - (c - 0.5)) / (w - 1) + 0.5) * 255
    inside = (arr[0] > 1600) & (arr[0] < 2500)
    expected = ((arr[0][inside] - 2047.5) / 1023 + 0.5) * 255
    assert np.abs(im.pixels[0][inside] - expected).max() <= 0.5 + 1e-9


def test_dicom_monochrome1_is_inverted(tmp_path):
    arr = _ramp(high=65535)
    m1 = read_image(write_dicom(tmp_path / "m1.dcm", arr, photometric="MONOCHROME1", bits_stored=16))
    m2 = read_image(write_dicom(tmp_path / "m2.dcm", arr, photometric="MONOCHROME2", bits_stored=16))
    assert m1.photometric == "MONOCHROME1" and m1.bits_stored == 16
    np.testing.assert_array_equal(m1.pixels, 255 - m2.pixels)
    assert m1.pixels[0, 0] == 255 and m1.pixels[0, -1] == 0


def test_dicom_rescale_and_explicit_window(tmp_path):
    arr = _ramp(high=1000)
    # stored values 0..1000 with slope 2, intercept -1000 -> -1000..1000
    path = write_dicom(tmp_path / "r.dcm", arr, rescale=(2.0, -1000.0))
    im = read_image(path, window=(0.0, 2.0))  # everything below 0 black, above 0 white
    modality = arr[0].astype(float) * 2 - 1000
    assert (im.pixels[0][modality < -1] == 0).all() and (im.pixels[0][modality > 1] == 255).all()


def test_window_function_formula():
    # DICOM PS3.3 C.11.2.1.2.1 linear: c=50, w=11 -> x <= 44.5 -> 0, x > 54.5 -> 255
    out = apply_window(np.array([44.0, 45.0, 49.5, 54.0, 55.0]), 50, 11)
    assert out.tolist() == [0, 13, 128, 242, 255]
    assert apply_window(np.array([0.0]), 0, 10, "SIGMOID")[0] == 128


@pytest.mark.parametrize("syntax", ["1.2.840.10008.1.2.5", "1.2.840.10008.1.2.4.90"])
def test_dicom_compressed_rle_and_jpeg2000(tmp_path, syntax):
    arr = _ramp()
    plain = read_image(write_dicom(tmp_path / "p.dcm", arr, bits_stored=12))
    comp = read_image(write_dicom(tmp_path / "c.dcm", arr, bits_stored=12, transfer_syntax=syntax))
    assert comp.metadata["transfer_syntax"] == syntax
    np.testing.assert_array_equal(comp.pixels, plain.pixels)


def test_dicom_jpeg_baseline_decoded_by_pylibjpeg(tmp_path):
    from pydicom import dcmread
    from pydicom.encaps import encapsulate
    from pydicom.uid import JPEGBaseline8Bit

    px = np.tile(np.arange(0, 256, 4, dtype=np.uint8), (32, 1))
    path = write_dicom(tmp_path / "b.dcm", px)
    ds = dcmread(path)
    buf = io.BytesIO()
    Image.fromarray(px).save(buf, format="JPEG", quality=100)
    ds.PixelData = encapsulate([buf.getvalue()])
    ds["PixelData"].is_undefined_length = True
    ds.file_meta.TransferSyntaxUID = JPEGBaseline8Bit
    ds.save_as(tmp_path / "j.dcm")
    im = read_image(tmp_path / "j.dcm")
    assert np.abs(im.pixels.astype(int) - to_uint8(px).astype(int)).max() <= 3


def test_dicom_without_pixel_data(tmp_path):
    from pydicom import dcmread

    path = write_dicom(tmp_path / "x.dcm", np.zeros((4, 4), np.uint8))
    ds = dcmread(path)
    del ds.PixelData
    ds.save_as(tmp_path / "nopix.dcm")
    with pytest.raises(ImageReadError, match="no pixel data") as info:
        read_image(tmp_path / "nopix.dcm")
    assert "nopix.dcm" in str(info.value)


@pytest.mark.filterwarnings("ignore::UserWarning")  # pydicom warns while failing on the junk file
def test_bad_files_raise_with_path_and_reason(tmp_path):
    noise = np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)
    good = write_image(tmp_path / "good.png", noise)
    trunc = tmp_path / "trunc.png"
    trunc.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    junk = tmp_path / "junk.jpg"
    junk.write_bytes(b"hello, not an image")
    empty = tmp_path / "empty.png"
    empty.write_bytes(b"")
    baddcm = tmp_path / "bad.dcm"
    baddcm.write_bytes(b"\0" * 128 + b"DICM" + b"\x02\x00garbage")
    cases = {trunc: "corrupt", junk: "not a recognised image", empty: "empty", baddcm: "DICOM",
             tmp_path / "missing.png": "not found"}
    for path, reason in cases.items():
        with pytest.raises(ImageReadError) as info:
            read_image(path)
        assert str(path) in str(info.value) and reason in str(info.value), str(info.value)


def test_read_images_collects_failures_and_keeps_order(tmp_path):
    paths = [write_image(tmp_path / f"{i}.png", np.full((4, 4), i, np.uint8)) for i in range(3)]
    bad = tmp_path / "bad.png"
    bad.write_bytes(b"xx")
    images, failures = read_images([paths[0], bad, paths[1], tmp_path / "none.png", paths[2]], progress=False)
    assert [im.pixels[0, 0] for im in images] == [0, 1, 2]
    assert [f.path for f in failures] == [str(bad), str(tmp_path / "none.png")]
    assert all(f.stage == "images" and f.reason for f in failures)


def test_cxrimage_validates_pixels():
    with pytest.raises(ImageReadError, match="uint8"):
        CXRImage(pixels=np.zeros((4, 4), np.float32))
    im = CXRImage(pixels=np.zeros((3, 5), np.uint8))
    assert im.rgb().shape == (3, 5, 3) and (im.height, im.width) == (3, 5)


def test_truncated_png_is_an_error_even_when_pillow_is_told_to_tolerate_it(tmp_path, monkeypatch) -> None:
    """lmms-eval switches on Pillow's process-wide LOAD_TRUNCATED_IMAGES; our readers still refuse a cut file."""
    from PIL import ImageFile

    from cxrground.io.masks import read_mask_png

    path = tmp_path / "cut.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 256, (64, 64), dtype=np.uint8)).save(path)
    path.write_bytes(path.read_bytes()[:200])
    monkeypatch.setattr(ImageFile, "LOAD_TRUNCATED_IMAGES", True)
    with pytest.raises(ImageReadError, match="truncated or corrupt"):
        read_image(path)
    with pytest.raises(MaskError):
        read_mask_png(path)
    assert ImageFile.LOAD_TRUNCATED_IMAGES is True  # the caller's setting is left as it was


def test_formats_other_than_png_jpeg_dicom_are_refused_by_content_whatever_the_name(tmp_path):
    pixels = (np.arange(64 * 64) % 251).astype(np.uint8).reshape(64, 64)
    Image.fromarray(pixels).save(tmp_path / "film.png", format="TIFF")  # a TIFF named .png
    Image.fromarray(pixels).save(tmp_path / "film.bmp")
    Image.fromarray(pixels).save(tmp_path / "film.gif", save_all=True, append_images=[Image.fromarray(pixels.T)])
    for name, fmt in (("film.png", "TIFF"), ("film.bmp", "BMP"), ("film.gif", "GIF")):
        with pytest.raises(ImageReadError, match=f"unsupported image format {fmt} \\(use JPEG, PNG or DICOM\\)"):
            read_image(tmp_path / name)


def test_find_images_lists_unsupported_formats_extensionless_dicoms_and_films_behind_folder_links(tmp_path):
    from cxrground.io.image import find_images

    pixels = (np.arange(64 * 64) % 251).astype(np.uint8).reshape(64, 64)
    films, other = tmp_path / "films", tmp_path / "elsewhere"
    films.mkdir()
    other.mkdir()
    write_image(films / "a.png", pixels)
    Image.fromarray(pixels).save(films / "b.tif")
    write_dicom(films / "c.dcm", pixels.astype(np.uint16))
    (films / "c.dcm").rename(films / "c_no_suffix")
    (films / "notes.txt").write_text("not a film")
    (films / "plain_no_suffix").write_bytes(b"\x00" * 200)
    write_image(other / "d.jpg", pixels)
    (films / "linked").symlink_to(other, target_is_directory=True)
    (other / "back").symlink_to(films, target_is_directory=True)  # a loop: walked once
    found = [p.relative_to(films).as_posix() for p in find_images(films)]
    assert found == ["a.png", "b.tif", "c_no_suffix", "linked/d.jpg"]
    assert read_image(films / "c_no_suffix").source_format == "dicom"


def test_a_lower_case_view_reads_without_pydicom_warnings_and_a_truncated_plain_dicom_is_named_so(tmp_path):
    import warnings

    import pydicom

    path = write_dicom(tmp_path / "ap.dcm", (np.arange(64 * 64) % 4000).astype(np.uint16).reshape(64, 64))
    ds = pydicom.dcmread(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds.ViewPosition = "ap"
    ds.save_as(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert read_image(path).view == "ap"
    data = path.read_bytes()
    (tmp_path / "cut.dcm").write_bytes(data[: len(data) - 3000])
    with pytest.raises(ImageReadError, match=r"truncated or corrupt pixel data") as err:
        read_image(tmp_path / "cut.dcm")
    assert "pylibjpeg" not in str(err.value)


def test_scan_reads_the_view_of_a_dicom_from_its_header(tmp_path):
    import pydicom
    from click.testing import CliRunner

    from cxrground.cli import main

    for name, view in (("a.dcm", "AP"), ("b.dcm", "LL")):
        path = write_dicom(tmp_path / name, (np.arange(64 * 64) % 4000).astype(np.uint16).reshape(64, 64))
        ds = pydicom.dcmread(path)
        ds.ViewPosition = view
        ds.save_as(path)
    (tmp_path / "index.csv").write_text("image,study_id,report\na.dcm,s1,FINDINGS: x\nb.dcm,s2,FINDINGS: y\n")
    res = CliRunner().invoke(main, ["scan", "--images", str(tmp_path), "--index", str(tmp_path / "index.csv")])
    assert res.exit_code == 0 and "views of the images: AP 1, LL 1" in res.output, res.output


@pytest.mark.parametrize("orientation", [3, 6, 8, 2])
def test_a_jpeg_stored_turned_is_read_as_viewers_show_it(tmp_path, orientation):
    from PIL import Image, ImageOps

    from cxrground.io.image import image_header_size

    rng = np.random.default_rng(orientation)
    stored = np.zeros((40, 64), np.uint8)
    stored[5:15, 10:30] = 220  # a bright block near the top left of the stored pixels
    stored += rng.integers(0, 20, stored.shape, dtype=np.uint8)
    im = Image.fromarray(stored)
    exif = im.getexif()
    exif[0x0112] = orientation
    path = tmp_path / "turned.jpg"
    im.save(path, quality=95, exif=exif)
    with Image.open(path) as back:
        shown = np.asarray(ImageOps.exif_transpose(back).convert("L"))
    read = read_image(path)
    assert read.shape == shown.shape and np.array_equal(read.pixels, shown)
    assert read.shape == ((64, 40) if orientation >= 5 else (40, 64))
    assert read.metadata["exif_orientation"] == orientation
    assert image_header_size(path.read_bytes(), "jpeg") == read.shape
