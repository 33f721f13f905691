"""DICOM files -> headers and float32 images in [0, 1]; anything unusable is a RejectedFile.

`read_header` parses the header without loading pixel data and rejects, with a short reason:
files that are not DICOM (a file without preamble/'DICM' is accepted only if, read as a bare
dataset, it has a SOP Class UID or pixel data); truncated files (any element whose declared
length runs past the end of the file, or an undefined-length element, such as encapsulated pixel
data, whose delimiter is missing); objects without Pixel Data (SR, RT Plan, RT Struct, ECG...);
malformed image geometry; native pixel data shorter than Rows x Columns x Frames x Samples x
BitsAllocated / 8; transfer syntaxes no installed plugin decodes; missing or empty PatientID.

`load_image` makes the same checks except PatientID (it needs only pixels), then decodes with
pydicom's plugins (native, deflate, big endian, RLE, JPEG, JPEG-LS, JPEG 2000). Every failure,
whatever raised it, becomes RejectedFile. The pixel rules, which a synthetic cohort generator
relies on so that every encoding of an image decodes to the same array, are:

1. Colour (SamplesPerPixel > 1; YBR is converted to RGB by the decoder): luminance
   0.299 R + 0.587 G + 0.114 B divided by 2**BitsStored - 1. PALETTE COLOR goes through its
   palette LUT first and is divided by 2**(LUT entry bits) - 1. No rescale, window or padding.
2. Greyscale, in order:
   a. Padding: stored values (before rescale) equal to PixelPaddingValue, or between it and
      PixelPaddingRangeLimit inclusive, are padding.
   b. Modality LUT: Modality LUT Sequence, else RescaleSlope/RescaleIntercept (pydicom's
      apply_modality_lut). Per-frame functional groups are not read.
   c. VOI, the first that applies:
      - VOI LUT Sequence: the first LUT, output divided by 2**(LUT Descriptor bits) - 1.
      - WindowCenter/WindowWidth: their FIRST values c, w, by VOILUTFunction (default LINEAR):
        LINEAR (PS3.3 C.11.2.1.2.1): 0 if x <= c - 0.5 - (w-1)/2, 1 if x > c - 0.5 + (w-1)/2,
          else (x - (c - 0.5)) / (w - 1) + 0.5; needs w >= 1.
        LINEAR_EXACT: 0 if x <= c - w/2, 1 if x > c + w/2, else (x - c) / w + 0.5; needs w > 0.
        SIGMOID: 1 / (1 + exp(-4 (x - c) / w)); needs w > 0.
        A window that breaks these conditions is ignored.
      - Otherwise percentiles over all non-padding pixels (all frames together) after the
        modality LUT: low, high = np.percentile(v, [0.5, 99.5]) (linear interpolation), output
        clip((v - low) / (high - low), 0, 1). If high == low, min and max replace them; if those
        are equal too (a constant image), the output is all zeros.
   d. Inversion, once: if PhotometricInterpretation is MONOCHROME1 OR PresentationLUTShape is
      INVERSE, out = 1 - out. So a MONOCHROME1 file whose stored values are M - x decodes like the
      MONOCHROME2 file holding x when windowed by percentiles.
   e. Padding pixels are set to exactly 0.0 (after inversion); the result is clipped to [0, 1].
Output: float32, (H, W), or (F, H, W) when NumberOfFrames > 1.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pydicom
from pydicom import dataelem
from pydicom import errors
from pydicom import uid as uids
from pydicom.pixels import utils as pixel_utils

from medjax.data import dicom_pixels

# Elements longer than this stay on disk until asked for, so headers never load pixel data.
_DEFER_BYTES = 1024
_PIXEL_DATA = 0x7FE00010
_FLOAT_PIXEL_DATA = (0x7FE00008, 0x7FE00009)
_UNDEFINED_LENGTH = 0xFFFFFFFF


class RejectedFile(Exception):
  """A file that cannot be used as an image; the only exception this module raises.

  Attributes:
    path: the file.
    reason: short human-readable reason, e.g. 'truncated pixel data: 4096 of 8192 bytes'.
  """

  def __init__(self, path: str, reason: str):
    super().__init__(f"{path}: {reason}")
    self.path = str(path)
    self.reason = reason

  def __reduce__(self):  # the default would re-call __init__ with the message alone
    return type(self), (self.path, self.reason)


@dataclasses.dataclass(frozen=True)
class Header:
  """What ingest needs to know about an image file; no names, dates or UIDs.

  Attributes:
    patient_id: raw PatientID. Callers hash it; never log it (it is left out of repr()).
    modality: e.g. 'CT'; '' when absent.
    sop_class: SOP class name, e.g. 'CT Image Storage'.
    rows, columns, frames, samples_per_pixel: image geometry (frames is 1 for single-frame).
    transfer_syntax: transfer syntax name, e.g. 'JPEG 2000 Image Compression (Lossless Only)'.
    photometric: PhotometricInterpretation as stored, e.g. 'MONOCHROME1', 'YBR_FULL_422'.
    pixel_bytes: Pixel Data length as stored; for encapsulated (undefined length) data, the
      bytes from its start to the end of the file.
  """
  patient_id: str = dataclasses.field(repr=False)
  modality: str
  sop_class: str
  rows: int
  columns: int
  frames: int
  samples_per_pixel: int
  transfer_syntax: str
  photometric: str
  pixel_bytes: int


def read_header(path: str | os.PathLike) -> Header:
  """Reads and checks a DICOM header without loading or decoding its pixel data.

  Args:
    path: the file.

  Returns:
    The file's Header.

  Raises:
    RejectedFile: see the module docstring for the reasons; nothing else is raised.
  """
  path = os.fspath(path)
  _, header = _guarded(path, _inspect)
  if not header.patient_id.strip():
    raise RejectedFile(path, "missing PatientID")
  return header


def load_image(path: str | os.PathLike) -> np.ndarray:
  """Decodes a DICOM image to float32 in [0, 1] by the rules in the module docstring.

  PatientID is not required here; use `read_header` to vet files for a cohort.

  Args:
    path: the file.

  Returns:
    float32 array, (H, W), or (F, H, W) for multi-frame files.

  Raises:
    RejectedFile: for every failure, including ones raised inside pydicom or its plugins.
  """
  path = os.fspath(path)
  return _guarded(path, _load)


def _guarded(path, fn):
  try:
    return fn(path)
  except RejectedFile:
    raise
  except Exception as e:  # pylint: disable=broad-except  # callers get RejectedFile, always
    raise RejectedFile(path, f"unreadable: {_describe(e)}") from e


def _load(path: str) -> np.ndarray:
  ds, header = _inspect(path)
  ts = ds.file_meta.TransferSyntaxUID
  try:
    arr, props = pydicom.pixels.get_decoder(ts).as_array(ds)
  except Exception as e:  # pylint: disable=broad-except
    raise RejectedFile(path, f"undecodable {header.transfer_syntax} pixel data: "
                       f"{_describe(e)}") from e
  return dicom_pixels.to_unit_range(arr, ds, props)


def _inspect(path: str):
  """Returns (dataset with pixel data deferred, Header) or raises RejectedFile."""
  ds = _read(path)
  _check_lengths(path, ds)
  sop_class = ds.get("SOPClassUID")
  sop_name = getattr(sop_class, "name", None) or "unknown"
  if _PIXEL_DATA not in ds:
    if any(tag in ds for tag in _FLOAT_PIXEL_DATA):
      raise RejectedFile(path, f"float pixel data is not supported (SOP class {sop_name})")
    raise RejectedFile(path, f"no pixel data (SOP class {sop_name})")
  ts = _transfer_syntax(path, ds)
  photometric = str(ds.get("PhotometricInterpretation") or "")
  if not photometric:
    raise RejectedFile(path, "missing PhotometricInterpretation")
  rows, columns = _positive_int(path, ds, "Rows"), _positive_int(path, ds, "Columns")
  frames = _positive_int(path, ds, "NumberOfFrames", default=1)
  samples = _positive_int(path, ds, "SamplesPerPixel", default=1)
  _positive_int(path, ds, "BitsAllocated")
  return ds, Header(
      patient_id=str(ds.get("PatientID") or ""), modality=str(ds.get("Modality") or ""),
      sop_class=sop_name, rows=rows, columns=columns, frames=frames, samples_per_pixel=samples,
      transfer_syntax=ts.name, photometric=photometric,
      pixel_bytes=_pixel_bytes(path, ds, ts))


def _read(path: str):
  try:
    ds = pydicom.dcmread(path, defer_size=_DEFER_BYTES)
  except errors.InvalidDicomError:
    # No preamble/'DICM'. Archives do hold such bare datasets, but so does any random file when
    # forced; a real one names its SOP class or carries pixel data.
    try:
      ds = pydicom.dcmread(path, defer_size=_DEFER_BYTES, force=True)
    except Exception as e:  # pylint: disable=broad-except
      raise RejectedFile(path, "not a DICOM file") from e
    if "SOPClassUID" not in ds and _PIXEL_DATA not in ds:
      raise RejectedFile(path, "not a DICOM file")
    return ds
  if not len(ds):
    # pydicom drops every element (with only a warning) when the file ends inside an
    # undefined-length value, e.g. encapsulated pixel data without its sequence delimiter.
    if len(pydicom.dcmread(path, stop_before_pixels=True)):
      raise RejectedFile(path, "truncated: file ends inside an undefined-length element "
                         "(encapsulated pixel data without its sequence delimiter?)")
    raise RejectedFile(path, "no data elements after the file meta (truncated or empty dataset)")
  return ds


def _check_lengths(path: str, ds) -> None:
  """Rejects the file if any still-unread element runs past the end of the file."""
  if ds.file_meta.get("TransferSyntaxUID") == uids.DeflatedExplicitVRLittleEndian:
    return  # offsets point into the inflated stream; a cut stream already failed to inflate
  size = os.path.getsize(path)
  for tag in ds.keys():
    # keep_deferred: without it get_item reads (and so loads) a deferred value.
    elem = ds.get_item(tag, keep_deferred=True)
    if isinstance(elem, dataelem.RawDataElement) and elem.length != _UNDEFINED_LENGTH:
      present = max(size - elem.value_tell, 0)
      if present < elem.length:
        what = "pixel data" if tag == _PIXEL_DATA else f"element {tag}"
        raise RejectedFile(path, f"truncated {what}: {present} of {elem.length} bytes")


def _transfer_syntax(path: str, ds) -> uids.UID:
  ts = ds.file_meta.get("TransferSyntaxUID")
  if ts is None:
    # Bare datasets don't say; pydicom guessed the encoding while parsing, and its decoders
    # need the UID, so record the guess.
    implicit, little = ds.original_encoding
    ts = (uids.ImplicitVRLittleEndian if implicit else
          uids.ExplicitVRLittleEndian if little is not False else uids.ExplicitVRBigEndian)
    ds.file_meta.TransferSyntaxUID = ts
  if not ts.is_transfer_syntax:
    raise RejectedFile(path, f"unknown transfer syntax {str(ts)!r}")
  try:
    decoder = pydicom.pixels.get_decoder(ts)
  except NotImplementedError as e:
    raise RejectedFile(path, f"no pixel decoder for {ts.name}") from e
  if not decoder.is_available:
    raise RejectedFile(path, f"no installed plugin decodes {ts.name}; install "
                       "pylibjpeg with its libjpeg/openjpeg/rle plugins, pyjpegls or gdcm")
  return ts


def _positive_int(path: str, ds, keyword: str, default: int | None = None) -> int:
  value = ds.get(keyword)
  value = default if value in (None, "") else value
  if value is None:
    raise RejectedFile(path, f"missing {keyword}")
  try:
    number = int(value)  # a malformed IS comes back as its raw string
  except (TypeError, ValueError):
    number = 0
  if number <= 0:
    raise RejectedFile(path, f"invalid {keyword} {value!r}")
  return number


def _pixel_bytes(path: str, ds, ts: uids.UID) -> int:
  elem = ds.get_item(_PIXEL_DATA, keep_deferred=True)
  if not isinstance(elem, dataelem.RawDataElement):  # already read, e.g. from a deflated file
    length, undefined = len(elem.value or b""), False
  else:
    length, undefined = elem.length, elem.length == _UNDEFINED_LENGTH
  if undefined:
    length = os.path.getsize(path) - elem.value_tell
  if not ts.is_encapsulated:
    expected = pixel_utils.get_expected_length(ds, "bytes")
    if length < expected:
      raise RejectedFile(path, f"truncated pixel data: {length} of {expected} bytes")
  return length


def _describe(e: BaseException) -> str:
  # Plugin errors span several lines (one per plugin tried); keep one line, bounded.
  return " ".join(f"{type(e).__name__}: {e}".split())[:300]
