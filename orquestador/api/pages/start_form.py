"""The flow page's Start form: fields made from the flow's data schema, read back as a run.

One field per top-level property of the flow's `dataSchema` that a person types in one
box: a text, a number, a checkbox, a select for an `enum`; its `description` is the
field's help. Every other property (objects, lists, anything the schema does not type)
goes in the JSON box, whose object the fields are laid over. The form's POST
(api/pages/actions.py) starts the run through the API's own `start_run`; a refusal shows
the flow page again with what was typed and each problem next to its field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from orquestador.api.problems import ApiProblem
from orquestador.domain.json_text import parse_json

# Beyond these a property goes in the JSON box: a form of a hundred fields helps nobody.
MAX_FIELDS = 30
MAX_TEXT_CHARACTERS = 10_000
# The JSON box's name, and the form-level problems' place.
JSON_BOX = "data"
FORM = ""
# What the JSON box starts with: an object the fields are laid over.
EMPTY_OBJECT = "{}"
FILL_IN = "Fill this in: the flow needs it."


@dataclass(frozen=True)
class StartField:
    """One input of the Start form, as the page shows it."""

    name: str
    kind: str  # text | integer | number | checkbox | select
    required: bool
    help: str | None
    # select: (the option's value as sent, the enum's value it stands for).
    options: tuple[tuple[str, Any], ...] = ()
    value: str = ""
    problem: str | None = None

    @property
    def control_id(self) -> str:
        return f"start-field-{self.name}"

    @property
    def control_name(self) -> str:
        # Apart from the form's own controls (transition, priority, data), whatever the
        # property is called.
        return f"field.{self.name}"


@dataclass(frozen=True)
class StartForm:
    """The Start form as the page shows it: empty, or as typed with its problems."""

    transitions: tuple[str, ...]
    fields: tuple[StartField, ...]
    # Properties of the schema that are typed in the JSON box, not in a field.
    in_json: tuple[str, ...]
    transition: str = ""
    priority: str = ""
    data: str = EMPTY_OBJECT
    # Problems not at one field: by place (the transition, the priority, the JSON box, "").
    problems: dict[str, str] = field(default_factory=dict)


def _kind(schema: Any) -> tuple[str, tuple[tuple[str, Any], ...]] | None:
    """The field a property's schema asks for, with a select's options; None: the JSON box."""
    if not isinstance(schema, dict):
        return None
    enum = schema.get("enum")
    if isinstance(enum, list) and enum and all(isinstance(v, str | int | float) for v in enum):
        # A text is sent as it is; a number as its JSON, which no text option can be.
        sent = [v if isinstance(v, str) else json.dumps(v) for v in enum]
        if len(set(sent)) == len(sent):
            return "select", tuple(zip(sent, enum, strict=True))
    types = schema.get("type")
    if isinstance(types, list):
        types = next((t for t in types if t != "null"), None)
    if types == "string":
        return "text", ()
    if types in ("integer", "number"):
        return types, ()
    if types == "boolean":
        return "checkbox", ()
    return None


def empty_form(definition: dict[str, Any]) -> StartForm:
    """The Start form of a flow: its fields from `dataSchema`, its transitions from the
    initial state."""
    initial = definition.get("initialState")
    transitions = tuple(
        t["id"]
        for t in definition.get("transitions") or []
        if isinstance(t, dict) and initial in (t.get("from") or [])
    )
    schema = definition.get("dataSchema")
    properties = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(properties, dict):
        properties = {}
    required_list = schema.get("required") if isinstance(schema, dict) else None
    required_order = (
        [n for n in required_list if isinstance(n, str)] if isinstance(required_list, list) else []
    )
    required = set(required_order)
    fields: list[StartField] = []
    in_json: list[str] = []
    # The stored schema keeps no order of its own (jsonb): the required properties come
    # first, as the schema lists them, then the others by name.
    listed = [name for name in required_order if name in properties]
    ordered = listed + sorted(name for name in properties if name not in listed)
    for name in ordered:
        property_schema = properties[name]
        kind = _kind(property_schema)
        if kind is None or len(fields) >= MAX_FIELDS:
            in_json.append(name)
            continue
        description = property_schema.get("description")
        fields.append(
            StartField(
                name=name,
                kind=kind[0],
                required=name in required,
                help=description if isinstance(description, str) else None,
                options=kind[1],
            )
        )
    return StartForm(transitions, tuple(fields), tuple(in_json))


def _read_field(start: StartField, form: Any) -> tuple[StartField, Any, bool]:
    """(the field as typed, its value for the data, whether it gives one)."""
    if start.kind == "checkbox":
        checked = form.get(start.control_name) == "on"
        return replace(start, value="on" if checked else ""), checked, True
    typed = form.get(start.control_name, "")
    shown = replace(start, value=typed)
    if typed.strip() == "":
        return replace(shown, problem=FILL_IN if start.required else None), None, False
    if len(typed) > MAX_TEXT_CHARACTERS:
        return replace(shown, problem=f"At most {MAX_TEXT_CHARACTERS} characters."), None, False
    if start.kind == "text":
        return shown, typed, True
    if start.kind == "select":
        chosen = dict(start.options)
        if typed not in chosen:
            return replace(shown, problem="Choose one of the options."), None, False
        return shown, chosen[typed], True
    try:
        number: int | float = int(typed) if start.kind == "integer" else float(typed)
    except ValueError:
        said = "a whole number" if start.kind == "integer" else "a number"
        return replace(shown, problem=f"Type {said}, such as 3."), None, False
    if isinstance(number, float) and not abs(number) < float("inf"):
        return replace(shown, problem="Type a number, such as 3."), None, False
    return shown, number, True


def read_start_form(blank: StartForm, form: Any) -> tuple[StartForm, dict[str, Any] | None]:
    """The form as typed, and the run's body when nothing in it is wrong (else None)."""
    problems: dict[str, str] = {}
    typed_json = form.get(JSON_BOX, "").strip()
    data: Any = {}
    if typed_json:
        try:
            data = parse_json(typed_json)
        except ValueError:
            problems[JSON_BOX] = "This is not valid JSON: give an object, such as {}."
        else:
            if not isinstance(data, dict):
                problems[JSON_BOX] = "Give a JSON object, such as {}."
                data = {}
    fields = []
    for start in blank.fields:
        shown, value, given = _read_field(start, form)
        fields.append(shown)
        if given:
            data[start.name] = value
    transition = form.get("transition", "")
    if transition not in blank.transitions:
        problems["transition"] = "Choose a transition that leaves the initial state."
    priority = form.get("priority", "")
    if priority not in ("", *"0123456789"):
        problems["priority"] = "Choose a priority from 0 to 9, or the flow's default."
    typed = replace(
        blank,
        fields=tuple(fields),
        transition=transition,
        priority=priority,
        data=form.get(JSON_BOX, EMPTY_OBJECT),
        problems=problems,
    )
    if problems or any(f.problem for f in fields):
        return typed, None
    body: dict[str, Any] = {"transition": transition, "data": data}
    if priority:
        body["priority"] = int(priority)
    return typed, body


def with_refusal(typed: StartForm, refused: ApiProblem) -> StartForm:
    """The form as typed, with each of the API's problems next to the field it is about;
    the refusal's own words head the form."""
    names = {start.name for start in typed.fields}
    at_field: dict[str, str] = {}
    elsewhere: dict[str, str] = {FORM: refused.detail}
    for problem in refused.problems or []:
        is_field, place, message = _place(problem.path, problem.message, names)
        (at_field if is_field else elsewhere).setdefault(place, message)
    fields = tuple(
        replace(start, problem=at_field.get(start.name, start.problem)) for start in typed.fields
    )
    return replace(typed, fields=fields, problems={**typed.problems, **elsewhere})


def _place(path: str, message: str, names: set[str]) -> tuple[bool, str, str]:
    """Where a problem of the run's body belongs on the form: (at a field, which place,
    what it says there)."""
    if path in ("/transition", "/priority"):
        return False, path[1:], message
    if path.startswith("/data/"):
        top = path.split("/")[2].replace("~1", "/").replace("~0", "~")
        if top in names:
            return True, top, message
        return False, JSON_BOX, f"{path.removeprefix('/data')}: {message}"
    if path == "/data":
        # "'machineId' is a required property": the field that was left empty.
        quoted = message.split("'")
        if len(quoted) >= 3 and quoted[1] in names:
            return True, quoted[1], FILL_IN
        return False, JSON_BOX, message
    return False, FORM, message
