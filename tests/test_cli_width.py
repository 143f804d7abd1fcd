"""Every line the CLI prints for a person fits in 100 columns: tables wrap their widest column,
reprs show only the fields that differ from their defaults, long messages wrap.

Not covered, on purpose: ``--json`` (for scripts), the IR that ``build --stage`` and ``golden
diff`` print (compiler output, line for line), and user errors (one ``kreg: error:`` line by
rule, whatever its length).
"""

from __future__ import annotations

import pytest

from kreg import golden
from kreg.cli import main
from kreg.cli._util import WIDTH, short_repr, table
from kreg.families.kda.specs import KdaScanSpec, KdaSplitSpec, KdaTileSpec
from kreg.problems import LinearAttentionProblem

COMMANDS = {
    "list": ["list"],
    "explain_sm90": ["explain", "kda", "--target", "sm90"],
    "explain_gfx950": ["explain", "kda", "--target", "gfx950"],
    "explain_sm90_verbose": ["explain", "kda", "--target", "sm90", "B=2", "T=4096", "--verbose"],
    "explain_gfx942_fused": ["explain", "kda", "--target", "gfx942", "--algorithm", "fused",
                             "--allow-opt-in", "K=64"],
    "explain_every_option": ["explain", "kda", "--target", "sm90", "K=100", "V=12", "HV=64",
                             "varlen=true", "num_seqs=4", "max_seqlen=2048", "lower_bound=-5",
                             "gate_activation=sigmoid_bound", "output_chunk_states=true",
                             "chunk_states_size=128", "chunk_states_dtype=bf16",
                             "initial_state=true", "state_layout=vk"],
    "bench_list": ["bench", "--list"],
    "matrix": ["matrix"],
    "matrix_check": ["matrix", "--check"],
    "docs_check": ["docs", "--check"],
    "version": ["--version"],
    "help": ["--help"],
    **{f"help_{c}": [c, "--help"] for c in ("list", "explain", "build", "golden", "matrix",
                                             "docs", "bench")},
    "help_golden_check": ["golden", "check", "--help"],
}  # fmt: skip


def _output(capsys, argv) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # --help, --version
        code = e.code
    out = capsys.readouterr()
    return code, out.out + out.err


def _assert_narrow(text: str, what: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > WIDTH]
    assert not wide, f"{what}: {len(wide)} line(s) over {WIDTH} columns, e.g. {wide[0]!r}"


@pytest.mark.parametrize("name", list(COMMANDS))
def test_command_output_within_100_columns(capsys, monkeypatch, name):
    monkeypatch.delenv("COLUMNS", raising=False)  # argparse: the 80 columns of a pipe
    code, text = _output(capsys, COMMANDS[name])
    assert code in (0, None), text
    assert text.strip()
    _assert_narrow(text, name)


@pytest.mark.slow
def test_build_output_within_100_columns(capsys):
    code, text = _output(capsys, ["build", "kda", "--target", "sm90", "K=32", "T=256"])
    assert code == 0, text
    assert "shared_bytes" in text
    _assert_narrow(text, "build")


def test_golden_skip_message_within_100_columns(capsys, monkeypatch, tmp_path):
    path = tmp_path / "golden.json"
    golden.save(path, {"format": 1, "triton": {"0.0.1": {}}})
    for name in ("CI", golden.STRICT_ENV):
        monkeypatch.delenv(name, raising=False)
    code, text = _output(capsys, ["golden", "check", "--file", str(path)])
    assert code == 0 and "skipped" in text
    _assert_narrow(text, "golden check")


def test_short_repr_shows_only_non_default_fields():
    spec = KdaSplitSpec(KdaTileSpec(chunk=32), KdaScanSpec(chunk=32, block_v=32))
    assert short_repr(spec) == (
        "KdaSplitSpec(tile=KdaTileSpec(chunk=32), scan=KdaScanSpec(chunk=32, block_v=32))"
    )
    assert short_repr(KdaSplitSpec()) == "KdaSplitSpec()"
    problem = LinearAttentionProblem(1, 64, 2, 2, 32, 32, qk_l2norm=True)
    # fields without a default always; num_seqs is filled in from batch
    assert short_repr(problem) == (
        "LinearAttentionProblem(batch=1, seq_len=64, heads_qk=2, heads_v=2, head_dim_k=32, "
        "head_dim_v=32, qk_l2norm=True, num_seqs=1)"
    )
    assert short_repr(3) == "3"


def test_table_wraps_its_widest_column():
    rows = [["a", "x" * 10, " ".join(["word"] * 60)], ["bb", "y", "z"]]
    text = table(rows, ["k", "v", "reason"], "  ")
    _assert_narrow(text, "table")
    lines = text.splitlines()
    assert len(lines) > 3  # the reason wrapped onto continuation lines
    start = lines[1].index("word")
    assert all(line[start:].startswith("word") for line in lines[2:-1])  # aligned under it
    assert lines[-1].split() == ["bb", "y", "z"]
    assert table([["a", "b"]], ["x", "y"]) == "x  y\na  b"  # narrow tables are unchanged
