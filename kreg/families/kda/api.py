"""``kda_prefill``: the public entry point of the KDA family.

Every argument is checked before any kernel launch; a bad one raises ``ValueError`` whose message
starts with its name. A tensor that requires grad (with grad enabled) is refused: there is no
backward yet, and a silently dropped gradient is worse than an error.
CUDA tensors run the compiled kernels; CPU tensors run the same kernels under the Triton
interpreter (``TRITON_INTERPRET=1`` must be set before kreg is imported).
"""

from __future__ import annotations

import inspect
import math
import numbers

import attrs
import numpy as np
import torch

from kreg.dispatch import select, selector
from kreg.problems import LinearAttentionProblem
from kreg.problems.linear_attention import STATE_LAYOUTS, check_gate
from kreg.registry.interpreter import interpreting
from kreg.registry.targets import resolve

from . import launch, plans
from .selection import FAMILY_NAME
from .specs import CHUNKS, HEAD_DIMS, MAX_HEAD_DIM, padded_head_dim, reads_caller_dims

_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_STATE_DTYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}
_CHUNK_STATE_DTYPES_BY_NAME = {name: dt for dt, name in _DTYPES.items()}
# chunk states every chunk_states_size tokens: a multiple of the smallest kernel chunk
_CHUNK_STATES_QUANTUM = min(CHUNKS)


def kda_prefill(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    *,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    gate_lower_bound: float | None = None,
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.Tensor | None = None,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    gate_activation: str = "none",
    use_qk_l2norm: bool = False,
    use_beta_sigmoid: bool = False,
    state_layout: str = "kv",
    output_chunk_states: bool = False,
    algorithm: str = "auto",
    allow_opt_in: bool = False,
    target=None,
    max_seqlen: int | None = None,
    initial_state_indices: torch.Tensor | None = None,
    initial_state_indices_cpu: torch.Tensor | None = None,
    chunk_states_size: int = 64,
    chunk_states_dtype: torch.dtype = torch.float32,
):
    """KDA prefill or decode step. Returns ``(o, final_state)``, or
    ``(o, final_state, chunk_states)`` with ``output_chunk_states``.

    One entry for both: the dispatcher serves short sequences (decode, a few speculative
    tokens) with ``kda.recurrent``, the token-serial recurrence, and longer ones with the
    chunked ``kda.split``, whichever its latency model estimates cheaper for the longest
    sequence (``kreg explain`` shows the estimates).

    Layouts (as the public peers): q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g ``[B, T, HV, K]``
    (log-decay, or the raw gate input with ``gate_activation``); beta ``[B, T, HV]``; states
    ``[B or N, HV, K, V]`` fp32 (``[.., V, K]`` with ``state_layout="vk"``; the initial state may
    be bf16). HV is a multiple of H: value head hv reads qk head ``hv // (HV // H)``. K and V
    are any size up to 256; sizes other than 32, 64, 128, 256 run at the next one, exactly: the
    chunked paths read and write the caller's tensors through masked tiles, the token-serial
    decode step runs on zero-padded copies (``_pad_inputs``; the note there). Tensors of any
    strides are served: a non-contiguous one costs one copy (``_kernel_inputs``).

    ``gate_lower_bound``: None (the default) serves any gate g <= 0 exactly, ``-inf`` (a hard
    reset) and gates of any magnitude included. A number is a promise that every per-step
    log-decay (natural log) is >= it, which admits the faster block-anchor specs; a row that
    breaks the promise so far that those specs' exponents would leave fp32's range gets NaN
    outputs from there on (and a NaN state), never a silently wrong value. With
    ``gate_activation="sigmoid_bound"`` it is the activation's bound (required).
    Non-finite inputs are contained: a NaN or infinity in k, v, g (other than -inf) or beta at
    position t makes the outputs from t on NaN and leaves every earlier output bit for bit as
    it was; one in q reaches only its own row. With an activation in the kernel the rule is on
    its output: a raw gate of +-inf that the gate activation maps to a finite decay, or a beta
    logit of +-inf that the sigmoid maps to 1 or 0, is served exactly as that value.
    ``gate_activation``: "none" (g is the log-decay), "sigmoid_bound"
    (``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``) or "softplus"
    (``-exp(A_log) * softplus(g + dt_bias)``), computed inside the prep kernel.
    ``cu_seqlens``: int64 or int32 ``[N + 1]`` sequence offsets of a packed batch (B == 1).
    Device offsets alone (as engines pass them) are never read on the host: no device sync, and
    the call can be captured in a CUDA graph. Their values are then not validated: they must run
    from 0 to T, non-decreasing; the chunked paths' first kernel clamps them into [0, T] and
    makes them non-decreasing before the others read them, the decode step's kernel clamps each
    sequence's pair (start and end in [0, T], end >= start): valid offsets pass unchanged, others
    give wrong outputs, never an out-of-bounds access. Offsets readable without a sync (a CPU
    ``cu_seqlens``, or ``cu_seqlens_cpu``, a host copy beside the device tensor) are validated
    (a bad value raises, naming ``cu_seqlens``) and the kernels read a device copy of that copy
    (under CUDA graph capture the captured device tensor, whose replays' values count).
    ``max_seqlen``: with ``cu_seqlens``, an upper bound of the longest sequence's length (the
    engines' ``max_seqlen``), which plans the scan (its serial chain is as long as the longest
    sequence, so a long sequence among short ones gets a sequence-parallel scan) and the choice
    between the recurrence and the chunked form. None (the default): the longest length read
    from the host copy where there is one (a given bound must be >= it), else the mean length,
    ``ceil(T / N)``. Results never depend on the plan: a sequence longer than planned is
    served exactly, only slower. Without ``cu_seqlens``: None or T.
    ``output_chunk_states``: also return the states for prefix caching: the state at the start
    of every ``chunk_states_size`` tokens of each sequence (default 64, as fla; a positive
    multiple of 16, the smallest kernel chunk: 64 and its multiples are served by every spec,
    others only by the specs whose chunk divides them), ``[rows, HV, K, V]`` (``[.., V, K]``
    with ``state_layout="vk"``), rows ``B * ceil(T / size)``, or with ``cu_seqlens`` the sum of
    ``ceil(length / size)`` in sequence order; in ``chunk_states_dtype`` (fp32, the default,
    bf16 or fp16: rounded from the fp32 state on the store). Independent of the kernels'
    chunk. With device offsets alone the host cannot know how many rows are written: the buffer
    comes back whole (``ceil(T / size) + N - 1`` rows, the written ones first).

    Host time: a call whose key (``plan_key``: shapes, dtypes, devices, 16-byte alignment,
    contiguity, options, grad mode) was seen before replays the kernel launches recorded for
    that key (``plans``), with fresh outputs. Calls whose values are read on the host
    (``cu_seqlens_cpu``, CPU offsets or slots), head dims run on zero-padded copies (the decode
    step's), strided inputs and the chunked form of a pool take the normal path every time.

    State pools (the serving engines' state cache): ``initial_state`` a pool ``[P, HV, K, V]``
    (``[P, HV, V, K]`` with ``state_layout="vk"``; fp32 or bf16) and ``initial_state_indices``
    ``[N]`` int32 or int64 on q's device: sequence n starts from slot ``indices[n]`` and its
    final state is written back into that slot, in place; the returned final state is the pool
    itself, whatever ``output_final_state``. A negative index (SGLang's padding slot, -1)
    starts from zeros and writes nothing back. ``kda.recurrent`` (decode) reads and writes the
    slots in its kernel; the chunked form (prefill) gathers the N slots' states into a buffer
    and scatters the N final states back (``launch.gather_slots``, ``launch.scatter_slots``: torch ops
    without a device sync, so a captured graph can hold them). The pool must be contiguous
    (a strided one is refused: it would be read through a copy). The index values
    are checked before launch (an index >= P, or a slot two sequences share, raises
    ``ValueError`` naming ``initial_state_indices``) when they are readable without a device
    sync: CPU indices, or ``initial_state_indices_cpu``, a host copy of the device indices,
    whose values the kernel then trusts the device tensor to equal. Device indices alone (a
    graph-captured decode step) are not read on the host: an index >= P then makes that
    sequence's outputs NaN and touches no memory outside the pool; a repeated slot is not
    detected (two sequences write one slot, the last writer wins). Under CUDA graph capture
    pass device indices; the captured graph reads them at every replay. int32 indices are
    converted to int64 on the device (one small kernel; pass int64 to avoid it).
    """
    return run_prefill(
        q, k, v, g, beta, scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, gate_lower_bound=gate_lower_bound,
        cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, A_log=A_log, dt_bias=dt_bias,
        gate_activation=gate_activation, use_qk_l2norm=use_qk_l2norm,
        use_beta_sigmoid=use_beta_sigmoid, state_layout=state_layout,
        output_chunk_states=output_chunk_states, max_seqlen=max_seqlen,
        chunk_states_size=chunk_states_size, chunk_states_dtype=chunk_states_dtype,
        initial_state_indices=initial_state_indices,
        initial_state_indices_cpu=initial_state_indices_cpu,
        algorithm=algorithm, allow_opt_in=allow_opt_in, target=target,
    )  # fmt: skip


PREFILL_SIGNATURE = inspect.signature(kda_prefill)
PREFILL_DEFAULTS = {n: p.default for n, p in PREFILL_SIGNATURE.parameters.items()
                    if p.default is not p.empty}  # fmt: skip


def prefill_arguments(q, k, v, g, beta, **options) -> dict:
    """Every argument of ``kda_prefill`` by name, its defaults filled in, as a call binds them:
    the one signature the other entries (custom op, context parallel) take their keywords from.
    An unknown or repeated keyword raises ``TypeError``, as the call would."""
    bound = PREFILL_SIGNATURE.bind(q, k, v, g, beta, **options)
    bound.apply_defaults()
    return bound.arguments


def given(arguments: dict, name: str) -> bool:
    """Whether ``arguments`` (``prefill_arguments``) sets ``name`` other than to its default."""
    value, default = arguments[name], PREFILL_DEFAULTS[name]
    if default is None:
        return value is not None
    return not (type(value) is type(default) and value == default)


def validated(arguments: dict) -> dict:
    """The options of ``arguments`` (``prefill_arguments``) that ``_validate`` checks, by name."""
    return {name: arguments[name] for name in _VALIDATED}


def run_prefill(q, k, v, g, beta, *, algorithm="auto", allow_opt_in=False, target=None,
                trim_chunk_states=True, family=FAMILY_NAME, gate="per_channel",
                **options):  # fmt: skip
    """``kda_prefill`` (``options``: its other keywords, ``_prepare``'s defaults for the rest);
    ``family`` and ``gate`` are the entry's: the family whose candidates serve the call, and
    its gate kind (``"scalar"``: g ``[B, T, HV]``, GDN's entries);
    ``trim_chunk_states=False`` returns a varlen call's whole chunk-state buffer
    (``launch.chunk_state_rows`` rows, the written ones first: what fla's ``use_graph``
    returns, the same rows whatever the offsets, as a captured graph needs).

    The thin path: a call whose key (``plan_key``) was seen replays the launches of the first
    call of that key (``plans``), skipping validation, selection and argument handling, none of
    which can come out otherwise for the same key."""
    key = plan_key(q, k, v, g, beta, options,
                   (algorithm, allow_opt_in, target, trim_chunk_states, family, gate))  # fmt: skip
    try:
        entry = _plans.get(key) if key is not None else False
    except TypeError:  # an unhashable option: the normal path names it
        key, entry = None, False
    if entry:
        return entry.run(_plan_inputs(q, k, v, g, beta, options))
    problem, call = _prepare(q, k, v, g, beta, gate=gate, **options)
    selection = select(problem, _target(q, target), family=family, algorithm=algorithm,
                       allow_opt_in=allow_opt_in)  # fmt: skip
    if entry is None:  # recorded when seen again: a key seen once (a new T) costs no recording
        if len(_plans) >= _MAX_PLANS:
            _plans.clear()
        _plans[key] = _SEEN
    if entry is not _SEEN:
        return run_selection(selection, call, problem, trim_chunk_states)
    inputs = _plan_inputs(q, k, v, g, beta, options)
    with plans.Recorder(_plan_roles(call, inputs), q.device) as recorder:
        out = run_selection(selection, call, problem, trim_chunk_states)
    _plans[key] = recorder.plan(out) or False  # False: replays cannot serve this key
    return out


# plan_key -> plans.Plan; _SEEN (seen once); False: its calls take the normal path
_plans: dict = {}
_SEEN = 0
_MAX_PLANS = 4096  # keys of many packed lengths (an engine's prefills) must not grow without end
# the launch call's tensors a plan takes from each call, by role (``_plan_inputs``)
_PLAN_ROLES = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias", "cu_seqlens",
               "state_indices")  # fmt: skip
_PLAIN = frozenset((type(None), bool, int, float, str))  # no tensor: isinstance costs 0.1 us
_TENSOR = object()  # marks an option's tensor in a key: no value a caller passes equals it
_PLAN_TENSORS = ("initial_state", "cu_seqlens", "cu_seqlens_cpu", "A_log", "dt_bias",
                 "initial_state_indices", "initial_state_indices_cpu")  # fmt: skip


def clear_plans() -> None:
    """Forget the cached plans (with ``selector.clear_cache``: a new tuning table)."""
    _plans.clear()


def plan_key(q, k, v, g, beta, options: dict, extra: tuple):
    """The key of a call's plan, or None where a call is not planned: a tensor's values are read
    on the host (``cu_seqlens_cpu``, host pool indices), a non-tensor sits where a tensor goes, a
    tensor where a number goes (an unhashable key: no plan). Everything validation and the
    launches read, but no tensor value: a call of a known key passes validation as the first
    one did, selects the same candidate and spec, and launches the same kernels with the same
    integers and grids. Of a tensor: shape, dtype, device, contiguity, 16-byte alignment
    (Triton specialises pointers on it), and with grad on whether it requires grad (validation
    refuses it then, and only then). One flat tuple: the key is made on every call."""
    try:  # a tensor without strided storage (sparse, nested) has no data_ptr: the normal path
        # names it
        grad = torch.is_grad_enabled()
        # the options' names in order; every number with its type: True == 1 == 1.0, and a flag
        # given as 1 must miss a plan made for True (validation refuses it; a replay would not)
        key = [*extra, *map(type, extra), grad, selector.generation(), *options]
        for x in (q, k, v, g, beta):
            if not isinstance(x, torch.Tensor):
                return None
            key += (x.shape, x.dtype, x.device, x.is_contiguous(), x.data_ptr() & 15)
            if grad:
                key.append(x.requires_grad)
        for name, x in options.items():
            kind = type(x)
            if kind in _PLAIN or not isinstance(x, torch.Tensor):
                key += (kind, x)
                continue
            if name not in _PLAN_TENSORS:
                return None  # a 0-d scale tensor: its value is read
            key += (_TENSOR, x.shape, x.dtype, x.device, x.is_contiguous(), x.data_ptr() & 15)
            if grad:
                key.append(x.requires_grad)
        cu, indices = options.get("cu_seqlens"), options.get("initial_state_indices")
        if (
            isinstance(cu, torch.Tensor)
            and _readable_offsets(cu, options.get("cu_seqlens_cpu")) is not None
        ):
            return None  # validated on the host every call; the longest sequence read from it
        if (
            isinstance(indices, torch.Tensor)
            and _readable_slots(indices, options.get("initial_state_indices_cpu")) is not None
        ):
            return None  # validated on the host every call
        if (
            q.is_cuda
        ):  # CUDA is initialised (q is on it): torch.cuda.current_device() less its checks
            key.append(torch._C._cuda_getDevice())
        return tuple(key)
    except (RuntimeError, NotImplementedError):
        return None


def _plan_inputs(q, k, v, g, beta, options: dict) -> dict:
    """The launch call's tensors of a planned call by role, as ``make_call`` derives them for a
    key that has a plan (``_plan_roles`` checks it at record time): the caller's tensors as
    given (contiguous, at the kernels' head dims), the pool slots as the kernels read them."""
    indices = options.get("initial_state_indices")
    return dict(q=q, k=k, v=v, g=g, beta=beta, initial_state=options.get("initial_state"),
                A_log=options.get("A_log"), dt_bias=options.get("dt_bias"),
                cu_seqlens=options.get("cu_seqlens"),
                state_indices=None if indices is None else _device_slots(indices))  # fmt: skip


def _plan_roles(call: launch.Call, inputs: dict) -> dict:
    """The recorded call's tensors by role, where a replay's ``_plan_inputs`` stand for them:
    the same memory (a view such as A_log [1, 1, HV, 1] read as [HV] is the same memory). A
    tensor made per call (a padded or contiguous copy) gets no role: the recorder then finds an
    argument it cannot name and makes no plan."""
    roles = {}
    for name in _PLAN_ROLES:
        made, given = getattr(call, name), inputs[name]
        if made is None or given is None:
            continue
        if name == "state_indices" or (made.data_ptr() == given.data_ptr()
                                       and made.dtype == given.dtype):  # fmt: skip
            roles[name] = made
    return roles


def run_selection(selection, call: launch.Call, problem: LinearAttentionProblem,
                  trim_chunk_states: bool = True):  # fmt: skip
    """Launch the selected candidate's kernels on prepared tensors (``candidate.run``): on the
    caller's tensors where the spec reads their head dims (masked tiles), else on zero-padded
    copies, whose outputs are given back at the caller's head dims (a pool is always at the
    kernels' head dims, ``_validate``, so it comes back whole)."""
    padded = not reads_caller_dims(selection.spec)
    if padded:
        call = pad_call(call, problem)
    o, ht, hs = selection.candidate.run(call, selection.spec)
    if padded:
        o, ht = _unpad(o, problem, "o"), _unpad(ht, problem, problem.state_layout)
    if not problem.output_chunk_states:
        return o, ht
    if trim_chunk_states:
        rows = _total_chunks(call, call.chunk_states_size)
        hs = hs[:rows] if rows is not None and rows < hs.shape[0] else hs
    return o, ht, _unpad(hs, problem, problem.state_layout) if padded else hs


def _total_chunks(call: launch.Call, chunk: int) -> int | None:
    """The chunk-state rows written, or None where only the device knows (device offsets)."""
    if call.cu_seqlens is None:
        return call.q.shape[0] * -(-call.q.shape[1] // chunk)
    if call.cu_seqlens_host is None:
        return None
    lens = call.cu_seqlens_host[1:] - call.cu_seqlens_host[:-1]
    return int(((lens + chunk - 1) // chunk).sum())


def _target(q: torch.Tensor, target):
    from kreg.registry import get_registry

    registry = get_registry()
    if target is not None:
        return resolve(registry.targets, target)
    if q.device.type == "cpu":
        return registry.targets["sm90"]  # interpreter runs: select with sm90's rules
    found = _detected(q.device.index, registry)
    if found is None:
        raise ValueError(f"target: no registered target matches the device of q ({q.device})")
    return found


_detected_targets: dict = {}


def _detected(index, registry):
    """detect() once per (device, registry): reading device properties costs ~30 us a call."""
    from kreg.registry.targets import detect

    key = (index, id(registry))
    if key not in _detected_targets:
        with torch.cuda.device(index):
            _detected_targets[key] = detect(registry.targets.values())
    return _detected_targets[key]


def _fail(name: str, message: str):
    raise ValueError(f"{name}: {message}")


_Q_DIMS = ("B", "T", "H", "K")
_V_DIMS = ("B", "T", "HV", "V")
# every tensor input whose gradient kda_prefill would drop
_GRAD_ARGS = ("q", "k", "v", "g", "beta", "initial_state", "A_log", "dt_bias")
_OFFSET_DTYPES = (torch.int64, torch.int32)


def _check_4d(name, x, dims):
    layout = f"[{', '.join(dims)}]"
    if not isinstance(x, torch.Tensor):
        _fail(name, f"expected a 4-d torch.Tensor {layout}, got {type(x).__name__}")
    _check_strided(name, x)
    if x.dim() != 4:
        _fail(name, f"expected a 4-d torch.Tensor {layout}, got shape {tuple(x.shape)}")
    for dim, size in zip(dims, x.shape, strict=True):
        if size == 0:
            _fail(name, f"dimension {dim} of {layout} is 0 (shape {tuple(x.shape)}): every "
                        "dimension must be positive")  # fmt: skip


def _check_strided(name, x) -> None:
    """The kernels read memory through strides: a sparse or other layout has none to read."""
    if x.layout is not torch.strided:
        _fail(name, f"must be a dense (strided) tensor, got layout {x.layout}")


def _check_tensor(name, x, shape, dtypes, device):
    if not isinstance(x, torch.Tensor):
        _fail(name, f"expected a torch.Tensor, got {type(x).__name__}")
    _check_strided(name, x)
    if tuple(x.shape) != tuple(shape):
        _fail(name, f"expected shape {tuple(shape)}, got {tuple(x.shape)}")
    if x.dtype not in dtypes:
        _fail(name, f"dtype {x.dtype} not supported here (allowed: {', '.join(map(str, dtypes))})")
    if x.device != device:
        _fail(name, f"on {x.device}, but q is on {device}")


def _check_no_grad(named) -> None:
    """There is no backward: a call autograd would record must not drop gradients silently."""
    if not torch.is_grad_enabled():
        return
    for name, x in named:
        if isinstance(x, torch.Tensor) and x.requires_grad:
            _fail(name, "requires grad; kreg's delta-rule kernels (kda_prefill, gdn_prefill) "
                        "have no backward yet: call under torch.no_grad() or detach")  # fmt: skip


def _real(name: str, x) -> float:
    """A finite float from a Python or numpy real, or a 0-d CPU tensor (reading a device tensor
    would synchronise with the device). Bools, strings and non-finite values are rejected."""
    if isinstance(x, torch.Tensor):
        if x.dim() != 0:
            _fail(name, f"must be a finite number or a 0-d tensor, got shape {tuple(x.shape)}")
        if x.device.type != "cpu":
            _fail(name, f"a 0-d tensor on {x.device} would need a device sync to read; pass a "
                        "Python float or a CPU tensor")  # fmt: skip
        if x.dtype == torch.bool or x.is_complex():
            _fail(name, f"must be a finite number, got a {x.dtype} tensor")
        _check_no_grad([(name, x)])
        x = x.item()
    if isinstance(x, (bool, np.bool_)) or not isinstance(x, numbers.Real):
        _fail(name, f"must be a finite number, got {x!r}")
    x = float(x)
    if not math.isfinite(x):
        _fail(name, f"must be a finite number, got {x!r}")
    return x


class Checked:
    """What ``_validate`` derives: the scale, the gate parameters in the kernels' layout (or None)
    and the fields of the ``LinearAttentionProblem`` (sizes may be symbolic while tracing)."""

    __slots__ = ("scale", "A_log", "dt_bias", "fields")

    _SIZES = ("batch", "seq_len", "heads_qk", "heads_v", "head_dim_k", "head_dim_v", "num_seqs",
              "max_seqlen")  # fmt: skip

    def __init__(self, scale, A_log, dt_bias, fields):
        self.scale, self.A_log, self.dt_bias, self.fields = scale, A_log, dt_bias, fields

    def problem(self, **fields) -> LinearAttentionProblem:
        """The problem, ``fields`` (the longest sequence, read from the offsets) replacing
        ``_validate``'s."""
        # int(): selection needs concrete sizes; under dynamic shapes this specialises them
        return LinearAttentionProblem(**{
            k: int(v) if k in self._SIZES and v is not None else v
            for k, v in {**self.fields, **fields}.items()
        })  # fmt: skip


def _validate(
    q, k, v, g, beta, scale, initial_state, output_final_state, gate_lower_bound, cu_seqlens,
    cu_seqlens_cpu, A_log, dt_bias, gate_activation, use_qk_l2norm, use_beta_sigmoid,
    state_layout, output_chunk_states, max_seqlen=None, initial_state_indices=None,
    initial_state_indices_cpu=None, chunk_states_size=64, chunk_states_dtype=torch.float32,
    *, gate=None,
) -> Checked:  # fmt: skip
    """Every check that reads no tensor's values: types, shapes, dtypes, devices,
    scalars, flags, and gradients. The one place of each check, shared by ``_prepare`` and the
    custom op's fake implementation, so eager and traced calls fail with the same message.
    ``gate`` is the entry's gate kind: "per_channel" (KDA: g ``[B, T, HV, K]``, dt_bias
    ``[HV, K]``) or "scalar" (GDN: g ``[B, T, HV]``, dt_bias ``[HV]``); None: g's own (tests
    that prepare calls directly)."""
    _check_4d("q", q, _Q_DIMS)
    if q.dtype not in _DTYPES:
        _fail("q", f"dtype {q.dtype} not supported (bf16, fp16, fp32)")
    B, T, H, K = q.shape
    device = q.device
    _check_4d("v", v, _V_DIMS)
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        _fail("v", f"value heads HV={HV} must be a multiple of qk heads H={H}")
    for name, dim in (("q", K), ("v", V)):
        if dim > MAX_HEAD_DIM:
            _fail(name, f"head dim {dim} not supported (at most {MAX_HEAD_DIM}; below that any "
                        f"size, run at the next of {HEAD_DIMS})")  # fmt: skip
    act_dtypes = (q.dtype,)
    _check_tensor("q", q, (B, T, H, K), act_dtypes, device)
    _check_tensor("k", k, (B, T, H, K), act_dtypes, device)
    _check_tensor("v", v, (B, T, HV, V), act_dtypes, device)
    if gate is None:
        gate = "scalar" if isinstance(g, torch.Tensor) and g.dim() == 3 else "per_channel"
    scalar = gate == "scalar"
    other = (B, T, HV, K) if scalar else (B, T, HV)  # the other family's gate, exactly
    if isinstance(g, torch.Tensor) and tuple(g.shape) == other:
        _fail("g", f"got shape {tuple(g.shape)}: "
                   + ("a per-channel gate [B, T, HV, K] is KDA's (kda_prefill); this entry takes "
                      "a scalar gate [B, T, HV]" if scalar else
                      "a scalar gate [B, T, HV] is GDN's (gdn_prefill); this entry takes a "
                      "per-channel gate [B, T, HV, K]"))  # fmt: skip
    _check_tensor("g", g, (B, T, HV) if scalar else (B, T, HV, K), (q.dtype, torch.float32),
                  device)  # fmt: skip
    _check_tensor("beta", beta, (B, T, HV), (q.dtype, torch.float32), device)

    scale = K**-0.5 if scale is None else _real("scale", scale)
    check_gate(gate_activation, gate_lower_bound)
    if gate_activation == "none" and (A_log is not None or dt_bias is not None):
        _fail("A_log" if A_log is not None else "dt_bias",
              "only used with gate_activation 'sigmoid_bound' or 'softplus'")  # fmt: skip

    # the engines' layouts: A_log [1, 1, HV, 1] (any shape of HV elements), dt_bias [HV, K]
    # (a scalar gate's dt_bias: [HV], or any shape of HV elements)
    def per_head(s):
        return math.prod(s) == HV and all(d in (1, HV) for d in s)

    A_log_view = _gate_param("A_log", A_log, (HV,), per_head,
                             " or any shape of HV elements, such as (1, 1, HV, 1)", device)  # fmt: skip
    if scalar:
        dt_bias_view = _gate_param("dt_bias", dt_bias, (HV,), per_head,
                                   " or any shape of HV elements", device)  # fmt: skip
    else:
        dt_bias_view = _gate_param("dt_bias", dt_bias, (HV * K,), lambda s: s == (HV, K),
                                   f" or (HV, K) = {(HV, K)}", device)  # fmt: skip
    for name, flag in (("output_final_state", output_final_state),
                       ("use_qk_l2norm", use_qk_l2norm), ("use_beta_sigmoid", use_beta_sigmoid),
                       ("output_chunk_states", output_chunk_states)):  # fmt: skip
        if not isinstance(flag, bool):
            _fail(name, f"must be a bool, got {flag!r}")
    if state_layout not in STATE_LAYOUTS:
        _fail("state_layout", f"must be one of {STATE_LAYOUTS}, got {state_layout!r}")
    chunk_states_size, chunk_states_dtype = check_chunk_states(chunk_states_size,
                                                               chunk_states_dtype)  # fmt: skip

    n_seqs = _check_cu_seqlens(cu_seqlens, cu_seqlens_cpu, B, device)
    varlen = n_seqs is not None
    n_seqs = n_seqs if varlen else B
    max_seqlen = _check_max_seqlen(max_seqlen, T, varlen)
    pool = _check_pool_indices(initial_state_indices, initial_state_indices_cpu, n_seqs, device)
    if pool and (padded_head_dim(K), padded_head_dim(V)) != (K, V):
        _fail("initial_state_indices", f"a state pool needs kernel head dims {HEAD_DIMS} (K={K}, "
                                       f"V={V} would run zero-padded, on a copy of the pool: "
                                       "not in place)")  # fmt: skip
    if pool and initial_state is None:
        _fail("initial_state", "the state pool [P, HV, K, V] is required with "
                               "initial_state_indices")  # fmt: skip
    as_pool = pool and isinstance(initial_state, torch.Tensor) and initial_state.dim() == 4
    n_states = initial_state.shape[0] if as_pool else n_seqs
    state_shape = (n_states, HV, K, V) if state_layout == "kv" else (n_states, HV, V, K)
    state_dtype = "fp32"
    if initial_state is not None:
        _check_tensor("initial_state", initial_state, state_shape, tuple(_STATE_DTYPES), device)
        state_dtype = _STATE_DTYPES[initial_state.dtype]
        if as_pool and not initial_state.is_contiguous():
            _fail("initial_state", "a state pool must be contiguous: it is written in place, "
                                   "and the kernels would read a strided one through a copy "
                                   "(the writes lost)")  # fmt: skip
    _check_no_grad(zip(_GRAD_ARGS, (q, k, v, g, beta, initial_state, A_log, dt_bias), strict=True))

    fields = dict(
        batch=B, seq_len=T, heads_qk=H, heads_v=HV, head_dim_k=K, head_dim_v=V,
        dtype=_DTYPES[q.dtype], gate=gate, gate_lower_bound=gate_lower_bound,
        gate_activation=gate_activation, qk_l2norm=use_qk_l2norm,
        beta_sigmoid=use_beta_sigmoid, initial_state=initial_state is not None,
        state_dtype=state_dtype, output_final_state=output_final_state or pool,
        state_layout=state_layout, output_chunk_states=output_chunk_states,
        varlen=varlen, num_seqs=n_seqs, max_seqlen=max_seqlen, state_pool=pool,
    )  # fmt: skip
    if output_chunk_states:  # else the defaults: one problem, whatever they were
        fields |= dict(chunk_states_size=chunk_states_size, chunk_states_dtype=chunk_states_dtype)
    return Checked(float(scale), A_log_view, dt_bias_view, fields)


def _check_device(q) -> None:
    """The device kinds that run kernels (read at run time, not while tracing)."""
    device = q.device
    if device.type == "cpu":
        if not interpreting():
            _fail("q", "CPU tensors run under the Triton interpreter: set TRITON_INTERPRET=1 "
                       "before importing kreg, or pass CUDA tensors")  # fmt: skip
        if q.dtype == torch.bfloat16:
            _fail("q", "bf16 on CPU: the Triton interpreter computes bf16 dot products wrongly; "
                       "use fp16 or fp32 on CPU")  # fmt: skip
    elif device.type != "cuda":
        _fail("q", f"device {device} not supported (cuda, or cpu under the interpreter)")


# _validate's options (after the five tensors): kda_prefill's keywords less the selection's
# (the gate kind is the entry's, not a keyword of the signature)
_VALIDATED = tuple(
    name for name, p in inspect.signature(_validate).parameters.items()
    if p.kind is not p.KEYWORD_ONLY
)[5:]  # fmt: skip


def _prepare(
    q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
    gate_lower_bound=None, cu_seqlens=None, cu_seqlens_cpu=None, A_log=None, dt_bias=None,
    gate_activation="none", use_qk_l2norm=False, use_beta_sigmoid=False, state_layout="kv",
    output_chunk_states=False, max_seqlen=None, initial_state_indices=None,
    initial_state_indices_cpu=None, chunk_states_size=64, chunk_states_dtype=torch.float32,
    *, gate=None,
):  # fmt: skip
    checked = _validate(
        q, k, v, g, beta, scale, initial_state, output_final_state, gate_lower_bound,
        cu_seqlens, cu_seqlens_cpu, A_log, dt_bias, gate_activation, use_qk_l2norm,
        use_beta_sigmoid, state_layout, output_chunk_states, max_seqlen, initial_state_indices,
        initial_state_indices_cpu, chunk_states_size, chunk_states_dtype, gate=gate,
    )  # fmt: skip
    _check_device(q)
    cu_host, cu_dev = _offsets(cu_seqlens, cu_seqlens_cpu, int(q.shape[1]), q.device)
    if cu_host is None:  # fixed length, or device offsets: the caller's bound, else the mean
        problem = checked.problem()
    else:  # the host copy _offsets validated (read anyway): the longest length costs no sync
        problem = checked.problem(max_seqlen=longest_seq(cu_host, checked.fields["max_seqlen"]))
    call = make_call(
        checked, problem, q, k, v, g, beta, initial_state=initial_state,
        output_final_state=output_final_state, output_chunk_states=output_chunk_states,
        state_layout=state_layout, cu_host=cu_host, cu_dev=cu_dev,
        state_indices=_pool_slots(initial_state_indices, initial_state_indices_cpu,
                                  initial_state),
    )  # fmt: skip
    return problem, call


def make_call(checked: Checked, problem: LinearAttentionProblem, q, k, v, g, beta, *,
              initial_state, output_final_state,
              output_chunk_states, state_layout, cu_host, cu_dev,
              state_indices=None) -> launch.Call:  # fmt: skip
    """The launch call of validated tensors (``checked`` is ``_validate``'s result for them, or,
    context parallel, for the whole call this slice belongs to; ``problem`` its problem, or the
    slice's: its head dims and chunk-state options are the call's)."""
    fields = checked.fields
    A_log, dt_bias = checked.A_log, checked.dt_bias
    if fields["gate_activation"] != "none":
        # an absent A_log means a factor exp(0) = 1, an absent dt_bias a zero bias
        HV, K = fields["heads_v"], fields["head_dim_k"]
        if A_log is None:
            A_log = _zeros(HV, q.device)
        if dt_bias is None:
            dt_bias = _zeros(HV * (K if fields["gate"] == "per_channel" else 1), q.device)
    q, k, v, g, beta, A_log, dt_bias, initial_state = _kernel_inputs(
        problem, q, k, v, g, beta, A_log, dt_bias, initial_state
    )
    return launch.Call(
        q=q, k=k, v=v, g=g, beta=beta, scale=checked.scale, A_log=A_log, dt_bias=dt_bias,
        lower_bound=float(fields["gate_lower_bound"] or 0.0),
        gate_activation=fields["gate_activation"], qk_l2norm=fields["qk_l2norm"],
        beta_sigmoid=fields["beta_sigmoid"], initial_state=initial_state,
        output_final_state=output_final_state, output_chunk_states=output_chunk_states,
        state_layout=state_layout, cu_seqlens=cu_dev, cu_seqlens_host=cu_host,
        longest=problem.longest_seq if problem.varlen else None,
        state_indices=state_indices,
        chunk_states_size=problem.chunk_states_size,
        chunk_states_dtype=_CHUNK_STATE_DTYPES_BY_NAME[problem.chunk_states_dtype],
    )  # fmt: skip


def _zeros(n: int, device) -> torch.Tensor:
    """A cached fp32 zero vector the kernels only read (made once, not per call)."""
    return plans.constant(("zeros", n, device), lambda: torch.zeros(n, device=device))


def _check_pool_indices(indices, indices_cpu, n_seqs, device) -> bool:
    """The pool indices' types, dtypes, shapes and devices (no values); whether a pool is used."""
    if indices is None:
        if indices_cpu is not None:
            _fail("initial_state_indices_cpu", "given without initial_state_indices")
        return False
    for name, x in (("initial_state_indices", indices), ("initial_state_indices_cpu", indices_cpu)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor) or tuple(x.shape) != (n_seqs,):
            got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
            _fail(name, f"expected a 1-d tensor [N] = ({n_seqs},), one slot per sequence, got "
                        f"{got}")  # fmt: skip
        _check_strided(name, x)
        if x.dtype not in _OFFSET_DTYPES:
            _fail(name, f"dtype must be torch.int64 or torch.int32, got {x.dtype}")
    if indices.device != device:
        _fail("initial_state_indices", f"on {indices.device}, but q is on {device}")
    if indices_cpu is not None and indices_cpu.device.type != "cpu":
        _fail("initial_state_indices_cpu", f"must be a CPU tensor, is on {indices_cpu.device}")
    _check_no_grad([("initial_state_indices", indices)])
    return True


def _readable_slots(indices, indices_cpu):
    """The pool slots' host copy where reading it costs no device sync (``indices_cpu``, or
    ``indices`` on the CPU), else None: device slots alone, which are never read on the host."""
    if indices_cpu is not None:
        return indices_cpu
    return indices if indices.device.type == "cpu" else None


def _pool_slots(indices, indices_cpu, pool):
    """Check the slots on the host where that needs no device sync (``_readable_slots``);
    return the device slots the kernel reads (``_device_slots``), or None without a pool."""
    if indices is None:
        return None
    host = _readable_slots(indices, indices_cpu)
    if host is not None:
        slots = host.to(torch.int64)
        size = pool.shape[0]
        if bool((slots >= size).any()):
            bad = int(slots[slots >= size][0])
            _fail("initial_state_indices", f"slot {bad} out of range for a pool of {size} "
                                           f"states (valid: 0 to {size - 1}, or negative for "
                                           "none)")  # fmt: skip
        used = slots[slots >= 0]
        if used.unique().numel() != used.numel():
            values, counts = used.unique(return_counts=True)
            _fail("initial_state_indices", f"slot {int(values[counts > 1][0])} is given to "
                                           "more than one sequence: their final states would "
                                           "race for it")  # fmt: skip
    return _device_slots(indices)


def _device_slots(indices: torch.Tensor) -> torch.Tensor:
    """The slots as the kernels read them: slot n at offset n, in the caller's dtype (int32 or
    int64: the kernel reads either, so no conversion launch per decode step); a strided view,
    a column of a slot table, is copied."""
    return indices if indices.is_contiguous() else indices.contiguous()


# --- head dims the kernels lack: masked tiles, or zero padding ---------------------------------
# Any K, V in 1..MAX_HEAD_DIM runs at Kp, Vp = specs.padded_head_dim(K, V). The chunked paths of a
# per-channel gate read and write the caller's tensors through column masks (masked tiles,
# ``specs.reads_caller_dims``): a masked column loads the value its padded copy would hold (0,
# and dt_bias -inf), so the tiles, and every output, are bit for bit the padded run's, without
# the copies. The other paths (decode, a scalar gate, context parallel) run on zero-padded copies
# of the inputs, and the caller gets the padded run's outputs sliced back. This is exact: the
# real entries are bit for bit those of a run on the padded inputs, and that run computes the
# real problem, because every term a padded column adds is an exact zero.
# - q, k get zero columns K..Kp, v zero columns V..Vp; g gets log-decay 0 on the padded K
#   columns and, with a gate activation, dt_bias gets -inf there, so the activated gate is
#   -0.0 (softplus(-inf) = 0, sigmoid(-inf) = 0). Every decay factor on a padded column is
#   then exp(0) = 1: finite, so no 0 * inf can arise (an A_log of -inf would give 0 * -inf =
#   NaN there: NaN outputs, contained as any non-finite input is, never a wrong value).
# - Every product with a padded column is an exact zero times a finite number, exactly 0 in
#   fp32 (and as tf32 or bf16 operands), and x + 0 == x exactly: each sum over K or V (the
#   dots, the L2 norm's sum of squares) is the sum of its real terms.
# - The state's padded K rows start at exactly 0 (the padded initial state) and each step
#   multiplies them by a decay of 1 and adds k_pad = 0 times a row: they stay 0, so W S and
#   Q S read nothing from them. Its padded V columns see u = 0 and stay 0; o is 0 there.
# - The default scale is the real K's (K ** -0.5), not Kp's (``_validate``).
# Cost: the kernels' work at Kp, Vp (K = 100 runs at 128: 1.28x the state; K = 12 at 32), less
# for masked tiles where a whole slice is padding (the pairs kernel stops at K); on the padded
# paths also one copy of q, k, v, g (dt_bias, the initial state) into padded buffers, a copy of
# o and the states out of them.
# tests/interpreter/test_kda_head_dims.py: split and fused runs (masked tiles) equal runs on
# hand-padded inputs bit for bit, the padded state stays zero, and both match the float64
# oracles at the real dims; decode (padded copies) matches the chunked form.


def _padded_copy(x: torch.Tensor, shape, fill: float = 0.0) -> torch.Tensor:
    """``x`` in the leading corner of a new contiguous ``shape`` tensor filled with ``fill``.
    Only the padding is filled (a whole-buffer fill before the copy wrote every byte twice)."""
    out = x.new_empty(shape)
    out[tuple(slice(0, n) for n in x.shape)].copy_(x)
    for dim, (n, m) in enumerate(zip(x.shape, shape, strict=True)):
        if n < m:
            out[(slice(None),) * dim + (slice(n, m),)].fill_(fill)
    return out


def _kernel_inputs(problem: LinearAttentionProblem, q, k, v, g, beta, A_log, dt_bias,
                   initial_state):  # fmt: skip
    """The inputs as the kernels read them: contiguous, with at most one copy each (none for
    an input that already is); at the caller's head dims (``pad_call`` pads them for a path
    that needs it).

    The kernels take no strides: they index tokens and heads by strides derived from the
    shapes (H * K per token, ...), which the compiled divisibility and vector widths rest on,
    and every kernel signature (and golden) would change to take them. So a non-contiguous
    input (q, k, v sliced from one projection, a transposed state) costs one copy to a
    contiguous buffer."""
    return tuple(
        None if x is None else x.contiguous()  # a no-op where x already is
        for x in (q, k, v, g, beta, A_log, dt_bias, initial_state)
    )


def pad_call(call: launch.Call, problem: LinearAttentionProblem) -> launch.Call:
    """``call`` with its inputs zero-padded to the kernels' head dims (the note above), or
    ``call`` itself where they already are."""
    K, V = problem.head_dim_k, problem.head_dim_v
    if (padded_head_dim(K), padded_head_dim(V)) == (K, V):
        return call
    q, k, v, g, dt_bias, h0 = _pad_inputs(problem, call.q, call.k, call.v, call.g, call.dt_bias,
                                          call.initial_state)  # fmt: skip
    return attrs.evolve(call, q=q, k=k, v=v, g=g, dt_bias=dt_bias, initial_state=h0)


def _pad_inputs(problem: LinearAttentionProblem, q, k, v, g, dt_bias, initial_state):
    """Copies of the inputs at the kernels' head dims (the note above)."""
    K, V = problem.head_dim_k, problem.head_dim_v
    Kp, Vp = padded_head_dim(K), padded_head_dim(V)
    lead = tuple(q.shape[:3])
    q, k = _padded_copy(q, (*lead, Kp)), _padded_copy(k, (*lead, Kp))
    v = _padded_copy(v, (*v.shape[:3], Vp))
    if problem.gate == "scalar":  # a scalar gate decays the padded K rows of zeros: exact
        return q, k, v, g, dt_bias, _padded_state(problem, initial_state)
    g = _padded_copy(g, (*g.shape[:3], Kp))
    if dt_bias is not None:  # -inf: the activated gate of a padded column is -0.0 (above)
        HV = problem.heads_v
        dt_bias = _padded_copy(dt_bias.reshape(HV, K), (HV, Kp), float("-inf")).view(HV * Kp)
    return q, k, v, g, dt_bias, _padded_state(problem, initial_state)


def _padded_state(problem: LinearAttentionProblem, initial_state):
    if initial_state is None:
        return None
    Kp, Vp = padded_head_dim(problem.head_dim_k), padded_head_dim(problem.head_dim_v)
    tail = (Kp, Vp) if problem.state_layout == "kv" else (Vp, Kp)
    return _padded_copy(initial_state, (*initial_state.shape[:2], *tail))


def _unpad(x: torch.Tensor | None, problem: LinearAttentionProblem, layout: str):
    """An output at the caller's head dims: ``layout`` "o" ([.., V]), or a state layout."""
    K, V = problem.head_dim_k, problem.head_dim_v
    if x is None or (padded_head_dim(K), padded_head_dim(V)) == (K, V):
        return x
    if layout == "o":
        return x[..., :V].contiguous()
    rows, cols = (K, V) if layout == "kv" else (V, K)
    return x[..., :rows, :cols].contiguous()


def _gate_param(name, x, shape, also, also_text, device):
    """``x`` (fp32, on q's device) viewed as ``shape``, the layout the kernels read; ``also(s)``
    accepts the other shapes holding the same elements in the same order. None stays None (the
    caller supplies the neutral default)."""
    if x is None:
        return None
    if not isinstance(x, torch.Tensor):
        _fail(name, f"expected a torch.Tensor or None, got {type(x).__name__}")
    _check_strided(name, x)
    got = tuple(x.shape)
    if got != shape and not also(got):
        _fail(name, f"expected shape {shape}{also_text}, got {got}")
    _check_tensor(name, x, got, (torch.float32,), device)
    return x.reshape(shape)  # a view where the strides allow (``_kernel_inputs`` copies if not)


def _check_cu_seqlens(cu_seqlens, cu_seqlens_cpu, B, device):
    """The offsets' types, dtypes, devices and shapes (no values); the sequence count N, or None
    without ``cu_seqlens``."""
    if cu_seqlens is None:
        if cu_seqlens_cpu is not None:
            _fail("cu_seqlens_cpu", "given without cu_seqlens")
        return None
    for name, x in (("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu)):
        if x is None:
            continue
        if not isinstance(x, torch.Tensor) or x.dim() != 1 or x.numel() < 2:
            _fail(name, "expected a 1-d tensor [N + 1] with N >= 1")
        _check_strided(name, x)
        if x.dtype not in _OFFSET_DTYPES:
            _fail(name, f"dtype must be torch.int64 or torch.int32, got {x.dtype}")
    if cu_seqlens_cpu is not None and cu_seqlens_cpu.device.type != "cpu":
        _fail("cu_seqlens_cpu", f"must be a CPU tensor, is on {cu_seqlens_cpu.device}")
    if B != 1:
        _fail("cu_seqlens", f"packed sequences need batch size B == 1, got B={B}")
    if cu_seqlens.device not in (device, torch.device("cpu")):
        _fail("cu_seqlens", f"on {cu_seqlens.device}, expected {device} or cpu")
    if cu_seqlens_cpu is not None and cu_seqlens_cpu.shape != cu_seqlens.shape:
        _fail("cu_seqlens_cpu", f"shape {tuple(cu_seqlens_cpu.shape)} differs from cu_seqlens "
                                f"{tuple(cu_seqlens.shape)}")  # fmt: skip
    return cu_seqlens.shape[0] - 1


def check_chunk_states(size, dtype) -> tuple[int, str]:
    """``chunk_states_size`` and ``chunk_states_dtype`` checked: (size, dtype name)."""
    if isinstance(size, (bool, np.bool_)) or not isinstance(size, numbers.Integral):
        _fail("chunk_states_size", f"must be a positive int, got {size!r}")
    size = int(size)
    if size < 1 or size % _CHUNK_STATES_QUANTUM:
        _fail("chunk_states_size", f"must be a positive multiple of {_CHUNK_STATES_QUANTUM} (the "
              f"smallest kernel chunk; 64 and its multiples suit every spec), got {size}")  # fmt: skip
    if not isinstance(dtype, torch.dtype) or dtype not in _DTYPES:
        _fail("chunk_states_dtype", f"must be torch.float32, torch.bfloat16 or torch.float16, "
                                    f"got {dtype!r}")  # fmt: skip
    return size, _DTYPES[dtype]


def _check_max_seqlen(max_seqlen, T, varlen):
    """``max_seqlen`` as an int or None, checked against the shapes (the offsets' values are
    ``longest_seq``'s to check)."""
    if max_seqlen is None:
        return None
    if isinstance(max_seqlen, (bool, np.bool_)) or not isinstance(
        max_seqlen, (numbers.Integral, torch.SymInt)
    ):
        _fail("max_seqlen", f"must be a positive int or None, got {max_seqlen!r}")
    max_seqlen = int(max_seqlen)
    if max_seqlen < 1:
        _fail("max_seqlen", f"must be a positive int or None, got {max_seqlen}")
    if not varlen:
        if max_seqlen != T:
            _fail("max_seqlen", f"without cu_seqlens every sequence is T={T} long: pass None or "
                                f"{T}, got {max_seqlen}")  # fmt: skip
        return None
    if max_seqlen > T:
        _fail("max_seqlen", f"{max_seqlen} exceeds T={T}, the packed length")
    return max_seqlen


def longest_seq(cu_host: torch.Tensor, max_seqlen: int | None = None) -> int:
    """The length the scan is planned for: the longest sequence of the host offsets
    ``cu_host`` (int64, validated), or ``max_seqlen`` where given, which must not be shorter
    (an upper bound is fine; a shorter one would plan a long sequence as a short one)."""
    longest = int((cu_host[1:] - cu_host[:-1]).max())
    if max_seqlen is None:
        return max(1, longest)
    if max_seqlen < longest:
        _fail("max_seqlen", f"{max_seqlen} is shorter than the longest sequence of cu_seqlens "
                            f"({longest} tokens); pass an upper bound or None")  # fmt: skip
    return max_seqlen


def _readable_offsets(cu_seqlens, cu_seqlens_cpu):
    """The offsets' host copy where reading it costs no device sync (``cu_seqlens_cpu``, or
    ``cu_seqlens`` on the CPU), else None: device offsets alone, which are never read on the
    host."""
    if cu_seqlens_cpu is not None:
        return cu_seqlens_cpu
    return cu_seqlens if cu_seqlens.device.type == "cpu" else None


def _offsets(cu_seqlens, cu_seqlens_cpu, T, device):
    """Validate the offsets' values where a host copy is readable without a sync
    (``_readable_offsets``); return (host int64 or None, the device offsets the kernels get), or
    (None, None) without offsets. The chunked paths read the device tensor through
    ``launch.chunk_tables``, which clamps it into [0, T] and makes it non-decreasing, and the
    decode kernel clamps each sequence's pair itself (valid offsets pass unchanged either way),
    so no offsets make a kernel read out of bounds.

    - A host copy: validated (a bad value raises, naming ``cu_seqlens``), and the kernels read
      a device copy of it (the values of a device ``cu_seqlens`` beside ``cu_seqlens_cpu`` are
      not read), except under CUDA graph capture, where the captured device ``cu_seqlens`` is
      what replays read.
    - Device offsets alone: not read on the host, not validated (the contract: offsets from 0 to
      T, non-decreasing; others give wrong outputs, never an out-of-bounds access)."""
    if cu_seqlens is None:
        return None, None
    given = _readable_offsets(cu_seqlens, cu_seqlens_cpu)
    if given is None:
        return None, cu_seqlens
    # int32 (vLLM) or int64, any stride; a no-op for a contiguous int64 CPU tensor
    host = given.to(torch.int64).contiguous()
    if int(host[0]) != 0:
        _fail("cu_seqlens", f"must start at 0, starts at {int(host[0])}")
    if bool((host[1:] < host[:-1]).any()):
        _fail("cu_seqlens", "must be non-decreasing")
    if int(host[-1]) != T:
        _fail("cu_seqlens", f"must end at T={T} (the packed length), ends at {int(host[-1])}")
    if device.type == "cpu":
        return host, host
    if cu_seqlens.device == device and torch.cuda.is_current_stream_capturing():
        return host, cu_seqlens
    if host is cu_seqlens_cpu and host.is_pinned():
        host = host.clone()  # the asynchronous copy must read what was validated, not a later edit
    return host, host.to(device, non_blocking=True)
