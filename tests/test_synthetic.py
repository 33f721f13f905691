"""Tests for medjax.data.synthetic: layout, determinism, missingness, exact posterior, images."""

from __future__ import annotations

import csv
import dataclasses
import functools
import importlib.util
import logging
import multiprocessing
import os
import signal

import numpy as np
import pydicom
import pytest
from scipy import stats

from medjax.data import synthetic
from medjax.data.synthetic import cohort as synthetic_cohort
from medjax.data.synthetic import dicom as synthetic_dicom
from medjax.data.synthetic import tables as synthetic_tables

_HAS_DICOM = importlib.util.find_spec("medjax.data.dicom") is not None
_WRITE_PATIENTS = 120


def _config(**overrides):
  cfg = synthetic.get_config()
  cfg.num_patients = _WRITE_PATIENTS
  cfg.seed = 3
  for key, value in overrides.items():
    cfg[key] = value
  return cfg


@pytest.fixture(scope="module")
def written(tmp_path_factory):
  """A small cohort written twice with the same config, plus its in-memory twin: once in this
  process, once by a pool of two processes."""
  cfg = _config()
  roots = [str(tmp_path_factory.mktemp("cohort") / "root") for _ in range(2)]
  all_stats = [synthetic.generate(cfg, root, processes=n) for root, n in zip(roots, (1, 2))]
  return cfg, synthetic.sample_cohort(cfg), roots, all_stats


@pytest.fixture(scope="module")
def big():
  """A larger in-memory cohort (no files) for fractions and ceilings."""
  cfg = synthetic.get_config()
  cfg.num_patients = 20_000
  cfg.seed = 11
  return synthetic.sample_cohort(cfg)


def _tree(root: str) -> dict[str, bytes]:
  out = {}
  for dirpath, _, files in os.walk(root):
    for name in files:
      path = os.path.join(dirpath, name)
      with open(path, "rb") as f:
        out[os.path.relpath(path, root)] = f.read()
  return out


def _read_csv(path: str) -> list[list[str]]:
  with open(path, newline="") as f:
    return list(csv.reader(f))


def _reference_decode(path: str) -> np.ndarray:
  """The decode rules the generator targets, written out independently of medjax.data.dicom."""
  ds = pydicom.dcmread(path)
  stored = ds.pixel_array.astype(np.float64)
  pad = stored == ds.get("PixelPaddingValue", -1)
  x = stored * float(ds.get("RescaleSlope", 1.0)) + float(ds.get("RescaleIntercept", 0.0))
  if "WindowCenter" in ds:
    c, w = float(ds.WindowCenter), float(ds.WindowWidth)
    out = np.clip((x - (c - 0.5)) / (w - 1) + 0.5, 0, 1)
    out = np.where(x <= c - 0.5 - (w - 1) / 2, 0.0, np.where(x > c - 0.5 + (w - 1) / 2, 1.0, out))
  else:
    low, high = np.percentile(x[~pad], [0.5, 99.5])
    out = np.clip((x - low) / (high - low), 0, 1)
  if ds.PhotometricInterpretation == "MONOCHROME1":
    out = 1.0 - out
  return np.where(pad, 0.0, out)


def test_same_seed_writes_identical_bytes(written):
  _, _, roots, all_stats = written
  a, b = _tree(roots[0]), _tree(roots[1])
  assert sorted(a) == sorted(b)
  assert [k for k in a if a[k] != b[k]] == []
  assert all_stats[0]["junk"] == all_stats[1]["junk"]


def _write_or_die(job: tuple) -> int:
  """`write_patient`, except that the first pool process to take a job is killed (SIGKILL, as
  the OOM killer would) before it writes anything."""
  marker = os.path.join(os.path.dirname(os.path.dirname(job[2])), "killed")  # beside the root
  if multiprocessing.parent_process() is not None and not os.path.exists(marker):
    open(marker, "x").close()
    os.kill(os.getpid(), signal.SIGKILL)
  return synthetic_dicom.write_patient(job)


def test_a_writing_process_killed_costs_the_pool_not_the_cohort(written, tmp_path, monkeypatch,
                                                                caplog):
  cfg, cohort, roots, _ = written
  monkeypatch.setattr(synthetic_dicom, "_write_jobs",
                      functools.partial(synthetic_dicom._write_jobs, write=_write_or_die))
  root = str(tmp_path / "root")
  with caplog.at_level(logging.WARNING):
    synthetic_cohort.write_cohort(cohort, root, cfg, processes=2)
  assert "a writing process died" in caplog.text
  a, b = _tree(roots[0]), _tree(root)
  assert sorted(a) == sorted(b) and [k for k in a if a[k] != b[k]] == []


def test_different_seed_gives_different_cohort(written, tmp_path):
  cfg, cohort, roots, _ = written
  other = synthetic.sample_cohort(_config(seed=4))
  synthetic_tables.write_tables(other, str(tmp_path), synthetic.VITALS_CHANNELS)
  for name in ("labels.csv", "labs.csv", "vitals.csv"):
    with open(os.path.join(roots[0], name), "rb") as f1, open(tmp_path / name, "rb") as f2:
      assert f1.read() != f2.read(), name
  assert not np.array_equal(other.posterior, cohort.posterior)
  # Same model_seed: same classes, prior and loadings, so ceilings are comparable across seeds.
  np.testing.assert_array_equal(other.model.means, cohort.model.means)


def test_tables_layout_and_values(written):
  cfg, cohort, roots, _ = written
  root, m = roots[0], cohort.model
  assert sorted(os.listdir(root)) == ["dicom", "labels.csv", "labs.csv", "oracle.npz",
                                      "vitals.csv"]
  rows = _read_csv(os.path.join(root, "labs.csv"))
  assert rows[0] == ["patient_id"] + m.lab_names and len(m.lab_names) == 43
  assert len(set(m.lab_panels)) == 7
  has_labs = cohort.modality_mask[:, synthetic.LABS]
  assert [r[0] for r in rows[1:]] == list(cohort.patient_ids[has_labs])
  parsed = np.array([[float(v) if v else np.nan for v in r[1:]] for r in rows[1:]])
  np.testing.assert_array_equal(parsed, cohort.labs[has_labs])  # Exact: written = in memory.

  rows = _read_csv(os.path.join(root, "vitals.csv"))
  assert rows[0] == ["patient_id", "hour", "hr", "sbp", "dbp", "rr", "spo2", "temp"]
  index = {p: i for i, p in enumerate(cohort.patient_ids)}
  rebuilt = np.full(cohort.vitals.shape, np.nan)
  for r in rows[1:]:
    assert all(v == "" or len(v.split(".")[1]) == 1 for v in r[2:])  # One decimal.
    assert any(r[2:]), "an observed row carries at least one value"
    rebuilt[index[r[0]], int(r[1])] = [float(v) if v else np.nan for v in r[2:]]
  np.testing.assert_array_equal(rebuilt, cohort.vitals)
  hours = {(r[0], r[1]) for r in rows[1:]}
  assert len(hours) == len(rows) - 1  # One row per observed (patient, hour).

  rows = _read_csv(os.path.join(root, "labels.csv"))
  assert rows[0] == ["patient_id", "diagnosis"]
  assert [r[1] for r in rows[1:]] == [m.class_names[y] for y in cohort.labels]
  assert len(set(m.class_names)) == 37

  with np.load(os.path.join(root, "oracle.npz"), allow_pickle=False) as f:
    assert sorted(f.files) == ["class_names", "patient_id", "posterior", "prior"]
    assert list(f["patient_id"]) == list(cohort.patient_ids)
    assert f["posterior"].dtype == np.float64 and f["posterior"].shape == (len(cohort), 37)
    np.testing.assert_array_equal(f["posterior"], cohort.posterior)
    np.testing.assert_allclose(f["posterior"].sum(axis=1), 1.0, atol=1e-12)
    assert list(f["class_names"]) == m.class_names
    np.testing.assert_array_equal(f["prior"], m.prior)


def test_dicom_files_link_by_patient_id_only(written):
  cfg, cohort, roots, all_stats = written
  root, st = roots[0], all_stats[0]
  files = {k for k in _tree(os.path.join(root, "dicom"))}
  listed = {im["path"][len("dicom/"):] for im in st["images"]}
  junk = {j["path"][len("dicom/"):] for j in st["junk"]}
  assert files == listed | junk and not listed & junk
  assert st["num_image_files"] == cohort.num_images.sum() == len(listed)
  for pid in cohort.patient_ids:  # No raw PatientID (nor its digits) in any path.
    assert not any(pid in p or pid[3:] in p for p in files)
  counts, sop_uids, seen_syntaxes = {}, set(), set()
  for im in st["images"]:
    ds = pydicom.dcmread(os.path.join(root, im["path"]), stop_before_pixels=True)
    assert ds.PatientID == im["patient_id"]
    counts[ds.PatientID] = counts.get(ds.PatientID, 0) + 1
    sop_uids.add(ds.SOPInstanceUID)
    seen_syntaxes.add(ds.file_meta.TransferSyntaxUID)
    assert "^" in str(ds.PatientName) and len(ds.PatientBirthDate) == 8 and ds.InstitutionName
    assert ds.SOPClassUID in (pydicom.uid.CTImageStorage, pydicom.uid.MRImageStorage,
                              pydicom.uid.DigitalXRayImageStorageForPresentation)
    assert ds.BitsAllocated == 16 and ds.BitsStored in (12, 16) and ds.PixelRepresentation == 0
  has = cohort.num_images > 0
  assert counts == dict(zip(cohort.patient_ids[has], cohort.num_images[has].tolist()))
  assert len(sop_uids) == len(listed)
  assert seen_syntaxes == set(synthetic_dicom.TRANSFER_SYNTAXES.values())


def test_junk_files_as_configured(written):
  cfg, cohort, roots, all_stats = written
  root, junk = roots[0], all_stats[0]["junk"]
  assert [j["kind"] for j in junk] == ["sr_report", "truncated", "no_patient_id", "text"]
  assert len(junk) == cfg.junk_files
  by_kind = {j["kind"]: os.path.join(root, j["path"]) for j in junk}
  sr = pydicom.dcmread(by_kind["sr_report"])
  assert sr.SOPClassUID == "1.2.840.10008.5.1.4.1.1.88.11" and "PixelData" not in sr
  assert sr.PatientID in set(cohort.patient_ids)
  assert "PatientID" not in pydicom.dcmread(by_kind["no_patient_id"])
  with pytest.raises(Exception):
    pydicom.dcmread(by_kind["truncated"]).pixel_array
  assert by_kind["text"].endswith("dicom/README.txt")
  if _HAS_DICOM:  # Ingest's reader rejects exactly the junk files.
    from medjax.data import dicom  # pylint: disable=g-import-not-at-top
    for path in by_kind.values():
      with pytest.raises(dicom.RejectedFile):
        dicom.read_header(path)
    for im in all_stats[0]["images"]:
      assert dicom.read_header(os.path.join(root, im["path"])).patient_id == im["patient_id"]
  # Junk is extra: the SR and the truncated copy sit in folders of patients who keep all their
  # images (test_dicom_files_link_by_patient_id_only checks the per-patient counts).
  for kind in ("sr_report", "truncated"):
    folder = os.path.dirname(by_kind[kind])
    assert any(os.path.dirname(os.path.join(root, im["path"])) == folder
               for im in all_stats[0]["images"])


def test_decoded_images_equal_canonical_for_every_variant(written):
  cfg, cohort, roots, all_stats = written
  index = {p: i for i, p in enumerate(cohort.patient_ids)}
  decoders = [_reference_decode]
  if _HAS_DICOM:
    from medjax.data import dicom  # pylint: disable=g-import-not-at-top
    decoders.append(dicom.load_image)
  seen = set()
  for im in all_stats[0]["images"]:
    want = synthetic.canonical_image(
        cohort.image_latents[index[im["patient_id"]], im["image_index"]], cfg.image_size)
    for decode in decoders:
      got = decode(os.path.join(roots[0], im["path"]))
      assert got.shape == want.shape == (cfg.image_size, cfg.image_size)
      assert np.max(np.abs(got - want)) < 1e-3, (decode.__name__, im)
    for key in ("photometric", "window", "padding", "rescale", "transfer_syntax", "modality"):
      seen.add((key, str(im[key])))
  for key, values in (("photometric", ["MONOCHROME1", "MONOCHROME2"]),
                      ("window", ["True", "False"]),
                      ("padding", ["True", "False"]), ("rescale", list(synthetic_dicom.RESCALES)),
                      ("transfer_syntax", list(synthetic_dicom.TRANSFER_SYNTAXES)),
                      ("modality", ["CT", "MR", "DX"])):
    assert {(key, v) for v in values} <= seen


def test_canonical_image_regions_and_latent_recovery():
  size, u_E = 64, np.linspace(-2, 2, 8)
  img = synthetic.canonical_image(u_E, size)
  assert img.dtype == np.float32 and img.min() == 0.0 and img.max() == 1.0
  fov, body, marker = synthetic_dicom.geometry(size)
  assert np.mean(img[fov] == 0.0) >= 0.05 and np.mean(img[fov] == 1.0) >= 0.02
  assert np.all((img[body & ~marker] > 0) & (img[body & ~marker] < 1))
  # The latent is linearly recoverable from pixels, also after 4x4 downsizing to 16 px.
  for factor in (1, 4):
    blobs_ExP = synthetic_dicom.blobs(8, size)[:, body & ~marker]
    pix = (img[body & ~marker] * 2000 - 1000 - synthetic_dicom.BODY_HU) / synthetic_dicom.BLOB_HU
    if factor > 1:
      def down(a):
        k = size // factor
        return a.reshape(*a.shape[:-2], k, factor, k, factor).mean((-1, -3))
      inside = down((body & ~marker).astype(float)) == 1
      full = np.zeros((size, size))
      full[body & ~marker] = pix
      pix = down(full)[inside]
      stack = np.zeros((8, size, size))
      stack[:, body & ~marker] = blobs_ExP
      blobs_ExP = down(stack)[:, inside]
    u_hat = np.linalg.lstsq(blobs_ExP.T, pix, rcond=None)[0]
    np.testing.assert_allclose(u_hat, u_E, atol=1e-3 * factor)


def test_missingness_fractions(big):
  cfg, c = synthetic.get_config(), big
  m = c.modality_mask
  assert m.any(axis=1).all()
  assert abs(np.mean(~m[:, 0]) - cfg.frac_no_images) < 0.015
  assert abs(np.mean(~m[:, 2]) - cfg.frac_no_vitals) < 0.01
  assert abs(np.mean(~m[:, 1]) - cfg.frac_no_labs) < 0.01
  lab_nan = np.isnan(c.labs)
  partial = m[:, 1] & lab_nan.any(axis=1)
  assert abs(np.mean(partial) - cfg.frac_partial_labs) < 0.015
  panels = np.array(c.model.lab_panels)
  for p in set(c.model.lab_panels):  # Whole panels are missing, never single analytes.
    block = lab_nan[:, panels == p]
    assert np.all(block.all(axis=1) | ~block.any(axis=1))
  missing_panels = np.array([len(set(panels[row])) for row in lab_nan[partial]])
  assert missing_panels.min() == 1 and missing_panels.max() == 3
  steps = ~np.isnan(c.vitals).all(axis=2)
  assert abs(1 - steps[m[:, 2]].mean() - cfg.frac_missing_vitals_steps) < 0.01
  assert not steps[~m[:, 2]].any() and steps[m[:, 2]].any(axis=1).all()
  cells = np.isnan(c.vitals)[steps]
  assert 0.005 < cells.mean() < 0.04
  n_img = c.num_images[m[:, 0]]
  assert n_img.min() == 1 and n_img.max() == 4 and abs(n_img.mean() - cfg.mean_images) < 0.05
  assert (c.num_images[~m[:, 0]] == 0).all()
  assert np.isnan(c.image_latents[~m[:, 0]]).all()
  # Long tail: several classes under 5% of records, frequencies following the prior.
  freq = np.bincount(c.labels, minlength=37) / len(c)
  assert np.sum(freq < 0.05) >= 10 and freq.min() > 0
  np.testing.assert_allclose(freq, c.model.prior, atol=0.01)


def _tiny_config():
  cfg = synthetic.get_config()
  cfg.update(num_patients=60, num_classes=5, rare_twins=1, num_analytes=10, vitals_steps=4,
             max_images=3, mean_images=2.0, latent_dim_shared=3, latent_dim_image=2,
             class_rank_shared=2, image_latent_dim=3, frac_no_images=0.3, frac_no_labs=0.2,
             frac_partial_labs=0.3, frac_no_vitals=0.3, frac_missing_vitals_steps=0.3,
             frac_missing_vitals_cells=0.2, seed=5)
  return cfg


def _brute_force_posterior(c: synthetic.Cohort, keep_3) -> np.ndarray:
  """p(y | x_obs) from the joint Gaussian of all observed entries (each image separately)."""
  m = c.model
  s, d = m.dim_shared, m.means.shape[1]
  vit_A = m.vitals_loadings.reshape(-1, s)
  vit_var = np.tile(m.vitals_noise_sd ** 2, m.vitals_loadings.shape[0])
  out = np.zeros((len(c), len(m.prior)))
  for i in range(len(c)):
    use = c.modality_mask[i] & keep_3
    xs, rows, noise = [], [], []
    if use[1]:
      obs = ~np.isnan(c.labs[i])
      xs.append(((c.labs[i] - m.lab_ref_mean) / m.lab_ref_sd)[obs])
      rows.append(np.pad(m.lab_loadings[obs], ((0, 0), (0, d - s))))
      noise.append(m.lab_noise_sd[obs] ** 2)
    if use[2]:
      x = ((c.vitals[i] - synthetic_cohort._VITALS_BASE) / synthetic_cohort._VITALS_SCALE).ravel()
      obs = ~np.isnan(x)
      xs.append(x[obs])
      rows.append(np.pad(vit_A[obs], ((0, 0), (0, d - s))))
      noise.append(vit_var[obs])
    if use[0]:
      for j in range(c.num_images[i]):
        xs.append(c.image_latents[i, j])
        rows.append(m.image_loadings)
        noise.append(np.full(len(m.image_loadings), m.image_noise_sd ** 2))
    if not xs:
      out[i] = m.prior
      continue
    x, a = np.concatenate(xs), np.concatenate(rows)
    # Image noise is per image, so independent across j; the shared part comes through a a^T.
    cov = a @ a.T + np.diag(np.concatenate(noise))
    logp = np.log(m.prior) + np.array(
        [stats.multivariate_normal.logpdf(x, a @ mu, cov) for mu in m.means])
    out[i] = np.exp(logp - logp.max()) / np.exp(logp - logp.max()).sum()
  return out


@pytest.mark.parametrize("keep_3", [(1, 1, 1), (1, 0, 0), (0, 1, 1), (1, 0, 1)])
def test_posterior_matches_brute_force(keep_3):
  c = synthetic.sample_cohort(_tiny_config())
  keep_3 = np.array(keep_3, bool)
  want = _brute_force_posterior(c, keep_3)
  np.testing.assert_allclose(synthetic.posterior(c, keep_3), want, atol=1e-8, rtol=0)
  if keep_3.all():
    np.testing.assert_allclose(c.posterior, want, atol=1e-8, rtol=0)


def test_ceiling_falls_as_modalities_go_missing(big):
  rows = big.modality_mask.all(axis=1)  # The same patients, modalities hidden.
  t = {}
  for name in ("ILV", "IL", "IV", "LV", "I", "L", "V"):
    guess = synthetic.log_posterior(big, [m in name for m in "ILV"])[rows].argmax(axis=1)
    t[name] = np.mean(guess == big.labels[rows])
  t["any2"] = np.mean([t["IL"], t["IV"], t["LV"]])
  t["single"] = np.mean([t["I"], t["L"], t["V"]])
  for pair in ("IL", "IV", "LV"):
    assert t["ILV"] > t[pair]
    for single in pair:
      assert t[pair] > t[single]
  assert t["ILV"] > t["any2"] > t["single"]
  # Calibrated to the paper's Table IV (All 3 ~0.89, any two ~0.86, single ~0.79).
  assert 0.87 < t["ILV"] < 0.93 and 0.82 < t["any2"] < 0.88 and 0.74 < t["single"] < 0.81


def test_rare_twins_separable_only_with_images(big):
  c, m = big, big.model
  assert len(m.twins) == 3
  lv = synthetic.log_posterior(c, [False, True, True])
  full = synthetic.log_posterior(c, [True, True, True])
  for rare, common in m.twins:
    assert m.prior[rare] < 0.01 < 0.05 < m.prior[common]
    # Without images the twins' likelihoods are identical: the odds are the prior odds.
    np.testing.assert_allclose(lv[:, rare] - lv[:, common],
                               np.log(m.prior[rare] / m.prior[common]), atol=1e-9)
    rows = np.isin(c.labels, [rare, common]) & c.modality_mask[:, 0]
    is_rare = c.labels[rows] == rare
    score = full[rows, rare] - full[rows, common]
    auc = stats.mannwhitneyu(score[is_rare], score[~is_rare]).statistic / (
        is_rare.sum() * (~is_rare).sum())
    assert auc > 0.95, (m.class_names[rare], auc)


def test_posterior_mask_and_prior_fallback(big):
  c = synthetic.Cohort(**{f.name: getattr(big, f.name) if f.name == "model"
                          else getattr(big, f.name)[:200] for f in dataclasses.fields(big)})
  nothing = synthetic.posterior(c, np.zeros(3, bool))
  np.testing.assert_allclose(nothing, np.broadcast_to(c.model.prior, nothing.shape), atol=1e-12)
  np.testing.assert_allclose(synthetic.posterior(c), c.posterior, atol=1e-12)
  np.testing.assert_allclose(synthetic.posterior(c, c.modality_mask), c.posterior, atol=1e-12)


def test_write_replaces_synthetic_root_but_not_foreign(tmp_path):
  cfg = _config(num_patients=10, junk_files=0)
  root = tmp_path / "cohort"
  synthetic.generate(cfg, str(root))
  (root / "synthetic.json").write_text("{}")  # e.g. a marker the pipeline adds.
  synthetic.generate(cfg, str(root))
  assert not (root / "synthetic.json").exists() and (root / "oracle.npz").exists()
  foreign = tmp_path / "foreign"
  foreign.mkdir()
  (foreign / "notes.txt").write_text("mine")
  with pytest.raises(FileExistsError, match="not a synthetic cohort"):
    synthetic.generate(cfg, str(foreign))
  assert (foreign / "notes.txt").read_text() == "mine"
  assert sorted(os.listdir(tmp_path)) == ["cohort", "foreign"]  # No temporary folders left.
