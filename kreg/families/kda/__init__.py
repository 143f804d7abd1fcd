"""KDA: chunkwise gated delta-rule linear attention prefill (Kimi Delta Attention).

``kda_prefill``, ``kda_prefill_op`` (the same call through the ``kreg::kda_prefill`` torch
custom op, registered when first used) and ``kda_prefill_cp`` (context parallel, over a
``torch.distributed`` process group) are imported on first use, so loading the registry (which
imports this package's plugin) does not pay for torch.
"""


def __getattr__(name):
    if name == "kda_prefill":
        from .api import kda_prefill

        return kda_prefill
    if name == "kda_prefill_op":
        from .torch_op import kda_prefill_op

        return kda_prefill_op
    if name == "kda_prefill_cp":
        from .context_parallel import kda_prefill_cp

        return kda_prefill_cp
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["kda_prefill", "kda_prefill_cp", "kda_prefill_op"]
