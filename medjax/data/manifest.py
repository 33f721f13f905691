"""The manifest: one row per patient, the only view of the cohort after ingest.

A manifest holds pseudonymous record ids (never raw PatientIDs), labels, which modalities each
record has, the image files to decode, a processing-cost estimate and the split. Everything
downstream (cache, placement, partitions, training) reads it; nothing downstream reads the raw
tables' patient identifiers.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

# Modality bits, in the order of `modality_mask` columns.
IMAGES, LABS, VITALS = 0, 1, 2
MODALITIES = ("I", "L", "V")
SPLITS = ("train", "val", "test")

# Cost model from the lineage paper (ms per record): 45 ms per image, 2 ms labs, 8 ms vitals.
IMAGE_COST_MS, LABS_COST_MS, VITALS_COST_MS = 45.0, 2.0, 8.0


def group_name(mask_3: np.ndarray | tuple[bool, bool, bool]) -> str:
  """'ILV', 'IL', ..., 'V' for a modality mask; '' when nothing is present."""
  return "".join(m for m, present in zip(MODALITIES, mask_3) if present)


def group_names() -> list[str]:
  """The seven non-empty modality subsets, indexed by their bitmask (1..7) minus one."""
  return [group_name(((g >> 0) & 1, (g >> 1) & 1, (g >> 2) & 1)) for g in range(1, 8)]


def expected_cost(modality_mask_Nx3: np.ndarray, num_images_N: np.ndarray) -> np.ndarray:
  """Expected processing cost per record in ms (the lineage paper's profile)."""
  m = modality_mask_Nx3.astype(np.float32)
  return (IMAGE_COST_MS * num_images_N * m[:, IMAGES] + LABS_COST_MS * m[:, LABS]
          + VITALS_COST_MS * m[:, VITALS]).astype(np.float32)


@dataclasses.dataclass
class Manifest:
  """Per-patient rows, as parallel arrays.

  Attributes:
    record_ids: (N,) pseudonymous ids, e.g. 'r-3fa1c0...'.
    labels: (N,) int32 class index into `class_names`.
    modality_mask: (N, 3) bool, columns images, labs, vitals.
    num_images: (N,) int32 image count (frames count as images), capped by nothing.
    cost: (N,) float32 expected processing cost in ms.
    split: (N,) '<U5' one of SPLITS.
    image_files: N lists of image paths relative to the data root.
    class_names: class index -> name.
  """
  record_ids: np.ndarray
  labels: np.ndarray
  modality_mask: np.ndarray
  num_images: np.ndarray
  cost: np.ndarray
  split: np.ndarray
  image_files: list[list[str]]
  class_names: list[str]
  # Values computed from the rows once per manifest (e.g. ring positions per seed): `derived`.
  _derived: dict = dataclasses.field(default_factory=dict, init=False, repr=False,
                                     compare=False)

  def __post_init__(self):
    n = len(self.record_ids)
    for name in ("labels", "modality_mask", "num_images", "cost", "split"):
      if len(getattr(self, name)) != n:
        raise ValueError(f"manifest: {name} has {len(getattr(self, name))} rows, record_ids {n}")
    if len(self.image_files) != n:
      raise ValueError(f"manifest: image_files has {len(self.image_files)} rows, record_ids {n}")

  def __len__(self) -> int:
    return len(self.record_ids)

  def derived(self, key, make):
    """`make()`, computed once for this manifest and `key`; callers must not mutate the rows."""
    if key not in self._derived:
      self._derived[key] = make()
    return self._derived[key]

  @property
  def groups(self) -> np.ndarray:
    """(N,) int modality-group bitmask: 1 images, 2 labs, 4 vitals (1..7)."""
    m = self.modality_mask.astype(np.int64)
    return m[:, IMAGES] | (m[:, LABS] << 1) | (m[:, VITALS] << 2)

  def indices(self, split: str) -> np.ndarray:
    """Row indices of one split, in manifest order."""
    if split not in SPLITS:
      raise ValueError(f"split {split!r} is not one of {SPLITS}")
    return np.flatnonzero(self.split == split)

  def row_fingerprint(self, i: int) -> str:
    """A string that changes whenever what record i decodes to could change."""
    return json.dumps([self.record_ids[i], self.modality_mask[i].tolist(), self.image_files[i]])

  def save(self, path: str) -> None:
    """Writes JSON lines (one row per patient) atomically; class names go in the first line."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
      f.write(json.dumps({"class_names": list(self.class_names)}) + "\n")
      for i in range(len(self)):
        f.write(json.dumps({
            "id": str(self.record_ids[i]),
            "label": int(self.labels[i]),
            # -1: no labels.csv (an ingest-only cohort); training refuses such a cohort.
            "label_name": self.class_names[self.labels[i]] if self.labels[i] >= 0 else None,
            "modalities": group_name(self.modality_mask[i]),
            "num_images": int(self.num_images[i]),
            "image_files": self.image_files[i],
            "cost_ms": round(float(self.cost[i]), 3),
            "split": str(self.split[i]),
        }) + "\n")
    os.replace(tmp, path)

  @classmethod
  def load(cls, path: str) -> "Manifest":
    with open(path) as f:
      header = json.loads(f.readline())
      rows = [json.loads(line) for line in f if line.strip()]
    return cls(
        record_ids=np.array([r["id"] for r in rows], dtype=object).astype(str),
        labels=np.array([r["label"] for r in rows], dtype=np.int32),
        modality_mask=np.array([[m in r["modalities"] for m in MODALITIES] for r in rows],
                               dtype=bool).reshape(-1, 3),
        num_images=np.array([r["num_images"] for r in rows], dtype=np.int32),
        cost=np.array([r["cost_ms"] for r in rows], dtype=np.float32),
        split=np.array([r["split"] for r in rows], dtype="<U5"),
        image_files=[list(r["image_files"]) for r in rows],
        class_names=list(header["class_names"]),
    )
