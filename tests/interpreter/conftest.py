"""The interpreter lane: KDA numerics on CPU tensors under ``TRITON_INTERPRET=1``.

The interpreter must be chosen before the kernels are imported, and kernels defined under it
cannot be compiled for a target in the same process, so these modules only run in a process
started with ``TRITON_INTERPRET=1`` (``tests/test_kda_interpreter_lane.py`` starts one). In any
other process they are not collected at all.
"""

from __future__ import annotations

import os

if os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
    collect_ignore_glob = ["test_*.py"]
