"""Triton interpreter support (``TRITON_INTERPRET=1``), used by the CPU numerics lane.

The interpreter must be chosen before kernels are imported, and kernels defined under it cannot be
compiled for a target in the same process: run interpreted numerics in their own process.
"""

from __future__ import annotations

import os


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def patch_interpreter() -> None:
    """Let loop bounds derived from program ids work under NumPy >= 2.

    Triton 3.6's interpreter converts a scalar tensor to an index with ``int(array)``; its
    scalars are 1-element arrays, which NumPy 2 refuses to convert. Idempotent.
    """
    from triton.runtime import interpreter as interp

    if getattr(interp._patch_lang_tensor, "_kreg_patched", False):
        return
    original = interp._patch_lang_tensor

    def patched(tensor, scope):
        original(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    patched._kreg_patched = True
    interp._patch_lang_tensor = patched
