"""``lucegen run --model DIR|FILE.gguf --prompt TEXT --max-tokens N``: the prompt through the prefill kernels, then
greedy decoding with the megakernel from the state they leave, streamed to stdout as the tokens arrive."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import LucegenError


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="generate text greedily with the decode megakernel",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="HF checkpoint directory or .gguf file")
    p.add_argument("--prompt", required=True, help="prompt text")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate (default 64)")
    p.add_argument("--max-context", type=int, default=None,
                   help="KV-cache positions to allocate (default: prompt + max-tokens)")
    p.add_argument("--target", default=None, help="descriptor to use (default: the one matching the GPU)")
    p.add_argument("--chunk", type=int, default=16, help="decode steps per launch between streamed outputs")
    p.add_argument("--prefill", choices=("kernels", "megakernel"), default="kernels",
                   help="prompt path: the prefill kernels (default) or token by token through the megakernel")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..model.checkpoint import load_checkpoint
    from ..model.tokenizer import load_tokenizer
    from ..runtime.megakernel import MegakernelDecoder

    if args.max_tokens < 1:
        raise LucegenError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.chunk < 1:
        raise LucegenError(f"--chunk must be at least 1, got {args.chunk}")
    tokenizer = load_tokenizer(args.model)
    prompt = tokenizer.encode(args.prompt)
    if not prompt:
        raise LucegenError("--prompt encodes to no tokens")
    need = len(prompt) + args.max_tokens
    max_context = args.max_context or need
    if len(prompt) > max_context:
        raise LucegenError(f"the prompt has {len(prompt)} tokens, more than --max-context {max_context}")
    if need - 1 > max_context:
        raise LucegenError(f"prompt ({len(prompt)} tokens) + --max-tokens {args.max_tokens} exceed "
                           f"--max-context {max_context}")
    checkpoint = load_checkpoint(args.model)
    decoder = MegakernelDecoder(checkpoint, target=args.target, max_context=max_context)
    generated: list[int] = []
    printed = ""
    eos = tokenizer.eos_id

    def emit(ids):
        nonlocal printed
        generated.extend(ids)
        stop = eos in generated if eos is not None else False
        text = tokenizer.decode(generated[: generated.index(eos)] if stop else generated)
        sys.stdout.write(text[len(printed):])
        sys.stdout.flush()
        printed = text

    if args.prefill == "kernels":
        from ..runtime.prefill.runner import Prefiller

        prefiller = Prefiller(decoder)
        prefiller.prefill(prompt)
        prefiller.close()
    else:
        decoder.prefill(prompt)
    decoder.generate(args.max_tokens, emit, chunk=args.chunk)
    sys.stdout.write("\n")
    shown = " ".join(str(i) for i in generated[:32]) + (" ..." if len(generated) > 32 else "")
    print(f"[{len(prompt)} prompt tokens, {len(generated)} generated on {decoder.device.target.name}; ids: {shown}]",
          file=sys.stderr)
    decoder.close()
    return 0
