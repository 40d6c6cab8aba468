"""The shared schema base and the one place a validation error becomes an `AdapterError`.

Schemas validate only: the adapters keep converting the caller's own dict, so fields a schema does
not name reach them unchanged. Types are strict (no "1" for 1, no true for 1); null counts as absent,
as it does in every adapter.
"""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, Discriminator, Tag, ValidationError
from pydantic_core import ErrorDetails
from tracetap.capture.adapters.base import AdapterError
from tracetap.capture.json_body import BodyError, check_depth

# pydantic error type -> what the field should have been
_EXPECTED = {
    "string_type": "a string", "int_type": "an integer", "float_type": "a number",
    "bool_type": "a boolean", "list_type": "an array", "dict_type": "an object", "model_type": "an object",
    "model_attributes_type": "an object",
}
_JSON_TYPES = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}


class Lenient(BaseModel):
    """A strictly typed view of a JSON object that allows (and ignores) fields it does not name."""

    model_config = ConfigDict(strict=True, extra="allow", populate_by_name=True)


class Other(Lenient):
    """An object of a `type` its schema does not describe: the adapter drops or rejects it by name."""

    type: str


def by_type(models: dict[str, type[BaseModel]], role_default: str | None = None) -> Any:
    """A union of models picked by the value's `type`; every other type validates as `Other`.

    `role_default` is the type of an object with a `role` and no `type` (a Responses message item).
    """
    def tag(value: object) -> str:
        if not isinstance(value, dict):
            return "other"
        kind = value.get("type") or (role_default if "role" in value else None)
        return f"type={kind}" if isinstance(kind, str) and kind in models else "other"

    members = [Annotated[model, Tag(f"type={kind}")] for kind, model in models.items()]
    return Annotated[Union[(*members, Annotated[Other, Tag("other")])], Discriminator(tag)]  # noqa: UP007


def validate(schema: type[BaseModel], body: object) -> None:
    """Raises AdapterError (a 400) when `body` is not an object, nests too deep, or breaks `schema`."""
    if not isinstance(body, dict):
        raise AdapterError("request body must be a JSON object")
    try:
        check_depth(body)
        schema.model_validate(body)
    except BodyError as exc:
        raise AdapterError(str(exc)) from None
    except ValidationError as exc:
        raise AdapterError(describe(exc, body)) from None


def describe(error: ValidationError, body: object) -> str:
    """The deepest failing field of `body` and what it should be; union alternatives are merged."""
    located = [(_input_path(e["loc"], body, e["type"] == "missing"), e) for e in error.errors(include_url=False)]
    path = max((where for where, _ in located), key=len)
    found = [e for where, e in located if where == path]
    name = ".".join(str(step) for step in path) or "request body"
    return f"{name}: {_problem(found)}"


def _input_path(loc: tuple, body: object, missing: bool) -> tuple:
    """The steps of `loc` that index the body itself (pydantic also names union alternatives);
    for a missing field, its name too."""
    path, node = [], body
    for step in loc:
        if isinstance(node, dict) and step in node:
            node = node[step]
        elif isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
            node = node[step]
        elif missing and isinstance(node, dict) and step == loc[-1]:
            node = None
        else:
            continue
        path.append(step)
    return tuple(path)


def _problem(errors: list[ErrorDetails]) -> str:
    value = errors[0].get("input")
    if value is None or errors[0]["type"] == "missing":
        return "field required"
    if errors[0]["type"] == "too_short":
        return f"expected at least {errors[0]['ctx']['min_length']} item(s), got none"
    if errors[0]["type"] == "literal_error":
        shown = repr(value[:40]) if isinstance(value, str) else _json_type(value)
        return f"expected {errors[0]['ctx']['expected']}, got {shown}"
    wanted = list(dict.fromkeys(_EXPECTED[e["type"]] for e in errors if e["type"] in _EXPECTED))
    if not wanted:
        return errors[0]["msg"]
    return f"expected {' or '.join(wanted)}, got {_json_type(value)}"


def _json_type(value: object) -> str:
    return _JSON_TYPES.get(type(value), type(value).__name__)
