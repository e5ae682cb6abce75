"""Tool calls in Qwen's output, both forms its templates use, each wrapped in ``<tool_call>...</tool_call>``:

    <tool_call>                                    <tool_call>
    {"name": "f", "arguments": {"x": 1}}           <function=f>
    </tool_call>                                   <parameter=x>
                                                   1
                                                   </parameter>
                                                   </function>
                                                   </tool_call>

:class:`ToolCallParser` reads the generated text piece by piece: text outside the tags streams through as content
at once (less a possible partial ``<tool_call>`` tag at the end), and each call is emitted as soon as its closing
tag arrives. A call that does not parse (bad JSON, no function name, an unknown tool when the request listed its
tools, no closing tag by the end of the output) is returned as the text it was, never dropped or raised.
XML parameter values become JSON by the tool's schema: a ``string`` parameter stays text, others are read as JSON
where they parse (numbers, booleans, objects) and kept as text where they do not.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from .think import partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's tool_calls carry it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    @property
    def input(self) -> dict:
        return json.loads(self.arguments)


def _schema_types(tools) -> dict[str, dict[str, str]]:
    """tool name -> {parameter: JSON schema type} from OpenAI-style tool dicts (malformed schemas give no types)."""
    out = {}
    for tool in tools or ():
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        schema = fn.get("parameters") or fn.get("input_schema") if isinstance(fn, dict) else None
        props = schema.get("properties") if isinstance(schema, dict) else None
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            out[fn["name"]] = {k: (v.get("type") if isinstance(v, dict) else None)
                               for k, v in (props.items() if isinstance(props, dict) else ())}
    return out


def _xml_value(raw: str, kind) -> object:
    value = raw[1:] if raw.startswith("\n") else raw
    value = value[:-1] if value.endswith("\n") else value
    if kind == "string":
        return value
    try:
        return json.loads(value)
    except ValueError:
        return value


def parse_call(body: str, tools=None) -> ParsedToolCall | None:
    """The call in one ``<tool_call>`` body, or None when it does not parse."""
    types = _schema_types(tools)
    match = _FUNCTION.match(body)
    if match:
        name = match.group(1).strip()
        params = {}
        for pname, raw in _PARAMETER.findall(match.group(2)):
            params[pname.strip()] = _xml_value(raw, types.get(name, {}).get(pname.strip()))
        rest = _PARAMETER.sub("", match.group(2)).strip()
        if rest:
            return None
        arguments = params
    else:
        try:
            obj = json.loads(body)
        except ValueError:
            return None
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return None
        name, arguments = obj["name"], obj.get("arguments", obj.get("parameters", {}))
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except ValueError:
                return None
        if not isinstance(arguments, dict):
            return None
    if not name or (tools and name not in types):
        return None
    return ParsedToolCall(name, json.dumps(arguments, ensure_ascii=False))


class ToolCallParser:
    """``feed(piece) -> [("content", text) | ("tool_call", ParsedToolCall)]``; ``flush()`` at the end of the
    output. ``tools``: the request's tools (OpenAI form: ``{"type": "function", "function": {...}}``)."""

    def __init__(self, tools=None):
        self.tools = tools
        self.held = ""
        self.inside = False
        self.calls = 0

    def feed(self, piece: str) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        text = self.held + piece
        self.held = ""
        while text:
            if not self.inside:
                at = text.find(OPEN)
                if at < 0:
                    keep = partial_suffix(text, [OPEN])
                    self._content(out, text[:len(text) - keep])
                    self.held = text[len(text) - keep:] if keep else ""
                    return out
                self._content(out, text[:at])
                text = text[at + len(OPEN):]
                self.inside = True
            else:
                at = text.find(CLOSE)
                if at < 0:
                    self.held = text
                    return out
                body, text = text[:at], text[at + len(CLOSE):]
                self.inside = False
                call = parse_call(body, self.tools)
                if call is None:
                    self._content(out, OPEN + body + CLOSE)
                else:
                    self.calls += 1
                    out.append(("tool_call", call))
                    text = text.lstrip("\n") if not text.strip() else text
        return out

    @staticmethod
    def _content(out: list, text: str) -> None:
        if text:
            out.append(("content", text))

    def flush(self) -> list[tuple[str, object]]:
        held, self.held = self.held, ""
        out: list[tuple[str, object]] = []
        self._content(out, (OPEN + held) if self.inside else held)
        self.inside = False
        return out
