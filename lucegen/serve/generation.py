"""One request's generation as the HTTP side sees it: a :class:`~.scheduler.Job` submitted to the engine thread,
its token events carried into the event loop, and the text pipeline that turns them into what both APIs send.

    tokens -> TextStream (UTF-8 safe text, stop strings) -> ThinkSplitter (reasoning | content)
           -> ToolCallParser (content | tool calls, when the request has tools)

:meth:`Generation.events` yields ``("reasoning", text)``, ``("content", text)``, the tool-call events of
:class:`~.tool_calls.ToolCallParser` (``tool_call_start``, ``tool_call_delta``, ``tool_call_end``) and finally
``("done", finish_reason)``, with finish_reason "stop", "length" or "tool_calls". Leaving the
iteration early (the client went away) cancels the job, which frees its slot at the engine's next turn.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from ..errors import LucegenError
from ..model.text_stream import TextStream
from .scheduler import Job, ThinkBudget
from .think import ThinkSplitter
from .tool_calls import ToolCallParser


class GenerationError(LucegenError):
    """The engine failed this request (the server keeps serving)."""


@dataclass
class GenerationSpec:
    prompt: list[int]
    max_tokens: int
    params: object
    stop_ids: frozenset
    stop: tuple = ()
    tools: list | None = None  # OpenAI-form tool dicts: parse tool calls
    in_think: bool = False  # the prompt opened a think block
    think_budget: ThinkBudget | None = None
    split_thinking: bool = True


class Generation:
    def __init__(self, spec: GenerationSpec, tokenizer, scheduler):
        self.spec, self.tokenizer = spec, tokenizer
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()

        def emit(event):
            loop.call_soon_threadsafe(self.queue.put_nowait, event)

        self.job = Job(spec.prompt, spec.max_tokens, spec.params, spec.stop_ids, emit, think=spec.think_budget)
        self.text = TextStream(tokenizer, stop=spec.stop)
        self.think = ThinkSplitter(spec.in_think) if spec.split_thinking else None
        self.tools = ToolCallParser(spec.tools) if spec.tools else None
        self.tool_calls = 0
        scheduler.submit(self.job)

    @property
    def prompt_tokens(self) -> int:
        return len(self.spec.prompt)

    @property
    def completion_tokens(self) -> int:
        return len(self.job.generated)

    def cancel(self) -> None:
        self.job.cancel()

    async def events(self):
        try:
            while True:
                kind, value = await self.queue.get()
                if kind == "tokens":
                    text, stopped = self.text.push(value)
                    for piece in self._pieces(text):
                        yield piece
                    if stopped:
                        self.job.cancel()
                        for piece in self._pieces("", final=True):
                            yield piece
                        yield "done", self._reason("stop")
                        return
                elif kind == "done":
                    for piece in self._pieces(self.text.finish(), final=True):
                        yield piece
                    yield "done", self._reason("stop" if value == "cancelled" else value)
                    return
                else:
                    raise GenerationError(value)
        finally:
            self.job.cancel()

    def _reason(self, reason: str) -> str:
        return "tool_calls" if self.tool_calls and reason == "stop" else reason

    def _pieces(self, text: str, final: bool = False):
        split = self.think.feed(text) if self.think else [("content", text)]
        if final and self.think:
            split += self.think.flush()
        for kind, piece in split:
            if kind == "content" and self.tools is not None:
                yield from self._tool_pieces(self.tools.feed(piece))
            elif piece:
                yield kind, piece
        if final and self.tools is not None:
            yield from self._tool_pieces(self.tools.flush())

    def _tool_pieces(self, parsed):
        for kind, value in parsed:
            if kind == "tool_call_end":
                self.tool_calls += 1
            yield kind, value


async def collect(generation: Generation, request=None) -> tuple[str, str, list, str]:
    """The whole output of a non-streaming request: (content, reasoning, tool calls, finish_reason). With the
    HTTP ``request``, a client that goes away cancels the generation at once (checked every 50 ms)."""
    task = asyncio.ensure_future(_collect(generation))
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.05)
            if done:
                return task.result()
            if request is not None and await request.is_disconnected():
                generation.cancel()
                raise ClientGone("the client disconnected")
    finally:
        task.cancel()


class ClientGone(Exception):
    """The client of a non-streaming request disconnected before its answer."""


async def _collect(generation: Generation) -> tuple[str, str, list, str]:
    content, reasoning, calls, reason = [], [], [], "stop"
    async for kind, value in generation.events():
        if kind == "content":
            content.append(value)
        elif kind == "reasoning":
            reasoning.append(value)
        elif kind == "tool_call_end":
            calls.append(value)
        elif kind == "done":
            reason = value
    return "".join(content), "".join(reasoning), calls, reason
