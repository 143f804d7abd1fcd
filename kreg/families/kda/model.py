"""The KDA split path's fitted cost model: spec roles, shape features, the fit and the ranker hook.

A *role* names one split spec by rules that hold at every head dim ("chunk 16, the widest V
block up to 64, scan 4 warps 3 stages, no segments"), so measurements at one head dim inform the
others; :func:`resolve` turns a role into the concrete valid spec of a problem. The model is one
least-squares fit per role of log2(device ms) against the shape :func:`features`; the ranker
(``kreg/dispatch/ranker.py``) calls :func:`predict` with the payload of a
``kreg/dispatch/kda_model.json`` section and runs the role of lowest predicted time.

Features (``FEATURES``, all from the problem, no data): the longest sequence ``L`` (log2: the
scan's serial chain), the chains ``P`` = log2(sequences x value heads) (the scan's parallelism)
and the work ``X`` = log2(tokens x value heads) (the prep kernel's), hinges where the scan's
programs and the prep's chunks outgrow one wave of the H200's 132 SMs, the head dims (log2 / 128)
and the production options (gate activation in the kernel). Fitted by ridge least squares on
standardised features; the payload stores the coefficients on the raw features, so a reader can
evaluate a prediction by hand.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import attrs

from kreg.registry.model import Prediction, Target

from . import specs as kspecs

MODEL_KIND = "kda-split-roles-lstsq"
FEATURE_VERSION = 1
FEATURES = ("const", "L", "P", "X", "P_over_7", "X_over_16", "k", "v", "prod")
RIDGE = 0.1  # in units of standardised features: mild shrinkage for roles with few shapes
MIN_SHAPES_PER_FEATURE = 1.5  # a role fitted on fewer shapes than this x features is dropped
# Sequence-parallel scans keep an affine map [K, K + V] and a start state [K, V] (fp32) per
# segment of every sequence, counted from the packed length: with many short varlen sequences
# that is gigabytes. Specs above this (or twice q + k + v) are neither swept nor predicted.
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


def _role(chunk, wide, warps, stages, seg) -> Role:
    name = f"c{chunk}.{'wide' if wide else 'narrow'}.w{warps}s{stages}.seg{seg}"
    return Role(name, chunk, wide, warps, stages, seg)


# Ten, covering what won somewhere in docs/kda/SPEED.md and the tuning table (chunk 16 with a
# wide V block, chunk 32 with a narrow one, segments of 16 and 64 chunks) plus chunk 64, the
# heuristic's usual choice off the table. The prep spec of a role is its chunk's with solve_block
# 16 (the only one a bounded gate admits at every head dim) and the fewest warps enumerated.
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
    _role(64, True, 4, 2, 0),
)
ROLE_BY_NAME = {r.name: r for r in ROLES}


def _tile_warps(valid: Sequence, chunk: int) -> int | None:
    warps = [s.tile.num_warps for s in valid if s.tile.chunk == chunk and s.tile.solve_block == 16]
    return min(warps) if warps else None


def resolve(role: Role, valid: Sequence) -> kspecs.KdaSplitSpec | None:
    """The spec of ``valid`` (specialised, valid split specs of one problem) that ``role`` names,
    or None where the enumeration has none (say chunk 64 at head dim 128)."""
    if not valid:
        return None
    tw = _tile_warps(valid, role.chunk)
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

    K, V = problem.head_dim_k, problem.head_dim_v
    n_seg = segment_count(problem.seq_len, spec.tile.chunk, seg)
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
    """The shape features of ``problem`` (see the module docstring), in ``FEATURES`` order."""
    n, hv = problem.num_seqs, problem.heads_v
    L = math.log2(problem.longest_seq)
    P = math.log2(n * hv)
    X = math.log2(problem.batch * problem.seq_len * hv)
    return {
        "const": 1.0, "L": L, "P": P, "X": X, "P_over_7": max(0.0, P - 7.0),
        "X_over_16": max(0.0, X - 16.0), "k": math.log2(problem.head_dim_k) - 7.0,
        "v": math.log2(problem.head_dim_v) - 7.0,
        "prod": 0.0 if problem.gate_activation == "none" else 1.0,
    }  # fmt: skip


# --- the fit (numpy, CPU) -------------------------------------------------------------------------


def fit(samples: Sequence[tuple[Mapping[str, float], Mapping[str, float]]],
        ridge: float = RIDGE) -> dict:  # fmt: skip
    """Fit the per-role model from ``samples``: (features, {role: measured ms}) per shape.

    Returns the ``model`` payload: per role the raw-feature coefficients of log2(ms), the shapes
    it was fitted on and its RMS residual (log2). Roles measured on too few shapes are left out.
    """
    import numpy as np

    names = [f for f in FEATURES if f != "const"]
    roles = {}
    for role in ROLES:
        rows = [(f, t[role.name]) for f, t in samples
                if role.name in t and t[role.name] and math.isfinite(t[role.name])]  # fmt: skip
        if len(rows) < MIN_SHAPES_PER_FEATURE * len(FEATURES):
            continue
        X = np.array([[f[n] for n in names] for f, _ in rows], dtype=float)
        y = np.log2(np.array([ms for _, ms in rows], dtype=float))
        mean, scale = X.mean(axis=0), X.std(axis=0)
        scale[scale == 0] = 1.0  # a constant feature (say all K = 128) gets no weight
        Z = (X - mean) / scale
        A = np.hstack([np.ones((len(rows), 1)), Z])
        reg = ridge * len(rows) * np.eye(A.shape[1])
        reg[0, 0] = 0.0  # the intercept is not shrunk
        w = np.linalg.solve(A.T @ A + reg, A.T @ y)
        raw = w[1:] / scale
        coef = {"const": float(w[0] - (raw * mean).sum())} | {
            n: float(c) for n, c in zip(names, raw, strict=True)
        }
        resid = y - A @ w
        roles[role.name] = {"coef": coef, "shapes": len(rows),
                            "rms_log2": float(np.sqrt((resid**2).mean()))}  # fmt: skip
    return {"kind": MODEL_KIND, "feature_version": FEATURE_VERSION, "features": list(FEATURES),
            "ridge": ridge, "roles": roles}  # fmt: skip


def predict_ms(payload: Mapping, role: str, feats: Mapping[str, float]) -> float | None:
    entry = payload.get("roles", {}).get(role)
    if entry is None:
        return None
    return 2.0 ** sum(c * feats[n] for n, c in entry["coef"].items())


def payload_ok(payload: Mapping) -> bool:
    return (payload.get("kind") == MODEL_KIND
            and payload.get("feature_version") == FEATURE_VERSION
            and list(payload.get("features", ())) == list(FEATURES))  # fmt: skip


def choose(payload: Mapping, problem, target: Target):
    """(role, spec, predicted ms) of the lowest prediction among the roles of ``problem``'s pool
    (CPU; what the ranker decides from this payload), or None when no role is modelled."""
    feats = features(problem)
    best = None
    for role, spec in pool(problem, target):
        ms = predict_ms(payload, role, feats)
        if ms is not None and (best is None or ms < best[2]):
            best = (role, spec, ms)
    return best


def predict(payload: Mapping, valid: Sequence, problem, target: Target) -> list[Prediction]:
    """The ranker hook: predictions for the specs of ``valid`` that a modelled role names. An
    unknown payload kind or feature set predicts nothing (the heuristic then decides)."""
    if not payload_ok(payload):
        return []
    feats = features(problem)
    out = []
    for role, spec in _resolved(list(valid), problem):
        ms = predict_ms(payload, role, feats)
        if ms is None:
            continue
        entry = payload["roles"][role]
        out.append(Prediction(spec, ms, f"role {role} (least squares over {entry['shapes']} "
                                        f"shapes, rms {entry['rms_log2']:.2f} log2)"))  # fmt: skip
    return out
