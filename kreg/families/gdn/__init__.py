"""GDN (Gated DeltaNet): gated delta-rule linear attention with one scalar gate per token and
value head. ``gdn_prefill``, ``gdn_prefill_op`` (the same call through the
``kreg::gdn_prefill`` torch custom op, registered when first used) and ``gdn_prefill_cp``
(context parallel, over a ``torch.distributed`` process group) are imported on first use, so
loading the registry (which imports this package's plugin) does not pay for torch."""


def __getattr__(name):
    if name == "gdn_prefill":
        from .api import gdn_prefill

        return gdn_prefill
    if name == "gdn_prefill_op":
        from .torch_op import gdn_prefill_op

        return gdn_prefill_op
    if name == "gdn_prefill_cp":
        from .context_parallel import gdn_prefill_cp

        return gdn_prefill_cp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["gdn_prefill", "gdn_prefill_cp", "gdn_prefill_op"]
