"""DICOM files of the synthetic cohort: rendering, a realistic header mix, and junk files.

Each image latent u (E,) is rendered to a value image v in HU-like units: a circular field of
view, an AIR ring, a body ellipse at BODY_HU + BLOB_HU * sum_k u_k blob_k (smooth Gaussian bumps
that survive downsizing to 16 px) clipped strictly inside (AIR_HU, MARKER_HU), and a MARKER_HU
square. Every header variant (MONOCHROME1/2, rescale slope/intercept or none, window tags or
not, PixelPaddingValue or not, six lossless transfer syntaxes) decodes to the same canonical
image (v - AIR) / (MARKER - AIR): window tags are set to exactly that linear map, and AIR
(>= 5% of non-padding pixels) and MARKER (>= 2%) are the 0.5th and 99.5th percentiles that
robust windowing uses when the tags are absent. MONOCHROME1 files store the reflected values.

Files are linked to patients only by the PatientID tag; folder names are random.
"""

from __future__ import annotations

import collections
import functools
import logging
import os
import time
import typing

import numpy as np
import pydicom
from pydicom import uid

from medjax.data import pools

AIR_HU, MARKER_HU, BODY_HU, BLOB_HU = -1000.0, 1000.0, 40.0, 200.0

TRANSFER_SYNTAXES = {
    "explicit": uid.ExplicitVRLittleEndian, "implicit": uid.ImplicitVRLittleEndian,
    "deflated": uid.DeflatedExplicitVRLittleEndian, "rle": uid.RLELossless,
    "jpeg_ls": uid.JPEGLSLossless, "jpeg2000": uid.JPEG2000Lossless}
_UNCOMPRESSED = ("explicit", "implicit", "deflated")
_BASIC_TEXT_SR = "1.2.840.10008.5.1.4.1.1.88.11"


class Rescale(typing.NamedTuple):
  """How HU maps to rescaled units r = r_air + per_hu * (v - AIR_HU), and r to stored values."""
  r_air: float
  per_hu: float
  slope: float | None  # None: no rescale tags, stored = r.
  intercept: float | None
  bits_stored: int
  padding: int  # A stored value the image never uses.


RESCALES = {
    "ct": Rescale(-1000.0, 1.0, 1.0, -1024.0, 12, 0),  # AIR stored 24, MARKER 2024.
    "ct_half": Rescale(-1000.0, 1.0, 0.5, -1000.0, 12, 4095),  # AIR 0, MARKER 4000.
    "raw": Rescale(0.0, 1.5, None, None, 16, 65535),  # MR/DX-like: AIR 0, MARKER 3000.
}

_SURNAMES = ("DOE", "ROE", "SMITH", "GARCIA", "NGUYEN", "MUELLER", "ROSSI", "KOWALSKI", "OKAFOR",
             "TANAKA", "SILVA", "JOHANSSON", "PATEL", "COHEN", "MARTIN", "OBRIEN")
_GIVEN = {"F": ("JANE", "MARY", "ANA", "LINH", "GRETA", "FATIMA", "SOFIA", "AIKO"),
          "M": ("JOHN", "RICHARD", "LUIS", "MINH", "HANS", "KWAME", "MARCO", "KENJI")}
_INSTITUTIONS = ("GENERAL HOSPITAL", "ST. MARY MEDICAL CENTER", "UNIVERSITY CLINIC",
                 "RIVERSIDE REGIONAL", "NORTHGATE HEART INSTITUTE")


@functools.lru_cache(maxsize=8)
def geometry(image_size: int):
  """(H, W) bool masks: circular field of view, body ellipse, marker square (inside the body)."""
  if image_size < 16:
    raise ValueError(f"config.data.synthetic.image_size={image_size}: need >= 16 so the "
                     "marker and air regions carry the percentiles")
  c = (np.arange(image_size) + 0.5) / image_size - 0.5
  y_HxW, x_HxW = np.meshgrid(c, c, indexing="ij")
  fov = x_HxW ** 2 + y_HxW ** 2 < 0.48 ** 2
  body = (x_HxW / 0.40) ** 2 + (y_HxW / 0.34) ** 2 < 1.0
  marker = (np.abs(x_HxW) < 0.08) & (np.abs(y_HxW) < 0.08)
  air = fov & ~body
  if air.sum() < 0.05 * fov.sum() or marker.sum() < 0.02 * fov.sum():
    raise ValueError(f"config.data.synthetic.image_size={image_size}: air or marker region "
                     "too small for robust windowing; use a larger image_size")
  return fov, body, marker


@functools.lru_cache(maxsize=8)
def blobs(num_blobs: int, image_size: int) -> np.ndarray:
  """(E, H, W) unit-peak Gaussian bumps on a ring inside the body, clear of the marker."""
  c = (np.arange(image_size) + 0.5) / image_size - 0.5
  y_HxW, x_HxW = np.meshgrid(c, c, indexing="ij")
  theta_E = 2 * np.pi * (np.arange(num_blobs) + 0.5) / num_blobs
  cx_E, cy_E = 0.25 * np.cos(theta_E), 0.2 * np.sin(theta_E)
  d2_ExHxW = (x_HxW[None] - cx_E[:, None, None]) ** 2 + (y_HxW[None] - cy_E[:, None, None]) ** 2
  return np.exp(-d2_ExHxW / (2 * 0.055 ** 2))


def render_hu(u_BxE: np.ndarray, image_size: int) -> np.ndarray:
  """Value images (B, H, W) float64 in HU-like units for latents (B, E)."""
  u_BxE = np.atleast_2d(np.asarray(u_BxE, np.float64))
  fov, body, marker = geometry(image_size)
  body_BxHxW = BODY_HU + BLOB_HU * np.einsum("be,ehw->bhw", u_BxE,
                                             blobs(u_BxE.shape[1], image_size))
  body_BxHxW = np.clip(body_BxHxW, AIR_HU + 1, MARKER_HU - 1)
  v_BxHxW = np.where(body, body_BxHxW, AIR_HU)
  return np.where(marker, MARKER_HU, v_BxHxW)


def canonical_image(u_E: np.ndarray, image_size: int) -> np.ndarray:
  """The decode of any written variant of latent `u_E`: float32 (H, W) in [0, 1]."""
  v_HxW = render_hu(np.asarray(u_E)[None], image_size)[0]
  return ((v_HxW - AIR_HU) / (MARKER_HU - AIR_HU)).astype(np.float32)


def stored_values(v_HxW: np.ndarray, variant: dict) -> np.ndarray:
  """The uint16 stored pixels of value image `v_HxW` under a header `variant`."""
  resc = RESCALES[variant["rescale"]]
  r_marker = resc.r_air + resc.per_hu * (MARKER_HU - AIR_HU)
  r_HxW = resc.r_air + resc.per_hu * (v_HxW - AIR_HU)
  if variant["photometric"] == "MONOCHROME1":
    r_HxW = resc.r_air + r_marker - r_HxW
  slope, intercept = (resc.slope, resc.intercept) if resc.slope is not None else (1.0, 0.0)
  stored_HxW = np.round((r_HxW - intercept) / slope)
  if variant["padding"]:
    fov, _, _ = geometry(v_HxW.shape[0])
    stored_HxW = np.where(fov, stored_HxW, resc.padding)
  assert 0 <= stored_HxW.min() and stored_HxW.max() < 2 ** resc.bits_stored
  return stored_HxW.astype(np.uint16)


def _quota(rng: np.random.Generator, n: int, weights: dict[str, float]) -> np.ndarray:
  """n labels in the given proportions (largest remainder), in random order."""
  names = list(weights)
  w = np.array([weights[k] for k in names], np.float64)
  if w.min() < 0 or w.sum() <= 0:
    raise ValueError(f"config.data.synthetic.headers: weights {dict(weights)} must be >= 0 "
                     "with a positive sum")
  exact = w / w.sum() * n
  counts = np.floor(exact).astype(int)
  counts[np.argsort(-(exact - counts), kind="stable")[:n - counts.sum()]] += 1
  out = np.repeat(np.array(names, dtype=object), counts)
  rng.shuffle(out)
  return out


def plan_headers(n: int, headers, rng: np.random.Generator) -> list[dict]:
  """Header variants of n image files, each factor in its configured proportion."""
  h = headers
  for field, known in (("transfer_syntax", TRANSFER_SYNTAXES), ("rescale", RESCALES)):
    unknown = set(h[field]) - set(known)
    if unknown:
      raise ValueError(f"config.data.synthetic.headers.{field}: unknown {sorted(unknown)}; "
                       f"use names from {sorted(known)}")
  photometric = _quota(rng, n, {"MONOCHROME1": h.frac_monochrome1,
                                "MONOCHROME2": 1 - h.frac_monochrome1})
  window = _quota(rng, n, {True: 1 - h.frac_no_window, False: h.frac_no_window})
  padding = _quota(rng, n, {True: h.frac_padding, False: 1 - h.frac_padding})
  rescale = _quota(rng, n, dict(h.rescale))
  syntax = _quota(rng, n, dict(h.transfer_syntax))
  dx = _quota(rng, n, {True: h.frac_dx, False: 1 - h.frac_dx})
  modality = np.where(rescale != "raw", "CT", np.where(dx.astype(bool), "DX", "MR"))
  return [dict(photometric=photometric[i], window=bool(window[i]), padding=bool(padding[i]),
               rescale=rescale[i], transfer_syntax=syntax[i], modality=str(modality[i]))
          for i in range(n)]


_SOP_CLASSES = {"CT": uid.CTImageStorage, "MR": uid.MRImageStorage,
                "DX": uid.DigitalXRayImageStorageForPresentation}


def _base_dataset(sop_class: str, sop_uid: str, study: dict, series_number: int,
                  transfer_syntax: str) -> pydicom.Dataset:
  ds = pydicom.Dataset()
  ds.file_meta = pydicom.dataset.FileMetaDataset()
  ds.file_meta.MediaStorageSOPClassUID = sop_class
  ds.file_meta.MediaStorageSOPInstanceUID = sop_uid
  ds.file_meta.TransferSyntaxUID = transfer_syntax
  ds.SOPClassUID, ds.SOPInstanceUID = sop_class, sop_uid
  for key, value in study["patient"].items():
    setattr(ds, key, value)
  ds.StudyInstanceUID, ds.StudyDate, ds.StudyTime = study["uid"], study["date"], study["time"]
  ds.AccessionNumber, ds.StudyID = study["accession"], study["study_id"]
  ds.ReferringPhysicianName = study["referrer"]
  ds.Manufacturer = "MEDJAX SYNTHETIC"
  ds.SeriesInstanceUID = uid.generate_uid(entropy_srcs=[sop_uid, "series"])
  ds.SeriesNumber, ds.InstanceNumber = series_number, 1
  return ds


def image_dataset(v_HxW: np.ndarray, variant: dict, sop_uid: str, study: dict,
                  series_number: int) -> pydicom.Dataset:
  """A single-frame image dataset of value image `v_HxW` with the header `variant`."""
  modality = variant["modality"]
  ts = TRANSFER_SYNTAXES[variant["transfer_syntax"]]
  native = variant["transfer_syntax"] in _UNCOMPRESSED
  ds = _base_dataset(_SOP_CLASSES[modality], sop_uid, study, series_number,
                     ts if native else uid.ExplicitVRLittleEndian)  # compress() sets it.
  resc = RESCALES[variant["rescale"]]
  ds.Modality = modality
  ds.BodyPartExamined = "CHEST"
  ds.ImageType = ["ORIGINAL", "PRIMARY", "AXIAL" if modality == "CT" else "OTHER"]
  ds.Rows, ds.Columns = v_HxW.shape
  ds.PixelSpacing = [f"{400 / v_HxW.shape[0]:.4f}"] * 2
  ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, variant["photometric"]
  ds.BitsAllocated, ds.BitsStored = 16, resc.bits_stored
  ds.HighBit, ds.PixelRepresentation = resc.bits_stored - 1, 0
  if modality == "DX":
    ds.PresentationIntentType = "FOR PRESENTATION"
  if resc.slope is not None:
    ds.RescaleSlope, ds.RescaleIntercept = f"{resc.slope:g}", f"{resc.intercept:g}"
    ds.RescaleType = "HU"
  if variant["window"]:  # Exactly the map r -> (r - r_air) / (r_marker - r_air).
    r_marker = resc.r_air + resc.per_hu * (MARKER_HU - AIR_HU)
    ds.WindowCenter = f"{(resc.r_air + r_marker) / 2 + 0.5:g}"
    ds.WindowWidth = f"{r_marker - resc.r_air + 1:g}"
  if variant["padding"]:
    ds.PixelPaddingValue = resc.padding
  stored_HxW = stored_values(v_HxW, variant)
  if native:
    ds.PixelData = stored_HxW.astype("<u2").tobytes()
  else:  # Lossless encoders; keep the instance UID (the default would draw a random one).
    ds.compress(ts, stored_HxW, generate_instance_uid=False)
  return ds


def sr_dataset(sop_uid: str, study: dict, text: str) -> pydicom.Dataset:
  """A Basic Text SR document (no pixels) in `study`: a file ingest must quarantine."""
  ds = _base_dataset(_BASIC_TEXT_SR, sop_uid, study, 99, uid.ExplicitVRLittleEndian)
  ds.Modality, ds.ValueType = "SR", "CONTAINER"
  ds.CompletionFlag, ds.VerificationFlag = "COMPLETE", "UNVERIFIED"
  concept = pydicom.Dataset()
  concept.CodeValue, concept.CodingSchemeDesignator = "18782-3", "LN"
  concept.CodeMeaning = "Radiology Study observation"
  ds.ConceptNameCodeSequence = pydicom.Sequence([concept])
  item = pydicom.Dataset()
  item.RelationshipType, item.ValueType, item.TextValue = "CONTAINS", "TEXT", text
  item.ConceptNameCodeSequence = pydicom.Sequence([concept])
  ds.ContentSequence = pydicom.Sequence([item])
  return ds


def _patients_phi(patient_ids: np.ndarray, rng: np.random.Generator) -> list[dict]:
  """PHI-like header fields per patient (what ingest must never let through)."""
  n = len(patient_ids)
  sex_N = rng.choice(["F", "M"], n)
  sur_N, giv_N = rng.integers(0, len(_SURNAMES), n), rng.integers(0, 8, n)
  mid_N, inst_N = rng.integers(-4, 26, n), rng.integers(0, len(_INSTITUTIONS), n)
  born_N = np.datetime64("1935-01-01") + rng.integers(0, 70 * 365, n).astype("timedelta64[D]")
  out = []
  for i in range(n):
    name = f"{_SURNAMES[sur_N[i]]}^{_GIVEN[sex_N[i]][giv_N[i]]}"
    if mid_N[i] >= 0:  # Some names carry a middle initial: 'DOE^JANE^M'.
      name += "^" + chr(ord("A") + int(mid_N[i]))
    out.append({"PatientName": name, "PatientID": str(patient_ids[i]), "PatientSex": sex_N[i],
                "PatientBirthDate": str(born_N[i]).replace("-", ""),
                "InstitutionName": _INSTITUTIONS[inst_N[i]]})
  return out


class _Writer:
  """Allocates random study folders and deterministic UIDs, and writes files."""

  def __init__(self, dicom_root: str, seed: int):
    self.root, self.seed = dicom_root, seed
    self.rng = np.random.default_rng(np.random.SeedSequence([seed, 2000]))
    self.folders: dict[str, int] = {}  # Folder -> next file index.

  def new_study(self, patient: dict, key: str) -> dict:
    folder = f"{self.rng.integers(0, 2 ** 48):012x}"
    while folder in self.folders:
      folder = f"{self.rng.integers(0, 2 ** 48):012x}"
    self.folders[folder] = 0
    os.makedirs(os.path.join(self.root, folder))
    date = np.datetime64("2018-01-01") + np.timedelta64(int(self.rng.integers(0, 2400)), "D")
    seconds = int(self.rng.integers(7 * 3600, 20 * 3600))
    return {"folder": folder, "patient": patient,
            "uid": uid.generate_uid(entropy_srcs=[str(self.seed), "study", key]),
            "date": str(date).replace("-", ""),
            "time": f"{seconds // 3600:02d}{seconds // 60 % 60:02d}{seconds % 60:02d}",
            "accession": f"A{self.rng.integers(10 ** 7, 10 ** 8)}",
            "study_id": f"{self.rng.integers(1, 10 ** 5)}", "referrer": "ROE^RICHARD^DR"}

  def next_path(self, study: dict) -> str:
    k = self.folders[study["folder"]]
    self.folders[study["folder"]] = k + 1
    return f"{study['folder']}/{k}.dcm"

  def sop_uid(self, rel_path: str) -> str:
    return uid.generate_uid(entropy_srcs=[str(self.seed), "sop", rel_path])

  def save(self, ds: pydicom.Dataset, rel_path: str) -> None:
    _save(ds, self.root, rel_path)


def _save(ds: pydicom.Dataset, root: str, rel_path: str) -> None:
  ds.save_as(os.path.join(root, rel_path), enforce_file_format=True)


def write_dicom(cohort, dicom_root: str, cfg, processes: int | None = None) -> dict:
  """Writes every patient's images and `cfg.junk_files` junk files under `dicom_root`.

  The files' contents and names are planned here and written by `processes` processes (default:
  one per core, or this process alone for fewer than MIN_POOL_FILES files), the same bytes
  however many.

  Returns:
    Stats: 'images' (one dict per image file: path relative to the cohort root, patient_id,
    image_index, header variant), 'junk' (path, kind), 'num_image_files', 'variants' (counts).
  """
  os.makedirs(dicom_root)
  # openjpeg logs every encoded tile at INFO; keep the run's log readable.
  openjpeg_log = logging.getLogger("openjpeg")
  level = openjpeg_log.level
  openjpeg_log.setLevel(max(level, logging.WARNING))
  try:
    return _write_all(cohort, dicom_root, cfg, processes)
  finally:
    openjpeg_log.setLevel(level)


# Fewer image files than this are written in the calling process: a pool's start costs more.
MIN_POOL_FILES = 256


def _write_all(cohort, dicom_root: str, cfg, processes: int | None) -> dict:
  writer = _Writer(dicom_root, cfg.seed)
  phi = _patients_phi(cohort.patient_ids, np.random.default_rng(
      np.random.SeedSequence([cfg.seed, 2001])))
  num_files = int(cohort.num_images.sum())
  variants = plan_headers(num_files, cfg.headers, np.random.default_rng(
      np.random.SeedSequence([cfg.seed, 2002])))
  images, jobs, f = [], [], 0
  for i in np.nonzero(cohort.num_images)[0]:   # the plan: studies, names, UIDs, in order
    files, studies = [], {}  # One study per modality per patient, each image its own series.
    for j in range(int(cohort.num_images[i])):
      var = variants[f]
      f += 1
      if var["modality"] not in studies:
        studies[var["modality"]] = writer.new_study(
            phi[i], f"{cohort.patient_ids[i]}/{var['modality']}")
      study = studies[var["modality"]]
      rel = writer.next_path(study)
      files.append((var, writer.sop_uid(rel), study, j + 1, rel))
      images.append(dict(var, path=f"dicom/{rel}", patient_id=str(cohort.patient_ids[i]),
                         image_index=j, study=study))
    jobs.append((cohort.image_latents[i, :len(files)], cfg.image_size, dicom_root, files))
  if processes is None:
    processes = pools.cores() if num_files >= MIN_POOL_FILES else 1
  _write_jobs(jobs, num_files, processes)
  junk = _write_junk(writer, images, cfg)
  for im in images:
    del im["study"]
  counts = {k: dict(collections.Counter(str(im[k]) for im in images))
            for k in ("photometric", "window", "padding", "rescale", "transfer_syntax",
                      "modality")}
  return {"num_image_files": len(images), "images": images, "junk": junk, "variants": counts}


def write_patient(job: tuple) -> int:
  """Writes one patient's planned image files (a pool's job); returns how many."""
  latents_BxE, image_size, root, files = job
  v_BxHxW = render_hu(latents_BxE, image_size)
  for k, (variant, sop_uid, study, series_number, rel) in enumerate(files):
    _save(image_dataset(v_BxHxW[k], variant, sop_uid, study, series_number), root, rel)
  return len(files)


def _write_jobs(jobs: list[tuple], num_files: int, processes: int,
                write: typing.Callable[[tuple], int] = write_patient) -> None:
  """Runs `write` on every job, in a pool of `processes` (the data layer's forkserver,
  `medjax.data.pools`) or here; logs progress every 10 s."""
  t0 = last_log = time.perf_counter()
  written = 0

  def progress(n: int) -> None:
    nonlocal written, last_log
    written += n
    if time.perf_counter() - last_log > 10:
      last_log = time.perf_counter()
      logging.info("synthetic dicom: %d / %d image files (%.0f files/s)", written, num_files,
                   written / (last_log - t0))

  with pools.Pool(processes if len(jobs) > 1 else 1, "synthetic dicom: a writing process died; "
                  "writing the rest in this process") as pool:
    for n in pool.map(write, jobs, chunksize=max(1, len(jobs) // (8 * pool.processes))):
      progress(n)


_JUNK_KINDS = ("sr_report", "truncated", "no_patient_id", "text")


def _write_junk(writer: _Writer, images: list[dict], cfg) -> list[dict]:
  """Extra files ingest must quarantine; none is the only image of a patient."""
  rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, 2003]))
  explicit = [im for im in images if im["transfer_syntax"] == "explicit"] or images
  out = []
  for k in range(cfg.junk_files):
    kind = _JUNK_KINDS[k % len(_JUNK_KINDS)]
    if kind in ("sr_report", "truncated") and not images:
      kind = "no_patient_id"  # Nothing to attach a report to or to truncate.
    if kind == "sr_report":
      study = images[rng.integers(len(images))]["study"]
      rel = writer.next_path(study)
      writer.save(sr_dataset(writer.sop_uid(rel), study, "IMPRESSION: No acute findings."), rel)
    elif kind == "truncated":
      src = explicit[rng.integers(len(explicit))]
      rel = writer.next_path(src["study"])
      with open(os.path.join(writer.root, src["path"][len("dicom/"):]), "rb") as fin:
        data = fin.read()
      pixel_bytes = 2 * cfg.image_size ** 2
      with open(os.path.join(writer.root, rel), "wb") as fout:  # Cut inside the pixel data.
        fout.write(data[:len(data) - pixel_bytes // 2])
    elif kind == "no_patient_id":
      patient = {"PatientName": "QA^PHANTOM", "InstitutionName": _INSTITUTIONS[0]}
      study = writer.new_study(patient, f"phantom/{k}")
      rel = writer.next_path(study)
      variant = dict(photometric="MONOCHROME2", window=True, padding=False, rescale="ct",
                     transfer_syntax="explicit", modality="CT")
      v_HxW = render_hu(rng.standard_normal((1, cfg.image_latent_dim)), cfg.image_size)[0]
      writer.save(image_dataset(v_HxW, variant, writer.sop_uid(rel), study, 1), rel)
    else:
      rel = "README.txt" if k < len(_JUNK_KINDS) else f"notes_{k}.txt"
      with open(os.path.join(writer.root, rel), "w") as fout:
        fout.write("PACS export of the study cohort. Do not redistribute.\n")
    out.append({"path": f"dicom/{rel}", "kind": kind})
  return out
