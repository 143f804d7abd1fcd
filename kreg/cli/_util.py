"""Helpers shared by the subcommands: name lookup, key=value options, specs, tables, JSON."""

from __future__ import annotations

import enum
import json
import typing
from typing import Any

import attrs

from kreg.dispatch.words import spec_choice_in_words  # noqa: F401
from kreg.registry.model import short_repr  # noqa: F401  (the CLI's reprs)
from kreg.text import WIDTH, table, wrap  # noqa: F401  (the CLI's text helpers)


class CliError(Exception):
    """A user mistake: reported as one ``kreg: error:`` line, exit status 2."""


def registry():
    from kreg.registry import get_registry

    return get_registry()


def repository_registry(args):
    """(registry, $KREG_PLUGINS for compile workers) whose families the repository files of a
    command hold. kreg's own files (no ``--root`` / ``--file``) describe kreg's built-in
    families only, whatever plugins are installed beside it (an installed plugin never makes
    kreg's checks stale); files of one's own describe every family installed."""
    import os

    if getattr(args, "root", None) is None and getattr(args, "file", None) is None:
        from kreg.registry.manager import load_registry

        return load_registry("none"), "none"
    return registry(), os.environ.get("KREG_PLUGINS")


def get_target(name: str, targets=None):
    """The target ``name`` of ``targets`` (default: the registry's), or a CliError saying why."""
    from kreg.registry.targets import resolve

    try:
        return resolve(registry().targets if targets is None else targets, name)
    except ValueError as e:
        raise CliError(str(e)) from None


def get_family(name: str):
    families = registry().families
    if name not in families:
        raise CliError(f"unknown family {name!r}; known: {', '.join(families) or '(none)'}")
    return families[name]


def parse_assignments(items: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items or ():
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise CliError(f"bad {what} {item!r}: expected key=value")
        if key.strip() in out:
            raise CliError(f"{what} {key.strip()!r} given twice")
        out[key.strip()] = value.strip()
    return out


def problem_from_options(family, options: dict[str, str]):
    """The family's problem built by its problem type's ``from_options`` classmethod."""
    problem_type = family.problem_type
    if not hasattr(problem_type, "from_options"):
        raise CliError(f"family {family.name!r}: {problem_type.__name__} has no from_options()")
    try:
        return family.problem(options)
    except (ValueError, TypeError, KeyError) as e:
        raise CliError(f"bad problem options for {family.name}: {e}") from e


def problem_options_help() -> str:
    """Every family's ``key=value`` problem options with their short forms and defaults (the
    epilog of ``explain --help`` and ``build --help``), read from the problem type:
    ``OPTION_ALIASES`` (short form -> field), ``OPTION_DEFAULTS`` and ``OPTION_FOLLOWS`` (field
    -> the field it defaults to) where it has them, then its attrs defaults; a family's own
    ``default_options`` come first."""
    parts = ["problem options, key=value (or its short form):"]
    for family in registry().families.values():
        cls = family.problem_type
        if not attrs.has(cls):
            parts.append(f"  {family.name}: {cls.__name__} (see its from_options)")
            continue
        short: dict[str, list[str]] = {}
        for alias, name in getattr(cls, "OPTION_ALIASES", {}).items():
            short.setdefault(name, []).append(alias)
        own = dict(family.default_options)
        defaults = getattr(cls, "OPTION_DEFAULTS", {})
        follows = getattr(cls, "OPTION_FOLLOWS", {})
        rows = []
        for name, field in attrs.fields_dict(cls).items():
            if name in own:
                default = own[name]
            elif name in follows:
                default = f"same as {follows[name]}"
            elif name in defaults:
                default = _option_text(defaults[name])
            elif field.default is not attrs.NOTHING:
                default = _option_text(field.default)
            else:
                default = "(required)"
            rows.append([name, ", ".join(short.get(name, [])), default])
        parts.append(f"  {family.name} ({cls.__name__})")
        parts.append(table(rows, ["option", "short", "default"], "    "))
    return "\n".join(parts)


def _option_text(value: Any) -> str:
    return (
        "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    )


def override_spec(spec: Any, assignments: dict[str, str]) -> Any:
    """``spec`` with fields replaced (``tile.chunk=32`` for nested specs), values converted to
    the type of the field's current value."""
    for path, text in assignments.items():
        spec = _set(spec, path.split("."), text, path)
    return spec


def _set(obj: Any, parts: list[str], text: str, path: str) -> Any:
    if not attrs.has(type(obj)):
        raise CliError(f"spec field {path!r}: {type(obj).__name__} has no fields")
    fields = attrs.fields_dict(type(obj))
    if parts[0] not in fields:
        raise CliError(
            f"unknown spec field {path!r}; {type(obj).__name__} has: {', '.join(fields)}"
        )
    current = getattr(obj, parts[0])
    if parts[1:]:
        value = _set(current, parts[1:], text, path)
    else:
        value = _convert(current, text, path, _allows_none(type(obj), fields[parts[0]], current))
    try:
        return attrs.evolve(obj, **{parts[0]: value})
    except (ValueError, TypeError) as e:
        raise CliError(f"bad value {text!r} for spec field {path!r}: {e}") from e


def _allows_none(cls: type, field: attrs.Attribute, current: Any) -> bool:
    """Whether the field's annotation admits None (``int | None``, ``Optional[int]``, ``Any``)."""
    if current is None:
        return True
    try:
        hint = typing.get_type_hints(cls).get(field.name, field.type)
    except Exception:  # an annotation that does not resolve here: read its text
        hint = field.type
    if isinstance(hint, str):
        return any(word in hint for word in ("None", "Optional", "Any"))
    if hint is Any or hint is type(None):
        return True
    return type(None) in typing.get_args(hint)


def _convert(current: Any, text: str, path: str, allows_none: bool = True) -> Any:
    if attrs.has(type(current)):
        raise CliError(f"spec field {path!r} is a {type(current).__name__}: set {path}.<field>")
    kind = type(current)
    try:
        if text.lower() == "none" and not isinstance(current, str):
            if not allows_none:
                raise CliError(f"bad value {text!r} for spec field {path!r}: takes {kind.__name__}, "
                               "not None")  # fmt: skip
            return None
        if isinstance(current, bool):
            flags = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}
            return flags[text.lower()]
        if isinstance(current, enum.Enum):
            return kind[text] if text in kind.__members__ else kind(type(current.value)(text))
        if isinstance(current, tuple):
            element = current[0] if current else ""
            return tuple(_convert(element, x.strip(), path) for x in text.split(",") if x.strip())
        if current is None:
            for parse in (int, float):
                try:
                    return parse(text)
                except ValueError:
                    pass
            return text
        return kind(text)
    except (ValueError, KeyError, TypeError) as e:
        raise CliError(f"bad value {text!r} for spec field {path!r} ({kind.__name__})") from e


def check_spec(candidate, spec, target, overrides: list[str] | None = None) -> None:
    """Run the candidate's validity rules on ``spec``; a failing rule, or a rule that raises on
    the values given (``solve_block=0`` dividing by zero), is a user error naming the reason."""
    given = f" (with --spec {' '.join(overrides)})" if overrides else ""
    try:
        verdict = candidate.is_valid(spec, target)
    except Exception as e:
        raise CliError(
            f"{candidate.name}: spec{given} is not valid on {target.name}: its validity rules "
            f"fail on these values ({type(e).__name__}: {e}); spec: {short_repr(spec)}"
        ) from e
    if not verdict.ok:
        raise CliError(
            f"{short_repr(spec)} is not valid on {target.name}: {'; '.join(verdict.reasons)}"
        )


def jsonable(obj: Any) -> Any:
    if attrs.has(type(obj)):
        return attrs.asdict(obj, value_serializer=lambda _i, _f, v: jsonable_leaf(v))
    return jsonable_leaf(obj)


def jsonable_leaf(v: Any) -> Any:
    if isinstance(v, enum.Enum):
        return v.value
    if isinstance(v, type):
        return v.__name__
    return v


def dump_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=str)
