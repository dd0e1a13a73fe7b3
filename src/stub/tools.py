"""Tool calls of the stub upstream: which tool a chat request calls, and with what arguments.

A call happens only when a request asks for it (``pick_tool``): ``tool_choice`` forces one,
or the last user message begins "use <name>". Its arguments are made up by
``tool_arguments``: a value of the tool's parameters schema (``example_value``), so a schema
that is not an object schema gives arguments that are JSON but not an object
(``{"const": 4120000000000.0}`` gives ``4120000000000.0``, what vLLM 0.32 answered a named
``tool_choice`` with), and ``"x-stub-arguments": TEXT`` in the schema gives TEXT verbatim
(text that is not JSON at all, or ``""``). A stream sends them in 2-3 fragments
(``split_arguments``), as vLLM streams a call's arguments over several chunks.
"""

from __future__ import annotations

import itertools
from typing import Any

from stub.schema import ChatRequest, NamedChoice, Tool, encode, message_texts


def example_value(schema: Any, depth: int = 0) -> Any:
    """A value valid for a (simple) JSON schema: string "x", integer 1, enum's first, ..."""
    if not isinstance(schema, dict) or depth > 16:
        return "x"
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return schema["enum"][0]
    for key in ("anyOf", "oneOf", "allOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return example_value(schema[key][0], depth + 1)
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind is None and "properties" in schema:
        kind = "object"
    if kind == "object":
        props = schema.get("properties")
        props = props if isinstance(props, dict) else {}
        value = {name: example_value(sub, depth + 1) for name, sub in props.items()}
        for name in schema.get("required") or ():
            value.setdefault(name, "x")
        return value
    scalars = {"integer": 1, "number": 1.5, "boolean": True, "array": [], "null": None}
    return scalars.get(kind, "x") if isinstance(kind, str) else "x"


STUB_ARGUMENTS = "x-stub-arguments"  # a schema key: the call's arguments, verbatim


def tool_arguments(parameters: dict[str, Any] | None) -> str:
    """The arguments text of a call of a tool with these parameters (see the module doc)."""
    schema = parameters or {}
    verbatim = schema.get(STUB_ARGUMENTS)
    if isinstance(verbatim, str):
        return verbatim
    return encode(example_value(schema)).decode()


def _begins_with_use(text: str, name: str) -> bool:
    """True for "use <name>" at the very start (after blanks), name followed by a non-name char."""
    text = text.lstrip()
    if text[:4].lower() != "use " or not text[4:].startswith(name):
        return False
    rest = text[4 + len(name) : 5 + len(name)]
    return not rest or not (rest.isalnum() or rest in "_-.")


def pick_tool(req: ChatRequest) -> Tool | None:
    """The tool to call: forced by tool_choice, or named by a last user message "use <name>".

    Only this explicit form triggers a call: real prompts mention tool names all the time,
    and an agent client would loop if any mention produced a call. Raises ValueError (400).
    """
    choice = req.tool_choice
    if isinstance(choice, str) and choice not in ("none", "auto", "required"):
        raise ValueError(f"Invalid `tool_choice` value: {choice!r}.")
    if not req.tools:
        if choice not in (None, "none", "auto"):
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        return None
    if choice == "required":
        return req.tools[0]
    if isinstance(choice, NamedChoice):
        for tool in req.tools:
            if tool.function.name == choice.function.name:
                return tool
        raise ValueError(f"Tool {choice.function.name!r} in `tool_choice` is not in `tools`.")
    if choice == "none" or not req.messages or req.messages[-1].role != "user":
        return None
    texts = message_texts(req.messages[-1:])
    by_length = sorted(req.tools, key=lambda t: len(t.function.name), reverse=True)
    for text in texts:
        for tool in by_length:
            if tool.function.name and _begins_with_use(text, tool.function.name):
                return tool
    return None


def split_arguments(arguments: str) -> list[str]:
    """Arguments JSON in 2-3 non-empty fragments, as a streaming tool parser emits them."""
    n = len(arguments)
    cuts = [0, n // 3, 2 * n // 3, n]
    return [arguments[a:b] for a, b in itertools.pairwise(cuts) if b > a]
