"""The GDN prefill benchmark scenario ``gdn`` (run by ``kreg bench gdn``).

Gated DeltaNet prefill (one scalar gate per token and value head), bf16, K = V = 128, against
fla-core 0.6.0's ``chunk_gated_delta_rule`` in the same run, and FlashInfer's GDN prefill where
``flashinfer`` imports: Qwen3-Next's linear-attention heads (H = 16 q/k heads, HV = 32 value
heads) at B×T = 1×4096, 1×8192, 4×8192 and a varlen batch of 7 sequences passed with device
offsets only, and FlashInfer's benchmark shape 1×8192 at H = HV = 32; each case in one gate
regime of ``kreg.families.kda.bench.gate_regimes`` (1×8192 at Qwen3-Next's heads in four), drawn
per token and value head. Every case makes the engines' call: q and k L2-normalised in the
kernel, beta precomputed (sigmoid), an fp32 initial state in and the final state out. See
:data:`HARNESS_DOC` (rendered at the top of the results page).

The kreg rows get fla's very keyword dict: they call ``kreg.compat.fla.chunk_gated_delta_rule``
(``fused_recurrent_gated_delta_rule`` in ``gdn-decode``) with exactly fla's keywords, recorded in
each kreg row's ``info["call"]``.
"""

from __future__ import annotations

import functools
import itertools

from kreg.bench import BenchCase, Impl, Pair, Prepared, Skip, first_line
from kreg.families.kda.bench import gate_regimes
from kreg.families.kda.bench import scenario as kda_bench
from kreg.families.kda.bench.decode import main_row
from kreg.families.kda.bench.gate_regimes import regime_of

SCENARIO = "gdn"
HEAD_DIM = 128
QWEN_H, QWEN_HV = 16, 32  # Qwen3-Next's linear attention: 16 q/k heads, 32 value heads
ANCHOR_H = 32  # FlashInfer's GDN prefill benchmark: H = HV = 32
VARLEN_LENGTHS = (1300, 547, 2048, 963, 271, 2500, 563)  # 7 sequences, 8192 tokens
# an engine's mixed batch: many short sequences, single tokens among them (6973 tokens)
ENGINE_LENGTHS = (1, 5, 17, 64, 129, 256, 300, 431, 512, 700, 880, 1500, 2048, 33, 97)
TP4_H, TP4_HV = QWEN_H // 4, QWEN_HV // 4  # Qwen3-Next's heads on one of 4 tensor-parallel GPUs
REGIMES = ("softplus", "softplus_pre", "logsigmoid", "heavy", "resets")  # gate_regimes' names
# (B, T, H, HV, lengths, regimes, tag): 12 cases, 5 fla autotuning classes (fla_class). The
# "heldout" shapes were added after the GDN selection's tie-breaks were set on the others, and
# no choice has been looked at on them since: they measure it out of sample.
PLAN = (
    (1, 4096, QWEN_H, QWEN_HV, None, ("softplus_pre",), "qwen3next"),
    (1, 8192, QWEN_H, QWEN_HV, None, ("softplus", "softplus_pre", "heavy", "resets"), "qwen3next"),
    (4, 8192, QWEN_H, QWEN_HV, None, ("softplus_pre",), "qwen3next"),
    (1, sum(VARLEN_LENGTHS), QWEN_H, QWEN_HV, VARLEN_LENGTHS, ("softplus_pre",), "varlen"),
    (1, 8192, ANCHOR_H, ANCHOR_H, None, ("logsigmoid",), "anchor"),
    (1, 2048, QWEN_H, QWEN_HV, None, ("softplus_pre",), "heldout"),
    (1, 32768, QWEN_H, QWEN_HV, None, ("softplus_pre",), "heldout"),
    (1, 8192, TP4_H, TP4_HV, None, ("softplus",), "heldout"),
    (1, sum(ENGINE_LENGTHS), QWEN_H, QWEN_HV, ENGINE_LENGTHS, ("softplus_pre",), "heldout"),
)  # fmt: skip
PEER = "fla"  # fla-core's chunk_gated_delta_rule, default keywords but the case's
FLASHINFER = "flashinfer"  # flashinfer.gdn_prefill.chunk_gated_delta_rule (non-varlen cases)
CPU_OFFSETS = kda_bench.CPU_OFFSETS  # suffix of the varlen kreg row given the host offsets too
PAIR_DEFAULT = "default"
PAIR_FLASHINFER = "flashinfer"
PREFILL_SHIM = "chunk_gated_delta_rule"  # kreg.compat.fla's name for fla's prefill entry
TENSORS = ("q", "k", "v", "g", "beta", "initial_state", "cu_seqlens", "A_log", "dt_bias")
FLASHINFER_ARCHS = (9, 10)  # the compute capabilities its GDN prefill serves (SM90, SM100)

RESETS_NOTE = (
    "`resets` feeds g = -inf rows: a peer whose output is not finite there judges no row (the "
    "runner skips a non-finite reference); kreg's default serves any g <= 0 exactly "
    "(kda_prefill's promise, which gdn_prefill shares)"
)
FLASHINFER_INPUTS = (
    "packed [B·T, heads, 128] with cu_seqlens = (0, T, ..., B·T); converted once outside the "
    "timed call: q, k L2-normalised, alpha = exp(g) fp32, beta fp32, the initial state "
    "transposed to [N, HV, V, K]"
)


def _plan_text() -> str:
    parts = []
    for B, T, H, HV, lengths, regimes, _ in PLAN:
        shape = "varlen" if lengths else f"{B}×{T}"
        parts.append(f"{shape} at H = {H}, HV = {HV} in " + ", ".join(f"`{r}`" for r in regimes))
    return "; ".join(parts)


PLAN_TEXT = _plan_text()
HARNESS_DOC = f"""# GDN prefill: benchmark results

## The harness

`kreg bench gdn` (scenario `gdn`, `kreg/families/gdn/bench/scenario.py`, runner `kreg/bench/`,
the measurement of the `kda` scenario: docs/kda/RESULTS.md) times Gated DeltaNet prefill on one
GPU against fla-core (and FlashInfer, where it imports) in the same run:

```
source scripts/gpu_env.sh          # on the GPU machine: kreg and fla-core's wheel on PYTHONPATH
python3 -m kreg bench gdn --quick --out bench_out/gdn   # 12 cases, 5 fla autotuning classes
python3 -m kreg bench --render bench_out/gdn/results.json --out docs/gdn
python3 -m kreg bench --list gdn   # the cases and implementations (no GPU needed)
```

**Cases.** bf16, K = V = {HEAD_DIM}. Qwen3-Next's heads (H = {QWEN_H} q/k heads, HV = {QWEN_HV}
value heads) at B×T = 1×4096, 1×8192, 4×8192 and a varlen batch of lengths
{", ".join(map(str, VARLEN_LENGTHS))} packed as B = 1; FlashInfer's GDN benchmark shape 1×8192
at H = HV = {ANCHOR_H}. Held out (tag `heldout`: added after the selection's tie-breaks were
set on the shapes above, and not tuned on since): 1×2048 and 1×32768 at Qwen3-Next's heads,
1×8192 at H = {TP4_H}, HV = {TP4_HV} (its heads on one of four tensor-parallel GPUs), and an
engine's mixed batch of {len(ENGINE_LENGTHS)} sequences ({", ".join(map(str, ENGINE_LENGTHS))}
tokens, single tokens among them). The regimes of each: {PLAN_TEXT}.

**Gate regimes** (`kreg/families/kda/bench/gate_regimes.py`, docs/kda/GATES.md), drawn per token
and value head (the regimes' draws at K = 1: A_log and dt_bias `[HV]`): `softplus`,
g = -exp(A_log)·softplus(x + dt_bias) computed in the kernel from the raw bf16 x (fla's
`use_gate_in_kernel=True`); `softplus_pre`, the same gates precomputed in fp32 (what the engines'
`fused_gdn_gating` passes); `logsigmoid`, fla's test recipe; `heavy`, softplus in the kernel
with A_log = log U(1, 16), dt_bias = 0 (near GDN's initialisation, A ~ U(0, 16)); `resets`,
`logsigmoid` with {gate_regimes.RESET_ROWS} rows of -inf per batch row. Cases of one shape share
their seed: their q, k, v and raw x are the same.

**The call.** One keyword dict, given to both sides: q, k `[B, T, H, K]` ~ N(0, 1) (raw:
`use_qk_l2norm_in_kernel=True`), v ~ N(0, 1), g `[B, T, HV]`, beta = sigmoid(N(0, 1)) precomputed
in bf16, `scale` = K^-1/2, `initial_state` 0.1·N(0, 1) fp32 `[N, HV, K, V]`,
`output_final_state=True`, `cu_seqlens` on the device only in the varlen case (as vLLM and SGLang
pass them), and `use_gate_in_kernel=True, A_log, dt_bias` in the in-kernel regimes.

- `kreg.split` (named after the candidate the dispatcher selects, `kreg explain gdn`):
  `kreg.compat.fla.chunk_gated_delta_rule(**kw)`.
- `{PEER}`: fla-core's `fla.ops.gated_delta_rule.chunk_gated_delta_rule(**kw)` with
  `FLA_DISABLE_BACKEND_DISPATCH=1`.
- `kreg.split{CPU_OFFSETS}` (varlen): the kreg row given `cu_seqlens_cpu` beside the device
  offsets (kreg's extension: no host synchronisation), against `{PEER}`.
- `{FLASHINFER}` (the non-varlen cases, SM90 or SM100): `flashinfer.gdn_prefill.
  chunk_gated_delta_rule` on the same values, {FLASHINFER_INPUTS} (vLLM's
  `fi_chunk_gated_delta_rule` does these conversions in every call), its final state read back
  transposed. Where `flashinfer` does not import, or has no GDN prefill, the row is skipped and
  the reason recorded.

Pairs (× peer within a pair, the peer's ms over kreg's): `{PAIR_DEFAULT}`, kreg against `{PEER}`;
`{PAIR_FLASHINFER}`, kreg against `{FLASHINFER}` where that row runs. Outputs (o and the final
state) are checked against the kreg and fla rows: relative RMS ‖a − b‖/‖b‖, flagged ⚠ above
1e-2; a reference whose own output is not finite judges nothing.

**Measurement** as the `kda` scenario: each kreg kernel, fla autotuning class and FlashInfer
kernel compiled once first in worker processes (`FLA_CACHE_RESULTS=0` there); then every row
called twice (compilation and fla's autotuning excluded), its device time the median of CUDA
graph replays with the L2 flushed (`--quick`: at least 10 replays and 40 ms), falling back to
`triton.testing.do_bench` where a call cannot be captured (fla with device offsets reads them on
the host: "(events)", host work included); host µs and extra MiB as there.

**Formulas.** FLOP per token and value head, the kda scenario's nominal chunkwise count with
C = 64: 6·K·V + 2·C·(3K + 2V) + C²/3 = 181,589 at K = V = 128. Compulsory bytes: q, k (H heads),
v and o (HV heads) in bf16, g (bf16 raw in the kernel, fp32 precomputed) and beta (bf16) per
token and value head, per sequence and value head the fp32 initial state read and final state
written (K·V·8), and A_log, dt_bias (fp32 `[HV]` each) where the gate is activated in the kernel.
"""


# --- cases ------------------------------------------------------------------------------------


def gate_in_kernel(params) -> bool:
    """Whether a case's gate reaches the call raw (``use_gate_in_kernel=True``)."""
    return bool(regime_of(params).gate_in_kernel(False))


def gdn_bytes(tokens: int, heads_qk: int, heads_v: int, K: int = HEAD_DIM, V: int = HEAD_DIM, *,
              act_bytes: int = 2, g_bytes: int = 4, beta_bytes: int = 2, num_states: int = 1,
              gate_params: bool = False) -> int:  # fmt: skip
    """Compulsory bytes of one GDN call (see HARNESS_DOC): the kda scenario's count with one
    gate per token and value head, A_log and dt_bias ``[HV]``, fp32 states in and out."""
    return kda_bench.kda_bytes(tokens, heads_qk, heads_v, K, V, act_bytes=act_bytes,
                               g_bytes=g_bytes, beta_bytes=beta_bytes, num_states=num_states,
                               initial_state_bytes=4, gate_params=gate_params, gate_channels=1)  # fmt: skip


def case_params(B: int, T: int, H: int, HV: int | None = None, *, lengths=None,
                regime: str = "softplus_pre", K: int = HEAD_DIM,
                dtype: str = "bf16") -> tuple[str, dict]:  # fmt: skip
    """(shape name, params) of a GDN case: the params every prepare() reads; the shape name
    seeds the inputs (every regime of a shape draws the same q, k, v, x)."""
    if regime not in REGIMES:
        raise ValueError(f"gate regime {regime!r}: GDN's cases feed {', '.join(REGIMES)}")
    if lengths is not None and (B != 1 or sum(lengths) != T):
        raise ValueError("varlen: B must be 1 and T the sum of the lengths")
    HV = H if HV is None else HV
    shape = kda_bench.shape_name(B, T, H, lengths=lengths, K=K, HV=HV)
    params = {"B": B, "T": T, "H": H, "HV": HV, "K": K, "V": K, "dtype": dtype,
              "lengths": list(lengths) if lengths else None, "regime": regime,
              "seed": kda_bench._seed(shape)}  # fmt: skip
    return shape, params


def make_case(B: int, T: int, H: int, HV: int | None = None, *, lengths=None,
              regime: str = "softplus_pre", K: int = HEAD_DIM, dtype: str = "bf16", tags=(),
              target: str = "sm90") -> BenchCase:  # fmt: skip
    """One GDN prefill case (``lengths``: varlen, device offsets)."""
    shape, params = case_params(B, T, H, HV, lengths=lengths, regime=regime, K=K, dtype=dtype)
    HV = params["HV"]
    in_kernel = gate_in_kernel(params)
    act = kda_bench.DTYPE_BYTES[dtype]
    n = len(lengths) if lengths else B
    nbytes = gdn_bytes(B * T, H, HV, K, K, act_bytes=act, g_bytes=act if in_kernel else 4,
                       beta_bytes=act, num_states=n, gate_params=in_kernel)  # fmt: skip
    rows = f"varlen lengths {', '.join(map(str, lengths))}" if lengths else f"B={B} T={T}"
    case = BenchCase(
        name=f"{shape}-{regime}",
        params=params,
        flops=kda_bench.kda_flops(B * T, HV, K, K),
        bytes=nbytes,
        tokens=B * T,
        heads=HV,
        bh=n * HV,
        tags=tags,
        description=f"{rows}, H={H} HV={HV} K=V={K}, {regime} gates",
    )
    return kda_bench.with_planned_impls(case, planned_impls, target)


@functools.cache
def cases() -> tuple[BenchCase, ...]:
    """Every case of the scenario (see HARNESS_DOC and PLAN)."""
    return tuple(make_case(B, T, H, HV, lengths=lengths, regime=r, tags=(tag,))
                 for B, T, H, HV, lengths, regimes, tag in PLAN for r in regimes)  # fmt: skip


# --- problems and selections (CPU-safe) ---------------------------------------------------------


def problem_of(params, *, host_offsets: bool = False, pool: bool = False):
    """The problem a case's kreg row poses (``host_offsets``: the row given ``cu_seqlens_cpu``,
    which plans for the longest sequence; device offsets alone plan for the mean length;
    ``pool``: the decode step on a state pool)."""
    from kreg.problems import LinearAttentionProblem

    lengths = params.get("lengths")
    return LinearAttentionProblem(
        batch=params["B"], seq_len=params["T"], heads_qk=params["H"], heads_v=params["HV"],
        head_dim_k=params["K"], head_dim_v=params["V"], dtype=params["dtype"], gate="scalar",
        gate_activation="softplus" if gate_in_kernel(params) else "none", qk_l2norm=True,
        initial_state=True, state_dtype="fp32", output_final_state=True, state_pool=pool,
        varlen=bool(lengths), num_seqs=len(lengths) if lengths else params["B"],
        max_seqlen=max(lengths) if lengths and host_offsets else None,
    )  # fmt: skip


def select(params, target, **options):
    from ..selection import select_gdn

    return select_gdn(problem_of(params, **options), kda_bench._target(target))


def selection_info(selection) -> dict:
    return {"candidate": selection.candidate.name, "spec": kda_bench.spec_text(selection.spec),
            "decided_by": selection.decided_by}  # fmt: skip


def fla_class(params) -> tuple:
    """What fla-core autotunes and compiles once for (its autotuning keys hold H, HV, K, V and
    varlen, and Triton's the tensors' dtypes, not T): the heads, varlen, how the gate arrives."""
    gate = "kernel" if gate_in_kernel(params) else "fp32"
    return (params["H"], params["HV"], params["K"], params["V"], bool(params.get("lengths")),
            gate)  # fmt: skip


def planned_impls(case: BenchCase, target="sm90") -> tuple[str, ...]:
    """The rows a run times, in prepare()'s order (the peers whenever importable)."""
    kreg = main_row(select(case.params, target))
    last = kreg + CPU_OFFSETS if case.params.get("lengths") else FLASHINFER
    return (kreg, PEER, last)


def call_text(params) -> str:
    """The keywords of the pair's call (both sides), tensors by name."""
    names = {n: n for n in TENSORS}
    names["cu_seqlens"] = "cu_seqlens (device only)" if params.get("lengths") else None
    kw = fla_kwargs(params, names)
    return ", ".join(v if k == v or str(v).startswith(k + " ") else f"{k}={v}"
                     for k, v in kw.items() if k != "scale")  # fmt: skip


# --- inputs and the calls' keywords ---------------------------------------------------------------


def make_inputs(params, device, seed: int) -> dict:
    """The case's tensors (the same for every row; see HARNESS_DOC): q, k raw, v, the gate of
    the regime ``[B, T, HV]`` (gate_regimes.draw at K = 1: raw x with A_log, dt_bias ``[HV]`` for
    the in-kernel regimes, else g in fp32), beta = sigmoid(N(0, 1)), an fp32 initial state,
    device ``cu_seqlens`` and ``cu_seqlens_cpu`` beside them in varlen cases."""
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    B, T, H, HV, K, V = (params[x] for x in ("B", "T", "H", "HV", "K", "V"))
    act = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[params["dtype"]]

    def randn(*shape, dtype=torch.float32):
        return torch.randn(shape, generator=gen, device=device, dtype=dtype)

    q, k = randn(B, T, H, K, dtype=act), randn(B, T, H, K, dtype=act)
    v = randn(B, T, HV, V, dtype=act)
    gate = gate_regimes.draw(regime_of(params), B, T, HV, 1, gen=gen, device=device, act=act)
    beta = torch.sigmoid(randn(B, T, HV)).to(act)
    lengths = params.get("lengths")
    h0 = 0.1 * randn(len(lengths) if lengths else B, HV, K, V)
    cu = cu_cpu = None
    if lengths:
        cu_cpu = torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int64)
        cu = cu_cpu.to(device)
    return {"q": q, "k": k, "v": v, "g": gate["g"].squeeze(-1), "beta": beta,
            "A_log": gate["A_log"], "dt_bias": gate["dt_bias"], "initial_state": h0,
            "cu_seqlens": cu, "cu_seqlens_cpu": cu_cpu}  # fmt: skip


def fla_kwargs(params, x) -> dict:
    """The keywords of the pair's call, the same dict for fla-core's and kreg's (see
    HARNESS_DOC); fla's ``fused_recurrent_gated_delta_rule`` takes them too (``gdn-decode``)."""
    kw = dict(q=x["q"], k=x["k"], v=x["v"], g=x["g"], beta=x["beta"], scale=params["K"] ** -0.5,
              initial_state=x["initial_state"], output_final_state=True,
              use_qk_l2norm_in_kernel=True)  # fmt: skip
    if x["cu_seqlens"] is not None:
        kw["cu_seqlens"] = x["cu_seqlens"]  # no cu_seqlens_cpu: engines pass none
    if gate_in_kernel(params):
        kw.update(use_gate_in_kernel=True, A_log=x["A_log"], dt_bias=x["dt_bias"])
    return kw


def kreg_entry(shim: str):
    """``(function, name)`` a kreg row calls with fla's keywords: ``kreg.compat.fla.<shim>``."""
    from kreg.compat import fla as compat_fla

    return getattr(compat_fla, shim), f"kreg.compat.fla.{shim}"


def in_inference(fn, kw):
    """``fn(**kw)`` under ``torch.inference_mode()``, as a row's ``run``."""
    import torch

    def run():
        with torch.inference_mode():
            return fn(**kw)

    return run


def activated_gate(params, x):
    """The log-decay g in fp32 ``[B, T, HV]`` (activated here for the in-kernel regimes)."""
    r = regime_of(params)
    if not gate_in_kernel(params):
        return x["g"].float()
    return gate_regimes.activate(r.activation, x["g"].unsqueeze(-1), x["A_log"],
                                 x["dt_bias"]).squeeze(-1)  # fmt: skip


# --- peers ----------------------------------------------------------------------------------------


def load_fla_gdn():
    """``(fla.ops.gated_delta_rule, version)`` or ``(None, reason)``; kda's ``load_fla`` sets
    ``FLA_DISABLE_BACKEND_DISPATCH=1`` before fla is imported."""
    chunk_kda, version = kda_bench.load_fla()
    if chunk_kda is None:
        return None, version
    try:
        from fla.ops import gated_delta_rule
    except Exception as e:
        return (
            None,
            f"fla-core {version}: no gated_delta_rule ({type(e).__name__}: {first_line(e)})",
        )
    return gated_delta_rule, version


def load_flashinfer():
    """``(flashinfer.gdn_prefill.chunk_gated_delta_rule, version)`` or ``(None, reason)``."""
    try:
        import flashinfer
    except Exception as e:
        return None, f"flashinfer not importable ({type(e).__name__}: {first_line(e)})"
    version = getattr(flashinfer, "__version__", "?")
    try:
        from flashinfer.gdn_prefill import chunk_gated_delta_rule
    except Exception as e:
        return None, (f"flashinfer {version} has no gdn_prefill.chunk_gated_delta_rule "
                      f"({type(e).__name__}: {first_line(e)})")  # fmt: skip
    return chunk_gated_delta_rule, version


def flashinfer_impl(params, x, device) -> Impl | Skip:
    """FlashInfer's GDN prefill on the case's values (inputs converted outside the timed call:
    FLASHINFER_INPUTS), returning o ``[B, T, HV, V]`` and the final state as fla lays it out;
    a Skip saying why where it cannot run here."""
    import torch
    import torch.nn.functional as F

    fn, version = load_flashinfer()
    if fn is None:
        return Skip(FLASHINFER, version)
    dev = torch.device(device)
    arch = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    if arch is None or arch[0] not in FLASHINFER_ARCHS:
        return Skip(FLASHINFER, f"flashinfer {version}: its GDN prefill runs on SM90 and SM100, "
                                f"not on {dev} (capability {arch})")  # fmt: skip
    B, T, H, HV, K, V = (params[n] for n in ("B", "T", "H", "HV", "K", "V"))
    n = B * T

    def normed(t):
        return F.normalize(t.float(), dim=-1).to(t.dtype).reshape(n, H, K)

    kw = dict(q=normed(x["q"]), k=normed(x["k"]), v=x["v"].reshape(n, HV, V),
              g=activated_gate(params, x).exp().reshape(n, HV).contiguous(),
              beta=x["beta"].float().reshape(n, HV), scale=K**-0.5,
              initial_state=x["initial_state"].transpose(-1, -2).contiguous(),
              output_final_state=True,
              cu_seqlens=torch.arange(B + 1, device=x["q"].device, dtype=torch.int64) * T)  # fmt: skip

    def run():
        with torch.inference_mode():
            o, state = fn(**kw)
        return o.view(B, T, HV, V), state.transpose(-1, -2)

    return Impl(FLASHINFER, run=run, info={"version": version, "inputs": FLASHINFER_INPUTS,
                                           "args": kda_bench._describe_kwargs(kw)})  # fmt: skip


# --- prepare and run (GPU) ------------------------------------------------------------------------


def prepare(case: BenchCase, target, device) -> Prepared:
    """Inputs on the device and every row of one case: the kreg row and fla's on one keyword
    dict, the varlen case's kreg row with ``cu_seqlens_cpu``, FlashInfer's elsewhere."""
    params = case.params
    x = make_inputs(params, device, kda_bench.seed_of(case))
    kw = fla_kwargs(params, x)  # one dict: both sides get exactly these keywords
    fn, call = kreg_entry(PREFILL_SHIM)
    sel = select(params, target)
    kreg = main_row(sel)
    args = kda_bench._describe_kwargs(kw)
    run = in_inference(fn, kw)
    impls: list = [Impl(kreg, run=run, call=run, peer=PEER,
                        info={**selection_info(sel), "call": call, "args": args})]  # fmt: skip
    module, version = load_fla_gdn()
    if module is None:
        impls.append(Skip(PEER, version))
    else:
        run_fla = in_inference(module.chunk_gated_delta_rule, kw)
        impls.append(Impl(PEER, run=run_fla, call=run_fla, info={"version": version, "args": args}))
    pairs = [Pair(PAIR_DEFAULT, kreg, PEER, f"`{params['regime']}` gates: kreg "
                  f"(`{call.split(' ')[0]}`) against fla-core's `chunk_gated_delta_rule(**kw)`, "
                  f"kw = {call_text(params)}")]  # fmt: skip
    if params.get("lengths"):
        host = select(params, target, host_offsets=True)
        run_cpu = in_inference(fn, dict(kw, cu_seqlens_cpu=x["cu_seqlens_cpu"]))
        impls.append(Impl(kreg + CPU_OFFSETS, run=run_cpu, call=run_cpu, peer=PEER,
                          info={**selection_info(host), "call": call, "extension":
                                "cu_seqlens_cpu beside the device offsets (kreg's extension; "
                                "its peer has none)"}))  # fmt: skip
    else:
        fi = flashinfer_impl(params, x, device)
        impls.append(fi)
        if isinstance(fi, Impl):
            pairs.append(Pair(PAIR_FLASHINFER, kreg, FLASHINFER, "the same values: "
                              f"`flashinfer.gdn_prefill.chunk_gated_delta_rule`, {FLASHINFER_INPUTS}"))  # fmt: skip
    notes = (RESETS_NOTE,) if regime_of(params).resets else ()
    return Prepared(impls=impls, outputs=lambda ret: {"o": ret[0], "state": ret[1]},
                    references=(kreg, PEER), peer=PEER, notes=notes, pairs=pairs)  # fmt: skip


def bench_warm_jobs(bench_cases, target="sm90") -> list[tuple]:
    """The compile plan: each kreg kernel (the split's by ``kernel_keys``), each fla autotuning
    class and FlashInfer's kernel per head configuration once, on the smallest case needing it;
    the peers' jobs first (fla compiles every autotuning config)."""
    from kreg.families.kda.builders import kernel_keys

    seen: set = set()
    jobs: dict[str, tuple] = {}
    for case in sorted(bench_cases, key=lambda c: c.tokens * c.heads):
        p = case.params
        for host in (False, True) if p.get("lengths") else (False,):
            problem = problem_of(p, host_offsets=host)
            sel = select(p, target, host_offsets=host)
            keys = (kernel_keys(problem, sel.spec) if sel.candidate.name.endswith(".split")
                    else {(sel.candidate.name, problem)})  # fmt: skip
            if not keys <= seen:
                seen |= keys
                row = main_row(sel) + (CPU_OFFSETS if host else "")
                jobs.setdefault(case.name, (case, []))[1].append(row)
        for peer, key in ((PEER, (PEER, *fla_class(p))),
                          (FLASHINFER, (FLASHINFER, p["H"], p["HV"], p["K"]))):  # fmt: skip
            if peer in case.impls and key not in seen:
                seen.add(key)
                jobs[f"{case.name}/{peer}"] = (case, [peer])
    return sorted(jobs.values(), key=lambda j: not ({PEER, FLASHINFER} & set(j[1])))


def versions(flashinfer: bool = True) -> dict[str, str]:
    """The peers' versions, where they import (``flashinfer``: FlashInfer's too)."""
    out = {}
    module, version = load_fla_gdn()
    if module is not None:
        out["fla-core"] = version
    fi, fi_version = load_flashinfer() if flashinfer else (None, "")
    if fi is not None:
        out["flashinfer"] = fi_version
    return out


def run(bench_cases, **options) -> dict:
    """Scenario entry point: measure ``bench_cases`` (see :func:`kreg.bench.run_cases`)."""
    meta = {
        "versions": versions(),
        "flop_formula": "tokens*HV*(6*K*V + 2*C*(3*K + 2*V) + C**2/3), C = 64",
        "bytes_formula": "tokens*(2*H*K + 2*HV*V)*act + tokens*HV*(g + beta) "
                         "+ seqs*HV*K*V*8 (fp32 state in and out) + 2*HV*4 (A_log, dt_bias, "
                         "gate in the kernel)",
    }  # fmt: skip
    return kda_bench.run_with_fla(SCENARIO, bench_cases, prepare, bench_warm_jobs,
                                  doc=HARNESS_DOC, meta=meta, **options)  # fmt: skip


def scenario():
    from kreg.registry.model import Scenario

    return Scenario(
        name=SCENARIO,
        family="gdn",
        description="GDN prefill, bf16, K = V = 128: Qwen3-Next's heads (H 16, HV 32) at 1x4096, "
        "1x8192, 4x8192 and varlen (7 sequences, device offsets), FlashInfer's 1x8192 H = HV = 32; "
        "gate regimes softplus (in the kernel), softplus_pre, logsigmoid, heavy, resets; kreg vs "
        "fla chunk_gated_delta_rule (and FlashInfer where it imports)",
        cases=cases,
        run=run,
    )
