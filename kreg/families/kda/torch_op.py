"""``kreg::kda_prefill`` (and ``kreg::gdn_prefill``): the delta-rule prefills as ``torch.library``
custom ops.

The op lets ``torch.compile`` (``fullgraph=True``) trace through a prefill call as one opaque node,
and gives ``FakeTensorMode`` / meta tracing the output shapes without running a kernel.
``kda_prefill_op`` is the Python wrapper with ``kda_prefill``'s keywords and return values.

One factory for every family's op: ``make_prefill_op(name, family, gate)`` registers
``kreg::<name>`` for the entry ``<name>`` (``kda_prefill``, ``gdn_prefill``: both take the one
signature ``api.PREFILL_SIGNATURE`` and are served by ``api.run_prefill`` with their family's
candidates and gate kind) and returns its wrapper ``<name>_op``. The schema, the fake, the checks
and the wrapper below are written once; an op differs from another only in its name, the family
whose candidates serve it, and its gate kind (``"per_channel"``: KDA's g ``[B, T, HV, K]``;
``"scalar"``: GDN's g ``[B, T, HV]``, ``kreg.families.gdn.torch_op``), which both the real and the
fake implementation validate with. What follows says ``kda_prefill``; it holds for
``gdn_prefill`` (``kreg::gdn_prefill``, ``gdn_prefill_op``) as written, but for the gate.
Registered when first used: this module is imported by the families' lazy exports only.

Op schema and output convention
-------------------------------
A custom op has a fixed schema and cannot return ``None``, so the raw op
``torch.ops.kreg.kda_prefill`` always returns three tensors ``(o, final_state, chunk_states)``:

* ``o``: like ``v``, ``[B, T, HV, V]``;
* ``final_state``: fp32 ``[N, HV, K, V]`` (``[N, HV, V, K]`` with ``state_layout="vk"``), N = B,
  or ``cu_seqlens.numel() - 1`` with varlen. **Not requested** (``output_final_state=False``):
  a zero-row fp32 tensor ``[0, HV, K, V]`` (``[0, HV, V, K]``), same rank and trailing dims;
* ``chunk_states``: ``[B * ceil(T / chunk_states_size), HV, K, V]`` in ``chunk_states_dtype``
  (shapes alone decide it); not requested: a zero-row fp32 tensor of the same trailing shape.

``kda_prefill_op`` turns the zero-row placeholders back into ``None`` / drops them (the flags are
Python constants, so this stays inside a ``fullgraph`` trace) and returns exactly what
``kda_prefill`` returns: ``(o, final_state)`` or ``(o, final_state, chunk_states)``.

Schema types (custom ops cannot take keyword-only tensors, so every argument of the raw op is
positional-or-keyword, in ``kda_prefill``'s order): optional tensors are ``Tensor?``; ``scale``
and ``gate_lower_bound`` are ``float?``; ``target`` is ``str?`` (a registered target name; the wrapper also takes a ``Target`` and passes
its name); ``max_seqlen`` (after the older arguments, so positional calls made before it
existed still bind) is ``SymInt?``, then ``chunk_states_size`` (``SymInt``) and
``chunk_states_dtype`` (``ScalarType?``, None meaning fp32). Every check that reads no tensor's values (types, shapes, dtypes, devices, flags)
runs in both the fake and the real implementation, through the one function ``kda_prefill`` uses
(``api._validate``, with the op's gate kind), so a ``torch.compile`` trace fails with the eager
message; value checks (the offsets) happen in the real implementation, which runs
``kda_prefill``'s path (``api.run_prefill`` with the family and gate kind; a bad argument raises
``ValueError`` naming it). The wrapper additionally rejects, by name, arguments the schema cannot
carry (a non-tensor where a tensor goes, a non-number scale, ...), converts ``scale`` as
``kda_prefill`` does (a Python or numpy real, or a 0-d CPU tensor), and refuses inputs that
require grad while grad is enabled (there is no backward; inside the op grad mode is off).

Not supported by the op: ``output_chunk_states=True`` together with ``cu_seqlens``. The number of
chunks of a packed batch depends on the offsets' *values*, which a fake (meta) implementation may
not read; the op raises ``ValueError`` for that combination (call ``kda_prefill`` directly).
For fixed-length batches the chunk count depends only on shapes and on the selected spec's chunk
size, which the fake implementation gets from the same (data-free, cached) dispatch ``select``.

CUDA graph capture
------------------
``kda_prefill`` on CUDA tensors can be captured in a ``torch.cuda.CUDAGraph`` (directly or
through this op) when:

1. **Warm-up first**: run the identical call (same shapes, flags, dtypes) eagerly once before
   capture, so the Triton kernels are compiled and loaded and the dispatch selection (which reads
   the tuning table and queries device properties) is cached.
2. **Fixed shapes**: every allocation (outputs, the prep kernel's tiles, the chunk tables, the
   segment buffers) and every grid is derived from the tensor shapes (B, T, H, HV, K, V), the
   flags, and - for varlen - the sequence count N and the planned longest sequence. Replays must
   keep the shapes, flags and N of the capture; new data is copied into the captured input
   tensors (``q``, ``k``, ``v``, ``g``, ``beta``, ``initial_state``, ``A_log``, ``dt_bias``, and the
   device ``cu_seqlens``).
3. **Varlen: pass ``cu_seqlens`` as a device tensor** (alone, or with ``cu_seqlens_cpu``, its
   CPU copy, to have the values validated at capture). Device offsets alone are never read on
   the host. During capture the kernels read the captured device tensor, which a kernel on the
   device clamps into ``[0, T]`` and makes non-decreasing before the others read it (a decode
   step's one kernel clamps each sequence's pair), so offsets
   copied in before a replay cannot make a kernel read out of bounds (offsets that break the
   rules give wrong outputs, not a fault). The chunk tables (per-sequence chunk offsets, chunk
   -> sequence map) are built by that kernel too, with an upper-bound chunk count
   ``ceil(T / chunk) + N`` (surplus programs exit), so new offsets copied into the captured
   ``cu_seqlens`` take effect on replay. Do *not* pass only a CPU ``cu_seqlens`` when
   capturing: the call then copies it host-to-device inside the graph (a pageable host copy,
   which capture rejects or, if pinned, re-reads a freed temporary on replay).
4. **Varlen with a sequence-parallel scan spec** (``segment_chunks > 0``): the segment grid and
   buffers are sized for the planned longest sequence (``max_seqlen``, the longest of
   ``cu_seqlens_cpu``, else the mean length ``ceil(T / N)``); segments past a sequence's end do
   nothing, and a sequence longer than planned runs its extra chunks in its last segment, so
   replays with other lengths stay exact but keep the capture's plan: capture with
   ``max_seqlen`` set to the longest length the replays will see.
5. ``gate_activation`` other than "none" without ``A_log``/``dt_bias`` reads cached zero
   defaults (made once, outside capture; under capture a capturable memset); nothing else is
   host-dependent.

``torch.compile``: the op is one node; ``backend="aot_eager"`` and inductor run it as is. With
``mode="reduce-overhead"`` (inductor CUDA graphs) a CPU ``cu_seqlens_cpu`` input makes inductor
skip graph capture for that graph (CPU inputs are not graph-safe); capture by hand as above.
"""

from __future__ import annotations

import inspect
import numbers

import torch

from kreg.problems.linear_attention import GATE_KINDS

from . import api
from .selection import FAMILY_NAME

OP_NAME = "kreg::kda_prefill"  # kda_prefill_op's (made below); GDN's: kreg::gdn_prefill
FP32 = torch.float32

# kda_prefill's arguments that the op's schema cannot carry: a pool is written in place, which
# the schema does not declare
_POOL_ARGS = ("initial_state_indices", "initial_state_indices_cpu")
# the wrapper's type checks (what the schema cannot carry raises by name), from the annotations
_OPTIONAL_TENSORS, _BOOLS, _STRINGS = (
    tuple(
        n
        for n, p in api.PREFILL_SIGNATURE.parameters.items()
        if p.annotation == kind and n not in _POOL_ARGS
    )
    for kind in ("torch.Tensor | None", "bool", "str")
)


def _fail(name: str, message: str):
    raise ValueError(f"{name}: {message}")


def _reject_varlen_chunk_states(cu_seqlens, output_chunk_states, entry: str) -> None:
    if output_chunk_states and cu_seqlens is not None:
        _fail("output_chunk_states", "not supported with cu_seqlens by the torch op: the chunk "
              "count of a packed batch depends on the offsets' values, which a fake (meta) "
              f"implementation cannot read; call {entry} directly")  # fmt: skip


def _state_tail(q: torch.Tensor, v: torch.Tensor, state_layout: str) -> tuple[int, int, int]:
    """A state's trailing dims, of arguments ``api._validate`` (or ``kda_prefill``) passed."""
    K, HV, V = q.shape[3], v.shape[2], v.shape[3]
    return (HV, K, V) if state_layout == "kv" else (HV, V, K)


def _absent(v: torch.Tensor, tail) -> torch.Tensor:
    """The placeholder of an output that was not requested: zero rows, fp32, same tail."""
    return v.new_empty((0, *tail), dtype=torch.float32)


def _problem_from_shapes(
    q, v, initial_state, output_final_state, gate_lower_bound, cu_seqlens, gate_activation,
    use_qk_l2norm, use_beta_sigmoid, state_layout, output_chunk_states, cu_seqlens_cpu=None,
    max_seqlen=None, chunk_states_size=64, chunk_states_dtype=FP32, *, gate="per_channel",
):  # fmt: skip
    """The ``LinearAttentionProblem`` ``api._prepare`` builds for these arguments, from shapes
    and flags (what the dispatcher selects on) and, with varlen, the longest sequence, read as
    ``_prepare`` reads it: from ``cu_seqlens_cpu`` or a CPU ``cu_seqlens`` (device offsets alone
    are not read), ``max_seqlen`` taking its place where given; ``gate`` the entry's gate kind
    (``"scalar"`` for GDN). Kept equal to ``_prepare``'s by a test (both families' ops). The
    fake implementation itself runs ``api._validate``; this shortcut (no k, g, beta needed)
    serves tests and benchmarks that only want the selection."""
    from kreg.problems import LinearAttentionProblem

    if q.dtype not in api._DTYPES:
        _fail("q", f"dtype {q.dtype} not supported (bf16, fp16, fp32)")
    # int(): selection needs concrete sizes; under dynamic shapes this specialises them (guards)
    B, T, H, K = (int(d) for d in q.shape)
    HV, V = int(v.shape[2]), int(v.shape[3])
    state_dtype = "fp32"
    if initial_state is not None:
        if initial_state.dtype not in api._STATE_DTYPES:
            _fail("initial_state", f"dtype {initial_state.dtype} not supported (fp32, bf16)")
        state_dtype = api._STATE_DTYPES[initial_state.dtype]
    varlen = cu_seqlens is not None
    longest = api._check_max_seqlen(max_seqlen, T, varlen)
    given = api._readable_offsets(cu_seqlens, cu_seqlens_cpu) if varlen else None
    if given is not None:  # device offsets alone are not read: the bound, or None (the mean)
        longest = api.longest_seq(given.to(torch.int64), longest)
    return LinearAttentionProblem(
        batch=B, seq_len=T, heads_qk=H, heads_v=HV, head_dim_k=K, head_dim_v=V,
        dtype=api._DTYPES[q.dtype], gate=gate, gate_lower_bound=gate_lower_bound,
        gate_activation=gate_activation, qk_l2norm=use_qk_l2norm,
        beta_sigmoid=use_beta_sigmoid, initial_state=initial_state is not None,
        state_dtype=state_dtype, output_final_state=output_final_state,
        state_layout=state_layout, output_chunk_states=output_chunk_states,
        varlen=varlen, num_seqs=int(cu_seqlens.shape[0]) - 1 if varlen else B,
        max_seqlen=longest,
        **(dict(zip(("chunk_states_size", "chunk_states_dtype"),
                    api.check_chunk_states(chunk_states_size, chunk_states_dtype),
                    strict=True)) if output_chunk_states else {}),
    )  # fmt: skip


def _op_signature() -> inspect.Signature:
    """The op's schema, from ``kda_prefill``'s signature (one list of arguments): its arguments
    less the pool's, in its order, each positional-or-keyword (custom ops take no keyword-only
    tensors); ``target`` a registered target's name; ``chunk_states_dtype`` None for fp32."""
    params = []
    for p in api.PREFILL_SIGNATURE.parameters.values():
        if p.name in _POOL_ARGS:
            continue
        p = p.replace(kind=inspect.Parameter.POSITIONAL_OR_KEYWORD)
        if p.name == "target":
            p = p.replace(annotation="str | None")
        elif p.name == "chunk_states_dtype":
            p = p.replace(annotation="torch.dtype | None", default=None)
        params.append(p)
    return inspect.Signature(
        params, return_annotation="tuple[torch.Tensor, torch.Tensor, torch.Tensor]"
    )


_OP_SIGNATURE = _op_signature()


def _op_arguments(args, kwargs, entry: str) -> dict:
    """The op's arguments by name (defaults filled in), ``chunk_states_dtype`` None -> fp32, and
    None for the pool's arguments: what ``run_prefill`` and ``api._validate`` take."""
    bound = _OP_SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    a = bound.arguments
    a["chunk_states_dtype"] = a["chunk_states_dtype"] or FP32
    _reject_varlen_chunk_states(a["cu_seqlens"], a["output_chunk_states"], entry)
    return a


# op name (its entry's, without the namespace) -> ((family, gate), wrapper): one registration each
_OPS: dict = {}


def make_prefill_op(name: str, family: str, gate: str):
    """Register ``kreg::<name>``, the custom op of the prefill entry ``name`` (``kda_prefill``,
    ``gdn_prefill``), served by ``api.run_prefill`` with ``family``'s candidates and the gate
    kind ``gate`` (``"per_channel"`` or ``"scalar"``), and return its wrapper ``<name>_op``
    (module docstring). The schema is ``_OP_SIGNATURE``, the same for every op. Made once per
    name: a second call with the same family and gate returns the same wrapper."""
    if gate not in GATE_KINDS:
        raise ValueError(f"gate: must be one of {GATE_KINDS}, got {gate!r}")
    if name in _OPS:
        made, wrapper = _OPS[name]
        if made != (family, gate):
            raise ValueError(f"name: kreg::{name} is registered for (family, gate) {made}, "
                             f"not {(family, gate)}")  # fmt: skip
        return wrapper

    def impl(*args, **kwargs):
        """Real implementation: the entry's path, ``run_prefill`` with the family and gate kind
        (which validates everything), outputs padded to the op's three-tensor convention
        (module docstring)."""
        a = _op_arguments(args, kwargs, name)
        out = api.run_prefill(**a, family=family, gate=gate)
        tail = _state_tail(a["q"], a["v"], a["state_layout"])
        o, ht = out[0], out[1]
        hs = out[2] if a["output_chunk_states"] else None
        return (
            o,
            ht if ht is not None else _absent(a["v"], tail),
            hs.contiguous() if hs is not None else _absent(a["v"], tail),
        )

    def fake(*args, **kwargs):
        """Shapes and dtypes only: reads no tensor values and never synchronises. Runs the same
        data-free validation as the entry (``api._validate``, with its gate kind), so a traced
        call fails with the message an eager one gives."""
        a = _op_arguments(args, kwargs, name)
        q, v, cu_seqlens = a["q"], a["v"], a["cu_seqlens"]
        checked = api._validate(q, a["k"], v, a["g"], a["beta"],
                                **api.validated({**a, **dict.fromkeys(_POOL_ARGS)}),
                                gate=gate)  # fmt: skip
        tail = _state_tail(q, v, a["state_layout"])
        B, T = q.shape[0], q.shape[1]
        o = torch.empty_like(v)
        if a["output_final_state"]:
            n = cu_seqlens.shape[0] - 1 if cu_seqlens is not None else B
            ht = v.new_empty((n, *tail), dtype=torch.float32)
        else:
            ht = _absent(v, tail)
        if a["output_chunk_states"]:  # fixed length only (varlen was rejected above)
            size = checked.fields["chunk_states_size"]
            hs = v.new_empty((B * -(-T // size), *tail), dtype=a["chunk_states_dtype"])
        else:
            hs = _absent(v, tail)
        return o, ht, hs

    for fn in (impl, fake):
        fn.__signature__ = _OP_SIGNATURE
    torch.library.custom_op(f"kreg::{name}", mutates_args=())(impl).register_fake(fake)
    op = getattr(torch.ops.kreg, name)

    def wrapper(q, k, v, g, beta, **options):
        a = api.prefill_arguments(q, k, v, g, beta, **options)  # unknown keywords: TypeError
        for arg in _POOL_ARGS:  # the schema declares no mutated input
            if a.pop(arg) is not None:
                _fail(arg, "state pools are not served through the custom op (the pool is "
                           f"written in place, which its schema does not declare): call {name}")  # fmt: skip
        for arg in ("q", "k", "v", "g", "beta"):
            if not isinstance(a[arg], torch.Tensor):
                _fail(arg, f"expected a torch.Tensor, got {type(a[arg]).__name__}")
        for arg in _OPTIONAL_TENSORS:
            if a[arg] is not None and not isinstance(a[arg], torch.Tensor):
                _fail(arg, f"expected a torch.Tensor or None, got {type(a[arg]).__name__}")
        for arg in _BOOLS:
            if not isinstance(a[arg], bool):
                _fail(arg, f"must be a bool, got {a[arg]!r}")
        for arg in _STRINGS:
            if not isinstance(a[arg], str):
                _fail(arg, f"must be a str, got {a[arg]!r}")
        # a Python or numpy real or a 0-d CPU tensor, as the entry takes it: the schema's float?
        a["scale"] = None if a["scale"] is None else api._real("scale", a["scale"])
        a["gate_lower_bound"] = _number("gate_lower_bound", a["gate_lower_bound"])
        a["max_seqlen"] = _integer("max_seqlen", a["max_seqlen"])
        a["chunk_states_size"] = api.check_chunk_states(a["chunk_states_size"],
                                                        a["chunk_states_dtype"])[0]  # fmt: skip
        target = a["target"]
        if target is not None and not isinstance(target, str):
            target_name = getattr(target, "name", None)
            if not isinstance(target_name, str):
                _fail("target", f"expected a target name, a Target or None, got {target!r}")
            a["target"] = target_name
        _reject_varlen_chunk_states(a["cu_seqlens"], a["output_chunk_states"], name)
        # here, not in the op: the dispatcher runs the implementations with grad mode off
        api._check_no_grad((arg, a[arg]) for arg in api._GRAD_ARGS)
        o, ht, hs = op(**a)
        final = ht if a["output_final_state"] else None
        return (o, final, hs) if a["output_chunk_states"] else (o, final)

    wrapper.__name__ = wrapper.__qualname__ = f"{name}_op"
    wrapper.__doc__ = _WRAPPER_DOC.format(name=name)
    wrapper.__signature__ = api.PREFILL_SIGNATURE
    _OPS[name] = ((family, gate), wrapper)
    return wrapper


_WRAPPER_DOC = """``{name}`` through the ``kreg::{name}`` custom op: same keywords, same returns
    (``(o, final_state)``, ``final_state`` None unless requested; or ``(o, final_state,
    chunk_states)``). Traceable by ``torch.compile(fullgraph=True)`` and fake tensors.

    Differences from ``{name}``: ``output_chunk_states=True`` with ``cu_seqlens`` raises
    ``ValueError`` (module docstring); ``target`` is a registered target's name or a ``Target``
    (passed by name); state pools (``initial_state_indices``) are refused. See the
    ``kreg.families.kda.torch_op`` docstring for CUDA graph capture requirements.
    """

kda_prefill_op = make_prefill_op("kda_prefill", FAMILY_NAME, "per_channel")


def _integer(name: str, x):
    """An int for the schema's ``SymInt?`` (max_seqlen; numpy integers too); bools and
    non-integers are rejected by name (``kda_prefill`` checks the value)."""
    if x is None or isinstance(x, torch.SymInt):
        return x
    if isinstance(x, bool) or not isinstance(x, numbers.Integral):
        _fail(name, f"must be a positive int or None, got {x!r}")
    return int(x)


def _number(name: str, x):
    """A float for the schema's ``float?`` (gate_lower_bound); bools and non-numbers are rejected
    by name."""
    if x is None:
        return None
    if isinstance(x, bool) or not isinstance(x, numbers.Real):
        _fail(name, f"must be a finite number or None, got {x!r}")
    return float(x)
