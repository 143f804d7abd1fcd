"""The broad KDA grid (scenario ``kda-grid``): shapes a user may bring, with a fixed fit / holdout
split, and what compiling them costs.

A designed, deterministic sample rather than a product (``SEED``): 12 head configurations
(``HEADS``: every H in 1..64, HV/H in 1, 2, 4, head dims 32 to 256, K != V three times) each with
five fixed-length batches spread over log T from 256 to the longest its work bound allows
(stratified, a seeded Latin hypercube in (log T, log B)), four configurations with five varlen
mixes each (uniform short, long-tailed, one long among many short, many length-1, some empty),
three with the production argument set, fixed and varlen, and the known weak spots pinned
(head dim 64 at B=4 T=8192 H=32; one 30,000-token sequence among 20 short ones at H=8), and
after the design one shape for each head dim engines use beyond them (``ENGINE_FIXED``: K = V =
96, 192, 256). Every
case keeps tokens x value heads x max(K + V, 128) / 256 within ``WORK_MAX`` (a few ms, well under 20 GB)
and every packed length a multiple of 16 (so Triton compiles one kernel per option set, not one
per length class).

Why so few head configurations: fla-core autotunes each of its kernels once per (H, HV, K, V,
varlen, options) in the measuring process, about 10 s each on the H200 (docs/kda/RESULTS.md's
first-call times), so the peer's distinct classes (:func:`fla_classes`), not the case count,
bound a run; kreg's kernels are compiled once per option set and integer class
(``builders.kernel_keys``), shared between cases.

Every case carries ``split``: "holdout" for every fourth case in design order (configuration-
major, by work), so the holdout quarter is spread over head configurations, sizes and mixes;
"fit" for the rest. ``gate``: the promise the sweep measures the case with ("bounded": lower
bound -5, kreg's block anchor against fla ``safe_gate``; "unbounded": kreg's default against
fla's default), half each of the plain cases in a seeded shuffle. ``regime``: the gates fed
(kreg/families/kda/bench/gate_regimes.py), dealt in seeded cycles so that it admits the gate's pair:
``BOUNDED_REGIMES`` for bounded plain cases, ``UNBOUNDED_REGIMES`` for the others,
``PROD_REGIMES`` for the production set (whose gate follows its regime). The bench and the sweep
time the pairs the regime admits (both only for ``legacy``).
"""

from __future__ import annotations

import functools
import math
import random

import attrs

SEED = 20261204
WORK_MAX = 2**21  # tokens x HV x (K + V) / 256 per case: ~2M token-heads at d = 128
T_MIN = 256
T_MAX = 262144
# (H, HV, K, V)
HEADS = (
    (1, 1, 128, 128),
    (2, 2, 256, 256),
    (4, 4, 64, 64),
    (4, 16, 128, 128),
    (8, 8, 128, 128),
    (8, 32, 32, 32),
    (16, 16, 128, 64),
    (16, 32, 256, 128),
    (32, 32, 64, 64),
    (32, 32, 128, 128),
    (32, 64, 64, 128),
    (64, 64, 32, 32),
)
FIXED_PER_HEAD = 5
VARLEN_HEADS = ((8, 8, 128, 128), (32, 32, 128, 128), (32, 32, 64, 64), (16, 16, 128, 64))
VARLEN_KINDS = ("uniform", "tailed", "one_long", "ones", "empty")
PROD_HEADS = ((32, 32, 128, 128), (8, 8, 128, 128), (32, 32, 64, 64))
PROD_FIXED = 2
PROD_VARLEN_HEADS = ((32, 32, 128, 128), (8, 8, 128, 128))
PROD_VARLEN_KINDS = ("one_long", "tailed")
# (head config, B, T) fixed shapes always in the grid: the measured weak spot and the
# scenario's main shape
# and the ends of the B and T axes
PINNED_FIXED = (((32, 32, 64, 64), 4, 8192), ((32, 32, 128, 128), 1, 8192),
                ((1, 1, 128, 128), 1, 262144), ((4, 4, 64, 64), 64, 256))  # fmt: skip
# (head config, kind, lengths): one 30,000-token sequence among 20 short ones at H = 8
PINNED_VARLEN = (((8, 8, 128, 128), "one_long",
                  (30000, 512, 397, 1210, 88, 640, 733, 251, 1024, 95, 470, 1500, 333, 802,
                   129, 961, 288, 705, 1111, 64, 61)),)  # fmt: skip
HOLDOUT_EVERY = 4
# Gate regimes (gate_regimes.py), dealt in seeded cycles: a bounded-gate shape takes one whose
# values keep g >= -5, an unbounded one the others, the production set the engines' two.
BOUNDED_REGIMES = ("legacy", "bounded")
UNBOUNDED_REGIMES = ("softplus", "softplus_pre", "logsigmoid", "heavy", "resets")
PROD_REGIMES = ("bounded", "softplus")
# (head config, B, T, regime): the head dims engines use beyond HEADS (96 and 192 run
# zero-padded today), one shape each, after the design
ENGINE_FIXED = (((16, 16, 256, 256), 1, 8192, "softplus"), ((16, 16, 192, 192), 1, 8192, "bounded"),
                ((32, 32, 96, 96), 1, 8192, "softplus_pre"))  # fmt: skip


@attrs.frozen
class GridShape:
    name: str
    H: int
    HV: int
    K: int
    V: int
    B: int
    T: int  # tokens per row; the packed total with varlen
    lengths: tuple[int, ...] | None
    production: bool
    kind: str  # "fixed" or a varlen kind
    split: str = "fit"  # "fit" | "holdout"
    gate: str = "bounded"  # the sweep's promise: "bounded" | "unbounded"
    regime: str = "legacy"  # the gates fed (gate_regimes.py); admits the gate's pair

    @property
    def tokens(self) -> int:
        return self.B * self.T

    @property
    def work(self) -> float:
        return work_of(self.tokens, (self.H, self.HV, self.K, self.V))

    @property
    def longest(self) -> int:
        return max(self.lengths) if self.lengths else self.T

    @property
    def num_seqs(self) -> int:
        return len(self.lengths) if self.lengths else self.B


def work_of(tokens: int, head) -> float:
    """tokens x HV x (K + V) / 256, head dims below 64 counted as 64 (their per-token memory
    and time do not shrink with the state products)."""
    H, HV, K, V = head
    return tokens * HV * max(K + V, 128) / 256


def _round16(x: float) -> int:
    return max(16, 16 * round(x / 16))


def _fixed(rng: random.Random, head, n: int) -> list[tuple[int, int]]:
    """``n`` (B, T): log T stratified over [log T_MIN, log of the longest the bound allows at
    B = 1], log B in [0, 6] by a shuffled stratification, B then halved (T if B is 1) until the
    work fits."""
    t_hi = min(T_MAX, 2 ** math.floor(math.log2(WORK_MAX / work_of(1, head))))
    lo, hi = math.log2(T_MIN), math.log2(t_hi)
    b_levels = [6 * (i + rng.random()) / n for i in range(n)]
    rng.shuffle(b_levels)
    out = []
    for i in range(n):
        T = _round16(2 ** (lo + (hi - lo) * (i + rng.random()) / n))
        B = max(1, round(2 ** b_levels[i]))
        while work_of(B * T, head) > WORK_MAX:
            if B > 1:
                B //= 2
            else:
                T = _round16(T / 2)
        out.append((B, T))
    return out


def _lengths(rng: random.Random, kind: str, head) -> tuple[int, ...]:
    if kind == "uniform":
        n = rng.randint(8, 64)
        lens = [rng.randint(128, 2048) for _ in range(n)]
    elif kind == "tailed":
        n = rng.randint(8, 32)
        lens = [min(32768, max(1, round(rng.lognormvariate(6.5, 1.3)))) for _ in range(n)]
    elif kind == "one_long":
        lens = [rng.randint(64, 1024) for _ in range(20)]
        lens.insert(rng.randrange(21), rng.randint(4096, 32768))
    elif kind == "ones":
        lens = [1] * rng.randint(128, 512) + [rng.randint(256, 2048) for _ in range(4)]
        rng.shuffle(lens)
    elif kind == "empty":
        n = rng.randint(16, 48)
        lens = [0 if rng.random() < 0.25 else rng.randint(64, 1024) for _ in range(n)]
        lens[0] = 0  # an empty first sequence, whatever the draw
    else:
        raise ValueError(f"unknown varlen kind {kind!r}")
    return _fit_lengths(lens, head)


def _fit_lengths(lens: list[int], head) -> tuple[int, ...]:
    """Scale down to the work bound, then pad the longest so the total is a multiple of 16."""
    total = sum(lens)
    cap = WORK_MAX / work_of(1, head)
    if total > cap:
        f = cap / total
        lens = [0 if x == 0 else max(1, int(x * f)) for x in lens]
    i = max(range(len(lens)), key=lens.__getitem__)
    lens[i] += -sum(lens) % 16
    return tuple(lens)


def _deal(kinds: tuple[str, ...], n: int, seed: int) -> list[str]:
    """``n`` of ``kinds`` in turn, shuffled with ``seed`` (balanced, independent of the split)."""
    out = [kinds[i % len(kinds)] for i in range(n)]
    random.Random(seed).shuffle(out)
    return out


def _gate_of(regime: str, production: bool) -> str:
    """The sweep's promise for a regime with one pair (its only pair's)."""
    from .gate_regimes import BY_NAME

    (pair,) = BY_NAME[regime].pairs_for(production)
    return "bounded" if pair == "bounded" else "unbounded"


def _name(s: GridShape) -> str:
    H, HV, K, V = s.H, s.HV, s.K, s.V
    lay = (f"b{s.B}-t{s.T}" if s.lengths is None
           else f"{s.kind}{len(s.lengths)}-t{s.T}")  # fmt: skip
    return ("prod-" if s.production else "") + f"{lay}-h{H}x{HV}-d{K}x{V}"


@functools.cache
def shapes() -> tuple[GridShape, ...]:
    """The grid in design order (see the module docstring); deterministic."""
    rng = random.Random(SEED)
    design: list[GridShape] = []

    def add(head, B, T, lengths, production, kind):
        H, HV, K, V = head
        design.append(GridShape("", H, HV, K, V, B, T, lengths, production, kind))

    for head in HEADS:
        fixed = _fixed(rng, head, FIXED_PER_HEAD)
        fixed += [(B, T) for h, B, T in PINNED_FIXED if h == head and (B, T) not in fixed]
        group = []
        for B, T in fixed:
            group.append((work_of(B * T, head), B, T, None, False, "fixed"))
        if head in VARLEN_HEADS:
            for kind in VARLEN_KINDS:
                pinned = [ls for h, k, ls in PINNED_VARLEN if h == head and k == kind]
                lens = _fit_lengths(list(pinned[0]), head) if pinned else _lengths(rng, kind, head)
                group.append((work_of(sum(lens), head), 1, sum(lens), lens, False, kind))
        if head in PROD_HEADS:
            for B, T in _fixed(rng, head, PROD_FIXED):
                group.append((work_of(B * T, head), B, T, None, True, "fixed"))
        if head in PROD_VARLEN_HEADS:
            for kind in PROD_VARLEN_KINDS:
                lens = _lengths(rng, kind, head)
                group.append((work_of(sum(lens), head), 1, sum(lens), lens, True, kind))
        for _, B, T, lens, prod, kind in sorted(group, key=lambda g: (g[4], g[3] is not None,
                                                                      g[0])):  # fmt: skip
            add(head, B, T, lens, prod, kind)

    n_plain = sum(not s.production for s in design)
    gates = ["bounded", "unbounded"] * (n_plain // 2) + ["bounded"] * (n_plain % 2)
    random.Random(SEED + 1).shuffle(gates)  # balanced, independent of the split
    regimes = {"bounded": _deal(BOUNDED_REGIMES, gates.count("bounded"), SEED + 2),
               "unbounded": _deal(UNBOUNDED_REGIMES, gates.count("unbounded"), SEED + 3),
               "production": _deal(PROD_REGIMES, len(design) - n_plain, SEED + 4)}  # fmt: skip
    promise = []  # (gate, regime) per shape of the design
    for s in design:
        if s.production:
            regime = regimes["production"].pop()
            promise.append((_gate_of(regime, True), regime))
        else:
            gate = gates.pop()
            promise.append((gate, regimes[gate].pop()))
    for head, B, T, regime in ENGINE_FIXED:  # after the design: the draws above stay as they were
        add(head, B, T, None, False, "fixed")
        promise.append((_gate_of(regime, False), regime))
    out, seen = [], set()
    for i, (s, (gate, regime)) in enumerate(zip(design, promise, strict=True)):
        split = "holdout" if i % HOLDOUT_EVERY == HOLDOUT_EVERY - 1 else "fit"
        s = attrs.evolve(s, split=split, gate=gate, regime=regime)
        name = _name(s)
        while name in seen:
            name += "'"
        seen.add(name)
        out.append(attrs.evolve(s, name=name))
    return tuple(out)


def problem_of(shape: GridShape, bounded: bool | None = None):
    """The problem the sweep measures ``shape`` with (its ``gate``), or the bounded / default one."""
    from .scenario import problem_of as bench_problem

    if bounded is None:
        bounded = shape.gate == "bounded"
    return bench_problem(params_of(shape), bounded=bounded)


def params_of(shape: GridShape) -> dict:
    """The bench params of ``shape`` (kreg/families/kda/bench/scenario.py's case format)."""
    from .scenario import LOWER_BOUND

    return {
        "B": shape.B, "T": shape.T, "H": shape.H, "HV": shape.HV, "K": shape.K, "V": shape.V,
        "dtype": "bf16", "lower_bound": LOWER_BOUND,
        "lengths": list(shape.lengths) if shape.lengths else None,
        "production": shape.production, "extras": False, "split": shape.split,
        "gate": shape.gate, "kind": shape.kind, "regime": shape.regime,
    }  # fmt: skip


# --- what a run compiles (CPU) --------------------------------------------------------------


def fla_class(shape: GridShape, safe_gate: bool) -> tuple:
    """What fla-core autotunes and compiles once for (bench.fla_class)."""
    from .scenario import PAIR_BOUNDED, PAIR_DEFAULT
    from .scenario import fla_class as bench_class

    return bench_class(params_of(shape), PAIR_BOUNDED if safe_gate else PAIR_DEFAULT)


def pairs(shape: GridShape) -> tuple[str, ...]:
    """The like-with-like pairs the bench times on ``shape`` (its regime's)."""
    from .scenario import pair_names

    return pair_names(params_of(shape))


def fla_classes(grid=None) -> set[tuple]:
    grid = shapes() if grid is None else grid
    return {fla_class(s, safe_gate=pair == "bounded") for s in grid for pair in pairs(s)}


def summary(grid=None) -> dict:
    """Counts over the grid's axes (for --list, the docs and the tests)."""
    grid = shapes() if grid is None else grid
    return {
        "shapes": len(grid),
        "holdout": sum(s.split == "holdout" for s in grid),
        "heads": sorted({s.H for s in grid}),
        "ratios": sorted({s.HV // s.H for s in grid}),
        "head_dims": sorted({(s.K, s.V) for s in grid}),
        "B": (min(s.B for s in grid), max(s.B for s in grid)),
        "T": (min(s.T for s in grid), max(s.T for s in grid)),
        "kinds": sorted({s.kind for s in grid}),
        "production": sum(s.production for s in grid),
        "regimes": sorted({s.regime for s in grid}),
        "fla_classes": len({c[:-1] for c in fla_classes(grid)}),
        "max_work": max(s.work for s in grid),
    }


# --- the kda-grid scenario -------------------------------------------------------------------

GRID_DOC = """# KDA prefill on the broad grid: benchmark results

`kreg bench kda-grid` (scenario `kda-grid`, `kreg/families/kda/bench/grid.py`) times the like-with-like
pairs of `kreg bench kda` (see docs/kda/RESULTS.md for the harness, inputs and formulas) on the
grid of `kreg/families/kda/bench/grid.py`: 12 head configurations (H 1 to 64, HV/H 1, 2, 4, head dims
32 to 256, K != V) and K = V = 96, 192, 256 at B=1 T=8192, fixed batches from B=1 T=262144 to
B=64 T=256, varlen mixes (uniform short, long-tailed, one long among short, many length-1, empty
sequences; `cu_seqlens` on the device only), the production argument set, each case's gate
regime (the column "regime"; docs/kda/GATES.md lists them) with the pairs it admits, and each
case's split label (fit / holdout: the cost model, kreg/families/kda/kda_model.json, is
fitted on the fit cases only, so the holdout rows measure it out of sample). No fused row and no
spec variants: the spec sweep is `benchmarks/kda_grid.py sweep`, its validation docs/kda/GRID.md.

```
OUT=P1 bash scripts/device_grid.sh 1; OUT=P2 bash scripts/device_grid.sh 2   # two H200 calls
python benchmarks/kda_grid.py merge P1/grid-1/results.json P2/grid-2/results.json --out docs/kda/grid
```

(One call does not hold the whole grid: fla autotunes each head configuration and gate path in
the measuring process, so each part takes half of the configurations; with the regimes the grid
has about twice as many fla classes as before, so plan on more parts.)
"""


def case_of(shape: GridShape, target: str = "sm90"):
    from .scenario import make_case

    p = params_of(shape)
    extra = {k: p[k] for k in ("split", "gate", "kind")}
    return make_case(shape.B, shape.T, shape.H, HV=shape.HV, K=shape.K, V=shape.V,
                     lengths=shape.lengths, production=shape.production, name=shape.name,
                     tags=(shape.split, shape.kind), extras=False, extra_params=extra,
                     target=target, regime=shape.regime)  # fmt: skip


def _order(grid) -> list[GridShape]:
    """Round robin over head configurations (design order within each): a run cut short by its
    deadline still covers every configuration."""
    by: dict[tuple, list[GridShape]] = {}
    for s in grid:
        by.setdefault((s.H, s.HV, s.K, s.V), []).append(s)
    out, rank = [], 0
    while len(out) < len(grid):
        out += [group[rank] for group in by.values() if rank < len(group)]
        rank += 1
    return out


@functools.cache
def cases() -> tuple:
    return tuple(case_of(s) for s in _order(shapes()))


def shape_named(name: str) -> GridShape:
    for s in shapes():
        if s.name == name:
            return s
    raise KeyError(f"no grid shape {name!r}")


def head_part(part: int, parts: int) -> list[str]:
    """Case-name patterns of one of ``parts`` disjoint parts of the grid, by head configuration
    (every ``parts``-th of ``HEADS``; no leading dash, which argparse would read as an option):
    the peer autotunes per head configuration in the measuring process, so each part pays for
    its own configurations only and a part fits one device call (``scripts/device_grid.sh``;
    ``benchmarks/kda_grid.py merge`` joins the runs)."""
    if not 1 <= part <= parts:
        raise ValueError(f"part {part} of {parts}: expected 1 to {parts}")
    heads = HEADS + tuple(head for head, *_ in ENGINE_FIXED)
    return [f"h{H}x{HV}-d{K}x{V}" for i, (H, HV, K, V) in enumerate(heads)
            if i % parts == part - 1]  # fmt: skip


def run(bench_cases, **options) -> dict:
    from kreg.bench import Budget

    from .scenario import run as kda_run

    options.setdefault("budget", Budget(min_reps=10, min_ms=40.0, max_reps=200, host_calls=10,
                                        host_budget_s=0.1) if options.get("quick") else None)  # fmt: skip
    return kda_run(bench_cases, scenario="kda-grid", doc=GRID_DOC, **options)


def scenario():
    from kreg.registry.model import Scenario

    return Scenario(
        name="kda-grid",
        family="kda",
        description=f"KDA prefill on a broad grid ({len(shapes())} shapes: heads, head dims, B, "
        "T, varlen mixes, production, a gate regime each; fit/holdout split): kreg default vs "
        "fla default, kreg bounded vs fla safe_gate, as the regime admits",
        cases=cases,
        run=run,
    )
