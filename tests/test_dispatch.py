"""select(): stages, opt-in, pinning, errors, cache and the tuning table."""

from __future__ import annotations

import json
import os
import warnings

import attrs
import pytest
import torch
import triton

from kreg.dispatch import NoCandidateError, TraceEntry, TuningWarning, clear_cache, select


@pytest.fixture
def vec(testfam):
    from kreg_testfam.family import Tile, VecProblem, VecSpec

    return VecProblem, VecSpec, Tile


def test_opt_in_never_wins_under_auto(vec):
    VecProblem, VecSpec, Tile = vec
    sel = select(VecProblem(), "sm90")
    assert sel.candidate.name == "testfam.simple"
    assert sel.spec == VecSpec(Tile(32, 1))
    assert sel.decided_by == "priority"
    assert (
        TraceEntry("testfam.fast", "ranked", False, "opt-in: experimental, numerics unverified")
        in sel.trace
    )
    assert [(e.candidate, e.stage) for e in sel.trace] == [
        ("testfam.fast", "problem"),
        ("testfam.fast", "target"),
        ("testfam.fast", "spec"),
        ("testfam.simple", "problem"),
        ("testfam.simple", "target"),
        ("testfam.simple", "spec"),
        ("testfam.fast", "ranked"),
        ("testfam.simple", "ranked"),
    ]
    spec_entry = sel.trace[5]
    assert spec_entry.reason.startswith("16 enumerated, 16 match the problem, 11 valid; rejected: ")
    assert spec_entry.reason.endswith("(+2 more)")


def test_allow_opt_in_and_pinned(vec):
    VecProblem, VecSpec, Tile = vec
    sel = select(VecProblem(), "sm90", allow_opt_in=True)
    assert sel.candidate.name == "testfam.fast"
    assert sel.spec == VecSpec(Tile(1024, 1))  # lowest cost
    assert sel.decided_by.startswith("heuristic cost 4.1 ")
    assert any(e.reason.startswith("outranked by testfam.fast") for e in sel.trace)
    for name in ("fast", "testfam.fast"):
        assert select(VecProblem(), "gfx950", algorithm=name).candidate.name == "testfam.fast"
    pinned = select(VecProblem(), "sm90", algorithm="simple")
    assert pinned.candidate.name == "testfam.simple"
    assert {e.candidate for e in pinned.trace} == {"testfam.simple"}


def test_pinned_candidate_that_cannot_serve(vec):
    VecProblem, _, _ = vec
    with pytest.raises(NoCandidateError, match="candidate testfam.fast cannot serve") as e:
        select(VecProblem(dtype="fp16"), "sm90", algorithm="fast")
    assert "testfam.fast: spec: 8 enumerated, 0 match the problem, 0 valid" in str(e.value)
    with pytest.raises(NoCandidateError, match="target: gfx942 not in sm90, gfx950"):
        select(VecProblem(), "gfx942", algorithm="fast")


def test_no_candidate_lists_every_candidate(vec):
    VecProblem, _, _ = vec
    with pytest.raises(NoCandidateError) as e:
        select(VecProblem(n=0), "sm90")
    lines = str(e.value).splitlines()
    assert lines[0] == "no candidate serves VecProblem(n=0) on sm90"
    assert lines[1:] == [
        "  testfam.fast: problem: n must be positive",
        "  testfam.simple: problem: n must be positive",
    ]
    with pytest.raises(NoCandidateError, match="n not a multiple of 32") as e:
        select(VecProblem(n=48), "sm90")
    assert {t.candidate for t in e.value.trace} == {"testfam.fast", "testfam.simple"}
    # an opt-in candidate that alone could serve is still not chosen, and says why
    with pytest.raises(NoCandidateError, match="testfam.fast: ranked: opt-in: experimental"):
        select(VecProblem(n=1 << 21), "sm90")
    assert select(VecProblem(n=1 << 21), "sm90", allow_opt_in=True).candidate.name == "testfam.fast"
    with pytest.raises(NoCandidateError, match="no registered family serves object"):
        select(object(), "sm90")


def test_bad_arguments(vec):
    VecProblem, _, _ = vec
    with pytest.raises(
        ValueError, match="unknown algorithm 'nope'; known: auto, testfam.fast, testfam.simple"
    ):
        select(VecProblem(), "sm90", algorithm="nope")
    with pytest.raises(ValueError, match="unknown target 'sm100'; known: sm90, gfx950, gfx942"):
        select(VecProblem(), "sm100")


def test_target_none_without_gpu(vec):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    with pytest.raises(ValueError, match="no supported GPU detected: pass target="):
        select(vec[0]())


@pytest.mark.gpu
def test_target_detected_on_gpu(vec):
    assert select(vec[0](), algorithm="simple").target.name in ("sm90", "gfx950", "gfx942")


def test_cache_and_determinism(vec):
    VecProblem, _, _ = vec
    first = select(VecProblem(), "sm90")
    assert select(VecProblem(), "sm90") is first
    clear_cache()
    again = select(VecProblem(), "sm90")
    assert again is not first and again == first


# --- tuning table ------------------------------------------------------------------------------


def section(target="sm90", triton_version=None, abi=3, entries=None):
    return {
        "header": {
            "target": target,
            "triton": triton_version or triton.__version__,
            "abi": {"testfam": abi},
        },
        "entries": entries
        if entries is not None
        else [
            {
                "candidate": "testfam.simple",
                "bucket": {"dtype": "fp32"},
                "spec": {"tile": {"block": 256}},
            }
        ],
    }


@pytest.fixture
def table(tmp_path, monkeypatch, vec):
    def use(data):
        path = tmp_path / "tuning.json"
        path.write_text(json.dumps(data))
        monkeypatch.setenv("KREG_TUNING", str(path))
        clear_cache()

    return use


def test_tuning_entry_decides(vec, table):
    VecProblem, VecSpec, Tile = vec
    table(section())
    sel = select(VecProblem(), "sm90")
    assert sel.spec == VecSpec(Tile(256, 1))
    assert sel.decided_by.startswith("tuning table entry {'tile': {'block': 256}}")
    # bucket does not match: no entry, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select(VecProblem(dtype="fp16"), "sm90").decided_by == "priority"
        assert select(VecProblem(), "gfx950").decided_by == "priority"  # other target's section


@pytest.mark.parametrize(
    "stale, why",
    [
        (section(triton_version="3.5.0"), "measured with Triton 3.5.0"),
        (section(abi=2), "abi 2, family is at abi 3"),
    ],
)
def test_stale_tuning_section_ignored_with_warning(vec, table, stale, why):
    table([stale, section(target="gfx950")])
    with pytest.warns(TuningWarning, match=why):
        sel = select(vec[0](), "sm90")
    assert sel.decided_by == "priority" and sel.spec.tile.block == 32


def test_stale_section_never_half_used(vec, table):
    # the stale section comes first; the current one after it decides
    good = section(entries=[{"candidate": "testfam.simple", "spec": {"tile": {"block": 64}}}])
    table([section(triton_version="0.0"), good])
    with pytest.warns(TuningWarning):
        assert select(vec[0](), "sm90").spec.tile.block == 64


def test_tuning_entry_matching_no_enumerated_spec_warns(vec, table):
    table(section(entries=[{"candidate": "testfam.simple", "spec": {"tile": {"block": 7}}}]))
    with pytest.warns(TuningWarning, match="matches no spec of the sm90 enumeration"):
        assert select(vec[0](), "sm90").decided_by == "priority"


def test_tuning_entry_invalid_for_the_problem_does_not_apply_silently():
    """The packaged sm90 entries name no anchor (it follows the problem): they apply to bounded
    and unbounded gates alike, each specialised to its anchor, and warn about nothing."""
    from kreg.problems import LinearAttentionProblem

    bounded = LinearAttentionProblem(
        batch=1, seq_len=8192, heads_qk=8, heads_v=8, head_dim_k=128, head_dim_v=128
    )
    bounded = attrs.evolve(bounded, gate_lower_bound=-5.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b = select(bounded, "sm90")
        u = select(attrs.evolve(bounded, gate_lower_bound=None), "sm90")
    assert b.decided_by.startswith("tuning table entry") and b.spec.tile.anchor == "block"
    assert u.decided_by == b.decided_by and u.spec.tile.anchor == "safe"
    assert attrs.evolve(u.spec.tile, anchor="block") == b.spec.tile


def test_malformed_tuning_table_warns(vec, table):
    table({"entries": "nope"})
    with pytest.warns(TuningWarning, match="malformed"):
        assert select(vec[0](), "sm90").decided_by == "priority"


@pytest.mark.parametrize("change", [
    {"header": {"abi": 1}},  # abi not a mapping
    {"entries": [{"candidate": "testfam.simple", "bucket": "all", "spec": {}}]},
    {"entries": [{"candidate": "testfam.simple", "spec": "fast"}]},
], ids=["abi", "bucket", "spec"])  # fmt: skip
def test_well_formed_json_of_the_wrong_shape_is_ignored_not_a_crash(vec, table, change):
    """Valid JSON, wrong shapes inside a section: the section is ignored with a warning and
    the next decides (they once raised AttributeError out of select and kda_prefill)."""
    bad = section()
    for key, value in change.items():
        bad[key] = {**bad[key], **value} if isinstance(value, dict) else value
    good = section(entries=[{"candidate": "testfam.simple", "spec": {"tile": {"block": 64}}}])
    table([bad, good])
    with pytest.warns(TuningWarning, match="malformed"):
        assert select(vec[0](), "sm90").spec.tile.block == 64


def test_a_family_ships_its_own_tuning_table(vec, testfam, tmp_path, monkeypatch):
    """A family's measurements are read from the package its ``data`` names, so a third party's
    family ships its tuning table (and cost models) in its own folder; another family's files
    do not apply to it, and ``$KREG_TUNING`` replaces them all."""
    from kreg.dispatch import ranker

    VecProblem, VecSpec, Tile = vec
    pkg = tmp_path / "kreg_t_famdata"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "tuning.json").write_text(json.dumps(section()))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("KREG_TUNING", raising=False)
    clear_cache()
    family = testfam.families["testfam"]
    simple = next(c for c in family.candidates if c.name == "testfam.simple")
    specs = [VecSpec(Tile(b, 1)) for b in (32, 64, 256)]
    args = (
        simple,
        attrs.evolve(family, data="kreg_t_famdata"),
        specs,
        VecProblem(),
        testfam.targets["sm90"],
    )
    assert ranker.tuned_spec(*args)[0] == VecSpec(Tile(256, 1))
    assert ranker.tuned_spec(simple, family, *args[2:]) is None  # testfam ships no data
    kda = attrs.evolve(family, data="kreg.families.kda")  # KDA's table names no testfam entry
    assert ranker.tuned_spec(simple, kda, *args[2:]) is None
    other = tmp_path / "other.json"
    other.write_text(json.dumps(section(entries=[])))
    monkeypatch.setenv("KREG_TUNING", str(other))
    clear_cache()
    assert ranker.tuned_spec(*args) is None


def test_packaged_tuning_table_is_valid():
    from importlib import resources

    from kreg.families.kda.plugin import FAMILY

    data = json.loads(resources.files(FAMILY.data).joinpath("tuning.json").read_text())
    sections = data if isinstance(data, list) else [data]
    for s in sections:
        assert {"target", "triton", "abi"} <= set(s["header"])
        assert all("candidate" in e for e in s["entries"])


# --- varlen: the longest sequence decides ---------------------------------------------------------


def _varlen(lengths, **kw):
    from kreg.problems import LinearAttentionProblem

    return LinearAttentionProblem(
        batch=1, seq_len=sum(lengths), heads_qk=8, heads_v=8, head_dim_k=128, head_dim_v=128,
        varlen=True, num_seqs=len(lengths), max_seqlen=max(lengths), **kw,
    )  # fmt: skip


ONE_LONG = (30_000,) + (50,) * 20  # one long sequence among 20 short ones: T = 31,000
EVEN = (1477,) * 20 + (1460,)  # the same 31,000 tokens over the same 21 sequences, evenly


@pytest.fixture
def heuristic_only(monkeypatch):
    """No cost model: the tuning table, then the heuristic cost decide."""
    monkeypatch.setenv("KREG_MODELS", os.devnull)
    clear_cache()
    yield
    monkeypatch.delenv("KREG_MODELS")
    clear_cache()


def test_a_long_sequence_among_short_ones_gets_a_segmented_scan(heuristic_only):
    """The scan's serial chain is as long as the longest sequence: keyed and costed on the mean
    (1,476 tokens) the 30,000-token sequence got no segments and ran at 0.53x the peer. (The
    heuristic's view; the fitted model, which decides off the tuning table where it applies,
    has no role with this spec: docs/kda/GRID.md.)"""
    long, even = _varlen(ONE_LONG), _varlen(EVEN)
    assert (long.seq_len, even.seq_len, long.num_seqs) == (31_000, 31_000, 21)
    assert long.bucket()["tokens_per_seq"] == 32768 and even.bucket()["tokens_per_seq"] == 2048
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert select(long, "sm90").spec.scan.segment_chunks > 0
        assert select(even, "sm90").spec.scan.segment_chunks == 0
        # unknown longest (a problem built by hand): planned on the mean, as before
        assert select(attrs.evolve(long, max_seqlen=None), "sm90").spec.scan.segment_chunks == 0


def test_fixed_length_problems_carry_no_max_seqlen():
    from kreg.problems import LinearAttentionProblem

    base = dict(batch=2, seq_len=4096, heads_qk=8, heads_v=8, head_dim_k=128, head_dim_v=128)
    plain = LinearAttentionProblem(**base)
    assert LinearAttentionProblem(**base, max_seqlen=4096) == plain  # one problem, one entry
    assert plain.max_seqlen is None and plain.longest_seq == 4096
    assert plain.bucket()["tokens_per_seq"] == 4096


@pytest.mark.parametrize(
    "kw,message",
    [(dict(max_seqlen=0), "max_seqlen must be a positive int or None, got 0"),
     (dict(max_seqlen=True), "max_seqlen must be a positive int or None, got True"),
     (dict(max_seqlen=30_000.0), "max_seqlen must be a positive int or None, got 30000.0"),
     (dict(max_seqlen=31_001), "max_seqlen (31001) must be <= seq_len (31000)"),
     (dict(max_seqlen=1476), "max_seqlen (1476) is below the mean: 21 sequences"),
     (dict(varlen=False, num_seqs=1, max_seqlen=30_000),
      "max_seqlen must be None or seq_len (31000) without varlen, got 30000")],
    ids=["zero", "bool", "float", "past_seq_len", "below_mean", "fixed_length"],
)  # fmt: skip
def test_max_seqlen_is_validated(kw, message):
    with pytest.raises(ValueError) as e:
        attrs.evolve(_varlen(ONE_LONG), **kw)
    assert str(e.value).startswith(message), str(e.value)


def test_explain_shows_the_bucket_of_the_longest_sequence(capsys, heuristic_only):
    from kreg.cli import main

    options = ["T=31000", "H=8", "varlen=true", "num_seqs=21", "max_seqlen=30000"]
    assert main(["explain", "kda", "--target", "sm90", *options]) == 0
    text = capsys.readouterr().out
    assert "max_seqlen=30000" in text
    bucket = "{'dtype': 'bf16', 'head_dim': 128, 'seqs_x_heads': 256, 'tokens_per_seq': 32768}"
    assert ["bucket", bucket] in [line.split(None, 1) for line in text.splitlines()]
    assert main(["explain", "kda", "--target", "sm90", *options, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["bucket"]["tokens_per_seq"] == 32768
    assert data["problem"]["fields"]["max_seqlen"] == 30000
    assert data["selected"]["spec"]["scan"]["segment_chunks"] > 0


def test_one_target_resolution_for_every_entry():
    """The dispatcher, kda_prefill, the CLI and the benchmarks resolve ``target`` in one place:
    a Target as it is, a registered name, and anything else refused naming the argument."""
    from kreg.registry import get_registry
    from kreg.registry.targets import resolve

    targets = get_registry().targets
    assert resolve(targets, "sm90") is targets["sm90"]
    assert resolve(targets, targets["gfx950"]) is targets["gfx950"]
    for bad in ("sm100", 5, b"sm90"):
        with pytest.raises(ValueError, match="^target: unknown target"):
            resolve(targets, bad)


@pytest.mark.parametrize(
    "activation, bound, name",
    [("relu", None, "gate_activation"), ("sigmoid_bound", None, "gate_lower_bound"),
     ("softplus", -5.0, "gate_lower_bound"), ("none", 0.0, "gate_lower_bound"),
     ("none", True, "gate_lower_bound"), ("none", float("-inf"), "gate_lower_bound")],
)  # fmt: skip
def test_gate_rules_are_one_check_for_the_problem_and_the_entry(activation, bound, name):
    """The problem type and kda_prefill's validation refuse the same gate options with the same
    message, naming the argument (one check, kreg.problems.linear_attention.check_gate)."""
    from kreg.families.kda import api
    from kreg.problems.linear_attention import LinearAttentionProblem, check_gate

    with pytest.raises(ValueError, match=f"^{name}: ") as direct:
        check_gate(activation, bound)
    with pytest.raises(ValueError) as problem:
        LinearAttentionProblem(batch=1, seq_len=8, heads_qk=1, heads_v=1, head_dim_k=32,
                               head_dim_v=32, gate_activation=activation, gate_lower_bound=bound)  # fmt: skip
    x = torch.zeros(1, 8, 1, 32)
    with pytest.raises(ValueError) as entry:
        api._validate(x, x, x, x, torch.zeros(1, 8, 1), None, None, False, bound, None, None,
                      None, None, activation, False, False, "kv", False)  # fmt: skip
    assert str(problem.value) == str(entry.value) == str(direct.value)
