"""Limits on a DICOM input, checked before it is parsed or decoded (used by `medjax.data.dicom`).

Which paths may be opened at all (regular files; a symlink only to a regular file inside the
cohort), the size budgets (`Budgets`: file size, pixels, decoded bytes), the inflated size of a
deflated dataset (inflated a megabyte at a time), a JPEG, JPEG-LS or JPEG 2000 codestream's
frame size against Rows x Columns, and encapsulated pixel data's offset tables and fragment count
against NumberOfFrames. Each failure is a `RejectedFile` whose reason names the numbers and, for a
budget, the config field to raise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import stat
import struct
import zlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

# pydicom (~0.15 s to import) is imported by the checks that read a file, not with this module:
# its RejectedFile and Budgets are used by every process that reads the decoded cache.
if TYPE_CHECKING:
  from pydicom import uid as uids

MB = 1 << 20
_UNDEFINED_LENGTH = 0xFFFFFFFF
# Elements other than pixel data that a deflated dataset may hold beyond the decoded-size budget.
_DEFLATED_SLACK = 64 * MB
# JPEG start-of-frame markers (SOF0-SOF15 but DHT, JPG and DAC) and JPEG-LS's SOF55.
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC} | {0xF7}
# Bytes of the first fragment read for its frame size; a codestream whose size marker comes
# later is not checked here (the isolated decoder still contains what it does).
_CODESTREAM_PEEK = 8192
_ITEM = b"\xfe\xff\x00\xe0"
_SEQUENCE_DELIMITER = b"\xfe\xff\xdd\xe0"
_PIXEL_DATA = 0x7FE00010
_EXTENDED_OFFSET_TABLE = 0x7FE00001
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISDIR, "a directory"))


class RejectedFile(Exception):
  """A file that cannot be used as an image; the only exception `medjax.data.dicom` raises.

  Attributes:
    path: the file.
    reason: short human-readable reason, e.g. 'truncated pixel data: 4096 of 8192 bytes'.
  """

  def __init__(self, path: str, reason: str):
    super().__init__(f"{path}: {reason}")
    self.path = str(path)
    self.reason = reason
    # The PatientID of a file rejected after its header was read (in memory only: ingest
    # accounts for that patient), else ''.
    self.patient_id = ""

  def __reduce__(self):  # the default would re-call __init__ with the message alone
    return type(self), (self.path, self.reason)


@dataclasses.dataclass(frozen=True)
class Budgets:
  """Limits checked on a file's size and header before any pixel data is read or decoded.

  The defaults are `configs/default.py`'s (`config.data.max_pixels` etc.); see there for why.

  Attributes:
    max_pixels: Rows x Columns x NumberOfFrames x SamplesPerPixel.
    max_decoded_mb: that times the bytes per decoded sample (BitsAllocated / 8, at least 1), MiB.
    max_file_mb: the file's size on disk, MiB.
  """
  max_pixels: int = 1 << 29
  max_decoded_mb: int = 1024
  max_file_mb: int = 2048

  @classmethod
  def from_config(cls, data_config) -> Budgets:
    """The budgets in `config.data` (a config saved before they existed gets the defaults)."""
    return cls(**{f.name: int(data_config.get(f.name, f.default))
                  for f in dataclasses.fields(cls)})


def check_path(path: str | os.PathLike, budgets: Budgets | None = None,
               roots: Sequence[str] = ()) -> os.stat_result:
  """Refuses anything but a regular file within the file-size budget, from os.lstat/os.stat alone.

  The path is never opened here: opening a FIFO blocks until a writer comes, and reading a
  device such as /dev/zero never ends. A symlink is followed only to a regular file, and only
  when its target lies inside one of `roots` (when given).

  Returns:
    The stat of the file (of the symlink's target for a symlink).

  Raises:
    RejectedFile: with the kind of thing found, or the size and the config field to raise.
  """
  path = os.fspath(path)
  budgets = budgets or Budgets()
  try:
    st = os.lstat(path)
  except OSError as e:
    raise RejectedFile(path, f"unreadable: {describe(e)}") from e
  link = stat.S_ISLNK(st.st_mode)
  if link:
    try:
      st = os.stat(path)
    except OSError as e:  # missing target, or a loop of links
      raise RejectedFile(path, f"broken symlink ({e.strerror or type(e).__name__})") from e
  if not stat.S_ISREG(st.st_mode):
    kind = next((name for test, name in _KINDS if test(st.st_mode)), "a special file")
    raise RejectedFile(path, f"{'symlink to ' if link else ''}{kind}, not a regular file; "
                       "not read")
  if link and roots and not _inside(os.path.realpath(path), roots):
    raise RejectedFile(path, "symlink to a file outside the cohort root; not followed")
  if st.st_size > budgets.max_file_mb * MB:
    raise RejectedFile(path, f"file is {mb(st.st_size)} MB, over "
                       f"config.data.max_file_mb={budgets.max_file_mb}; raise it if the file "
                       "is genuine")
  return st


def _inside(target: str, roots: Sequence[str]) -> bool:
  for root in roots:
    root = os.path.realpath(root)
    if os.path.commonpath([target, root]) == root:
      return True
  return False


class _File:
  """An open file as pydicom sees a buffer: deferred elements are read from this descriptor,
  never by opening the path again (by then it could name something else)."""

  def __init__(self, f):
    self._f = f
    self.read, self.seek, self.tell = f.read, f.seek, f.tell

  @property
  def closed(self) -> bool:
    return self._f.closed


@contextlib.contextmanager
def opened(path: str, checked: os.stat_result, budgets: Budgets):
  """Yields (file, size) for a path `check_path` passed, if it is still that regular file."""
  # O_NONBLOCK: if a FIFO was swapped in since the check, open returns at once (then fails the
  # identity check below) instead of waiting for a writer.
  fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
  try:
    now = os.fstat(fd)
    if (not stat.S_ISREG(now.st_mode)
        or (now.st_dev, now.st_ino) != (checked.st_dev, checked.st_ino)):
      raise RejectedFile(path, "replaced by something else while being opened; not read")
    if now.st_size > budgets.max_file_mb * MB:
      raise RejectedFile(path, f"file grew to {mb(now.st_size)} MB, over "
                         f"config.data.max_file_mb={budgets.max_file_mb}")
    os.set_blocking(fd, True)
    with open(fd, "rb", closefd=False) as f:
      yield _File(f), now.st_size
  finally:
    os.close(fd)


def check_budgets(path: str, rows: int, columns: int, frames: int, samples: int, bits: int,
                  budgets: Budgets) -> None:
  """Rejects an image over `budgets.max_pixels` or `budgets.max_decoded_mb`."""
  pixels = rows * columns * frames * samples
  shape = (f"{rows} x {columns} x {frames} frame{'s' * (frames != 1)} x {samples} "
           f"sample{'s' * (samples != 1)}")
  if pixels > budgets.max_pixels:
    raise RejectedFile(path, f"image is {shape} = {pixels} pixels, over "
                       f"config.data.max_pixels={budgets.max_pixels}; raise it if the file is "
                       "genuine")
  decoded = pixels * (max(bits, 8) // 8)
  if decoded > budgets.max_decoded_mb * MB:
    raise RejectedFile(path, f"image is {shape} at {bits} bits = {mb(decoded)} MB decoded, "
                       f"over config.data.max_decoded_mb={budgets.max_decoded_mb}; raise it if "
                       "the file is genuine")


@functools.cache
def _codestreams() -> frozenset:
  """The JPEG, JPEG-LS and JPEG 2000 transfer syntaxes (built once, at the first file checked)."""
  from pydicom import uid as uids  # pylint: disable=import-outside-toplevel
  return frozenset(uids.JPEGTransferSyntaxes + uids.JPEGLSTransferSyntaxes
                   + uids.JPEG2000TransferSyntaxes)


def check_codestream(path: str, f, ds, ts: uids.UID, rows: int, columns: int,
                     size: int) -> None:
  """Rejects a JPEG, JPEG-LS or JPEG 2000 file whose first frame's size is not Rows x Columns.

  Decoders size their output from one and fill it from the other: gdcm aborts the process on
  such a JPEG-LS file, openjpeg allocates what a forged SIZ marker claims. Only the first bytes
  of the first fragment are read (never the deferred pixel data element).

  Args:
    f: the open file.
    ds: the dataset, its Pixel Data still deferred.
    size: the file's size.
  """
  pixel_data = _encapsulated(ds)
  if ts not in _codestreams() or pixel_data is None:
    return
  fragments_at = _after_offset_table(f, pixel_data, size)
  if fragments_at is None:
    return  # the decoder reports malformed encapsulation
  f.seek(fragments_at[0])
  item = f.read(8)
  if len(item) < 8 or item[:4] != _ITEM:
    return
  shape = codestream_size(f.read(min(struct.unpack("<I", item[4:])[0], _CODESTREAM_PEEK)))
  if shape is not None and shape != (rows, columns):
    raise RejectedFile(path, f"{ts.name} codestream is {shape[0]} x {shape[1]} but Rows x Columns "
                       f"is {rows} x {columns} (inconsistent header); not decoded")


def check_frames(path: str, f, ds, ts: uids.UID, frames: int, size: int) -> None:
  """Rejects encapsulated pixel data whose offset tables or fragments disagree with NumberOfFrames.

  PS3.5 A.4: a Basic Offset Table that is not empty has one entry per frame, as has an Extended
  Offset Table; every frame has at least one fragment of its own; RLE Lossless (PS3.5 G.2) has
  exactly one per frame. Decoders trust NumberOfFrames and the data differently (one joins every
  fragment into one frame, another splits them by the offset table), so a file where they
  disagree decodes to the wrong frames, or to one frame built from several.

  Only the 8-byte item headers are read, seeking over their values, and at most NumberOfFrames + 1
  of them, never past `size`; the pixel data element itself is never loaded. Malformed
  encapsulation (an item tag missing, an item running past the end of the file) is left to the
  decoder to report.

  Args:
    f: the open file.
    ds: the dataset, its Pixel Data still deferred.
    frames: NumberOfFrames (1 when absent).
    size: the file's size.
  """
  from pydicom import dataelem  # pylint: disable=import-outside-toplevel
  from pydicom import uid as uids  # pylint: disable=import-outside-toplevel
  pixel_data = _encapsulated(ds)
  if not ts.is_encapsulated or pixel_data is None:
    return
  extended = ds.get_item(_EXTENDED_OFFSET_TABLE, keep_deferred=True)
  if extended is not None:
    entries = (extended.length if isinstance(extended, dataelem.RawDataElement)
               else len(extended.value or b"")) // 8
    if entries and entries != frames:
      raise RejectedFile(path, f"Extended Offset Table has {_count(entries, 'entry', 'entries')} "
                         f"but NumberOfFrames is {frames} (inconsistent header)")
  fragments_at = _after_offset_table(f, pixel_data, size)
  if fragments_at is None:
    return
  pos, table = fragments_at
  if table % 4:
    return
  if table and table // 4 != frames:
    raise RejectedFile(path, f"Basic Offset Table has {_count(table // 4, 'entry', 'entries')} "
                       f"but NumberOfFrames is {frames} (inconsistent header)")
  rle = ts == uids.RLELossless
  fragments = 0
  # Enough to decide: NumberOfFrames fragments, or one more for RLE.
  while fragments < frames + rle:
    item = _item(f, pos, size)
    if item is None or item[0] == _SEQUENCE_DELIMITER:
      break
    if item[0] != _ITEM:
      return
    fragments, pos = fragments + 1, pos + 8 + item[1]
  if item is None and fragments < frames:
    return  # a truncated or malformed sequence: the decoder's to report
  if fragments < frames:
    raise RejectedFile(path, f"encapsulated pixel data has {_count(fragments, 'fragment')} but "
                       f"NumberOfFrames is {frames}; each frame has at least one (inconsistent "
                       "header)")
  if rle and fragments > frames:
    raise RejectedFile(path, f"RLE Lossless pixel data has more than "
                       f"{_count(frames, 'fragment')} but NumberOfFrames is {frames}; RLE has "
                       "exactly one per frame (inconsistent header)")


def check_codestream_end(path: str, f, ds, ts: uids.UID, size: int) -> None:
  """Rejects a JPEG, JPEG-LS or JPEG 2000 file whose last fragment does not end with the
  codestream's end marker (EOI, or JPEG 2000's EOC: both FF D9), past the bytes that pad a
  fragment to even length (00, or FF as some encoders write it: pydicom's MR2_J2KR.dcm).
  Decoders fill what a cut codestream lacks (a JPEG cut in half decoded with its lower half one
  grey), and a truncated file is caught earlier only when the encapsulation itself is cut.

  Only item headers and the last fragment's final bytes are read; malformed encapsulation is
  left to `check_frames` and the decoder."""
  pixel_data = _encapsulated(ds)
  if ts not in _codestreams() or pixel_data is None:
    return
  fragments_at = _after_offset_table(f, pixel_data, size)
  if fragments_at is None:
    return
  pos, last = fragments_at[0], None
  while (item := _item(f, pos, size)) is not None and item[0] == _ITEM:
    last, pos = (pos + 8, item[1]), pos + 8 + item[1]
  if last is None or last[1] == 0:
    return   # no fragment, or an empty one: the decoder says so
  start, length = last
  f.seek(start + max(0, length - 64))
  tail = f.read(min(length, 64)).rstrip(b"\0\xff")
  if not tail.endswith(b"\xff\xd9"):
    raise RejectedFile(path, f"{ts.name} codestream ends without its end marker (FF D9): "
                       "truncated")


def _encapsulated(ds):
  """The dataset's Pixel Data element if it is of undefined length (encapsulated) and still
  deferred (its value unread), else None."""
  from pydicom import dataelem  # pylint: disable=import-outside-toplevel
  pixel_data = ds.get_item(_PIXEL_DATA, keep_deferred=True)
  if (isinstance(pixel_data, dataelem.RawDataElement)
      and pixel_data.length == _UNDEFINED_LENGTH):
    return pixel_data
  return None


def _after_offset_table(f, pixel_data, size: int) -> tuple[int, int] | None:
  """(where the first fragment's item starts, the Basic Offset Table's length) of `_encapsulated`
  Pixel Data; None when its first item is not an item (malformed: the decoder's to report)."""
  item = _item(f, pixel_data.value_tell, size)
  if item is None or item[0] != _ITEM:
    return None
  return pixel_data.value_tell + 8 + item[1], item[1]


def _item(f, pos: int, size: int) -> tuple[bytes, int] | None:
  """(tag bytes, value length) of the item header at `pos`; None if it or its value runs past
  `size`."""
  if pos + 8 > size:
    return None
  f.seek(pos)
  head = f.read(8)
  if len(head) < 8:
    return None
  length = struct.unpack("<I", head[4:])[0]
  if head[:4] == _ITEM and (length == _UNDEFINED_LENGTH or pos + 8 + length > size):
    return None
  return head[:4], length


def _count(n: int, one: str, many: str | None = None) -> str:
  return f"{n} {one if n == 1 else many or one + 's'}"


def codestream_size(head: bytes) -> tuple[int, int] | None:
  """(rows, columns) from the start of a JPEG, JPEG-LS or JPEG 2000 codestream, if found there."""
  soc = head.find(b"\xff\x4f\xff\x51")  # JPEG 2000: SOC then SIZ (also inside a JP2 box)
  if soc >= 0:
    if len(head) < soc + 24:
      return None
    width, height, x0, y0 = struct.unpack(">IIII", head[soc + 8:soc + 24])
    return height - y0, width - x0
  if head[:2] != b"\xff\xd8":
    return None
  i = 2
  while i + 4 <= len(head):
    if head[i] != 0xFF:
      return None
    marker = head[i + 1]
    if marker == 0xFF:  # fill byte
      i += 1
      continue
    if marker in _SOF:
      if len(head) < i + 9:
        return None
      height, width = struct.unpack(">HH", head[i + 5:i + 9])
      return (height, width) if height else None  # 0: a DNL marker gives it later
    i += 2 + struct.unpack(">H", head[i + 2:i + 4])[0]
  return None


def check_deflated(path: str, f, budgets: Budgets) -> None:
  """Rejects a deflated dataset that inflates past the byte budget, inflating 1 MiB at a time.

  pydicom inflates the whole dataset in memory before parsing it, so a few MB of zeros deflated
  would otherwise become gigabytes in the reading process.
  """
  from pydicom import filereader  # pylint: disable=import-outside-toplevel
  from pydicom import uid as uids  # pylint: disable=import-outside-toplevel
  f.seek(0)
  try:
    filereader.read_preamble(f, False)
    meta = filereader._read_file_meta_info(f)  # pylint: disable=protected-access
  except Exception:  # pylint: disable=broad-except  # not Part 10: the full read decides
    return
  if meta.get("TransferSyntaxUID") != uids.DeflatedExplicitVRLittleEndian:
    return
  limit = budgets.max_decoded_mb * MB + _DEFLATED_SLACK
  inflate, total = zlib.decompressobj(-zlib.MAX_WBITS), 0
  try:
    while not inflate.eof:
      chunk = inflate.unconsumed_tail or f.read(MB)
      if not chunk:
        return  # a cut stream: pydicom's own inflate reports it
      total += len(inflate.decompress(chunk, MB))
      if total > limit:
        raise RejectedFile(path, f"deflated dataset inflates to over {limit // MB} MB, more than "
                           f"config.data.max_decoded_mb={budgets.max_decoded_mb} (+"
                           f"{_DEFLATED_SLACK // MB} MB for other elements) allows")
  except zlib.error:
    return  # reported by pydicom's own inflate


def mb(nbytes: int) -> str:
  """Bytes as MiB for a reason: one decimal under 10 MB."""
  return f"{nbytes / MB:.1f}" if nbytes < 10 * MB else f"{nbytes / MB:.0f}"


def describe(e: BaseException) -> str:
  """An exception as one bounded line."""
  # Plugin errors span several lines (one per plugin tried); keep one line, bounded.
  return " ".join(f"{type(e).__name__}: {e}".split())[:300]
