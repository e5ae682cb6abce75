"""Generate text from a checkpoint with lucegen.LLM: on the GPU, or with the numpy reference on the CPU.

The model is a Qwen3.5 checkpoint: a HF directory (safetensors) or a GGUF file. Without --model, the script writes
the random `tiny` preset (0.8 M parameters, with a tokenizer) to a temporary directory, which is what
`lucegen init-weights --preset tiny --format safetensors --out DIR` writes. Random weights make random text; a real
checkpoint makes real text.

lucegen.LLM picks the engine: on an NVIDIA GPU the prompt goes through the generated prefill kernels and the decode
megakernel generates the tokens (the quantised target for a Q4_K_M GGUF); without one, the numpy reference
generates them: lucegen's oracle, slow but exact, and the tokens the GPU engines are tested against. Decoding stops
at --max-tokens or at one of the model's stop tokens; --temperature above 0 samples (--seed repeats a run).

    python examples/generate.py --prompt "def fibonacci(n):" --max-tokens 24
    python examples/generate.py --model /tmp/q08 --prompt "Hello" --max-tokens 32 --temperature 0.7 --seed 1
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import lucegen
from lucegen.cli import main as lucegen_cli


def generate_on_gpu(model: Path, prompt: list[int], max_tokens: int, device=None, **sampling) -> list[int]:
    """The GPU engine lucegen.LLM picks for ``model`` (``device``: an open Device, or the GPU if None)."""
    with lucegen.LLM(model, device=device or "gpu", max_context=len(prompt) + max_tokens) as llm:
        return llm.generate(prompt, max_tokens=max_tokens, **sampling).token_ids


def generate_on_cpu(model: Path, prompt: list[int], max_tokens: int, **sampling) -> list[int]:
    """The numpy reference behind the same interface: prefill, then one step per token, in float32."""
    with lucegen.LLM(model, device="cpu") as llm:
        return llm.generate(prompt, max_tokens=max_tokens, **sampling).token_ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="HF checkpoint directory or .gguf (default: a random tiny model)")
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--temperature", type=float, default=0.0, help="0 (default): greedy")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu", action="store_true", help="use the numpy reference even if there is a GPU")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = Path(scratch) / "tiny"
            lucegen_cli(["init-weights", "--preset", "tiny", "--format", "safetensors", "--out", str(model),
                         "--quiet"])
        device = "cpu" if args.cpu else None  # None: the GPU if one is visible, else the CPU
        with lucegen.LLM(model, device=device) as llm:
            c = llm.generate(args.prompt, max_tokens=args.max_tokens, temperature=args.temperature,
                             seed=args.seed)
            print(f"{len(c.prompt_token_ids)} prompt tokens, {len(c.token_ids)} generated on {llm.engine.name}: "
                  f"{c.token_ids}")
            print(f"finish: {c.finish_reason}; {c.timings.format()}")
            print(args.prompt + c.text)


if __name__ == "__main__":
    main()
