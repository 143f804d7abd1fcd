"""``chunk_kda`` and ``fused_recurrent_kda`` with fla-core 0.6.0's signatures
(``fla/ops/kda/chunk.py``, ``fla/ops/kda/fused_recurrent.py``), served by
``kreg.families.kda.kda_prefill`` (whose dispatcher runs the recurrent kernel for short
sequences and the chunked one for long ones, whichever function was called).

Moving from fla is one import change::

    from kreg.compat.fla import chunk_kda, fused_recurrent_kda  # was: from fla.ops.kda import ...

Every argument fla accepts is served or refused with a ``ValueError`` whose message starts with
the argument's name; see ``chunk_kda``'s docstring for the mapping.
"""

from __future__ import annotations

import warnings

import torch

from kreg.families.kda.api import run_prefill as _run

# the keyword-only names fla 0.6.0 reads from ``**kwargs``
_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout", "max_seqlen")
# fused_recurrent_kda's: fla's deprecated layout name, and the state pool (kreg's extension,
# under SGLang's name and vLLM's / fla's kernel-level name)
_RECURRENT_KWARGS = ("transpose_state_layout", "initial_state_indices", "ssm_state_indices")


def _fail(name: str, message: str):
    raise ValueError(f"{name}: {message}")


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        _fail(name, f"must be a bool, got {value!r}")
    return value


def _known_kwargs(function: str, kwargs: dict, known) -> None:
    """fla ignores unknown keywords silently, which would hide a misspelt ``A_log``."""
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(f"{function}() got unexpected keyword argument(s) {', '.join(unknown)}")


def _renamed_layout(kwargs: dict, state_v_first):
    """``state_v_first``, or fla's deprecated ``transpose_state_layout`` (warned, as fla does)."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        _fail("transpose_state_layout", "cannot be passed together with state_v_first "
                                        "(its new name)")  # fmt: skip
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                  DeprecationWarning, stacklevel=3)  # fmt: skip
    return kwargs["transpose_state_layout"]


def _in_kernel_gate(lower_bound, A_log) -> tuple[str, float | None]:
    """fla's ``use_gate_in_kernel=True``: (gate_activation, gate_lower_bound) for kda_prefill.
    With ``lower_bound`` the sigmoid bound; without, softplus, which needs ``A_log``."""
    if lower_bound is not None:
        return "sigmoid_bound", lower_bound
    if A_log is None:
        _fail("A_log", "must be provided when use_gate_in_kernel=True and lower_bound is not set")
    return "softplus", None


def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context=None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs,
):
    """fla 0.6.0's ``chunk_kda`` (forward only), run by ``kda_prefill``.

    Returns ``(o, final_state)`` as fla does; ``final_state`` is None unless
    ``output_final_state``. With ``return_intermediate_states=True``, ``(o, final_state, h)``
    as fla: ``h`` the state at the start of every ``chunk_size`` tokens (64 by default) of each
    sequence, ``[B, NT, HV, K, V]`` (``[.., V, K]`` with ``state_v_first``) in q's dtype, NT =
    ceil(T / chunk_size); with ``cu_seqlens`` B = 1 and NT the sequences' chunks in order
    (with ``use_graph``, or with device ``cu_seqlens`` alone, whose values are never read on
    the host, ``ceil(T / chunk_size) + N - 1`` rows, the written ones first, the surplus
    unwritten, as fla's ``use_graph``). Served by ``kda_prefill(output_chunk_states=True, chunk_states_size=chunk_size,
    chunk_states_dtype=q.dtype)``, whatever chunk kreg's kernels run at. Layouts are fla's (and kda_prefill's): q, k ``[B, T, H, K]``, v
    ``[B, T, HV, V]``, g ``[B, T, HV, K]``, beta ``[B, T, HV]``, states ``[N, HV, K, V]``.

    Mapping to ``kda_prefill``:

    - ``use_qk_l2norm_in_kernel`` -> ``use_qk_l2norm``; ``use_beta_sigmoid_in_kernel`` ->
      ``use_beta_sigmoid``; ``state_v_first=True`` (states ``[.., V, K]``) ->
      ``state_layout="vk"``; ``scale``, ``initial_state``, ``output_final_state``,
      ``cu_seqlens``, ``cu_seqlens_cpu`` pass through. Device ``cu_seqlens`` alone are never
      read on the host (no sync; capturable in a CUDA graph; not validated: see
      ``kda_prefill``); ``cu_seqlens_cpu`` beside them is validated.
    - kreg's extension in ``**kwargs``: ``max_seqlen``, an upper bound of the longest sequence
      (the engines have it), which plans the scan as the host offsets would; without it and
      without ``cu_seqlens_cpu``, device offsets are planned for the mean length (exact either
      way; a long sequence among short ones runs faster with the bound).
    - ``use_gate_in_kernel=True`` (``A_log`` ``[HV]`` and optional ``dt_bias`` ``[HV * K]`` in
      ``**kwargs``): with ``lower_bound`` None, ``gate_activation="softplus"``
      (``-exp(A_log) * softplus(g + dt_bias)``; ``A_log`` required); with ``lower_bound`` set,
      ``gate_activation="sigmoid_bound"`` with ``gate_lower_bound=lower_bound``
      (``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``, ``A_log`` may be None). fla's gate
      kernel takes the sigmoid bound whenever ``lower_bound`` is set, with or without
      ``safe_gate``; ``safe_gate=True`` additionally requires ``lower_bound`` in ``[-5, 0)``.
    - ``use_gate_in_kernel=False``: ``A_log`` / ``dt_bias`` are ignored (as fla ignores them);
      ``safe_gate=True`` with ``lower_bound`` -> ``gate_lower_bound=lower_bound``, the caller's
      promise that every gate is >= it; ``lower_bound`` without ``safe_gate`` has no effect in
      fla and none here.
    - Accepted, no effect on the result: ``disable_recompute`` (backward only; kreg has no
      backward), ``use_graph`` (kreg's offsets already serve zero-length padding sequences and
      graph capture; with ``use_graph`` and ``cu_seqlens`` an explicit ``max_num_seqs`` must be
      the sequence count, as fla asserts), ``max_num_seqs``, ``chunk_size`` (32 or 64 as in
      fla; kreg picks its own tiles; it sets the spacing of ``return_intermediate_states``). ``transpose_state_layout`` (fla's deprecated name of ``state_v_first``) warns
      and is served as fla serves it.
    - Refused (``ValueError`` naming the argument): ``allow_neg_eigval=True``,
      ``disable_recompute=True`` with ``return_intermediate_states=True`` (fla asserts the
      same), ``cp_context`` (kreg's context parallel prefill is
      ``kreg.families.kda.kda_prefill_cp``, over a process group). Other keyword names raise ``TypeError`` (fla ignores
      them silently, which would hide a misspelt ``A_log``).

    Differences from fla: a non-contiguous tensor costs one copy, as with fla's
    ``input_guard`` (``kda_prefill`` makes it, merged with the head-dim padding where there is
    one); int32 and int64 ``cu_seqlens`` are both served; ``initial_state`` may also be
    bf16 (fla requires fp32); inputs that require grad are refused (``kda_prefill`` has no
    backward), where fla would build a graph.
    """
    _known_kwargs("chunk_kda", kwargs, _KWARGS)
    state_v_first = _renamed_layout(kwargs, state_v_first)

    if cp_context is not None:
        _fail("cp_context", "fla's context object is not mapped: pass None, and for context "
                            "parallel call kreg.families.kda.kda_prefill_cp(..., group=...)")  # fmt: skip
    if _flag("allow_neg_eigval", allow_neg_eigval):
        _fail("allow_neg_eigval", "True (beta in [0, 2)) is not served by kreg; pass False")
    intermediate = _flag("return_intermediate_states", return_intermediate_states)
    if _flag("disable_recompute", disable_recompute) and intermediate:
        _fail("disable_recompute", "must be False with return_intermediate_states=True (as fla)")
    _flag("use_graph", use_graph)
    if max_num_seqs is not None and (
        isinstance(max_num_seqs, bool) or not isinstance(max_num_seqs, int)
    ):
        _fail("max_num_seqs", f"must be an int or None, got {max_num_seqs!r}")
    if use_graph and cu_seqlens is not None and max_num_seqs is not None:
        n = len(cu_seqlens) - 1
        if n != max_num_seqs:
            _fail("max_num_seqs", f"{max_num_seqs}, but cu_seqlens holds {n} sequences: pad it "
                                  "with zero-length sequences to max_num_seqs + 1 entries (as fla)")  # fmt: skip
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in (32, 64) or isinstance(chunk_size, bool):
        _fail("chunk_size", f"must be either 32 or 64 for KDA, got {chunk_size!r}")

    state_layout = "vk" if _flag("state_v_first", state_v_first) else "kv"
    A_log = dt_bias = None
    gate_lower_bound = None
    if _flag("use_gate_in_kernel", use_gate_in_kernel):
        A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
        gate_activation, gate_lower_bound = _in_kernel_gate(lower_bound, A_log)
        if _flag("safe_gate", safe_gate):
            if lower_bound is None:
                _fail("lower_bound", "must be specified when safe_gate=True and "
                                     "use_gate_in_kernel=True")  # fmt: skip
            if not isinstance(lower_bound, (int, float)) or not (-5 <= lower_bound < 0):
                _fail("lower_bound", f"must be in the safe range [-5, 0), got {lower_bound!r}")
    else:
        gate_activation = "none"
        if _flag("safe_gate", safe_gate):
            gate_lower_bound = lower_bound

    states = dict(output_chunk_states=intermediate, chunk_states_size=chunk_size,
                  chunk_states_dtype=q.dtype) if intermediate else {}  # fmt: skip
    out = _run(
        q, k, v, g, beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        gate_lower_bound=gate_lower_bound,
        cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu,
        A_log=A_log,
        dt_bias=dt_bias,
        gate_activation=gate_activation,
        use_qk_l2norm=use_qk_l2norm_in_kernel,
        use_beta_sigmoid=use_beta_sigmoid_in_kernel,
        state_layout=state_layout,
        trim_chunk_states=not (use_graph and cu_seqlens is not None),
        **{name: kwargs[name] for name in ("max_seqlen",) if name in kwargs},
        **states,
    )  # fmt: skip
    if not intermediate:
        return out
    o, final_state, h = out
    return o, final_state, h.view(-1 if cu_seqlens is None else 1, *_rows(h, q, cu_seqlens))


def _rows(h, q, cu_seqlens):
    """fla's [B, NT, ...]: NT rows per batch row (varlen: all of them in the one row)."""
    return ((h.shape[0] // q.shape[0]) if cu_seqlens is None else h.shape[0], *h.shape[1:])


def fused_recurrent_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    scale: float | None = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
):
    """fla 0.6.0's ``fused_recurrent_kda`` (forward only), run by ``kda_prefill``.

    Returns ``(o, final_state)`` as fla does: o ``[B, T, HV, V]`` in v's dtype, final_state
    ``[N, HV, K, V]`` fp32 (``[N, HV, V, K]`` with ``state_v_first``) or None unless
    ``output_final_state``. The dispatcher serves it with ``kda.recurrent`` for decode-shaped
    calls and with ``kda.split`` where that is estimated faster (longer sequences): the same
    recurrence, within rounding.

    Mapping to ``kda_prefill``:

    - ``use_qk_l2norm_in_kernel`` -> ``use_qk_l2norm``; ``use_beta_sigmoid_in_kernel`` ->
      ``use_beta_sigmoid``; ``state_v_first`` -> ``state_layout="vk"``; ``scale``,
      ``initial_state``, ``output_final_state``, ``cu_seqlens`` (int64 or int32) pass through.
    - ``use_gate_in_kernel=True``: with ``lower_bound`` set, ``gate_activation="sigmoid_bound"``
      (``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``; ``A_log`` None: factor 1, as in
      fla); with ``lower_bound`` None, ``gate_activation="softplus"``
      (``-exp(A_log) * softplus(g + dt_bias)``; ``A_log`` is then required: fla would silently
      use the factor exp(1), its chunk_kda refuses, and so does this). ``dt_bias`` ``[HV * K]``
      or ``[HV, K]`` (the layout fla's kernel reads; its docstring's ``[HV]`` is not).
    - ``use_gate_in_kernel=False``: ``A_log``, ``dt_bias`` and ``lower_bound`` are ignored, as
      fla ignores them (g is the log-decay; the recurrence is exact for any g <= 0).
    - kreg's extension in ``**kwargs``: ``initial_state_indices`` (SGLang's name) or
      ``ssm_state_indices`` (fla's and vLLM's kernel-level name), ``[N]`` int32 / int64 slots
      of a state pool passed as ``initial_state`` ``[P, HV, K, V]``: final states are written
      back into the pool in place and the pool is returned as the final state (see
      ``kda_prefill``; fla's public function ignores these names). As fla's kernel, only the
      first N slots are read: vLLM's graph-padded decode passes the slots of the captured
      batch (padded with -1) and ``cu_seqlens`` cut to its N + 1 real offsets.
    - Refused (``ValueError`` naming the argument): ``allow_neg_eigval=True`` (beta in [0, 2)),
      a per-column beta ``[B, T, HV, V]`` (fla's headwise beta), 2-d state indices (fla's
      speculative-decoding layout). Other keyword names raise ``TypeError`` (fla ignores them
      silently).

    Differences from fla: tensors are made contiguous first (fla's ``input_guard`` does the
    same); ``initial_state`` fp32 or bf16 (fla reads any float dtype); inputs that require grad
    are refused (no backward).
    """
    _known_kwargs("fused_recurrent_kda", kwargs, _RECURRENT_KWARGS)
    state_v_first = _renamed_layout(kwargs, state_v_first)
    if "initial_state_indices" in kwargs and "ssm_state_indices" in kwargs:
        _fail("ssm_state_indices", "pass the pool slots once: initial_state_indices or "
                                   "ssm_state_indices")  # fmt: skip
    name = "ssm_state_indices" if "ssm_state_indices" in kwargs else "initial_state_indices"
    indices = kwargs.get(name)
    if isinstance(indices, torch.Tensor) and indices.dim() != 1:
        _fail(name, f"expected [N] slots, got shape {tuple(indices.shape)} (2-d per-token slots "
                    "for speculative decoding are not served)")  # fmt: skip
    n_seqs = _sequence_count(q, cu_seqlens)
    if isinstance(indices, torch.Tensor) and n_seqs is not None and indices.shape[0] > n_seqs:
        indices = indices[:n_seqs]  # a view: no copy, no sync (the pad slots are never read)
    if _flag("allow_neg_eigval", allow_neg_eigval):
        _fail("allow_neg_eigval", "True (beta in [0, 2)) is not served by kreg; pass False")
    if isinstance(beta, torch.Tensor) and isinstance(v, torch.Tensor) and beta.dim() == v.dim():
        _fail("beta", f"per-column beta {tuple(beta.shape)} ([B, T, HV, V]) is not served; pass "
                      "[B, T, HV]")  # fmt: skip
    gate_activation, gate_lower_bound = "none", None
    if _flag("use_gate_in_kernel", use_gate_in_kernel):
        gate_activation, gate_lower_bound = _in_kernel_gate(lower_bound, A_log)
    else:
        A_log = dt_bias = None  # ignored, as fla ignores them
    return _run(
        q, k, v, g, beta,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        gate_lower_bound=gate_lower_bound,
        cu_seqlens=cu_seqlens,
        A_log=A_log,
        dt_bias=dt_bias,
        gate_activation=gate_activation,
        use_qk_l2norm=_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
        use_beta_sigmoid=_flag("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel),
        state_layout="vk" if _flag("state_v_first", state_v_first) else "kv",
        initial_state_indices=indices,
    )  # fmt: skip


def _sequence_count(q, cu_seqlens) -> int | None:
    """N as fla's kernel counts it (from shapes only), or None where the arguments are malformed
    (``kda_prefill`` then names them)."""
    if isinstance(cu_seqlens, torch.Tensor) and cu_seqlens.dim() == 1:
        return max(cu_seqlens.shape[0] - 1, 0)
    if cu_seqlens is None and isinstance(q, torch.Tensor) and q.dim() == 4:
        return q.shape[0]
    return None
