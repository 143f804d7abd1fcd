"""KDA: chunkwise gated delta-rule linear attention prefill (Kimi Delta Attention)."""

from .api import kda_prefill

__all__ = ["kda_prefill"]
