"""``kreg::gdn_prefill``: GDN prefill as a ``torch.library`` custom op, and ``gdn_prefill_op``,
its wrapper with ``gdn_prefill``'s keywords and returns.

Made by KDA's factory (``kreg.families.kda.torch_op.make_prefill_op``): the schema, the fake
implementation, the checks and the wrapper are ``kreg::kda_prefill``'s (that module's docstring
says what the op serves, returns and refuses, and how to capture it in a CUDA graph); this op
differs only in its name, its family's candidates and its gate kind (a scalar gate, g
``[B, T, HV]``), which the fake implementation validates with. Registered when first used
(``kreg.families.gdn.gdn_prefill_op``), as KDA's.
"""

from __future__ import annotations

from kreg.families.kda.torch_op import make_prefill_op

from .selection import FAMILY_NAME

OP_NAME = "kreg::gdn_prefill"

gdn_prefill_op = make_prefill_op("gdn_prefill", FAMILY_NAME, "scalar")
