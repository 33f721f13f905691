"""DICOM: files -> headers and float32 images in [0, 1]; anything unusable is a RejectedFile.

  files          headers without pixels, decoded images (the public API below)
  limits         budgets checked before a file is parsed or decoded; RejectedFile
  pixels         pixel arithmetic: stored values -> float32 in [0, 1]
  decoder        decoding where a crashing or runaway decoder costs one file, not the process
  decoder_child  the decoder's child process (`python -m medjax.data.dicom.decoder_child`)
  scan           a dicom/ folder -> each file's header or its quarantine entry (ingest's first step)
"""

from medjax.data.dicom.files import Header
from medjax.data.dicom.files import load_image
from medjax.data.dicom.files import load_image_if
from medjax.data.dicom.files import read_header
from medjax.data.dicom.limits import Budgets
from medjax.data.dicom.limits import check_path
from medjax.data.dicom.limits import RejectedFile
