"""Generate text from a checkpoint: greedy decoding on the GPU, or with the numpy reference on the CPU.

The model is a Qwen3.5 checkpoint: a HF directory (safetensors) or a GGUF file. Without --model, the script writes
the random `tiny` preset (0.8 M parameters, with a tokenizer) to a temporary directory, which is what
`lucegen init-weights --preset tiny --format safetensors --out DIR` writes. Random weights make random text; a real
checkpoint makes real text.

On an NVIDIA GPU the prompt goes through the generated prefill kernels, and the decode megakernel generates the
tokens (what `lucegen run` does). Without one, the numpy reference generates them: lucegen's oracle, slow but exact,
and the tokens the GPU engines are tested against.

    python examples/generate.py --prompt "def fibonacci(n):" --max-tokens 24
    python examples/generate.py --model /tmp/q08 --prompt "Hello" --max-tokens 32      # any checkpoint
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from lucegen.cli import main as lucegen
from lucegen.errors import DeviceError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.tokenizer import load_tokenizer


def generate_on_gpu(model: Path, prompt: list[int], max_tokens: int, device=None) -> list[int]:
    """The prompt through the prefill kernels, then the megakernel's greedy steps (``device``: the GPU if None)."""
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller

    decoder = MegakernelDecoder(load_checkpoint(model), max_context=len(prompt) + max_tokens, device=device)
    prefiller = Prefiller(decoder)
    prefiller.prefill(prompt)  # fills the KV cache and the DeltaNet states; decoder.next_token is the first token
    tokens = decoder.generate(max_tokens)
    prefiller.close()
    decoder.close()
    return tokens


def generate_on_cpu(model: Path, prompt: list[int], max_tokens: int) -> list[int]:
    """The numpy reference: prefill, then greedy steps, in float32."""
    from lucegen.model.reference import Reference

    checkpoint = load_checkpoint(model)
    return Reference(checkpoint.config, checkpoint).greedy(prompt, max_tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="HF checkpoint directory or .gguf (default: a random tiny model)")
    parser.add_argument("--prompt", default="def fibonacci(n):")
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--cpu", action="store_true", help="use the numpy reference even if there is a GPU")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as scratch:
        model = args.model
        if model is None:
            model = Path(scratch) / "tiny"
            lucegen(["init-weights", "--preset", "tiny", "--format", "safetensors", "--out", str(model), "--quiet"])
        tokenizer = load_tokenizer(model)
        prompt = tokenizer.encode(args.prompt)
        tokens, where = None, "the numpy reference (CPU)"
        if not args.cpu:
            try:
                tokens, where = generate_on_gpu(model, prompt, args.max_tokens), "the GPU"
            except DeviceError as exc:
                print(f"not on a GPU ({exc}); generating with the numpy reference")
        if tokens is None:
            tokens = generate_on_cpu(model, prompt, args.max_tokens)
        print(f"{len(prompt)} prompt tokens, {len(tokens)} generated on {where}: {tokens}")
        print(args.prompt + tokenizer.decode(tokens))


if __name__ == "__main__":
    main()
