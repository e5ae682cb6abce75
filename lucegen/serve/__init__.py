"""``lucegen serve``: an OpenAI- and Anthropic-compatible HTTP server over :class:`lucegen.LLM`.

- :mod:`.protocol`: the request and response bodies (pydantic models) of both APIs and their error objects;
- :mod:`.text`: incremental detokenisation, stop strings, the ``<think>`` splitter;
- :mod:`.tool_calls`: the Qwen tool-call parser (``<tool_call>`` JSON and ``<function=...>`` XML forms);
- :mod:`.metrics`: the Prometheus metrics;
- :mod:`.scheduler`: slots, the FIFO queue, the prefix cache, the engine thread;
- :mod:`.app`, :mod:`.openai_routes`, :mod:`.anthropic_routes`: the FastAPI application;
- :mod:`.client_bench`: ``lucegen bench serve``.
"""
