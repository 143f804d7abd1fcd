"""``gdn_prefill``: the public entry point of the GDN family, bound to the one linear-attention
signature (``kda.api.PREFILL_SIGNATURE``) and served by the shared path (``kda.api.run_prefill``)
with a scalar gate and GDN's candidates."""

from __future__ import annotations

from kreg.families.kda.api import PREFILL_SIGNATURE, prefill_arguments, run_prefill

from .selection import FAMILY_NAME

_TENSORS = ("q", "k", "v", "g", "beta")


def gdn_prefill(q, k, v, g, beta, **options):
    """GDN prefill or decode step: ``kda_prefill``'s arguments and returns, with a scalar gate.

    g ``[B, T, HV]`` (log-decay, or the raw gate input with ``gate_activation``); with
    ``gate_activation="softplus"`` the decay is ``-exp(A_log) * softplus(g + dt_bias)``, A_log
    and dt_bias ``[HV]`` (any shape of HV elements), as Qwen3-Next's layer computes it. Every
    other argument, layout, promise and error is ``kda_prefill``'s (see its docstring):
    exact for any gate in [-inf, 0], causal and NaN-contained, varlen from device offsets,
    state pools in place, chunk states. ``algorithm``: "auto", "gdn.split", "gdn.recurrent" or
    "gdn.fused" (opt-in)."""
    arguments = prefill_arguments(q, k, v, g, beta, **options)
    rest = {name: value for name, value in arguments.items() if name not in _TENSORS}
    return run_prefill(q, k, v, g, beta, family=FAMILY_NAME, gate="scalar", **rest)


gdn_prefill.__signature__ = PREFILL_SIGNATURE
