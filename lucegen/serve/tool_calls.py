"""Tool calls in Qwen's output, both forms its templates use, each wrapped in ``<tool_call>...</tool_call>``:

    <tool_call>                                    <tool_call>
    {"name": "f", "arguments": {"x": 1}}           <function=f>
    </tool_call>                                   <parameter=x>
                                                   1
                                                   </parameter>
                                                   </function>
                                                   </tool_call>

:class:`ToolCallParser` reads the generated text piece by piece and emits ``("content", text)``,
``("tool_call_start", call)``, ``("tool_call_delta", (call, fragment))`` and ``("tool_call_end", call)``; the
fragments of a call concatenate to its ``arguments``, a JSON object. Text outside the tags streams through at once
(less a possible partial ``<tool_call>`` tag at the end).

The XML form streams argument by argument: the call starts when ``<function=NAME>`` names a tool of the request
(any name when the request listed none); each ``string`` parameter's value streams as it is generated, the others
(typed by the tool's JSON schema: numbers, booleans, objects, read as JSON where they parse, else kept as text)
when their ``</parameter>`` arrives. A started call whose body then breaks off (stray text, or the output ends)
ends with the parameters it has, and the rest is text. The JSON form is emitted whole when ``</tool_call>``
arrives. Whatever does not start a call (bad JSON, an unknown tool, no function name, no closing tag) is returned
as the text it was: nothing is dropped and nothing raises.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field

from .think import partial_suffix

OPEN, CLOSE = "<tool_call>", "</tool_call>"
FUNCTION, END_FUNCTION = "<function=", "</function>"
PARAMETER, END_PARAMETER = "<parameter=", "</parameter>"
_FUNCTION = re.compile(r"^\s*<function=([^>\n]+)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)</parameter>", re.S)


@dataclass
class ParsedToolCall:
    name: str
    arguments: str  # a JSON object, as OpenAI's tool_calls carry it (complete at the call's end)
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")
    index: int = 0  # the call's place among the output's calls

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
    """``feed(piece) -> [(kind, value)]`` as the module's docstring says; ``flush()`` at the end of the output.
    ``tools``: the request's tools (OpenAI form: ``{"type": "function", "function": {...}}``)."""

    def __init__(self, tools=None):
        self.tools = tools
        self.types = _schema_types(tools)
        self.held = ""  # text not yet decided on
        self.state = "text"  # text | head | whole | params | string | typed | closing
        self.call: ParsedToolCall | None = None
        self.params = 0  # parameters of the current call so far
        self.param_type = None
        self.strip_newline = False  # at the start of a string value
        self.calls = 0

    # ------------------------------------------------------------------------------------------ the states
    def feed(self, piece: str) -> list[tuple[str, object]]:
        out: list[tuple[str, object]] = []
        self.held += piece
        while self.held and getattr(self, "_" + self.state)(out):
            pass
        return out

    def _text(self, out) -> bool:
        before = self._take_to(OPEN)
        if before is None:
            self._content(out, self._release(partial_suffix(self.held, [OPEN])))
            return False
        self._content(out, before)
        self.state = "head"
        return True

    def _head(self, out) -> bool:
        """After <tool_call>: an XML header naming a tool starts a streamed call; anything else waits whole."""
        body = self.held.lstrip()
        if not body or (len(body) < len(FUNCTION) and FUNCTION.startswith(body)):
            return False
        if body.startswith(FUNCTION):
            end = body.find(">")
            if end < 0:
                if "\n" not in body:
                    return False  # the name is still coming
            else:
                name = body[len(FUNCTION):end].strip()
                if name and "\n" not in name and (not self.tools or name in self.types):
                    self.call = ParsedToolCall(name, "", index=self.calls)
                    self.calls += 1
                    self.params = 0
                    out.append(("tool_call_start", self.call))
                    self.held = body[end + 1:]
                    self.state = "params"
                    return True
        self.state = "whole"
        return True

    def _whole(self, out) -> bool:
        """A call that is not streamed: parsed when </tool_call> arrives, else text."""
        body = self._take_to(CLOSE)
        if body is None:
            return False
        call = parse_call(body, self.tools)
        if call is None:
            self._content(out, OPEN + body + CLOSE)
        else:
            call.index = self.calls
            self.calls += 1
            out += [("tool_call_start", call), ("tool_call_delta", (call, call.arguments)), ("tool_call_end", call)]
            self._after_call()
        self.state = "text"
        return True

    def _params(self, out) -> bool:
        rest = self.held.lstrip()
        if rest.startswith(PARAMETER):
            end = rest.find(">")
            if end < 0:
                if "\n" in rest:
                    return self._break_off(out)
                return False
            name = rest[len(PARAMETER):end].strip()
            self.held = rest[end + 1:]
            self.param_type = self.types.get(self.call.name, {}).get(name)
            self._delta(out, ("{" if self.params == 0 else ", ") + json.dumps(name, ensure_ascii=False) + ": ")
            self.params += 1
            if self.param_type == "string":
                self._delta(out, '"')
                self.state, self.strip_newline = "string", True
            else:
                self.state = "typed"
            return True
        if rest.startswith(END_FUNCTION):
            self._delta(out, "}" if self.params else "{}")
            self.held = rest[len(END_FUNCTION):]
            self.state = "closing"
            return True
        if not rest or any(tag.startswith(rest) for tag in (PARAMETER, END_FUNCTION)):
            return False
        return self._break_off(out)

    def _string(self, out) -> bool:
        """A string parameter's value, streamed as JSON string content; the newlines the template puts around a
        value are not part of it."""
        if self.strip_newline:
            self.strip_newline = False
            if self.held.startswith("\n"):
                self.held = self.held[1:]
                if not self.held:
                    return False
        value = self._take_to(END_PARAMETER)
        if value is not None:
            self._delta(out, _json_text(value[:-1] if value.endswith("\n") else value) + '"')
            self.state = "params"
            return True
        keep = partial_suffix(self.held, [END_PARAMETER])
        if self.held[:len(self.held) - keep].endswith("\n"):
            keep += 1  # perhaps the newline before </parameter>
        if keep < len(self.held):
            self._delta(out, _json_text(self._release(keep)))
        return False

    def _typed(self, out) -> bool:
        raw = self._take_to(END_PARAMETER)
        if raw is None:
            return False
        self._delta(out, json.dumps(_xml_value(raw, self.param_type), ensure_ascii=False))
        self.state = "params"
        return True

    def _closing(self, out) -> bool:
        """After </function>: the call ends at </tool_call>."""
        rest = self.held.lstrip()
        if rest.startswith(CLOSE):
            self.held = rest[len(CLOSE):]
            self._end(out)
            self._after_call()
            return True
        if not rest or CLOSE.startswith(rest):
            return False
        self._end(out)
        return True

    # ------------------------------------------------------------------------------------------ helpers
    def _take_to(self, tag: str) -> str | None:
        """The held text before ``tag``, leaving what follows ``tag`` held; None while ``tag`` has not arrived."""
        at = self.held.find(tag)
        if at < 0:
            return None
        before, self.held = self.held[:at], self.held[at + len(tag):]
        return before

    def _release(self, keep: int) -> str:
        """The held text but its last ``keep`` characters, which stay held."""
        released, self.held = self.held[:len(self.held) - keep], self.held[len(self.held) - keep:]
        return released

    def _break_off(self, out) -> bool:
        """Stray text inside a started call: the call ends with the parameters it has; the text is content."""
        self._delta(out, "}" if self.params else "{}")
        self._end(out)
        return True

    def _end(self, out) -> None:
        out.append(("tool_call_end", self.call))
        self.call = None
        self.state = "text"

    def _after_call(self) -> None:
        if not self.held.strip():  # the newline between calls is not content
            self.held = self.held.lstrip("\n")

    def _delta(self, out, fragment: str) -> None:
        self.call.arguments += fragment
        out.append(("tool_call_delta", (self.call, fragment)))

    @staticmethod
    def _content(out: list, text: str) -> None:
        if text:
            out.append(("content", text))

    def flush(self) -> list[tuple[str, object]]:
        """The end of the output: a started call ends with what it has, anything held is text."""
        out: list[tuple[str, object]] = []
        held, self.held = self.held, ""
        if self.state in ("head", "whole"):
            self._content(out, OPEN + held)
        elif self.state == "string":
            self._delta(out, _json_text(held) + '"}')
            self._end(out)
        elif self.state == "typed":
            self._delta(out, json.dumps(_xml_value(held, self.param_type), ensure_ascii=False) + "}")
            self._end(out)
        elif self.state == "params":
            self._delta(out, "}" if self.params else "{}")
            self._end(out)
            self._content(out, held.strip() and held)
        elif self.state == "closing":
            self._end(out)
            self._content(out, held.strip() and held)
        else:
            self._content(out, held)
        self.state = "text"
        return out


def _json_text(text: str) -> str:
    """``text`` as the inside of a JSON string (escaping is per character, so pieces concatenate)."""
    return json.dumps(text, ensure_ascii=False)[1:-1]
