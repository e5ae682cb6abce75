"""``lucegen serve MODEL``: an OpenAI- and Anthropic-compatible HTTP server (uvicorn + FastAPI) over lucegen.LLM:
/v1/chat/completions, /v1/completions, /v1/messages, /v1/models, /health, /metrics.

``--slots N`` sequences generate at once (the CPU engine; a GPU engine holds one sequence, so one slot there),
further requests wait in a FIFO queue of ``--queue-size`` (429 beyond it). SIGINT / SIGTERM stop accepting, give the
requests in flight ``--shutdown-timeout`` seconds to finish, cancel the rest and free the engine."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from ..errors import LucegenError

#: the serve extra's packages (pyproject.toml), checked before the model loads
SERVE_PACKAGES = ("fastapi", "uvicorn", "pydantic", "prometheus_client")


def register(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve a model over HTTP (OpenAI and Anthropic APIs)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("model", type=Path, help="HF checkpoint directory or .gguf file")
    p.add_argument("--draft", type=Path, default=None, help="DFlash draft (directory or .gguf): speculative decoding")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument("--model-name", default=None, help="the model id clients send (default: the checkpoint's name)")
    p.add_argument("--max-context", type=int, default=None, help="positions per sequence (prompt + completion)")
    p.add_argument("--slots", type=int, default=1, help="sequences generating at once (default 1)")
    p.add_argument("--queue-size", type=int, default=64, help="requests that may wait for a slot (default 64)")
    p.add_argument("--chat-template-file", type=Path, default=None, help="a Jinja chat template instead of the "
                   "model's")
    p.add_argument("--api-key", default=None, help="require this key (Authorization: Bearer KEY or x-api-key)")
    p.add_argument("--think-max-tokens", type=int, default=None,
                   help="thinking budget: close the <think> block after this many tokens")
    p.add_argument("--device", choices=("cpu", "gpu"), default=None, help="default: the GPU if one is visible")
    p.add_argument("--target", default=None, help="descriptor (default: the one matching the GPU)")
    p.add_argument("--max-body-bytes", type=int, default=8 << 20, help="largest request body (default 8 MiB)")
    p.add_argument("--shutdown-timeout", type=float, default=5.0,
                   help="seconds in-flight requests get to finish on SIGINT/SIGTERM (default 5)")
    p.set_defaults(func=run)


def check_args(args) -> None:
    for name in ("slots", "queue_size", "max_body_bytes"):
        if getattr(args, name) < 1:
            raise LucegenError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if not 0 < args.port < 65536:
        raise LucegenError(f"--port must be in 1..65535, got {args.port}")
    if args.think_max_tokens is not None and args.think_max_tokens < 1:
        raise LucegenError(f"--think-max-tokens must be at least 1, got {args.think_max_tokens}")
    if args.shutdown_timeout < 0:
        raise LucegenError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    if args.chat_template_file is not None and not args.chat_template_file.is_file():
        raise LucegenError(f"--chat-template-file {args.chat_template_file}: no such file")


def run(args) -> int:
    check_args(args)
    missing = [name for name in SERVE_PACKAGES if importlib.util.find_spec(name) is None]
    if missing:
        raise LucegenError(f"lucegen serve needs {', '.join(missing)}: pip install 'lucegen[serve]'")
    from ..api import LLM
    from ..serve.app import DrainingUvicorn, Server, ServeOptions

    llm = LLM(args.model, draft=args.draft, target=args.target, device=args.device, max_context=args.max_context,
              chat_template=args.chat_template_file)
    try:
        if llm.engine.device != "cpu" and args.slots > 1:
            raise LucegenError(f"--slots {args.slots}: {llm.engine.name} holds one sequence at a time; use --slots 1 "
                               "(several slots need the CPU engine)")
        options = ServeOptions(model_name=args.model_name or args.model.name, slots=args.slots,
                               queue_size=args.queue_size, api_key=args.api_key, max_body_bytes=args.max_body_bytes,
                               think_max_tokens=args.think_max_tokens, shutdown_timeout=args.shutdown_timeout)
        server = Server(llm, options)
    except BaseException:
        llm.close()
        raise
    print(f"lucegen serve: {args.model} as {options.model_name!r} on http://{args.host}:{args.port} "
          f"({llm.engine.name}, {args.slots} slots)", file=sys.stderr, flush=True)
    try:
        DrainingUvicorn(server, args.host, args.port).run()
    finally:
        server.close(0)  # nothing left to do when the lifespan's end already closed it
    return 0
