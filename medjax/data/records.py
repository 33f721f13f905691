"""One manifest row -> the fixed-shape arrays the model reads.

A record is a dict of numpy arrays:
  images_MxSxS   in [0, 1], up to M images (frames count as images), letterboxed to S x S: float32
                 as decoded, float16 in batches (IMAGE_DTYPE, as the cache stores them)
  image_mask_M   bool
  labs_L         raw lab values (NaN-free; 0 where missing)
  labs_mask_L    bool
  vitals_TxC     raw vital signs (0 where missing)
  vitals_mask_TxC bool
Batches stack records along a leading B axis and drop the per-record suffixes from the keys
(`images`, `image_mask`, ...). Normalisation by training-split statistics happens at batch time.
"""

from __future__ import annotations

import dataclasses
import os
import time

import numpy as np
from PIL import Image

from medjax.data.dicom import decoder as decoder_lib
from medjax.data.dicom import limits as dicom_limits

KEYS = ("images", "image_mask", "labs", "labs_mask", "vitals", "vitals_mask")
# Batches carry images as the cache stores them, and the model casts them to its dtype on the
# device: half the bytes of float32 to gather and copy to the device (16.8 MB of images in a
# batch of 512 paper records, not 33.6), and the same values, since every image was stored in
# float16.
IMAGE_DTYPE = np.float16


@dataclasses.dataclass(frozen=True)
class Shapes:
  image_size: int
  max_images: int
  num_analytes: int
  vitals_steps: int
  vitals_channels: int

  def as_dict(self) -> dict:
    return dataclasses.asdict(self)

  def record_shapes(self) -> dict[str, tuple[int, ...]]:
    s, m, l, t, c = (self.image_size, self.max_images, self.num_analytes, self.vitals_steps,
                     self.vitals_channels)
    return {"images": (m, s, s), "image_mask": (m,), "labs": (l,), "labs_mask": (l,),
            "vitals": (t, c), "vitals_mask": (t, c)}


def shapes_for(data_config, tables: dict[str, np.ndarray]) -> Shapes:
  """Record shapes from the config (images) and the ingested tables (labs, vitals)."""
  return Shapes(image_size=data_config.image_size, max_images=data_config.max_images,
                num_analytes=tables["labs"].shape[1], vitals_steps=tables["vitals"].shape[1],
                vitals_channels=tables["vitals"].shape[2])


def empty(shapes: Shapes, n: int) -> dict[str, np.ndarray]:
  """n all-missing records (padding), in batch dtypes."""
  return {k: np.zeros((n, *shape), bool if k.endswith("mask") else
                      IMAGE_DTYPE if k == "images" else np.float32)
          for k, shape in shapes.record_shapes().items()}


# Beyond this many pixels the padded square is not made (see `letterbox`).
_MAX_SQUARE = 1 << 24


def letterbox(image_HxW: np.ndarray, size: int) -> np.ndarray:
  """Pads to a square (keeping the aspect ratio) and resizes to size x size (area-averaging).

  An image whose square would hold more than 2**24 pixels (a 1 x 60000 strip: 14 GB as
  float32) is resized first, to its side's share of `size`, and padded after."""
  h, w = image_HxW.shape
  side = max(h, w)
  if side * side > _MAX_SQUARE:
    fit = (max(1, round(w * size / side)), max(1, round(h * size / side)))
    image_HxW = _resized(image_HxW, fit)
    h, w = image_HxW.shape
    side = size
  if (h, w) != (side, side):
    square = np.zeros((side, side), np.float32)
    top, left = (side - h) // 2, (side - w) // 2
    square[top:top + h, left:left + w] = image_HxW
    image_HxW = square
  if side == size:
    return image_HxW.astype(np.float32)
  return _resized(image_HxW, (size, size))


def _resized(image_HxW: np.ndarray, size_WH: tuple[int, int]) -> np.ndarray:
  shrinks = size_WH[0] < image_HxW.shape[1] or size_WH[1] < image_HxW.shape[0]
  out = Image.fromarray(image_HxW.astype(np.float32), "F").resize(
      size_WH, Image.BOX if shrinks else Image.BILINEAR)
  return np.clip(np.asarray(out, np.float32), 0.0, 1.0)


def decode(manifest, row: int, tables: dict[str, np.ndarray], data_root: str, shapes: Shapes,
           decoder: decoder_lib.Decoder | None = None
           ) -> tuple[dict[str, np.ndarray], list[dict], int]:
  """Decodes one record from shared storage.

  Args:
    decoder: budgets and decoder isolation (default: `decoder.default()`, config defaults).

  Returns:
    (record, rejected files as quarantine entries, bytes read from storage).
  """
  images, rejected, nbytes = decode_images(manifest.image_files[row], data_root, shapes, decoder)
  return with_tables(images, tables, row), rejected, nbytes


def decode_images(image_files, data_root: str, shapes: Shapes,
                  decoder: decoder_lib.Decoder | None = None
                  ) -> tuple[dict[str, np.ndarray], list[dict], int]:
  """A record's images ({'images', 'image_mask'}) from its files, the files rejected, and the
  bytes read."""
  decoder = decoder or decoder_lib.default()
  # A symlinked image must resolve inside the cohort (or its dicom/ folder, which may itself be
  # a link to another disk), as at scan time.
  roots = (data_root, os.path.join(data_root, "dicom"))
  images = np.zeros((shapes.max_images, shapes.image_size, shapes.image_size), np.float32)
  mask = np.zeros(shapes.max_images, bool)
  rejected, nbytes, slot = [], 0, 0
  for rel in image_files:
    if slot >= shapes.max_images:
      break
    path = os.path.join(data_root, rel)
    try:
      nbytes += os.path.getsize(path)
      # Only the frames this record has room for: a 600-slice volume in one file decodes 3.
      pixels = decoder.load_image(path, roots, frames=shapes.max_images - slot)
    except (dicom_limits.RejectedFile, OSError) as e:
      rejected.append({"path": rel, "stage": "decode", "reason": getattr(e, "reason", str(e))})
      continue
    frames = pixels[None] if pixels.ndim == 2 else pixels
    for frame in frames[:shapes.max_images - slot]:
      images[slot] = letterbox(frame, shapes.image_size)
      mask[slot] = True
      slot += 1
  return {"images": images, "image_mask": mask}, rejected, nbytes


def decode_images_timed(args: tuple) -> tuple[dict[str, np.ndarray], list[dict], int, float]:
  """`decode_images(*args)` and its seconds: a process pool's job (`medjax.data.cache.fill`)."""
  t0 = time.perf_counter()
  images, rejected, nbytes = decode_images(*args)
  return images, rejected, nbytes, time.perf_counter() - t0


def with_tables(images: dict[str, np.ndarray], tables: dict[str, np.ndarray],
                row: int) -> dict[str, np.ndarray]:
  """A whole record: its images and its table values (finite, 0 where missing) and masks."""
  record = dict(images)
  for key in ("labs", "vitals"):
    record[key + "_mask"] = tables[key + "_mask"][row].copy()
    record[key] = tables[key][row].astype(np.float32)
  return record


def stack(records: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  return {k: np.stack([r[k] for r in records]) for k in KEYS}


def zscore(key: str, values: np.ndarray, mask: np.ndarray,
           tables: dict[str, np.ndarray]) -> np.ndarray:
  """`values` of 'labs' or 'vitals' z-scored with the training split's statistics, float32, 0
  where `mask` says missing: what the model sees."""
  return np.where(mask, (values - tables[key + "_mean"]) / tables[key + "_std"], 0
                  ).astype(np.float32)


def normalize(batch: dict[str, np.ndarray], tables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
  """z-scores labs and vitals with the training split's statistics; 0 where missing."""
  out = dict(batch)
  for key in ("labs", "vitals"):
    out[key] = zscore(key, batch[key], batch[key + "_mask"], tables)
  return out
