"""Writing a synthetic cohort's tables: labs.csv, vitals.csv, labels.csv and oracle.npz.

Byte-for-byte deterministic: fixed-decimal numbers (which re-parse exactly) and zip entries with
fixed timestamps.
"""

from __future__ import annotations

import io
import os
import zipfile

import numpy as np

from medjax.data import manifest


def _format_columns(values_NxC: np.ndarray, decimals_C) -> np.ndarray:
  """Fixed-decimal strings, '' for NaN (a value rounded to d decimals re-parses exactly)."""
  out = np.empty(values_NxC.shape, dtype=object)
  for j, dec in enumerate(decimals_C):
    col = values_NxC[:, j]
    out[:, j] = np.where(np.isnan(col), "", np.char.mod(f"%.{dec}f", col))
  return out


def _write_csv(path: str, header: list[str], cells_NxC: np.ndarray) -> None:
  with open(path, "w", newline="") as f:
    f.write(",".join(header) + "\n")
    f.writelines(",".join(row) + "\n" for row in cells_NxC.tolist())


def _write_npz(path: str, arrays: dict[str, np.ndarray]) -> None:
  """np.savez with fixed zip timestamps, so the same arrays give the same bytes."""
  with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
    for name, arr in arrays.items():
      buf = io.BytesIO()
      np.lib.format.write_array(buf, np.asarray(arr), allow_pickle=False)
      zf.writestr(zipfile.ZipInfo(name + ".npy", date_time=(1980, 1, 1, 0, 0, 0)),
                  buf.getvalue(), compress_type=zipfile.ZIP_DEFLATED)


def write_tables(cohort, root: str, vitals_channels) -> None:
  """Writes labs.csv, vitals.csv, labels.csv and oracle.npz under `root`."""
  m = cohort.model
  ids_N = cohort.patient_ids.astype(object)
  has_labs_N = cohort.modality_mask[:, manifest.LABS]
  cells = _format_columns(cohort.labs[has_labs_N], m.lab_decimals)
  _write_csv(os.path.join(root, "labs.csv"), ["patient_id"] + m.lab_names,
             np.concatenate([ids_N[has_labs_N, None], cells], axis=1))

  n, t, c = cohort.vitals.shape
  row_obs_NxT = ~np.all(np.isnan(cohort.vitals), axis=2)
  pi, ti = np.nonzero(row_obs_NxT)  # Patient-major, then hour.
  cells = _format_columns(cohort.vitals[pi, ti], [1] * c)
  _write_csv(os.path.join(root, "vitals.csv"), ["patient_id", "hour", *vitals_channels],
             np.concatenate([ids_N[pi, None], ti.astype(str).astype(object)[:, None], cells], 1))

  names_N = np.array(m.class_names, dtype=object)[cohort.labels]
  _write_csv(os.path.join(root, "labels.csv"), ["patient_id", "diagnosis"],
             np.stack([ids_N, names_N], axis=1))
  _write_npz(os.path.join(root, "oracle.npz"), {
      "patient_id": cohort.patient_ids, "posterior": cohort.posterior,
      "class_names": np.array(m.class_names), "prior": m.prior})
