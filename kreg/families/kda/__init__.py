"""KDA: chunkwise gated delta-rule linear attention prefill (Kimi Delta Attention).

``kda_prefill`` is imported on first use, so loading the registry (which imports this
package's plugin) does not pay for torch.
"""


def __getattr__(name):
    if name == "kda_prefill":
        from .api import kda_prefill

        return kda_prefill
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["kda_prefill"]
