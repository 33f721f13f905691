"""Hostile DICOM inputs, built as real files (pydicom, pyjpegls), for tests and experiments.

Each builder writes one file (or FIFO, socket, link) and returns the reason ingest must give for
it. `add_to_cohort` puts all of them under a cohort's dicom/hostile/ and returns the quarantine
entries ingest must produce: {path: (stage, reason)}. `inconsistent_headers` writes files whose
header disagrees with their pixel data ({name: reason}), `consistent_edges` valid files at the
edges of those rules ({name: decoded shape}).
"""

from __future__ import annotations

import os
import stat
import struct
import zlib

import numpy as np
import pydicom
from pydicom import encaps
from pydicom import filebase
from pydicom import filewriter
from pydicom import uid

MB = 1 << 20


def image_dataset(pixels: np.ndarray, patient_id: str = "HOSTILE-1", bits_stored: int = 12,
                  sop_uid: str | None = None) -> pydicom.Dataset:
  """A CT image dataset (with file meta) holding `pixels` natively."""
  ds = pydicom.Dataset()
  ds.file_meta = pydicom.dataset.FileMetaDataset()
  ds.SOPClassUID = uid.CTImageStorage
  ds.SOPInstanceUID = sop_uid or uid.generate_uid()
  ds.PatientID = patient_id
  ds.PatientName = "HOSTILE^TEST"
  ds.Modality = "CT"
  ds.set_pixel_data(np.asarray(pixels), "MONOCHROME2", bits_stored)
  return ds


def patched(ds: pydicom.Dataset, path: str, old: bytes, new: bytes) -> str:
  """`ds` saved to `path`, then the one occurrence of `old` in the file overwritten with `new`
  (as long): what pydicom would not write (a 'NaN' RescaleSlope, Latin-1 bytes under UTF-8)."""
  save(ds, path)
  with open(path, "rb") as f:
    data = f.read()
  assert data.count(old) == 1 and len(old) == len(new)
  with open(path, "wb") as f:
    f.write(data.replace(old, new))
  return path


def ramp(size: int = 64) -> np.ndarray:
  return (np.add.outer(np.arange(size), np.arange(size)) * (4000 // (2 * size))).astype(np.uint16)


def save(ds: pydicom.Dataset, path: str) -> str:
  os.makedirs(os.path.dirname(path), exist_ok=True)
  ds.save_as(path, enforce_file_format=True)
  return path


def jpegls_geometry_mismatch(path: str, patient_id: str = "HOSTILE-1",
                             late_sof: bool = False) -> str:
  """A 64 x 64 JPEG-LS codestream in a file whose Rows/Columns say 128 x 128: gdcm aborts.

  late_sof: put a 9 KB APP8 segment before the codestream's frame header, beyond what the header
  check reads, so that the file reaches a decoder (and gdcm's SIGABRT).
  """
  ds = image_dataset(ramp(64), patient_id)
  ds.compress(uid.JPEGLSLossless, encoding_plugin="pyjpegls")
  if late_sof:
    frame = next(encaps.generate_frames(ds.PixelData, number_of_frames=1))
    pad = b"\xff\xe8" + struct.pack(">H", 2 + 9000) + bytes(9000)
    ds.PixelData = encaps.encapsulate([frame[:2] + pad + frame[2:]])
  ds.Rows = ds.Columns = 128
  save(ds, path)
  if late_sof:
    return "decoder crashed (SIGABRT) on JPEG-LS Lossless Image Compression"
  return ("JPEG-LS Lossless Image Compression codestream is 64 x 64 but Rows x Columns is "
          "128 x 128 (inconsistent header); not decoded")


def j2k_size_bomb(path: str, patient_id: str = "HOSTILE-1") -> str:
  """A 64 x 64 image whose JPEG 2000 SIZ marker claims 40000 x 40000 (openjpeg: 6 GB)."""
  ds = image_dataset(ramp(64), patient_id)
  ds.compress(uid.JPEG2000Lossless, encoding_plugin="pylibjpeg")
  frame = bytearray(next(encaps.generate_frames(ds.PixelData, number_of_frames=1)))
  siz = frame.find(b"\xff\x4f\xff\x51")
  frame[siz + 8:siz + 40] = struct.pack(">8I", 40000, 40000, 0, 0, 40000, 40000, 0, 0)
  ds.PixelData = encaps.encapsulate([bytes(frame)])
  save(ds, path)
  return ("JPEG 2000 Image Compression (Lossless Only) codestream is 40000 x 40000 but Rows x "
          "Columns is 64 x 64 (inconsistent header); not decoded")


def rle_bomb(path: str, patient_id: str = "HOSTILE-1") -> str:
  """A ~2 KB RLE file claiming 65535 x 65535 16-bit pixels (8 GiB decoded)."""
  ds = image_dataset(ramp(16), patient_id)
  ds.compress(uid.RLELossless)
  ds.Rows = ds.Columns = 65535
  save(ds, path)
  return ("image is 65535 x 65535 x 1 frame x 1 sample = 4294836225 pixels, over "
          "config.data.max_pixels=536870912; raise it if the file is genuine")


def _rle_zeros(n: int) -> bytes:
  """An RLE segment of n zero bytes (PackBits: -127 repeats the next byte 128 times)."""
  full, rest = divmod(n, 128)
  return b"\x81\x00" * full + (bytes([257 - rest, 0]) if rest > 1 else b"\x00\x00" * rest)


def rle_memory_bomb(path: str, side: int = 12000, patient_id: str = "HOSTILE-1") -> str:
  """A genuine-looking RLE image of side x side zeros at 16 bits: a few MB on disk, within the
  header budgets, but decoding it takes ~22 bytes per pixel (3 GB at 12000)."""
  ds = image_dataset(np.zeros((2, 2), np.uint16), patient_id)
  segment = _rle_zeros(side * side)
  header = struct.pack("<16I", 2, 64, 64 + len(segment), *[0] * 13)
  ds.PixelData = encaps.encapsulate([header + segment + segment])
  ds.file_meta.TransferSyntaxUID = uid.RLELossless
  ds.Rows = ds.Columns = side
  save(ds, path)
  return "out of memory"  # the reason starts so, then names config.data.decode_memory_mb


def deflate_bomb(path: str, inflated_mb: int = 1100, patient_id: str = "HOSTILE-1") -> str:
  """A deflated dataset of ~1 MB per GB inflated: 64 x 64 pixels then `inflated_mb` of zeros."""
  ds = image_dataset(np.zeros((64, 64), np.uint16), patient_id)
  del ds.PixelData
  body = filebase.DicomBytesIO()
  body.is_little_endian, body.is_implicit_VR = True, False
  filewriter.write_dataset(body, ds)
  length = inflated_mb * MB
  body.write(struct.pack("<HH2sHI", 0x7FE0, 0x0010, b"OW", 0, length))
  # Full flushes make each block stand alone, so one compressed MB of zeros repeats.
  head = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
  prefix = head.compress(body.getvalue()) + head.flush(zlib.Z_FULL_FLUSH)
  zeros = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
  block = zeros.compress(bytes(MB)) + zeros.flush(zlib.Z_FULL_FLUSH)
  meta = pydicom.dataset.FileMetaDataset()
  meta.MediaStorageSOPClassUID = ds.SOPClassUID
  meta.MediaStorageSOPInstanceUID = ds.SOPInstanceUID
  meta.TransferSyntaxUID = uid.DeflatedExplicitVRLittleEndian
  meta_fp = filebase.DicomBytesIO()
  meta_fp.is_little_endian, meta_fp.is_implicit_VR = True, False
  filewriter.write_file_meta_info(meta_fp, meta, enforce_standard=True)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  with open(path, "wb") as f:
    f.write(bytes(128) + b"DICM" + meta_fp.getvalue() + prefix)
    for _ in range(inflated_mb):
      f.write(block)
    f.write(b"\x03\x00")  # an empty final block
  return ("deflated dataset inflates to over 1088 MB, more than config.data.max_decoded_mb=1024 "
          "(+64 MB for other elements) allows")


def bits_allocated_12(path: str, patient_id: str = "HOSTILE-1") -> str:
  ds = image_dataset(ramp(16), patient_id)
  ds.BitsAllocated = 12
  save(ds, path)
  return "invalid BitsAllocated 12 (DICOM allows 1, 8, 16, 32, 64)"


def bits_stored_over_allocated(path: str, patient_id: str = "HOSTILE-1") -> str:
  ds = image_dataset(ramp(16).astype(np.uint8), patient_id, bits_stored=8)
  ds.BitsStored, ds.HighBit = 16, 15
  save(ds, path)
  return "BitsStored 16 is over BitsAllocated 8"


def bits_allocated_vs_length(path: str, patient_id: str = "HOSTILE-1") -> str:
  """8-bit pixel data under a header that says BitsAllocated 16."""
  ds = image_dataset(ramp(64).astype(np.uint8), patient_id, bits_stored=8)
  ds.BitsAllocated, ds.BitsStored, ds.HighBit = 16, 12, 11
  save(ds, path)
  return "truncated pixel data: 4096 of 8192 bytes"


def pixel_data_far_too_long(path: str, patient_id: str = "HOSTILE-1") -> str:
  """A 16 x 16 8-bit header over 2 MiB of native pixel data."""
  ds = image_dataset(ramp(16).astype(np.uint8), patient_id, bits_stored=8)
  ds.PixelData = bytes(2 * MB)
  save(ds, path)
  return ("native pixel data is 2097152 bytes but Rows x Columns x NumberOfFrames x "
          "SamplesPerPixel x BitsAllocated/8 = 16 x 16 x 1 x 1 x 8/8 = 256 (inconsistent header)")


_NATIVE = "Rows x Columns x NumberOfFrames x SamplesPerPixel x BitsAllocated/8"


def _native(nbytes: int, terms: str, expected: int, names: str = _NATIVE) -> str:
  pad = f", or {expected + 1} with its pad byte" if expected % 2 else ""
  return (f"native pixel data is {nbytes} bytes but {names} = {terms} = {expected}{pad} "
          "(inconsistent header)")


def frames(n: int, size: int = 16, dtype=np.uint16) -> np.ndarray:
  """n different size x size frames."""
  return np.stack([np.roll(ramp(size), 3 * i, axis=1) for i in range(n)]).astype(dtype)


def _with(ds: pydicom.Dataset, **attrs) -> pydicom.Dataset:
  for keyword, value in attrs.items():
    setattr(ds, keyword, value)
  return ds


def one_bit(shape: tuple[int, ...], patient_id: str = "HOSTILE-1", **attrs) -> pydicom.Dataset:
  """A 1-bit image of `shape` ((rows, columns) or (frames, rows, columns)), packed as DICOM packs
  it: little-endian bit order, frames not padded, one pad byte if the total is odd."""
  bits = np.add.outer(np.arange(shape[-2]), np.arange(shape[-1])) % 3 == 0
  ds = image_dataset(ramp(4), patient_id)
  ds.Rows, ds.Columns = shape[-2:]
  if len(shape) == 3:
    ds.NumberOfFrames = shape[0]
  ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 1, 1, 0, 0
  ds.PixelData = np.packbits(np.broadcast_to(bits, shape).ravel(), bitorder="little").tobytes()
  ds["PixelData"].VR = "OB"
  return _with(ds, **attrs)


def compressed(pixels: np.ndarray, ts: uid.UID, patient_id: str = "HOSTILE-1", table="basic",
               fragments_per_frame: int = 1, **attrs) -> pydicom.Dataset:
  """`pixels` ((rows, columns) or (frames, rows, columns)) compressed in `ts`, with a Basic
  Offset Table ('basic'), an empty one ('none') or an Extended Offset Table ('extended'); with
  'none', each frame may be cut into several fragments."""
  ds = image_dataset(pixels, patient_id)
  plugin = {uid.JPEGLSLossless: "pyjpegls", uid.JPEG2000Lossless: "pylibjpeg"}.get(ts)
  ds.compress(ts, **({"encoding_plugin": plugin} if plugin else {}))
  count = int(ds.get("NumberOfFrames") or 1)
  encoded = list(encaps.generate_frames(ds.PixelData, number_of_frames=count))
  if table == "extended":
    ds.PixelData, ds.ExtendedOffsetTable, ds.ExtendedOffsetTableLengths = (
        encaps.encapsulate_extended(encoded))
  else:
    assert table == "none" or fragments_per_frame == 1, "a cut frame needs an empty table"
    # Cut at even offsets: a fragment of odd length is padded, which would corrupt the frame.
    n = fragments_per_frame
    at = lambda f, i: len(f) if i == n else i * len(f) // n // 2 * 2
    cut = [f[at(f, i):at(f, i + 1)] for f in encoded for i in range(n)]
    ds.PixelData = encaps.encapsulate(cut, has_bot=table == "basic")
  ds["PixelData"].VR = "OB"
  return _with(ds, **attrs)


def inconsistent_headers(directory: str, patient_id: str = "HOSTILE-1") -> dict[str, str]:
  """Valid images written by pydicom, then a header field changed so that it disagrees with the
  pixel data (or bytes appended to it), in each case so that the data fits another reading of
  the header. Writes them into `directory`.

  Returns:
    {file name: the reason read_header and load_image must reject it with}.
  """
  def native(pixels, bits_stored=12, **attrs):
    return _with(image_dataset(pixels, patient_id, bits_stored), **attrs)

  def rgb(size, **attrs):
    ds = image_dataset(ramp(4), patient_id)
    ds.set_pixel_data(np.arange(size * size * 3, dtype=np.uint8).reshape(size, size, 3), "RGB", 8)
    return _with(ds, **attrs)
  appended = native(ramp(64))
  appended.PixelData += b"\x00\x00"
  ls, rle = uid.JPEGLSLossless, uid.RLELossless
  cases = {
      # 16-bit data under BitsAllocated 8: twice the length 8 bits give.
      "bits_8_over_16.dcm": (native(ramp(32), BitsAllocated=8, BitsStored=8, HighBit=7),
                             _native(2048, "32 x 32 x 1 x 1 x 8/8", 1024)),
      # Two frames under NumberOfFrames 1; three 8-bit ones under 2.
      "frames_1_over_2.dcm": (native(frames(2), NumberOfFrames=1),
                              _native(1024, "16 x 16 x 1 x 1 x 16/8", 512)),
      "frames_2_over_3.dcm": (native(frames(3, dtype=np.uint8), 8, NumberOfFrames=2),
                              _native(768, "16 x 16 x 2 x 1 x 8/8", 512)),
      # 24 x 32 data under Columns 24.
      "columns_short.dcm": (native(ramp(32)[:24], Columns=24),
                            _native(1536, "24 x 24 x 1 x 1 x 16/8", 1152)),
      # An odd expected length: 6 x 5 8-bit data under Rows 5 (25 bytes, 26 with the pad).
      "rows_short_odd.dcm": (native(ramp(6)[:, :5].astype(np.uint8), 8, Rows=5),
                             _native(30, "5 x 5 x 1 x 1 x 8/8", 25)),
      # Two bytes appended to a valid image (a pad is one byte, and only up to an even length).
      "appended.dcm": (appended, _native(8194, "64 x 64 x 1 x 1 x 16/8", 8192)),
      # RGB data under SamplesPerPixel 1.
      "samples_1_over_3.dcm": (rgb(8, SamplesPerPixel=1, PhotometricInterpretation="MONOCHROME2"),
                               _native(192, "8 x 8 x 1 x 1 x 8/8", 64)),
      # Full RGB under YBR_FULL_422, which holds two thirds as many bytes.
      "rgb_as_ybr_422.dcm": (rgb(4, PhotometricInterpretation="YBR_FULL_422"),
                             _native(48, "4 x 4 x 1 x 3 x 8/8 x 2/3", 32,
                                     _NATIVE + " x 2/3 (YBR_FULL_422)")),
      # 8-bit data under BitsAllocated 1; two 10 x 10 1-bit frames (25 bytes, padded to 26)
      # under NumberOfFrames 1 (13 bytes, 14 with the pad).
      "bits_1_over_8.dcm": (native(ramp(16).astype(np.uint8), 8, BitsAllocated=1, BitsStored=1,
                                   HighBit=0),
                            _native(256, "ceil(16 x 16 x 1 x 1 x 1/8)", 32)),
      "bits_1_frames_1_over_2.dcm": (one_bit((2, 10, 10), patient_id, NumberOfFrames=1),
                                     _native(26, "ceil(10 x 10 x 1 x 1 x 1/8)", 13)),
      # Encapsulated: offset tables and fragments against NumberOfFrames.
      "rle_bot_2_frames_1.dcm": (
          compressed(frames(2), rle, patient_id, NumberOfFrames=1),
          "Basic Offset Table has 2 entries but NumberOfFrames is 1 (inconsistent header)"),
      "jpegls_bot_2_frames_3.dcm": (
          compressed(frames(2), ls, patient_id, NumberOfFrames=3),
          "Basic Offset Table has 2 entries but NumberOfFrames is 3 (inconsistent header)"),
      "jpegls_eot_2_frames_3.dcm": (
          compressed(frames(2), ls, patient_id, "extended", NumberOfFrames=3),
          "Extended Offset Table has 2 entries but NumberOfFrames is 3 (inconsistent header)"),
      "jpegls_2_fragments_frames_3.dcm": (
          compressed(frames(2), ls, patient_id, "none", NumberOfFrames=3),
          ("encapsulated pixel data has 2 fragments but NumberOfFrames is 3; each frame has at "
           "least one (inconsistent header)")),
      "rle_2_fragments_1_frame.dcm": (
          compressed(ramp(16), rle, patient_id, "none", fragments_per_frame=2),
          ("RLE Lossless pixel data has more than 1 fragment but NumberOfFrames is 1; RLE has "
           "exactly one per frame (inconsistent header)")),
      "rle_3_fragments_2_frames.dcm": (
          compressed(frames(3), rle, patient_id, "none", NumberOfFrames=2),
          ("RLE Lossless pixel data has more than 2 fragments but NumberOfFrames is 2; RLE has "
           "exactly one per frame (inconsistent header)")),
  }
  for name, (ds, _) in cases.items():
    save(ds, os.path.join(directory, name))
  return {name: reason for name, (_, reason) in cases.items()}


def consistent_edges(directory: str, patient_id: str = "HOSTILE-1") -> dict[str, tuple[int, ...]]:
  """Valid images at the edges of the length and frame rules, written into `directory`.

  Returns:
    {file name: the shape load_image must decode it to}.
  """
  ls, rle = uid.JPEGLSLossless, uid.RLELossless
  cases = {
      # 25 bytes of 8-bit data, written with its pad byte (26).
      "odd_padded.dcm": (image_dataset(ramp(5).astype(np.uint8), patient_id, 8), (5, 5)),
      "multiframe.dcm": (image_dataset(frames(3), patient_id), (3, 16, 16)),
      # 1-bit: 100 bits in 13 bytes, padded to 14; three frames, 300 bits in 38 bytes.
      "bits_1_odd.dcm": (one_bit((10, 10), patient_id), (10, 10)),
      "bits_1_frames_3.dcm": (one_bit((3, 10, 10), patient_id), (3, 10, 10)),
      "rle_frames_3.dcm": (compressed(frames(3), rle, patient_id), (3, 16, 16)),
      "rle_frames_3_no_bot.dcm": (compressed(frames(3), rle, patient_id, "none"), (3, 16, 16)),
      "jpegls_frames_2_eot.dcm": (compressed(frames(2), ls, patient_id, "extended"), (2, 16, 16)),
      # A frame may span fragments, except in RLE.
      "jpegls_3_fragments_1_frame.dcm": (
          compressed(ramp(16), ls, patient_id, "none", fragments_per_frame=3), (16, 16)),
  }
  for name, (ds, _) in cases.items():
    save(ds, os.path.join(directory, name))
  return {name: shape for name, (_, shape) in cases.items()}


def sparse_huge(path: str, size_mb: int = 2049) -> str:
  """A sparse file over the default config.data.max_file_mb (no disk space used)."""
  with open(path, "wb") as f:
    f.truncate(size_mb * MB)
  return (f"file is {size_mb} MB, over config.data.max_file_mb=2048; raise it if the file is "
          "genuine")


def fifo(path: str) -> str:
  os.mkfifo(path)
  return "a FIFO, not a regular file; not read"


def socket_file(path: str) -> str:
  os.mknod(path, 0o600 | stat.S_IFSOCK)
  return "a socket, not a regular file; not read"


def link_to_dev_zero(path: str) -> str:
  os.symlink("/dev/zero", path)
  return "symlink to a character device, not a regular file; not read"


def link_outside(path: str, outside_dir: str) -> str:
  """A symlink to a valid DICOM file outside the cohort."""
  target = save(image_dataset(ramp(16), "OUTSIDE-9"), os.path.join(outside_dir, "real.dcm"))
  os.symlink(target, path)
  return "symlink to a file outside the cohort root; not followed"


def broken_link(path: str) -> str:
  os.symlink(path + ".missing", path)
  return "broken symlink (No such file or directory)"


def link_loop(path: str) -> str:
  os.symlink(os.path.basename(path), path)
  return "broken symlink (Too many levels of symbolic links)"


def dir_link_loop(path: str) -> str:
  """dicom/hostile/loop -> dicom/hostile: walked naively, an endless tree."""
  os.symlink(".", path)
  return "symlink to a directory; not followed (put the files, or links to them, under dicom/)"


def add_to_cohort(root: str, outside_dir: str, patient_id: str, memory_bomb_side: int = 12000
                  ) -> dict[str, tuple[str, str]]:
  """Writes every hostile input under `root`/dicom/hostile/; returns {path: (stage, reason)}.

  Files that get past the scan (the late-SOF JPEG-LS abort, the RLE memory bomb of
  `memory_bomb_side` squared pixels) belong to `patient_id`, who needs a label so that they are
  decoded into the cache; their decode reasons are the exact one (SIGABRT) or a prefix ("out of
  memory"). Also adds a valid image of `patient_id` twice (the same instance under two names)
  and a symlink from dicom/ to a valid file elsewhere in the cohort, which is followed.
  """
  d = os.path.join(root, "dicom", "hostile")
  os.makedirs(d, exist_ok=True)
  os.makedirs(outside_dir, exist_ok=True)
  rel = lambda name: f"dicom/hostile/{name}"
  p = lambda name: os.path.join(d, name)
  scan = {
      "jpegls_mismatch.dcm": jpegls_geometry_mismatch(p("jpegls_mismatch.dcm")),
      "j2k_size_bomb.dcm": j2k_size_bomb(p("j2k_size_bomb.dcm")),
      "rle_bomb.dcm": rle_bomb(p("rle_bomb.dcm")),
      "deflate_bomb.dcm": deflate_bomb(p("deflate_bomb.dcm")),
      "bits_12.dcm": bits_allocated_12(p("bits_12.dcm")),
      "bits_stored_over.dcm": bits_stored_over_allocated(p("bits_stored_over.dcm")),
      "bits_vs_length.dcm": bits_allocated_vs_length(p("bits_vs_length.dcm")),
      "pixels_too_long.dcm": pixel_data_far_too_long(p("pixels_too_long.dcm")),
      "huge.dcm": sparse_huge(p("huge.dcm")),
      "fifo.dcm": fifo(p("fifo.dcm")),
      "socket.dcm": socket_file(p("socket.dcm")),
      "zero.dcm": link_to_dev_zero(p("zero.dcm")),
      "escape.dcm": link_outside(p("escape.dcm"), outside_dir),
      "broken.dcm": broken_link(p("broken.dcm")),
      "self.dcm": link_loop(p("self.dcm")),
      "loop": dir_link_loop(p("loop")),
  }
  # The same instance twice: the first by path is kept.
  original = save(image_dataset(ramp(32), patient_id), p("dup_a.dcm"))
  with open(original, "rb") as src, open(p("dup_b.dcm"), "wb") as dst:
    dst.write(src.read())
  scan["dup_b.dcm"] = "duplicate SOPInstanceUID (same instance as dicom/hostile/dup_a.dcm)"
  # A symlink to a regular file inside the cohort root (outside dicom/): followed.
  inside = save(image_dataset(ramp(24), patient_id), os.path.join(root, "extra", "inside.dcm"))
  os.symlink(os.path.relpath(inside, d), p("inside_link.dcm"))
  decode = {
      "jpegls_late_sof.dcm": jpegls_geometry_mismatch(p("jpegls_late_sof.dcm"), patient_id,
                                                     late_sof=True),
      "rle_memory_bomb.dcm": rle_memory_bomb(p("rle_memory_bomb.dcm"), memory_bomb_side,
                                             patient_id),
  }
  return {**{rel(k): ("scan", v) for k, v in scan.items()},
          **{rel(k): ("decode", v) for k, v in decode.items()}}
