"""The GDN family's registration: the gated delta rule with one scalar gate per token and value
head (Qwen3-Next's linear attention), served by the delta-rule kernels KDA runs, in their scalar
gate mode: candidates ``gdn.split`` (prefill), ``gdn.recurrent`` (decode, pools) and
``gdn.fused`` (opt-in).

The kernels, the launch path and the argument checks are the shared delta-rule ones
(``kreg.families.kda``: ``kernels``, ``launch``, ``api``); what is GDN's own is here: which
problems it accepts (a scalar gate), its entry (``api.gdn_prefill``), its golden cases, its
measurements and its data (``tuning.json`` beside this file).
"""

from __future__ import annotations

from kreg.families.kda import specs
from kreg.families.kda.plugin import delta_rule_candidates
from kreg.problems import LinearAttentionProblem
from kreg.registry.hookspecs import hookimpl
from kreg.registry.model import Family, Verdict

from .selection import ABI_VERSION, FAMILY_NAME

FUSED_OPT_IN_REASON = (
    "one program per (sequence, value head) serialises the parallel tile phase; KDA's fused "
    "path, the same kernel with per-channel gates, measured 2.5-50x slower than its split "
    "(docs/kda/CASE_STUDY.md); GDN's own fused path is not timed yet (docs/gdn/SPEED.md)"
)


def accepts(problem: LinearAttentionProblem) -> Verdict:
    return Verdict.check(
        (problem.gate == "scalar",
         f"gate={problem.gate!r}: GDN gates are one scalar per token and value head "
         "(per-channel gates are KDA's)"),
        (max(problem.head_dim_k, problem.head_dim_v) <= specs.MAX_HEAD_DIM,
         f"head dims K={problem.head_dim_k}, V={problem.head_dim_v}: at most "
         f"{specs.MAX_HEAD_DIM} (smaller ones run zero-padded to {specs.HEAD_DIMS})"),
    )  # fmt: skip


SPLIT, RECURRENT, FUSED = delta_rule_candidates(
    FAMILY_NAME,
    accepts,
    split_description="prep kernel (tiles, one program per chunk: whole-chunk products, the "
    "scalar gate's decay factor from one masked product, no pairs kernel) + scan kernel "
    "(recurrence)",
    fused_description="tiles and recurrence in one kernel, one program per (sequence, value head)",
    fused_opt_in_reason=FUSED_OPT_IN_REASON,
)

FAMILY = Family(
    name=FAMILY_NAME,
    problem_type=LinearAttentionProblem,
    candidates=(SPLIT, RECURRENT, FUSED),
    abi_version=ABI_VERSION,
    description="Gated DeltaNet: gated delta-rule linear attention with a scalar gate per token "
    "and value head, chunkwise prefill and token-serial decode",
    docs="docs/families/gdn.md",
    # Qwen3-Next's layer: 16 q/k heads, 32 value heads, K = V = 128, softplus gate, L2 norm
    default_options={
        "gate": "scalar",
        "H": "16",
        "HV": "32",
        "gate_activation": "softplus",
        "qk_l2norm": "true",
    },  # fmt: skip
    data=__package__,  # its tuning data would sit here (none yet: the split heuristic ranks)
)


@hookimpl
def kreg_register_families(register):
    register(FAMILY)


@hookimpl
def kreg_register_golden_cases(register):
    from .golden_cases import golden_cases

    for case in golden_cases():
        register(case)


@hookimpl
def kreg_register_scenarios(register):
    from .bench import decode, scenario

    register(scenario.scenario())
    register(decode.scenario())
