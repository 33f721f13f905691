"""Hostile DICOM inputs cost one file each, never the process: budgets, paths, isolated decoders.

The files are real (tests/hostile.py builds them with pydicom, pyjpegls and openjpeg); the
JPEG-LS one really aborts the process when decoded in it (checked below in a subprocess).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pydicom
import pytest

from configs import default as default_config
from medjax.data import cache as cache_lib
from medjax.data import dicom
from medjax.data import ingest
from medjax.data import pools
from medjax.data import records
from medjax.data import synthetic
from medjax.data.cache import fill
from medjax.data.dicom import decoder
from medjax.data.dicom import limits as dicom_limits
from medjax.data.dicom import scan as dicom_scan
from tests import cohorts
from tests import hostile
from tests import testdata

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# One file per transfer syntax family: native, big endian, deflated, RLE, JPEG baseline and
# extended, JPEG-LS, JPEG 2000, multi-frame RLE, colour JPEG.
SAMPLES = ["CT_small.dcm", "MR_small_bigendian.dcm", "image_dfl.dcm", "MR_small_RLE.dcm",
           "SC_rgb_jpeg_dcmtk.dcm", "JPGExtended.dcm", "MR_small_jpeg_ls_lossless.dcm",
           "MR_small_jp2klossless.dcm", "emri_small_RLE.dcm", "SC_rgb_rle_2frame.dcm"]


@pytest.fixture(autouse=True)
def fresh_children():
  """Every test starts and ends without decoder children (and with no fault hook set)."""
  decoder.shutdown()
  yield
  decoder.shutdown()


@pytest.fixture(scope="module")
def hostile_cohort(tmp_path_factory):
  root = str(tmp_path_factory.mktemp("hostile") / "cohort")
  expected = hostile.add_to_cohort(root, os.path.join(os.path.dirname(root), "outside"),
                                   "MRN001", memory_bomb_side=4096)
  return root, expected


def _rejected(fn, *args, **kwargs) -> dicom.RejectedFile:
  with pytest.raises(dicom.RejectedFile) as e:
    fn(*args, **kwargs)
  return e.value


def _gone(pid: int) -> bool:
  try:
    return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
  except psutil.NoSuchProcess:
    return True


# --- The scan: every hostile input quarantined with its exact reason, the rest accepted. ---


def test_scan_quarantines_each_hostile_input_with_its_reason(hostile_cohort):
  root, expected = hostile_cohort
  accepted, rejected = dicom_scan.scan_dicom(os.path.join(root, "dicom"))
  want = {path: reason for path, (stage, reason) in expected.items() if stage == "scan"}
  assert {q["path"]: q["reason"] for q in rejected} == want
  assert all(q["stage"] == "scan" for q in rejected)
  assert [q["path"] for q in rejected] == sorted(want)
  # Accepted: the first copy of the duplicated instance, the link inside the cohort, and the two
  # files whose trouble only a decoder can find.
  assert [rel for rel, _ in accepted] == ["hostile/dup_a.dcm", "hostile/inside_link.dcm",
                                          "hostile/jpegls_late_sof.dcm",
                                          "hostile/rle_memory_bomb.dcm"]
  assert {h.patient_id for _, h in accepted} == {"MRN001"}


def test_special_files_are_refused_without_being_opened(hostile_cohort, monkeypatch):
  root, _ = hostile_cohort
  opened = []
  real_open = os.open
  monkeypatch.setattr(os, "open", lambda path, *a, **k: opened.append(path) or real_open(
      path, *a, **k))
  d = os.path.join(root, "dicom", "hostile")
  reasons = {}
  for name in ("fifo.dcm", "socket.dcm", "zero.dcm", "escape.dcm", "huge.dcm", "self.dcm"):
    path = os.path.join(d, name)
    # load_image_if with `here` saying no: the read that only finds where to decode.
    elsewhere = lambda p, roots: dicom.load_image_if(p, lambda ts: False, roots=roots)
    for fn in (dicom.read_header, dicom.load_image, elsewhere, decoder.Decoder().load_image):
      reasons.setdefault(name, set()).add(_rejected(fn, path, roots=(root,)).reason)
  assert opened == []
  assert reasons == {
      "fifo.dcm": {"a FIFO, not a regular file; not read"},
      "socket.dcm": {"a socket, not a regular file; not read"},
      "zero.dcm": {"symlink to a character device, not a regular file; not read"},
      "escape.dcm": {"symlink to a file outside the cohort root; not followed"},
      "huge.dcm": {"file is 2049 MB, over config.data.max_file_mb=2048; raise it if the file "
                   "is genuine"},
      "self.dcm": {"broken symlink (Too many levels of symbolic links)"}}
  # Without roots a symlink to a regular file is followed wherever it points.
  assert dicom.read_header(os.path.join(d, "escape.dcm")).rows == 16


def test_directory_symlink_loop_does_not_hang_the_walk(tmp_path):
  d = tmp_path / "cohort" / "dicom" / "a" / "b"
  d.mkdir(parents=True)
  hostile.save(hostile.image_dataset(hostile.ramp(16), "P1"), str(d / "x.dcm"))
  os.symlink("../..", d / "up")            # dicom/a/b/up -> dicom/
  os.symlink(str(tmp_path), d / "tmp")   # far outside the cohort
  accepted, rejected = dicom_scan.scan_dicom(str(tmp_path / "cohort" / "dicom"))
  assert [rel for rel, _ in accepted] == ["a/b/x.dcm"]
  reason = "symlink to a directory; not followed (put the files, or links to them, under dicom/)"
  assert rejected == [{"path": "dicom/a/b/tmp", "stage": "scan", "reason": reason},
                      {"path": "dicom/a/b/up", "stage": "scan", "reason": reason}]


def test_duplicate_instances_keep_the_first_by_path(tmp_path):
  d = tmp_path / "dicom"
  ds = hostile.image_dataset(hostile.ramp(16), "P1", sop_uid="1.2.3.4.5.6")
  for name in ("b/second.dcm", "a/first.dcm", "c/third.dcm"):
    hostile.save(ds, str(d / name))
  hostile.save(hostile.image_dataset(hostile.ramp(16), "P1", sop_uid="1.2.3.4.5.7"),
               str(d / "z.dcm"))
  # The same UID under another PatientID belongs to that patient (linking is by PatientID).
  hostile.save(hostile.image_dataset(hostile.ramp(16), "P2", sop_uid="1.2.3.4.5.6"),
               str(d / "other_patient.dcm"))
  accepted, rejected = dicom_scan.scan_dicom(str(d))
  assert [rel for rel, _ in accepted] == ["a/first.dcm", "other_patient.dcm", "z.dcm"]
  reason = "duplicate SOPInstanceUID (same instance as dicom/a/first.dcm)"
  assert rejected == [{"path": "dicom/b/second.dcm", "stage": "scan", "reason": reason},
                      {"path": "dicom/c/third.dcm", "stage": "scan", "reason": reason}]
  # The header keeps a hash of the UID, never the UID itself.
  header = accepted[0][1]
  assert "1.2.3.4.5.6" not in repr(header) and "1.2.3.4.5.6" not in header.instance
  assert header.instance == dicom.read_header(str(d / "b/second.dcm")).instance


# --- Budgets, in read_header and again in load_image. ---


def test_budgets_name_the_numbers_and_the_field_to_raise(tmp_path):
  path = hostile.save(hostile.image_dataset(np.zeros((3, 100, 200), np.uint16), "P1"),
                      str(tmp_path / "ct.dcm"))
  cases = [
      (dicom.Budgets(max_pixels=59_999), "image is 100 x 200 x 3 frames x 1 sample = 60000 "
       "pixels, over config.data.max_pixels=59999; raise it if the file is genuine"),
      (dicom.Budgets(max_decoded_mb=0), "image is 100 x 200 x 3 frames x 1 sample at 16 bits "
       "= 0.1 MB decoded, over config.data.max_decoded_mb=0; raise it if the file is genuine"),
      (dicom.Budgets(max_file_mb=0), "file is 0.1 MB, over config.data.max_file_mb=0; raise it "
       "if the file is genuine"),
  ]
  for budgets, reason in cases:
    for fn in (lambda p, b=budgets: dicom.read_header(p, b),
               lambda p, b=budgets: dicom.load_image(p, b),
               decoder.Decoder(budgets).load_image,
               decoder.Decoder(budgets, isolate="all").load_image):
      assert _rejected(fn, path).reason == reason
  assert dicom.read_header(path, dicom.Budgets(max_pixels=60_000)).frames == 3


def test_default_budgets_are_the_config_defaults():
  from configs import default  # pylint: disable=import-outside-toplevel
  data = default.get_config().data
  assert dicom.Budgets.from_config(data) == dicom.Budgets()
  made = decoder.Decoder.from_config(data)
  assert (made.isolate, made.memory_mb, made.timeout_s, made.workers) == (
      "compressed", 2048, 120.0, 2)


def test_deflate_bomb_is_refused_with_bounded_memory(tmp_path):
  path = str(tmp_path / "bomb.dcm")
  hostile.deflate_bomb(path, inflated_mb=200)
  assert os.path.getsize(path) < 300_000
  budgets = dicom.Budgets(max_decoded_mb=16)
  for fn in (lambda p: dicom.read_header(p, budgets), decoder.Decoder(budgets).load_image):
    assert _rejected(fn, path).reason == (
        "deflated dataset inflates to over 80 MB, more than config.data.max_decoded_mb=16 "
        "(+64 MB for other elements) allows")
  # Within the budget it is a header with far too much native pixel data.
  assert _rejected(dicom.read_header, path).reason == (
      "native pixel data is 209715200 bytes but Rows x Columns x NumberOfFrames x "
      "SamplesPerPixel x BitsAllocated/8 = 64 x 64 x 1 x 1 x 16/8 = 8192 (inconsistent header)")


# --- Headers that disagree with their pixel data: exact lengths and frame counts. ---


@pytest.fixture(scope="module")
def header_cases(tmp_path_factory):
  """(directory, {name: reason} of inconsistent files, {name: shape} of valid edge cases)."""
  d = str(tmp_path_factory.mktemp("headers"))
  return d, hostile.inconsistent_headers(d), hostile.consistent_edges(d)


def test_a_header_that_disagrees_with_its_pixel_data_is_rejected(header_cases):
  d, bad, _ = header_cases
  # Every way: the header scan, the in-process loader, and the decoder ingest's cache uses.
  got = {name: {_rejected(fn, os.path.join(d, name)).reason
                for fn in (dicom.read_header, dicom.load_image, decoder.Decoder().load_image)}
         for name in bad}
  assert got == {name: {reason} for name, reason in bad.items()}
  assert len(bad) == 16


def test_valid_edge_cases_decode_to_their_header_shape(header_cases):
  d, _, good = header_cases
  out = {}
  for name, shape in good.items():
    path = os.path.join(d, name)
    header = dicom.read_header(path)
    out[name] = dicom.load_image(path)
    assert out[name].shape == shape, name
    assert header.frames == (shape[0] if len(shape) == 3 else 1), name
  # The odd lengths carry their pad byte: 25 bytes of 8-bit data, 100 bits of 1-bit data.
  assert dicom.read_header(os.path.join(d, "odd_padded.dcm")).pixel_bytes == 26
  assert dicom.read_header(os.path.join(d, "bits_1_odd.dcm")).pixel_bytes == 14
  # 1-bit frames are packed end to end (300 bits in 38 bytes), not padded one by one.
  assert dicom.read_header(os.path.join(d, "bits_1_frames_3.dcm")).pixel_bytes == 38
  bits_HxW = (np.add.outer(np.arange(10), np.arange(10)) % 3 == 0).astype(np.float32)
  np.testing.assert_array_equal(out["bits_1_odd.dcm"], bits_HxW)
  np.testing.assert_array_equal(out["bits_1_frames_3.dcm"], np.stack([bits_HxW] * 3))
  # Each encoding of the same frames decodes to the same array (every frame of hostile.frames
  # holds the same values, so the percentile window is the same whatever the frame count).
  native = out["multiframe.dcm"]
  np.testing.assert_array_equal(out["rle_frames_3.dcm"], native)
  np.testing.assert_array_equal(out["rle_frames_3_no_bot.dcm"], native)
  np.testing.assert_array_equal(out["jpegls_frames_2_eot.dcm"], native[:2])
  np.testing.assert_array_equal(out["jpegls_3_fragments_1_frame.dcm"], native[0])


def _never_read(*args, **kwargs):
  raise AssertionError("read_header loaded deferred pixel data")


def test_frame_check_reads_item_headers_only(tmp_path, monkeypatch):
  """The fragments are counted from their 8-byte headers, seeking over the values, and no
  further than decides the case, however many items the file holds."""
  read = []
  check = dicom_limits.check_frames

  class Counted:
    def __init__(self, f):
      self.f, self.seek, self.tell = f, f.seek, f.tell

    def read(self, n=-1):
      data = self.f.read(n)
      read.append(len(data))
      return data
  monkeypatch.setattr(dicom_limits, "check_frames",
                      lambda path, f, *args: check(path, Counted(f), *args))
  monkeypatch.setattr(pydicom.filereader, "read_deferred_data_element", _never_read)
  rng = np.random.default_rng(0)
  big = hostile.compressed(rng.integers(0, 4096, (3, 256, 256), dtype=np.uint16),
                           pydicom.uid.RLELossless)
  path = hostile.save(big, str(tmp_path / "big.dcm"))
  assert os.path.getsize(path) > 3 * 256 * 256 * 2  # noise: RLE does not shrink it
  assert dicom.read_header(path).frames == 3
  assert read == [8] * 5  # the offset table, three fragments, the sequence delimiter
  # One RLE frame followed by 100,000 empty items: decided on the second fragment.
  many = hostile.compressed(hostile.ramp(16), pydicom.uid.RLELossless, table="none")
  many.PixelData += b"\xfe\xff\x00\xe0\x00\x00\x00\x00" * 100_000
  path = hostile.save(many, str(tmp_path / "many.dcm"))
  read.clear()
  assert _rejected(dicom.read_header, path).reason.startswith(
      "RLE Lossless pixel data has more than 1 fragment but NumberOfFrames is 1")
  assert read == [8] * 3


def test_ingest_quarantines_inconsistent_headers_beside_the_valid_files(tmp_path):
  from configs import default  # pylint: disable=import-outside-toplevel
  root = cohorts.tiny_cohort(str(tmp_path / "cohort"))
  d = os.path.join(root, "dicom", "headers")
  bad = hostile.inconsistent_headers(d, "MRN001")
  good = hostile.consistent_edges(d, "MRN001")
  config = default.get_config()
  config.data.update(vitals_steps=6, image_size=16, split=(0.5, 0.0, 0.5))
  workdir = str(tmp_path / "work")
  result = ingest.run(config, workdir, root)
  with open(os.path.join(workdir, "ingest", "quarantine.jsonl")) as f:
    report = [json.loads(line) for line in f]
  assert report == result.quarantine
  assert {q["path"]: (q["stage"], q["reason"]) for q in report
          if q["path"].startswith("dicom/headers/")} == {
              f"dicom/headers/{name}": ("scan", reason) for name, reason in bad.items()}
  # MRN001's record holds every valid file beside them, counted by its frames.
  m = result.manifest
  row = next(i for i, files in enumerate(m.image_files) if "dicom/s1/a.dcm" in files)
  assert sorted(m.image_files[row]) == sorted(
      ["dicom/s1/a.dcm", "dicom/s1/b.dcm", *(f"dicom/headers/{name}" for name in good)])
  assert m.num_images[row] == 2 + sum(shape[0] if len(shape) == 3 else 1
                                      for shape in good.values())


# --- Decoders in child processes. ---


def test_jpegls_geometry_mismatch_aborts_in_process_but_costs_one_file_isolated(tmp_path):
  path = str(tmp_path / "late_sof.dcm")
  reason = hostile.jpegls_geometry_mismatch(path, late_sof=True)
  # The hazard is real: decoded in the process, gdcm takes the whole process down.
  run = subprocess.run([sys.executable, "-c", "import sys; from medjax.data import dicom; "
                        "dicom.load_image(sys.argv[1])", path], cwd=REPO, capture_output=True,
                       timeout=120, check=False)
  assert run.returncode == -signal.SIGABRT, run.stderr[-500:]
  assert b"gdcm" in run.stderr
  # Isolated, it is one rejected file, and the next compressed file decodes.
  d = decoder.Decoder()
  assert _rejected(d.load_image, path).reason == reason == (
      "decoder crashed (SIGABRT) on JPEG-LS Lossless Image Compression")
  good = testdata.dicom_test_file("MR_small_jpeg_ls_lossless.dcm")
  np.testing.assert_array_equal(d.load_image(good), dicom.load_image(good))
  # The same file without the padding is refused from its header, before any decoder.
  plain = str(tmp_path / "plain.dcm")
  want = hostile.jpegls_geometry_mismatch(plain)
  for fn in (dicom.read_header, dicom.load_image, d.load_image):
    assert _rejected(fn, plain).reason == want


def test_j2k_size_bomb_is_refused_from_its_codestream_header(tmp_path):
  path = str(tmp_path / "j2k.dcm")
  reason = hostile.j2k_size_bomb(path)
  for fn in (dicom.read_header, dicom.load_image, decoder.Decoder().load_image):
    assert _rejected(fn, path).reason == reason


@pytest.mark.parametrize("action,reason", [
    ("segv", "decoder crashed (SIGSEGV) on RLE Lossless"),
    ("abort", "decoder crashed (SIGABRT) on RLE Lossless"),
    # Killed from outside: tried once more in a new child, then given up.
    ("kill", "decoder crashed (SIGKILL) on RLE Lossless"),
    ("hang", "decoder timed out after 2 s on RLE Lossless (config.data.decode_timeout_s)"),
    ("oom", "out of memory while decoding (decoder limit config.data.decode_memory_mb=2048; "
     "raise it if the file is genuine)"),
    # A reply claiming a 16 GiB array is refused before anything is allocated for it.
    ("lie", "decoder sent an invalid reply on RLE Lossless (a float32 array of shape "
     "(65536, 65536))"),
])
def test_a_failing_child_costs_one_file_and_is_replaced(tmp_path, monkeypatch, action, reason):
  good = testdata.dicom_test_file("MR_small_RLE.dcm")
  bad = str(tmp_path / "bad.dcm")
  with open(good, "rb") as src, open(bad, "wb") as dst:
    dst.write(src.read())
  monkeypatch.setenv(decoder.FAULT_ENV, f"{action}=bad.dcm")
  d = decoder.Decoder(timeout_s=2.0, workers=1)
  want = dicom.load_image(good)
  np.testing.assert_array_equal(d.load_image(good), want)
  first = decoder.children()
  t0 = time.monotonic()
  assert _rejected(d.load_image, bad).reason == reason
  assert time.monotonic() - t0 < 30
  assert decoder.children() == [] and all(_gone(p) for p in first)  # replaced on next use
  np.testing.assert_array_equal(d.load_image(good), want)
  assert len(decoder.children()) == 1 and decoder.children() != first


def test_memory_bomb_is_contained_by_decode_memory_mb(tmp_path):
  path = str(tmp_path / "bomb.dcm")
  hostile.rle_memory_bomb(path, side=4096)
  assert os.path.getsize(path) < 1_100_000   # 1 MB on disk, 2 GB to decode and window
  assert dicom.read_header(path).rows == 4096  # within every header budget
  assert _rejected(decoder.Decoder(memory_mb=512).load_image, path).reason == (
      "out of memory while decoding (decoder limit config.data.decode_memory_mb=512; raise it "
      "if the file is genuine)")
  small = str(tmp_path / "small.dcm")
  hostile.rle_memory_bomb(small, side=1024)
  np.testing.assert_array_equal(decoder.Decoder(memory_mb=512).load_image(small),
                                np.zeros((1024, 1024), np.float32))


@pytest.mark.parametrize("isolate", ["compressed", "all"])
def test_isolated_decoding_is_bitwise_identical(isolate):
  d = decoder.Decoder(isolate=isolate)
  for name in SAMPLES:
    path = testdata.dicom_test_file(name)
    want, got = dicom.load_image(path), d.load_image(path)
    assert got.dtype == want.dtype and got.shape == want.shape, name
    assert got.tobytes() == want.tobytes(), name
  # Rejections come back with the same reason as in-process.
  for name in ("JPEG-lossy.dcm", "rtplan.dcm", "MR_truncated.dcm"):
    path = testdata.dicom_test_file(name)
    assert _rejected(d.load_image, path).reason == _rejected(dicom.load_image, path).reason


def test_pool_is_lazy_shared_by_threads_and_shut_down():
  d = decoder.Decoder(workers=2)
  native = testdata.dicom_test_file("CT_small.dcm")
  d.load_image(native)
  assert decoder.children() == []  # no compressed file, no child
  paths = [testdata.dicom_test_file(n) for n in SAMPLES] * 3
  want = {p: dicom.load_image(p).tobytes() for p in set(paths)}
  results, errors = {}, []

  def work(chunk):
    try:
      for p in chunk:
        results.setdefault(p, set()).add(d.load_image(p).tobytes())
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)
  threads = [threading.Thread(target=work, args=(paths[i::4],)) for i in range(4)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors
  assert results == {p: {want[p]} for p in want}
  pids = decoder.children()
  assert 1 <= len(pids) <= 2
  # The threads that started the children have ended; the children live on (their parent-death
  # signal is tied to the pool's own spawner thread).
  d.load_image(testdata.dicom_test_file("MR_small_RLE.dcm"))
  assert set(decoder.children()) <= set(pids)
  decoder.shutdown()
  assert decoder.children() == [] and all(_gone(p) for p in pids)


@pytest.mark.slow
def test_children_die_with_their_parent():
  script = ("import sys, time\nfrom medjax.data.dicom import decoder\n"
            "decoder.Decoder().load_image(sys.argv[1])\n"
            "print(*decoder.children(), flush=True)\ntime.sleep(600)\n")
  parent = subprocess.Popen([sys.executable, "-c", script,
                             testdata.dicom_test_file("MR_small_RLE.dcm")],
                            cwd=REPO, stdout=subprocess.PIPE, text=True)
  try:
    pids = [int(p) for p in parent.stdout.readline().split()]
    assert len(pids) == 1 and not _gone(pids[0])
  finally:
    parent.kill()
    parent.wait()
  deadline = time.monotonic() + 10
  while not all(_gone(p) for p in pids) and time.monotonic() < deadline:
    time.sleep(0.05)
  assert all(_gone(p) for p in pids)


# --- A whole ingest over a cohort holding every hostile input. ---


@pytest.mark.slow
def test_ingest_of_a_hostile_cohort_exits_0_and_accounts_for_every_file(tmp_path):
  root = cohorts.tiny_cohort(str(tmp_path / "cohort"))
  expected = hostile.add_to_cohort(root, str(tmp_path / "outside"), "MRN001",
                                   memory_bomb_side=4096)
  workdir = str(tmp_path / "work")
  launched = subprocess.Popen(
      [sys.executable, "launch.py", "--config", "configs/quickstart.py",
       "--config.mode=ingest", f"--config.data.root={root}", f"--workdir={workdir}",
       "--config.data.decode_memory_mb=512"],
      cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  stdout, stderr = launched.communicate(timeout=600)
  assert launched.returncode == 0, stderr[-3000:]
  # No decoder child outlived the ingest (their argv names their parent's pid).
  time.sleep(0.5)
  leftover = [p.pid for p in psutil.process_iter(["cmdline"])
              if (p.info["cmdline"] or [])[-3:-1] == ["medjax.data.dicom.decoder_child",
                                                       str(launched.pid)]]
  assert leftover == []
  with open(os.path.join(workdir, "ingest", "quarantine.jsonl")) as f:
    quarantine = [json.loads(line) for line in f]
  scan = {q["path"]: q["reason"] for q in quarantine if q["path"].startswith("dicom/hostile/")}
  assert scan == {p: r for p, (stage, r) in expected.items() if stage == "scan"}
  with open(os.path.join(workdir, "cache", "host-0", "decode_quarantine.jsonl")) as f:
    decoded = {q["path"]: q for q in map(json.loads, f)}
  assert set(decoded) == {"dicom/hostile/jpegls_late_sof.dcm", "dicom/hostile/rle_memory_bomb.dcm"}
  assert decoded["dicom/hostile/jpegls_late_sof.dcm"] == {
      "path": "dicom/hostile/jpegls_late_sof.dcm", "stage": "decode",
      "reason": "decoder crashed (SIGABRT) on JPEG-LS Lossless Image Compression"}
  assert decoded["dicom/hostile/rle_memory_bomb.dcm"]["reason"] == (
      "out of memory while decoding (decoder limit config.data.decode_memory_mb=512; raise it "
      "if the file is genuine)")
  # Everything else is ingested: the tiny cohort's six patients, every file either referenced by
  # the manifest or quarantined, and every record decoded into the cache.
  result = ingest.load(workdir)
  assert len(result.manifest) == 6
  referenced = {f for files in result.manifest.image_files for f in files}
  assert {"dicom/s1/a.dcm", "dicom/s1/b.dcm", "dicom/s2/x", "dicom/hostile/dup_a.dcm",
          "dicom/hostile/inside_link.dcm"} <= referenced
  entries = set()
  for dirpath, dirnames, files in os.walk(os.path.join(root, "dicom")):
    entries |= {os.path.relpath(os.path.join(dirpath, n), root) for n in files + dirnames
                if os.path.islink(os.path.join(dirpath, n)) or n in files}
  quarantined = {q["path"] for q in quarantine if q["path"].startswith("dicom")}
  assert referenced | quarantined == entries and not referenced & quarantined
  with open(os.path.join(workdir, "ingest", "report.json")) as f:
    cache = json.load(f)["cache"]["host-0"]
  assert cache["records_written"] == 6 and cache["rejected_at_decode"] == 2
  # No raw identifier reached any output.
  outputs = stdout + stderr
  for dirpath, _, files in os.walk(workdir):
    for name in files:
      if name != "id_salt":
        with open(os.path.join(dirpath, name), "rb") as f:
          outputs += f.read().decode(errors="replace")
  for secret in ("MRN00", "MRN999", "HOSTILE-1", "OUTSIDE-9", "DOE^JOHN"):
    assert secret not in outputs


@pytest.mark.slow
def test_a_fill_on_every_core_keeps_the_decoders_isolated(tmp_path, monkeypatch):
  """The cache fill's decoding processes (`cache.fill`) decode compressed files in isolated
  children of their own: the JPEG-LS file that aborts its decoder and the RLE memory bomb cost
  their own files, quarantined with the same reasons as in one process; the rest is cached."""
  root = cohorts.tiny_cohort(str(tmp_path / "cohort"))
  hostile.add_to_cohort(root, str(tmp_path / "outside"), "MRN001", memory_bomb_side=4096)
  config = default_config.get_config()
  config.data.decode_memory_mb = 512
  result = ingest.run(config, str(tmp_path / "work"), root)
  monkeypatch.setattr(fill, "MIN_RECORDS", 0)   # the tiny cohort is far below it
  cache = cache_lib.Cache(str(tmp_path / "cache"), result.manifest, result.tables,
                          records.shapes_for(config.data, result.tables), root,
                          decoder=decoder.Decoder.from_config(config.data), fill_processes=2)
  assert cache.ensure(np.arange(len(result.manifest))) == len(result.manifest)
  assert cache.rejected["dicom/hostile/jpegls_late_sof.dcm"]["reason"] == (
      "decoder crashed (SIGABRT) on JPEG-LS Lossless Image Compression")
  assert cache.rejected["dicom/hostile/rle_memory_bomb.dcm"]["reason"].startswith(
      "out of memory while decoding")
  assert set(cache.rejected) == {"dicom/hostile/jpegls_late_sof.dcm",
                                 "dicom/hostile/rle_memory_bomb.dcm"}
  assert cache.counters["records_written"] == len(result.manifest)


@pytest.mark.slow
def test_a_file_whose_read_never_returns_costs_that_file_and_the_ingest_goes_on(tmp_path):
  """A pool process stuck on one file (SIGSTOP, as a read a stalled mount never answers leaves
  it), once in the header scan and once in the cache fill: past config.data.decode_timeout_s
  that process is killed, the file (the fill: its record's files) quarantined with the reason,
  and the rest is scanned, ingested and cached in new processes; exit 0, every file accounted
  for."""
  config = default_config.get_config()
  config.data.synthetic.num_patients = 500    # > scan.MIN_POOL_FILES files, > fill.MIN_RECORDS
  config.data.synthetic.image_size = 32
  config.data.synthetic.junk_files = 0        # every file is a patient's image
  root = str(tmp_path / "cohort")
  synthetic.generate(config.data.synthetic, root)
  files = sorted(os.path.relpath(os.path.join(d, n), root)
                 for d, _, names in os.walk(os.path.join(root, "dicom")) for n in names)
  assert len(files) > dicom_scan.MIN_POOL_FILES
  at_scan, at_fill = files[10], files[400]
  workdir = str(tmp_path / "work")
  env = dict(os.environ, **{pools.FAULT_ENV: f"dicom scan:{at_scan[len('dicom/'):]};"
                                             f"cache fill:{at_fill}"})
  t0 = time.monotonic()
  run = subprocess.run(
      [sys.executable, "-m", "medjax", "--config", "configs/quickstart.py:tiny",
       "--config.mode=ingest", f"--config.data.root={root}", f"--workdir={workdir}",
       "--config.data.scan_workers=2", "--config.data.decode_processes=2",
       "--config.data.decode_timeout_s=2"],
      cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
  assert run.returncode == 0, run.stderr[-3000:]
  assert time.monotonic() - t0 < 120
  assert f"dicom scan: {at_scan} took more than 2 s in a pool process" in run.stderr
  with open(os.path.join(workdir, "ingest", "quarantine.jsonl")) as f:
    quarantine = {q["path"]: q for q in map(json.loads, f)}
  assert quarantine[at_scan] == {
      "path": at_scan, "stage": "scan", "reason": "reading its header took longer than 2 s "
      "(config.data.decode_timeout_s): the storage did not answer"}
  result = ingest.load(workdir)
  referenced = {f for record in result.manifest.image_files for f in record}
  assert referenced | set(quarantine) >= set(files) and at_scan not in referenced
  assert len(result.manifest) == 500
  # The fill: the stalled file's record lost its files (quarantined), every record is cached.
  row = next(r for r, record in enumerate(result.manifest.image_files) if at_fill in record)
  with open(os.path.join(workdir, "cache", "host-0", "decode_quarantine.jsonl")) as f:
    decoded = {q["path"]: q for q in map(json.loads, f)}
  record = result.manifest.image_files[row]
  limit = 2 * (len(record) + 1)   # the timeout a file, and one more
  assert f"cache fill: {record[0]} took more than {limit} s in a pool process" in run.stderr
  assert {p: q["reason"] for p, q in decoded.items() if p in record} == {
      p: f"decoding its record's {len(record)} file(s) took longer than {limit} s "
         "(config.data.decode_timeout_s a file, and one more): the storage did not answer"
      for p in record}
  with open(os.path.join(workdir, "ingest", "report.json")) as f:
    cache = json.load(f)["cache"]["host-0"]
  assert cache["records_written"] == 500


def test_a_decoder_that_aborts_on_an_image_too_big_for_its_limit_says_so(tmp_path, monkeypatch):
  """A C decoder that cannot allocate aborts (a genuine 20000 x 20000 JPEG under the 2 GB
  limit: 'decoder crashed (SIGABRT)'), which read as a damaged file. Where the header asks for
  more than the limit, the reason says so and what to raise; a small image's crash does not."""
  path = str(tmp_path / "big.dcm")
  hostile.rle_memory_bomb(path, side=4096)
  monkeypatch.setenv(decoder.FAULT_ENV, "abort=big.dcm")
  assert _rejected(decoder.Decoder(memory_mb=512, workers=1).load_image, path).reason == (
      "decoder crashed (SIGABRT) on RLE Lossless (its 16,777,216 pixels need about 652 MB to "
      "decode, over config.data.decode_memory_mb=512; raise it if the file is genuine)")
  assert _rejected(decoder.Decoder(memory_mb=2048, workers=1).load_image, path).reason == (
      "decoder crashed (SIGABRT) on RLE Lossless")
