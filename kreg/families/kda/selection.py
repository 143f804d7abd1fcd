"""The KDA family's name and its selection, apart from its registration (``plugin``), so that the
serving path (``api``) selects without importing the module that registers the measurements."""

from __future__ import annotations

FAMILY_NAME = "kda"


def select_kda(problem, target, **options):
    """The dispatcher's choice among the KDA candidates only: a plugin serving the same problem
    type never takes over KDA's calls, benchmarks, sweeps or pages."""
    from kreg.dispatch import select

    return select(problem, target, family=FAMILY_NAME, **options)
