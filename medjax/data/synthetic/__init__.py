"""The synthetic cohort: real DICOM files and tables whose Bayes-optimal posterior is known.

  cohort   the generative model, sampling, the exact posterior, writing (the public API below)
  config   defaults of the config's data.synthetic section (ml_collections only)
  dicom    rendering the images, a realistic header mix, and junk files
  tables   writing labs.csv, vitals.csv, labels.csv and oracle.npz
"""

# The generator's API, loaded on first use: configs/default.py and the config check import
# `config`, and a launcher that only checks a config must not pay for numpy and pydicom.
_API = ("DISEASES", "IMAGES", "LABS", "VITALS", "VITALS_CHANNELS", "Cohort", "Model",
        "build_model", "canonical_image", "generate", "get_config", "log_posterior",
        "manifest_without_pixels", "posterior", "random_manifest", "sample_cohort",
        "write_cohort")


def __getattr__(name: str):
  if name in _API:
    from medjax.data.synthetic import cohort  # pylint: disable=import-outside-toplevel
    return getattr(cohort, name)
  raise AttributeError(f"module 'medjax.data.synthetic' has no attribute {name!r}")
