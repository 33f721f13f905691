"""Tests for medjax.data.dicom on pydicom's real test files and on small files written here."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import os
import pickle
import tarfile
import zipfile

import numpy as np
import pydicom
import pytest
from pydicom.pixels import processing

from medjax.data import dicom
from tests import testdata

# pydicom warns about the many malformed files it is fed here; the tests assert on outcomes.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

_MAX_SWEEP_BYTES = 20 * 2**20


@functools.lru_cache(maxsize=None)
def _load(name: str) -> np.ndarray | dicom.RejectedFile:
  """load_image on a test file, once per session (color3d_jpeg_baseline alone takes seconds)."""
  try:
    return dicom.load_image(testdata.dicom_test_file(name))
  except dicom.RejectedFile as e:
    return e


def _image(name: str) -> np.ndarray:
  out = _load(name)
  if isinstance(out, dicom.RejectedFile):
    raise AssertionError(f"expected {name} to decode, got RejectedFile: {out}")
  return out


def _write(path, stored, photometric="MONOCHROME2", bits_stored=12, **elements) -> str:
  """Writes a real DICOM file (with preamble and file meta) holding `stored` pixels.

  `elements` are set as keyword=value on the dataset; a value of None deletes the element.
  """
  ds = pydicom.Dataset()
  ds.file_meta = pydicom.dataset.FileMetaDataset()
  ds.SOPClassUID = pydicom.uid.MRImageStorage
  ds.Modality = "MR"
  ds.PatientID = "patient-1"
  ds.set_pixel_data(np.asarray(stored), photometric, bits_stored)
  for keyword, value in elements.items():
    if value is None:
      delattr(ds, keyword)
    else:
      setattr(ds, keyword, value)
  path = os.fspath(path)
  pydicom.dcmwrite(path, ds, enforce_file_format=True)
  return path


def _ramp(shape=(24, 32), high=4095, seed=0) -> np.ndarray:
  """A non-degenerate 12-bit test image: a ramp plus noise."""
  rng = np.random.default_rng(seed)
  ramp = np.linspace(0, high, num=np.prod(shape)).reshape(shape)
  return np.clip(ramp + rng.normal(0, 50, shape), 0, high).astype(np.uint16)


# Every pair below was checked to decode to identical stored values before writing this test.
# pydicom-data's X_UNCR is the uncompressed twin of X_J2KR (reversible), X_UNCI of X_J2KI
# (the lossy image, decompressed): X_UNCI vs X_J2KR is NOT equal.
LOSSLESS_PAIRS = [
    *[("MR_small.dcm", f"MR_small_{s}.dcm") for s in
      ("RLE", "jpeg_ls_lossless", "jp2klossless", "bigendian", "implicit", "expb")],
    *[("emri_small.dcm", f"emri_small_{s}.dcm") for s in
      ("RLE", "jpeg_ls_lossless", "jpeg_2k_lossless", "big_endian")],
    *[(f"{s}_UNCR.dcm", f"{s}_J2KR.dcm") for s in ("MR2", "RG1", "RG3", "US1", "693")],
    *[(f"{s}_UNCI.dcm", f"{s}_J2KI.dcm") for s in ("MR2", "RG3", "US1", "693")],
    ("US1_UNCR.dcm", "examples_jpeg2k.dcm"),
    ("JPEG2000_UNC.dcm", "JPEG2000.dcm"),
    *[("SC_rgb.dcm", f"SC_rgb_{s}.dcm") for s in
      ("rle", "expb", "jpeg_gdcm", "gdcm_KY", "gdcm2k_uncompressed")],
    ("SC_rgb_16bit.dcm", "SC_rgb_rle_16bit.dcm"),
    ("SC_rgb_16bit.dcm", "SC_rgb_expb_16bit.dcm"),
    ("SC_rgb_32bit.dcm", "SC_rgb_rle_32bit.dcm"),
    ("SC_rgb_2frame.dcm", "SC_rgb_rle_2frame.dcm"),
    ("SC_rgb_32bit_2frame.dcm", "SC_rgb_expb_32bit_2frame.dcm"),
    ("SC_rgb_small_odd.dcm", "SC_rgb_small_odd_big_endian.dcm"),
    ("SC_rgb_jpeg_dcmd.dcm", "SC_rgb_jpeg.dcm"),
    ("OBXXXX1A.dcm", "OBXXXX1A_rle.dcm"),
    ("OBXXXX1A.dcm", "OBXXXX1A_expb.dcm"),
    ("OBXXXX1A_2frame.dcm", "OBXXXX1A_rle_2frame.dcm"),
    ("OBXXXX1A_2frame.dcm", "OBXXXX1A_expb_2frame.dcm"),
    ("gdcm-US-ALOKA-16.dcm", "gdcm-US-ALOKA-16_big.dcm"),
    ("liver.dcm", "liver_expb.dcm"),
    ("liver_1frame.dcm", "liver_expb_1frame.dcm"),
    ("rtdose.dcm", "rtdose_rle.dcm"),
    ("rtdose.dcm", "rtdose_expb.dcm"),
    ("rtdose_1frame.dcm", "rtdose_rle_1frame.dcm"),
]


@pytest.mark.parametrize("reference,variant", LOSSLESS_PAIRS)
def test_lossless_variants_decode_identically(reference, variant):
  want, got = _image(reference), _image(variant)
  assert want.max() > want.min(), f"{reference} decodes to a constant image; pair proves nothing"
  np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("reference,variant,max_mean_abs_diff", [
    ("MR2_UNCR.dcm", "MR2_J2KI.dcm", 0.02),
    ("RG1_UNCR.dcm", "RG1_J2KI.dcm", 0.01),
    ("US1_UNCR.dcm", "US1_J2KI.dcm", 0.02),
    ("SC_rgb.dcm", "SC_rgb_jpeg_dcmtk.dcm", 0.005),
    ("SC_rgb.dcm", "SC_rgb_jpeg_lossy_gdcm.dcm", 0.005),
    ("SC_rgb.dcm", "SC_rgb_dcmtk_+eb+cy+np.dcm", 0.005),
    ("SC_rgb.dcm", "SC_rgb_dcmtk_+eb+cr.dcm", 0.005),
    ("SC_rgb.dcm", "SC_rgb_jls_lossy_line.dcm", 0.005),
    ("SC_rgb.dcm", "SC_ybr_full_uncompressed.dcm", 0.005),
    ("SC_rgb.dcm", "SC_ybr_full_422_uncompressed.dcm", 0.005),
])
def test_lossy_and_ybr_variants_decode_close(reference, variant, max_mean_abs_diff):
  want, got = _image(reference), _image(variant)
  assert got.shape == want.shape
  assert np.abs(got - want).mean() < max_mean_abs_diff


@pytest.mark.parametrize("name,shape", [
    ("JPGExtended.dcm", (1024, 256)),
    ("SC_rgb_jpeg.dcm", (256, 256)),
    ("SC_rgb_jpeg_dcmtk.dcm", (100, 100)),
    ("SC_rgb_dcmtk_+eb+cy+s4.dcm", (100, 100)),
    ("SC_rgb_small_odd_jpeg.dcm", (3, 3)),
    ("SC_jpeg_no_color_transform.dcm", (256, 256)),
    ("examples_ybr_color.dcm", (30, 240, 320)),
    ("color3d_jpeg_baseline.dcm", (120, 480, 640)),
    ("JPEGLSNearLossless_16.dcm", (50, 10)),
    ("image_dfl.dcm", (512, 512)),  # deflated
    ("emri_small.dcm", (10, 64, 64)),
    ("SC_rgb_2frame.dcm", (2, 100, 100)),
    ("OBXXXX1A_2frame.dcm", (2, 600, 800)),
    ("rtdose.dcm", (15, 10, 10)),
    ("liver.dcm", (3, 512, 512)),  # 1 bit allocated
    ("eCT_Supplemental.dcm", (2, 512, 512)),
])
def test_decodes_to_shape_in_unit_range(name, shape):
  out = _image(name)
  assert out.dtype == np.float32 and out.shape == shape
  assert out.min() >= 0.0 and out.max() <= 1.0 and out.max() > out.min()


def test_rgb_is_bt601_luminance_over_bit_depth():
  ds = pydicom.dcmread(testdata.dicom_test_file("SC_rgb.dcm"))
  rgb = ds.pixel_array.astype(np.float64)
  want = (0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]) / 255.0
  np.testing.assert_allclose(_image("SC_rgb.dcm"), want, atol=1e-6)


def test_palette_colour_goes_through_its_lut():
  ds = pydicom.dcmread(testdata.dicom_test_file("OBXXXX1A.dcm"))
  rgb = processing.apply_color_lut(ds.pixel_array, ds).astype(np.float64)
  want = (0.299 * rgb[..., 0] + 0.587 * rgb[..., 1] + 0.114 * rgb[..., 2]) / 65535.0
  np.testing.assert_allclose(_image("OBXXXX1A.dcm"), want, atol=1e-6)
  # Bare dataset (no preamble, no file meta) with an 8-bit palette.
  face = _image("OT-PAL-8-face.dcm")
  assert face.shape == (480, 640) and face.std() > 0.1


def test_voi_lut_sequence_is_applied_and_normalised_by_its_bit_depth():
  ds = pydicom.dcmread(testdata.dicom_test_file("vlut_04.dcm"))
  want = processing.apply_voi(ds.pixel_array, ds) / 65535.0
  np.testing.assert_allclose(_image("vlut_04.dcm"), want, atol=1e-6)


def test_modality_lut_sequence_is_applied_before_percentiles():
  ds = pydicom.dcmread(testdata.dicom_test_file("mlut_18.dcm"))
  values = processing.apply_modality_lut(ds.pixel_array, ds).astype(np.float64)
  low, high = np.percentile(values, [0.5, 99.5])
  np.testing.assert_allclose(_image("mlut_18.dcm"), np.clip((values - low) / (high - low), 0, 1),
                             atol=1e-6)


# --- Synthetic files: the windowing contract the cohort generator relies on. ---


def test_percentile_window_is_half_to_99_5th_percentile(tmp_path):
  stored = np.random.default_rng(0).permutation(1000).reshape(25, 40).astype(np.uint16)
  out = dicom.load_image(_write(tmp_path / "a.dcm", stored))
  # np.percentile(0..999, [0.5, 99.5]) with linear interpolation is [4.995, 994.005].
  np.testing.assert_allclose(out, np.clip((stored - 4.995) / 989.01, 0, 1), atol=1e-6)


def test_monochrome1_reflection_decodes_like_monochrome2(tmp_path):
  x = _ramp()
  x[:3] = 0  # padding
  mono2 = dicom.load_image(_write(tmp_path / "m2.dcm", x, PixelPaddingValue=0))
  mono1 = dicom.load_image(_write(tmp_path / "m1.dcm", 4095 - x, "MONOCHROME1",
                                  PixelPaddingValue=4095))
  np.testing.assert_allclose(mono1, mono2, atol=1e-6)
  assert np.all(mono1[:3] == 0.0) and np.all(mono2[:3] == 0.0)
  assert mono2[3:].min() < 0.01 and mono2[3:].max() > 0.99


def test_presentation_lut_inverse_inverts_once(tmp_path):
  x = _ramp()
  plain = dicom.load_image(_write(tmp_path / "p.dcm", x))
  inverse = dicom.load_image(_write(tmp_path / "i.dcm", x, PresentationLUTShape="INVERSE"))
  np.testing.assert_allclose(inverse, 1.0 - plain, atol=1e-6)
  mono1 = dicom.load_image(_write(tmp_path / "m1.dcm", x, "MONOCHROME1"))
  mono1_inverse = dicom.load_image(_write(tmp_path / "m1i.dcm", x, "MONOCHROME1",
                                          PresentationLUTShape="INVERSE"))
  np.testing.assert_allclose(mono1, 1.0 - plain, atol=1e-6)
  np.testing.assert_array_equal(mono1_inverse, mono1)


@pytest.mark.parametrize("function,center,width,stored,want", [
    # PS3.3 C.11.2.1.2.1 with c=100, w=101: 0 up to 49.5, 1 above 149.5, (x-99.5)/100+0.5 between.
    (None, [100, 9999], [101, 3], [0, 49, 50, 99, 100, 149, 150, 4000],
     [0, 0, 0.005, 0.495, 0.505, 0.995, 1, 1]),
    ("LINEAR", 100, 1, [0, 99, 100, 4000], [0, 0, 1, 1]),
    ("LINEAR_EXACT", 100, 100, [0, 50, 75, 100, 150, 151], [0, 0, 0.25, 0.5, 1, 1]),
    ("SIGMOID", 100, 100, [0, 100, 125, 4000],
     [1 / (1 + np.exp(4.0)), 0.5, 1 / (1 + np.exp(-1.0)), 1.0]),
])
def test_window_tags(tmp_path, function, center, width, stored, want):
  stored = np.array([stored], dtype=np.uint16)
  path = _write(tmp_path / "w.dcm", stored, WindowCenter=center, WindowWidth=width,
                **({"VOILUTFunction": function} if function else {}))
  np.testing.assert_allclose(dicom.load_image(path), [want], atol=1e-6)
  inverted = dicom.load_image(_write(tmp_path / "w1.dcm", stored, "MONOCHROME1",
                                     WindowCenter=center, WindowWidth=width,
                                     **({"VOILUTFunction": function} if function else {})))
  np.testing.assert_allclose(inverted, 1.0 - np.array([want]), atol=1e-6)


def test_unusable_window_falls_back_to_percentiles(tmp_path):
  x = _ramp()
  plain = dicom.load_image(_write(tmp_path / "p.dcm", x))
  zero_width = dicom.load_image(_write(tmp_path / "z.dcm", x, WindowCenter=100, WindowWidth=0))
  np.testing.assert_array_equal(zero_width, plain)


def test_rescale_is_applied_before_window_and_does_not_change_percentiles(tmp_path):
  stored = np.array([[450, 500, 550]], dtype=np.uint16)  # -100, 0, 100 after 2x - 1000
  path = _write(tmp_path / "w.dcm", stored, RescaleSlope=2, RescaleIntercept=-1000,
                WindowCenter=0, WindowWidth=200, VOILUTFunction="LINEAR_EXACT")
  np.testing.assert_allclose(dicom.load_image(path), [[0.0, 0.5, 1.0]], atol=1e-6)
  x = _ramp()
  plain = dicom.load_image(_write(tmp_path / "p.dcm", x))
  rescaled = dicom.load_image(_write(tmp_path / "r.dcm", x, RescaleSlope=2,
                                     RescaleIntercept=-1000))
  np.testing.assert_allclose(rescaled, plain, atol=1e-6)


@pytest.mark.parametrize("range_limit", [None, 10])
def test_padding_is_zero_and_excluded_from_percentiles(tmp_path, range_limit):
  rng = np.random.default_rng(1)
  values = 1000 + rng.permutation(1000)
  padding = rng.integers(0, 11 if range_limit else 1, size=250)
  stored = np.concatenate([values, padding]).reshape(50, 25).astype(np.uint16)
  elements = {"PixelPaddingValue": 0, "RescaleIntercept": -1024, "RescaleSlope": 1}
  if range_limit:
    elements["PixelPaddingRangeLimit"] = range_limit
  out = dicom.load_image(_write(tmp_path / "pad.dcm", stored, **elements)).reshape(-1)
  # Percentiles of 1000..1999 alone: 1004.995 and 1994.005 (the intercept cancels out).
  np.testing.assert_allclose(out[:1000], np.clip((values - 1004.995) / 989.01, 0, 1), atol=1e-6)
  assert np.all(out[1000:] == 0.0)


def test_signed_padding_is_compared_on_stored_values(tmp_path):
  x = _ramp().astype(np.int16) - 1024
  x[0] = -2000
  out = dicom.load_image(_write(tmp_path / "ct.dcm", x, bits_stored=16, PixelPaddingValue=-2000,
                                RescaleSlope=1, RescaleIntercept=-1024, Modality="CT"))
  assert np.all(out[0] == 0.0) and out[1:].max() == 1.0


def test_synthetic_voi_lut_and_constant_image(tmp_path):
  item = pydicom.Dataset()
  item.add_new(0x00283002, "US", [256, 100, 16])  # LUT Descriptor: 256 entries from value 100
  item.add_new(0x00283006, "US", [i * 257 for i in range(256)])  # LUT Data
  stored = np.array([[0, 100, 228, 355, 4000]], dtype=np.uint16)
  path = _write(tmp_path / "voi.dcm", stored, VOILUTSequence=pydicom.Sequence([item]),
                WindowCenter=0, WindowWidth=10)  # the LUT wins over the window
  np.testing.assert_allclose(dicom.load_image(path), [[0, 0, 128 / 255, 1, 1]], atol=1e-6)
  constant = dicom.load_image(_write(tmp_path / "c.dcm", np.full((4, 4), 7, np.uint16)))
  np.testing.assert_array_equal(constant, np.zeros((4, 4), np.float32))


def test_sparse_image_falls_back_to_min_max(tmp_path):
  stored = np.zeros((40, 50), np.uint16)
  stored[0, :3] = 1  # 0.15% of pixels: both percentiles are 0
  out = dicom.load_image(_write(tmp_path / "s.dcm", stored))
  np.testing.assert_array_equal(out, stored.astype(np.float32))


# --- Headers. ---


def test_header_fields():
  header = dicom.read_header(testdata.dicom_test_file("CT_small.dcm"))
  assert header == dicom.Header(
      patient_id="1CT1", modality="CT", sop_class="CT Image Storage", rows=128, columns=128,
      frames=1, samples_per_pixel=1, transfer_syntax="Explicit VR Little Endian",
      photometric="MONOCHROME2", pixel_bytes=128 * 128 * 2, bits_allocated=16,
      instance=hashlib.blake2b(b"1.3.6.1.4.1.5962.1.1.1.1.1.20040119072730.12322",
                               digest_size=16).hexdigest())
  assert [f.name for f in dataclasses.fields(dicom.Header)] == [
      "patient_id", "modality", "sop_class", "rows", "columns", "frames", "samples_per_pixel",
      "transfer_syntax", "photometric", "pixel_bytes", "bits_allocated", "instance"]
  # No identifier (nor the instance hash) in logs.
  assert "1CT1" not in repr(header) and header.instance not in repr(header)


def test_header_of_encapsulated_multiframe_colour():
  path = testdata.dicom_test_file("color3d_jpeg_baseline.dcm")
  header = dicom.read_header(path)
  assert (header.frames, header.rows, header.columns, header.samples_per_pixel) == (120, 480, 640,
                                                                                  3)
  assert header.transfer_syntax == "JPEG Baseline (Process 1)"
  assert header.photometric == "YBR_FULL_422"
  assert 0.9 * os.path.getsize(path) < header.pixel_bytes < os.path.getsize(path)


def test_read_header_never_reads_pixel_data(monkeypatch):
  def fail(*args, **kwargs):
    raise AssertionError("read_header loaded deferred pixel data")
  monkeypatch.setattr(pydicom.filereader, "read_deferred_data_element", fail)
  # JPEG-lossy.dcm's pixel data can't be decoded; its header is fine.
  header = dicom.read_header(testdata.dicom_test_file("JPEG-lossy.dcm"))
  assert header.rows == 1024 and header.pixel_bytes > 0
  assert dicom.read_header(testdata.dicom_test_file("RG1_UNCR.dcm")).pixel_bytes == 1955 * 1841 * 2


def test_bare_dataset_without_file_meta_is_read(tmp_path):
  x = _ramp()
  with_meta = _write(tmp_path / "meta.dcm", x)
  ds = pydicom.dcmread(with_meta)
  ds.file_meta, ds.preamble = pydicom.dataset.FileMetaDataset(), None
  bare = os.fspath(tmp_path / "bare.dcm")
  pydicom.dcmwrite(bare, ds, implicit_vr=True, little_endian=True)  # no preamble, no meta
  with pytest.raises(pydicom.errors.InvalidDicomError):
    pydicom.dcmread(bare)
  assert dicom.read_header(bare).transfer_syntax == "Implicit VR Little Endian"
  np.testing.assert_array_equal(dicom.load_image(bare), dicom.load_image(with_meta))


def test_missing_patient_id_rejects_header_only(tmp_path):
  for value in (None, ""):
    path = _write(tmp_path / "nopid.dcm", _ramp(), PatientID=value)
    with pytest.raises(dicom.RejectedFile) as e:
      dicom.read_header(path)
    assert e.value.reason == "missing PatientID"
    assert dicom.load_image(path).shape == (24, 32)  # pixels don't need an identity


# --- Rejections. ---


@pytest.mark.parametrize("name,reason", [
    ("rtplan.dcm", "no pixel data (SOP class RT Plan Storage)"),
    ("rtstruct.dcm", "no pixel data (SOP class RT Structure Set Storage)"),
    ("test-SR.dcm", "no pixel data (SOP class Comprehensive SR Storage)"),
    ("reportsi.dcm", "no pixel data (SOP class Basic Text SR Storage)"),
    ("waveform_ecg.dcm", "no pixel data (SOP class 12-lead ECG Waveform Storage)"),
    ("MR_truncated.dcm", "truncated pixel data: 8130 of 8192 bytes"),
    # MR_small with 128 bytes after its pixels. PS3.5 8.1.1 pads only up to an even length (its
    # Note asks readers to tolerate older writers' excess padding); surplus bytes are also what
    # a header short of a frame, a row or BitsAllocated leaves, so no surplus is accepted.
    ("MR_small_padded.dcm", ("native pixel data is 8320 bytes but Rows x Columns x "
                             "NumberOfFrames x SamplesPerPixel x BitsAllocated/8 = 64 x 64 x 1 "
                             "x 1 x 16/8 = 8192 (inconsistent header)")),
    ("rtplan_truncated.dcm", "truncated element (300A,00B0): 711 of 976 bytes"),
    ("emri_small_jpeg_2k_lossless_too_short.dcm",
     "truncated: file ends inside an undefined-length element"),
    ("badVR.dcm", "invalid NumberOfFrames '1A'"),
    ("no_meta.dcm", "not a DICOM file"),
    ("meta_missing_tsyntax.dcm", "missing PhotometricInterpretation"),
])
def test_rejected_by_header_and_loader(name, reason):
  path = testdata.dicom_test_file(name)
  for fn in (dicom.read_header, dicom.load_image):
    with pytest.raises(dicom.RejectedFile) as e:
      fn(path)
    assert e.value.reason.startswith(reason), (fn.__name__, e.value.reason)
    assert e.value.path == path and str(e.value) == f"{path}: {e.value.reason}"


@pytest.mark.parametrize("name,reason", [
    # NEMA's NM1_JPLY with a bad SOS segment; JPGExtended.dcm is its fixed copy.
    ("JPEG-lossy.dcm", "undecodable JPEG Extended (Process 2 and 4) pixel data: RuntimeError"),
    # Its first fragment's SIZ marker is garbage; caught before any decoder runs.
    ("JPEG2000-embedded-sequence-delimiter.dcm",
     "JPEG 2000 Image Compression codestream is 1024 x 3722445056 but Rows x Columns is "
     "1024 x 256 (inconsistent header); not decoded"),
])
def test_undecodable_pixels_rejected_by_loader(name, reason):
  with pytest.raises(dicom.RejectedFile) as e:
    dicom.load_image(testdata.dicom_test_file(name))
  assert e.value.reason.startswith(reason)
  assert "\n" not in e.value.reason


@pytest.mark.parametrize("content", [b"", b"hello, this is not DICOM\n" * 40,
                                     np.random.default_rng(0).bytes(5000)],
                         ids=["empty", "text", "random"])
def test_non_dicom_files_rejected(tmp_path, content):
  path = tmp_path / "x.dcm"
  path.write_bytes(content)
  for fn in (dicom.read_header, dicom.load_image):
    with pytest.raises(dicom.RejectedFile) as e:
      fn(path)
    assert e.value.reason == "not a DICOM file"


def test_an_archive_among_the_images_is_named_with_what_to_do(tmp_path):
  """A ZIP or tar.gz of a study, as exports leave them, was 'not a DICOM file' alone: its
  patient's images were lost with no word of where they were."""
  image = testdata.dicom_test_file("CT_small.dcm")
  with zipfile.ZipFile(tmp_path / "study.zip", "w") as z:
    z.write(image, "IMG0001")
  with tarfile.open(tmp_path / "study.tar", "w") as t:
    t.add(image, "IMG0001")
  with tarfile.open(tmp_path / "study.tgz", "w:gz") as t:
    t.add(image, "IMG0001")
  for name, kind in (("study.zip", "a ZIP archive"), ("study.tar", "a tar archive"),
                     ("study.tgz", "a gzip file")):
    for fn in (dicom.read_header, dicom.load_image):
      with pytest.raises(dicom.RejectedFile) as e:
        fn(tmp_path / name)
      assert e.value.reason == (f"not a DICOM file: {kind}; unpack it under dicom/ for its files "
                                "to be read"), name


def test_truncated_copies_rejected(tmp_path):
  data = open(testdata.dicom_test_file("CT_small.dcm"), "rb").read()
  path = tmp_path / "cut.dcm"
  path.write_bytes(data[:len(data) // 2])
  for fn in (dicom.read_header, dicom.load_image):
    with pytest.raises(dicom.RejectedFile) as e:
      fn(path)
    # CT_small's pixel data starts 6300 bytes into the file.
    assert e.value.reason == f"truncated pixel data: {len(data) // 2 - 6300} of 32768 bytes"
  # Wherever the cut falls, the result is a RejectedFile (the reason depends on the cut: a cut
  # between two header elements reads as a complete header without pixel data).
  for cut in range(0, len(data), 997):
    path.write_bytes(data[:cut])
    for fn in (dicom.read_header, dicom.load_image):
      with pytest.raises(dicom.RejectedFile):
        fn(path)


def test_missing_path_and_directory_rejected(tmp_path):
  for path, reason in ((tmp_path / "absent.dcm", "unreadable: FileNotFoundError"),
                       (tmp_path, "a directory, not a regular file; not read")):
    for fn in (dicom.read_header, dicom.load_image):
      with pytest.raises(dicom.RejectedFile) as e:
        fn(path)
      assert e.value.reason.startswith(reason)


def test_a_dicomdir_is_named_as_the_media_s_index():
  """A CD export's DICOMDIR was 'no pixel data (SOP class unknown)': its class is in the file
  meta only. It is named for what it is; the files it lists are scanned where they lie."""
  import pydicom.data
  path = os.path.join(os.path.dirname(pydicom.data.__file__), "test_files", "dicomdirtests",
                      "DICOMDIR")
  with pytest.raises(dicom.RejectedFile) as e:
    dicom.read_header(path)
  assert e.value.reason.startswith("a DICOMDIR, the media's index of its files, not an image")


def test_rejected_file_pickles():
  e = pickle.loads(pickle.dumps(dicom.RejectedFile("/a/b.dcm", "not a DICOM file")))
  assert (e.path, e.reason, str(e)) == ("/a/b.dcm", "not a DICOM file", "/a/b.dcm: not a DICOM file")


# --- Every real test file: an image in [0, 1] or a RejectedFile, nothing else. ---

# Non-images, truncated files and broken encodings among pydicom's and pydicom-data's files.
EXPECTED_REJECTS = {
    "ExplVR_BigEndNoMeta.dcm", "ExplVR_LitEndNoMeta.dcm", "JPEG-lossy.dcm",
    "JPEG2000-embedded-sequence-delimiter.dcm", "MR_small_padded.dcm", "MR_truncated.dcm",
    "UN_sequence.dcm",
    "badVR.dcm", "empty_charset_LEI.dcm", "meta_missing_tsyntax.dcm", "nested_priv_SQ.dcm",
    "no_meta.dcm", "no_meta_group_length.dcm", "priv_SQ.dcm", "reportsi.dcm",
    "reportsi_with_empty_number_tags.dcm", "rtplan.dcm", "rtplan_truncated.dcm", "rtstruct.dcm",
    "test-SR.dcm", "waveform_ecg.dcm", "emri_small_jpeg_2k_lossless_too_short.dcm",
}


@pytest.mark.parametrize("path", [p for p in testdata.all_dicom_test_files()
                                  if os.path.getsize(p) <= _MAX_SWEEP_BYTES],
                         ids=os.path.basename)
def test_every_test_file_decodes_or_is_rejected(path):
  name = os.path.basename(path)
  out = _load(name)
  try:
    header = dicom.read_header(path)
  except dicom.RejectedFile as e:
    header = e
  if isinstance(out, dicom.RejectedFile):
    assert name in EXPECTED_REJECTS, f"unexpected rejection: {out}"
    assert out.reason and out.path == path
    return
  assert name not in EXPECTED_REJECTS, f"{name} should have been rejected"
  assert out.dtype == np.float32 and out.ndim in (2, 3)
  assert np.all(np.isfinite(out)) and out.min() >= 0.0 and out.max() <= 1.0
  if isinstance(header, dicom.RejectedFile):
    # The loader rejects everything the header rejects, except for a missing PatientID.
    assert header.reason == "missing PatientID", header.reason
  else:
    frames = (header.frames,) if header.frames > 1 else ()
    assert out.shape == (*frames, header.rows, header.columns)
