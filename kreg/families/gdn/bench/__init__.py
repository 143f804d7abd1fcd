"""GDN's measurements, apart from the code that serves calls: the benchmark scenarios
(``scenario``: ``kreg bench gdn``, prefill; ``decode``: ``kreg bench gdn-decode``), run by the
harness in ``kreg.bench`` and fed the gate regimes of ``kreg.families.kda.bench.gate_regimes``
(one scalar gate per token and value head: the regimes' draws at K = 1). Nothing in the serving
path imports this package; ``plugin`` registers its scenarios lazily."""
