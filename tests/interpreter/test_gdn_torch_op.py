"""``kreg::gdn_prefill`` custom op under the Triton interpreter (CPU tensors).

``test_kda_torch_op.py``'s checks on GDN's op (made by the same factory), with GDN's scalar gate
g ``[B, T, HV]`` (A_log and dt_bias ``[HV]``): the op's outputs equal ``gdn_prefill``'s bit for
bit (fp16 and fp32: bf16 is wrong in the interpreter); the fake implementation's shapes equal
the real ones and it selects on the problem ``gdn_prefill`` builds (a scalar gate's);
``torch.library.opcheck`` passes; ``torch.compile(fullgraph=True)`` (``aot_eager`` and
``eager``) gives the same result; the real implementation's errors name the argument.
"""

from __future__ import annotations

import pytest
from test_kda_torch_op import (  # same folder: pytest puts it on sys.path
    BITWISE,
    BITWISE_IDS,
    CASES,
    COMPILE,
    OPCHECK,
    Prefill,
    check_fake_shapes_equal_real,
    check_op_equals_entry,
    check_opcheck,
    check_real_impl_errors_name_the_argument,
    check_torch_compile_fullgraph,
)

from kreg.families.gdn import api
from kreg.families.gdn.torch_op import gdn_prefill_op
from kreg.registry.interpreter import interpreting

pytestmark = pytest.mark.skipif(
    not interpreting(),
    reason="needs TRITON_INTERPRET=1 (run by tests/test_kda_interpreter_lane.py)",
)

GDN = Prefill(api.gdn_prefill, gdn_prefill_op, "scalar")


@pytest.mark.parametrize("case, dtype", BITWISE, ids=BITWISE_IDS)
def test_op_equals_gdn_prefill_bitwise(case, dtype):
    check_op_equals_entry(GDN, case, dtype)


@pytest.mark.parametrize("case", list(CASES))
def test_fake_shapes_equal_real(case):
    check_fake_shapes_equal_real(GDN, case)


@pytest.mark.parametrize("case", OPCHECK)
def test_opcheck(case):
    check_opcheck(GDN, case)


@pytest.mark.parametrize("case, backend", COMPILE)
def test_torch_compile_fullgraph(case, backend):
    check_torch_compile_fullgraph(GDN, case, backend)


def test_real_impl_errors_name_the_argument():
    check_real_impl_errors_name_the_argument(GDN)
