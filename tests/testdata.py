"""Real DICOM test files shipped with pydicom and the pydicom-data package, for tests.

Nothing here downloads: pydicom's `get_testdata_file` fetches unknown names over the network,
so files are looked up in the two local directories only.
"""

from __future__ import annotations

import glob
import os

import pydicom

try:
  import data_store  # the pydicom-data package
except ImportError:  # tests that need its files fail with the message in `dicom_test_file`
  data_store = None

PYDICOM_DIR = os.path.join(os.path.dirname(pydicom.__file__), "data", "test_files")
PYDICOM_DATA_DIR = (os.path.join(os.path.dirname(data_store.__file__), "data")
                    if data_store is not None else None)


def _dirs() -> list[str]:
  return [d for d in (PYDICOM_DIR, PYDICOM_DATA_DIR) if d is not None]


def dicom_test_file(name: str) -> str:
  """Path of the test file `name` (e.g. 'MR_small.dcm') in pydicom's or pydicom-data's files.

  Raises:
    FileNotFoundError: if neither directory holds it.
  """
  for directory in _dirs():
    path = os.path.join(directory, name)
    if os.path.isfile(path):
      return path
  raise FileNotFoundError(
      f"DICOM test file {name!r} is in neither {PYDICOM_DIR} nor "
      f"{PYDICOM_DATA_DIR or '<pydicom-data not installed>'}; install pydicom-data "
      "(pip install pydicom-data) or pick a name from testdata.all_dicom_test_files()")


def all_dicom_test_files() -> list[str]:
  """Every *.dcm file in both directories, sorted by directory then name."""
  return [path for directory in _dirs()
          for path in sorted(glob.glob(os.path.join(directory, "*.dcm")))]
