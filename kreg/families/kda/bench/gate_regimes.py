"""The gate regimes the KDA benchmarks feed (``kreg bench kda``, ``kda-grid``, the grid sweep and
``benchmarks/kda_gate_paths.py``): one table, rendered into docs/kda/GATES.md ("Gate regimes the
benchmark feeds"; ``python -m kreg.families.kda.bench.gate_regimes`` rewrites that block).

A regime says how the gate reaches ``chunk_kda``: activated in the kernel from the raw gate
``x`` [B, T, HV, K] with ``A_log`` [HV] and ``dt_bias`` [HV * K] (fla's and kreg.compat.fla's
``use_gate_in_kernel=True``, what SGLang's extend sends), or precomputed and passed as ``g``
(what vLLM sends after ``fused_kda_gate``). The raw gate is x ~ N(0, 1) in the activations'
dtype everywhere (the output of a low-rank projection); the regimes differ in the activation,
``A_log`` and ``dt_bias``. Which like-with-like pairs a regime admits follows from its values: the
bounded pair (kreg ``gate_lower_bound=-5`` against fla ``safe_gate=True, lower_bound=-5``) only
where every gate is >= -5, the default pair only where no bound is needed to call it (a
sigmoid-bound gate activated in the kernel needs its bound).
"""

from __future__ import annotations

import math

import attrs

LOWER_BOUND = -5.0
RESET_ROWS = 4  # -inf token rows (every head and channel) per batch row in `resets`
DOC_BLOCK = "kda-gate-regimes"
GATES_MD = "docs/kda/GATES.md"

FORMULAS = {
    "softplus": "-exp(A_log) · softplus(x + dt_bias)",
    "sigmoid_bound": f"{LOWER_BOUND:g} · sigmoid(exp(A_log) · (x + dt_bias))",
    "logsigmoid": "logsigmoid(x)",
}


@attrs.frozen
class GateRegime:
    name: str
    activation: str  # a key of FORMULAS
    in_kernel: bool | None  # None: in the kernel in the production set only (legacy)
    # ("N", mean, std): A_log ~ N; ("logU", lo, hi): A_log = log U(lo, hi); "logU_heads": the
    # same stratified over the heads (one draw in each 1/HV of the range: the mean over heads
    # hardly varies with the seed)
    A_log: tuple = ()
    dt_bias: tuple = ()  # ("N", mean, std) per channel, or ("zero",)
    g_fp32: bool = True  # a precomputed g is passed in fp32 (else in the activations' dtype)
    resets: int = 0  # -inf token rows per batch row
    pairs: tuple[str, ...] = ("default",)  # the like-with-like pairs its values admit
    mean: float = 0.0  # documented mean gate, nats per token and channel (tested, roughly)
    source: str = ""

    def pairs_for(self, production: bool) -> tuple[str, ...]:
        """A sigmoid-bound gate activated in the kernel needs its bound: the bounded pair only."""
        if self.activation == "sigmoid_bound" and self.gate_in_kernel(production):
            return ("bounded",)
        return self.pairs

    def gate_in_kernel(self, production: bool) -> bool:
        return production if self.in_kernel is None else self.in_kernel


FLA_TEST = "fla tests/ops/test_kda.py"
TRAINED = (("logU_heads", 1, 3.5), ("N", 0, 1))  # A_log, dt_bias of bounded, softplus, softplus_pre
REGIMES = (
    GateRegime("bounded", "sigmoid_bound", True, *TRAINED, pairs=("bounded",), mean=-2.5,
               source="fla's bounded gate (`use_gate_in_kernel=True, safe_gate=True, "
               "lower_bound=-5`) on the raw inputs of `softplus` (same seed)"),
    GateRegime("softplus", "softplus", True, *TRAINED, mean=-2.0,
               source=f"SGLang's extend, fla `use_gate_in_kernel=True`; dt_bias ~ N(0, 1) as "
               f"{FLA_TEST} `test_chunk`, exp(A_log) scaled so that the mean is the issue's "
               f"trained model's (~ -2 nats per token; trained checkpoints' values are not "
               f"public); single gates to ~ -20"),
    GateRegime("softplus_pre", "softplus", False, *TRAINED, mean=-2.0,
               source="vLLM: `fused_kda_gate` (fp32), then `chunk_kda(g=...)`; the gates of "
               "`softplus` on the same seed"),
    GateRegime("logsigmoid", "logsigmoid", False, mean=-0.81,
               source=f"{FLA_TEST} `test_chunk`, `test_chunk_varlen`, `test_fused_recurrent` "
               f"(`F.logsigmoid(torch.randn(...))`); mild like GDN's initialisation"),
    GateRegime("heavy", "softplus", True, ("logU_heads", 1, 16), ("zero",), mean=-6.9,
               source="KDA's public initialisation (fla/layers/kda.py: A_log = log U(1, 16) per "
               "head, dt_bias = 0); half of the gates below -5, single ones to ~ -70; the mean "
               "is at most -5 from HV = 4 heads on"),
    GateRegime("resets", "logsigmoid", False, resets=RESET_ROWS, mean=-0.81,
               source=f"`logsigmoid` with {RESET_ROWS} hard resets (g = -inf on every head and "
               f"channel of a token) per batch row at seeded positions: kreg's default promises "
               f"any g <= 0; fla's default returns non-finite outputs there"),
    GateRegime("legacy", "sigmoid_bound", None, ("logU", 0.5, 2), ("N", 0, 0.5), g_fp32=False,
               pairs=("default", "bounded"), mean=-2.5,
               source="what the benchmarks fed until issue 23 (the committed results): "
               "precomputed in bf16 in plain cases (both pairs), in the kernel in the production "
               "set; never below -5"),
)  # fmt: skip
BY_NAME = {r.name: r for r in REGIMES}
DEFAULT = "legacy"  # params without a "regime" (earlier results, other benchmarks' cases)


def regime_of(params) -> GateRegime:
    name = params.get("regime") or DEFAULT
    if name not in BY_NAME:
        raise ValueError(f"unknown gate regime {name!r}; known: {', '.join(BY_NAME)}")
    return BY_NAME[name]


def activate(activation: str, x, A_log=None, dt_bias=None):
    """The gate in fp32 from the raw ``x`` [..., HV, K] (the formula of FORMULAS)."""
    import torch.nn.functional as F

    x = x.float()
    if activation == "logsigmoid":
        return F.logsigmoid(x)
    HV, K = x.shape[-2:]
    z = x + dt_bias.view(HV, K)
    a = A_log.exp().view(HV, 1)
    if activation == "softplus":
        return -a * F.softplus(z)
    return LOWER_BOUND * (a * z).sigmoid()


def draw(regime: GateRegime, B: int, T: int, HV: int, K: int, *, gen, device, act,
         production: bool = False) -> dict:  # fmt: skip
    """``g``, ``A_log``, ``dt_bias`` as passed for ``regime`` (the last two None when the gate
    is precomputed), and the raw ``x``; drawn from ``gen`` in the order A_log, dt_bias, x, reset
    positions (the legacy regime's draws are those of the benchmark before the regimes)."""
    import torch

    def param(spec, n):
        if spec[0] == "N":
            return spec[1] + spec[2] * torch.randn(n, generator=gen, device=device)
        if spec[0] == "logU":
            return torch.empty(n, device=device).uniform_(spec[1], spec[2], generator=gen).log_()
        if spec[0] == "logU_heads":
            u = torch.arange(n, device=device) + torch.rand(n, generator=gen, device=device)
            return (spec[1] + (spec[2] - spec[1]) * u / n).log_()
        return torch.zeros(n, device=device)

    A_log = param(regime.A_log, HV) if regime.A_log else None
    dt_bias = param(regime.dt_bias, HV * K) if regime.dt_bias else None
    x = torch.randn((B, T, HV, K), generator=gen, device=device, dtype=act)
    if regime.gate_in_kernel(production):
        return {"g": x, "A_log": A_log, "dt_bias": dt_bias, "x": x}
    g = activate(regime.activation, x, A_log, dt_bias)
    if regime.resets:
        rows = torch.randint(0, T, (B, regime.resets), generator=gen, device=device)
        g[torch.arange(B, device=device).view(B, 1), rows] = -math.inf
    return {"g": g if regime.g_fp32 else g.to(act), "A_log": None, "dt_bias": None, "x": x}


def _param_text(name: str, spec: tuple, per: str) -> str:
    if spec[0] == "N":
        return f"{name} ~ N({spec[1]:g}, {spec[2]:g}²) per {per}"
    if spec[0].startswith("logU"):
        strat = ", stratified over the heads" if spec[0] == "logU_heads" else ""
        return f"{name} = log U({spec[1]:g}, {spec[2]:g}) per {per}{strat}"
    return f"{name} = 0"


def markdown() -> str:
    """The regime table of docs/kda/GATES.md."""
    rows = ["| regime | gate reaches chunk_kda | g | parameters | mean g | pairs | source |",
            "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in REGIMES:
        where = {True: "in the kernel (`use_gate_in_kernel=True`, x bf16)",
                 False: f"precomputed, g {'fp32' if r.g_fp32 else 'bf16'}",
                 None: "precomputed (bf16); in the kernel in the production set"}[r.in_kernel]  # fmt: skip
        params = ["x ~ N(0, 1)"]
        params += [_param_text("A_log", r.A_log, "head")] if r.A_log else []
        params += [_param_text("dt_bias", r.dt_bias, "channel")] if r.dt_bias else []
        params += [f"{r.resets} rows of -inf per batch row"] if r.resets else []
        formula = FORMULAS[r.activation] + (" (-inf rows)" if r.resets else "")
        rows.append(f"| `{r.name}` | {where} | {formula} | {'; '.join(params)} | "
                    f"≈ {r.mean:g} | {', '.join(r.pairs)} | {r.source} |")  # fmt: skip
    return "\n".join(rows)


def _gates_md(root=None):
    from pathlib import Path

    from kreg.checkout import PACKAGE_PARENT

    return Path(root or PACKAGE_PARENT) / GATES_MD


def rendered(text: str) -> str:
    """``text`` (GATES.md) with its regime block regenerated."""
    from kreg import docsgen

    return docsgen.fill(text, {DOC_BLOCK: markdown()}, "")


if __name__ == "__main__":
    path = _gates_md()
    text = path.read_text()
    new = rendered(text)
    if new != text:
        path.write_text(new)
    print(f"{'wrote' if new != text else 'up to date:'} {path}")
