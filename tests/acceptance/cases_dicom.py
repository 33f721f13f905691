"""Bad-input cases of DICOM files (see bad_inputs.py).

Every case writes the base cohort (`lib.cohort`: 10 patients with labels, labs,
vitals, 2 of them with a DICOM image), breaks one thing, and ingests it with
`launch.py --config=configs/quickstart.py:tiny --config.mode=ingest` (scan, tables, manifest,
placement and the decoded cache, so decode-stage problems show).
"""

from __future__ import annotations

import os
import random
import struct

import numpy as np

from tests.acceptance import lib
from tests.acceptance.lib import ACCEPTED, CLEAR, IDS, QUARANTINED, Quarantined, case

# -- DICOM --------------------------------------------------------------------------------------

HOSTILE_ID = IDS[0]   # a patient with a label, labs and vitals: whatever passes the scan is decoded


def _dicom(ctx, build, reason: str | None = None, stage: str | None = None,
           name: str = "hostile.dcm", extra=(), expect_path: str | None = None, checks=(),
           patients=10, error=None, quarantined=True, no_override=False,
           after=None) -> lib.Plan:
  """The base cohort plus dicom/hostile/<name>, written by build(path) (which may return the
  exact reason to expect); ingested with decoding."""
  root = lib.cohort(ctx.path("cohort"))
  path = os.path.join(root, "dicom", "hostile", name)
  os.makedirs(os.path.dirname(path), exist_ok=True)
  got = build(path)
  if reason is None:   # tests/hostile.py's builders return the exact reason; others: any reason
    reason = got if isinstance(got, str) and not got.startswith("/") else ""
  work = ctx.path("work")
  rel = expect_path or f"dicom/hostile/{name}"
  return lib.Plan(argv=lib.ingest_argv(root, work, *extra), workdir=work,
                  raw_ids=[*IDS, HOSTILE_ID.lower()], cohort=root, patients=patients,
                  patient_ids=IDS,
                  quarantined=[Quarantined(rel, reason, stage=stage)] if quarantined else [],
                  checks=list(checks), error=error, timeout=180, no_override=no_override,
                  after=after)


def _hostile():
  from tests import hostile  # pylint: disable=import-outside-toplevel
  return hostile


def _image(pixels=None, **attrs):
  h = _hostile()
  ds = h.image_dataset(h.ramp(16) if pixels is None else pixels, HOSTILE_ID)
  for k, v in attrs.items():
    setattr(ds, k, v)
  return ds


def _saved(ds, path):
  return _hostile().save(ds, path)


@case("dicom", "control: base cohort, nothing hostile", ACCEPTED)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"))
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=IDS, cohort=root,
                  patients=10, patient_ids=IDS, checks=[lib.decoded(10)])


@case("dicom", "control: a valid JPEG baseline file", ACCEPTED)
def _(ctx):
  def build(path):
    import pydicom  # pylint: disable=import-outside-toplevel
    from tests import testdata  # pylint: disable=import-outside-toplevel
    ds = pydicom.dcmread(testdata.dicom_test_file("SC_rgb_jpeg_dcmtk.dcm"))
    ds.PatientID = HOSTILE_ID
    ds.save_as(path)
  return _dicom(ctx, build, quarantined=False,
                checks=[lib.referenced("dicom/hostile/hostile.dcm"), lib.decoded(10)])


@case("dicom", "JPEG-LS: Rows/Columns disagree with the codestream", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().jpegls_geometry_mismatch(p, HOSTILE_ID))


@case("dicom", "JPEG-LS: geometry lie past the header check (gdcm SIGABRT)", QUARANTINED,
      quick=True)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().jpegls_geometry_mismatch(p, HOSTILE_ID, late_sof=True),
                stage="decode", checks=[lib.decoded(10)])


@case("dicom", "JPEG 2000: SIZ claims 40000 x 40000", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().j2k_size_bomb(p, HOSTILE_ID))


@case("dicom", "RLE: 65535 x 65535 header bomb", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().rle_bomb(p, HOSTILE_ID))


@case("dicom", "RLE: memory bomb within the header budgets", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().rle_memory_bomb(p, 4096, HOSTILE_ID),
                stage="decode", extra=["--config.data.decode_memory_mb=512"],
                checks=[lib.decoded(10)])


@case("dicom", "deflate bomb (1 MB inflating to 1.1 GB)", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().deflate_bomb(p, patient_id=HOSTILE_ID))


@case("dicom", "BitsAllocated 12", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().bits_allocated_12(p, HOSTILE_ID))


@case("dicom", "BitsStored over BitsAllocated", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().bits_stored_over_allocated(p, HOSTILE_ID))


@case("dicom", "BitsAllocated inconsistent with the pixel length", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().bits_allocated_vs_length(p, HOSTILE_ID))


@case("dicom", "native pixel data far too long", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().pixel_data_far_too_long(p, HOSTILE_ID))


@case("dicom", "file over the default max_file_mb (sparse 2 GB)", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().sparse_huge(p))


@case("dicom", "genuine file over data.max_file_mb=1", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(np.zeros((1024, 1024), np.uint16)), p),
                reason="over config.data.max_file_mb=1", extra=["--config.data.max_file_mb=1"])


@case("dicom", "FIFO named x.dcm", QUARANTINED, quick=True)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().fifo(p))


@case("dicom", "socket", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().socket_file(p))


@case("dicom", "symlink to /dev/zero", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().link_to_dev_zero(p))


@case("dicom", "symlink leaving the cohort root", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().link_outside(p, ctx.path("outside")))


@case("dicom", "broken symlink", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().broken_link(p))


@case("dicom", "symlink to itself", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().link_loop(p))


@case("dicom", "directory symlink loop (to itself)", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _hostile().dir_link_loop(p), name="loop")


@case("dicom", "directory symlink to the cohort's parent", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: os.symlink("../../..", p), name="up",
                reason="symlink to a directory")


@case("dicom", "duplicate SOPInstanceUID", QUARANTINED)
def _(ctx):
  def build(path):
    ds = _image(SOPInstanceUID="1.2.826.0.1.3680043.8.498.1")
    _saved(ds, os.path.join(os.path.dirname(path), "a.dcm"))
    _saved(ds, path)
  return _dicom(ctx, build, name="b.dcm", reason="duplicate SOPInstanceUID",
                checks=[lib.referenced("dicom/hostile/a.dcm")])


@case("dicom", "truncated in the pixel data", QUARANTINED)
def _(ctx):
  def build(path):
    _saved(_image(_hostile().ramp(64)), path)
    with open(path, "r+b") as f:
      f.truncate(os.path.getsize(path) * 6 // 10)
  return _dicom(ctx, build, reason="truncated")


@case("dicom", "truncated in the header", QUARANTINED)
def _(ctx):
  def build(path):
    _saved(_image(), path)
    with open(path, "r+b") as f:
      f.truncate(200)
  return _dicom(ctx, build)


@case("dicom", "zero-length file", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: lib.write(p, b""))


@case("dicom", "random bytes", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: lib.write(p, random.Random(3).randbytes(4096)))


@case("dicom", "random bytes after a DICM preamble", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: lib.write(p, bytes(128) + b"DICM"
                                         + random.Random(4).randbytes(4096)))


@case("dicom", "PNG named .dcm", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: lib.write(p, b"\x89PNG\r\n\x1a\n" + random.Random(5).randbytes(900)))


@case("dicom", "a study left zipped among the images", QUARANTINED)
def _(ctx):
  # It was 'not a DICOM file' alone, with no word of the images inside.
  def build(path):
    import zipfile  # pylint: disable=import-outside-toplevel
    import pydicom.data  # pylint: disable=import-outside-toplevel
    with zipfile.ZipFile(path, "w") as z:
      z.write(os.path.join(os.path.dirname(pydicom.data.__file__), "test_files", "CT_small.dcm"),
              "IMG0001")
  return _dicom(ctx, build, name="study.zip",
                reason="not a DICOM file: a ZIP archive; unpack it under dicom/")


@case("dicom", "a CD export's DICOMDIR beside its images", QUARANTINED)
def _(ctx):
  # It was 'no pixel data (SOP class unknown)': its class is in the file meta only.
  def build(path):
    import shutil  # pylint: disable=import-outside-toplevel
    import pydicom.data  # pylint: disable=import-outside-toplevel
    shutil.copy(os.path.join(os.path.dirname(pydicom.data.__file__), "test_files",
                             "dicomdirtests", "DICOMDIR"), path)
  return _dicom(ctx, build, name="DICOMDIR",
                reason="a DICOMDIR, the media's index of its files, not an image")


@case("dicom", "SR document (no pixels)", QUARANTINED)
def _(ctx):
  def build(path):
    import pydicom  # pylint: disable=import-outside-toplevel
    from pydicom import uid  # pylint: disable=import-outside-toplevel
    ds = pydicom.Dataset()
    ds.file_meta = pydicom.dataset.FileMetaDataset()
    ds.SOPClassUID = "1.2.840.10008.5.1.4.1.1.88.11"   # Basic Text SR
    ds.SOPInstanceUID = uid.generate_uid()
    ds.PatientID, ds.Modality = HOSTILE_ID, "SR"
    ds.file_meta.TransferSyntaxUID = uid.ExplicitVRLittleEndian
    _saved(ds, path)
  return _dicom(ctx, build, reason="no pixel data")


@case("dicom", "RT plan (no pixels)", QUARANTINED)
def _(ctx):
  def build(path):
    import pydicom  # pylint: disable=import-outside-toplevel
    from tests import testdata  # pylint: disable=import-outside-toplevel
    ds = pydicom.dcmread(testdata.dicom_test_file("rtplan.dcm"))
    ds.PatientID = HOSTILE_ID
    ds.save_as(path)
  return _dicom(ctx, build, reason="no pixel data")


@case("dicom", "missing PatientID", QUARANTINED)
def _(ctx):
  def build(path):
    ds = _image()
    del ds.PatientID
    _saved(ds, path)
  return _dicom(ctx, build, reason="PatientID")


@case("dicom", "PatientID only whitespace", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(PatientID="   "), p), reason="PatientID")


@case("dicom", "PatientID multi-valued", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(PatientID=f"{IDS[0]}\\{IDS[1]}"), p))


@case("dicom", "float pixel data", QUARANTINED)
def _(ctx):
  def build(path):
    ds = _image()
    del ds.PixelData
    ds.BitsAllocated = 32
    for tag in ("BitsStored", "HighBit", "PixelRepresentation"):
      delattr(ds, tag)
    ds.FloatPixelData = np.linspace(0, 1, 256, dtype=np.float32).tobytes()
    _saved(ds, path)
  return _dicom(ctx, build)


@case("dicom", "1-bit pixels", ACCEPTED)
def _(ctx):
  def build(path):
    ds = _image()
    bits = (np.add.outer(np.arange(16), np.arange(16)) % 2).astype(np.uint8)
    ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 1, 1, 0, 0
    ds.PixelData = np.packbits(bits.ravel(), bitorder="little").tobytes()
    _saved(ds, path)
  return _dicom(ctx, build, quarantined=False,
                checks=[lib.referenced("dicom/hostile/hostile.dcm"), lib.decoded(10)])


@case("dicom", "unsupported transfer syntax UID (JPEG XL)", QUARANTINED)
def _(ctx):
  def build(path):
    from pydicom import encaps  # pylint: disable=import-outside-toplevel
    ds = _image()
    ds.PixelData = encaps.encapsulate([random.Random(6).randbytes(300)])
    ds["PixelData"].VR = "OB"
    # pydicom refuses to write a standard UID it does not know: write a private one of the same
    # length, then put JPEG XL Lossless (1.2.840.10008.1.2.4.110, DICOM 2024) in its place.
    ds.file_meta.TransferSyntaxUID = "1.3.6.1.4.1.99999.1.2.3"
    ds.save_as(path, implicit_vr=False, little_endian=True, enforce_file_format=True)
    with open(path, "rb") as f:
      data = f.read().replace(b"1.3.6.1.4.1.99999.1.2.3", b"1.2.840.10008.1.2.4.110", 1)
    lib.write(path, data)
  return _dicom(ctx, build)


@case("dicom", "private transfer syntax UID", QUARANTINED)
def _(ctx):
  def build(path):
    from pydicom import encaps  # pylint: disable=import-outside-toplevel
    ds = _image()
    ds.PixelData = encaps.encapsulate([random.Random(7).randbytes(300)])
    ds["PixelData"].VR = "OB"
    ds.file_meta.TransferSyntaxUID = "1.3.6.1.4.1.99999.1.2"
    ds.save_as(path, implicit_vr=False, little_endian=True, enforce_file_format=True)
  return _dicom(ctx, build)


@case("dicom", "multi-frame with NumberOfFrames too large", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(NumberOfFrames=5000), p), reason="truncated")


@case("dicom", "Rows 0", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(Rows=0), p))


@case("dicom", "Rows 0xFFFF (negative as a signed short)", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(Rows=0xFFFF), p))


@case("dicom", "photometric interpretation unknown", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(PhotometricInterpretation="FOO"), p))


@case("dicom", "SamplesPerPixel 3 with one sample of data", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(SamplesPerPixel=3, PlanarConfiguration=0), p))


def _insert_before_pixels(path: str, element: bytes) -> None:
  with open(path, "rb") as f:
    data = f.read()
  at = data.rfind(b"\xe0\x7f\x10\x00")
  with open(path, "wb") as f:
    f.write(data[:at] + element + data[at:])


@case("dicom", "element claiming a 4 GB length", QUARANTINED)
def _(ctx):
  def build(path):
    _saved(_image(), path)
    _insert_before_pixels(path, struct.pack("<HH2sHI", 0x0009, 0x1010, b"UN", 0, 0xFFFFFFF0)
                          + bytes(64))
  return _dicom(ctx, build)


@case("dicom", "Pixel Data length 0xFFFFFFF0", QUARANTINED)
def _(ctx):
  def build(path):
    _saved(_image(), path)
    with open(path, "rb") as f:
      data = bytearray(f.read())
    at = data.rfind(b"\xe0\x7f\x10\x00")
    data[at + 8:at + 12] = struct.pack("<I", 0xFFFFFFF0)
    with open(path, "wb") as f:
      f.write(data)
  return _dicom(ctx, build)


@case("dicom", "Pixel Data only inside a sequence", QUARANTINED)
def _(ctx):
  def build(path):
    import pydicom  # pylint: disable=import-outside-toplevel
    ds = _image()
    item = pydicom.Dataset()
    item.PixelData = ds.PixelData
    item["PixelData"].VR = "OW"
    del ds.PixelData
    ds.IconImageSequence = [item]
    _saved(ds, path)
  return _dicom(ctx, build, reason="no pixel data")


@case("dicom", "file name with bytes that are not UTF-8", ACCEPTED)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"))
  d = os.path.join(root, "dicom", "hostile")
  os.makedirs(d)
  _saved(_image(), os.fsdecode(os.fsencode(d) + b"/scan\xff\xfe.dcm"))
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=IDS, cohort=root,
                  patients=10, patient_ids=IDS, checks=[lib.decoded(10)])


@case("dicom", "file name with a newline", ACCEPTED)
def _(ctx):
  return _dicom(ctx, lambda p: _saved(_image(), p), name="two\nlines.dcm", quarantined=False,
                checks=[lib.referenced("dicom/hostile/two\nlines.dcm")])


@case("dicom", "dicom/ is a regular file", CLEAR)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"), images=0)
  lib.write(os.path.join(root, "dicom"), b"not a folder\n")
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=IDS, cohort=root,
                  error="dicom")


# -- issue 32: headers that disagree with their pixel data --------------------------------------

def _inconsistent(ctx, name: str):
  """A build writing tests/hostile.py's `inconsistent_headers` file `name` (a valid image
  whose header was then changed to disagree with its pixel data); returns its exact reason."""
  def build(path):
    made = ctx.path("made")   # outside the cohort: only the one file goes in
    os.makedirs(made, exist_ok=True)
    reasons = _hostile().inconsistent_headers(made, HOSTILE_ID)
    os.replace(os.path.join(made, name), path)
    return reasons[name]
  return build


for _name, _what in [
    ("bits_8_over_16.dcm", "16-bit data under BitsAllocated 8"),
    ("frames_1_over_2.dcm", "two frames under NumberOfFrames 1"),
    ("frames_2_over_3.dcm", "three 8-bit frames under NumberOfFrames 2"),
    ("columns_short.dcm", "24 x 32 data under Columns 24"),
    ("rows_short_odd.dcm", "6 x 5 data under Rows 5 (odd length)"),
    ("appended.dcm", "two bytes appended to the pixel data"),
    ("samples_1_over_3.dcm", "RGB data under SamplesPerPixel 1"),
    ("bits_1_frames_1_over_2.dcm", "two 1-bit frames under NumberOfFrames 1"),
    ("rle_bot_2_frames_1.dcm", "RLE: offset table of 2 frames, NumberOfFrames 1"),
    ("jpegls_bot_2_frames_3.dcm", "JPEG-LS: offset table of 2 frames, NumberOfFrames 3"),
    ("jpegls_eot_2_frames_3.dcm", "JPEG-LS: extended offset table of 2, NumberOfFrames 3"),
    ("jpegls_2_fragments_frames_3.dcm", "JPEG-LS: 2 fragments, NumberOfFrames 3"),
    ("rle_3_fragments_2_frames.dcm", "RLE: 3 fragments, NumberOfFrames 2")]:

  @case("dicom", f"header vs pixel data: {_what}", QUARANTINED)
  def _(ctx, _name=_name):
    return _dicom(ctx, _inconsistent(ctx, _name), name=_name)


def _consistent(ctx, name: str):
  def build(path):
    made = ctx.path("made")
    os.makedirs(made, exist_ok=True)
    _hostile().consistent_edges(made, HOSTILE_ID)
    os.replace(os.path.join(made, name), path)
  return build


@case("dicom", "control: odd-length 8-bit data with its pad byte", ACCEPTED)
def _(ctx):
  return _dicom(ctx, _consistent(ctx, "odd_padded.dcm"), name="odd_padded.dcm",
                quarantined=False, checks=[lib.referenced("dicom/hostile/odd_padded.dcm"),
                                           lib.decoded(10)])


@case("dicom", "control: RLE, 3 frames, no offset table", ACCEPTED)
def _(ctx):
  return _dicom(ctx, _consistent(ctx, "rle_frames_3_no_bot.dcm"), name="rle_frames_3_no_bot.dcm",
                quarantined=False,
                checks=[lib.referenced("dicom/hostile/rle_frames_3_no_bot.dcm"), lib.decoded(10)])


# -- one SOPInstanceUID under two patients ------------------------------------------------------

_UID = "1.2.826.0.1.3680043.8.498.77"
_SHARED = "SOPInstanceUID is also in"


def _both(a: str, b: str) -> list:
  """Both files of one SOPInstanceUID under two patients, each quarantined naming the other."""
  return [lib.Quarantined(a, f"{_SHARED} {b}", stage="link"),
          lib.Quarantined(b, f"{_SHARED} {a}", stage="link")]


def _shared_plan(ctx, root: str, quarantined, patients=10, more=()) -> lib.Plan:
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=[*IDS, *more],
                  cohort=root, patients=patients, patient_ids=[*IDS, *more],
                  quarantined=quarantined, timeout=180)


@case("dicom", "one SOPInstanceUID in two patients' new files", QUARANTINED, quick=True)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"))
  for name, pid in (("a.dcm", IDS[0]), ("b.dcm", IDS[1])):
    lib.small_image(os.path.join(root, "dicom", "hostile", name), pid, SOPInstanceUID=_UID)
  return _shared_plan(ctx, root, _both("dicom/hostile/a.dcm", "dicom/hostile/b.dcm"))


@case("dicom", "one SOPInstanceUID: patient 2's only image copies patient 1's", QUARANTINED)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"))
  import pydicom  # pylint: disable=import-outside-toplevel
  uid = pydicom.dcmread(os.path.join(root, "dicom", "p0", "img.dcm")).SOPInstanceUID
  lib.small_image(os.path.join(root, "dicom", "p1", "img.dcm"), IDS[1], SOPInstanceUID=uid)
  return _shared_plan(ctx, root, _both("dicom/p0/img.dcm", "dicom/p1/img.dcm"))


@case("dicom", "one SOPInstanceUID: twice for one patient, once for another", QUARANTINED)
def _(ctx):
  root = lib.cohort(ctx.path("cohort"))
  for name, pid in (("a.dcm", IDS[0]), ("a2.dcm", IDS[0]), ("b.dcm", IDS[1])):
    lib.small_image(os.path.join(root, "dicom", "hostile", name), pid, SOPInstanceUID=_UID)
  return _shared_plan(ctx, root, [
      lib.Quarantined("dicom/hostile/a2.dcm", "duplicate SOPInstanceUID (same instance as "
                      "dicom/hostile/a.dcm)"),
      *_both("dicom/hostile/a.dcm", "dicom/hostile/b.dcm")])


@case("dicom", "one SOPInstanceUID: the image of a patient with nothing else", QUARANTINED)
def _(ctx):
  # The new patient's one image is set aside: a label and no data, a patient entry.
  extra = "PTX8010K"
  root = lib.cohort(ctx.path("cohort"))
  with open(os.path.join(root, "labels.csv"), "a") as f:
    f.write(f"{extra},flu\n")
  import pydicom  # pylint: disable=import-outside-toplevel
  uid = pydicom.dcmread(os.path.join(root, "dicom", "p0", "img.dcm")).SOPInstanceUID
  lib.small_image(os.path.join(root, "dicom", "p9", "img.dcm"), extra, SOPInstanceUID=uid)
  return _shared_plan(ctx, root, more=[extra], quarantined=[
      *_both("dicom/p9/img.dcm", "dicom/p0/img.dcm"),
      # Why: its one image was set aside (the chain names it), not "no image".
      lib.left_out(extra, "dicom/p9/img.dcm")])


# -- folders and files the process may not read -------------------------------------------------

@case("dicom", "a dicom/ subfolder not readable by the process", QUARANTINED)
def _(ctx):
  locked = ctx.path("cohort", "dicom", "hostile")

  def build(path):
    _saved(_image(), path)
    os.chmod(locked, 0)
  return _dicom(ctx, build, expect_path="dicom/hostile", reason="directory not readable",
                no_override=True, after=lambda: os.chmod(locked, 0o755))


@case("dicom", "dicom/ itself not readable by the process", QUARANTINED)
def _(ctx):
  base = ctx.path("cohort", "dicom")
  return _dicom(ctx, lambda p: (_saved(_image(), p), os.chmod(base, 0)), expect_path="dicom",
                reason="directory not readable", no_override=True,
                after=lambda: os.chmod(base, 0o755))


@case("dicom", "a DICOM file not readable by the process", QUARANTINED)
def _(ctx):
  return _dicom(ctx, lambda p: (_saved(_image(), p), os.chmod(p, 0)), no_override=True)


# -- a patient whose every image is rejected after its header was read ---------------------------

def _only_image(ctx, build, *, labelled: bool, reason: str) -> lib.Plan:
  """The base cohort plus a patient whose one image (dicom/p9/img.dcm, written by
  build(path, patient)) is rejected once its header was read; with a label row or without."""
  extra = "PTX8011K"
  root = lib.cohort(ctx.path("cohort"))
  if labelled:
    with open(os.path.join(root, "labels.csv"), "a") as f:
      f.write(f"{extra},copd\n")
  path = os.path.join(root, "dicom", "p9", "img.dcm")
  os.makedirs(os.path.dirname(path))
  build(path, extra)
  work = ctx.path("work")
  return lib.Plan(argv=lib.ingest_argv(root, work), workdir=work, raw_ids=[*IDS, extra],
                  cohort=root, patients=10, patient_ids=[*IDS, extra], timeout=180,
                  quarantined=[lib.Quarantined("dicom/p9/img.dcm", reason),
                               lib.left_out(extra, "dicom/p9/img.dcm" if labelled
                                            else "no row in labels.csv")])


def _truncated(path, pid):
  lib.small_image(path, pid, size=64)
  with open(path, "r+b") as f:
    f.truncate(os.path.getsize(path) * 6 // 10)


@case("dicom", "a labelled patient's only image truncated in the pixel data", QUARANTINED)
def _(ctx):
  return _only_image(ctx, _truncated, labelled=True, reason="truncated")


@case("dicom", "an unlabelled patient's only image truncated in the pixel data", QUARANTINED)
def _(ctx):
  return _only_image(ctx, _truncated, labelled=False, reason="truncated")


@case("dicom", "a labelled patient's only image with an inconsistent header", QUARANTINED)
def _(ctx):
  def build(path, pid):
    made = ctx.path("made")
    os.makedirs(made, exist_ok=True)
    _hostile().inconsistent_headers(made, pid)
    os.replace(os.path.join(made, "appended.dcm"), path)
  return _only_image(ctx, build, labelled=True, reason="inconsistent header")


# -- values an export gets wrong (tests/test_dicom_values.py has the unit tests) --------------

@case("dicom", "PatientID stored with the wrong VR (IS): pydicom's warning quotes it", ACCEPTED)
def _(ctx):
  def build(path):
    import pydicom  # pylint: disable=import-outside-toplevel
    ds = _image()
    ds.add(pydicom.DataElement(0x00100020, "IS", "1" * len(HOSTILE_ID)))
    _hostile().patched(ds, path, b"1" * len(HOSTILE_ID), HOSTILE_ID.encode())
  return _dicom(ctx, build, quarantined=False,
                checks=[lib.referenced("dicom/hostile/hostile.dcm"), lib.decoded(10)])


@case("dicom", "RescaleSlope 'NaN'", QUARANTINED)
def _(ctx):
  def build(path):
    _hostile().patched(_image(RescaleSlope="1.25", RescaleIntercept="0"), path, b"1.25", b"NaN ")
  return _dicom(ctx, build, "RescaleSlope 'NaN' is not a finite number", stage="decode",
                checks=[lib.decoded(10)])


@case("dicom", "JPEG 2000 codestream cut in half inside whole encapsulation", QUARANTINED)
def _(ctx):
  def build(path):
    from pydicom import encaps  # pylint: disable=import-outside-toplevel
    from pydicom import uid  # pylint: disable=import-outside-toplevel
    h = _hostile()
    ds = h.compressed(h.ramp(64), uid.JPEG2000Lossless, HOSTILE_ID)
    (frame,) = encaps.generate_frames(ds.PixelData, number_of_frames=1)
    ds.PixelData = encaps.encapsulate([frame[:len(frame) // 4 * 2]])
    _saved(ds, path)
  return _dicom(ctx, build, "codestream ends without its end marker (FF D9): truncated")


@case("dicom", "a strip 1 x 60000 pixels (its padded square: 13.4 GiB)", ACCEPTED)
def _(ctx):
  def build(path):
    strip = (np.arange(60000) % 4000).astype(np.uint16)[None]
    _saved(_image(strip), path)
  return _dicom(ctx, build, quarantined=False,
                checks=[lib.referenced("dicom/hostile/hostile.dcm"), lib.decoded(10)])
