"""The GDN family's identity (its name, its ABI version) and its selection, apart from its
registration (``plugin``), as KDA's ``selection``."""

from __future__ import annotations

FAMILY_NAME = "gdn"
# bumped when a change makes earlier tuning entries and cost models meaningless
ABI_VERSION = 1


def select_gdn(problem, target, **options):
    """The dispatcher's choice among the GDN candidates only."""
    from kreg.dispatch import select

    return select(problem, target, family=FAMILY_NAME, **options)
