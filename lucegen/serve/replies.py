"""What both APIs do with a request's generation, whatever their formats: start it (a full queue is a 429, a server
shutting down a 503), collect its whole answer (an engine failure is a 503), or stream it as server-sent events
(an engine failure ends the stream with the API's error event; the stream's end, finished or cut by the client,
cancels the generation)."""

from __future__ import annotations

from contextlib import aclosing

from fastapi.responses import StreamingResponse

from .generation import Generation, GenerationError, GenerationSpec, collect
from .http import ApiError
from .scheduler import QueueFull, ShuttingDown

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def start(server, spec: GenerationSpec) -> Generation:
    try:
        return Generation(spec, server.llm.tokenizer, server.scheduler)
    except (QueueFull, ShuttingDown) as exc:
        raise ApiError(exc.status, str(exc), code=type(exc).__name__) from None


async def whole_answer(generation: Generation, request) -> tuple[str, str, list, str]:
    """(content, reasoning, tool calls, finish_reason) of a non-streaming request."""
    try:
        return await collect(generation, request)
    except GenerationError as exc:
        raise ApiError(503, str(exc)) from None


def event_stream(generation: Generation, events, error_event) -> StreamingResponse:
    """``events`` (an async iterator of the API's server-sent events for ``generation``) as the response;
    ``error_event(message)`` is the API's last event when the engine fails."""

    async def body():
        try:
            async with aclosing(events):
                async for event in events:
                    yield event
        except GenerationError as exc:
            yield error_event(str(exc))
        finally:
            generation.cancel()

    return StreamingResponse(body(), media_type="text/event-stream", headers=SSE_HEADERS)
