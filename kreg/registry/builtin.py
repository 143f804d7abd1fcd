"""The built-in plugin: kreg's own hardware targets."""

from .hookspecs import hookimpl
from .targets import BUILTIN_TARGETS


@hookimpl
def kreg_register_targets(register):
    for target in BUILTIN_TARGETS:
        register(target)
