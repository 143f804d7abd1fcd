"""testfam's kreg plugin (entry point ``testfam = kreg_testfam.plugin``)."""

from kreg.registry import GoldenCase, Scenario, hookimpl

from .family import FAMILY, Tile, VecSpec


@hookimpl
def kreg_register_families(register):
    register(FAMILY)


@hookimpl
def kreg_register_golden_cases(register):
    register(
        GoldenCase(
            name="testfam_simple_b256", candidate="testfam.simple", spec=VecSpec(Tile(256, 4))
        )
    )


@hookimpl
def kreg_register_scenarios(register):
    register(
        Scenario(
            name="testfam.sweep",
            family="testfam",
            description="n sweep",
            cases=lambda: [],
            run=lambda cases, **kw: [],
        )
    )
