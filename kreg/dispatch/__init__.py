"""Dispatch: choose the candidate and spec that serve a problem on a target, with a trace."""

from .ranker import TuningWarning
from .selector import NoCandidateError, Selection, TraceEntry, clear_cache, select

__all__ = ["NoCandidateError", "Selection", "TraceEntry", "TuningWarning", "clear_cache", "select"]
