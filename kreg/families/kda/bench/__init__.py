"""KDA's measurements, apart from the code that serves calls: the benchmark scenarios (``scenario``:
``kreg bench kda``; ``decode``: ``kda-decode``; ``grid``: ``kda-grid``; ``cp``: context parallel
under torchrun), the gate regimes they feed (``gate_regimes``), the spec sweep that fits the
cost model (``sweep``) and its held-out validation (``validate``). Nothing in the serving path
(``api``, ``launch``, ``plugin``'s candidates) imports this package; ``plugin`` registers its
scenarios lazily."""
