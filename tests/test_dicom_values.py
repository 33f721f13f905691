"""DICOM values a hospital export gets wrong: each costs its file with a reason naming the
element, or is read as meant; none crashes the ingest, poisons the cache or leaks a PatientID.

The files are real (pydicom writes them; a few bytes are then overwritten to hold what pydicom
would not write: a 'NaN' RescaleSlope, Latin-1 bytes under a UTF-8 SpecificCharacterSet).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pydicom
import pytest
from pydicom import encaps
from pydicom import uid

from medjax.data import dicom
from medjax.data import records
from medjax.data.dicom import decoder
from tests import hostile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh_children():
  decoder.shutdown()
  yield
  decoder.shutdown()


def _rejected(fn, path: str, **kw) -> str:
  with pytest.raises(dicom.RejectedFile) as e:
    fn(path, **kw)
  return e.value.reason


def _voi_lut(descriptor, data) -> pydicom.Dataset:
  item = pydicom.Dataset()
  item.add_new(0x00283002, "US", descriptor)   # LUTDescriptor
  item.add_new(0x00283006, "US", data)         # LUTData
  return item


@pytest.mark.parametrize("placeholder,value,reason", [
    (b"1.25", b"NaN ", "RescaleSlope 'NaN' is not a finite number"),
    (b"1.25", b"1,25", "RescaleSlope '1,25' is not a number"),
    (b"1.000 ", b"1e308 ", "RescaleSlope '1e308' and RescaleIntercept '0.0' take pixel values "
                           "past float range"),
])
def test_a_rescale_that_is_not_a_usable_number_costs_its_file_naming_it(tmp_path, placeholder,
                                                                          value, reason):
  ds = hostile.image_dataset(hostile.ramp(16))
  ds.RescaleSlope, ds.RescaleIntercept = placeholder.decode().strip(), "0.0"
  path = hostile.patched(ds, str(tmp_path / "rescale.dcm"), placeholder, value)
  dicom.read_header(path)   # the header is fine: decoding finds it
  for fn in (dicom.load_image, decoder.Decoder(isolate="all").load_image):
    assert _rejected(fn, path) == reason


@pytest.mark.parametrize("item,reason", [
    (_voi_lut([256, 0, 0], list(range(256))),
     "VOI LUT Sequence: LUTDescriptor gives 0 bits per entry (DICOM: 8 to 16)"),
    (_voi_lut([256, 0, 16], []), "VOI LUT Sequence: LUTData is empty"),
])
def test_a_voi_lut_that_cannot_map_costs_its_file_naming_it(tmp_path, item, reason):
  """Before: divided by 2**0 - 1, or indexed an empty table: NaN pixels in the cache."""
  ds = hostile.image_dataset(hostile.ramp(16))
  ds.VOILUTSequence = [item]
  path = hostile.save(ds, str(tmp_path / "voi.dcm"))
  assert _rejected(dicom.load_image, path) == reason


def test_header_values_that_mislead_the_length_checks_are_named(tmp_path):
  ds = hostile.image_dataset(hostile.frames(2))
  ds.NumberOfFrames = "222"
  path = hostile.patched(ds, str(tmp_path / "frames.dcm"), b"IS\x04\x00222 ", b"IS\x04\x001.5 ")
  # (IS '1.5' used to count as 1 frame, then as 1.5 in the expected length.)
  assert _rejected(dicom.read_header, path) == "invalid NumberOfFrames '1.5'"
  ds = hostile.compressed(hostile.ramp(16), uid.RLELossless)   # undefined-length pixel data
  path = hostile.patched(ds, str(tmp_path / "native.dcm"), uid.RLELossless.encode() + b"\0",
                         uid.ExplicitVRLittleEndian.encode() + b"\0")
  assert _rejected(dicom.read_header, path) == (
      "Pixel Data has undefined length (encapsulated data?) under the native transfer syntax "
      "Explicit VR Little Endian: the file's TransferSyntaxUID is wrong")


def test_a_codestream_cut_short_inside_whole_encapsulation_costs_its_file(tmp_path):
  """A JPEG 2000 frame cut in half, re-encapsulated (so the file itself ends where it should):
  decoders fill the missing half; the missing end marker says it is cut. The marker followed by
  pad bytes (00 or FF) is whole."""
  ds = hostile.compressed(hostile.ramp(64), uid.JPEG2000Lossless)
  (frame,) = encaps.generate_frames(ds.PixelData, number_of_frames=1)
  assert frame.rstrip(b"\0").endswith(b"\xff\xd9")
  for name, fragment, reason in [
      ("cut.dcm", frame[:len(frame) // 4 * 2],
       "JPEG 2000 Image Compression (Lossless Only) codestream ends without its end marker "
       "(FF D9): truncated"),
      ("padded.dcm", frame.rstrip(b"\0") + b"\xff" * (len(frame.rstrip(b"\0")) % 2 or 2), None)]:
    ds.PixelData = encaps.encapsulate([fragment])
    path = hostile.save(ds, str(tmp_path / name))
    for fn in (dicom.read_header, dicom.load_image, decoder.Decoder().load_image):
      if reason is None:
        fn(path)
      else:
        assert _rejected(fn, path) == reason


def _with_patient_id(tmp_path, name: str, raw: bytes, charset: str | None) -> str:
  ds = hostile.image_dataset(hostile.ramp(8), patient_id="X" * len(raw))
  if charset:
    ds.SpecificCharacterSet = charset
  return hostile.patched(ds, str(tmp_path / name), b"X" * len(raw), raw)


def test_patient_ids_in_the_wrong_character_set_stay_apart_and_read_as_meant(tmp_path):
  """Latin-1 bytes under ISO_IR 192 (UTF-8) were read with U+FFFD for the bad byte, making
  'PTXÄ8001K' and 'PTXÖ8001K' one patient; UTF-8 bytes without a SpecificCharacterSet were read
  as Latin-1 ('PTXÃ\\x84...'), matching no labels row. Valid ids are read as before."""
  got = {name: dicom.read_header(_with_patient_id(tmp_path, name, raw, charset)).patient_id
         for name, raw, charset in [
             ("a.dcm", b"PTX\xc48001K", "ISO_IR 192"), ("o.dcm", b"PTX\xd68001K", "ISO_IR 192"),
             ("u.dcm", b"PTX\xc3\x848002K", None), ("v.dcm", b"PTX\xc3\x848003K", "ISO_IR 192"),
             ("l.dcm", b"PTX\xc48004K", "ISO_IR 100"), ("p.dcm", b"PTX8005K", None)]}
  assert got == {"a.dcm": "PTX\u00c48001K", "o.dcm": "PTX\u00d68001K", "u.dcm": "PTX\u00c48002K",
                 "v.dcm": "PTX\u00c48003K", "l.dcm": "PTX\u00c48004K", "p.dcm": "PTX8005K"}


def test_pydicom_warnings_that_quote_a_patient_id_never_reach_the_output(tmp_path):
  """A PatientID stored with the wrong VR (IS): pydicom's warning quotes the value; ingest reads
  headers in its own process, whose output is the run's log."""
  ds = hostile.image_dataset(hostile.ramp(8))
  ds.add(pydicom.DataElement(0x00100020, "IS", "12345678"))
  path = hostile.patched(ds, str(tmp_path / "vr.dcm"), b"12345678", b"PTX7001K")
  code = ("import sys; from medjax.data import dicom; "
          "print(dicom.read_header(sys.argv[1]).patient_id == 'PTX7001K')")
  out = subprocess.run([sys.executable, "-c", code, path], cwd=REPO, capture_output=True,
                       text=True, timeout=120, check=True)
  assert out.stdout.strip() == "True"
  assert "PTX7001K" not in out.stderr, out.stderr[-2000:]


def test_a_strip_one_pixel_high_is_letterboxed_without_its_square():
  """1 x 60000: padded to a square first, that is 60000 x 60000 float32 (13.4 GiB; the ingest
  stopped with a MemoryError). Resized first, it is a 16-wide strip one row high."""
  strip = np.linspace(0.0, 1.0, 60000, dtype=np.float32)[None]
  tracemalloc.start()
  out = records.letterbox(strip, 16)
  peak = tracemalloc.get_traced_memory()[1]
  tracemalloc.stop()
  assert peak < 32 << 20 and out.shape == (16, 16) and out.dtype == np.float32
  assert np.count_nonzero(out.any(axis=1)) == 1 and 0.4 < out.max(axis=0).mean() < 0.6
  square = np.random.default_rng(0).random((40, 30)).astype(np.float32)
  side = np.zeros((40, 40), np.float32)
  side[:, 5:35] = square   # below the bound: padded, then resized, as it always was
  np.testing.assert_array_equal(records.letterbox(square, 16), records.letterbox(side, 16))


@pytest.mark.parametrize("ts", [uid.ExplicitVRLittleEndian, uid.RLELossless])
def test_a_record_decodes_only_the_frames_it_has_room_for(tmp_path, ts):
  """A 40-frame file for a record of 3 images decodes 3 frames (a 600-slice CT volume in one
  file took 4.4 GB to decode whole), windowed as a 3-frame file of the same frames is."""
  many = hostile.frames(40)
  files = {}
  for name, pixels in (("many.dcm", many), ("three.dcm", many[:3])):
    ds = (hostile.compressed(pixels, ts) if ts.is_compressed
          else hostile.image_dataset(pixels))
    files[name] = hostile.save(ds, str(tmp_path / name))
  three = dicom.load_image(files["three.dcm"])
  for fn in (dicom.load_image, decoder.Decoder().load_image):
    np.testing.assert_array_equal(fn(files["many.dcm"], frames=3), three)
  assert dicom.load_image(files["many.dcm"]).shape == (40, 16, 16)
  shapes = records.Shapes(image_size=16, max_images=3, num_analytes=1, vitals_steps=1,
                          vitals_channels=1)
  images, rejected, _ = records.decode_images(["many.dcm"], str(tmp_path), shapes)
  assert not rejected and images["image_mask"].all()
  np.testing.assert_allclose(images["images"], three, atol=1e-6)
