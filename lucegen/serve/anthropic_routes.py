"""``POST /v1/messages``: Anthropic's Messages API. The request's system prompt, text, thinking, tool_use and
tool_result blocks become the chat template's messages (tool results as ``tool`` messages, tool uses as
``tool_calls``); ``thinking`` turns the template's ``enable_thinking`` on or off and its ``budget_tokens`` is the
thinking budget. The reply is content blocks (thinking, text, tool_use); streamed, it is the event sequence
message_start, then per block content_block_start / content_block_delta (text_delta, thinking_delta,
input_json_delta) / content_block_stop, then message_delta (stop_reason, usage) and message_stop."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request

from .http import ApiError, read_request
from .generation import Generation
from .prepare import chat_spec, render_chat, sampling_params
from .protocol import STOP_REASONS, AnthropicUsage, CountTokensRequest, MessagesRequest, MessagesResponse, new_id
from .replies import event_stream, start, whole_answer

router = APIRouter()


def _text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(block.text for block in content)


def template_messages(req: MessagesRequest) -> list[dict]:
    out = []
    if req.system:
        out.append({"role": "system", "content": _text(req.system)})
    for m in req.messages:
        if isinstance(m.content, str):
            out.append({"role": m.role, "content": m.content})
            continue
        text, reasoning, calls = [], [], []
        for block in m.content:
            if block.type == "text":
                text.append(block.text)
            elif block.type == "thinking" and m.role == "assistant":
                reasoning.append(block.thinking)
            elif block.type == "tool_use" and m.role == "assistant":
                calls.append({"id": block.id, "type": "function",
                              "function": {"name": block.name, "arguments": block.input}})
            elif block.type == "tool_result" and m.role == "user":
                out.append({"role": "tool", "content": _text(block.content), "tool_call_id": block.tool_use_id})
            else:
                raise ApiError(400, f"a {block.type} block cannot be in a {m.role} message", "messages")
        if m.role == "assistant":
            message = {"role": "assistant", "content": "".join(text)}
            if reasoning:
                message["reasoning_content"] = "".join(reasoning)
            if calls:
                message["tool_calls"] = calls
            out.append(message)
        elif text or not any(b.type == "tool_result" for b in m.content):
            out.append({"role": "user", "content": "".join(text)})
    return out


def _stop_reason(generation: Generation, reason: str) -> tuple[str, str | None]:
    if reason == "stop" and generation.text.stopped is not None:
        return "stop_sequence", generation.text.stopped
    return STOP_REASONS.get(reason, "end_turn"), None


def _template_options(req: MessagesRequest) -> tuple[list | None, dict, int | None]:
    """(tools in OpenAI form for the template, template kwargs, thinking budget) of a Messages request."""
    tools = None
    if req.tools and (req.tool_choice or {}).get("type") != "none":
        tools = [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                                   "parameters": t.input_schema or {"type": "object"}}}
                 for t in req.tools]
    kwargs, budget = {}, None
    if req.thinking is not None:
        kwargs["enable_thinking"] = req.thinking.type != "disabled"
        budget = req.thinking.budget_tokens if req.thinking.type == "enabled" else None
    return tools, kwargs, budget


@router.post("/v1/messages/count_tokens")
async def count_tokens(request: Request):
    """The prompt's token count as the template renders it (agent clients ask before sending)."""
    server, req = await read_request(request, CountTokensRequest)
    tools, kwargs, _ = _template_options(req)
    _, prompt = render_chat(server, template_messages(req), tools, kwargs)
    return {"input_tokens": len(prompt)}


@router.post("/v1/messages")
async def messages(request: Request):
    server, req = await read_request(request, MessagesRequest)
    params = sampling_params(server.llm.engine, req.temperature, req.top_p, req.top_k, seed=req.seed)
    tools, kwargs, budget = _template_options(req)
    spec = chat_spec(server, template_messages(req), tools=tools, template_kwargs=kwargs, max_tokens=req.max_tokens,
                     params=params, stop=req.stop_sequences, think_budget=budget)
    generation = start(server, spec)
    mid = new_id("msg")
    if req.stream:
        return event_stream(generation, _stream(generation, mid, req.model), error_event)
    content, reasoning, calls, reason = await whole_answer(generation, request)
    blocks = []
    if reasoning:
        blocks.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if content:
        blocks.append({"type": "text", "text": content})
    blocks += [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.input} for c in calls]
    stop_reason, stop_sequence = _stop_reason(generation, reason)
    body = MessagesResponse(id=mid, model=req.model, content=blocks, stop_reason=stop_reason,
                            stop_sequence=stop_sequence,
                            usage=AnthropicUsage(input_tokens=generation.prompt_tokens,
                                                 output_tokens=generation.completion_tokens))
    return body.model_dump()


def event(name: str, data: dict) -> str:
    return f"event: {name}\ndata: {json.dumps({'type': name, **data}, ensure_ascii=False)}\n\n"


def error_event(message: str) -> str:
    """The last event of a stream whose generation the engine failed."""
    return event("error", {"error": {"type": "api_error", "message": message}})


async def _stream(generation: Generation, mid: str, model: str):
    index, open_kind = -1, None

    def close_block():
        return event("content_block_stop", {"index": index})

    yield event("message_start", {"message": {
        "id": mid, "type": "message", "role": "assistant", "model": model, "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": generation.prompt_tokens, "output_tokens": 0}}})
    async for kind, value in generation.events():
        if kind in ("content", "reasoning"):
            if open_kind != kind:
                if open_kind is not None:
                    yield close_block()
                index, open_kind = index + 1, kind
                block = {"type": "text", "text": ""} if kind == "content" else \
                    {"type": "thinking", "thinking": "", "signature": ""}
                yield event("content_block_start", {"index": index, "content_block": block})
            delta = {"type": "text_delta", "text": value} if kind == "content" else \
                {"type": "thinking_delta", "thinking": value}
            yield event("content_block_delta", {"index": index, "delta": delta})
        elif kind == "tool_call_start":
            if open_kind is not None:
                yield close_block()
            index, open_kind = index + 1, None
            yield event("content_block_start", {"index": index, "content_block": {
                "type": "tool_use", "id": value.id, "name": value.name, "input": {}}})
        elif kind == "tool_call_delta":
            yield event("content_block_delta", {"index": index, "delta": {
                "type": "input_json_delta", "partial_json": value[1]}})
        elif kind == "tool_call_end":
            yield close_block()
        else:
            if open_kind is not None:
                yield close_block()
                open_kind = None
            stop_reason, stop_sequence = _stop_reason(generation, value)
            yield event("message_delta", {"delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
                                          "usage": {"output_tokens": generation.completion_tokens}})
            yield event("message_stop", {})
