"""Repository-wide test setup: the persistent compile cache goes to a fresh temporary folder, and
routing by measurement is off.

torchburn's compile cache is on by default in the user's cache folder; tests (and the many
sessions CI runs) must neither write there nor reuse what another run left. A run that sets
``TORCHBURN_CACHE_DIR`` itself keeps its choice.

Routing (``torchburn.routing``) would move a partition that eager runs faster to eager PyTorch
after its first calls; the test suites check that the engines' kernels run and give eager's
results, so they run with ``TORCHBURN_ROUTING=off`` unless the run sets it (the routing tests set
``options={"routing": "measure"}`` themselves).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

os.environ.setdefault("TORCHBURN_ROUTING", "off")

if "TORCHBURN_CACHE_DIR" not in os.environ:
    _folder = tempfile.mkdtemp(prefix="torchburn-test-cache-")
    os.environ["TORCHBURN_CACHE_DIR"] = _folder
    atexit.register(shutil.rmtree, _folder, ignore_errors=True)
