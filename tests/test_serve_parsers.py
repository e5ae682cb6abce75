"""The server's text parsers, fed whole and in every split: the <think> splitter and the tool-call parser (the
JSON-in-<tool_call> and XML <function=...> forms; malformed calls come back as text)."""

from __future__ import annotations

import json
import random

import pytest

from lucegen.serve.think import ThinkSplitter, partial_suffix
from lucegen.serve.tool_calls import ToolCallParser, parse_call

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "units": {"type": "string"}}}}}]


def pieces(text: str, rnd: random.Random) -> list[str]:
    cuts = sorted(rnd.sample(range(1, len(text)), min(len(text) - 1, rnd.randint(0, 12)))) if len(text) > 1 else []
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def run_think(text: str, in_think: bool, split) -> list[tuple[str, str]]:
    splitter = ThinkSplitter(in_think)
    out = []
    for piece in split:
        out += splitter.feed(piece)
    out += splitter.flush()
    merged = []
    for kind, value in out:
        if merged and merged[-1][0] == kind:
            merged[-1] = (kind, merged[-1][1] + value)
        else:
            merged.append((kind, value))
    return merged


@pytest.mark.parametrize("text,in_think,expected", [
    ("plan the answer\n</think>\n\nParis.", True, [("reasoning", "plan the answer\n"), ("content", "Paris.")]),
    ("<think>\nhm</think>Yes", False, [("reasoning", "hm"), ("content", "Yes")]),
    ("no tags at all", False, [("content", "no tags at all")]),
    ("still thinking when cut off", True, [("reasoning", "still thinking when cut off")]),
    ("a </thin", True, [("reasoning", "a </thin")]),  # a partial tag at the end is text
    ("x</think>y<think>z", True, [("reasoning", "x"), ("content", "y<think>z")]),  # one block only
])
def test_think_splitter_every_split(text, in_think, expected):
    assert run_think(text, in_think, [text]) == expected
    assert run_think(text, in_think, list(text)) == expected
    rnd = random.Random(0)
    for _ in range(50):
        assert run_think(text, in_think, pieces(text, rnd)) == expected


def test_partial_suffix():
    assert partial_suffix("abc<too", ["<tool_call>"]) == 4
    assert partial_suffix("abc", ["<tool_call>"]) == 0
    assert partial_suffix("<tool_call>", ["<tool_call>"]) == 0  # a whole tag is not partial


def run_tools(text: str, split, tools=TOOLS):
    """(content, [(name, arguments)]) from the parser fed ``split``; checks that each call's deltas concatenate to
    its arguments and come between its start and its end."""
    parser = ToolCallParser(tools)
    out = []
    for piece in split:
        out += parser.feed(piece)
    out += parser.flush()
    content = "".join(v for k, v in out if k == "content")
    calls, open_call, fragments = [], None, ""
    for kind, value in out:
        if kind == "tool_call_start":
            assert open_call is None
            open_call, fragments = value, ""
        elif kind == "tool_call_delta":
            assert value[0] is open_call
            fragments += value[1]
        elif kind == "tool_call_end":
            assert value is open_call and fragments == value.arguments
            calls.append((value.name, json.loads(value.arguments)))
            open_call = None
        else:
            assert open_call is None, "content inside a call"
    assert open_call is None
    return content, calls


XML = "Let me check.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nSan Francisco\n</parameter>\n" \
      "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
JSON_FORM = 'Sure.<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": 2}}\n</tool_call>' \
            '<tool_call>\n{"name": "get_weather", "arguments": "{\\"city\\": \\"Rome\\"}"}\n</tool_call>'


@pytest.mark.parametrize("text,content,calls", [
    (XML, "Let me check.\n", [("get_weather", {"city": "San Francisco", "days": 3})]),
    (JSON_FORM, "Sure.", [("get_weather", {"city": "Paris", "days": 2}), ("get_weather", {"city": "Rome"})]),
    ("no calls here < tool", "no calls here < tool", []),
    # a value with newlines, quotes and a partial closing tag inside; no parameters at all
    ("<tool_call>\n<function=get_weather>\n<parameter=city>\n\n\"A\"\n</param\n\n</parameter>\n</function>"
     "\n</tool_call>", "", [("get_weather", {"city": '\n"A"\n</param\n'})]),
    ("<tool_call><function=get_weather></function></tool_call>after", "after", [("get_weather", {})]),
    # not a call: bad JSON, an unknown tool, a header that never closes -> the text as it was
    ("a<tool_call>{not json}</tool_call>b", "a<tool_call>{not json}</tool_call>b", []),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', '<tool_call>{"name": "rm_rf", "arguments": {}}'
                                                                  '</tool_call>', []),
    ("<tool_call>\n<function=rm_rf>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>",
     "<tool_call>\n<function=rm_rf>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>", []),
    ("x<tool_call>\n<function=get_wea", "x<tool_call>\n<function=get_wea", []),
    # a started call that breaks off ends with the parameters it has; the rest is text
    ("x<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo", "x", [("get_weather", {"city": "Oslo"})]),
    ("<tool_call><function=get_weather>junk</function></tool_call>", "junk</function></tool_call>",
     [("get_weather", {})]),
    ("<tool_call><function=get_weather><parameter=days>\n4\n</parameter>\n</function>\noops",
     "\noops", [("get_weather", {"days": 4})]),
])
def test_tool_call_parser_every_split(text, content, calls):
    assert run_tools(text, [text]) == (content, calls)
    assert run_tools(text, list(text)) == (content, calls)
    rnd = random.Random(1)
    for _ in range(50):
        assert run_tools(text, pieces(text, rnd)) == (content, calls)


def test_xml_values_follow_the_schema():
    call = parse_call("<function=get_weather>\n<parameter=city>\n42\n</parameter>\n<parameter=days>\n7\n"
                      "</parameter>\n<parameter=units>\n{\"a\": 1}\n</parameter>\n</function>", TOOLS)
    assert call.input == {"city": "42", "days": 7, "units": '{"a": 1}'}  # strings stay strings
    untyped = parse_call("<function=f>\n<parameter=x>\n[1, 2]\n</parameter>\n<parameter=y>\nnot json\n</parameter>"
                         "\n</function>")
    assert untyped.input == {"x": [1, 2], "y": "not json"}


def test_content_and_arguments_stream_before_the_call_closes():
    parser = ToolCallParser(TOOLS)
    assert parser.feed("Hello <tool") == [("content", "Hello ")]
    assert parser.feed("_call>\n<function=get_weather>")[0][0] == "tool_call_start"
    out = parser.feed("\n<parameter=city>\nNew Yo")
    assert [v[1] for k, v in out if k == "tool_call_delta"] == ['{"city": ', '"', "New Yo"]
    out = parser.feed("rk\n</parameter>\n<parameter=days>\n1")
    assert [v[1] for k, v in out if k == "tool_call_delta"] == ['rk"', ', "days": ']  # a number waits for its end
    out = parser.feed("0\n</parameter>\n</function>\n</tool_call> after")
    assert [k for k, _ in out] == ["tool_call_delta", "tool_call_delta", "tool_call_end", "content"]
    assert json.loads(out[2][1].arguments) == {"city": "New York", "days": 10}
