"""The request shape of linear-attention prefill (KDA and any future linear-attention family).

Linear attention has no SDPA request shape (no softmax, a recurrent state instead of a KV cache),
so it gets its own problem type. Every field is validated when the problem is constructed.
"""

from __future__ import annotations

import math
from typing import ClassVar

import attrs

DTYPES = ("bf16", "fp16", "fp32")
GATE_KINDS = ("per_channel", "scalar")
GATE_ACTIVATIONS = ("none", "sigmoid_bound", "softplus")
STATE_LAYOUTS = ("kv", "vk")
STATE_DTYPES = ("fp32", "bf16")
CHUNK_STATE_DTYPES = ("fp32", "bf16", "fp16")


def _positive(instance, attribute, value):
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{attribute.name} must be a positive int, got {value!r}")


def _bool(instance, attribute, value):
    if not isinstance(value, bool):
        raise ValueError(f"{attribute.name} must be a bool, got {value!r}")


def _one_of(choices):
    def check(instance, attribute, value):
        if value not in choices:
            raise ValueError(f"{attribute.name} must be one of {choices}, got {value!r}")

    return check


def check_gate(gate_activation, gate_lower_bound) -> None:
    """The gate options' rules, in the one place every entry (the problem type, ``kda_prefill``'s
    validation) checks them: a ``ValueError`` naming the argument at fault. A bound is a finite
    negative number (or None: unbounded); the sigmoid activation needs its bound, softplus has
    none."""
    if gate_activation not in GATE_ACTIVATIONS:
        raise ValueError(f"gate_activation: must be one of {GATE_ACTIVATIONS}, got "
                         f"{gate_activation!r}")  # fmt: skip
    if gate_lower_bound is not None and (
        isinstance(gate_lower_bound, bool) or not isinstance(gate_lower_bound, (int, float))
        or not math.isfinite(gate_lower_bound) or gate_lower_bound >= 0
    ):  # fmt: skip
        raise ValueError(f"gate_lower_bound: must be a finite negative number or None, got "
                         f"{gate_lower_bound!r}")  # fmt: skip
    if gate_activation == "sigmoid_bound" and gate_lower_bound is None:
        raise ValueError("gate_lower_bound: gate_activation='sigmoid_bound' needs its bound "
                         "(e.g. -5.0)")  # fmt: skip
    if gate_activation == "softplus" and gate_lower_bound is not None:
        raise ValueError("gate_lower_bound: must be None with gate_activation='softplus' "
                         "(unbounded)")  # fmt: skip


def _bucket(n: int) -> int:
    """Power-of-two bucket, so tuning entries cover shape ranges rather than exact shapes."""
    return 1 << max(0, (n - 1).bit_length())


@attrs.frozen
class LinearAttentionProblem:
    """One linear-attention prefill call, as a dispatcher sees it (shapes and options, no data).

    ``batch`` rows of ``seq_len`` tokens; with ``varlen`` the batch is one packed row of
    ``seq_len`` tokens holding ``num_seqs`` sequences (``cu_seqlens``), the longest of them
    ``max_seqlen`` tokens long (None: not known, planned as if the tokens were spread evenly).
    The longest sequence decides the speed of a varlen batch: the scan's serial chain over a
    sequence's chunks is as long as that sequence, whatever the others hold.
    """

    batch: int = attrs.field(validator=_positive)
    seq_len: int = attrs.field(validator=_positive)
    heads_qk: int = attrs.field(validator=_positive)
    heads_v: int = attrs.field(validator=_positive)
    head_dim_k: int = attrs.field(validator=_positive)
    head_dim_v: int = attrs.field(validator=_positive)
    dtype: str = attrs.field(default="bf16", validator=_one_of(DTYPES))
    gate: str = attrs.field(default="per_channel", validator=_one_of(GATE_KINDS))
    # Lower bound of every per-step log-decay (natural log), a promise that admits faster specs;
    # None (the default): any gate g <= 0, -inf resets included.
    gate_lower_bound: float | None = None  # checked with gate_activation (check_gate)
    gate_activation: str = "none"  # check_gate
    qk_l2norm: bool = attrs.field(default=False, validator=_bool)
    beta_sigmoid: bool = attrs.field(default=False, validator=_bool)
    initial_state: bool = attrs.field(default=False, validator=_bool)
    state_dtype: str = attrs.field(default="fp32", validator=_one_of(STATE_DTYPES))
    output_final_state: bool = attrs.field(default=False, validator=_bool)
    state_layout: str = attrs.field(default="kv", validator=_one_of(STATE_LAYOUTS))
    output_chunk_states: bool = attrs.field(default=False, validator=_bool)
    # the states live in a pool [P, HV, K, V] read and written in place through per-sequence
    # slots (``initial_state_indices``): needs initial_state and output_final_state
    state_pool: bool = attrs.field(default=False, validator=_bool)
    # with output_chunk_states: the state every chunk_states_size tokens, in this dtype
    chunk_states_size: int = attrs.field(default=64, validator=_positive)
    chunk_states_dtype: str = attrs.field(default="fp32", validator=_one_of(CHUNK_STATE_DTYPES))
    varlen: bool = attrs.field(default=False, validator=_bool)
    num_seqs: int | None = None  # defaults to batch; the sequence count with varlen
    # the longest sequence's tokens with varlen (an upper bound is fine: it plans, never indexes);
    # without varlen every row is seq_len long, so it is stored as None (seq_len is accepted)
    max_seqlen: int | None = None

    def __attrs_post_init__(self):
        check_gate(self.gate_activation, self.gate_lower_bound)
        if self.heads_v % self.heads_qk:
            raise ValueError(
                f"heads_v ({self.heads_v}) must be a multiple of heads_qk ({self.heads_qk})"
            )
        if self.varlen and self.batch != 1:
            raise ValueError(f"batch must be 1 with varlen (packed sequences), got {self.batch}")
        if self.num_seqs is None:
            object.__setattr__(self, "num_seqs", self.batch)
        elif (not isinstance(self.num_seqs, int) or isinstance(self.num_seqs, bool)
              or self.num_seqs < 1):  # fmt: skip
            raise ValueError(f"num_seqs must be a positive int, got {self.num_seqs!r}")
        elif not self.varlen and self.num_seqs != self.batch:
            raise ValueError(f"num_seqs ({self.num_seqs}) must equal batch without varlen")
        if self.max_seqlen is not None:
            if (not isinstance(self.max_seqlen, int) or isinstance(self.max_seqlen, bool)
                    or self.max_seqlen < 1):  # fmt: skip
                raise ValueError(f"max_seqlen must be a positive int or None, got "
                                 f"{self.max_seqlen!r}")  # fmt: skip
            if not self.varlen and self.max_seqlen != self.seq_len:
                raise ValueError(f"max_seqlen must be None or seq_len ({self.seq_len}) without "
                                 f"varlen, got {self.max_seqlen}")  # fmt: skip
            if not self.varlen:  # every row is seq_len long: one problem, one cache entry
                object.__setattr__(self, "max_seqlen", None)
            elif self.max_seqlen > self.seq_len:
                raise ValueError(f"max_seqlen ({self.max_seqlen}) must be <= seq_len "
                                 f"({self.seq_len}), the packed length")  # fmt: skip
            elif self.max_seqlen * self.num_seqs < self.seq_len:
                raise ValueError(f"max_seqlen ({self.max_seqlen}) is below the mean: "
                                 f"{self.num_seqs} sequences of at most {self.max_seqlen} "
                                 f"tokens cannot fill seq_len={self.seq_len}")  # fmt: skip
        if self.state_pool and not (self.initial_state and self.output_final_state):
            raise ValueError("state_pool needs initial_state and output_final_state (the pool's "
                             "slots are read and written in place)")  # fmt: skip

    @property
    def group_size(self) -> int:
        return self.heads_v // self.heads_qk

    @property
    def longest_seq(self) -> int:
        """The tokens of the longest sequence: ``seq_len`` for fixed-length batches; with varlen
        ``max_seqlen``, or without it the mean rounded up (the least the longest can be)."""
        if self.max_seqlen is not None:
            return self.max_seqlen
        return -(-self.seq_len * self.batch // self.num_seqs)

    def bucket(self) -> dict:
        """The coarse shape class a tuning-table entry is keyed by.

        ``tokens_per_seq`` is the longest sequence's, not the mean: the scan's serial chain is
        as long as the longest sequence, so one 30,000-token sequence among 20 short ones runs
        like a 30,000-token problem (with the mean, 1,500, it would be keyed and tuned as a
        short one). Fixed-length batches are unchanged (there the longest is ``seq_len``).
        ``head_dim`` is the power of two at or above K: a K of 100 runs padded to 128 (KDA's
        kernels), so it takes 128's measurements."""
        return {
            "dtype": self.dtype,
            "head_dim": _bucket(self.head_dim_k),
            "seqs_x_heads": _bucket(self.num_seqs * self.heads_v),
            "tokens_per_seq": _bucket(self.longest_seq),
        }

    # ``from_options`` (the CLI's key=value options, listed by ``kreg explain --help``): short
    # names, the defaults of the fields that have none, and the fields that default to another
    OPTION_ALIASES: ClassVar[dict[str, str]] = {
        "B": "batch",
        "T": "seq_len",
        "H": "heads_qk",
        "HV": "heads_v",
        "K": "head_dim_k",
        "V": "head_dim_v",
        "lower_bound": "gate_lower_bound",
    }
    OPTION_DEFAULTS: ClassVar[dict[str, int]] = {
        "batch": 1,
        "seq_len": 2048,
        "heads_qk": 32,
        "head_dim_k": 128,
    }
    OPTION_FOLLOWS: ClassVar[dict[str, str]] = {
        "heads_v": "heads_qk",
        "head_dim_v": "head_dim_k",
        "num_seqs": "batch",
    }

    @classmethod
    def from_options(cls, options: dict[str, str]) -> LinearAttentionProblem:
        """Build a problem from ``key=value`` strings (the CLI); short names B, T, H, HV, K, V."""
        fields = attrs.fields_dict(cls)
        values: dict = dict(cls.OPTION_DEFAULTS)
        given: dict[str, str] = {}
        for key, raw in options.items():
            name = cls.OPTION_ALIASES.get(key, key)
            if name not in fields:
                raise ValueError(f"unknown problem option {key!r}; known: {_known(cls)}")
            if name in given:
                raise ValueError(f"{name} given twice ({given[name]} and {key})")
            given[name] = key
            values[name] = _parse(name, raw, fields[name].type)
        for name, source in cls.OPTION_FOLLOWS.items():
            values.setdefault(name, values[source])
        return cls(**values)

    @classmethod
    def matrix_probe(cls):
        """How the support matrix probes this problem type (kreg/problems/probe.py): each dtype
        and head dim at the family's default options, then each option turned on."""
        from .probe import Option, Probe

        def make(family, dtype: str, head_dim: int):
            return family.problem({"K": str(head_dim), "dtype": dtype})

        options = [
            Option("gate activations", act, {"gate_activation": act}
                   | ({"gate_lower_bound": -5.0} if act == "sigmoid_bound" else {}))
            for act in GATE_ACTIVATIONS
        ]  # fmt: skip
        options += [Option("options", f"{gate} gate", {"gate": gate}) for gate in GATE_KINDS]
        options += [
            Option("options", "qk_l2norm", {"qk_l2norm": True}),
            Option("options", "beta_sigmoid", {"beta_sigmoid": True}),
            Option("options", "varlen", {"varlen": True, "num_seqs": 4}),
            Option("options", "unbounded gates", {"gate_lower_bound": None}),
            Option("options", "bounded gates (-5)", {"gate_lower_bound": -5.0}),
        ]
        options += [
            Option("states / layouts", f"initial_state ({sd})",
                   {"initial_state": True, "state_dtype": sd})
            for sd in STATE_DTYPES
        ]  # fmt: skip
        options += [
            Option("states / layouts", "output_final_state", {"output_final_state": True}),
            Option("states / layouts", "output_chunk_states", {"output_chunk_states": True}),
            Option("states / layouts", "state pool (in place)",
                   {"state_pool": True, "initial_state": True, "output_final_state": True}),
        ]  # fmt: skip
        options += [
            Option("states / layouts", f"chunk states ({dt})",
                   {"output_chunk_states": True, "chunk_states_dtype": dt})
            for dt in CHUNK_STATE_DTYPES if dt != "fp32"
        ]  # fmt: skip
        options += [
            Option("states / layouts", f"layout {layout}",
                   {"state_layout": layout, "initial_state": True})
            for layout in STATE_LAYOUTS
        ]  # fmt: skip
        return Probe(DTYPES, make, tuple(options))


def _known(cls) -> str:
    """Every option name, its short forms after it: ``batch (B), ..., seq_len (T), ...``."""
    short: dict[str, list[str]] = {}
    for alias, name in cls.OPTION_ALIASES.items():
        short.setdefault(name, []).append(alias)
    return ", ".join(
        name + (f" ({', '.join(short[name])})" if name in short else "")
        for name in sorted(attrs.fields_dict(cls))
    )


def _parse(name: str, raw, annotation):
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    kind = str(annotation)
    if "bool" in kind:
        if text.lower() in ("1", "true", "yes", "on"):
            return True
        if text.lower() in ("0", "false", "no", "off"):
            return False
        raise ValueError(f"{name} must be true or false, got {raw!r}")
    if "float" in kind:
        if text.lower() in ("none", "unbounded"):
            return None
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name} must be a number, got {raw!r}") from None
    if "int" in kind:
        if "None" in kind and text.lower() == "none":
            return None
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    return text
