"""``kreg.compat.sglang.chunk_kda`` without kernels: its signature is SGLang's own extend
kernel's, each argument reaches ``kda_prefill`` as mapped (a recorder stands in for
``api.run_prefill``), and every refusal is raised before any launch, naming its argument. Its
outputs and pool writes are checked against the float64 oracle by the engine replay
(``tests/interpreter/test_engine_replay.py``, ``sglang.extend``).
"""

from __future__ import annotations

import inspect

import pytest
import torch

from kreg.compat import sglang

# SGLang python/sglang/srt/layers/attention/fla/kda.py, ``def chunk_kda``: (name, default)
SGLANG_PARAMS = [
    ("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty), ("g", inspect.Parameter.empty),
    ("beta", inspect.Parameter.empty), ("scale", None), ("initial_state", None),
    ("initial_state_indices", None), ("use_qk_l2norm_in_kernel", False), ("cu_seqlens", None),
    ("A_log", None), ("dt_bias", None), ("lower_bound", None),
    ("output_intermediate_states", False), ("kwargs", inspect.Parameter.empty),
]  # fmt: skip
HV, K = 2, 32


def call_args():
    gen = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(1, 8, 1, K, generator=gen), k=torch.randn(1, 8, 1, K, generator=gen),
        v=torch.randn(1, 8, HV, K, generator=gen), g=torch.randn(1, 8, HV, K, generator=gen),
        beta=torch.rand(1, 8, HV, generator=gen), initial_state=torch.zeros(4, HV, K, K),
        initial_state_indices=torch.tensor([2, 0], dtype=torch.int32),
        cu_seqlens=torch.tensor([0, 3, 8], dtype=torch.int32),
    )  # fmt: skip


@pytest.fixture
def recorded(monkeypatch):
    calls = []

    def record(*args, **kwargs):
        calls.append(kwargs)
        return "o", "pool"

    monkeypatch.setattr(sglang, "_run", record)
    return calls


def test_signature_is_sglangs():
    params = inspect.signature(sglang.chunk_kda).parameters.values()
    assert [(p.name, p.default) for p in params] == SGLANG_PARAMS


def test_pool_in_place_v_first_and_o_only(recorded):
    x = call_args()
    assert sglang.chunk_kda(**x, use_qk_l2norm_in_kernel=True) == "o"
    [kw] = recorded
    assert kw["initial_state"] is x["initial_state"]
    assert kw["initial_state_indices"] is x["initial_state_indices"]
    assert kw["state_layout"] == "vk" and kw["output_final_state"] and kw["use_qk_l2norm"]
    assert kw["gate_activation"] == "none" and kw["gate_lower_bound"] is None


@pytest.mark.parametrize(("lower_bound", "activation"), [(None, "softplus"),
                                                         (-5.0, "sigmoid_bound")])  # fmt: skip
def test_a_log_activates_the_gate(recorded, lower_bound, activation):
    A_log, dt_bias = torch.zeros(1, 1, HV, 1), torch.zeros(HV * K)
    sglang.chunk_kda(**call_args(), A_log=A_log, dt_bias=dt_bias, lower_bound=lower_bound)
    [kw] = recorded
    assert kw["gate_activation"] == activation and kw["gate_lower_bound"] == lower_bound
    assert kw["A_log"] is A_log and kw["dt_bias"] is dt_bias


@pytest.mark.parametrize(
    ("change", "error", "message"),
    [
        (dict(output_intermediate_states=True), ValueError, "^output_intermediate_states: True"),
        (dict(initial_state=None), ValueError, "^initial_state: SGLang's chunk_kda updates"),
        (dict(initial_state_indices=None), ValueError, "^initial_state_indices: required"),
        (dict(dt_bias=torch.zeros(HV * K)), ValueError, "^dt_bias: given without A_log"),
        (dict(lower_bound=-5.0), ValueError, "^lower_bound: given without A_log"),
        (dict(use_qk_l2norm_in_kernel=1), ValueError, "^use_qk_l2norm_in_kernel: must be a bool"),
        (dict(track_state=torch.zeros(1)), TypeError, "track_state"),
    ],
)  # fmt: skip
def test_refusals_name_the_argument_before_any_launch(recorded, change, error, message):
    with pytest.raises(error, match=message):
        sglang.chunk_kda(**{**call_args(), **change})
    assert recorded == []
