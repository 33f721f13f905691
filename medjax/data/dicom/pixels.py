"""Pixel arithmetic for `medjax.data.dicom`: decoded stored values -> float32 in [0, 1].

The rules (and why each is the way it is) are documented in `medjax.data.dicom`; this module only
implements them on arrays, so that it can be tested and reused without touching files.
"""

from __future__ import annotations

import numpy as np
from pydicom import multival
from pydicom.pixels import processing

# ITU-R BT.601 luma weights, the same ones DICOM's YBR_FULL uses, so RGB and YBR copies of an
# image give the same luminance up to rounding.
LUMA_RGB = (0.299, 0.587, 0.114)
# Robust window when a file carries no VOI: ignores the few hottest/coldest pixels (metal, air).
PERCENTILES = (0.5, 99.5)


class Unusable(ValueError):
  """An element the pixel rules need holds what they cannot use; str() is the reason, naming it
  (the file's caller makes it a RejectedFile)."""


def to_unit_range(arr: np.ndarray, ds, props: dict) -> np.ndarray:
  """Maps decoded pixels to float32 in [0, 1] (one channel).

  Args:
    arr: pixels as pydicom's decoder returns them: (H, W), (F, H, W), or with a trailing
      samples axis for colour.
    ds: the dataset the pixels came from (for the LUT, window and padding elements).
    props: the decoder's image pixel properties (photometric interpretation after any colour
      conversion, bits stored, samples per pixel).

  Returns:
    float32 array of shape (H, W) or (F, H, W), all values in [0, 1].
  """
  photometric = str(props["photometric_interpretation"])
  if photometric == "PALETTE COLOR":
    rgb = palette_rgb(arr, ds)
    # The LUT's entry depth (8 or 16 bits) is its output range, not the stored bits.
    return luminance(rgb, np.iinfo(rgb.dtype).max, "RGB")
  if int(props["samples_per_pixel"]) > 1:
    return luminance(arr, 2.0**int(props["bits_stored"]) - 1, photometric)
  return greyscale(arr, ds)


def luminance(pixels_xC: np.ndarray, max_value: float, photometric: str) -> np.ndarray:
  """0.299R + 0.587G + 0.114B over the last axis, divided by `max_value`, clipped to [0, 1]."""
  if photometric.startswith("YBR"):
    # Left as YBR by the decoder (e.g. YBR_PARTIAL_420): Y already is the luma.
    y = pixels_xC[..., 0].astype(np.float32)
  else:
    # Channel by channel in float32: a 120-frame colour cine would need ~1 GB as float64 RGB.
    y = pixels_xC[..., 0] * np.float32(LUMA_RGB[0])
    y += pixels_xC[..., 1] * np.float32(LUMA_RGB[1])
    y += pixels_xC[..., 2] * np.float32(LUMA_RGB[2])
  return np.clip(y / max_value, 0.0, 1.0).astype(np.float32)


def palette_rgb(indices: np.ndarray, ds) -> np.ndarray:
  """pydicom's apply_color_lut, with big-endian 16-bit LUT data put in little-endian order first.

  pydicom 3.0 reads (non-segmented) palette LUT data as little-endian whatever the transfer syntax,
  so a big-endian file's palette would come out byte-swapped (near-black images).
  """
  if ds.original_encoding[1] is False:
    entries = int(ds.RedPaletteColorLookupTableDescriptor[0]) or 2**16
    for colour in ("Red", "Green", "Blue", "Alpha"):
      keyword = f"{colour}PaletteColorLookupTableData"
      if keyword in ds and len(ds[keyword].value) == 2 * entries:
        ds[keyword].value = np.frombuffer(ds[keyword].value, ">u2").astype("<u2").tobytes()
  return processing.apply_color_lut(indices, ds)


def greyscale(stored: np.ndarray, ds) -> np.ndarray:
  """Padding mask, modality LUT, VOI (LUT, window or percentiles), inversion, padding -> 0."""
  padding = padding_mask(stored, ds)
  values = modality_lut(stored, ds)
  window = window_values(ds)
  if ds.get("VOILUTSequence"):
    out = voi_lut(values, ds)
  elif window is not None:
    out = apply_window(values, *window)
  else:
    out = percentile_window(values, None if padding is None else ~padding)
  # Either flag means "low values are bright"; MONOCHROME1 files often carry INVERSE as well, and
  # inverting twice would turn them back into negatives.
  if (ds.get("PhotometricInterpretation") == "MONOCHROME1"
      or ds.get("PresentationLUTShape") == "INVERSE"):
    out = 1.0 - out
  out = np.clip(out, 0.0, 1.0).astype(np.float32)
  if padding is not None:
    out[padding] = 0.0
  return out


def modality_lut(stored: np.ndarray, ds) -> np.ndarray:
  """pydicom's apply_modality_lut, once its inputs are known to be usable."""
  for keyword in ("RescaleSlope", "RescaleIntercept"):
    value = ds.get(keyword)
    if value in (None, ""):
      continue
    try:
      number = float(value)
    except (TypeError, ValueError):
      raise Unusable(f"{keyword} {str(value)!r} is not a number") from None
    if not np.isfinite(number):
      raise Unusable(f"{keyword} {str(value)!r} is not a finite number")
  try:
    with np.errstate(over="ignore", invalid="ignore"):   # checked just below
      values = processing.apply_modality_lut(stored, ds)
  except (IndexError, ValueError, TypeError, KeyError, AttributeError) as e:
    what = "Modality LUT Sequence" if ds.get("ModalityLUTSequence") else "modality LUT"
    raise Unusable(f"{what} unusable ({type(e).__name__}: {str(e)[:120]})") from e
  if not np.isfinite(values).all():
    raise Unusable(f"RescaleSlope {str(ds.get('RescaleSlope'))!r} and RescaleIntercept "
                   f"{str(ds.get('RescaleIntercept'))!r} take pixel values past float range")
  return values


def padding_mask(stored: np.ndarray, ds) -> np.ndarray | None:
  """True where the stored value is Pixel Padding Value (or within its Range Limit); else None."""
  value = ds.get("PixelPaddingValue")
  if value is None:
    return None
  limit = ds.get("PixelPaddingRangeLimit")
  low, high = (value, value) if limit is None else sorted((value, limit))
  mask = (stored >= low) & (stored <= high)
  return mask if mask.any() else None


def window_values(ds) -> tuple[float, float, str] | None:
  """(center, width, function) from the first Window Center/Width values, or None if unusable."""
  center, width = _first_float(ds.get("WindowCenter")), _first_float(ds.get("WindowWidth"))
  if center is None or width is None:
    return None
  function = str(ds.get("VOILUTFunction") or "LINEAR").strip().upper()
  function = function if function in ("LINEAR_EXACT", "SIGMOID") else "LINEAR"
  # PS3.3 C.11.2.1.2: LINEAR needs width >= 1, the others width > 0; a bad window is no window.
  if width < (1.0 if function == "LINEAR" else np.finfo(np.float64).tiny):
    return None
  return center, width, function


def apply_window(values: np.ndarray, center: float, width: float, function: str) -> np.ndarray:
  """The PS3.3 C.11.2.1.2 VOI functions, with output range [0, 1] instead of [ymin, ymax]."""
  values = np.asarray(values, dtype=np.float64)
  if function == "SIGMOID":
    with np.errstate(over="ignore"):  # exp overflow -> inf -> exactly 0, which is right
      return 1.0 / (1.0 + np.exp(-4.0 * (values - center) / width))
  if function == "LINEAR_EXACT":
    return np.clip((values - center) / width + 0.5, 0.0, 1.0)
  if width == 1.0:  # the LINEAR ramp has zero length: a step at c - 0.5
    return (values > center - 0.5).astype(np.float64)
  return np.clip((values - (center - 0.5)) / (width - 1.0) + 0.5, 0.0, 1.0)


def percentile_window(values: np.ndarray, keep: np.ndarray | None) -> np.ndarray:
  """clip((v - p0.5) / (p99.5 - p0.5), 0, 1) with percentiles over the `keep` pixels."""
  values = np.asarray(values, dtype=np.float64)
  kept = values if keep is None else values[keep]
  if kept.size == 0:
    return np.zeros(values.shape)
  low, high = np.percentile(kept, PERCENTILES)
  if high <= low:
    # Over 99% of pixels share one value (e.g. a sparse binary mask): spread the full range
    # rather than return black; a truly constant image still comes out all zeros.
    low, high = kept.min(), kept.max()
    if high <= low:
      return np.zeros(values.shape)
  return np.clip((values - low) / (high - low), 0.0, 1.0)


def voi_lut(values: np.ndarray, ds) -> np.ndarray:
  """The first VOI LUT, normalised by its output range [0, 2**bits - 1] (LUT Descriptor)."""
  item = ds.VOILUTSequence[0]
  try:
    _, first_mapped, bits = (int(v) for v in item.LUTDescriptor)
  except (AttributeError, TypeError, ValueError):
    raise Unusable("VOI LUT Sequence: LUTDescriptor is not three numbers") from None
  if not 1 <= bits <= 16:
    raise Unusable(f"VOI LUT Sequence: LUTDescriptor gives {bits} bits per entry (DICOM: 8 to "
                   "16)")
  data = item.get("LUTData")
  if isinstance(data, bytes):  # VR OW: raw 16-bit words in the dataset's byte order
    data = np.frombuffer(data[:len(data) // 2 * 2],
                         dtype="<u2" if ds.original_encoding[1] is not False else ">u2")
  lut = np.atleast_1d(np.asarray(data if data is not None else [], dtype=np.float64))
  if lut.size == 0:
    raise Unusable("VOI LUT Sequence: LUTData is empty")
  # Done here, not with pydicom's apply_voi, which indexes through an array of the LUT's own
  # dtype: an 8-bit LUT with more than 256 entries would wrap its indices around.
  index = np.clip(np.rint(values) - first_mapped, 0, lut.size - 1).astype(np.intp)
  return lut[index] / (2.0**bits - 1.0)


def _first_float(value) -> float | None:
  if isinstance(value, (multival.MultiValue, list, tuple)):
    value = value[0] if len(value) else None
  try:
    value = float(value)
  except (TypeError, ValueError):  # absent, empty or malformed: treated as absent
    return None
  return value if np.isfinite(value) else None
