"""kreg's registry: value types, hook specifications and the plugin host."""

from .hookspecs import hookimpl
from .manager import (
    RegistrationError,
    Registry,
    get_registry,
    load_registry,
    reset_registry,
)
from .model import (
    ACCEPT,
    Artifact,
    Candidate,
    Family,
    GoldenCase,
    Prediction,
    Scenario,
    Target,
    Verdict,
)

__all__ = [
    "ACCEPT",
    "Artifact",
    "Candidate",
    "Family",
    "GoldenCase",
    "Prediction",
    "RegistrationError",
    "Registry",
    "Scenario",
    "Target",
    "Verdict",
    "get_registry",
    "hookimpl",
    "load_registry",
    "reset_registry",
]
