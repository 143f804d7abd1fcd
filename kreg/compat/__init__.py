"""Drop-in shims for other libraries' entry points, routed to kreg's families.

``kreg.compat.fla.chunk_kda`` takes fla-core 0.6.0's ``fla.ops.kda.chunk_kda`` signature and runs
``kreg.families.kda.kda_prefill`` (registry, dispatcher, kernels).
"""
