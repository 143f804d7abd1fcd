"""Drop-in shims for other libraries' entry points, routed to kreg's families.

``kreg.compat.fla``: ``chunk_kda`` and ``fused_recurrent_kda`` with fla-core 0.6.0's signatures
(what vLLM vendors). ``kreg.compat.sglang``: ``chunk_kda`` with SGLang's own extend signature
(a state pool updated in place, only ``o`` returned). Both run
``kreg.families.kda.kda_prefill`` (registry, dispatcher, kernels).
"""
