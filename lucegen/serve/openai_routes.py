"""``POST /v1/chat/completions`` and ``POST /v1/completions``: OpenAI's request and response bodies, streamed as
server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``) when ``stream`` is set; with
``stream_options.include_usage`` a last chunk carries the usage. Reasoning goes in ``reasoning_content``; tool calls
in ``tool_calls`` (finish_reason "tool_calls"), each streamed as a delta with its index, id and name, then deltas
with pieces of its arguments as the parser releases them."""

from __future__ import annotations

import json

from fastapi import APIRouter, Request

from .http import ApiError, read_request
from .generation import Generation
from .prepare import chat_spec, completion_spec, sampling_params, tool_arguments
from .protocol import (ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChunkChoice,
                       Completion, CompletionChoice, CompletionRequest, Delta, OutFunction, OutMessage, OutToolCall,
                       Usage, new_id)
from .replies import event_stream, start, whole_answer

router = APIRouter()


def sse(data) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def error_event(message: str) -> str:
    """The last event of a stream whose generation the engine failed."""
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": 503}})


def _include_usage(req) -> bool:
    return req.stream_options is not None and req.stream_options.include_usage


def _params(server, req):
    if req.n != 1:
        raise ApiError(400, f"n={req.n}: this server generates one choice per request (n must be 1)", "n")
    if req.logprobs:
        raise ApiError(400, "logprobs are not supported by this server", "logprobs")
    return sampling_params(server.llm.engine, req.temperature, req.top_p, req.top_k, req.min_p, req.seed,
                           req.presence_penalty, req.frequency_penalty, req.repetition_penalty)


def _messages(req: ChatCompletionRequest) -> list[dict]:
    out = []
    for i, m in enumerate(req.messages):
        content = m.content
        if isinstance(content, list):
            parts = []
            for part in content:
                if part.type != "text" or part.text is None:
                    raise ApiError(400, f"messages.{i}.content: only text parts are supported, got {part.type!r}",
                                   f"messages.{i}.content")
                parts.append(part.text)
            content = "".join(parts)
        message = {"role": "system" if m.role == "developer" else m.role, "content": content}
        if m.name is not None:
            message["name"] = m.name
        if m.reasoning_content is not None:
            message["reasoning_content"] = m.reasoning_content
        if m.tool_call_id is not None:
            message["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            message["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                "name": c.function.name, "arguments": tool_arguments(c.function.arguments)}} for c in m.tool_calls]
        out.append(message)
    return out


def _template_options(req: ChatCompletionRequest) -> tuple[list | None, dict, int | None]:
    """(tools for the template, template kwargs, thinking budget) of a chat request; ``thinking_budget`` is an extra
    field (the request model allows unknown fields), so it is checked here."""
    tools = None
    if req.tools and req.tool_choice != "none":
        tools = [t.model_dump(exclude_none=True) for t in req.tools]
    budget = getattr(req, "thinking_budget", None)
    if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 1):
        raise ApiError(400, f"thinking_budget must be a positive integer, got {budget!r}", "thinking_budget")
    return tools, dict(req.chat_template_kwargs or {}), budget


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    server, req = await read_request(request, ChatCompletionRequest)
    params = _params(server, req)
    tools, kwargs, budget = _template_options(req)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    spec = chat_spec(server, _messages(req), tools=tools, template_kwargs=kwargs, max_tokens=requested,
                     params=params, stop=req.stop, think_budget=budget)
    generation = start(server, spec)
    rid = new_id("chatcmpl")
    if req.stream:
        return event_stream(generation, _chat_stream(generation, rid, req.model, _include_usage(req)), error_event)
    content, reasoning, calls, reason = await whole_answer(generation, request)
    message = OutMessage(content=content if content or not calls else None, reasoning_content=reasoning or None,
                         tool_calls=[OutToolCall(id=c.id, type="function", function=OutFunction(
                             name=c.name, arguments=c.arguments)) for c in calls] or None)
    body = ChatCompletion(id=rid, model=req.model, choices=[ChatChoice(message=message, finish_reason=reason)],
                          usage=_usage(generation))
    return body.model_dump(exclude_none=True)


def _usage(generation: Generation) -> Usage:
    return Usage(prompt_tokens=generation.prompt_tokens, completion_tokens=generation.completion_tokens,
                 total_tokens=generation.prompt_tokens + generation.completion_tokens)


async def _chat_stream(generation: Generation, rid: str, model: str, include_usage: bool):
    def chunk(delta: Delta, finish=None) -> str:
        body = ChatCompletionChunk(id=rid, model=model, choices=[ChunkChoice(delta=delta, finish_reason=finish)])
        return sse(body.model_dump_json(exclude_none=True))

    yield chunk(Delta(role="assistant", content=""))
    async for kind, value in generation.events():
        if kind == "content":
            yield chunk(Delta(content=value))
        elif kind == "reasoning":
            yield chunk(Delta(reasoning_content=value))
        elif kind == "tool_call_start":
            yield chunk(Delta(tool_calls=[OutToolCall(index=value.index, id=value.id, type="function",
                                                      function=OutFunction(name=value.name, arguments=""))]))
        elif kind == "tool_call_delta":
            call, fragment = value
            yield chunk(Delta(tool_calls=[OutToolCall(index=call.index, function=OutFunction(arguments=fragment))]))
        elif kind == "done":
            yield chunk(Delta(), finish=value)
    if include_usage:
        body = ChatCompletionChunk(id=rid, model=model, choices=[], usage=_usage(generation))
        yield sse(body.model_dump_json(exclude_none=True))
    yield sse("[DONE]")


@router.post("/v1/completions")
async def completions(request: Request):
    server, req = await read_request(request, CompletionRequest)
    params = _params(server, req)
    spec = completion_spec(server, req.prompt, max_tokens=req.max_tokens, params=params, stop=req.stop)
    generation = start(server, spec)
    rid = new_id("cmpl")
    echo = server.llm.tokenizer.decode(spec.prompt) if req.echo else ""
    if req.stream:
        return event_stream(generation, _completion_stream(generation, rid, req.model, _include_usage(req), echo),
                            error_event)
    content, _, _, reason = await whole_answer(generation, request)
    body = Completion(id=rid, model=req.model, choices=[CompletionChoice(text=echo + content, finish_reason=reason)],
                      usage=_usage(generation))
    return body.model_dump(exclude_none=True)


async def _completion_stream(generation: Generation, rid: str, model: str, include_usage: bool, echo: str):
    def chunk(text: str, finish=None) -> str:
        body = Completion(id=rid, model=model, choices=[CompletionChoice(text=text, finish_reason=finish)])
        data = body.model_dump(exclude_none=True)
        data["choices"][0]["finish_reason"] = finish
        return sse(data)

    if echo:
        yield chunk(echo)
    async for kind, value in generation.events():
        if kind == "content":
            yield chunk(value)
        elif kind == "done":
            yield chunk("", value)
    if include_usage:
        yield sse(Completion(id=rid, model=model, choices=[], usage=_usage(generation)).model_dump_json(
            exclude_none=True))
    yield sse("[DONE]")
