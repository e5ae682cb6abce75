"""Request and response bodies of the two APIs the server speaks, as pydantic models.

OpenAI: ``/v1/chat/completions`` and ``/v1/completions`` (requests, responses, streaming chunks, usage) and its
error object ``{"error": {"message", "type", "param", "code"}}``. Anthropic: ``/v1/messages`` (request, response,
the streaming events message_start, content_block_start / _delta / _stop, message_delta, message_stop) and its error
object ``{"type": "error", "error": {"type", "message"}}``.

Requests accept fields they do not know (clients send many); the fields they use are typed and bounded, so a wrong
type or an out-of-range value is a 400 naming the field, before any engine work.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field

#: the largest integer field value accepted anywhere (seeds are 64-bit)
MAX_INT = 2**64 - 1


class Request(BaseModel):
    model_config = ConfigDict(extra="allow")


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


# ------------------------------------------------------------------------------------------------ OpenAI requests
class FunctionDef(Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(Request):
    type: Literal["function"] = "function"
    function: FunctionDef


class ToolCallFunction(Request):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(Request):
    id: str | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ContentPart(Request):
    type: str
    text: str | None = None


class ChatMessage(Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class StreamOptions(Request):
    include_usage: bool = False


class SamplingFields(Request):
    """The sampling fields both OpenAI endpoints share (vLLM's extensions top_k, min_p, repetition_penalty too)."""

    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=-1, le=MAX_INT)
    min_p: float | None = Field(default=None, ge=0, lt=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    seed: int | None = Field(default=None, ge=-(2**63), le=MAX_INT)
    stop: str | list[str] | None = None
    n: int = Field(default=1, ge=1, le=MAX_INT)
    stream: bool = False
    stream_options: StreamOptions | None = None
    logprobs: bool | int | None = None


class ChatCompletionRequest(SamplingFields):
    model: str
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class CompletionRequest(SamplingFields):
    model: str
    prompt: str | list[int] = Field(min_length=1)
    max_tokens: int | None = Field(default=16, ge=1, le=MAX_INT)
    echo: bool = False


# ------------------------------------------------------------------------------------------------ OpenAI responses
def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class Usage(Body):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class OutFunction(Body):
    name: str | None = None
    arguments: str | None = None


class OutToolCall(Body):
    index: int | None = None
    id: str | None = None
    type: Literal["function"] | None = None
    function: OutFunction


class OutMessage(Body):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[OutToolCall] | None = None


class ChatChoice(Body):
    index: int = 0
    message: OutMessage
    finish_reason: str | None
    logprobs: None = None


class ChatCompletion(Body):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(Body):
    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[OutToolCall] | None = None


class ChunkChoice(Body):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: None = None


class ChatCompletionChunk(Body):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class CompletionChoice(Body):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: None = None


class Completion(Body):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None


class ModelCard(Body):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "lucegen"
    max_model_len: int


class ModelList(Body):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class ErrorDetail(Body):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(Body):
    error: ErrorDetail


# ------------------------------------------------------------------------------------------------ Anthropic requests
class AnthropicTextBlock(Request):
    type: Literal["text"]
    text: str


class AnthropicThinkingBlock(Request):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class AnthropicToolUseBlock(Request):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict[str, Any]


class AnthropicToolResultBlock(Request):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[AnthropicTextBlock] | None = None
    is_error: bool | None = None


AnthropicBlock = Union[AnthropicTextBlock, AnthropicThinkingBlock, AnthropicToolUseBlock, AnthropicToolResultBlock]


class AnthropicMessage(Request):
    role: Literal["user", "assistant"]
    content: str | list[AnthropicBlock]


class AnthropicTool(Request):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class AnthropicThinking(Request):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)


class MessagesRequest(Request):
    model: str
    messages: list[AnthropicMessage] = Field(min_length=1)
    max_tokens: int = Field(ge=1, le=MAX_INT)
    system: str | list[AnthropicTextBlock] | None = None
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = Field(default=None, ge=0, le=MAX_INT)
    seed: int | None = Field(default=None, ge=-(2**63), le=MAX_INT)  # not Anthropic's: reproducible sampling
    stop_sequences: list[str] | None = None
    stream: bool = False
    tools: list[AnthropicTool] | None = None
    tool_choice: dict[str, Any] | None = None
    thinking: AnthropicThinking | None = None
    metadata: dict[str, Any] | None = None


class CountTokensRequest(MessagesRequest):
    """``/v1/messages/count_tokens``: a Messages request without max_tokens."""

    max_tokens: int | None = Field(default=None, ge=1, le=MAX_INT)


# ------------------------------------------------------------------------------------------------ Anthropic responses
class AnthropicUsage(Body):
    input_tokens: int
    output_tokens: int


class MessagesResponse(Body):
    id: str
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[dict[str, Any]]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None
    stop_sequence: str | None = None
    usage: AnthropicUsage


#: OpenAI finish_reason -> Anthropic stop_reason
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "stop_sequence": "stop_sequence"}

#: HTTP status -> Anthropic error type
ANTHROPIC_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                         404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                         429: "rate_limit_error", 503: "overloaded_error"}
#: HTTP status -> OpenAI error type
OPENAI_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                      405: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_exceeded",
                      503: "server_error"}
