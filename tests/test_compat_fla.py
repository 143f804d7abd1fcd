"""``kreg.compat.fla.chunk_kda`` without kernels: its signature is fla-core 0.6.0's, each fla flag
reaches ``kda_prefill`` as the mapped argument (a recorder stands in for ``api.run_prefill``,
``kda_prefill``'s body), and
every refusal is raised before any launch, naming its argument.

The outputs themselves (the shim equals ``kda_prefill`` bit for bit) are checked under the
interpreter: ``tests/interpreter/test_compat_fla.py``.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from kreg.compat import fla

# fla-core 0.6.0, fla/ops/kda/chunk.py, ``def chunk_kda``: (name, default) in order
# (q, k, v, g, beta have no default; ``**kwargs`` last)
FLA_060_PARAMS = [
    ("q", inspect.Parameter.empty),
    ("k", inspect.Parameter.empty),
    ("v", inspect.Parameter.empty),
    ("g", inspect.Parameter.empty),
    ("beta", inspect.Parameter.empty),
    ("scale", None),
    ("initial_state", None),
    ("output_final_state", False),
    ("use_qk_l2norm_in_kernel", False),
    ("use_gate_in_kernel", False),
    ("use_beta_sigmoid_in_kernel", False),
    ("allow_neg_eigval", False),
    ("safe_gate", False),
    ("lower_bound", None),
    ("disable_recompute", False),
    ("return_intermediate_states", False),
    ("state_v_first", False),
    ("cu_seqlens", None),
    ("cu_seqlens_cpu", None),
    ("cp_context", None),
    ("use_graph", False),
    ("max_num_seqs", None),
    ("kwargs", inspect.Parameter.empty),
]

B, T, H, HV, K, V = 1, 8, 1, 2, 32, 32


def inputs(B=B):
    gen = torch.Generator().manual_seed(0)
    return dict(
        q=torch.randn(B, T, H, K, generator=gen),
        k=torch.randn(B, T, H, K, generator=gen),
        v=torch.randn(B, T, HV, V, generator=gen),
        g=-torch.rand(B, T, HV, K, generator=gen),
        beta=torch.rand(B, T, HV, generator=gen),
    )


DEFAULTS = dict(
    scale=None, initial_state=None, output_final_state=False, gate_lower_bound=None,
    cu_seqlens=None, cu_seqlens_cpu=None, A_log=None, dt_bias=None, gate_activation="none",
    use_qk_l2norm=False, use_beta_sigmoid=False, state_layout="kv", trim_chunk_states=True,
)  # fmt: skip


@pytest.fixture
def recorded(monkeypatch):
    """Replace kda_prefill behind the shim; the list receives (args, kwargs) of each call. With
    chunk states it returns them as kda_prefill would: ``[rows, HV, K, V]``, rows the cue."""
    calls = []

    def record(*args, **kwargs):
        calls.append((args, kwargs))
        if kwargs.get("output_chunk_states"):
            return "o", "ht", torch.zeros(6, HV, K, V, dtype=kwargs["chunk_states_dtype"])
        return "o", "ht"

    monkeypatch.setattr(fla, "_run", record)
    return calls


def mapped(calls):
    ((args, kwargs),) = calls
    return kwargs


def test_signature_is_fla_060s():
    params = inspect.signature(fla.chunk_kda).parameters.values()
    assert [(p.name, p.default) for p in params] == FLA_060_PARAMS
    kinds = [p.kind for p in params]
    assert kinds[:-1] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * (len(kinds) - 1)
    assert kinds[-1] == inspect.Parameter.VAR_KEYWORD


def test_plain_call_maps_to_kda_prefill_defaults(recorded):
    x = inputs()
    assert fla.chunk_kda(**x) == ("o", "ht")
    ((args, kwargs),) = recorded
    assert all(a is b for a, b in zip(args, x.values(), strict=True))  # contiguous: no copy
    assert kwargs == DEFAULTS


def test_scale_is_positional_or_keyword(recorded):
    x = inputs()
    fla.chunk_kda(*x.values(), 0.25)
    fla.chunk_kda(**x, scale=0.25)
    assert [kw["scale"] for _, kw in recorded] == [0.25, 0.25]


A_LOG = torch.randn(HV)
DT_BIAS = torch.randn(HV * K)

MAPPINGS = {
    "l2norm_beta_sigmoid": (
        dict(use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True),
        dict(use_qk_l2norm=True, use_beta_sigmoid=True),
    ),
    "softplus_gate": (
        dict(use_gate_in_kernel=True, A_log=A_LOG, dt_bias=DT_BIAS),
        dict(gate_activation="softplus", A_log=A_LOG, dt_bias=DT_BIAS),
    ),
    "safe_gate_sigmoid_bound": (
        dict(use_gate_in_kernel=True, safe_gate=True, lower_bound=-5.0, A_log=A_LOG,
             dt_bias=DT_BIAS),
        dict(gate_activation="sigmoid_bound", gate_lower_bound=-5.0, A_log=A_LOG,
             dt_bias=DT_BIAS),
    ),
    # fla's gate kernel takes the sigmoid bound whenever lower_bound is set (USE_LOWER_BOUND),
    # and A_log may then be None
    "lower_bound_no_A_log": (
        dict(use_gate_in_kernel=True, lower_bound=-3.0, dt_bias=DT_BIAS),
        dict(gate_activation="sigmoid_bound", gate_lower_bound=-3.0, dt_bias=DT_BIAS),
    ),
    "safe_gate_promise": (
        dict(safe_gate=True, lower_bound=-5.0),
        dict(gate_lower_bound=-5.0),
    ),
    # without safe_gate (and no in-kernel gate) fla never reads lower_bound
    "lower_bound_alone_no_effect": (dict(lower_bound=-5.0), dict()),
    # fla ignores A_log / dt_bias without the in-kernel gate
    "gate_params_ignored": (dict(A_log=A_LOG, dt_bias=DT_BIAS), dict()),
    "state_v_first": (dict(state_v_first=True), dict(state_layout="vk")),
    "accepted_no_effect": (
        dict(disable_recompute=True, use_graph=True, max_num_seqs=4, chunk_size=32), dict()
    ),
    "final_state": (dict(output_final_state=True), dict(output_final_state=True)),
}  # fmt: skip


@pytest.mark.parametrize("name", MAPPINGS)
def test_mapping(recorded, name):
    given, expected = MAPPINGS[name]
    fla.chunk_kda(**inputs(), **given)
    assert mapped(recorded) == {**DEFAULTS, **expected}


def test_transpose_state_layout_is_served_with_fla_warning(recorded):
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        fla.chunk_kda(**inputs(), transpose_state_layout=True)
    assert mapped(recorded)["state_layout"] == "vk"


def test_varlen_offsets_and_state_pass_through(recorded):
    cu = torch.tensor([0, 3, 8])
    h0 = torch.randn(2, HV, K, V)
    fla.chunk_kda(**inputs(), initial_state=h0, cu_seqlens=cu, cu_seqlens_cpu=cu)
    kw = mapped(recorded)
    assert kw["cu_seqlens"] is cu and kw["cu_seqlens_cpu"] is cu and kw["initial_state"] is h0


def strided(t):
    """t's values in a view of stride 2 along the last dimension (not contiguous)."""
    return torch.stack([t, torch.zeros_like(t)], dim=-1).flatten(-2)[..., ::2]


def test_non_contiguous_inputs_pass_through_uncopied(recorded):
    """kda_prefill serves any strides (one copy there, merged with a head-dim padding): the
    shim adds no second copy."""
    x = {n: strided(t) for n, t in inputs().items()}  # stride 2
    h0 = torch.randn(1, HV, V, K).transpose(-1, -2)
    assert not any(t.is_contiguous() for t in (*x.values(), h0))
    fla.chunk_kda(**x, initial_state=h0)
    ((args, kwargs),) = recorded
    for got, want in zip((*args, kwargs["initial_state"]), (*x.values(), h0), strict=True):
        assert got is want


REJECTED = {
    "allow_neg_eigval": dict(allow_neg_eigval=True, use_beta_sigmoid_in_kernel=True),
    "disable_recompute": dict(return_intermediate_states=True, disable_recompute=True),
    "max_num_seqs_graph": dict(use_graph=True, cu_seqlens=torch.tensor([0, 3, 8]), max_num_seqs=3),
    "cp_context": dict(cp_context=object()),
    "chunk_size": dict(chunk_size=16),
    "A_log": dict(use_gate_in_kernel=True),
    "lower_bound": dict(use_gate_in_kernel=True, safe_gate=True, A_log=A_LOG),
    "transpose_state_layout": dict(state_v_first=True, transpose_state_layout=True),
    "use_gate_in_kernel": dict(use_gate_in_kernel=1),
    "state_v_first": dict(state_v_first="vk"),
    "max_num_seqs": dict(max_num_seqs=2.0),
}


@pytest.mark.parametrize("name", REJECTED)
def test_rejection_names_its_argument(recorded, name):
    with pytest.raises(ValueError, match=rf"^{name.removesuffix('_graph')}: "):
        fla.chunk_kda(**inputs(), **REJECTED[name])
    assert not recorded


@pytest.mark.parametrize(
    "B,extra,shape",
    [(1, dict(), (1, 6)), (2, dict(chunk_size=32), (2, 3)),
     (1, dict(cu_seqlens=torch.tensor([0, 3, 8])), (1, 6)),
     (1, dict(cu_seqlens=torch.tensor([0, 3, 8]), use_graph=True, max_num_seqs=2), (1, 6)),
     (1, dict(state_v_first=True), (1, 6))],
    ids=["fixed", "batch2_chunk32", "varlen", "varlen_graph", "v_first"],
)  # fmt: skip
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_return_intermediate_states_maps_to_chunk_states(recorded, B, extra, shape, dtype):
    """fla's h: chunk states every chunk_size tokens in q's dtype, [B, NT, HV, K, V]; the whole
    buffer (untrimmed) with use_graph and cu_seqlens, as fla's static chunk indices give."""
    x = {n: t.to(dtype) for n, t in inputs(B=B).items()}
    o, ht, h = fla.chunk_kda(**x, return_intermediate_states=True, **extra)
    kw = mapped(recorded)
    assert (kw["output_chunk_states"], kw["chunk_states_dtype"]) == (True, dtype)
    assert kw["chunk_states_size"] == extra.get("chunk_size", 64)
    assert kw["trim_chunk_states"] == (not extra.get("use_graph", False))
    assert h.shape == (*shape, HV, K, V) and h.dtype == dtype


@pytest.mark.parametrize("bound", [-5.5, 0.0])
def test_safe_gate_lower_bound_range(recorded, bound):
    with pytest.raises(ValueError, match=r"^lower_bound: .*\[-5, 0\)"):
        fla.chunk_kda(**inputs(), use_gate_in_kernel=True, safe_gate=True, lower_bound=bound,
                      A_log=A_LOG)  # fmt: skip


def test_unknown_kwargs_are_a_type_error(recorded):
    with pytest.raises(TypeError, match="A_logs, dtbias"):
        fla.chunk_kda(**inputs(), A_logs=A_LOG, dtbias=DT_BIAS)
    assert not recorded


def test_inputs_requiring_grad_are_refused():
    # the real kda_prefill: its gradient check runs before the device check and any launch
    x = inputs()
    x["q"].requires_grad_(True)
    with pytest.raises(ValueError, match=r"^q: requires grad"):
        fla.chunk_kda(**x)


def test_max_seqlen_is_kregs_extension(recorded):
    """The engines' bound of the longest sequence passes through (fla ignores the keyword)."""
    x = inputs()
    fla.chunk_kda(**x, cu_seqlens=torch.tensor([0, x["q"].shape[1]]), max_seqlen=5)
    assert mapped(recorded)["max_seqlen"] == 5
