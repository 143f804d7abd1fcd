"""Problem types shared by families: a family states which one it serves."""

from .linear_attention import LinearAttentionProblem

__all__ = ["LinearAttentionProblem"]
