"""The benchmark harness behind ``kreg bench``: generic across families.

A family contributes a :class:`~kreg.registry.model.Scenario` whose ``cases()`` returns
:class:`BenchCase` values (cheap, no GPU) and whose ``run(cases, **options)`` calls
:func:`run_cases` with a ``prepare(case, target, device)`` function. ``prepare`` makes the inputs
of one case on the device and returns a :class:`Prepared`: the implementations to time (each a
closure over those inputs, host work done up front), how to read named outputs from a return
value, which implementations are the references every other one is checked against, and which
one is the peer the speed ratio is taken against: one per case (``Prepared.peer``), or one per
row (``Impl.peer``) when a case times like-with-like pairs (``Prepared.pairs``: a kreg row and
the peer row called with the same promise, each ratio taken within its pair).

Per case the runner (1) calls every implementation twice (compilation, autotuning and
allocator warm-up stay out of every measurement) and compares the named outputs by relative
RMS against each reference, (2) measures the peak device memory one call allocates beyond its
inputs and outputs, (3) the host overhead of one call (wall clock of the Python call, no
synchronisation inside the timed region, median), and (4) the device time: a CUDA graph of one
call replayed with the L2 cache flushed before every replay, median of many replays; an
implementation that cannot be captured falls back to ``triton.testing.do_bench`` (median).
A large device-to-device copy measured in the same run gives the bandwidth that the compulsory
bytes of every row are compared against.

:func:`write_results` writes ``results.json``, ``RESULTS.md`` and the sweep plot;
:func:`render` regenerates the last two from the JSON alone.

One module per stage: ``cases`` (what a family hands in), ``timing`` (one implementation's
device time, host overhead and memory), ``runner`` (a scenario's cases, compiled in worker
processes), ``results`` (the JSON on disk: written, merged, validated) and ``render``
(``RESULTS.md``, the plot, the summary line). This package re-exports what families, the CLI
and the benchmarks use.
"""

from .cases import (
    FLAG_REL_ERR,
    BenchCase,
    BenchError,
    Impl,
    Pair,
    Prepared,
    ResultsError,
    Skip,
    filter_cases,
    impl_selected,
)
from .render import (
    PLOT_NAME,
    markdown,
    pair_rows,
    plot_sweep,
    render,
    summary,
    sweep_series,
    table_rows,
    write_results,
)
from .results import merge_results, validate_results, write_json
from .runner import default_workers, precompile, precompile_named, run_cases
from .timing import (
    DEFAULT_BUDGET,
    QUICK_BUDGET,
    Budget,
    Timer,
    device_ms,
    environment,
    first_line,
    host_overhead_us,
    peak_extra_bytes,
    rel_rms,
    require_gpu,
    row_metrics,
)

__all__ = [
    "DEFAULT_BUDGET", "FLAG_REL_ERR", "PLOT_NAME", "QUICK_BUDGET", "BenchCase", "BenchError",
    "Budget", "Impl", "Pair", "Prepared", "ResultsError", "Skip", "Timer", "default_workers",
    "device_ms", "environment", "filter_cases", "first_line", "host_overhead_us",
    "impl_selected", "markdown", "merge_results", "pair_rows", "peak_extra_bytes", "plot_sweep",
    "precompile", "precompile_named", "rel_rms", "render", "require_gpu", "row_metrics",
    "run_cases", "summary", "sweep_series", "table_rows", "validate_results", "write_json",
    "write_results",
]  # fmt: skip
