"""Pictures — the one way a picture is read: a path, a file's bytes (an upload) or a PIL image → RGB, 8 bits a channel.

Pictures are read as Qwen-VL reads them: a JPEG's EXIF orientation tag is ignored by default (the picture is taken as
stored, like Qwen-VL's own preprocessing); `exif_transpose=True` turns it upright first. No torch: the grounding and
the toy data read pictures without it.
"""

import io
import os

import numpy as np
from PIL import Image, ImageOps, UnidentifiedImageError

from .checks.values import check_path, unusable_path


def to_8_bit(img: Image.Image) -> Image.Image:
    """A high-bit-depth greyscale picture as 8-bit "L"; other modes unchanged.

    Integer pictures ("I;16…" and "I", as Pillow reads 16-bit PNG, TIFF and PGM files) hold 16-bit samples: 0–65535
    maps to 0–255 (rounded; values outside are clipped). Float pictures ("F") are read as intensities from 0.0 (black)
    to 1.0 (white), values outside clipped; NaN or inf is refused.
    """
    if not (img.mode.startswith("I") or img.mode == "F"):
        return img
    samples = np.asarray(img, dtype=np.float64)  # [H, W]
    if img.mode == "F":
        if not np.isfinite(samples).all():
            raise ValueError("the float picture holds NaN or infinite pixels; give finite intensities from 0.0 to 1.0")
        scaled = np.clip(samples, 0.0, 1.0) * 255.0
    else:
        scaled = np.clip(samples, 0, 65535) * (255.0 / 65535.0)
    return Image.fromarray(np.rint(scaled).astype(np.uint8), mode="L")


def _as_rgb(img: Image.Image, exif_transpose: bool) -> Image.Image:
    """RGB copy of a picture: upright when `exif_transpose`, high bit depths scaled to 8 bits."""
    if exif_transpose:
        img = ImageOps.exif_transpose(img)
    return to_8_bit(img).convert("RGB")


def load_image(image, exif_transpose: bool = False) -> Image.Image:
    """The one way pictures are read: a path, a file's bytes (an upload) or a PIL image → RGB, 8 bits per channel.

    High bit depths are scaled to 8 bits (`to_8_bit`), so a picture gives the same pixels however it arrives. The EXIF
    orientation tag is ignored unless `exif_transpose` (Qwen-VL's preprocessing ignores it).
    """
    if isinstance(image, Image.Image):
        return _as_rgb(image, exif_transpose)
    if isinstance(image, (bytes, bytearray, memoryview)):
        source, name = io.BytesIO(bytes(image)), f"the {len(image)} bytes given"
    elif isinstance(image, (str, os.PathLike)):
        source, name = check_path("image path", image), repr(str(image))
        try:
            is_dir, is_file = source.is_dir(), source.is_file()
        except OSError as err:  # a name longer than the file system allows, a loop of links, no right to look
            raise ValueError(f"cannot use the image path {name}: {unusable_path(source, err)}") from None
        if is_dir:
            raise IsADirectoryError(f"image path {name} is a directory; give the path of a PNG/JPEG file in it")
        if not is_file:
            raise FileNotFoundError(f"image file not found: {name}; check the path in the {{'image': …}} element")
    else:
        raise TypeError(
            f"an image must be a path (str or os.PathLike), a file's bytes or a PIL image, got {type(image).__name__}"
        )
    try:
        with Image.open(source) as img:
            return _as_rgb(img, exif_transpose)
    except (UnidentifiedImageError, OSError, Image.DecompressionBombError, SyntaxError) as err:
        # Pillow's words for a file it does not know only name the file again (or a BytesIO object)
        reason = "not a picture file Pillow knows" if isinstance(err, UnidentifiedImageError) else err
        raise ValueError(f"cannot read {name} as an image ({reason}); give a PNG/JPEG file") from None
    except ValueError as err:
        raise ValueError(f"cannot read {name} as an image: {err}") from None
