"""``kreg::kda_prefill`` custom op: registration, schema, fake (meta) shapes, wrapper validation,
fake-mode tracing, and (``gpu``) CUDA graph capture.

The main process does not run the Triton interpreter, so nothing here executes a kernel on CPU:
the fake implementation runs under ``FakeTensorMode``. The op's numerics and ``torch.compile``
run in the interpreter lane (``tests/interpreter/test_kda_torch_op.py``).

The helpers take an ``Op`` (an entry, its op's wrapper, its gate kind), KDA's by default:
``tests/test_gdn_torch_op.py`` runs them on ``kreg::gdn_prefill``, made by the same factory.
"""

from __future__ import annotations

import inspect
from typing import NamedTuple

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from kreg.dispatch import select
from kreg.families import kda
from kreg.families.kda import api, torch_op
from kreg.families.kda.torch_op import kda_prefill_op
from kreg.registry import get_registry

FP16, FP32 = torch.float16, torch.float32


class Op(NamedTuple):
    """A family's prefill entry, the wrapper of its custom op, and its gate kind."""

    entry: object
    wrapper: object
    gate: str

    @property
    def raw(self):
        """The raw op, ``torch.ops.kreg.<entry>``."""
        return getattr(torch.ops.kreg, self.entry.__name__)


KDA = Op(api.kda_prefill, kda_prefill_op, "per_channel")


def fake_inputs(B=2, T=40, H=2, HV=None, K=32, V=32, dtype=FP16, device="cpu", gate="per_channel"):
    HV = HV or H
    return dict(
        q=torch.empty(B, T, H, K, dtype=dtype, device=device),
        k=torch.empty(B, T, H, K, dtype=dtype, device=device),
        v=torch.empty(B, T, HV, V, dtype=dtype, device=device),
        g=torch.empty(B, T, HV, *([K] if gate == "per_channel" else []), dtype=dtype,
                      device=device),
        beta=torch.empty(B, T, HV, dtype=dtype, device=device),
    )  # fmt: skip


def shapes(out):
    return [None if x is None else (tuple(x.shape), x.dtype) for x in out]


def test_registered_and_exported():
    assert hasattr(torch.ops.kreg, "kda_prefill")
    assert kda.kda_prefill_op is kda_prefill_op
    assert "kda_prefill_op" in kda.__all__
    schema = str(torch.ops.kreg.kda_prefill.default._schema)
    assert schema.startswith(
        "kreg::kda_prefill(Tensor q, Tensor k, Tensor v, Tensor g, Tensor beta"
    )
    for piece in ("float? scale=None", "Tensor? initial_state=None", "float? gate_lower_bound=None",
                  "Tensor? cu_seqlens_cpu=None", "str state_layout=\"kv\"", "str? target=None",
                  "-> (Tensor, Tensor, Tensor)"):  # fmt: skip
        assert piece in schema, piece
    # no mutation, no aliasing of inputs
    args = torch.ops.kreg.kda_prefill.default._schema.arguments
    assert not any(a.alias_info for a in args)
    # one default per option: the raw op's are kda_prefill's (a -5 bound here once made a
    # caller of the op promise bounded gates without knowing it)
    ref = inspect.signature(api.kda_prefill).parameters
    for a in args:
        if a.has_default_value() and a.name != "chunk_states_dtype":  # None there means fp32
            assert a.default_value == ref[a.name].default, a.name


def check_wrapper_mirrors_the_signature(op: Op):
    ref = inspect.signature(op.entry).parameters
    assert ref == api.PREFILL_SIGNATURE.parameters  # the one signature of every entry
    got = inspect.signature(op.wrapper).parameters
    assert list(got) == list(ref)
    for name, p in ref.items():
        assert got[name].kind == p.kind, name
        assert got[name].default == p.default, name
    # the raw op takes the same arguments in the same order, but for the state pool's (the
    # wrapper refuses them: the schema declares no mutated input)
    op_args = [a.name for a in op.raw.default._schema.arguments]
    assert op_args == [n for n in ref if n not in torch_op._POOL_ARGS]
    entry = op.entry.__name__
    assert op.wrapper.__name__ == f"{entry}_op" and f"``{entry}``" in op.wrapper.__doc__
    with pytest.raises(ValueError, match=f"^initial_state_indices: .*: call {entry}$"):
        op.wrapper(*[torch.zeros(1)] * 5, initial_state_indices=torch.zeros(1))


def test_wrapper_mirrors_kda_prefill_keywords():
    check_wrapper_mirrors_the_signature(KDA)


# --- fake implementation -------------------------------------------------------------------------


def run_fake(x, *, op: Op = KDA, **kw):
    """The raw op's and the wrapper's outputs on fake copies of ``x`` and ``kw``'s tensors."""
    with FakeTensorMode() as mode:
        fx = {name: mode.from_tensor(t) for name, t in x.items()}
        fkw = {n: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for n, t in kw.items()}
        raw = op.raw(**fx, **fkw)
        wrapped = op.wrapper(**fx, **fkw)
    return raw, wrapped


@pytest.mark.parametrize("dtype", [FP16, FP32, torch.bfloat16])
def test_fake_plain(dtype):
    x = fake_inputs(B=2, T=40, H=2, dtype=dtype)
    raw, wrapped = run_fake(x, output_final_state=True)
    assert shapes(raw) == [((2, 40, 2, 32), dtype), ((2, 2, 32, 32), FP32), ((0, 2, 32, 32), FP32)]
    assert shapes(wrapped) == shapes(raw[:2])
    assert all(isinstance(t, torch._subclasses.fake_tensor.FakeTensor) for t in raw)


def test_fake_gqa_and_unequal_head_dims():
    x = fake_inputs(B=1, T=40, H=2, HV=4, K=32, V=64)
    raw, wrapped = run_fake(x, output_final_state=True)
    assert shapes(raw) == [((1, 40, 4, 64), FP16), ((1, 4, 32, 64), FP32), ((0, 4, 32, 64), FP32)]
    assert shapes(wrapped) == shapes(raw[:2])


def test_fake_vk_layout():
    x = fake_inputs(B=2, T=40, H=1, HV=2, K=32, V=64)
    raw, wrapped = run_fake(x, output_final_state=True, state_layout="vk")
    assert shapes(raw)[1:] == [((2, 2, 64, 32), FP32), ((0, 2, 64, 32), FP32)]
    assert shapes(wrapped) == shapes(raw[:2])


def test_fake_varlen():
    x = fake_inputs(B=1, T=40, H=2, HV=4)
    cu = torch.tensor([0, 7, 7, 40])
    raw, wrapped = run_fake(x, output_final_state=True, cu_seqlens=cu, cu_seqlens_cpu=cu)
    assert shapes(raw) == [((1, 40, 4, 32), FP16), ((3, 4, 32, 32), FP32), ((0, 4, 32, 32), FP32)]
    assert shapes(wrapped) == shapes(raw[:2])


def test_fake_no_final_state():
    x = fake_inputs(B=3, T=40, H=2)
    raw, wrapped = run_fake(x)
    assert shapes(raw) == [((3, 40, 2, 32), FP16), ((0, 2, 32, 32), FP32), ((0, 2, 32, 32), FP32)]
    assert len(wrapped) == 2 and wrapped[1] is None


@pytest.mark.parametrize("T", [16, 40, 64, 65, 200])
@pytest.mark.parametrize("size,dtype", [(64, FP32), (16, torch.bfloat16), (96, FP16)])
def test_fake_chunk_states_fixed_length(T, size, dtype):
    """One chunk state every chunk_states_size tokens, in chunk_states_dtype: from shapes
    alone, whatever chunk the selected spec has."""
    x = fake_inputs(B=2, T=T, H=2)
    raw, wrapped = run_fake(x, output_chunk_states=True, chunk_states_size=size,
                            chunk_states_dtype=dtype)  # fmt: skip
    assert shapes(raw)[1:] == [((0, 2, 32, 32), FP32), ((2 * -(-T // size), 2, 32, 32), dtype)]
    assert len(wrapped) == 3 and wrapped[1] is None and shapes(wrapped)[2] == shapes(raw)[2]


def test_fake_reads_no_values():
    """Meta tensors hold no data at all: the fake must get by on shapes alone (varlen too)."""
    x = fake_inputs(B=1, T=40, H=2, device="meta")
    cu = torch.empty(4, dtype=torch.int64, device="meta")
    with FakeTensorMode(allow_non_fake_inputs=False) as mode:
        fx = {n: mode.from_tensor(t) for n, t in x.items()}
        o, ht, hs = torch.ops.kreg.kda_prefill(**fx, output_final_state=True,
                                               cu_seqlens=mode.from_tensor(cu))  # fmt: skip
    assert tuple(ht.shape) == (3, 2, 32, 32) and o.device.type == "meta"


def check_make_fx_traces_one_op_node(op: Op):
    """Tracing with fake tensors (no kernel runs) records the op as a single node."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(q, k, v, g, beta, h0):
        o, ht = op.wrapper(q, k, v, g, beta, initial_state=h0, output_final_state=True)
        return o * 2, ht + 1

    x = fake_inputs(B=1, T=40, H=1, dtype=FP32, gate=op.gate)
    h0 = torch.empty(1, 1, 32, 32)
    gm = make_fx(fn, tracing_mode="fake")(*x.values(), h0)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert targets.count(op.raw.default) == 1


def test_make_fx_traces_one_op_node():
    check_make_fx_traces_one_op_node(KDA)


@pytest.mark.parametrize("chunk_states", [False, True])
def test_make_fx_symbolic_shapes(chunk_states):
    """Dynamic shapes: sizes stay symbolic, except that chunk states (whose count depends on the
    selected spec's chunk) specialise them for the selection."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(q, k, v, g, beta, cu):
        if chunk_states:
            return kda_prefill_op(q, k, v, g, beta, output_chunk_states=True)
        return kda_prefill_op(q, k, v, g, beta, cu_seqlens=cu, output_final_state=True)

    x = fake_inputs(B=1, T=40, H=1, dtype=FP32)
    gm = make_fx(fn, tracing_mode="symbolic")(*x.values(), torch.tensor([0, 10, 40]))
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.kreg.kda_prefill.default in targets


# --- validation ----------------------------------------------------------------------------------


def check_varlen_chunk_states_rejected(op: Op):
    x = fake_inputs(B=1, T=40, H=2, gate=op.gate)
    cu = torch.tensor([0, 20, 40])
    entry = op.entry.__name__
    with pytest.raises(ValueError, match=f"^output_chunk_states: .*cu_seqlens.*call {entry} "):
        op.wrapper(**x, cu_seqlens=cu, output_chunk_states=True)
    with pytest.raises(ValueError, match="^output_chunk_states: "), FakeTensorMode() as mode:
        fx = {n: mode.from_tensor(t) for n, t in x.items()}
        op.raw(**fx, cu_seqlens=mode.from_tensor(cu), output_chunk_states=True)


def test_varlen_chunk_states_rejected():
    check_varlen_chunk_states_rejected(KDA)


# (keywords the schema cannot carry, the argument the wrapper's ValueError names)
BAD_ARGUMENTS = [
    (dict(k=[1.0]), "k"),
    (dict(beta=None), "beta"),
    (dict(initial_state=3), "initial_state"),
    (dict(cu_seqlens=[0, 40]), "cu_seqlens"),
    (dict(scale="1"), "scale"),
    (dict(scale=True), "scale"),
    (dict(gate_lower_bound="low"), "gate_lower_bound"),
    (dict(output_final_state=1), "output_final_state"),
    (dict(use_qk_l2norm="yes"), "use_qk_l2norm"),
    (dict(state_layout=None), "state_layout"),
    (dict(algorithm=3), "algorithm"),
    (dict(target=42), "target"),
    (dict(max_seqlen=True), "max_seqlen"),
    (dict(A_log=np.zeros(1)), "A_log"),
]


def check_wrapper_rejects(op: Op, kw, name):
    x = {**fake_inputs(B=1, T=40, H=1, gate=op.gate), **kw}
    with pytest.raises(ValueError, match=f"^{name}: "):
        op.wrapper(**x)


@pytest.mark.parametrize("kw, name", BAD_ARGUMENTS)
def test_wrapper_rejects_bad_arguments_by_name(kw, name):
    check_wrapper_rejects(KDA, kw, name)


def test_real_impl_errors_surface_as_value_error():
    """The real implementation's ValueError crosses the dispatcher unchanged (here: CPU tensors
    outside the interpreter, which ``kda_prefill`` refuses naming q)."""
    x = {n: torch.zeros_like(t) for n, t in fake_inputs(B=1, T=40, H=1).items()}
    with pytest.raises(ValueError, match="^q: CPU tensors run under the Triton interpreter"):
        kda_prefill_op(**x)


def test_target_object_passed_by_name():
    sm90 = get_registry().targets["sm90"]
    x = fake_inputs(B=1, T=40, H=1)
    with FakeTensorMode() as mode:
        fx = {n: mode.from_tensor(t) for n, t in x.items()}
        out = kda_prefill_op(**fx, output_chunk_states=True, target=sm90)
    assert out[2].shape[0] >= 1


# --- CUDA graph capture (GPU) --------------------------------------------------------------------


def _cuda_inputs(B, T, H, HV, K, V, dtype, gen):
    q = torch.randn(B, T, H, K, generator=gen, device="cuda")
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen, device="cuda"), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, device="cuda")
    g = -5.0 * torch.rand(B, T, HV, K, generator=gen, device="cuda")
    beta = torch.rand(B, T, HV, generator=gen, device="cuda")
    return dict(q=q.to(dtype), k=k.to(dtype), v=v.to(dtype), g=g.to(dtype), beta=beta.to(dtype))


GRAPH_CASES = {
    # name: (B, T, H, HV, K, V, capture-time offsets or None, replay offsets)
    "fixed": (2, 300, 2, 4, 64, 64, None, [None, None]),
    # the replays change the offsets (same N)
    "varlen": (1, 300, 2, 4, 64, 64, [0, 300, 300, 300], [None, [0, 100, 100, 300]]),
    # few heads, long sequences: the ranker picks a sequence-parallel (segmented) scan; the
    # capture's longest sequence is shorter than a replay's, which the shape-sized segment grid
    # must cover
    "varlen_segments": (1, 16384, 2, 2, 128, 128, [0, 1000, 16384],
                        [[0, 15000, 16384], [0, 16000, 16384]]),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", list(GRAPH_CASES))
def test_cuda_graph_capture_and_replay(case):
    """Capture the op with static buffers, replay on new data (and new offsets, same N), compare
    with eager calls bit for bit."""
    B, T, H, HV, K, V, capture_offsets, replays = GRAPH_CASES[case]
    dtype = torch.bfloat16
    gen = torch.Generator(device="cuda").manual_seed(0)
    static = _cuda_inputs(B, T, H, HV, K, V, dtype, gen)
    n = B if capture_offsets is None else len(capture_offsets) - 1
    h0 = torch.randn(n, HV, K, V, generator=gen, device="cuda")
    kw = dict(output_final_state=True)
    if capture_offsets is not None:
        capture_cu = torch.tensor(capture_offsets, dtype=torch.int64)
        cu_dev = capture_cu.cuda()
        kw.update(cu_seqlens=cu_dev, cu_seqlens_cpu=capture_cu)
    if case == "varlen_segments":
        problem = torch_op._problem_from_shapes(
            static["q"], static["v"], h0, True, -5.0, cu_dev, "none", False, False, "kv", False
        )
        if not select(problem).spec.scan.segment_chunks:
            pytest.skip("this target's selection uses no segmented scan for this case")

    def call():
        return kda_prefill_op(**static, initial_state=h0, **kw)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):  # warm-up: compile the kernels, cache the selection
            call()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        o_s, ht_s = call()

    for offsets in replays:
        fresh = _cuda_inputs(B, T, H, HV, K, V, dtype, gen)
        fresh_h0 = torch.randn(n, HV, K, V, generator=gen, device="cuda")
        for name, t in fresh.items():
            static[name].copy_(t)
        h0.copy_(fresh_h0)
        eager_kw = dict(output_final_state=True)
        if capture_offsets is not None:
            cu = capture_cu if offsets is None else torch.tensor(offsets, dtype=torch.int64)
            cu_dev.copy_(cu)
            eager_kw.update(cu_seqlens=cu.cuda(), cu_seqlens_cpu=cu)
        graph.replay()
        torch.cuda.synchronize()
        o_ref, ht_ref = api.kda_prefill(**fresh, initial_state=fresh_h0, **eager_kw)
        assert torch.equal(o_s, o_ref)
        assert torch.equal(ht_s, ht_ref)


# --- the fake validates as kda_prefill does ------------------------------------------------------


def _bad(x, **kw):
    return {**x, **kw}


def _other_gate(g):
    """g of the other gate kind: a scalar gate's [B, T, HV] for a per-channel one, and back."""
    return g[..., 0] if g.dim() == 4 else g[..., None].expand(*g.shape, 32)


FAKE_CASES = [
    # (id, edit of fake_inputs(B=1, T=40, H=2, gate=...) -> keywords, argument named); the same
    # for either gate kind
    ("k_shape", lambda x: _bad(x, k=x["k"][:, :, :1]), "k"),
    ("k_dtype", lambda x: _bad(x, k=x["k"].float()), "k"),
    # the last dim: K of a per-channel gate, HV of a scalar one
    ("g_shape", lambda x: _bad(x, g=x["g"][..., :16] if x["g"].dim() == 4 else x["g"][..., :1]),
     "g"),
    # the other family's gate: the fake validates with its own op's gate kind
    ("g_other_gate", lambda x: _bad(x, g=_other_gate(x["g"])), "g"),
    ("beta_4d", lambda x: _bad(x, beta=x["beta"][..., None]), "beta"),
    ("v_HV0", lambda x: _bad(x, v=x["v"][:, :, :0]), "v"),
    ("q_H0", lambda x: _bad(x, q=x["q"][:, :, :0], k=x["k"][:, :, :0]), "q"),
    ("A_log", lambda x: _bad(x, gate_activation="sigmoid_bound", gate_lower_bound=-5.0,
                                     A_log=torch.zeros(3)), "A_log"),
    ("dt_bias", lambda x: _bad(x, gate_activation="softplus", gate_lower_bound=None,
                               dt_bias=torch.zeros(2, 31)), "dt_bias"),
    ("initial_state", lambda x: _bad(x, initial_state=torch.zeros(2, 2, 32, 32)), "initial_state"),
    ("cu_dtype", lambda x: _bad(x, cu_seqlens=torch.tensor([0, 40], dtype=torch.int16)),
     "cu_seqlens"),
    ("cu_cpu_shape", lambda x: _bad(x, cu_seqlens=torch.tensor([0, 40]),
                                    cu_seqlens_cpu=torch.tensor([0, 20, 40])), "cu_seqlens_cpu"),
    ("state_layout", lambda x: _bad(x, state_layout="KV"), "state_layout"),
]  # fmt: skip


def _message(fn) -> str:
    with pytest.raises(ValueError) as e:
        fn()
    return str(e.value)


def check_fake_fails_as_eager(op: Op, edit, name):
    """The fake runs the entry's own data-free checks: tracing a bad call fails exactly as the
    eager call does (eager here: CPU tensors, which fail validation before the device check)."""
    kw = edit(fake_inputs(B=1, T=40, H=2, gate=op.gate))
    eager = _message(lambda: op.entry(**kw))
    assert eager.startswith(f"{name}: "), eager

    def fake():
        with FakeTensorMode() as mode:
            fkw = {n: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t
                   for n, t in kw.items()}  # fmt: skip
            op.raw(**fkw)

    assert _message(fake) == eager


@pytest.mark.parametrize("edit,name", [c[1:] for c in FAKE_CASES], ids=[c[0] for c in FAKE_CASES])
def test_fake_fails_with_the_eager_message(edit, name):
    check_fake_fails_as_eager(KDA, edit, name)


def check_torch_compile_fails_as_eager(op: Op):
    kw = fake_inputs(B=1, T=40, H=2, gate=op.gate)
    kw["k"] = kw["k"][:, :, :1].contiguous()
    eager = _message(lambda: op.entry(**kw))
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend="eager", dynamic=False)
    def fn(q, k, v, g, beta):
        return op.wrapper(q, k, v, g, beta)[0]

    with pytest.raises(Exception) as e:
        fn(**kw)
    assert eager in str(e.value), str(e.value)


def test_torch_compile_fails_with_the_eager_message():
    check_torch_compile_fails_as_eager(KDA)


# --- scale and gradients through the wrapper -----------------------------------------------------

_DEVICE_CHECK = "^q: CPU tensors run under the Triton interpreter"  # reached: scale was accepted


@pytest.mark.parametrize(
    "scale",
    [2, 0.25, np.float32(0.25), np.float64(0.25), torch.tensor(0.25), torch.tensor(2)],
    ids=["int", "float", "np_float32", "np_float64", "tensor", "int_tensor"],
)
def test_wrapper_scale_forms_as_kda_prefill(scale):
    x = {n: torch.zeros_like(t) for n, t in fake_inputs(B=1, T=40, H=1).items()}
    for fn in (kda_prefill_op, api.kda_prefill):
        with pytest.raises(ValueError, match=_DEVICE_CHECK):
            fn(**x, scale=scale)


@pytest.mark.parametrize(
    "scale,fragment",
    [(True, "finite number"), (np.bool_(False), "finite number"), ("0.5", "finite number"),
     (float("nan"), "finite number"), (np.float32("inf"), "finite number"),
     (torch.tensor([0.5]), "0-d tensor"), (torch.tensor(0.5, device="meta"), "device sync")],
    ids=["bool", "np_bool", "str", "nan", "np_inf", "1d_tensor", "device_tensor"],
)  # fmt: skip
def test_wrapper_scale_rejections_as_kda_prefill(scale, fragment):
    x = {n: torch.zeros_like(t) for n, t in fake_inputs(B=1, T=40, H=1).items()}
    messages = {
        _message(lambda fn=fn: fn(**x, scale=scale)) for fn in (kda_prefill_op, api.kda_prefill)
    }
    assert len(messages) == 1, messages
    (text,) = messages
    assert text.startswith("scale: ") and fragment in text, text


GRAD_ARGS = ["q", "v", "beta", "initial_state", "A_log"]


def check_wrapper_refuses_grad(op: Op, name):
    """Inside the op grad mode is off, so the wrapper checks (with kda_prefill's function)."""
    x = {n: torch.zeros_like(t, dtype=FP32)
         for n, t in fake_inputs(B=1, T=40, H=1, gate=op.gate).items()}  # fmt: skip
    kw = dict(initial_state=torch.zeros(1, 1, 32, 32), gate_activation="sigmoid_bound",
              gate_lower_bound=-5.0, A_log=torch.zeros(1))  # fmt: skip
    kw = {**x, **kw}
    leaf = kw[name].clone().requires_grad_()
    kw[name] = leaf * 1
    with pytest.raises(
        ValueError, match=f"^{name}: requires grad; kreg.s delta-rule kernels .* have no backward"
    ):
        (op.wrapper(**kw)[0].sum() + leaf.sum()).backward()
    with torch.no_grad(), pytest.raises(ValueError, match=_DEVICE_CHECK):
        op.wrapper(**kw)


@pytest.mark.parametrize("name", GRAD_ARGS)
def test_wrapper_refuses_inputs_that_require_grad(name):
    check_wrapper_refuses_grad(KDA, name)
