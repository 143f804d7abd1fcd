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
else:
    import pytest
    import torch

    _EMPTY, _EMPTY_LIKE = torch.empty, torch.empty_like

    def _poisoned(t):
        return t.fill_(float("nan")) if t.is_floating_point() else t

    @pytest.fixture(autouse=True)
    def nan_fresh_buffers(monkeypatch):
        """Every fresh float buffer starts NaN: an output element a kernel leaves unwritten shows
        up as NaN instead of passing with whatever a reused allocation held (a start state left
        unwritten once passed this way)."""
        monkeypatch.setattr(torch, "empty", lambda *a, **k: _poisoned(_EMPTY(*a, **k)))
        monkeypatch.setattr(torch, "empty_like", lambda *a, **k: _poisoned(_EMPTY_LIKE(*a, **k)))
