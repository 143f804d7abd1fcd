"""How the support matrix probes a problem type: the dtypes and head dims it tries and the
options it turns on one at a time. Each problem type declares its own (a ``matrix_probe()``
classmethod returning a ``Probe``), beside its fields, so that a new problem type (a third
party's too) brings its probe with it; ``kreg.matrix`` only runs them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

# Head dims probed (K = V): the supported ones must show up, the others are reported unclaimed.
PROBE_HEAD_DIMS = (16, 32, 48, 64, 96, 128, 192, 256, 512)


@attrs.frozen
class Option:
    column: str  # matrix column it is reported in
    label: str
    overrides: dict  # problem fields set to probe it


@attrs.frozen
class Probe:
    """How to build probe problems of one problem type."""

    dtypes: tuple[str, ...]
    # (family, dtype, head_dim) -> the family's problem (its default options) of that dtype and
    # head dim, or raises ValueError
    make: Callable[[Any, str, int], Any]
    options: tuple[Option, ...]
    head_dims: tuple[int, ...] = PROBE_HEAD_DIMS
