"""The plugin host: loads built-in and third-party plugins and validates what they register.

Built-in plugins are registered explicitly and any error in them raises
:class:`RegistrationError`. Third-party plugins come from the ``kreg`` entry-point group; each is
isolated: an import error, an unknown hook, an exception in a hook (any ``BaseException`` but
``KeyboardInterrupt``: ``SystemExit`` from ``sys.exit()`` or an ``argparse`` parse at import
too) or an invalid registration drops everything that plugin registered and is reported in
:attr:`Registry.broken`. While a third-party plugin is imported or its hooks run, what it prints
is captured (so ``kreg list --json`` stays JSON; it is passed on to stderr, or quoted in the
error when the plugin breaks) and ``sys.argv`` is restored afterwards if it changed it.
Functions named like hooks (``kreg_*``) but not marked ``@hookimpl`` are called as hooks, as
pytest does, with an entry in :attr:`Registry.warnings`.

``KREG_PLUGINS`` selects third-party plugins: unset loads all, ``none`` (or empty) loads none, a
comma-separated list loads only the entry points named.
"""

from __future__ import annotations

import contextlib
import difflib
import importlib
import importlib.metadata
import importlib.util
import inspect
import io
import os
import sys
from importlib import resources
from typing import Any

import attrs
import pluggy

from . import hookspecs
from .model import Candidate, Family, GoldenCase, Scenario, Target

ENTRY_POINT_GROUP = "kreg"
FAMILIES_PACKAGE = "kreg.families"
BUILTIN_PREFIX = "builtin:"
# Hooks are called in this order across all plugins: every target exists before any family.
PHASES = (
    ("kreg_register_targets", Target),
    ("kreg_register_families", Family),
    ("kreg_register_golden_cases", GoldenCase),
    ("kreg_register_scenarios", Scenario),
)
_ENV = object()


class RegistrationError(Exception):
    """A plugin failed to load or made an invalid registration; names the plugin."""

    def __init__(self, plugin: str, message: str):
        super().__init__(f"plugin {plugin!r}: {message}")
        self.plugin = plugin
        self.message = message


@attrs.frozen
class PluginInfo:
    """A third-party plugin: its entry point and the distribution that installs it."""

    name: str  # entry point name
    value: str  # entry point value ("module" or "module:object")
    distribution: str | None
    version: str | None

    @property
    def label(self) -> str:
        """``distribution version`` as pytest's header shows plugins (or the entry point)."""
        if self.distribution is None:
            return self.value
        return f"{self.distribution} {self.version or '?'}"


@attrs.frozen
class Registry:
    """Everything registered, by name. Built once per process by :func:`get_registry`."""

    targets: dict[str, Target]
    families: dict[str, Family]
    candidates: dict[str, Candidate]  # by dotted name
    golden_cases: dict[str, GoldenCase]
    scenarios: dict[str, Scenario]
    origin: dict[str, str]  # registered name -> plugin name ("builtin:<module>" or entry point)
    broken: list[tuple[str, str]]  # (plugin name, error) of skipped third-party plugins
    # third-party plugins that loaded, by entry point name (broken ones are in ``broken``)
    plugins: dict[str, PluginInfo] = attrs.field(factory=dict)
    # (plugin name, warning): loaded, but something in it looks wrong (an unmarked hook)
    warnings: list[tuple[str, str]] = attrs.field(factory=list)
    # every discovered third-party plugin, loaded or broken
    discovered: dict[str, PluginInfo] = attrs.field(factory=dict)

    def family_of(self, candidate: Candidate | str) -> Family:
        name = candidate if isinstance(candidate, str) else candidate.name
        return self.families[self.candidates[name].family]

    def candidates_for(self, problem: Any) -> tuple[Candidate, ...]:
        """Candidates of every family whose problem type ``problem`` is an instance of."""
        return tuple(c for c in self.candidates.values() if isinstance(problem, c.problem_type))


# --- the cached registry ------------------------------------------------------------------

_registry: Registry | None = None


def get_registry() -> Registry:
    """The process-wide registry, loaded on first use."""
    global _registry
    if _registry is None:
        _registry = load_registry()
    return _registry


def reset_registry() -> None:
    """Forget the cached registry (tests; after installing a plugin): the next use reloads."""
    global _registry
    _registry = None
    importlib.invalidate_caches()  # entry-point discovery caches per sys.path entry


# --- loading --------------------------------------------------------------------------------

_DEFAULT_IMPL_OPTS = dict(hookspecs.hookimpl(lambda: None).kreg_impl)
HOOK_NAMES = tuple(name for name, _ in PHASES)


class _PluginManager(pluggy.PluginManager):
    """Treats every ``kreg_*`` function as a hook, marked or not (as pytest does for
    ``pytest_*``), so a misspelled hook is always caught by ``check_pending``."""

    def parse_hookimpl_opts(self, plugin, name):
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is None and name.startswith("kreg_"):
            found = inspect.getattr_static(plugin, name, None)
            if inspect.isfunction(found):
                return dict(_DEFAULT_IMPL_OPTS)
        return opts


class _Isolated:
    """Runs one step of a third-party plugin (import, register, a hook) so that nothing it does
    escapes: any BaseException but KeyboardInterrupt is caught into ``error``, what it prints is
    captured, and ``sys.argv`` is put back."""

    def __init__(self):
        self.error: BaseException | None = None
        self.output = ""
        self.argv_changed = False

    def run(self, fn, *args):
        argv = list(sys.argv)
        buffer = io.StringIO()
        result = None
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                result = fn(*args)
        except KeyboardInterrupt:
            raise
        except BaseException as e:  # noqa: BLE001 - SystemExit, GeneratorExit, ... included
            self.error = e
        finally:
            if sys.argv != argv:
                sys.argv[:] = argv
                self.argv_changed = True
            self.output = buffer.getvalue()
        if self.error is None and self.output:
            sys.stderr.write(self.output)  # a plugin's own messages, kept off stdout
        return result

    def describe(self) -> str:
        e = self.error
        if isinstance(e, SystemExit):
            text = f"SystemExit({e.code!r}): the plugin tried to exit the process"
        else:
            text = f"{type(e).__name__}: {e}"
        lines = [line.strip() for line in self.output.splitlines() if line.strip()]
        if lines:
            text += f" (it printed: {lines[-1][:200]})"
        return text


def builtin_plugins() -> tuple[str, ...]:
    """kreg's own plugins: its targets, then the ``plugin`` module of every folder under
    ``kreg/families/`` that has one. Every built-in family is registered this one way (a new
    folder with a ``plugin.py`` is a new family, nothing else to edit); a third party's family
    comes from the ``kreg`` entry-point group instead."""
    folders = resources.files(FAMILIES_PACKAGE)
    families = sorted(f.name for f in folders.iterdir()
                      if f.is_dir() and f.joinpath("plugin.py").is_file())  # fmt: skip
    return ("kreg.registry.builtin",) + tuple(f"{FAMILIES_PACKAGE}.{n}.plugin" for n in families)


def load_registry(plugins: str | Any | None = _ENV, *, builtins=None) -> Registry:
    """Load a fresh registry (uncached). ``plugins`` overrides ``$KREG_PLUGINS``; ``builtins``
    (module names) replaces :func:`builtin_plugins`."""
    if plugins is _ENV:
        plugins = os.environ.get("KREG_PLUGINS")
    pm = _PluginManager("kreg")
    pm.add_hookspecs(hookspecs)
    broken: list[tuple[str, str]] = []
    warnings: list[tuple[str, str]] = []
    loaded: list[str] = []
    discovered: dict[str, PluginInfo] = {}

    for module_name in builtin_plugins() if builtins is None else builtins:
        name = BUILTIN_PREFIX + module_name
        try:
            module = importlib.import_module(module_name)
        except ImportError as e:
            raise RegistrationError(name, f"import failed: {e}") from e
        try:
            warnings += [(name, w) for w in _add_plugin(pm, module, name)]
        except Exception as e:
            raise RegistrationError(name, str(e)) from e
        loaded.append(name)

    def argv_warning(plugin: str, step: _Isolated, what: str) -> None:
        if step.argv_changed:
            warnings.append((plugin, f"{what} changed sys.argv (restored)"))

    for ep in _not_builtin(_entry_points(plugins, broken), broken):
        discovered[ep.name] = _plugin_info(ep)
        step = _Isolated()
        obj = step.run(ep.load)
        argv_warning(ep.name, step, "import")
        if step.error is None:
            found = step.run(_add_plugin, pm, obj, ep.name)
            if step.error is None:
                warnings += [(ep.name, w) for w in found]
        if step.error is not None:
            broken.append((ep.name, step.describe()))
        else:
            loaded.append(ep.name)

    def fail(plugin: str, message: str, cause: BaseException | None = None) -> None:
        if plugin.startswith(BUILTIN_PREFIX):
            raise RegistrationError(plugin, message) from cause
        broken.append((plugin, message))
        loaded.remove(plugin)

    staged = _call_hooks(pm, loaded, fail, argv_warning)
    # A plugin whose registrations fail validation is dropped whole and the rest rebuilt, so
    # nothing depends on a dropped plugin's targets, families or candidates.
    while True:
        try:
            reg = _build([(p, kind, obj) for p in loaded for kind, obj in staged[p]], broken)
        except RegistrationError as e:
            fail(e.plugin, e.message, e)
            continue
        reg.plugins.update({p: discovered[p] for p in loaded if p in discovered})
        reg.discovered.update(discovered)
        dropped = {p for p, _ in broken}
        reg.warnings.extend((p, w) for p, w in warnings if p not in dropped)
        return reg


def _plugin_info(ep: importlib.metadata.EntryPoint) -> PluginInfo:
    dist = getattr(ep, "dist", None)
    try:
        name = dist.metadata["Name"] if dist is not None else None
        version = dist.version if dist is not None else None
    except Exception:  # a distribution with broken metadata still names its entry point
        name = version = None
    return PluginInfo(ep.name, ep.value, name, version)


def _add_plugin(pm: pluggy.PluginManager, plugin: Any, name: str) -> list[str]:
    """Register ``plugin``; returns warnings about hook-like names it does not implement."""
    pm.register(plugin, name=name)
    try:
        pm.check_pending()  # an unknown (misspelled) hook is an error
    except pluggy.PluginValidationError as e:
        pm.unregister(name=name)
        unknown = [
            n
            for n in dir(plugin)
            if n not in HOOK_NAMES
            and (
                n.startswith("kreg_")
                or hasattr(inspect.getattr_static(plugin, n, None), "kreg_impl")
            )
        ]
        hints = [
            f"{n!r} is not a kreg hook; did you mean {close[0]!r}?"
            for n in unknown
            if (close := difflib.get_close_matches(n, HOOK_NAMES, n=1))
        ]
        raise pluggy.PluginValidationError(
            e.plugin, " ".join([str(e), *hints, f"(kreg hooks: {', '.join(HOOK_NAMES)})"])
        ) from e
    return _hook_warnings(plugin)


def _hook_warnings(plugin: Any) -> list[str]:
    """Names that look like kreg hooks but are not called, or are called without a marker."""
    out = []
    for attr in dir(plugin):
        if not attr.lower().startswith("kreg_"):
            continue
        found = inspect.getattr_static(plugin, attr, None)
        if attr.startswith("kreg_") and inspect.isfunction(found):
            if not hasattr(found, "kreg_impl"):
                out.append(f"{attr} is not marked @hookimpl (called as a hook anyway)")
        elif attr.lower() in HOOK_NAMES and attr not in HOOK_NAMES:
            out.append(f"{attr}: hook names are lower case ({attr.lower()}): ignored")
        elif callable(found) and not inspect.isclass(found):
            what = type(found).__name__
            out.append(f"{attr} looks like a kreg hook but is a {what}, not a function: ignored")
    return out


def _entry_points(allow: str | None, broken: list) -> list[importlib.metadata.EntryPoint]:
    eps = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    if allow is None:
        return eps
    names = [n.strip() for n in allow.split(",") if n.strip()]
    if names in ([], ["none"]):
        return []
    known = {ep.name for ep in eps}
    for name in names:
        if name not in known:
            broken.append((name, f"named in KREG_PLUGINS but no entry point {name!r} is installed"))
    return [ep for ep in eps if ep.name in names]


def _not_builtin(eps: list, broken: list) -> list:
    """Entry points named like a built-in (``builtin:...``) would run unisolated: refused."""
    out = []
    for ep in eps:
        if ep.name.startswith(BUILTIN_PREFIX):
            broken.append((ep.name, f"entry point names may not start with {BUILTIN_PREFIX!r} "
                                    "(reserved for kreg's own plugins)"))  # fmt: skip
        else:
            out.append(ep)
    return out


def _call_hooks(pm, loaded: list[str], fail, argv_warning) -> dict[str, list[tuple[type, Any]]]:
    """Call each hook plugin by plugin, in PHASES order, staging what each registers."""
    staged: dict[str, list[tuple[type, Any]]] = {p: [] for p in loaded}
    for hook_name, kind in PHASES:
        impls = getattr(pm.hook, hook_name).get_hookimpls()
        for plugin in list(loaded):
            items = staged[plugin]

            def register(obj, _items=items, _kind=kind):
                _items.append((_kind, obj))

            for impl in impls:
                if impl.plugin_name != plugin or plugin not in loaded:
                    continue
                args = [register for _ in impl.argnames]
                if plugin.startswith(BUILTIN_PREFIX):
                    try:
                        impl.function(*args)
                    except Exception as e:
                        fail(plugin, f"{hook_name} raised {type(e).__name__}: {e}", e)
                    continue
                step = _Isolated()
                step.run(impl.function, *args)
                argv_warning(plugin, step, hook_name)
                if step.error is not None:
                    fail(plugin, f"{hook_name} raised {step.describe()}", step.error)
    return staged


def _build(staged: list[tuple[str, type, Any]], broken: list) -> Registry:
    """Validate staged registrations into a Registry; RegistrationError names the plugin."""
    reg = Registry({}, {}, {}, {}, {}, {}, broken)
    for _, kind in PHASES:
        for plugin, item_kind, obj in staged:
            if item_kind is kind:
                try:
                    _check(reg, plugin, kind, obj)
                except RegistrationError:
                    raise
                except Exception as e:  # a malformed object: its fields are not what they say
                    message = f"invalid {kind.__name__} registration: {type(e).__name__}: {e}"
                    raise RegistrationError(plugin, message) from e
    return reg


def _check(reg: Registry, plugin: str, kind: type, obj: Any) -> None:
    def bad(message: str) -> None:
        raise RegistrationError(plugin, message)

    def claim(table: dict, what: str, name: str, value: Any) -> None:
        _plain_str(name, f"{what} name", bad)
        if name in table:
            bad(f"duplicate {what} {name!r} (already registered by {reg.origin[name]!r})")
        if reg.origin.get(name, plugin) != plugin:  # one name, one owner, whatever its kind
            bad(f"{what} {name!r}: the name is already registered by {reg.origin[name]!r}")
        table[name] = value
        reg.origin[name] = plugin

    if not isinstance(obj, kind):
        bad(f"registered {type(obj).__name__} {obj!r:.60} where a {kind.__name__} was expected")
    if kind is Target:
        _check_target(obj, bad)
        claim(reg.targets, "target", obj.name, obj)
    elif kind is Family:
        if not inspect.isclass(obj.problem_type):
            bad(f"family {obj.name!r}: problem_type {obj.problem_type!r:.60} is not a class")
        if type(obj.data) is not str or obj.data:  # read at selection: the package must exist
            _plain_str(obj.data, f"family {obj.name!r}: data", bad)
            if not _is_package(obj.data):
                bad(f"family {obj.name!r}: data {obj.data!r} is not an importable package "
                    f"(the package holding its tuning.json and *_model.json)")  # fmt: skip
        for c in obj.candidates:
            _check_candidate(reg, obj, c, bad)
        claim(reg.families, "family", obj.name, obj)
        for c in obj.candidates:
            claim(reg.candidates, "candidate", c.name, c)
    elif kind is GoldenCase:
        _plain_str(obj.candidate, f"golden case {obj.name!r}: candidate", bad)
        if obj.candidate not in reg.candidates:
            bad(f"golden case {obj.name!r} names unknown candidate {obj.candidate!r}")
        # the golden file's keys must stay distinct on case-insensitive file systems and reviews
        twin = next((n for n in reg.golden_cases if n.lower() == str(obj.name).lower()), None)
        if twin is not None and twin != obj.name:
            bad(f"golden case {obj.name!r} differs from {twin!r} (by "
                f"{reg.origin[twin]!r}) only in letter case")  # fmt: skip
        unknown = sorted(set(obj.targets or ()) - set(reg.targets))
        if unknown:
            bad(f"golden case {obj.name!r} names unknown targets {unknown}")
        claim(reg.golden_cases, "golden case", obj.name, obj)
    else:
        _plain_str(obj.family, f"scenario {obj.name!r}: family", bad)
        if obj.family not in reg.families:
            bad(f"scenario {obj.name!r} names unknown family {obj.family!r}")
        claim(reg.scenarios, "scenario", obj.name, obj)


def _is_package(name: str) -> bool:
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):  # a missing parent, or a relative or empty name
        return False
    return spec is not None and spec.submodule_search_locations is not None


def _plain_str(value: Any, what: str, bad) -> None:
    """Names are compared and hashed by the registry and the dispatcher: a ``str`` subclass
    could answer ``==`` as it likes (and match every family), so only ``str`` itself passes."""
    if type(value) is not str or not value:
        bad(f"{what} must be a non-empty str, got {type(value).__name__} {value!r:.60}")


def _check_target(t: Target, bad) -> None:
    ints = ("warp_size", "compute_units", "shared_mem_per_unit", "shared_mem_per_block",
            "registers_per_unit", "max_registers_per_thread")  # fmt: skip
    for field in ints:
        value = getattr(t, field)
        if type(value) is not int or value <= 0:
            bad(f"target {t.name!r}: {field} must be a positive int, got {value!r:.60}")
    if not all(type(d) is str for d in t.devices):
        bad(f"target {t.name!r}: devices must be strings, got {t.devices!r:.80}")


def _check_candidate(reg: Registry, family: Family, c: Any, bad) -> None:
    if not isinstance(c, Candidate):
        bad(f"family {family.name!r} lists {type(c).__name__} {c!r:.60}, not a Candidate")
    _plain_str(c.name, "candidate name", bad)
    _plain_str(c.family, f"candidate {c.name!r}: family", bad)
    if c.problem_type is not family.problem_type:
        bad(f"candidate {c.name!r} serves {c.problem_type!r:.60}, its family "
            f"{family.name!r} {family.problem_type!r:.60}")  # fmt: skip
    if type(c.priority) is not int:
        bad(f"candidate {c.name!r}: priority must be an int, got {c.priority!r:.60}")
    if not all(inspect.isclass(t) for t in c.spec_types):
        bad(f"candidate {c.name!r}: spec_types must be classes, got {c.spec_types!r:.80}")
    if c.targets is not None and not all(type(t) is str for t in c.targets):
        bad(f"candidate {c.name!r}: targets must be target names, got {c.targets!r:.80}")
    prefix, _, short = c.name.partition(".")
    if prefix != family.name or not short:
        bad(f"candidate {c.name!r} must be named '{family.name}.<name>'")
    if c.family != family.name:
        bad(f"candidate {c.name!r} says family {c.family!r} but is listed by {family.name!r}")
    unknown = sorted(set(c.targets or ()) - set(reg.targets))
    if unknown:
        bad(f"candidate {c.name!r} names unknown targets {unknown}")
    if not c.builders or not all(callable(b) for b in c.builders.values()):
        bad(f"candidate {c.name!r} has no builders (or a builder that is not callable)")
    if not callable(c.is_valid):
        bad(f"candidate {c.name!r} has no callable is_valid")
    if c.predict is not None and not callable(c.predict):
        bad(f"candidate {c.name!r}: predict must be callable or None")
    if not c.spec_types or not callable(c.enumerate_specs):
        bad(f"candidate {c.name!r}: spec type without an enumeration")
