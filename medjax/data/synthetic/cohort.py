"""Synthetic multi-modal cohort whose Bayes-optimal posterior is known exactly.

Generative model (all Gaussian, so every modality subset has a closed-form posterior):

  y ~ prior (Zipf-like long tail over `num_classes` diseases)
  h | y ~ N(mu_y, I_D),  h = [h_shared (S dims), h_image (D - S dims)]
  labs     x_L = A_L h_shared + N(0, sigma_L^2)                 one value per analyte
  vitals   x[t, c] = (w_c + (t / (T - 1) - 1/2) v_c) . h_shared + N(0, sigma_V^2)
  images   u_j = A_I h + N(0, sigma_I^2 I_E), j < n_images      rendered into DICOM pixels

Class means differ only along a few directions of h_shared (`class_rank_shared`) and along
h_image. Vitals and images read those directions; labs read all of h_shared; only images read
h_image. So every modality alone is informative and combining them saturates, in the pattern of
the lineage paper's Table IV (see experiments/calibrate_synthetic.py for the calibration). A few
rare classes ("twins") copy a common class's mean on h_shared: only images tell them apart.

Labs and vitals are written in clinical units (ref_mean + ref_sd * x) after rounding to the
CSV precision; the posterior is computed from those written values, the mean image latent and
exactly the entries a patient has. (Rounding adds < 1% to any entry's noise variance, which the
posterior ignores; it is exact for the values as written under the Gaussian model.)

`sample_cohort` builds a cohort in memory, `write_cohort` writes the on-disk input layout read by
ingest (see DESIGN.md, "Synthetic cohort"; DICOM writing is in `synthetic_dicom`), `generate` does
both. The generator reads the `data.synthetic` config section (`get_config`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import shutil
import time

import numpy as np

from medjax import errors
from medjax.data import manifest as manifest_lib
from medjax.data.synthetic import config as synthetic_config
from medjax.data.synthetic import dicom as synthetic_dicom
from medjax.data.synthetic import tables as synthetic_tables

IMAGES, LABS, VITALS = 0, 1, 2  # modality_mask columns, as in medjax.data.manifest.
VITALS_CHANNELS = synthetic_config.VITALS_CHANNELS
# Per channel: written value = base + scale * x (bpm, mmHg, mmHg, /min, %, degC).
_VITALS_BASE = np.array([82.0, 122.0, 74.0, 17.0, 96.5, 37.0])
_VITALS_SCALE = np.array([14.0, 16.0, 10.0, 3.5, 1.4, 0.5])

# Ordered common -> rare. The i-th rarest class is the twin of class i when rare_twins > i
# (pheochromocytoma mimics hypertension, LAM mimics COPD, amyloid mimics heart failure).
DISEASES = (
    "Essential hypertension", "Chronic obstructive pulmonary disease", "Heart failure",
    "Type 2 diabetes mellitus", "Community-acquired pneumonia", "Coronary artery disease",
    "Asthma", "Atrial fibrillation", "Chronic kidney disease", "Hypothyroidism",
    "Hyperlipidemia", "Acute kidney injury", "Sepsis", "Pulmonary embolism",
    "Iron deficiency anemia", "Acute myocardial infarction", "Deep vein thrombosis", "Cirrhosis",
    "Rheumatoid arthritis", "Hyperthyroidism", "Non-alcoholic fatty liver disease",
    "Interstitial lung disease", "Systemic lupus erythematosus", "Diabetic ketoacidosis",
    "Pulmonary hypertension", "Hypertrophic cardiomyopathy", "Acute pancreatitis", "Sarcoidosis",
    "Myocarditis", "Idiopathic pulmonary fibrosis", "ANCA-associated vasculitis",
    "Cushing syndrome", "Addison disease", "Systemic sclerosis", "Cardiac amyloidosis",
    "Lymphangioleiomyomatosis", "Pheochromocytoma")

# (panel, analyte, reference mean, reference sd) in conventional US units; 7 panels, 43 analytes.
_ANALYTES = (
    ("BMP", "Na", 140, 2.5), ("BMP", "K", 4.2, .35), ("BMP", "Cl", 103, 2.5),
    ("BMP", "HCO3", 25, 2), ("BMP", "BUN", 14, 2.3), ("BMP", "Creatinine", .95, .15),
    ("BMP", "Glucose", 100, 12), ("BMP", "Ca", 9.4, .4),
    ("CBC", "WBC", 7, 1.1), ("CBC", "RBC", 4.7, .4), ("CBC", "Hemoglobin", 14, 1.2),
    ("CBC", "Hematocrit", 42, 3.5), ("CBC", "MCV", 90, 4.5), ("CBC", "MCH", 30, 1.5),
    ("CBC", "MCHC", 34, 1), ("CBC", "RDW", 13.2, .8), ("CBC", "Platelets", 250, 40),
    ("CBC", "Neutrophils_pct", 60, 7),
    ("Liver", "ALT", 25, 4), ("Liver", "AST", 24, 4), ("Liver", "ALP", 80, 13),
    ("Liver", "Total_bilirubin", .7, .11), ("Liver", "Direct_bilirubin", .15, .025),
    ("Liver", "Albumin", 4.2, .3), ("Liver", "Total_protein", 7.1, .45), ("Liver", "GGT", 30, 5),
    ("Lipid", "Total_cholesterol", 190, 25), ("Lipid", "LDL", 110, 18), ("Lipid", "HDL", 55, 8),
    ("Lipid", "Triglycerides", 130, 21),
    ("Coag", "PT", 12.5, .7), ("Coag", "INR", 1, .08), ("Coag", "aPTT", 30, 3),
    ("Coag", "Fibrinogen", 300, 45), ("Coag", "D_dimer", 250, 40),
    ("Thyroid", "TSH", 2, .33), ("Thyroid", "Free_T4", 1.25, .17), ("Thyroid", "Free_T3", 3.1, .3),
    ("Cardiac", "Troponin_I", .02, .0033), ("Cardiac", "BNP", 60, 10), ("Cardiac", "CK_MB", 3, .5),
    ("Cardiac", "CRP", 3, .5), ("Cardiac", "ESR", 12, 2))

# Independent random streams, so e.g. changing the image noise leaves labels and labs unchanged.
_LABELS, _LATENT, _MISSING, _LABS_NOISE, _VITALS_NOISE, _IMAGE_NOISE, _IDS = range(7)


# The config section's defaults, in a module of their own that imports no numpy or pydicom: every
# config file reads them (configs/default.py), and a launcher should not pay for the generator.
get_config = synthetic_config.get_config


@dataclasses.dataclass
class Model:
  """Parameters of the generative model (loadings include the unit-variance gain).

  Attributes:
    class_names: K disease names.
    prior: (K,) class prior.
    means: (K, D) class means of h.
    twins: (rare, common) class pairs sharing means on h_shared.
    dim_shared: S, the leading dims of h read by labs and vitals.
    lab_names, lab_panels: L analyte names and their panel names.
    lab_ref_mean, lab_ref_sd, lab_decimals: (L,) written value = round(mean + sd * x, decimals).
    lab_loadings: (L, S); lab_noise_sd: (L,).
    vitals_loadings: (T, 6, S); vitals_noise_sd: (6,).
    image_loadings: (E, D); image_noise_sd: scalar, per image.
  """
  class_names: list[str]
  prior: np.ndarray
  means: np.ndarray
  twins: list[tuple[int, int]]
  dim_shared: int
  lab_names: list[str]
  lab_panels: list[str]
  lab_ref_mean: np.ndarray
  lab_ref_sd: np.ndarray
  lab_decimals: np.ndarray
  lab_loadings: np.ndarray
  lab_noise_sd: np.ndarray
  vitals_loadings: np.ndarray
  vitals_noise_sd: np.ndarray
  image_loadings: np.ndarray
  image_noise_sd: float


@dataclasses.dataclass
class Cohort:
  """A sampled cohort, values exactly as written to disk.

  Attributes:
    model: the generative model.
    patient_ids: (N,) 'MRN' + 7 digits.
    labels: (N,) int32 class index.
    modality_mask: (N, 3) bool, columns images, labs, vitals; every row has one True.
    num_images: (N,) int32, 0 without imaging.
    labs: (N, L) float64 in clinical units, NaN = not measured (whole panels, or all).
    vitals: (N, T, 6) float64 in clinical units, NaN = not observed.
    image_latents: (N, max_images, E) float64 u_j, NaN past num_images.
    latents: (N, D) the hidden h (for diagnostics only).
    posterior: (N, K) float64 p(y | everything observed).
  """
  model: Model
  patient_ids: np.ndarray
  labels: np.ndarray
  modality_mask: np.ndarray
  num_images: np.ndarray
  labs: np.ndarray
  vitals: np.ndarray
  image_latents: np.ndarray
  latents: np.ndarray
  posterior: np.ndarray

  def __len__(self) -> int:
    return len(self.labels)


def _rng(seed: int, stream: int) -> np.random.Generator:
  return np.random.default_rng(np.random.SeedSequence([seed, stream]))


def _unit_rows(x: np.ndarray) -> np.ndarray:
  return x / np.linalg.norm(x, axis=-1, keepdims=True)


def _check_config(cfg) -> None:
  fracs = ("frac_no_images", "frac_no_labs", "frac_partial_labs", "frac_no_vitals",
           "frac_missing_vitals_steps", "frac_missing_vitals_cells")
  for name in fracs:
    if not 0.0 <= cfg[name] <= 1.0:
      raise errors.InputError(
          f"config.data.synthetic.{name}={cfg[name]} is not a fraction in [0, 1]")
  if cfg.frac_no_labs + cfg.frac_partial_labs > 1.0:
    raise errors.InputError(
        "config.data.synthetic: frac_no_labs + frac_partial_labs exceeds 1; lower one")
  if not 1.0 <= cfg.mean_images <= cfg.max_images:
    raise errors.InputError(f"config.data.synthetic.mean_images={cfg.mean_images} must lie in "
                     f"[1, max_images={cfg.max_images}]")
  if cfg.num_classes < 2 or not 0 <= 2 * cfg.rare_twins <= cfg.num_classes:
    raise errors.InputError(
        f"config.data.synthetic: num_classes={cfg.num_classes} needs >= 2 classes "
        f"and >= 2 * rare_twins ({cfg.rare_twins})")
  if cfg.vitals_steps < 2 or cfg.num_analytes < 1 or cfg.num_patients < 1:
    raise errors.InputError("config.data.synthetic: need vitals_steps >= 2, num_analytes >= 1 and "
                     "num_patients >= 1")


def build_model(cfg) -> Model:
  """The generative model of `cfg` (depends on `cfg.model_seed`, not on `cfg.seed`)."""
  _check_config(cfg)
  rng = np.random.default_rng(np.random.SeedSequence([cfg.model_seed, 1000]))
  k, s = cfg.num_classes, cfg.latent_dim_shared
  d = s + cfg.latent_dim_image
  names = [DISEASES[i] if i < len(DISEASES) else f"Disease {i + 1}" for i in range(k)]
  prior_K = (np.arange(1, k + 1, dtype=np.float64)) ** -cfg.class_prior_exponent
  prior_K /= prior_K.sum()
  # Class means live in a basis_SxR subspace of h_shared plus all of h_image (module docstring).
  r = min(cfg.class_rank_shared, s)
  basis_SxR = np.linalg.qr(rng.standard_normal((s, r)))[0]
  means_KxD = cfg.class_sep * np.concatenate(
      [rng.standard_normal((k, r)) @ basis_SxR.T, rng.standard_normal((k, d - s))], axis=1)
  twins = [(k - 1 - i, i) for i in range(cfg.rare_twins)]
  for rare, common in twins:  # Same on h_shared; a fixed offset on h_image only.
    offset = _unit_rows(rng.standard_normal(d - s))
    means_KxD[rare] = np.concatenate([means_KxD[common, :s],
                                      means_KxD[common, s:] + cfg.twin_offset * offset])
  # Gains give each written standardized value roughly unit marginal variance.
  signal_var = 1.0 + cfg.class_sep ** 2

  n_lab = cfg.num_analytes
  table = [_ANALYTES[i] if i < len(_ANALYTES) else ("Extra", f"analyte_{i + 1}", 10.0, 1.5)
           for i in range(n_lab)]
  ref_mean_L = np.array([row[2] for row in table], np.float64)
  ref_sd_L = np.minimum([row[3] for row in table], ref_mean_L / 6)  # Keeps values positive.
  # A resolution of <= sd / 100 keeps rounding noise under 0.1% of the measurement noise.
  decimals_L = np.maximum(0, 2 - np.floor(np.log10(ref_sd_L))).astype(np.int64)
  lab_gain = 1.0 / np.sqrt(signal_var + cfg.lab_noise ** 2)
  lab_LxS = lab_gain * _unit_rows(rng.standard_normal((n_lab, s)))

  t = cfg.vitals_steps
  c = len(VITALS_CHANNELS)
  # Vitals read the class subspace only (lab rows also see the class-free dims of h_shared).
  w_CxS = _unit_rows(rng.standard_normal((c, r)) @ basis_SxR.T)
  v_CxS = cfg.vitals_trend * _unit_rows(rng.standard_normal((c, r)) @ basis_SxR.T)
  tau_T = np.arange(t) / (t - 1) - 0.5
  vit_TxCxS = w_CxS[None] + tau_T[:, None, None] * v_CxS[None]
  row_var_C = np.mean(np.sum(vit_TxCxS ** 2, axis=-1), axis=0)
  vit_gain_C = 1.0 / np.sqrt(row_var_C * signal_var + cfg.vitals_noise ** 2)

  # Images read h through the class subspace of h_shared and all of h_image.
  e = cfg.image_latent_dim
  view_RxD = np.zeros((r + d - s, d))
  view_RxD[:r, :s] = basis_SxR.T
  view_RxD[r:, s:] = np.eye(d - s)
  image_ExD = _unit_rows(rng.standard_normal((e, r + d - s)) @ view_RxD)
  img_gain = 1.0 / np.sqrt(signal_var + cfg.image_noise ** 2)
  return Model(
      class_names=names, prior=prior_K, means=means_KxD, twins=twins, dim_shared=s,
      lab_names=[row[1] for row in table], lab_panels=[row[0] for row in table],
      lab_ref_mean=ref_mean_L, lab_ref_sd=ref_sd_L, lab_decimals=decimals_L,
      lab_loadings=lab_LxS, lab_noise_sd=np.full(n_lab, lab_gain * cfg.lab_noise),
      vitals_loadings=vit_TxCxS * vit_gain_C[None, :, None],
      vitals_noise_sd=vit_gain_C * cfg.vitals_noise,
      image_loadings=img_gain * image_ExD,
      image_noise_sd=float(img_gain * cfg.image_noise))


def _sample_masks(cfg, model: Model, n: int):
  """Modality mask (N, 3), lab observed (N, L), vitals observed (N, T, 6), image counts (N,)."""
  rng = _rng(cfg.seed, _MISSING)
  mask_Nx3 = np.zeros((n, 3), bool)
  lab_state_N = np.zeros(n, np.int64)  # 0 none, 1 partial, 2 full.
  todo_N = np.ones(n, bool)
  while todo_N.any():  # Redraw the (rare) patients that would have no modality at all.
    m = int(todo_N.sum())
    r_N = rng.random(m)
    state = np.where(r_N < cfg.frac_no_labs, 0,
                     np.where(r_N < cfg.frac_no_labs + cfg.frac_partial_labs, 1, 2))
    lab_state_N[todo_N] = state
    mask_Nx3[todo_N] = np.stack([rng.random(m) >= cfg.frac_no_images, state > 0,
                                 rng.random(m) >= cfg.frac_no_vitals], axis=1)
    todo_N = ~mask_Nx3.any(axis=1)

  panels = list(dict.fromkeys(model.lab_panels))
  panel_L = np.array([panels.index(p) for p in model.lab_panels])
  max_missing = min(cfg.max_missing_panels, len(panels) - 1)  # Partial keeps >= 1 panel.
  draws_N = 1 + rng.integers(0, max(max_missing, 1), n)
  num_missing_N = np.where((lab_state_N == 1) & (max_missing >= 1), draws_N, 0)
  panel_rank_NxP = np.argsort(np.argsort(rng.random((n, len(panels))), axis=1), axis=1)
  panel_obs_NxP = (panel_rank_NxP >= num_missing_N[:, None]) & mask_Nx3[:, LABS:LABS + 1]
  lab_obs_NxL = panel_obs_NxP[:, panel_L]

  t, c = cfg.vitals_steps, len(VITALS_CHANNELS)
  step_obs_NxT = rng.random((n, t)) >= cfg.frac_missing_vitals_steps
  forced_N = rng.integers(0, t, n)
  step_obs_NxT[np.arange(n), forced_N] |= ~step_obs_NxT.any(axis=1)  # >= 1 observed step.
  cell_obs_NxTxC = rng.random((n, t, c)) >= cfg.frac_missing_vitals_cells
  forced_NxT = rng.integers(0, c, (n, t))
  empty_NxT = ~cell_obs_NxTxC.any(axis=2)  # An observed row carries >= 1 value.
  ni, ti = np.nonzero(empty_NxT)
  cell_obs_NxTxC[ni, ti, forced_NxT[ni, ti]] = True
  vit_obs_NxTxC = cell_obs_NxTxC & step_obs_NxT[:, :, None] & mask_Nx3[:, VITALS, None, None]

  p = (cfg.mean_images - 1) / max(cfg.max_images - 1, 1)
  num_images_N = np.where(mask_Nx3[:, IMAGES], 1 + rng.binomial(cfg.max_images - 1, p, n), 0)
  return mask_Nx3, lab_obs_NxL, vit_obs_NxTxC, num_images_N.astype(np.int32)


def sample_cohort(cfg) -> Cohort:
  """Samples a cohort in memory (no files); deterministic in `cfg`.

  Args:
    cfg: the `data.synthetic` ConfigDict (see `get_config`).

  Returns:
    A Cohort with values rounded exactly as `write_cohort` writes them and the exact posterior.
  """
  model = build_model(cfg)
  n, s = cfg.num_patients, model.dim_shared
  labels_N = _rng(cfg.seed, _LABELS).choice(len(model.prior), n, p=model.prior).astype(np.int32)
  h_NxD = model.means[labels_N] + _rng(cfg.seed, _LATENT).standard_normal(
      (n, model.means.shape[1]))
  mask_Nx3, lab_obs_NxL, vit_obs_NxTxC, num_images_N = _sample_masks(cfg, model, n)

  rng = _rng(cfg.seed, _LABS_NOISE)
  x_NxL = h_NxD[:, :s] @ model.lab_loadings.T + model.lab_noise_sd * rng.standard_normal(
      (n, len(model.lab_names)))
  labs_NxL = model.lab_ref_mean + model.lab_ref_sd * x_NxL
  for l, dec in enumerate(model.lab_decimals):
    labs_NxL[:, l] = np.round(labs_NxL[:, l], dec)
  labs_NxL[~lab_obs_NxL] = np.nan

  rng = _rng(cfg.seed, _VITALS_NOISE)
  x_NxTxC = np.einsum("ns,tcs->ntc", h_NxD[:, :s], model.vitals_loadings)
  x_NxTxC += model.vitals_noise_sd * rng.standard_normal(x_NxTxC.shape)
  vitals_NxTxC = np.round(_VITALS_BASE + _VITALS_SCALE * x_NxTxC, 1)
  vitals_NxTxC[~vit_obs_NxTxC] = np.nan

  rng = _rng(cfg.seed, _IMAGE_NOISE)
  u_NxE = h_NxD @ model.image_loadings.T
  u_NxMxE = u_NxE[:, None, :] + model.image_noise_sd * rng.standard_normal(
      (n, cfg.max_images, len(u_NxE[0])))
  u_NxMxE[np.arange(cfg.max_images)[None, :] >= num_images_N[:, None]] = np.nan

  mrn_N = _rng(cfg.seed, _IDS).choice(9_000_000, n, replace=False) + 1_000_000
  cohort = Cohort(model=model, patient_ids=np.array([f"MRN{m}" for m in mrn_N]),
                  labels=labels_N, modality_mask=mask_Nx3, num_images=num_images_N,
                  labs=labs_NxL, vitals=vitals_NxTxC, image_latents=u_NxMxE, latents=h_NxD,
                  posterior=np.zeros((n, len(model.prior))))
  cohort.posterior = posterior(cohort)
  return cohort


def _evidence(cohort: Cohort, rows: slice, use_Nx3: np.ndarray):
  """s = A^T D^-1 x_obs (N, D) and F = A^T D^-1 A (N, D, D) over the observed entries."""
  m = cohort.model
  s_dim, d = m.dim_shared, m.means.shape[1]
  n = len(use_Nx3)
  s_NxD = np.zeros((n, d))
  f_NxDxD = np.zeros((n, d, d))
  # Labs and vitals are both rows of x = A h_shared + noise; stack them as P observations.
  x_lab_NxL = (cohort.labs[rows] - m.lab_ref_mean) / m.lab_ref_sd
  x_vit_NxTC = ((cohort.vitals[rows] - _VITALS_BASE) / _VITALS_SCALE).reshape(n, -1)
  x_NxP = np.concatenate([np.where(use_Nx3[:, LABS:LABS + 1], x_lab_NxL, np.nan),
                          np.where(use_Nx3[:, VITALS:VITALS + 1], x_vit_NxTC, np.nan)], axis=1)
  a_PxS = np.concatenate([m.lab_loadings, m.vitals_loadings.reshape(-1, s_dim)])
  var_P = np.concatenate([m.lab_noise_sd ** 2, np.tile(m.vitals_noise_sd ** 2,
                                                       m.vitals_loadings.shape[0])])
  prec_NxP = np.where(np.isnan(x_NxP), 0.0, 1.0 / var_P)
  s_NxD[:, :s_dim] = (prec_NxP * np.nan_to_num(x_NxP)) @ a_PxS
  outer_PxSS = (a_PxS[:, :, None] * a_PxS[:, None, :]).reshape(len(a_PxS), -1)
  f_NxDxD[:, :s_dim, :s_dim] = (prec_NxP @ outer_PxSS).reshape(n, s_dim, s_dim)
  # Images: the mean latent over n images is sufficient, with noise variance sigma_I^2 / n.
  n_img_N = np.where(use_Nx3[:, IMAGES], cohort.num_images[rows], 0)
  u_NxMxE = cohort.image_latents[rows]
  ubar_NxE = np.where(n_img_N[:, None] > 0, np.nansum(u_NxMxE, axis=1), 0.0) / np.maximum(
      n_img_N, 1)[:, None]
  prec_N = n_img_N / m.image_noise_sd ** 2
  s_NxD += prec_N[:, None] * (ubar_NxE @ m.image_loadings)
  f_NxDxD += prec_N[:, None, None] * (m.image_loadings.T @ m.image_loadings)[None]
  return s_NxD, f_NxDxD


def log_posterior(cohort: Cohort, modality_mask_Nx3=None, chunk: int = 8192) -> np.ndarray:
  """Normalized log p(y | observed entries of the modalities kept), (N, K) float64."""
  m = cohort.model
  use_Nx3 = cohort.modality_mask
  if modality_mask_Nx3 is not None:
    use_Nx3 = use_Nx3 & np.broadcast_to(np.asarray(modality_mask_Nx3, bool), use_Nx3.shape)
  d = m.means.shape[1]
  out_NxK = np.empty((len(cohort), len(m.prior)))
  const_K = np.log(m.prior) - 0.5 * np.sum(m.means ** 2, axis=1)
  for start in range(0, len(cohort), chunk):
    rows = slice(start, start + chunk)
    s_NxD, f_NxDxD = _evidence(cohort, rows, use_Nx3[rows])
    # Marginalizing h ~ N(mu_y, I): log p(x | y) = -|mu|^2/2 + (s+mu)^T (I+F)^-1 (s+mu)/2 + c(x).
    r_NxDxK = s_NxD[:, :, None] + m.means.T[None]
    z_NxDxK = np.linalg.solve(np.eye(d) + f_NxDxD, r_NxDxK)
    logits_NxK = const_K + 0.5 * np.sum(r_NxDxK * z_NxDxK, axis=1)
    logits_NxK -= logits_NxK.max(axis=1, keepdims=True)
    out_NxK[rows] = logits_NxK - np.log(np.sum(np.exp(logits_NxK), axis=1, keepdims=True))
  return out_NxK


def posterior(cohort: Cohort, modality_mask_Nx3=None) -> np.ndarray:
  """Exact Bayes posterior p(y | x), (N, K) float64.

  Args:
    cohort: a sampled cohort.
    modality_mask_Nx3: optional bool mask (broadcastable to (N, 3), columns images, labs,
      vitals) of modalities to keep; a modality a patient lacks stays missing. A patient left with
      nothing gets the prior.
  """
  return np.exp(log_posterior(cohort, modality_mask_Nx3))


def manifest_without_pixels(num_patients: int, seed: int = 0, split=(0.7, 0.1, 0.2)):
  """A manifest of a sampled cohort (nothing written): for placement and planning at scale."""
  from medjax.data import ingest  # pylint: disable=import-outside-toplevel
  from medjax.data import manifest  # pylint: disable=import-outside-toplevel
  cfg = get_config()
  cfg.num_patients, cfg.seed = num_patients, seed
  cohort = sample_cohort(cfg)
  salt = f"manifest-without-pixels/{seed}".encode().ljust(16, b".")
  ids = np.array([ingest.pseudonym(p, salt) for p in cohort.patient_ids])
  mask = cohort.modality_mask
  num_images = cohort.num_images.astype(np.int32)
  return manifest.Manifest(
      record_ids=ids, labels=cohort.labels.astype(np.int32), modality_mask=mask,
      num_images=num_images, cost=manifest.expected_cost(mask, num_images),
      split=ingest.stratified_split(cohort.labels, ids, tuple(split), seed),
      image_files=[[] for _ in ids], class_names=list(cohort.model.class_names))


def canonical_image(u_E: np.ndarray, image_size: int) -> np.ndarray:
  """The image every written DICOM variant of latent `u_E` decodes to, float32 [H, W] in [0, 1]."""
  return synthetic_dicom.canonical_image(u_E, image_size)


def write_cohort(cohort: Cohort, root: str, cfg, processes: int | None = None) -> dict:
  """Writes the cohort's input layout under `root`.

  `root` must be absent, empty, or hold an earlier synthetic cohort (it has oracle.npz), which is
  replaced as a whole. Files are written to a sibling temporary folder and renamed into place
  at the end, so an interrupted run never leaves a half-written or mixed cohort behind.

  `processes`: the DICOM files' writing processes (`synthetic.dicom.write_dicom`; default: one
  per core for a cohort of `dicom.MIN_POOL_FILES` image files or more).

  Returns:
    Stats: counts, the written image files with their header variants ('images'), the junk
    files ingest must quarantine ('junk', paths relative to root) and timings in seconds.
  """
  root = os.path.abspath(root)
  if (os.path.isdir(root) and os.listdir(root)
      and not os.path.exists(os.path.join(root, "oracle.npz"))):
    raise FileExistsError(f"synthetic cohort root {root} holds files that are not a synthetic "
                          "cohort; remove them or pick another root")
  tmp = f"{root}.partial-{os.getpid()}"
  shutil.rmtree(tmp, ignore_errors=True)
  os.makedirs(tmp)
  t0 = time.perf_counter()
  synthetic_tables.write_tables(cohort, tmp, VITALS_CHANNELS)
  t1 = time.perf_counter()
  stats = synthetic_dicom.write_dicom(cohort, os.path.join(tmp, "dicom"), cfg, processes)
  t2 = time.perf_counter()
  if os.path.isdir(root):  # Empty, or an earlier synthetic cohort: move it aside, then drop it.
    old = f"{root}.old-{os.getpid()}"
    os.rename(root, old)
    os.rename(tmp, root)
    shutil.rmtree(old)
  else:
    os.rename(tmp, root)
  mask_Nx3 = cohort.modality_mask
  stats.update(
      num_patients=len(cohort), num_with_images=int(mask_Nx3[:, IMAGES].sum()),
      num_with_labs=int(mask_Nx3[:, LABS].sum()), num_with_vitals=int(mask_Nx3[:, VITALS].sum()),
      timings={"tables_s": t1 - t0, "dicom_s": t2 - t1, "total_s": t2 - t0})
  logging.info("synthetic cohort: %d patients, %d image files, %d junk files written to %s "
               "in %.1f s", len(cohort), stats["num_image_files"], len(stats["junk"]), root,
               t2 - t0)
  return stats


def generate(cfg, root: str, processes: int | None = None) -> dict:
  """Samples the cohort of `cfg` and writes it under `root` (`processes`: `write_cohort`'s);
  returns `write_cohort`'s stats."""
  t0 = time.perf_counter()
  cohort = sample_cohort(cfg)
  sample_s = time.perf_counter() - t0
  stats = write_cohort(cohort, root, cfg, processes)
  stats["timings"]["sample_s"] = sample_s
  return stats


def random_manifest(n: int, seed: int = 0, *, image_files: bool = True) -> manifest_lib.Manifest:
  """A manifest of n random records in the paper cohort's proportions, with no files behind it.

  37 long-tailed classes, ~38% without images, ~10% without labs, ~15% without vitals, 1-4
  images, 80/10/10 split: for placement and partition studies and tests. `image_files`: give each
  record made-up image paths (False: none; placement never reads them).
  """
  rng = np.random.default_rng(seed)
  p_C = 1.0 / np.arange(1, 38) ** 1.2
  labels_N = rng.choice(37, size=n, p=p_C / p_C.sum()).astype(np.int32)
  mask_Nx3 = np.stack([rng.random(n) >= 0.38, rng.random(n) >= 0.10, rng.random(n) >= 0.15], 1)
  mask_Nx3[~mask_Nx3.any(1), manifest_lib.LABS] = True
  images_N = np.where(mask_Nx3[:, manifest_lib.IMAGES], rng.integers(1, 5, n), 0).astype(np.int32)
  split_N = np.array(manifest_lib.SPLITS)[rng.choice(3, size=n, p=[0.8, 0.1, 0.1])]
  ids_N = np.array([f"r-{hashlib.sha256(f'{seed}/{i}'.encode()).hexdigest()[:16]}"
                    for i in range(n)])
  files = [[f"dicom/{ids_N[i]}/{k}.dcm" for k in range(images_N[i])] if image_files else []
           for i in range(n)]
  return manifest_lib.Manifest(
      record_ids=ids_N, labels=labels_N, modality_mask=mask_Nx3, num_images=images_N,
      cost=manifest_lib.expected_cost(mask_Nx3, images_N), split=split_N, image_files=files,
      class_names=[f"class-{k}" for k in range(37)])
