"""``lucegen run --model DIR|FILE.gguf --prompt TEXT --max-tokens N``: generate text with :class:`lucegen.LLM`,
streamed to stdout as the tokens arrive; the timings (TTFT, prefill and decode tok/s) go to stderr at the end.

The engine follows the checkpoint: the decode megakernel for a float checkpoint, the quantised target (plain
decoding through one-slot verify passes) for a K-quant GGUF such as Q4_K_M, speculative decoding with ``--draft``
(a DFlash draft: the draft proposes a block per step, a DDTree of at most ``--budget`` nodes is verified in one
target pass; lossless, so only the speed differs), and the numpy reference with ``--device cpu`` (tiny models).
Decoding stops at ``--max-tokens``, at the model's stop tokens, or at a ``--stop`` string. ``--temperature`` above 0
samples (``--top-p``, ``--top-k``, ``--min-p``, penalties; ``--seed`` repeats a run); ``--chat`` sends the prompt as
a user message through the model's chat template (or ``--chat-template-file``)."""

from __future__ import annotations

import sys
from pathlib import Path

from ..errors import LucegenError
from . import check_draft_ring
from ..model.kv_cache import FORMATS as KV_FORMATS


def register(subparsers) -> None:
    p = subparsers.add_parser("run", help="generate text from a checkpoint (GPU engines or --device cpu)",
                              description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="HF checkpoint directory or .gguf file")
    p.add_argument("--prompt", required=True, help="prompt text (with --chat: the user's message)")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens to generate at most (default 64)")
    p.add_argument("--max-context", type=int, default=None,
                   help="KV-cache positions to allocate (default: what the prompt and --max-tokens need)")
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu",
                   help="gpu (default) or cpu: the numpy reference, for tiny models")
    p.add_argument("--target", default=None, help="descriptor to use (default: the one matching the GPU)")
    p.add_argument("--chunk", type=int, default=16,
                   help="greedy steps per launch at most between looks at the tokens (default 16)")
    p.add_argument("--prefill", choices=("kernels", "megakernel"), default="kernels",
                   help="prompt path of the megakernel: the prefill kernels (default) or token by token through "
                        "the megakernel")
    g = p.add_argument_group("sampling (default: greedy)")
    g.add_argument("--temperature", type=float, default=0.0, help="0 (default) is greedy")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus mass in (0, 1] (default 1: off)")
    g.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (default 0: off)")
    g.add_argument("--min-p", type=float, default=0.0, help="keep tokens >= min_p * the top one's (default 0)")
    g.add_argument("--repetition-penalty", type=float, default=1.0, help="HF's repetition penalty (default 1: off)")
    g.add_argument("--presence-penalty", type=float, default=0.0, help="OpenAI's presence penalty (default 0)")
    g.add_argument("--frequency-penalty", type=float, default=0.0, help="OpenAI's frequency penalty (default 0)")
    g.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    g.add_argument("--stop", action="append", default=None, metavar="TEXT",
                   help="stop before this text (repeatable); the model's stop tokens always stop")
    c = p.add_argument_group("chat")
    c.add_argument("--chat", action="store_true", help="send --prompt as a user message through the chat template")
    c.add_argument("--system", default=None, help="with --chat: a system message before it")
    c.add_argument("--no-thinking", action="store_true", help="with --chat: enable_thinking=False for the template")
    c.add_argument("--chat-template-file", type=Path, default=None,
                   help="a Jinja chat template to use instead of the model's")
    d = p.add_argument_group("speculative decoding")
    d.add_argument("--draft", type=Path, default=None,
                   help="DFlash draft (HF directory or .gguf): speculative decoding")
    d.add_argument("--budget", type=int, default=None, help="tree nodes per verify (default: the descriptor's)")
    d.add_argument("--draft-top-k", type=int, default=8, help="draft candidates per position (default 8)")
    d.add_argument("--chain", action="store_true", help="verify the draft's top-1 chain instead of a tree")
    d.add_argument("--draft-ring", type=int, default=None,
                   help="the draft attends to the last N context positions, kept in a ring of N rows per draft layer "
                        "(default: the whole context); bounds the draft's memory at long contexts")
    p.add_argument("--kv-cache", choices=tuple(KV_FORMATS), default=None,
                   help="KV cache format of a quantised target (default: the descriptor's kv_cache_type); q8_0 / "
                        "q4_0 / tq3_0 hold a longer context in the same memory")
    p.set_defaults(func=run)


def _check(args) -> None:
    """The arguments that need no file: one line each, before anything is loaded."""
    from ..api import check_stop_strings
    from ..model.sampling import SamplingParams

    if args.max_tokens < 1:
        raise LucegenError(f"--max-tokens must be at least 1, got {args.max_tokens}")
    if args.chunk < 1:
        raise LucegenError(f"--chunk must be at least 1, got {args.chunk}")
    if args.draft_top_k < 1:
        raise LucegenError(f"--draft-top-k must be at least 1, got {args.draft_top_k}")
    check_draft_ring(args)
    if args.draft and args.prefill != "kernels":
        raise LucegenError("--draft needs --prefill kernels (the draft's context comes from the prefill)")
    if args.device == "cpu" and args.draft:
        raise LucegenError("--draft runs on the GPU (speculative decoding); --device cpu decodes plainly")
    if (args.system or args.no_thinking) and not args.chat:
        raise LucegenError("--system and --no-thinking need --chat")
    args.sampling = dict(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, min_p=args.min_p,
                         repetition_penalty=args.repetition_penalty, presence_penalty=args.presence_penalty,
                         frequency_penalty=args.frequency_penalty, seed=args.seed)
    params = SamplingParams(**args.sampling).validate()
    if args.device == "gpu":
        from ..runtime.device_sampling import checked_sampling

        checked_sampling(params)  # the GPU engines take no penalties
    try:
        check_stop_strings(args.stop)
    except LucegenError as exc:
        raise LucegenError(f"--stop: {exc}") from None


def _prompt_ids(args) -> list[int]:
    """The prompt as the model will see it (rendered through the chat template with --chat), as token ids."""
    from ..api import chat_prompt
    from ..model.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(args.model)
    text = args.prompt
    if args.chat:
        messages = ([{"role": "system", "content": args.system}] if args.system else []) + \
                   [{"role": "user", "content": args.prompt}]
        kwargs = {"enable_thinking": False} if args.no_thinking else {}
        text = chat_prompt(args.model, messages, chat_template=args.chat_template_file, **kwargs)
    ids = tokenizer.encode(text)
    if not ids:
        raise LucegenError("--prompt encodes to no tokens")
    return ids


def run(args) -> int:
    import lucegen

    _check(args)
    prompt = _prompt_ids(args)
    reserve = 0
    device = args.device
    if args.draft:  # a verify pass writes up to budget + 1 rows past the committed position
        from ..runtime.device import Device

        device = Device.open(args.target)
        if args.budget is None:
            args.budget = device.target.ddtree.budget
        reserve = args.budget + 1
    need = len(prompt) + args.max_tokens + reserve
    max_context = args.max_context or need
    if len(prompt) > max_context:
        raise LucegenError(f"the prompt has {len(prompt)} tokens, more than --max-context {max_context}")
    if need - 1 > max_context:
        raise LucegenError(f"prompt ({len(prompt)} tokens) + --max-tokens {args.max_tokens} exceed "
                           f"--max-context {max_context}")
    try:
        llm = lucegen.LLM(args.model, args.draft, target=args.target, device=device, max_context=max_context,
                          kv_cache=args.kv_cache, chat_template=args.chat_template_file, budget=args.budget,
                          draft_top_k=args.draft_top_k, chain=args.chain, draft_ring=args.draft_ring,
                          chunk=args.chunk, prefill=args.prefill)
    except BaseException:
        if device not in ("gpu", "cpu"):
            device.close()
        raise
    with llm:
        if args.draft:
            print(llm.engine.memory_plan(), file=sys.stderr)
        last = None
        generated: list[int] = []
        for piece in llm.stream(prompt, max_tokens=args.max_tokens, stop=args.stop, **args.sampling):
            sys.stdout.write(piece.text)
            sys.stdout.flush()
            generated.extend(piece.token_ids)
            last = piece
        sys.stdout.write("\n")
        stats = ""
        if args.draft:
            s = llm.engine.spec.stats
            stats = f", {s.steps} speculative steps, acceptance length {s.acceptance_length:.2f}"
        shown = " ".join(str(i) for i in generated[:32]) + (" ..." if len(generated) > 32 else "")
        finish = last.finish_reason if last.stop_reason is None else f"{last.finish_reason} ({last.stop_reason!r})"
        print(f"[{len(prompt)} prompt tokens, {len(generated)} generated on {llm.engine.name}{stats}; "
              f"finish: {finish}; ids: {shown}]", file=sys.stderr)
        print(f"[{last.timings.format()}]", file=sys.stderr)
    if device not in ("gpu", "cpu"):
        device.close()
    return 0
