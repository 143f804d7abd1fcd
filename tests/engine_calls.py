"""How vLLM's and SGLang's KDA layers call ``chunk_kda`` / ``fused_recurrent_kda``: one record
per call site, shared by the interpreter lane (``tests/interpreter/test_engine_replay.py``,
against the float64 oracle) and the GPU lane (``tests/test_engine_replay_gpu.py``, against
fla-core itself).

Each ``step_*`` function re-states what the engine does around its call, in the engine's own
order: the tensors it builds (layouts, dtypes, strides), the keyword arguments it passes, the
pool traffic before and after, and the values it unpacks. The call sites read (public
repositories, the commits the code index served):

- vLLM ``vllm/model_executor/layers/kda.py`` @ 01a7e5d91d42e6232d746d12f898a590f1ee77f9,
  ``KimiDeltaAttention._forward``: prefill and decode. Its ``chunk_kda`` /
  ``fused_recurrent_kda`` are vLLM's vendored copies (``vllm/model_executor/layers/fla/ops/
  kda.py`` @ 59e459897da422926a8c401c975d8765f0a3e1d1): the same keywords as fla-core 0.6.0
  plus ``ssm_state_indices`` (a pool updated in place, ``inplace_final_state=True`` by
  default), states ``[K, V]`` (``fla/ops/fused_recurrent.py`` @ 03c6dad8: ``o_k[:, None] * V``).
  Full-CUDA-graph decode pads the slots to the graph's batch with ``PAD_SLOT_ID = -1`` while
  ``cu_seqlens`` is cut to ``num_decodes + 1`` (``vllm/v1/attention/backends/gdn_attn.py``,
  ``non_spec_state_indices_tensor[num_decodes:].fill_(PAD_SLOT_ID)``).
- SGLang ``python/sglang/srt/layers/attention/linear/kda_backend.py`` @ 0051ebfc71df,
  ``KDAAttnBackend.forward_extend`` (q, k, v from one transposed conv output, split), and
  ``.../linear/kernels/kda_triton.py`` @ 007d1d93beab, ``TritonKDAKernel.extend``: SGLang's
  own ``chunk_kda`` (``python/sglang/srt/layers/attention/fla/kda.py`` @ 0465eebc1445), whose
  signature is not fla's: ``initial_state_indices`` into a V-first pool ``[P, HV, V, K]``
  updated in place, the gate activated in-kernel whenever ``A_log`` is given (no
  ``use_gate_in_kernel``), ``output_intermediate_states``, and only ``o`` returned. The model
  (``python/sglang/srt/models/kimi_linear.py`` @ 0220422fc000) passes the raw gate, a sigmoid
  beta in fp32, ``A_log`` ``[1, 1, HV, 1]`` fp32 and ``dt_bias`` ``[HV * K]`` fp32.
  SGLang's decode calls ``fused_sigmoid_gating_delta_rule_update`` (its own kernel, not an fla
  function); ``sglang_decode`` is that step written against fla 0.6.0's
  ``fused_recurrent_kda`` with the pool, which is what an SGLang integrator would call.

GDN (Qwen3-Next's Gated DeltaNet, one gate per token and value head; ``EngineCall.family``
"gdn", served by ``kreg.compat.<library>.chunk_gated_delta_rule`` /
``fused_recurrent_gated_delta_rule``):

- vLLM ``vllm/model_executor/models/qwen3_next.py`` @ 6365b387890f7aa74b0fe65b81705d4730fcc763,
  ``Qwen3NextGatedDeltaNet._forward_core``: prefill gathers the slots' states
  (``ssm_state[non_spec_state_indices_tensor].contiguous()``, zeroed where
  ``~has_initial_state``), calls ``chunk_gated_delta_rule(..., initial_state=...,
  output_final_state=True, cu_seqlens=..., head_first=False, use_qk_l2norm_in_kernel=True)``
  and scatters the final states back; decode calls ``fused_recurrent_gated_delta_rule(...,
  initial_state=ssm_state, inplace_final_state=True, cu_seqlens=...[: num_decodes + 1],
  ssm_state_indices=..., use_qk_l2norm_in_kernel=True)``. g and beta come from its
  ``fused_gdn_gating``: g fp32 ``[1, T, HV]``, beta ``sigmoid(b)`` in b's (the activations')
  dtype; q, k, v are made contiguous (``rearrange_mixed_qkv``). Those are vLLM's vendored
  functions (``vllm/model_executor/layers/fla/ops/chunk.py`` @ 8744bb09,
  ``fused_recurrent.py`` @ 03c6dad8): some of fla's keywords plus ``head_first`` (fla 0.6.0
  raises on it), ``ssm_state_indices`` and ``inplace_final_state`` (True by default). Their
  state layout changed in vLLM PR #33291 ("Change GDN Attention State Layout from
  [N, HV, K, V] to [N, HV, V, K]", 2026-01-28) with no keyword at the call site; the records
  replay a ``[K, V]`` pool, fla-core's default layout (a ``[V, K]`` vLLM pool moving to fla
  0.6.0's semantics must add ``state_v_first=True``: with K = V nothing else tells them apart).
- SGLang ``python/sglang/srt/layers/attention/linear/gdn_backend.py`` @ 0051ebfc71df,
  ``GDNAttnBackend.forward_extend`` (q, k, v split from the transposed conv output; g, beta
  from ``fused_gdn_gating``; ``core_attn_out, last_recurrent_state, h = ...extend(...)``),
  and ``.../linear/kernels/gdn_triton.py`` @ 0a48af3ac181, ``TritonGDNKernel.extend``:
  SGLang's own ``chunk_gated_delta_rule`` (``python/sglang/kernels/ops/attention/fla/chunk.py``
  @ 0a0df252ac62), whose signature is not fla's: ``initial_state_indices`` into a V-first pool
  updated in place (``inplace_update=True``), ``head_first``, no ``output_final_state``, and
  ``(o, None, h)`` returned. SGLang's decode calls its own
  ``fused_sigmoid_gating_delta_rule_update``; ``sglang_gdn_decode`` is that step written
  against fla 0.6.0's ``fused_recurrent_gated_delta_rule`` (the softplus gate from ``A_log``,
  ``dt_bias`` ``[HV]``, the sigmoid of raw b, the V-first pool with kreg's pool keyword).

Each call names the library whose signatures it is written against (``EngineCall.library``):
the replay runs it on ``kreg.compat.<library>`` (``kreg.compat.sglang`` for SGLang's own
``chunk_kda``). ``KNOWN_GAPS`` names the calls kreg's shims do not serve yet, with the reason
(none today); the lanes mark them ``xfail(strict=True)`` so that serving them turns the mark
into a failure to remove.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace

import attrs
import numpy as np
import torch

from kreg.families.kda.oracles import gate_softplus, l2norm, sigmoid, token_serial_oracle

PAD_SLOT_ID = -1  # vLLM's and SGLang's padding slot


@attrs.frozen
class Batch:
    """One engine batch: sequence lengths, the pool slot of each sequence (-1: a padding
    sequence that reads zeros and writes nothing), which ones start from their slot's state
    (the rest start from zeros: vLLM's ``has_initial_state``), trailing padding slots past the
    last sequence (vLLM's graph padding), and head sizes (Kimi-Linear: K = V = head_dim)."""

    lengths: tuple[int, ...]
    slots: tuple[int, ...]
    pool_size: int
    H: int = 1
    HV: int = 2
    K: int = 32
    has_initial_state: tuple[bool, ...] | None = None
    trailing_pad: int = 0

    def __attrs_post_init__(self):
        assert len(self.slots) == len(self.lengths)
        assert self.has_initial_state is None or len(self.has_initial_state) == len(self.slots)

    @property
    def starts(self) -> tuple[bool, ...]:
        return self.has_initial_state or (True,) * len(self.slots)


@attrs.frozen
class EngineCall:
    name: str
    function: str  # the shim function the step calls: "chunk_kda", "fused_recurrent_kda", ...
    step: Callable  # step(ops, t) -> o; t's "pool" is updated in place
    gate: str  # "activated" (engine computes g in fp32) or "raw" (A_log, dt_bias, in-kernel)
    # "prob" (sigmoid applied by the engine, fp32), "prob_act" (the same in the activations'
    # dtype: vLLM's and SGLang's fused_gdn_gating) or "logit" (raw, in-kernel)
    beta: str
    v_first: bool  # pool layout [P, HV, V, K]
    q_layout: str  # "conv_transposed", "split_rows" or "contiguous"
    source: str
    library: str = "fla"  # whose signatures the engine calls: kreg.compat.<library> serves it
    family: str = "kda"  # "kda": g [.., HV, K], dt_bias [HV * K]; "gdn": g [.., HV], dt_bias [HV]

    def shim(self):
        """The kreg module the integrator imports instead (one import change)."""
        import importlib

        return importlib.import_module(f"kreg.compat.{self.library}")


# --- engine-layout tensors --------------------------------------------------------------------


def _qkv(b: Batch, T: int, layout: str, dtype, gen, device):
    """q, k, v ``[1, T, H or HV, K]`` with the strides the engine's conv step leaves.

    ``conv_transposed``: prefill; the causal conv runs channels-first ``[dim, T]`` and the
    result is transposed back and split (strides (1, T) along (token, channel)).
    ``split_rows``: SGLang decode; one ``[T, 3 * dim]`` conv-update output split by columns.
    ``contiguous``: vLLM decode; three separate conv-update outputs."""
    dims = [b.H * b.K, b.H * b.K, b.HV * b.K]
    if layout == "conv_transposed":
        parts = torch.randn(sum(dims), T, generator=gen).to(dtype).to(device).t().split(dims, -1)
    elif layout == "split_rows":
        parts = torch.randn(T, sum(dims), generator=gen).to(dtype).to(device).split(dims, -1)
    else:
        parts = [torch.randn(T, d, generator=gen).to(dtype).to(device) for d in dims]
    return [p.unflatten(-1, (-1, b.K)).unsqueeze(0) for p in parts]


def make_tensors(call: EngineCall, b: Batch, *, dtype, pool_dtype=torch.float32, device="cpu",
                 seed=0) -> dict:  # fmt: skip
    """The tensors the engine holds at the call: activations in ``dtype``, the gate and beta
    as the engine makes them, int32 offsets and slots, and a pool (random states, so a wrong
    slot or a missed write shows) in ``pool_dtype``."""
    gen = torch.Generator().manual_seed(seed)
    T = sum(b.lengths)
    q, k, v = _qkv(b, T, call.q_layout, dtype, gen, device)
    # KDA: A_log [1, 1, HV, 1] and dt_bias [HV * K] (both engines); GDN: both [HV] (Qwen3-Next)
    gdn = call.family == "gdn"
    channels = () if gdn else (b.K,)
    raw = torch.randn(1, T, b.HV, *channels, generator=gen)
    A_log = (0.5 * torch.randn(*((b.HV,) if gdn else (1, 1, b.HV, 1)), generator=gen)).to(device)
    dt_bias = torch.randn(b.HV * (1 if gdn else b.K), generator=gen).to(device)
    if call.gate == "activated":  # vLLM's fused_kda_gate, the engines' fused_gdn_gating: fp32
        g = (-A_log.view(b.HV, *(1,) * len(channels)).exp() * torch.nn.functional.softplus(
            raw.to(device) + dt_bias.view(b.HV, *channels))).float()  # fmt: skip
    else:
        g = raw.to(dtype).to(device)
    beta_raw = torch.randn(1, T, b.HV, generator=gen)
    beta = {"prob": beta_raw.float().sigmoid(), "prob_act": beta_raw.float().sigmoid().to(dtype),
            "logit": beta_raw.to(dtype)}[call.beta]  # fmt: skip
    shape = (b.pool_size, b.HV, b.K, b.K)
    pool = (0.5 * torch.randn(*shape, generator=gen)).to(pool_dtype).to(device)
    # graph padding: zero-length sequences on -1 slots (vLLM cuts them off again at the call)
    lengths = torch.tensor((0, *b.lengths, *(0,) * b.trailing_pad)).cumsum(0)
    slots = (*b.slots, *(PAD_SLOT_ID,) * b.trailing_pad)
    return dict(
        q=q, k=k, v=v, g=g, beta=beta.to(device), A_log=A_log, dt_bias=dt_bias, pool=pool,
        cu_seqlens=lengths.to(torch.int32).to(device),
        slots=torch.tensor(slots, dtype=torch.int32).to(device),
        has_initial_state=torch.tensor(b.starts).to(device), num_decodes=len(b.lengths),
    )  # fmt: skip


# --- the call sites ---------------------------------------------------------------------------


def step_vllm_prefill(ops, t):
    """vLLM prefill: zero the slots of fresh sequences, gather the states, chunk_kda, scatter."""
    pool, slots = t["pool"], t["slots"]
    pool[slots[~t["has_initial_state"]]] = 0
    initial_state = pool[slots].contiguous()
    o, last_state = ops.chunk_kda(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"],
        initial_state=initial_state, output_final_state=True, use_qk_l2norm_in_kernel=True,
        cu_seqlens=t["cu_seqlens"],
    )  # fmt: skip
    pool[slots] = last_state.to(pool.dtype)  # as vLLM: the state comes back fp32
    return o


def step_vllm_decode(ops, t):
    """vLLM decode: the whole pool with its slots; the kernel updates it in place."""
    o, _ = ops.fused_recurrent_kda(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], initial_state=t["pool"],
        use_qk_l2norm_in_kernel=True, cu_seqlens=t["cu_seqlens"][: t["num_decodes"] + 1],
        ssm_state_indices=t["slots"],
    )  # fmt: skip
    return o


def step_sglang_extend(ops, t):
    """SGLang extend, on SGLang's own chunk_kda signature: pool + slots, raw gate with
    A_log / dt_bias, only o back."""
    return ops.chunk_kda(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], initial_state=t["pool"],
        initial_state_indices=t["slots"], use_qk_l2norm_in_kernel=True,
        cu_seqlens=t["cu_seqlens"], A_log=t["A_log"], dt_bias=t["dt_bias"], lower_bound=None,
        output_intermediate_states=False,
    )  # fmt: skip


def step_sglang_extend_fla(ops, t):
    """SGLang extend written against fla 0.6.0's chunk_kda: gather from the V-first pool,
    the in-kernel softplus gate, scatter back."""
    pool, slots = t["pool"], t["slots"]
    o, last_state = ops.chunk_kda(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], A_log=t["A_log"],
        dt_bias=t["dt_bias"], initial_state=pool[slots].contiguous(), output_final_state=True,
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, state_v_first=True,
        cu_seqlens=t["cu_seqlens"],
    )  # fmt: skip
    pool[slots] = last_state.to(pool.dtype)
    return o


def step_sglang_decode(ops, t):
    """SGLang decode (its fused_sigmoid_gating_delta_rule_update: softplus gate from A_log and
    dt_bias, sigmoid of raw beta, L2 norms, V-first pool in place, -1 slots skipped), written
    against fla 0.6.0's fused_recurrent_kda with kreg's pool keyword."""
    o, _ = ops.fused_recurrent_kda(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], A_log=t["A_log"],
        dt_bias=t["dt_bias"], initial_state=t["pool"], use_qk_l2norm_in_kernel=True,
        use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, state_v_first=True,
        cu_seqlens=t["cu_seqlens"], initial_state_indices=t["slots"],
    )  # fmt: skip
    return o


def step_vllm_gdn_prefill(ops, t):
    """vLLM Qwen3-Next prefill: gather the slots' states, zero the fresh ones in the copy,
    chunk_gated_delta_rule with head_first=False, scatter the final states back."""
    pool, slots = t["pool"], t["slots"]
    initial_state = pool[slots].contiguous()
    initial_state[~t["has_initial_state"], ...] = 0
    o, last_state = ops.chunk_gated_delta_rule(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], initial_state=initial_state,
        output_final_state=True, cu_seqlens=t["cu_seqlens"], head_first=False,
        use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    pool[slots] = last_state.to(pool.dtype)
    return o


def step_vllm_gdn_decode(ops, t):
    """vLLM Qwen3-Next decode: the whole pool, its slots and inplace_final_state=True."""
    o, _ = ops.fused_recurrent_gated_delta_rule(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], initial_state=t["pool"],
        inplace_final_state=True, cu_seqlens=t["cu_seqlens"][: t["num_decodes"] + 1],
        ssm_state_indices=t["slots"], use_qk_l2norm_in_kernel=True,
    )  # fmt: skip
    return o


def step_sglang_gdn_extend(ops, t):
    """SGLang extend (TritonGDNKernel.extend), on SGLang's own chunk_gated_delta_rule: pool +
    slots updated in place, (o, None, h) back."""
    o, _, _ = ops.chunk_gated_delta_rule(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], initial_state=t["pool"],
        cu_seqlens=t["cu_seqlens"], head_first=False, use_qk_l2norm_in_kernel=True,
        initial_state_indices=t["slots"], inplace_update=True,
    )  # fmt: skip
    return o


def step_sglang_gdn_decode(ops, t):
    """SGLang decode (its fused_sigmoid_gating_delta_rule_update: softplus gate from A_log,
    dt_bias [HV], sigmoid of raw b, L2 norms, V-first pool in place, -1 slots skipped), written
    against fla 0.6.0's fused_recurrent_gated_delta_rule with kreg's pool keyword."""
    o, _ = ops.fused_recurrent_gated_delta_rule(
        q=t["q"], k=t["k"], v=t["v"], g=t["g"], beta=t["beta"], initial_state=t["pool"],
        use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=t["A_log"],
        dt_bias=t["dt_bias"], use_beta_sigmoid_in_kernel=True, state_v_first=True,
        cu_seqlens=t["cu_seqlens"], initial_state_indices=t["slots"],
    )  # fmt: skip
    return o


VLLM = "vllm-project/vllm vllm/model_executor/layers/kda.py@01a7e5d9"
VLLM_GDN = "vllm-project/vllm vllm/model_executor/models/qwen3_next.py@6365b387"
SGLANG_GDN = (
    "sgl-project/sglang python/sglang/srt/layers/attention/linear/kernels/gdn_triton.py@0a48af3a"
)
SGLANG = (
    "sgl-project/sglang python/sglang/srt/layers/attention/linear/kernels/kda_triton.py@007d1d93"
)
CALLS = {
    c.name: c
    for c in [
        EngineCall("vllm.prefill", "chunk_kda", step_vllm_prefill, "activated", "prob", False,
                   "conv_transposed", VLLM),
        EngineCall("vllm.decode", "fused_recurrent_kda", step_vllm_decode, "activated", "prob",
                   False, "contiguous", VLLM),
        EngineCall("sglang.extend", "chunk_kda", step_sglang_extend, "raw", "prob", True,
                   "conv_transposed", SGLANG, library="sglang"),
        EngineCall("sglang.extend_fla", "chunk_kda", step_sglang_extend_fla, "raw", "prob",
                   True, "conv_transposed", SGLANG + " (on fla 0.6.0's signature)"),
        EngineCall("sglang.decode", "fused_recurrent_kda", step_sglang_decode, "raw", "logit",
                   True, "split_rows", SGLANG + " (decode, on fla 0.6.0's signature)"),
        EngineCall("vllm.gdn_prefill", "chunk_gated_delta_rule", step_vllm_gdn_prefill,
                   "activated", "prob_act", False, "contiguous", VLLM_GDN, family="gdn"),
        EngineCall("vllm.gdn_decode", "fused_recurrent_gated_delta_rule", step_vllm_gdn_decode,
                   "activated", "prob_act", False, "contiguous", VLLM_GDN, family="gdn"),
        EngineCall("sglang.gdn_extend", "chunk_gated_delta_rule", step_sglang_gdn_extend,
                   "activated", "prob_act", True, "conv_transposed", SGLANG_GDN,
                   library="sglang", family="gdn"),
        EngineCall("sglang.gdn_decode", "fused_recurrent_gated_delta_rule",
                   step_sglang_gdn_decode, "raw", "logit", True, "split_rows",
                   SGLANG_GDN + " (decode, on fla 0.6.0's signature)", family="gdn"),
    ]
}  # fmt: skip


def batches(K=32, H=1, HV=2, prefill=(5, 1, 14), decode=4):
    """(call name, batch id, Batch) to replay: for each call a batch in its engine's shape.
    Prefill: varlen with a fresh sequence (vLLM) and slots out of order in a larger pool;
    decode: one token per sequence, a padding sequence (-1) among them, and vLLM's graph
    padding (slots past the last sequence)."""
    n = len(prefill)
    pool = 2 * max(n, decode) + 1
    pre = Batch(prefill, tuple(range(pool - 1, pool - 1 - 2 * n, -2)), pool, H, HV, K,
                has_initial_state=(True, False, True)[:n])  # fmt: skip
    dec_slots = tuple([3, 0, PAD_SLOT_ID, 6, 1, 5][:decode])
    dec = Batch((1,) * decode, dec_slots, pool, H, HV, K)
    padded = attrs.evolve(dec, slots=tuple(s for s in dec_slots if s >= 0),
                          lengths=(1,) * sum(s >= 0 for s in dec_slots), trailing_pad=3)  # fmt: skip
    # vLLM's plain decode batch has no pad slot: a free slot stands in for it (two sequences on
    # one slot would race for its write-back in any kernel)
    free = min(set(range(pool)) - set(dec_slots))
    unpadded = tuple(free if s < 0 else s for s in dec_slots)
    for slots in (pre.slots, dec.slots, unpadded):
        used = [s for s in slots if s >= 0]
        assert len(set(used)) == len(used), f"repeated slots in a replay batch: {slots}"
    sg_pre = attrs.evolve(pre, has_initial_state=None)  # SGLang keeps fresh slots zeroed itself
    return [
        ("vllm.prefill", "varlen", pre),
        ("vllm.decode", "batch", attrs.evolve(dec, slots=unpadded)),
        ("vllm.decode", "graph_padded", padded),
        ("sglang.extend", "varlen", sg_pre),
        ("sglang.extend_fla", "varlen", sg_pre),
        ("sglang.decode", "batch_with_pad_slot", dec),
        ("vllm.gdn_prefill", "varlen", pre),
        ("vllm.gdn_decode", "batch", attrs.evolve(dec, slots=unpadded)),
        ("vllm.gdn_decode", "graph_padded", padded),
        ("sglang.gdn_extend", "varlen", sg_pre),
        ("sglang.gdn_decode", "batch_with_pad_slot", dec),
    ]


# calls kreg's shim does not serve yet: (call, batch id) -> (exception, reason)
KNOWN_GAPS: dict = {}


# --- what the engine expects: float64 -----------------------------------------------------------


def expected(call: EngineCall, b: Batch, t: dict) -> tuple[np.ndarray, np.ndarray]:
    """(o, pool after the step) in float64 by the token-serial oracle: sequence n starts from
    its slot's state (zeros for a fresh sequence or a -1 slot) and its final state lands in
    its slot; every other slot keeps its value. ``t`` as made, before the step."""
    x = {n: t[n].double().cpu().numpy() for n in ("q", "k", "v", "g", "beta")}
    x["q"], x["k"] = l2norm(x["q"]), l2norm(x["k"])
    if call.family == "gdn":  # a scalar gate is a per-channel gate with equal channels
        x["g"] = x["g"][..., None]
    if call.gate == "raw":
        x["g"] = gate_softplus(x["g"], t["A_log"].cpu(), t["dt_bias"].cpu())
    x["g"] = np.broadcast_to(x["g"], (*x["g"].shape[:-1], b.K))
    if call.beta == "logit":
        x["beta"] = sigmoid(x["beta"])
    pool = t["pool"].double().cpu().numpy().copy()
    n = len(b.lengths)
    slots = t["slots"].cpu().numpy()[:n]
    starts = np.asarray(b.starts) & (slots >= 0)
    h0 = np.where(starts[:, None, None, None], pool[np.maximum(slots, 0)], 0.0)
    layout = "vk" if call.v_first else "kv"
    cu = t["cu_seqlens"].cpu().numpy()[: n + 1]
    o, ht = token_serial_oracle(**x, initial_state=h0, cu_seqlens=cu, state_layout=layout)
    pool[slots[slots >= 0]] = ht[slots >= 0]
    # vLLM zeroes a fresh sequence's slot before the gather; its final state overwrites it
    return o, pool


def clone(t: dict) -> dict:
    return {n: x.clone() if isinstance(x, torch.Tensor) else x for n, x in t.items()}


# --- fla as an engine would run it (GPU lane) --------------------------------------------------


def pooled_ops(**functions) -> SimpleNamespace:
    """fla 0.6.0's public functions (by name: ``chunk_kda=...``) as an engine would run them.
    They take no pool (the fused_recurrent functions ignore ``ssm_state_indices`` and assert one
    state per sequence): the pool calls' keywords are served here by gathering the slots'
    states (zeros for -1), calling fla with ``output_final_state=True``, and scattering the
    final states back: the engines' pool semantics on fla's numerics (vLLM's
    ``inplace_final_state=True`` is that). The chunk functions get the engines'
    ``head_first=False`` dropped (fla 0.6.0 raises on any ``head_first``). Calls without these
    keywords pass through unchanged."""

    def recurrent(fn):
        def call(*args, initial_state=None, inplace_final_state=True, **kw):
            name = "ssm_state_indices" if "ssm_state_indices" in kw else "initial_state_indices"
            slots = kw.pop(name, None)
            if slots is None:
                return fn(*args, initial_state=initial_state, **kw)
            assert inplace_final_state, "only the in-place pool is replayed"
            pool = initial_state
            n = len(kw["cu_seqlens"]) - 1
            slots = slots[:n].long()
            live = slots >= 0
            h0 = torch.where(live.view(-1, 1, 1, 1), pool[slots.clamp(min=0)], 0).float()
            kw["output_final_state"] = True
            o, ht = fn(*args, initial_state=h0, **kw)
            pool[slots[live]] = ht[live].to(pool.dtype)
            return o, pool

        return call

    def chunk(fn):
        def call(*args, head_first=False, **kw):
            assert head_first is False, "fla 0.6.0 takes [B, T, H, ...] inputs only"
            return fn(*args, **kw)

        return call

    return SimpleNamespace(**{
        name: (recurrent if name.startswith("fused_recurrent") else chunk)(fn)
        for name, fn in functions.items()
    })  # fmt: skip
