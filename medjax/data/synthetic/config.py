"""Defaults of the `data.synthetic` config section (`medjax.data.synthetic`'s generator).

Only ml_collections: configs/default.py reads them, so every process that loads a config file
would otherwise import numpy and pydicom (~0.35 s on 2 cores) for the generator it rarely runs.
"""

from __future__ import annotations

import ml_collections

# The vital-sign channels the generator writes, in column order (config_check checks
# data.vitals_channels against them).
VITALS_CHANNELS = ("hr", "sbp", "dbp", "rr", "spo2", "temp")


def get_config() -> ml_collections.ConfigDict:
  """Defaults of the `data.synthetic` config section (paper cohort shape, test-sized)."""
  c = ml_collections.ConfigDict()
  c.seed = 0  # Patients, values, file headers and names.
  c.model_seed = 0  # Class means and loadings; the calibrated ceilings below are for seed 0.
  c.num_patients = 500  # 53_420 in the paper.
  c.num_classes = 37
  c.class_prior_exponent = 1.0  # prior_k ~ (k + 1)^-a.
  c.rare_twins = 3  # Rarest classes sharing h_shared means with common classes 0, 1, ...
  c.twin_offset = 5.0  # Distance of a twin's mean from its common twin's, along h_image.
  c.num_analytes = 43
  c.vitals_steps = 24
  c.image_size = 64
  c.max_images = 4
  c.mean_images = 3.2  # Per patient with imaging (the paper's profile); 1 + Binomial.
  # Latent model; separation and noise levels are calibrated by experiments/calibrate_synthetic.py.
  c.latent_dim_shared = 16
  c.latent_dim_image = 2
  c.class_rank_shared = 6  # Dims of h_shared along which class means differ.
  c.image_latent_dim = 8
  c.class_sep = 1.71  # Class means ~ N(0, class_sep^2 I).
  c.lab_noise = 0.87  # Per-analyte noise sd relative to the unit-norm signal loading.
  c.vitals_noise = 1.46  # Per hourly entry; vitals read only the class subspace.
  c.vitals_trend = 0.8  # Norm of the within-stay trend loading v_c relative to w_c.
  c.image_noise = 1.34  # Per-image noise sd; the mean of n images has sd image_noise / sqrt(n).
  # Missingness (fractions of patients unless noted).
  c.frac_no_images = 0.38
  c.frac_no_labs = 0.08
  c.frac_partial_labs = 0.22  # 1..max_missing_panels whole panels missing.
  c.max_missing_panels = 3
  c.frac_no_vitals = 0.15
  c.frac_missing_vitals_steps = 0.10  # Of hourly steps, for patients with vitals.
  c.frac_missing_vitals_cells = 0.02  # Of channels within an observed step.
  # Files.
  c.junk_files = 4  # Cycles: SR report, truncated image, image without PatientID, text file.
  c.headers = header_config()
  return c


def header_config() -> ml_collections.ConfigDict:
  """Defaults of `data.synthetic.headers`: fractions of image files per header variant."""
  c = ml_collections.ConfigDict()
  c.frac_monochrome1 = 0.25
  c.frac_no_window = 0.3
  c.frac_padding = 0.2
  c.frac_dx = 0.5  # Of 'raw' files: Digital X-Ray, the others MR.
  c.rescale = ml_collections.ConfigDict({"ct": 0.5, "ct_half": 0.2, "raw": 0.3})
  c.transfer_syntax = ml_collections.ConfigDict({
      "explicit": 0.4, "implicit": 0.12, "deflated": 0.12, "rle": 0.12, "jpeg_ls": 0.12,
      "jpeg2000": 0.12})
  return c
