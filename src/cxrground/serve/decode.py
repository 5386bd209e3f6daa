"""Client bytes → :class:`~cxrground.io.image.CXRImage`, with the server's limits enforced.

The type is sniffed from the content (PNG signature, JPEG SOI marker, DICOM ``DICM`` marker), never
taken from a file name or a declared content type. The pixel count is read from the header before
the pixels are decoded (by the format's header parser, so an image over PIL's decompression-bomb limit
is refused with 413 like any other, never decoded). Strings may carry an image as plain base64 or as a
``data:`` URL; remote URLs (``http(s)://``) are never fetched and anything that looks like a file-system path
(``/x/y.png``, ``./y.png``, ``C:\\y.png``, ``file:...``) is refused: the server reads no files named
by clients.
"""

from __future__ import annotations

import base64
import binascii
import re

from cxrground.errors import ImageReadError
from cxrground.io.image import CXRImage, image_header_pixels, image_header_size, read_image_bytes, sniff_type
from cxrground.serve.limits import ApiError, Limits

__all__ = ["decode_image_bytes", "decode_image_string", "image_header_size", "pixel_limit", "sniff_type"]

_PATH_LIKE = re.compile(r"^(file:|~|\.{0,2}/|\\\\|[A-Za-z]:[\\/])|\.(png|jpe?g|dcm|dicom|tiff?|bmp)$", re.IGNORECASE)
_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[\w.+-]+=[\w.+-]+)*)(?P<b64>;base64)?,",
                       re.IGNORECASE)


#: Largest ratio of an image's sides the server reads (a 1 x 20,000,000 strip is within the pixel limit but no film,
#: and costs seconds of model time).
MAX_ASPECT = 8


def pixel_limit(limits: Limits) -> int:
    """Most pixels an image may state: ``limits.max_pixels``, capped by PIL's decompression-bomb error limit."""
    from PIL import Image

    pil = Image.MAX_IMAGE_PIXELS
    return limits.max_pixels if pil is None else min(limits.max_pixels, 2 * int(pil))


def decode_image_bytes(data: bytes, limits: Limits) -> CXRImage:
    """Check size, type and pixel count of uploaded bytes, then read them as a CXR image.

    A client's file name is never used (neither to pick the reader nor as the image's ``path``).
    """
    if not data:
        raise ApiError(400, "invalid_image", "the image is empty (0 bytes)")
    if len(data) > limits.max_upload_bytes:
        raise ApiError(413, "payload_too_large",
                       f"image is {len(data)} bytes; the limit is {limits.max_upload_bytes} bytes")
    kind = sniff_type(data)
    if kind is None or kind not in limits.allowed_types:
        what = "an unrecognised format" if kind is None else kind.upper()
        allowed = ", ".join(t.upper() for t in limits.allowed_types)
        raise ApiError(415, "unsupported_media_type", f"the image is {what}; this server accepts {allowed}")
    try:
        h, w, n = image_header_pixels(data, kind)
        if n > pixel_limit(limits):
            frames = "" if n == h * w else f" in {n // max(1, h * w)} frames or samples"
            raise ApiError(413, "too_many_pixels",
                           f"image is {w}x{h}{frames} = {n} pixels; the limit is {pixel_limit(limits)} pixels")
        if max(h, w) > MAX_ASPECT * max(1, min(h, w)):
            raise ApiError(400, "invalid_image", f"image is {w}x{h}: sides more than {MAX_ASPECT}:1 apart are no "
                                                 "chest film")
        return read_image_bytes(data)
    except ImageReadError as exc:
        raise ApiError(400, "invalid_image", f"cannot decode the {kind.upper()} image: {exc.reason}") from exc


def decode_image_string(text: str, limits: Limits, *, data_url_only: bool = False) -> CXRImage:
    """Decode an image sent as a ``data:`` URL or (unless ``data_url_only``) plain base64."""
    text = (text or "").strip()
    if not text:
        raise ApiError(400, "invalid_image", "no image given")
    low = text[:16].lower()
    if low.startswith(("http://", "https://", "ftp://")):
        raise ApiError(400, "invalid_image", "remote URLs are not fetched; send the image as a base64 data URL")
    if low.startswith("data:"):
        match = _DATA_URL.match(text)
        if match is None or not match["b64"]:
            raise ApiError(400, "invalid_image", "data URL must be of the form data:<type>;base64,<data>")
        return decode_image_bytes(_b64decode(text[match.end():], limits), limits)
    if data_url_only or _looks_like_path(text):
        if _PATH_LIKE.search(text) and len(text) < 4096:
            raise ApiError(400, "invalid_image",
                           "file-system paths are not accepted; send the image bytes (upload, base64 or data URL)")
        raise ApiError(400, "invalid_image", "the image must be a data URL (data:image/png;base64,...)")
    return decode_image_bytes(_b64decode(text, limits), limits)


def _looks_like_path(text: str) -> bool:
    """A short string that reads as a path and does not decode to a known image type."""
    if len(text) >= 4096 or not _PATH_LIKE.search(text):
        return False
    try:
        head = base64.b64decode(text[:400], validate=True)
    except (binascii.Error, ValueError):
        return True
    return sniff_type(head + b"\0" * 132) is None


def _b64decode(payload: str, limits: Limits) -> bytes:
    payload = re.sub(r"\s+", "", payload)
    if len(payload) > limits.max_body_bytes:
        raise ApiError(413, "payload_too_large",
                       f"base64 image is {len(payload)} characters; the limit is {limits.max_upload_bytes} bytes "
                       "of image data")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ApiError(400, "invalid_image", f"image is not valid base64 ({exc})") from exc
