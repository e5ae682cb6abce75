"""``lucegen serve``: an OpenAI- and Anthropic-compatible HTTP server over :class:`lucegen.LLM`.

- :mod:`.protocol`: the request and response bodies (pydantic models) of both APIs;
- :mod:`.http`: the API key, the body read within its size limit, the model name, the error objects;
- :mod:`.think` and :mod:`.tool_calls`: the ``<think>`` splitter and Qwen's tool-call parser;
- :mod:`.metrics`: the Prometheus metrics;
- :mod:`.scheduler`: slots, the FIFO queue, the prefix cache, the engine thread;
- :mod:`.generation`: one request's tokens carried to the event loop and through the text pipeline;
- :mod:`.prepare`: a validated request as a generation (sampling, prompt, context, stops, thinking);
- :mod:`.replies`: a generation started, collected or streamed as server-sent events (both APIs);
- :mod:`.app`, :mod:`.openai_routes`, :mod:`.anthropic_routes`: the FastAPI application and uvicorn server.

``lucegen bench serve`` (the client side) is :mod:`lucegen.bench.serve`.
"""
