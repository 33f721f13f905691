"""Hostile DICOM inputs, built as real files (pydicom, pyjpegls), for tests and experiments.

Each builder writes one file (or FIFO, socket, link) and returns the reason ingest must give for
it. `add_to_cohort` puts all of them under a cohort's dicom/hostile/ and returns the quarantine
entries ingest must produce: {path: (stage, reason)}.
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
  return ("native pixel data is 2097152 bytes, over twice the 256 that Rows x Columns x Frames "
          "x Samples x BitsAllocated/8 give (inconsistent header)")


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
