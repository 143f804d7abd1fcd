"""SGLang's own extend kernels with their signatures, served by kreg's families:
``chunk_kda`` (``sglang/srt/layers/attention/fla/kda.py``, called by
``TritonKDAKernel.extend``) by ``kreg.families.kda.kda_prefill``, and
``chunk_gated_delta_rule`` (``sglang/kernels/ops/attention/fla/chunk.py``, called by
``TritonGDNKernel.extend``) by ``kreg.families.gdn.gdn_prefill``. SGLang's signatures are not
fla's: the state pool is passed whole with ``initial_state_indices`` and updated in place
(V-first, ``[P, HV, V, K]``), ``chunk_kda`` activates the gate in the kernel whenever ``A_log``
is given and returns only ``o``, ``chunk_gated_delta_rule`` returns ``(o, None, h)``. Moving is
one import change::

    from kreg.compat.sglang import chunk_kda  # was: from sglang...fla.kda import chunk_kda
    from kreg.compat.sglang import chunk_gated_delta_rule  # was: from sglang...fla.chunk import ...

Every argument is served or refused with a ``ValueError`` whose message starts with its name.
"""

from __future__ import annotations

import torch

from kreg.families.kda.api import run_prefill as _run

from .fla import _fail, _flag, _in_kernel_gate, _known_kwargs, _per_batch_row


def _pool_required(function: str, initial_state, initial_state_indices) -> None:
    """SGLang's extend kernels read and write the pool through the slots: both are required."""
    if initial_state is None:
        _fail("initial_state", f"SGLang's {function} updates a state pool [P, HV, V, K]: pass "
                               "it with initial_state_indices")  # fmt: skip
    if initial_state_indices is None:
        _fail("initial_state_indices", "required with the state pool (one slot per sequence)")


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    use_qk_l2norm_in_kernel: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    lower_bound: float | None = None,
    output_intermediate_states: bool = False,
    **kwargs,
) -> torch.Tensor:
    """SGLang's KDA prefill (forward only): returns ``o`` ``[1, T, HV, V]`` in v's dtype and
    writes each sequence's final state into its slot of ``initial_state`` in place.

    - ``initial_state``: the pool ``[P, HV, V, K]`` (V-first, as SGLang keeps it; fp32 or
      bf16, contiguous), ``initial_state_indices`` ``[N]`` int32 / int64 slots, one per
      sequence of ``cu_seqlens`` (int32 or int64); both required. A negative slot starts from
      zeros and is not written (see ``kda_prefill``'s state pools).
    - ``A_log`` given: the gate is activated in the kernel, ``lower_bound * sigmoid(exp(A_log)
      * (g + dt_bias))`` with ``lower_bound``, else ``-exp(A_log) * softplus(g + dt_bias)``.
      ``A_log`` None: g is the log-decay; ``dt_bias`` or ``lower_bound`` without ``A_log`` is
      refused (they would be ignored).
    - ``beta`` is the probability (SGLang applies the sigmoid before the call).
    - Refused: ``output_intermediate_states=True`` (SGLang's radix-cache snapshots: their
      layout is not mapped; ``kda_prefill(..., output_chunk_states=True)`` serves the same
      states), any other keyword (``TypeError``, naming it).
    """
    _known_kwargs("chunk_kda", kwargs, ())
    if _flag("output_intermediate_states", output_intermediate_states):
        _fail("output_intermediate_states", "True is not served by kreg's SGLang shim (call "
                                            "kda_prefill with output_chunk_states=True)")  # fmt: skip
    _pool_required("chunk_kda", initial_state, initial_state_indices)
    if A_log is None:
        for name, value in (("dt_bias", dt_bias), ("lower_bound", lower_bound)):
            if value is not None:
                _fail(name, "given without A_log: SGLang activates the gate only with A_log, so "
                            "it would be ignored")  # fmt: skip
        gate_activation, gate_lower_bound = "none", None
    else:
        gate_activation, gate_lower_bound = _in_kernel_gate(lower_bound, A_log)
    o, _ = _run(
        q, k, v, g, beta,
        scale=scale,
        initial_state=initial_state,
        initial_state_indices=initial_state_indices,
        output_final_state=True,
        gate_lower_bound=gate_lower_bound,
        cu_seqlens=cu_seqlens,
        A_log=A_log,
        dt_bias=dt_bias,
        gate_activation=gate_activation,
        use_qk_l2norm=_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
        state_layout="vk",
    )  # fmt: skip
    return o


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    initial_state_indices: torch.Tensor | None = None,
    cu_seqlens: torch.LongTensor | None = None,
    head_first: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    inplace_update: bool = True,
):
    """SGLang's GDN prefill (forward only): returns ``(o, None, h)`` as SGLang's does, writing
    each sequence's final state into its slot of ``initial_state`` in place.

    - ``initial_state``: the pool ``[P, HV, V, K]`` (V-first; fp32 or bf16, contiguous),
      ``initial_state_indices`` ``[N]`` int32 / int64 slots, one per sequence of
      ``cu_seqlens``; both required. A negative slot starts from zeros and is not written, as
      SGLang's kernel skips it.
    - g ``[1, T, HV]`` is the log-decay and beta the probability (SGLang's ``fused_gdn_gating``
      computes both before the call).
    - ``h``: the state at the start of every 64 tokens of each sequence (SGLang's chunk),
      ``[1, NT, HV, V, K]`` in q's dtype, sequences in order, what SGLang's radix cache tracks
      from: ``gdn_prefill(..., output_chunk_states=True, chunk_states_size=64)``. With device
      ``cu_seqlens`` alone NT is ``ceil(T / 64) + N - 1`` (the host cannot count the chunks
      without a sync), the written rows first, as ``kda_prefill`` returns them.
    - Refused: ``head_first=True`` and ``inplace_update=False`` (SGLang's multi-item scoring:
      final states not written back), each naming itself.
    """
    if _flag("head_first", head_first):
        _fail("head_first", "True ([B, H, T, ...] inputs) is not served: pass [B, T, H, ...]")
    if not _flag("inplace_update", inplace_update):
        _fail("inplace_update", "False (final states not written back) is not served by kreg's "
                                "SGLang shim: kreg writes each sequence's slot in place")  # fmt: skip
    _pool_required("chunk_gated_delta_rule", initial_state, initial_state_indices)
    o, _, h = _run(
        q, k, v, g, beta,
        family="gdn",
        gate="scalar",
        scale=scale,
        initial_state=initial_state,
        initial_state_indices=initial_state_indices,
        output_final_state=True,
        cu_seqlens=cu_seqlens,
        use_qk_l2norm=_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
        state_layout="vk",
        output_chunk_states=True,
        chunk_states_size=64,
        chunk_states_dtype=q.dtype,
    )  # fmt: skip
    return o, None, _per_batch_row(h, q, cu_seqlens)
