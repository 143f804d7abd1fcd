"""The KDA family's identity (its name, its ABI version) and its selection, apart from its
registration (``plugin``), so that the serving path (``api``) and the measurements select without
importing the module that registers them."""

from __future__ import annotations

FAMILY_NAME = "kda"
# bumped when a change makes earlier tuning entries and cost models meaningless
ABI_VERSION = 1


def select_kda(problem, target, **options):
    """The dispatcher's choice among the KDA candidates only: a plugin serving the same problem
    type never takes over KDA's calls, benchmarks, sweeps or pages."""
    from kreg.dispatch import select

    return select(problem, target, family=FAMILY_NAME, **options)
