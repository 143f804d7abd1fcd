"""GDN (Gated DeltaNet): gated delta-rule linear attention with one scalar gate per token and
value head. ``gdn_prefill`` is imported on first use, so loading the registry (which imports
this package's plugin) does not pay for torch."""


def __getattr__(name):
    if name == "gdn_prefill":
        from .api import gdn_prefill

        return gdn_prefill
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["gdn_prefill"]
