"""From a validated request to a :class:`~.generation.GenerationSpec`: the API's sampling fields as a
SamplingParams, the prompt (the chat template rendered, or the text / ids given) checked against the context,
the stop strings and stop tokens, tools, and whether the prompt opened a think block (and its budget)."""

from __future__ import annotations

import json
import secrets

from ..api import check_stop_strings
from ..model.sampling import SamplingParams
from .http import ApiError
from .generation import GenerationSpec
from .scheduler import ThinkBudget
from .think import THINK_CLOSE, THINK_OPEN

#: temperatures below this are greedy (vLLM's rule): dividing float32 logits by less overflows them
GREEDY_BELOW = 1e-5

#: what the server forces when the thinking budget runs out
THINK_CLOSE_TEXT = "\n" + THINK_CLOSE + "\n\n"


def sampling_params(engine, temperature=None, top_p=None, top_k=None, min_p=None, seed=None, presence_penalty=None,
                    frequency_penalty=None, repetition_penalty=None) -> SamplingParams:
    """The API's defaults: temperature 1, top-p 1, no top-k / min-p / penalties; no seed draws a random one. A
    negative seed (OpenAI allows them) is taken modulo 2**64; top_k -1 or 0 turns top-k off; a temperature below
    :data:`GREEDY_BELOW` is greedy."""
    if seed is None:
        seed = secrets.randbits(64)
    temperature = 1.0 if temperature is None else float(temperature)
    params = SamplingParams(
        temperature=0.0 if temperature < GREEDY_BELOW else temperature,
        top_p=1.0 if top_p is None else float(top_p),
        top_k=0 if top_k is None or top_k < 0 else int(top_k),
        min_p=0.0 if min_p is None else float(min_p),
        seed=int(seed) % 2**64,
        presence_penalty=0.0 if presence_penalty is None else float(presence_penalty),
        frequency_penalty=0.0 if frequency_penalty is None else float(frequency_penalty),
        repetition_penalty=1.0 if repetition_penalty is None else float(repetition_penalty),
    ).validate()
    engine.check_params(params)  # an engine that decodes greedily only refuses a temperature
    return params


def check_text(text: str, where: str) -> None:
    """Text must be encodable as UTF-8 (JSON can carry lone surrogates, which no tokenizer takes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{where}: the text holds a lone surrogate at character {exc.start}", where) from None


def encode(server, prompt, where: str = "prompt") -> list[int]:
    if isinstance(prompt, str):
        check_text(prompt, where)
    return server.llm.encode(prompt)


def max_new_tokens(server, prompt_tokens: int, requested: int | None) -> int:
    """``requested`` (None: as many as fit), at most the room the context leaves after the prompt: a larger request
    (agent clients ask for tens of thousands) ends with finish_reason "length" where the context ends. A prompt
    that leaves no room is a 400 with the counts."""
    engine = server.llm.engine
    context = engine.max_context
    room = context - engine.reserve - prompt_tokens
    if room < 1:
        raise ApiError(400, f"This model's maximum context length is {context} tokens; the prompt has "
                            f"{prompt_tokens} tokens, leaving no room for a completion", "messages",
                       "context_length_exceeded")
    return room if requested is None else min(requested, room)


def stop_strings(stop) -> tuple[str, ...]:
    stops = check_stop_strings(stop)
    for s in stops:
        check_text(s, "stop")
    return stops


def tool_arguments(arguments):
    """A message's tool-call arguments as the template wants them: a dict (OpenAI sends a JSON string)."""
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments)
        except ValueError:
            return arguments
        return parsed if isinstance(parsed, dict) else arguments
    return arguments


#: template variables a request's chat_template_kwargs may not set
RESERVED_TEMPLATE_VARIABLES = frozenset({"messages", "tools", "documents", "add_generation_prompt", "special_tokens"})


def render_chat(server, messages: list[dict], tools, template_kwargs: dict) -> tuple[str, list[int]]:
    """The chat template rendered for a request (both APIs), and its token ids."""
    reserved = RESERVED_TEMPLATE_VARIABLES.intersection(template_kwargs)
    if reserved:
        raise ApiError(400, f"chat_template_kwargs may not set {sorted(reserved)[0]!r}", "chat_template_kwargs")
    check_text(_all_text(messages), "messages")
    check_text(_all_text(tools), "tools")
    check_text(_all_text(template_kwargs), "chat_template_kwargs")
    text = server.llm.apply_chat_template(messages, tools=tools or None, **template_kwargs)
    return text, server.llm.encode(text)


def chat_spec(server, messages: list[dict], *, tools, template_kwargs: dict, max_tokens, params, stop,
              think_budget: int | None) -> GenerationSpec:
    """Render the chat template and build the spec of a chat request (both APIs)."""
    text, prompt = render_chat(server, messages, tools, template_kwargs)
    in_think = text.rstrip(" ").endswith((THINK_OPEN, THINK_OPEN + "\n"))
    budget = think_budget if think_budget is not None else server.options.think_max_tokens
    think = None
    if budget is not None:
        think = ThinkBudget(budget, server.llm.tokenizer.encode(THINK_CLOSE_TEXT), in_think)
    return _spec(server, prompt, max_tokens, params, stop, tools=tools or None, in_think=in_think, think_budget=think)


def completion_spec(server, prompt, *, max_tokens, params, stop) -> GenerationSpec:
    """Encode the prompt (text or token ids) and build the spec of a completion request: no template, and the
    output is not split into reasoning and content."""
    ids = encode(server, prompt)
    return _spec(server, ids, max_tokens, params, stop, split_thinking=False)


def _spec(server, prompt: list[int], max_tokens, params, stop, **options) -> GenerationSpec:
    """The spec with the room the context leaves, the model's stop tokens and the request's checked stop strings."""
    return GenerationSpec(prompt, max_new_tokens(server, len(prompt), max_tokens), params,
                          server.llm.stop_token_ids, stop_strings(stop), **options)


def _all_text(value) -> str:
    """Every string inside a JSON-like value, joined (to check it once for lone surrogates)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return "".join(_all_text(k) + _all_text(v) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return "".join(_all_text(v) for v in value)
    return ""
