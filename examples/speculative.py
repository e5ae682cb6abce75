"""Speculative decoding with a DFlash draft (needs an NVIDIA GPU), checked against plain greedy decoding.

Each step, the draft proposes a block of tokens with its top-k candidates per position. A DDTree of at most
`budget` nodes is built from them, the target verifies the whole tree in one pass, and the longest path the target
agrees with is committed, plus the target's own next token. The output is the target's greedy output token for
token; a good draft only makes it faster. This script runs plain greedy decoding through the same verifier first,
then the speculative run, and checks that the two agree.

Without --model/--draft it writes the random `tiny-q` preset as a Q4_K_M GGUF (the quantised target, which keeps its
weights in GGML blocks on the GPU, as for the 27B) and its random `dflash-tiny-q` draft to a temporary directory. A
random draft is rarely right, so its acceptance length stays near 1. With the 27B:

    lucegen init-weights --preset qwen3.5-27b --format gguf --quant q4_k_m --out /tmp/q27.gguf
    lucegen init-weights --preset dflash-qwen3.5-27b --out /tmp/d27
    python examples/speculative.py --model /tmp/q27.gguf --draft /tmp/d27 --budget 22

Without a GPU the script says so and exits (`lucegen plan` shows such an engine's memory plan on the CPU).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from lucegen.cli import main as lucegen
from lucegen.errors import DeviceError
from lucegen.model.tokenizer import load_tokenizer


def speculative_and_greedy(model: Path, draft_path: Path, prompt: list[int], n: int, budget: int | None = None,
                           device=None):
    """(speculative tokens, greedy tokens, acceptance length) of ``n`` tokens after ``prompt``."""
    from lucegen.runtime.device import Device
    from lucegen.runtime.dflash import SpecDecoder
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import open_target
    from lucegen.runtime.tree_verify import TreeVerifier

    device = device or Device.open()  # the GPU and the descriptor that matches it
    budget = budget or device.target.ddtree.budget
    # a verify pass writes up to budget + 1 rows past the committed position
    # a K-quant GGUF stays quantised (QuantDecoder); a BF16 checkpoint runs on the megakernel decoder's weights
    target = open_target(model, max_context=len(prompt) + n + budget + 1, device=device)
    draft = DFlashDrafter(target, draft_path, k=8)
    prefiller = Prefiller(target, draft=draft)  # the prompt's hidden states become the draft's context
    verifier = TreeVerifier(target, budget=budget, draft=draft)

    prefiller.prefill(prompt)
    greedy = verifier.greedy(n)  # one-slot passes: what the speculative run must emit
    target.reset()
    draft.reset()
    prefiller.prefill(prompt)
    spec = SpecDecoder(verifier, draft)
    tokens = spec.generate(n)
    for part in (verifier, prefiller, draft, target):
        part.close()
    return tokens, greedy, spec.stats.acceptance_length


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="the target: HF directory or .gguf (default: random tiny-q)")
    parser.add_argument("--draft", type=Path, help="a DFlash draft: HF directory or .gguf")
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--budget", type=int, default=None, help="tree nodes per verify (default: the descriptor's)")
    args = parser.parse_args()
    if (args.model is None) != (args.draft is None):
        parser.error("give both --model and --draft, or neither")

    from lucegen.runtime.device import detect

    try:
        detect()
    except DeviceError as exc:
        print(f"skipped: speculative decoding runs on an NVIDIA GPU ({exc})")
        return

    with tempfile.TemporaryDirectory() as scratch:
        model, draft = args.model, args.draft
        if model is None:
            model, draft = Path(scratch) / "tiny-q.gguf", Path(scratch) / "draft"
            lucegen(["init-weights", "--preset", "tiny-q", "--format", "gguf", "--quant", "q4_k_m",
                     "--out", str(model), "--quiet"])
            lucegen(["init-weights", "--preset", "dflash-tiny-q", "--out", str(draft), "--quiet"])
        tokenizer = load_tokenizer(model)
        prompt = tokenizer.encode(args.prompt)
        try:
            tokens, greedy, al = speculative_and_greedy(model, draft, prompt, args.max_tokens, args.budget)
        except DeviceError as exc:  # a GPU without a descriptor, for instance: the error says which to add
            sys.exit(f"speculative.py: {exc}")
        print(args.prompt + tokenizer.decode(tokens))
        print(f"acceptance length {al:.2f} tokens a step; equal to greedy decoding: {tokens == greedy}")
        if tokens != greedy:
            sys.exit("speculative decoding differed from greedy decoding")


if __name__ == "__main__":
    main()
