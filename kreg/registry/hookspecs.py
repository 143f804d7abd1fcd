"""Hook specifications: what a kreg plugin may implement.

Each hook receives a ``register`` callback instead of returning values, so the host validates
every registration as it happens and can name the plugin that made a bad one.

Mark implementations with ``@hookimpl``. As pytest does for ``pytest_*``, the host treats every
``kreg_*`` function of a plugin as a hook: an unmarked one is still called (and reported as a
warning by ``kreg list``), and a ``kreg_*`` name that is not one of these hooks (a typo) makes the
plugin broken, with the closest hook name suggested.
"""

import pluggy

hookspec = pluggy.HookspecMarker("kreg")
hookimpl = pluggy.HookimplMarker("kreg")


@hookspec
def kreg_register_targets(register):
    """Register hardware targets: call ``register(Target)`` once per target.

    Target names are unique across all plugins. Targets are collected before any family, so a
    family may name a target registered by any plugin.
    """


@hookspec
def kreg_register_families(register):
    """Register kernel families: call ``register(Family)`` with the family and its candidates.

    The host rejects a duplicate family or candidate name, a candidate named outside its family's
    dotted namespace, a candidate naming an unknown target, a candidate without builders or a
    validity rule, and a spec type without an enumeration.
    """


@hookspec
def kreg_register_golden_cases(register):
    """Register golden IR cases: call ``register(GoldenCase)`` per (candidate, spec) to pin.

    Case names are unique; the candidate must be registered and the spec valid on every
    target the case covers.
    """


@hookspec
def kreg_register_scenarios(register):
    """Register benchmark scenarios: call ``register(Scenario)``; names are unique."""
