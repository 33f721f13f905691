"""DICOM files -> headers and float32 images in [0, 1]; anything unusable is a RejectedFile.

`read_header` parses the header without loading pixel data and rejects, with a short reason:
paths that are not regular files (FIFOs, sockets, devices, directories: refused from os.lstat and
os.stat, never opened; a symlink is followed only to a regular file, and only into `roots` when
given); files over the budgets (`Budgets`: file size; Rows x Columns x Frames x Samples; decoded
bytes; a deflated dataset that inflates past the byte budget, found by a bounded streaming
inflate); files that are not DICOM (a file without preamble/'DICM' is accepted only if, read as a
bare dataset, it has a SOP Class UID or pixel data); truncated files (any element whose declared
length runs past the end of the file, or an undefined-length element, such as encapsulated pixel
data, whose delimiter is missing); objects without Pixel Data (SR, RT Plan, RT Struct, ECG...);
malformed image geometry; BitsAllocated not 1, 8, 16, 32 or 64, BitsStored over it, HighBit not
in [BitsStored - 1, BitsAllocated - 1]; native pixel data whose length is not exactly Rows x
Columns x NumberOfFrames x SamplesPerPixel x BitsAllocated / 8 (pydicom's expected length: 1-bit
data packed, YBR_FULL_422 subsampled), or that plus the one pad byte an odd length takes, since
data of any other length fits some other reading of the header (BitsAllocated 8 over 16-bit data,
a frame more or less) and would be decoded wrongly; encapsulated pixel data whose Basic or
Extended Offset Table does not have one entry per frame, with fewer fragments than frames, or
(RLE Lossless) not exactly one fragment per frame, read from the item headers alone; a JPEG,
JPEG-LS or JPEG 2000 first frame whose codestream size is not Rows x Columns (read from its first
8 KB); transfer syntaxes no installed plugin decodes; missing or empty PatientID. All of it is
decided before any pixel data is read, so a small file that claims a huge image is refused
without allocating it.

Decoders of compressed data can still crash or allocate without bound on what these checks do
not see; `medjax.data.dicom.decoder` runs them in child processes, where that costs one file. This
module decodes in the calling process.

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
import hashlib
import logging
import os
import warnings
from collections.abc import Callable
from collections.abc import Sequence

import numpy as np
import pydicom
from pydicom import dataelem
from pydicom import errors
from pydicom import filereader
from pydicom import uid as uids
from pydicom.pixels import utils as pixel_utils

from medjax.data.dicom import limits as dicom_limits
from medjax.data.dicom import pixels as dicom_pixels

# pydicom's warnings quote element values ("Invalid value for VR IS: '<a PatientID>'" for an id
# stored with the wrong VR), and headers are read in the ingesting process, whose warnings and
# log lines reach the run's log: none of them is let out. (The decoder's children silence all.)
pydicom.config.settings.reading_validation_mode = pydicom.config.IGNORE
warnings.filterwarnings("ignore", module=r"pydicom(\.|$)")
logging.getLogger("pydicom").setLevel(logging.CRITICAL)

# The limits' public names, part of this module's API.
RejectedFile = dicom_limits.RejectedFile
Budgets = dicom_limits.Budgets
check_path = dicom_limits.check_path

# Elements longer than this stay on disk until asked for, so headers never load pixel data.
_DEFER_BYTES = 1024
_PIXEL_DATA = 0x7FE00010
_PATIENT_ID = 0x00100020
_FLOAT_PIXEL_DATA = (0x7FE00008, 0x7FE00009)
_UNDEFINED_LENGTH = 0xFFFFFFFF
_BITS_ALLOCATED = (1, 8, 16, 32, 64)


@dataclasses.dataclass(frozen=True)
class Header:
  """What ingest needs to know about an image file; no names, dates or UIDs (one, hashed).

  Attributes:
    patient_id: raw PatientID. Callers hash it; never log it (it is left out of repr()).
    modality: e.g. 'CT'; '' when absent.
    sop_class: SOP class name, e.g. 'CT Image Storage'.
    rows, columns, frames, samples_per_pixel: image geometry (frames is 1 for single-frame).
    transfer_syntax: transfer syntax name, e.g. 'JPEG 2000 Image Compression (Lossless Only)'.
    photometric: PhotometricInterpretation as stored, e.g. 'MONOCHROME1', 'YBR_FULL_422'.
    pixel_bytes: Pixel Data length as stored; for encapsulated (undefined length) data, the
      bytes from its start to the end of the file.
    bits_allocated: BitsAllocated.
    instance: a hash of SOPInstanceUID (to find one instance stored twice); '' when absent.
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
  bits_allocated: int
  instance: str = dataclasses.field(repr=False)


def read_header(path: str | os.PathLike, budgets: Budgets | None = None, *,
                roots: Sequence[str] = ()) -> Header:
  """Reads and checks a DICOM header without loading or decoding its pixel data.

  Args:
    path: the file.
    budgets: size limits (default: `Budgets()`).
    roots: directories a symlink's target must lie in (empty: anywhere).

  Returns:
    The file's Header.

  Raises:
    RejectedFile: see the module docstring for the reasons; nothing else is raised.
  """
  path = os.fspath(path)
  budgets = budgets or Budgets()
  _, header = _guarded(path, budgets, roots, lambda f, size: _inspect(path, f, size, budgets))
  if not header.patient_id.strip():
    raise RejectedFile(path, "missing PatientID")
  return header


def load_image(path: str | os.PathLike, budgets: Budgets | None = None, *,
               roots: Sequence[str] = (), frames: int | None = None) -> np.ndarray:
  """Decodes a DICOM image to float32 in [0, 1] by the rules in the module docstring.

  PatientID is not required here; use `read_header` to vet files for a cohort. This decodes in
  the calling process; `medjax.data.dicom.decoder.Decoder.load_image` isolates the risky decoders.

  Args:
    path: the file.
    budgets: size limits (default: `Budgets()`), checked before pixel data is read.
    roots: directories a symlink's target must lie in (empty: anywhere).
    frames: decode only a multi-frame file's first `frames` frames (None: all of them); the
      percentile window (rule 2c) is then over those frames.

  Returns:
    float32 array, (H, W), or (F, H, W) for multi-frame files.

  Raises:
    RejectedFile: for every failure, including ones raised inside pydicom or its plugins.
  """
  path = os.fspath(path)
  budgets = budgets or Budgets()
  return _guarded(path, budgets, roots,
                  lambda f, size: _load(path, f, size, budgets, frames=frames))


def load_image_if(path: str | os.PathLike, here: Callable[[uids.UID | None], bool],
                  budgets: Budgets | None = None, *, roots: Sequence[str] = (),
                  frames: int | None = None) -> tuple[np.ndarray | None, uids.UID | None]:
  """(image, transfer syntax): the file's transfer syntax, read from its file meta without
  parsing the dataset (None for a bare dataset, without preamble or file meta), and the image
  `load_image` decodes if `here(that syntax)` is true, else None (the caller decodes the file
  elsewhere). One open and one read of the file meta serve both: choosing where to decode, then
  decoding, used to take two of each.

  Raises:
    RejectedFile: as `load_image`; when `here` says no, only for the path checks and the
      file-size budget (the rest of the file is not read).
  """
  path = os.fspath(path)
  budgets = budgets or Budgets()

  def load(f, size):
    syntax = _meta_syntax(f)
    if not here(syntax):
      return None, syntax
    deflated = syntax is None or syntax == uids.DeflatedExplicitVRLittleEndian
    return _load(path, f, size, budgets, deflated=deflated, frames=frames), syntax
  return _guarded(path, budgets, roots, load)


def _meta_syntax(f) -> uids.UID | None:
  """The transfer syntax in the file meta of the file `f`; None without a usable one."""
  try:
    filereader.read_preamble(f, False)
    return filereader._read_file_meta_info(f).get("TransferSyntaxUID")  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except  # no usable file meta: the full read decides
    return None


def _guarded(path: str, budgets: Budgets, roots: Sequence[str], fn):
  try:
    checked = check_path(path, budgets, roots)
    with dicom_limits.opened(path, checked, budgets) as (f, size):
      return fn(f, size)
  except RejectedFile:
    raise
  except MemoryError as e:
    raise RejectedFile(path, "out of memory while decoding") from e
  except Exception as e:  # pylint: disable=broad-except  # callers get RejectedFile, always
    raise RejectedFile(path, f"unreadable: {dicom_limits.describe(e)}") from e


def _load(path: str, f, size: int, budgets: Budgets, deflated: bool = True,
          frames: int | None = None) -> np.ndarray:
  ds, header = _inspect(path, f, size, budgets, deflated)
  decoder = pydicom.pixels.get_decoder(ds.file_meta.TransferSyntaxUID)
  try:
    if frames is None or header.frames <= frames:
      arr, props = decoder.as_array(ds)
    else:   # the others are never decoded (a 300 MB volume took 4.4 GB to decode whole)
      decoded = [decoder.as_array(ds, index=i) for i in range(max(1, frames))]
      arr, props = np.stack([a for a, _ in decoded]), decoded[0][1]
  except MemoryError as e:
    raise RejectedFile(path, f"out of memory while decoding {header.transfer_syntax} pixel "
                       "data") from e
  except Exception as e:  # pylint: disable=broad-except
    raise RejectedFile(path, f"undecodable {header.transfer_syntax} pixel data: "
                       f"{dicom_limits.describe(e)}") from e
  try:
    image = dicom_pixels.to_unit_range(arr, ds, props)
  except dicom_pixels.Unusable as e:
    raise RejectedFile(path, str(e)) from e
  if not np.isfinite(image).all():
    raise RejectedFile(path, "decoded pixel values are not finite numbers (check "
                       "RescaleSlope, RescaleIntercept and the Modality and VOI LUTs)")
  return image


def _inspect(path: str, f, size: int, budgets: Budgets, deflated: bool = True):
  """Returns (dataset with pixel data deferred, Header) or raises RejectedFile (with the
  file's PatientID once its header was read). `deflated`: False when the file meta was read
  and names another transfer syntax (its inflation is not bounded again)."""
  ds = _read(path, f, budgets, deflated)
  patient_id = _patient_id(ds)
  try:
    return _checked(path, f, size, budgets, ds, patient_id)
  except RejectedFile as e:
    e.patient_id = patient_id
    raise


def _patient_id(ds) -> str:
  """PatientID as text, one id for one byte string.

  pydicom decodes it by SpecificCharacterSet, replacing bytes that are not valid there with
  U+FFFD, and reads non-ASCII bytes without a SpecificCharacterSet as Latin-1. Exports get both
  wrong (UTF-8 ids without a SpecificCharacterSet, Latin-1 ids under ISO_IR 192), and
  replacement characters make two patients one ('PTX\ufffd01' for both 'PTX\xc401' and
  'PTX\xd601'). Such bytes are read as UTF-8 where they are valid UTF-8, else as Latin-1: both
  are one-to-one, as the tables are read (UTF-8, else a single-byte code page)."""
  raw = ds.get_item(_PATIENT_ID, keep_deferred=True)
  value = str(ds.get("PatientID") or "")
  data = raw.value if isinstance(raw, dataelem.RawDataElement) else None
  if (not isinstance(data, bytes) or data.isascii() or b"\\" in data
      or (ds.get("SpecificCharacterSet") and "\ufffd" not in value)):
    return value
  try:
    text = data.decode("utf-8")
  except UnicodeDecodeError:
    text = data.decode("latin-1")
  return text.rstrip("\0 ")


def _checked(path: str, f, size: int, budgets: Budgets, ds, patient_id: str):
  _check_lengths(path, ds, size)
  # A DICOMDIR (a CD export's index) names its class in the file meta only.
  sop_class = ds.get("SOPClassUID") or getattr(ds, "file_meta", {}).get("MediaStorageSOPClassUID")
  sop_name = getattr(sop_class, "name", None) or "unknown"
  if _PIXEL_DATA not in ds:
    if any(tag in ds for tag in _FLOAT_PIXEL_DATA):
      raise RejectedFile(path, f"float pixel data is not supported (SOP class {sop_name})")
    if sop_class == "1.2.840.10008.1.3.10":
      raise RejectedFile(path, "a DICOMDIR, the media's index of its files, not an image; "
                         "the files it lists are read where they lie")
    raise RejectedFile(path, f"no pixel data (SOP class {sop_name})")
  ts = _transfer_syntax(path, ds)
  photometric = str(ds.get("PhotometricInterpretation") or "")
  if not photometric:
    raise RejectedFile(path, "missing PhotometricInterpretation")
  rows, columns = _positive_int(path, ds, "Rows"), _positive_int(path, ds, "Columns")
  frames = _positive_int(path, ds, "NumberOfFrames", default=1)
  samples = _positive_int(path, ds, "SamplesPerPixel", default=1)
  bits = _positive_int(path, ds, "BitsAllocated")
  _check_bits(path, ds, bits)
  dicom_limits.check_budgets(path, rows, columns, frames, samples, bits, budgets)
  dicom_limits.check_codestream(path, f, ds, ts, rows, columns, size)
  dicom_limits.check_frames(path, f, ds, ts, frames, size)
  dicom_limits.check_codestream_end(path, f, ds, ts, size)
  instance = str(ds.get("SOPInstanceUID") or "").strip()
  return ds, Header(
      patient_id=patient_id, modality=str(ds.get("Modality") or ""),
      sop_class=sop_name, rows=rows, columns=columns, frames=frames, samples_per_pixel=samples,
      transfer_syntax=ts.name, photometric=photometric,
      pixel_bytes=_pixel_bytes(path, ds, ts, size), bits_allocated=bits,
      instance=hashlib.blake2b(instance.encode(), digest_size=16).hexdigest() if instance else "")


def _check_bits(path: str, ds, bits: int) -> None:
  if bits not in _BITS_ALLOCATED:
    raise RejectedFile(path, f"invalid BitsAllocated {bits} (DICOM allows "
                       f"{', '.join(map(str, _BITS_ALLOCATED))})")
  if ds.get("BitsStored") in (None, ""):
    return  # the decoder reports it if it needs it
  stored = _positive_int(path, ds, "BitsStored")
  if stored > bits:
    raise RejectedFile(path, f"BitsStored {stored} is over BitsAllocated {bits}")
  if ds.get("HighBit") in (None, ""):
    return
  try:
    high = int(ds.HighBit)
  except (TypeError, ValueError):
    high = -1
  if not stored - 1 <= high < bits:
    raise RejectedFile(path, f"HighBit {ds.HighBit!r} is not between BitsStored - 1 "
                       f"({stored - 1}) and BitsAllocated - 1 ({bits - 1})")


# Archives an export may leave among the images, by their first bytes (tar: 'ustar' at 257).
_ARCHIVES = ((b"PK\x03\x04", "a ZIP archive"), (b"\x1f\x8b", "a gzip file"),
             (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"), (b"Rar!", "a RAR archive"),
             (b"BZh", "a bzip2 file"), (b"\xfd7zXZ", "an xz file"))


def _not_dicom(f) -> str:
  """'not a DICOM file', and where the file is an archive, which and what to do."""
  f.seek(0)
  head = f.read(262)
  kind = next((k for magic, k in _ARCHIVES if head.startswith(magic)),
              "a tar archive" if head[257:262] == b"ustar" else "")
  return "not a DICOM file" + (f": {kind}; unpack it under dicom/ for its files to be read"
                               if kind else "")


def _read(path: str, f, budgets: Budgets, deflated: bool = True):
  if deflated:
    dicom_limits.check_deflated(path, f, budgets)
  f.seek(0)
  try:
    ds = pydicom.dcmread(f, defer_size=_DEFER_BYTES)
  except errors.InvalidDicomError:
    # No preamble/'DICM'. Archives do hold such bare datasets, but so does any random file when
    # forced; a real one names its SOP class or carries pixel data.
    try:
      f.seek(0)
      ds = pydicom.dcmread(f, defer_size=_DEFER_BYTES, force=True)
    except Exception as e:  # pylint: disable=broad-except
      raise RejectedFile(path, _not_dicom(f)) from e
    if "SOPClassUID" not in ds and _PIXEL_DATA not in ds:
      raise RejectedFile(path, _not_dicom(f))
    return ds
  if not len(ds):
    # pydicom drops every element (with only a warning) when the file ends inside an
    # undefined-length value, e.g. encapsulated pixel data without its sequence delimiter.
    f.seek(0)
    if len(pydicom.dcmread(f, stop_before_pixels=True)):
      raise RejectedFile(path, "truncated: file ends inside an undefined-length element "
                         "(encapsulated pixel data without its sequence delimiter?)")
    raise RejectedFile(path, "no data elements after the file meta (truncated or empty dataset)")
  return ds


def _check_lengths(path: str, ds, size: int) -> None:
  """Rejects the file if any still-unread element runs past the end of the file."""
  if ds.file_meta.get("TransferSyntaxUID") == uids.DeflatedExplicitVRLittleEndian:
    return  # offsets point into the inflated stream; a cut stream already failed to inflate
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
  if isinstance(value, float) and value != number:   # IS '1.5' (pydicom's ISfloat) is not 1
    number, value = 0, str(getattr(value, "original_string", None) or value)
  if number <= 0:
    raise RejectedFile(path, f"invalid {keyword} {value!r}")
  return number


def _pixel_bytes(path: str, ds, ts: uids.UID, size: int) -> int:
  elem = ds.get_item(_PIXEL_DATA, keep_deferred=True)
  if not isinstance(elem, dataelem.RawDataElement):  # already read, e.g. from a deflated file
    length, undefined = len(elem.value or b""), False
  else:
    length, undefined = elem.length, elem.length == _UNDEFINED_LENGTH
  if undefined:
    length = size - elem.value_tell
    if not ts.is_encapsulated:
      raise RejectedFile(path, f"Pixel Data has undefined length (encapsulated data?) under "
                         f"the native transfer syntax {ts.name}: the file's TransferSyntaxUID "
                         "is wrong")
  if not ts.is_encapsulated:
    expected = pixel_utils.get_expected_length(ds, "bytes")
    if length < expected:
      raise RejectedFile(path, f"truncated pixel data: {length} of {expected} bytes")
    # PS3.5 8.1.1 pads only up to the next even length. Its Note asks readers to tolerate older
    # writers' excess padding, but surplus bytes are also what a header that undercounts leaves
    # (a frame, a row, BitsAllocated), and the two can't be told apart.
    if length not in (expected, expected + expected % 2):
      raise RejectedFile(path, f"native pixel data is {length} bytes but "
                         f"{_expected_length(ds, expected)} (inconsistent header)")
  return length


def _expected_length(ds, expected: int) -> str:
  """How the header gives pydicom's expected length `expected`, spelled out for a reason."""
  rows, columns, bits = int(ds.Rows), int(ds.Columns), int(ds.BitsAllocated)
  frames = int(ds.get("NumberOfFrames") or 1)
  samples = int(ds.SamplesPerPixel)
  terms = f"{rows} x {columns} x {frames} x {samples} x {bits}/8"
  if bits == 1:
    terms = f"ceil({terms})"
  names = "Rows x Columns x NumberOfFrames x SamplesPerPixel x BitsAllocated/8"
  if ds.PhotometricInterpretation == "YBR_FULL_422":
    names, terms = f"{names} x 2/3 (YBR_FULL_422)", f"{terms} x 2/3"
  pad = f", or {expected + 1} with its pad byte" if expected % 2 else ""
  return f"{names} = {terms} = {expected}{pad}"
