"""fla-core 0.6.0's forward entry points, served by kreg's families: ``chunk_kda`` and
``fused_recurrent_kda`` (``fla/ops/kda/chunk.py``, ``fla/ops/kda/fused_recurrent.py``) by
``kreg.families.kda.kda_prefill``, ``chunk_gated_delta_rule`` and
``fused_recurrent_gated_delta_rule`` (``fla/ops/gated_delta_rule/chunk.py``,
``fla/ops/gated_delta_rule/fused_recurrent.py``) by ``kreg.families.gdn.gdn_prefill``. Each
family's dispatcher runs the recurrent kernel for short sequences and the chunked one for long
ones, whichever function was called.

Moving from fla is one import change::

    from kreg.compat.fla import chunk_kda, fused_recurrent_kda  # was: from fla.ops.kda import ...
    from kreg.compat.fla import chunk_gated_delta_rule  # was: from fla.ops.gated_delta_rule ...

Every argument fla accepts is served or refused with a ``ValueError`` whose message starts with
the argument's name; see each function's docstring for the mapping. The two families' shims
share one argument mapping (the helpers below); what differs is each function's own flags.
"""

from __future__ import annotations

import warnings

import torch

from kreg.families.kda.api import run_prefill as _run

# the keyword-only names fla 0.6.0's chunk_kda reads from ``**kwargs`` (and kreg's max_seqlen)
_KWARGS = ("A_log", "dt_bias", "chunk_size", "transpose_state_layout", "max_seqlen")
# chunk_gated_delta_rule's: fla's gate keywords, and the engines' head_first=False (vLLM and
# SGLang pass it; fla 0.6.0 raises on any head_first)
_GDN_KWARGS = ("use_gate_in_kernel", "A_log", "dt_bias", "chunk_size", "transpose_state_layout",
               "head_first", "max_seqlen")  # fmt: skip
# the fused_recurrent functions': fla's deprecated layout name, and the state pool (kreg's
# extension, under SGLang's name and vLLM's / fla's kernel-level name, with vLLM's
# inplace_final_state)
_RECURRENT_KWARGS = ("transpose_state_layout", "initial_state_indices", "ssm_state_indices",
                     "inplace_final_state")  # fmt: skip
# the family each shim runs: kda_prefill's (the default), or gdn_prefill's (a scalar gate)
_FAMILIES = {"kda": {}, "gdn": dict(family="gdn", gate="scalar")}


def _fail(name: str, message: str):
    raise ValueError(f"{name}: {message}")


def _flag(name: str, value) -> bool:
    if not isinstance(value, bool):
        _fail(name, f"must be a bool, got {value!r}")
    return value


def _known_kwargs(function: str, kwargs: dict, known) -> None:
    """fla ignores unknown keywords silently, which would hide a misspelt ``A_log``."""
    if not kwargs or kwargs.keys() <= set(known):
        return
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        raise TypeError(f"{function}() got unexpected keyword argument(s) {', '.join(unknown)}")


def _renamed_layout(kwargs: dict, state_v_first, stacklevel: int = 3):
    """``state_v_first``, or fla's deprecated ``transpose_state_layout`` (warned, as fla does;
    ``stacklevel`` points the warning at the caller's call)."""
    if "transpose_state_layout" not in kwargs:
        return state_v_first
    if state_v_first:
        _fail("transpose_state_layout", "cannot be passed together with state_v_first "
                                        "(its new name)")  # fmt: skip
    warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.",
                  DeprecationWarning, stacklevel=stacklevel)  # fmt: skip
    return kwargs["transpose_state_layout"]


def _in_kernel_gate(lower_bound, A_log) -> tuple[str, float | None]:
    """fla's ``use_gate_in_kernel=True``: (gate_activation, gate_lower_bound) for kda_prefill.
    With ``lower_bound`` (KDA's) the sigmoid bound; without, softplus, which needs ``A_log``."""
    if lower_bound is not None:
        return "sigmoid_bound", lower_bound
    if A_log is None:
        _fail("A_log", "must be provided when use_gate_in_kernel=True (the softplus gate "
                       "-exp(A_log) * softplus(g + dt_bias); KDA's lower_bound selects the "
                       "sigmoid bound instead)")  # fmt: skip
    return "softplus", None


def _gate(use_gate_in_kernel, lower_bound, A_log, dt_bias) -> tuple:
    """fla's in-kernel gate flag as kda_prefill's (gate_activation, gate_lower_bound, A_log,
    dt_bias); off, A_log and dt_bias are ignored, as fla ignores them (g is the log-decay)."""
    if not _flag("use_gate_in_kernel", use_gate_in_kernel):
        return "none", None, None, None
    return (*_in_kernel_gate(lower_bound, A_log), A_log, dt_bias)


def _no_neg_eigval(allow_neg_eigval) -> None:
    if _flag("allow_neg_eigval", allow_neg_eigval):
        _fail("allow_neg_eigval", "True (beta in [0, 2)) is not served by kreg; pass False")


def _chunk_checks(function: str, kwargs: dict, known, *, state_v_first, allow_neg_eigval,
                  cp_context, cp_hint: str, chunk_sizes: tuple, family: str):  # fmt: skip
    """What fla's chunk functions share: their keywords, the layout's old name, the refused
    context object and negative eigenvalues, and ``chunk_size`` (fla's values for the family,
    accepted: kreg picks its own tiles). Returns (state_v_first, chunk_size)."""
    _known_kwargs(function, kwargs, known)
    state_v_first = _renamed_layout(kwargs, state_v_first, stacklevel=4)
    if cp_context is not None:
        _fail("cp_context", f"fla's context object is not mapped: pass None{cp_hint}")
    _no_neg_eigval(allow_neg_eigval)
    chunk_size = kwargs.get("chunk_size", 64)
    if chunk_size not in chunk_sizes or isinstance(chunk_size, bool):
        allowed = " or ".join(map(str, chunk_sizes))
        _fail("chunk_size", f"must be {allowed} for {family}, got {chunk_size!r}")
    return state_v_first, chunk_size


def _pool_slots(q, cu_seqlens, kwargs: dict):
    """The fused_recurrent functions' state pool (kreg's extension): the slots under SGLang's
    name ``initial_state_indices`` or vLLM's ``ssm_state_indices``, the first N of them (as
    fla's kernel reads them), with vLLM's ``inplace_final_state`` checked against them."""
    if "initial_state_indices" in kwargs and "ssm_state_indices" in kwargs:
        _fail("ssm_state_indices", "pass the pool slots once: initial_state_indices or "
                                   "ssm_state_indices")  # fmt: skip
    name = "ssm_state_indices" if "ssm_state_indices" in kwargs else "initial_state_indices"
    indices = kwargs.get(name)
    if isinstance(indices, torch.Tensor) and indices.dim() != 1:
        _fail(name, f"expected [N] slots, got shape {tuple(indices.shape)} (2-d per-token slots "
                    "for speculative decoding are not served)")  # fmt: skip
    if "inplace_final_state" in kwargs:
        inplace = _flag("inplace_final_state", kwargs["inplace_final_state"])
        if inplace and indices is None:
            _fail("inplace_final_state", "True writes the final states into the pool's slots: "
                                         "pass them as ssm_state_indices (or "
                                         "initial_state_indices)")  # fmt: skip
        if not inplace and indices is not None:
            _fail("inplace_final_state", "False with pool slots (vLLM's per-token states in a "
                                         "new buffer) is not served: kreg writes each "
                                         "sequence's final state into its slot in place")  # fmt: skip
    n_seqs = _sequence_count(q, cu_seqlens)
    if isinstance(indices, torch.Tensor) and n_seqs is not None and indices.shape[0] > n_seqs:
        indices = indices[:n_seqs]  # a view: no copy, no sync (the pad slots are never read)
    return indices


def _recurrent_checks(function: str, kwargs: dict, *, q, v, beta, cu_seqlens, state_v_first,
                      allow_neg_eigval):  # fmt: skip
    """What fla's fused_recurrent functions share: their keywords, the layout's old name, the
    pool slots, and the refused negative eigenvalues and per-column beta. Returns
    (state_v_first, the pool slots or None)."""
    _known_kwargs(function, kwargs, _RECURRENT_KWARGS)
    state_v_first = _renamed_layout(kwargs, state_v_first, stacklevel=4)
    indices = _pool_slots(q, cu_seqlens, kwargs)
    _no_neg_eigval(allow_neg_eigval)
    if isinstance(beta, torch.Tensor) and isinstance(v, torch.Tensor) and beta.dim() == v.dim():
        _fail("beta", f"per-column beta {tuple(beta.shape)} ([B, T, HV, V]) is not served; pass "
                      "[B, T, HV]")  # fmt: skip
    return state_v_first, indices


def _call(family: str, q, k, v, g, beta, *, gate: tuple, use_qk_l2norm_in_kernel,
          use_beta_sigmoid_in_kernel, state_v_first, **options):  # fmt: skip
    """The family's prefill with fla's flags mapped: ``gate`` is ``_gate``'s tuple; ``options``
    the keywords that pass through (scale, states, offsets, slots, chunk states)."""
    gate_activation, gate_lower_bound, A_log, dt_bias = gate
    return _run(
        q, k, v, g, beta,
        gate_lower_bound=gate_lower_bound,
        A_log=A_log,
        dt_bias=dt_bias,
        gate_activation=gate_activation,
        use_qk_l2norm=_flag("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel),
        use_beta_sigmoid=_flag("use_beta_sigmoid_in_kernel", use_beta_sigmoid_in_kernel),
        state_layout="vk" if _flag("state_v_first", state_v_first) else "kv",
        **_FAMILIES[family],
        **options,
    )  # fmt: skip


def _max_seqlen(kwargs: dict) -> dict:
    """kreg's ``max_seqlen`` where given (the engines' bound of the longest sequence)."""
    return {name: kwargs[name] for name in ("max_seqlen",) if name in kwargs}


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
    state_v_first, chunk_size = _chunk_checks(
        "chunk_kda", kwargs, _KWARGS, state_v_first=state_v_first,
        allow_neg_eigval=allow_neg_eigval, cp_context=cp_context,
        cp_hint=", and for context parallel call kreg.families.kda.kda_prefill_cp(..., group=...)",
        chunk_sizes=(32, 64), family="KDA",
    )  # fmt: skip
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

    gate = _gate(use_gate_in_kernel, lower_bound, kwargs.get("A_log"), kwargs.get("dt_bias"))
    if _flag("safe_gate", safe_gate) and use_gate_in_kernel:
        if lower_bound is None:
            _fail("lower_bound", "must be specified when safe_gate=True and "
                                 "use_gate_in_kernel=True")  # fmt: skip
        if not isinstance(lower_bound, (int, float)) or not (-5 <= lower_bound < 0):
            _fail("lower_bound", f"must be in the safe range [-5, 0), got {lower_bound!r}")
    elif safe_gate:  # a precomputed gate: the caller's promise that every gate is >= the bound
        gate = ("none", lower_bound, None, None)

    states = dict(output_chunk_states=intermediate, chunk_states_size=chunk_size,
                  chunk_states_dtype=q.dtype) if intermediate else {}  # fmt: skip
    out = _call(
        "kda", q, k, v, g, beta,
        gate=gate,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        state_v_first=state_v_first,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu,
        trim_chunk_states=not (use_graph and cu_seqlens is not None),
        **_max_seqlen(kwargs),
        **states,
    )  # fmt: skip
    if not intermediate:
        return out
    o, final_state, h = out
    return o, final_state, _per_batch_row(h, q, cu_seqlens)


def _per_batch_row(h, q, cu_seqlens):
    """kda_prefill's chunk states ``[rows, ...]`` as fla's (and SGLang's) ``h``
    ``[B, NT, ...]``: NT rows per batch row (varlen: all of them in the one row)."""
    if cu_seqlens is None:
        return h.view(q.shape[0], h.shape[0] // q.shape[0], *h.shape[1:])
    return h.view(1, *h.shape)


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
      batch (padded with -1) and ``cu_seqlens`` cut to its N + 1 real offsets. vLLM's
      ``inplace_final_state=True`` (its kernels' default) is what the pool does; it needs the
      slots.
    - Refused (``ValueError`` naming the argument): ``allow_neg_eigval=True`` (beta in [0, 2)),
      a per-column beta ``[B, T, HV, V]`` (fla's headwise beta), 2-d state indices (fla's
      speculative-decoding layout), ``inplace_final_state=True`` without slots or ``False``
      with them (vLLM's per-token states). Other keyword names raise ``TypeError`` (fla ignores
      them silently; vLLM's speculative ``num_accepted_tokens`` among them).

    Differences from fla: tensors are made contiguous first (fla's ``input_guard`` does the
    same); ``initial_state`` fp32 or bf16 (fla reads any float dtype); inputs that require grad
    are refused (no backward).
    """
    state_v_first, indices = _recurrent_checks(
        "fused_recurrent_kda", kwargs, q=q, v=v, beta=beta, cu_seqlens=cu_seqlens,
        state_v_first=state_v_first, allow_neg_eigval=allow_neg_eigval,
    )  # fmt: skip
    return _call(
        "kda", q, k, v, g, beta,
        gate=_gate(use_gate_in_kernel, lower_bound, A_log, dt_bias),
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        state_v_first=state_v_first,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
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


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context=None,
    **kwargs,
):
    """fla 0.6.0's ``chunk_gated_delta_rule`` (forward only), run by ``gdn_prefill``.

    Returns ``(o, final_state)`` as fla does: o ``[B, T, HV, V]`` in v's dtype, final_state
    ``[N, HV, K, V]`` fp32 (``[N, HV, V, K]`` with ``state_v_first``) or None unless
    ``output_final_state``. Layouts are fla's: q, k ``[B, T, H, K]``, v ``[B, T, HV, V]``,
    g and beta ``[B, T, HV]`` (one gate per token and value head).

    Mapping to ``gdn_prefill`` (``kda_prefill``'s keywords, a scalar gate):

    - ``use_qk_l2norm_in_kernel`` -> ``use_qk_l2norm``; ``use_beta_sigmoid_in_kernel`` ->
      ``use_beta_sigmoid``; ``state_v_first`` -> ``state_layout="vk"``; ``scale``,
      ``initial_state``, ``output_final_state``, ``cu_seqlens``, ``cu_seqlens_cpu`` pass
      through (device ``cu_seqlens`` alone are never read on the host, as ``chunk_kda``).
    - ``**kwargs`` as fla reads them: ``use_gate_in_kernel=True`` with ``A_log`` ``[HV]``
      (required, as fla asserts) and optional ``dt_bias`` ``[HV]`` ->
      ``gate_activation="softplus"``, ``-exp(A_log) * softplus(g + dt_bias)`` with g the raw
      gate; without it ``A_log`` / ``dt_bias`` are ignored, as fla ignores them.
      ``transpose_state_layout`` (the old name of ``state_v_first``) warns and is served.
    - Accepted, no effect on the result: ``chunk_size`` (16, 32 or 64 as in fla; kreg picks its
      own tiles), ``chunk_indices`` (fla's precomputed chunk table; kreg plans its chunks from
      ``cu_seqlens``), ``head_first=False`` (vLLM's and SGLang's call sites pass it; fla 0.6.0
      raises on any ``head_first``), kreg's ``max_seqlen`` (as in ``chunk_kda``).
    - Refused (``ValueError`` naming the argument): ``allow_neg_eigval=True`` (beta in [0, 2)),
      ``head_first=True``, ``cp_context`` (context parallel is not served for GDN). Other
      keyword names raise ``TypeError`` (fla ignores them silently).

    Differences from fla: as ``chunk_kda``'s (one copy of a non-contiguous input, int32 or
    int64 offsets, inputs that require grad refused).
    """
    state_v_first, _ = _chunk_checks(
        "chunk_gated_delta_rule", kwargs, _GDN_KWARGS, state_v_first=state_v_first,
        allow_neg_eigval=allow_neg_eigval, cp_context=cp_context,
        cp_hint=" (context parallel is not served for GDN)", chunk_sizes=(16, 32, 64),
        family="Gated Delta Rule",
    )  # fmt: skip
    if _flag("head_first", kwargs.get("head_first", False)):
        _fail("head_first", "True ([B, H, T, ...] inputs) is not served (fla removed it): pass "
                            "[B, T, H, ...] tensors")  # fmt: skip
    if chunk_indices is not None and not isinstance(chunk_indices, torch.Tensor):
        _fail("chunk_indices", f"expected a tensor or None, got {type(chunk_indices).__name__}")
    return _call(
        "gdn", q, k, v, g, beta,
        gate=_gate(kwargs.get("use_gate_in_kernel", False), None, kwargs.get("A_log"),
                   kwargs.get("dt_bias")),
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        state_v_first=state_v_first,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        cu_seqlens_cpu=cu_seqlens_cpu,
        **_max_seqlen(kwargs),
    )  # fmt: skip


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
):
    """fla 0.6.0's ``fused_recurrent_gated_delta_rule`` (forward only), run by ``gdn_prefill``
    (``kda_prefill`` for a per-key gate ``gk``).

    Returns ``(o, final_state)`` as fla does (final_state None unless ``output_final_state``,
    or the pool with its slots). The dispatcher serves decode-shaped calls with
    ``gdn.recurrent`` and longer ones with ``gdn.split``: the same recurrence, within rounding.

    Mapping (as ``fused_recurrent_kda``'s, with these differences):

    - ``g`` ``[B, T, HV]``: the log-decay, or with ``use_gate_in_kernel=True`` the raw gate of
      ``-exp(A_log) * softplus(g + dt_bias)`` (``A_log`` required, as fla; ``A_log`` and
      ``dt_bias`` ``[HV]``). ``g`` None (and no ``gk``): no decay, a zero log-decay (fla's
      plain delta rule); with ``use_gate_in_kernel`` it is refused, as fla refuses it.
    - ``gk`` ``[B, T, HV, K]`` alone (a per-key log-decay): served by ``kda_prefill`` (KDA's
      gate). ``beta`` None: ones, as fla (then the sigmoid with
      ``use_beta_sigmoid_in_kernel``, as fla's kernel applies it).
    - The state pool as in ``fused_recurrent_kda``: ``initial_state_indices`` or vLLM's
      ``ssm_state_indices`` (with ``inplace_final_state=True``, vLLM's default) in
      ``**kwargs``, the pool written in place and returned.
    - Refused (``ValueError`` naming the argument): ``gv`` (a per-value decay, which no kreg
      kernel applies), ``gk`` together with ``g`` or with ``use_gate_in_kernel`` (fla activates
      only ``g``), and what ``fused_recurrent_kda`` refuses (``allow_neg_eigval=True``, a
      per-column beta, 2-d slots, a mismatched ``inplace_final_state``). Other keyword names
      raise ``TypeError``.
    """
    state_v_first, indices = _recurrent_checks(
        "fused_recurrent_gated_delta_rule", kwargs, q=q, v=v, beta=beta, cu_seqlens=cu_seqlens,
        state_v_first=state_v_first, allow_neg_eigval=allow_neg_eigval,
    )  # fmt: skip
    family, gate = "gdn", _gate(use_gate_in_kernel, None, A_log, dt_bias)
    if gv is not None:
        _fail("gv", "a per-value decay [B, T, HV, V] is not served by kreg (its kernels decay "
                    "the state along K only); pass g or gk")  # fmt: skip
    if gk is not None:
        if g is not None or use_gate_in_kernel:
            _fail("gk", "is served alone (a per-key log-decay, KDA's gate): fold g into it "
                        "(gk + g[..., None]) and pass no g, without use_gate_in_kernel")  # fmt: skip
        family, g = "kda", gk
    elif g is None:
        if use_gate_in_kernel:
            _fail("g", "the raw gate input is required with use_gate_in_kernel=True (as fla)")
        g = _filled(v, 0.0, torch.float32)  # no decay: exp(0) = 1 at every step
    if beta is None:
        beta = _filled(v, 1.0, q.dtype if isinstance(q, torch.Tensor) else torch.float32)
    return _call(
        family, q, k, v, g, beta,
        gate=gate,
        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        use_beta_sigmoid_in_kernel=use_beta_sigmoid_in_kernel,
        state_v_first=state_v_first,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
        initial_state_indices=indices,
    )  # fmt: skip


def _filled(v, value: float, dtype):
    """A ``[B, T, HV]`` tensor of ``value`` beside v (fla's absent g or beta), or None where v
    is malformed (``kda_prefill`` then names v)."""
    if not isinstance(v, torch.Tensor) or v.dim() != 4:
        return None
    return torch.full(v.shape[:3], value, dtype=dtype, device=v.device)
