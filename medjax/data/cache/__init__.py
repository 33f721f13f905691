"""The node-local decoded cache, who owns which record, and recaching when hosts change.

  store      the decoded-record cache in TensorStore (zarr) on the host's disk (API below)
  placement  which host owns (caches and trains on) each manifest row: bounded-load hashing
  recache    what each host caches in a generation, and the background recacher
"""

from medjax.data.cache.store import Cache
from medjax.data.cache.store import COUNTERS
from medjax.data.cache.disk import fingerprint
from medjax.data.cache.store import FORMAT_VERSION
from medjax.data.cache.store import TABLES
from medjax.data.cache.store import write_json
