"""The server's protocol for thinking and tool calls, through the official clients. The tiny random model cannot
be made to write a tool call, so here (and only here) a scripted engine double replays a chosen text through the
real tokenizer; everything else (template, scheduler, text pipeline, routes) is the real server's."""

from __future__ import annotations

import json

import pytest

from lucegen import LLM
from serve_helpers import TEMPLATE, ScriptedEngine, ServerThread, write_tiny

TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather in a city",
                                           "parameters": {"type": "object", "properties": {
                                               "city": {"type": "string"}, "days": {"type": "integer"}}}}}]
ANTHROPIC_TOOLS = [{"name": "get_weather", "description": "weather in a city", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}]
THINK_AND_CALL = ("The user wants the weather.\n</think>\n\nChecking.\n<tool_call>\n<function=get_weather>\n"
                  "<parameter=city>\nParis\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n"
                  "</tool_call>")
USER = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    llm = LLM(write_tiny(tmp_path_factory.mktemp("serve") / "tiny"), device="cpu", max_context=1024,
              chat_template=TEMPLATE)
    llm.engine = ScriptedEngine(llm.config, 1024, eos=min(llm.stop_token_ids))
    srv = ServerThread(llm, slots=2)
    yield srv
    srv.stop()


@pytest.fixture
def script(server):
    engine = server.server.llm.engine

    def set_text(text: str):
        engine.script = server.server.llm.tokenizer.encode(text)
        engine.prompts.clear()
        return engine

    return set_text


def test_openai_reasoning_and_tool_call(oa, script):
    script(THINK_AND_CALL)
    reply = oa.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=200)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.reasoning_content == "The user wants the weather.\n"
    assert choice.message.content == "Checking.\n"
    (call,) = choice.message.tool_calls
    assert call.function.name == "get_weather" and json.loads(call.function.arguments) == {"city": "Paris", "days": 2}
    assert call.id.startswith("call_")

    script(THINK_AND_CALL)
    reasoning, content, calls, finish, order = "", "", {}, None, []
    for chunk in oa.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=200, stream=True):
        delta = chunk.choices[0].delta
        if getattr(delta, "reasoning_content", None):
            reasoning += delta.reasoning_content
            order.append("reasoning")
        if delta.content:
            content += delta.content
            order.append("content")
        for tc in delta.tool_calls or []:  # accumulated as clients do: by index
            entry = calls.setdefault(tc.index, {"id": None, "name": "", "arguments": ""})
            entry["id"] = tc.id or entry["id"]
            entry["name"] += tc.function.name or ""
            entry["arguments"] += tc.function.arguments or ""
            order.append("tool")
        finish = chunk.choices[0].finish_reason or finish
    assert (reasoning, content, finish) == ("The user wants the weather.\n", "Checking.\n", "tool_calls")
    assert [c["name"] for c in calls.values()] == ["get_weather"]
    assert json.loads(calls[0]["arguments"]) == {"city": "Paris", "days": 2}
    assert order.index("content") > order.index("reasoning") and order[-1] == "tool"
    assert order.count("reasoning") > 1  # streamed piece by piece, not at the end
    assert order.count("tool") > 3  # the call's header, then its arguments in pieces


def test_malformed_tool_call_is_text(oa, script):
    text = 'Here.<tool_call>{"name": "get_weather", "arguments": {broken</tool_call>'
    script(text)
    reply = oa.chat.completions.create(model="tiny", messages=USER, tools=TOOLS, max_tokens=100,
                                       extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content == text and not reply.choices[0].message.tool_calls
    assert reply.choices[0].finish_reason == "stop"


def test_anthropic_thinking_and_tool_use(an, script):
    script(THINK_AND_CALL)
    message = an.messages.create(model="tiny", max_tokens=200, messages=USER, tools=ANTHROPIC_TOOLS)
    assert message.stop_reason == "tool_use"
    assert [b.type for b in message.content] == ["thinking", "text", "tool_use"]
    assert message.content[0].thinking == "The user wants the weather.\n"
    assert message.content[2].name == "get_weather" and message.content[2].input == {"city": "Paris", "days": 2}

    script(THINK_AND_CALL)
    with an.messages.stream(model="tiny", max_tokens=200, messages=USER, tools=ANTHROPIC_TOOLS) as stream:
        events = [(e.type, getattr(getattr(e, "delta", None), "type", None)) for e in stream]
        final = stream.get_final_message()
    kinds = [t for t, _ in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert ("content_block_delta", "thinking_delta") in events and ("content_block_delta", "text_delta") in events
    assert events.count(("content_block_delta", "input_json_delta")) > 2  # the arguments in pieces
    assert kinds.count("content_block_start") == kinds.count("content_block_stop") == 3
    assert final.stop_reason == "tool_use"
    assert [b.type for b in final.content] == ["thinking", "text", "tool_use"]
    assert final.content[2].input == {"city": "Paris", "days": 2}


def test_thinking_budget_closes_the_block(oa, an, server, script):
    tokenizer = server.server.llm.tokenizer
    long_thought = "model kernel layer weight block warp thread memory cache state " * 4
    engine = script(long_thought + "</think>\n\nDone.")
    reply = oa.chat.completions.create(model="tiny", messages=USER, max_tokens=200,
                                       extra_body={"thinking_budget": 6})
    reasoning = reply.choices[0].message.reasoning_content
    assert 1 <= len(tokenizer.encode(reasoning)) <= 8 and long_thought.startswith(reasoning.rstrip("\n"))
    assert reply.choices[0].message.content  # the answer after the forced </think>
    forced = tokenizer.encode("\n</think>\n\n")
    assert engine.prompts[-1][-len(forced):] == forced  # the closing tokens went into the sequence

    script(long_thought)
    message = an.messages.create(model="tiny", max_tokens=200, messages=USER,
                                 thinking={"type": "enabled", "budget_tokens": 5})
    assert message.content[0].type == "thinking" and len(tokenizer.encode(message.content[0].thinking)) <= 7
    assert message.content[1].type == "text"
