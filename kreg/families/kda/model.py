"""The KDA split path's fitted cost model: spec roles, features, the fit and the ranker hook.

A *role* names one split spec by rules that hold at every head dim ("chunk 16, the widest V
block up to 64, scan 4 warps 3 stages, no segments"), so measurements at one head dim inform the
others; :func:`resolve` turns a role into the concrete valid spec of a problem. The model is one
least-squares fit of log2(device ms), pooled over the roles: a per-role offset plus coefficients
shared by every role on the features of a (problem, spec) pair; the ranker
(``kreg/dispatch/ranker.py``) calls :func:`predict` with the payload of a
``kreg/families/kda/kda_model.json`` section and runs the role of lowest predicted time.

Shape features (``SHAPE_FEATURES``, :func:`features`): the longest sequence ``L`` (log2: the
scan's serial chain), the chains ``P`` = log2(sequences x value heads) (the scan's parallelism)
and the work ``X`` = log2(tokens x value heads) (the prep kernel's), hinges where the scan's
programs and the prep's chunks outgrow one wave of the H200's 132 SMs, the head dims (log2 / 128)
and the production options (gate activation in the kernel). Role features (``ROLE_FEATURES``,
:func:`role_features`, functions of the spec and the shape, which is what lets one coefficient
serve every role): the scan's serial chain in tokens (a segmented scan's one segment plus its
combine), its waves (programs / 2 x 132 SMs, non-empty segments counted), the waves past one,
the V blocks per head and a scan-time proxy (chain x waves x K x block_v). Pooling was chosen
over one fit per role by leave-one-out cross-validation on the fit shapes only (docs/kda/GRID.md
gives the figures); the ridge strength is chosen inside :func:`fit` the same way, from
``RIDGES``, so nothing of the holdout shapes decides either. The payload stores the coefficients
on the raw features, so a reader can evaluate a prediction by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kreg.registry.model import Prediction, Target

from . import specs as kspecs

MODEL_KIND = "kda-split-roles-pooled-lstsq"
FEATURE_VERSION = 3
SHAPE_FEATURES = ("L", "P", "X", "P_over_7", "X_over_16", "k", "v", "prod")
ROLE_FEATURES = ("chain", "waves", "waves_over_1", "v_blocks", "scan", "regs", "regs_over_7")
FEATURES = SHAPE_FEATURES + ROLE_FEATURES
# ridge strengths (units of standardised features) the fit picks from by leave-one-out
# cross-validation over its own shapes: least geomean regret, then least worst regret
RIDGES = (0.001, 0.003, 0.01, 0.03, 0.1)
MIN_SHAPES = 4  # a role measured on fewer shapes gets no offset (it is not predicted)
SMS = 132  # the H200's; two scan programs fit one SM
# Sequence-parallel scans keep an affine map [K, K + V] and a start state [K, V] (fp32) per
# segment of every sequence, as many per sequence as the longest one holds: with many short
# varlen sequences that is gigabytes. Specs above this (or twice q + k + v) are neither swept
# nor predicted.
WORKSPACE_FLOOR = 256 * 2**20


@attrs.frozen
class Role:
    """One split spec named by rules that apply at any head dim."""

    name: str
    chunk: int
    wide: bool  # scan block_v: min(64, V) if wide, min(32, V) otherwise
    scan_warps: int
    stages: int  # the most pipeline stages valid up to this
    segment_chunks: int
    prep_warps: str = "fewest"  # the prep spec's warps: the fewest or the most enumerated


def _role(chunk, wide, warps, stages, seg, prep_warps="fewest") -> Role:
    name = f"c{chunk}.{'wide' if wide else 'narrow'}.w{warps}s{stages}.seg{seg}"
    name += "" if prep_warps == "fewest" else f".p{prep_warps}"
    return Role(name, chunk, wide, warps, stages, seg, prep_warps)


# The first eleven cover what won somewhere in docs/kda/SPEED.md and the tuning table (chunk 16
# with a wide V block, chunk 32 with a narrow one, segments of 16 and 64 chunks) plus chunk 64,
# the heuristic's usual choice off the table, and chunk 32 wide with 64-chunk segments (best for
# one long sequence among short ones in the first sweep, where no role came within 1.3x of it).
# The prep spec of a role is its chunk's with solve_block 16 (the only one a bounded gate admits
# at every head dim) and the fewest warps enumerated unless the role says the most.
ROLES = (
    _role(16, True, 4, 3, 0),
    _role(16, True, 2, 3, 0),
    _role(16, True, 4, 3, 64),
    _role(16, False, 4, 3, 0),
    _role(16, False, 2, 3, 16),
    _role(32, False, 2, 3, 0),
    _role(32, False, 2, 3, 16),
    _role(32, False, 2, 2, 64),
    _role(32, True, 4, 3, 0),
    _role(32, True, 4, 2, 64),
    _role(64, True, 4, 2, 0),
    # Four more for K = 256, where every segmented role above and the fewest prep warps spill
    # (sm90 ptxas, 2026-12-04: scan 896 B at V block 32 with 2 warps, 288 B at 64 with 4; prep
    # 328 B at 4 warps, none at 8): the scan that compiles without spilling there (V block 32,
    # 4 warps: 254 registers, and its segment map none) with segments, and the most prep warps.
    # Measured by no sweep yet, so never predicted until one times them (predict_ms).
    _role(16, False, 4, 3, 16),
    _role(16, False, 4, 3, 64),
    _role(16, False, 4, 3, 0, "most"),
    _role(16, False, 4, 3, 16, "most"),
)
ROLE_BY_NAME = {r.name: r for r in ROLES}


def _tile_warps(valid: Sequence, chunk: int, which: str = "fewest") -> int | None:
    warps = [s.tile.num_warps for s in valid if s.tile.chunk == chunk and s.tile.solve_block == 16]
    return (min if which == "fewest" else max)(warps) if warps else None


def resolve(role: Role, valid: Sequence) -> kspecs.KdaSplitSpec | None:
    """The spec of ``valid`` (specialised, valid split specs of one problem) that ``role`` names,
    or None where the enumeration has none (say chunk 64 at head dim 128)."""
    if not valid:
        return None
    tw = _tile_warps(valid, role.chunk, role.prep_warps)
    if tw is None:
        return None
    V = valid[0].scan.head_dim_v
    bv = min(64 if role.wide else 32, V)
    matches = [
        s for s in valid
        if s.tile.chunk == role.chunk and s.tile.solve_block == 16 and s.tile.num_warps == tw
        and s.scan.block_v == bv and s.scan.num_warps == role.scan_warps
        and s.scan.segment_chunks == role.segment_chunks and s.scan.num_stages <= role.stages
    ]  # fmt: skip
    if not matches:
        return None
    # the tile's fp32_dot is the enumeration's (one per backend); most stages wins
    return max(matches, key=lambda s: s.scan.num_stages)


def workspace_bytes(spec, problem) -> int:
    """Device bytes a sequence-parallel scan allocates beyond the tiles (0 without segments)."""
    seg = spec.scan.segment_chunks
    if not seg:
        return 0
    from .runtime_args import segment_count

    K, V = _kernel_dims(problem)
    n_seg = segment_count(problem.longest_seq, spec.tile.chunk, seg)  # as launch._scan_scalars
    return problem.num_seqs * n_seg * problem.heads_v * K * (K + 2 * V) * 4


def qkv_bytes(problem) -> int:
    tokens = problem.batch * problem.seq_len
    act = kspecs.DTYPE_BYTES[problem.dtype]
    hk, hv = problem.heads_qk * problem.head_dim_k, problem.heads_v * problem.head_dim_v
    return tokens * (2 * hk + hv) * act


def workspace_ok(spec, problem) -> bool:
    return workspace_bytes(spec, problem) <= max(WORKSPACE_FLOOR, 2 * qkv_bytes(problem))


def segments_pay(spec, problem) -> bool:
    """A sequence-parallel scan whose longest sequence fits in one segment is its serial twin
    plus two passes: not worth measuring or predicting."""
    seg = spec.scan.segment_chunks
    return not seg or -(-problem.longest_seq // spec.tile.chunk) > seg


def admissible(spec, problem) -> bool:
    return spec is not None and segments_pay(spec, problem) and workspace_ok(spec, problem)


def pool(problem, target: Target) -> list[tuple[str, kspecs.KdaSplitSpec]]:
    """(role name, spec) of every role that resolves for ``problem`` and is admissible (several
    roles may name one spec, e.g. at V = 32 where wide and narrow V blocks coincide)."""
    return _resolved(kspecs.valid_split_specs(target, problem), problem)


def _resolved(valid, problem) -> list[tuple[str, kspecs.KdaSplitSpec]]:
    out = []
    for role in ROLES:
        spec = resolve(role, valid)
        if admissible(spec, problem):
            out.append((role.name, spec))
    return out


def features(problem) -> dict[str, float]:
    """The shape features of ``problem`` (see the module docstring), in ``SHAPE_FEATURES``
    order."""
    n, hv = problem.num_seqs, problem.heads_v
    L = math.log2(problem.longest_seq)
    P = math.log2(n * hv)
    X = math.log2(problem.batch * problem.seq_len * hv)
    K, V = _kernel_dims(problem)
    return {
        "L": L, "P": P, "X": X, "P_over_7": max(0.0, P - 7.0),
        "X_over_16": max(0.0, X - 16.0), "k": math.log2(K) - 7.0,
        "v": math.log2(V) - 7.0,
        "prod": 0.0 if problem.gate_activation == "none" else 1.0,
    }  # fmt: skip


def _kernel_dims(problem) -> tuple[int, int]:
    """The head dims the kernels run (a K or V they lack runs at the next one: masked tiles)."""
    return kspecs.padded_head_dim(problem.head_dim_k), kspecs.padded_head_dim(problem.head_dim_v)


def role_features(problem, spec) -> dict[str, float]:
    """The features of running ``spec`` on ``problem`` (see the module docstring)."""
    from .runtime_args import segment_count

    K, V = _kernel_dims(problem)
    c, bv, seg = spec.tile.chunk, spec.scan.block_v, spec.scan.segment_chunks
    chunks = -(-problem.longest_seq // c)
    if seg:
        # two passes over one segment's chunks (its map, then its scan) and between them the
        # combine, serial over the segments (as plugin.split_cost)
        chain = 2 * min(chunks, seg) + -(-chunks // seg)
        tokens = problem.batch * problem.seq_len
        launched = problem.num_seqs * segment_count(problem.longest_seq, c, seg)
        states = min(launched, -(-tokens // (c * seg)) + problem.num_seqs)  # non-empty ones
    else:
        chain, states = chunks, problem.num_seqs
    waves = math.log2(V // bv * problem.heads_v * states / (2 * SMS))
    regs = math.log2(K * bv / (spec.scan.num_warps * 32))  # the state block's, per thread
    return {
        "chain": math.log2(chain * c), "waves": waves, "waves_over_1": max(0.0, waves),
        "v_blocks": math.log2(V / bv),
        "scan": math.log2(chain * c) + max(0.0, waves) + math.log2(K * bv) - 12,
        "regs": regs, "regs_over_7": max(0.0, regs - 7.0),
    }  # fmt: skip


def pair_features(problem, spec) -> dict[str, float]:
    """Every feature of ``spec`` on ``problem``, in ``FEATURES`` order."""
    return features(problem) | role_features(problem, spec)


# --- the fit (numpy, CPU) -------------------------------------------------------------------------


@attrs.frozen
class Sample:
    """One measured shape as the fitter sees it: per role, its features and measured ms; and the
    best measured ms of the shape (any spec), the yardstick of the regret."""

    times: Mapping[str, tuple[Mapping[str, float], float]]
    best_ms: float


def _design(samples, roles):
    import numpy as np

    X, y, which = [], [], []
    for i, s in enumerate(samples):
        for role, (f, ms) in s.times.items():
            if role in roles:
                X.append([f[n] for n in FEATURES] + [float(role == r) for r in roles])
                y.append(math.log2(ms))
                which.append((i, role))
    return np.array(X, dtype=float), np.array(y), which


def _solve(X, y, ridge: float, n_roles: int):
    """Ridge least squares on standardised shared features; the role offsets (one-hot columns,
    no intercept) are not shrunk. Returns (raw shared coefs, role offsets)."""
    import numpy as np

    nf = X.shape[1] - n_roles
    mean, scale = X[:, :nf].mean(axis=0), X[:, :nf].std(axis=0)
    scale[scale == 0] = 1.0  # a constant feature gets no weight
    Z = np.hstack([(X[:, :nf] - mean) / scale, X[:, nf:]])
    reg = np.diag([ridge * len(y)] * nf + [1e-9 * len(y)] * n_roles)
    w = np.linalg.solve(Z.T @ Z + reg, Z.T @ y)
    raw = w[:nf] / scale
    return raw, w[nf:] - raw @ mean


def _regrets(samples, roles, ridge: float) -> list[float]:
    """Leave-one-out: per sample, the measured time of the role a fit on the others picks, over
    the sample's best."""
    import numpy as np

    out = []
    for i, s in enumerate(samples):
        rest = samples[:i] + samples[i + 1 :]
        X, y, _ = _design(rest, roles)
        coef, offsets = _solve(X, y, ridge, len(roles))
        pred = {r: float(np.dot(coef, [f[n] for n in FEATURES]) + offsets[roles.index(r)])
                for r, (f, _) in s.times.items() if r in roles}  # fmt: skip
        if pred:
            out.append(s.times[min(pred, key=pred.get)][1] / s.best_ms)
    return out


def regret_stats(regrets: Sequence[float]) -> dict:
    import statistics

    return {"n": len(regrets), "median": statistics.median(regrets), "worst": max(regrets),
            "geomean": 2 ** statistics.mean(math.log2(r) for r in regrets),
            "over_1_25": sum(r > 1.25 for r in regrets)}  # fmt: skip


def fit(samples: Sequence[Sample], ridges: Sequence[float] = RIDGES) -> dict:
    """Fit the pooled model from ``samples``, its ridge strength picked from ``ridges`` by
    leave-one-out cross-validation over the same samples (so only they decide it).

    Returns the ``model`` payload: the shared raw-feature coefficients of log2(ms), per role its
    offset, shapes and RMS residual (log2), the ridge chosen and every ridge's CV regrets.
    Roles measured on fewer than ``MIN_SHAPES`` shapes are left out; where that leaves none,
    the payload has no roles (it predicts nothing) and says why in ``unfitted``."""
    import numpy as np

    counts = {r.name: sum(r.name in s.times for s in samples) for r in ROLES}
    dims = {r: sorted({_head_dim_k(s.times[r][0]) for s in samples if r in s.times})
            for r in counts}  # fmt: skip
    roles = [r.name for r in ROLES if counts[r.name] >= MIN_SHAPES]
    if not roles:  # too few shapes (a smoke sweep): a model that predicts nothing, said so
        return {"kind": MODEL_KIND, "feature_version": FEATURE_VERSION, "features": list(FEATURES),
                "ridge": None, "cv": {}, "coef": {n: 0.0 for n in FEATURES}, "roles": {},
                "unfitted": f"no role measured on {MIN_SHAPES} or more shapes (of "
                            f"{len(samples)}): the heuristic decides"}  # fmt: skip
    cv = {str(a): regret_stats(_regrets(list(samples), roles, a)) for a in ridges}
    ridge = min(ridges, key=lambda a: (round(cv[str(a)]["geomean"], 6), cv[str(a)]["worst"]))
    X, y, which = _design(samples, roles)
    coef, offsets = _solve(X, y, ridge, len(roles))
    resid = y - X[:, : len(FEATURES)] @ coef - X[:, len(FEATURES) :] @ offsets
    out_roles = {}
    for k, r in enumerate(roles):
        res = np.array([e for e, (_, w) in zip(resid, which, strict=True) if w == r])
        out_roles[r] = {"offset": float(offsets[k]), "shapes": counts[r],
                        "rms_log2": float(np.sqrt((res**2).mean())), "head_dims": dims[r]}  # fmt: skip
    return {"kind": MODEL_KIND, "feature_version": FEATURE_VERSION, "features": list(FEATURES),
            "ridge": ridge, "cv": cv, "coef": {n: float(c) for n, c in zip(FEATURES, coef,
                                                                          strict=True)},
            "roles": out_roles}  # fmt: skip


def predict_ms(payload: Mapping, role: str, feats: Mapping[str, float]) -> float | None:
    """2 ** (the role's offset + the shared coefficients . ``feats``, :func:`pair_features`);
    None for a role not fitted, or not measured at the (padded) head dim K of ``feats``: its
    offset says nothing of a kernel never timed there (the K = 256 segmented scans, valid since
    the row-blocked combine, until a sweep times them)."""
    entry = payload.get("roles", {}).get(role)
    if entry is None or _head_dim_k(feats) not in entry.get("head_dims", ()):
        return None
    return 2.0 ** (entry["offset"] + sum(c * feats[n] for n, c in payload["coef"].items()))


def _head_dim_k(feats: Mapping[str, float]) -> int:
    """The kernels' head dim K that the feature ``k`` (log2(K) - 7, :func:`features`) encodes."""
    return round(2 ** (feats["k"] + 7))


def payload_ok(payload: Mapping) -> bool:
    return (payload.get("kind") == MODEL_KIND
            and payload.get("feature_version") == FEATURE_VERSION
            and list(payload.get("features", ())) == list(FEATURES)
            and all("head_dims" in r for r in payload.get("roles", {}).values()))  # fmt: skip


def choose(payload: Mapping, problem, target: Target):
    """(role, spec, predicted ms) of the lowest prediction among the roles of ``problem``'s pool
    (CPU; what the ranker decides from this payload), or None when no role is modelled."""
    best = None
    for role, spec in pool(problem, target):
        ms = predict_ms(payload, role, pair_features(problem, spec))
        if ms is not None and (best is None or ms < best[2]):
            best = (role, spec, ms)
    return best


def predict(payload: Mapping, valid: Sequence, problem, target: Target) -> list[Prediction]:
    """The ranker hook: predictions for the specs of ``valid`` that a modelled role names. An
    unknown payload kind or feature set predicts nothing (the heuristic then decides)."""
    if not payload_ok(payload):
        return []
    out = []
    for role, spec in _resolved(list(valid), problem):
        feats = pair_features(problem, spec)
        ms = predict_ms(payload, role, feats)
        if ms is None:
            continue
        entry = payload["roles"][role]
        out.append(Prediction(spec, ms, f"role {role} (pooled least squares, offset "
                                        f"{entry['offset']:+.2f} log2 over {entry['shapes']} "
                                        f"shapes, rms {entry['rms_log2']:.2f}; chain "
                                        f"2^{feats['chain']:.1f} tokens, "
                                        f"{2 ** feats['waves']:.2g} waves)"))  # fmt: skip
    return out
