"""``gdn_prefill_cp``: context parallel GDN prefill, one batch's token axis split over the ranks
of a ``torch.distributed`` process group. KDA's implementation (``kda.context_parallel``: the
planning, the one all-gather of the slices' affine maps, the incoming states), run with GDN's
scalar gate and its ``gdn.split`` candidate."""

from __future__ import annotations

from kreg.families.kda.context_parallel import CP_SIGNATURE, CpEntry, prefill_cp

from .selection import FAMILY_NAME

GDN = CpEntry(FAMILY_NAME, "scalar")


def gdn_prefill_cp(q, k, v, g, beta, *, group, cp_offsets=None, **options):
    """``gdn_prefill`` of one batch whose token axis is split over the ranks of ``group``: every
    argument, return, promise and error is ``kda_prefill_cp``'s (see its docstring), with
    ``gdn_prefill``'s scalar gate (g ``[B, T_r, HV]``, the slice's tokens; A_log and dt_bias
    ``[HV]``, the same on every rank). ``algorithm`` may be "auto" or "gdn.split"; chunk states
    and state pools are not served. ``plan_cp`` (``kda.context_parallel``) says which final
    states a rank returns."""
    return prefill_cp(GDN, q, k, v, g, beta, group, cp_offsets, options)


gdn_prefill_cp.__signature__ = CP_SIGNATURE
