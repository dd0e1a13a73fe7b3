"""Responses tools -> the function tools the model is offered, and back.

- `function` tools are offered as they are.
- `namespace` tools (a named group of function tools, as OpenAI's Codex CLI sends them)
  are flattened: each function inside is offered as `<namespace>__<name>`, the way Codex
  itself spells a namespaced tool when a boundary cannot keep the split (its
  `ToolName::canonical_flat_name`: trailing `_` of the namespace and leading `_` of the
  name trimmed). A call of such a name comes back as a `function_call` with `namespace`
  and the tool's own `name`, which is how Codex (and the SDKs' `namespace` field) route
  it; a namespaced call in the history is flattened again for the model.
- Every other type (`web_search`, `file_search`, `code_interpreter`, `computer_use`,
  `image_generation`, `mcp`, `local_shell`, `custom`, ...) is a tool the API's own
  servers would run, or one whose calls are not JSON: it is left out of what the model
  is offered, never refused.
"""

from __future__ import annotations

from typing import Any

import msgspec

from adapters.inbound.responses import schema as w
from adapters.inbound.responses.validation import invalid_at
from domain.canonical import ToolChoice, ToolSpec
from domain.errors import InvalidRequest

NAMESPACE_DELIMITER = "__"


def flat_name(namespace: str, name: str) -> str:
    """The name a namespaced tool is offered under (Codex's canonical flat name)."""
    return f"{namespace.rstrip('_')}{NAMESPACE_DELIMITER}{name.lstrip('_')}"


class Toolset(msgspec.Struct, kw_only=True):
    """The tools offered to the model, and the namespaced ones by their flat names."""

    specs: list[ToolSpec]
    namespaced: dict[str, tuple[str, str]]  # flat name -> (namespace, name)

    def split(self, offered: str) -> tuple[str, str | None]:
        """(name, namespace) of a tool the model called by its offered name."""
        found = self.namespaced.get(offered)
        return (offered, None) if found is None else (found[1], found[0])

    def join(self, name: str, namespace: str | None) -> str:
        """The offered name of a (name, namespace) call from the history."""
        return name if not namespace else flat_name(namespace, name)


def decode_tools(tools: list[dict[str, Any]] | None) -> Toolset:
    specs: list[ToolSpec] = []
    namespaced: dict[str, tuple[str, str]] = {}
    seen: set[str] = set()
    for i, raw in enumerate(tools or ()):
        kind = raw.get("type")
        if kind == "function":
            tool = _convert(raw, w.FunctionToolParam, f"tools[{i}]")
            _offer(specs, seen, tool.name, tool, f"tools[{i}].name")
        elif kind == "namespace":
            group = _convert(raw, w.NamespaceTool, f"tools[{i}]")
            for j, inner in enumerate(group.tools):
                if inner.get("type") != "function":
                    continue  # not a function: not offered (see the module doc)
                tool = _convert(inner, w.FunctionToolParam, f"tools[{i}].tools[{j}]")
                name = flat_name(group.name, tool.name)
                _offer(specs, seen, name, tool, f"tools[{i}].tools[{j}].name")
                namespaced[name] = (group.name, tool.name)
        elif not isinstance(kind, str):
            raise InvalidRequest(f"Missing required field `tools[{i}].type`.", param=f"tools[{i}].type")
    return Toolset(specs=specs, namespaced=namespaced)


def _offer(specs: list[ToolSpec], seen: set[str], name: str, tool: w.FunctionToolParam, param: str) -> None:
    if name in seen:
        raise InvalidRequest(f"Two tools are offered as `{name}`; tool names must be unique.", param=param)
    seen.add(name)
    specs.append(ToolSpec(name=name, description=tool.description, parameters=tool.parameters or {}))


def decode_tool_choice(
    raw: str | dict[str, Any] | None, parallel: bool | None, tools: Toolset
) -> tuple[ToolChoice | None, list[ToolSpec]]:
    """The canonical choice, and the tools offered under it (`allowed_tools` narrows them)."""
    specs = tools.specs
    if raw is None:
        return (None if parallel is None else ToolChoice(mode="auto", parallel=parallel)), specs
    if isinstance(raw, str):
        if raw not in ("auto", "none", "required"):
            raise InvalidRequest(
                f"`tool_choice` must be 'auto', 'none', 'required' or an object, not {raw[:64]!r}.",
                param="tool_choice",
            )
        return ToolChoice(mode=raw, parallel=parallel), specs  # type: ignore[arg-type]
    kind = raw.get("type")
    if kind == "function":
        named = _convert(raw, w.FunctionChoice, "tool_choice")
        return ToolChoice(mode="named", name=tools.join(named.name, named.namespace), parallel=parallel), specs
    if kind == "allowed_tools":
        allowed = _convert(raw, w.AllowedToolsChoice, "tool_choice")
        names = {tools.join(t.name, t.namespace) for t in allowed.tools if t.type == "function" and t.name}
        return ToolChoice(mode=allowed.mode, parallel=parallel), [s for s in specs if s.name in names]
    raise InvalidRequest(
        f"`tool_choice` of type {str(kind)[:64]!r} asks for a tool this gateway cannot run; "
        "only function tools (also inside a namespace) are offered to the model.",
        param="tool_choice",
    )


def _convert(raw: dict[str, Any], kind: type[Any], at: str) -> Any:
    try:
        return msgspec.convert(raw, kind)
    except msgspec.ValidationError as error:
        raise invalid_at(error, at) from None
