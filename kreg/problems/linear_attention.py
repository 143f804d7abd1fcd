"""The request shape of linear-attention prefill (KDA and any future linear-attention family).

Linear attention has no SDPA request shape (no softmax, a recurrent state instead of a KV cache),
so it gets its own problem type. Every field is validated when the problem is constructed.
"""

from __future__ import annotations

import math

import attrs

DTYPES = ("bf16", "fp16", "fp32")
GATE_KINDS = ("per_channel", "scalar")
GATE_ACTIVATIONS = ("none", "sigmoid_bound", "softplus")
STATE_LAYOUTS = ("kv", "vk")
STATE_DTYPES = ("fp32", "bf16")


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


def _bound(instance, attribute, value):
    if value is None:
        return
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value >= 0:
        raise ValueError(
            f"{attribute.name} must be a finite negative number or None, got {value!r}"
        )


def _bucket(n: int) -> int:
    """Power-of-two bucket, so tuning entries cover shape ranges rather than exact shapes."""
    return 1 << max(0, (n - 1).bit_length())


@attrs.frozen
class LinearAttentionProblem:
    """One linear-attention prefill call, as a dispatcher sees it (shapes and options, no data).

    ``batch`` rows of ``seq_len`` tokens; with ``varlen`` the batch is one packed row of
    ``seq_len`` tokens holding ``num_seqs`` sequences (``cu_seqlens``).
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
    gate_lower_bound: float | None = attrs.field(default=None, validator=_bound)
    gate_activation: str = attrs.field(default="none", validator=_one_of(GATE_ACTIVATIONS))
    qk_l2norm: bool = attrs.field(default=False, validator=_bool)
    beta_sigmoid: bool = attrs.field(default=False, validator=_bool)
    initial_state: bool = attrs.field(default=False, validator=_bool)
    state_dtype: str = attrs.field(default="fp32", validator=_one_of(STATE_DTYPES))
    output_final_state: bool = attrs.field(default=False, validator=_bool)
    state_layout: str = attrs.field(default="kv", validator=_one_of(STATE_LAYOUTS))
    output_chunk_states: bool = attrs.field(default=False, validator=_bool)
    varlen: bool = attrs.field(default=False, validator=_bool)
    num_seqs: int | None = None  # defaults to batch; the sequence count with varlen

    def __attrs_post_init__(self):
        if self.gate_activation == "sigmoid_bound" and self.gate_lower_bound is None:
            raise ValueError("gate_lower_bound must be given with gate_activation='sigmoid_bound'")
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
        if self.gate_activation == "softplus" and self.gate_lower_bound is not None:
            raise ValueError("gate_lower_bound must be None with gate_activation='softplus'")
        if self.gate_activation == "sigmoid_bound" and self.gate_lower_bound is None:
            raise ValueError("gate_lower_bound is required with gate_activation='sigmoid_bound'")

    @property
    def group_size(self) -> int:
        return self.heads_v // self.heads_qk

    def bucket(self) -> dict:
        """The coarse shape class a tuning-table entry is keyed by."""
        return {
            "dtype": self.dtype,
            "head_dim": self.head_dim_k,
            "seqs_x_heads": _bucket(self.num_seqs * self.heads_v),
            "tokens_per_seq": _bucket(max(1, self.seq_len * self.batch // self.num_seqs)),
        }

    @classmethod
    def from_options(cls, options: dict[str, str]) -> LinearAttentionProblem:
        """Build a problem from ``key=value`` strings (the CLI); short names B, T, H, HV, K, V."""
        aliases = {
            "B": "batch",
            "T": "seq_len",
            "H": "heads_qk",
            "HV": "heads_v",
            "K": "head_dim_k",
            "V": "head_dim_v",
            "lower_bound": "gate_lower_bound",
        }
        fields = attrs.fields_dict(cls)
        values: dict = {"batch": 1, "seq_len": 2048, "heads_qk": 32, "head_dim_k": 128}
        for key, raw in options.items():
            name = aliases.get(key, key)
            if name not in fields:
                raise ValueError(f"unknown problem option {key!r}; known: {sorted(fields)}")
            values[name] = _parse(name, raw, fields[name].type)
        values.setdefault("heads_v", values["heads_qk"])
        values.setdefault("head_dim_v", values["head_dim_k"])
        return cls(**values)


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
        try:
            return int(text)
        except ValueError:
            raise ValueError(f"{name} must be an integer, got {raw!r}") from None
    return text
