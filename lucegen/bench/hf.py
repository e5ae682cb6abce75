"""The HF transformers baseline model the benchmarks run against: ``Qwen3_5ForCausalLM`` in BF16 on the GPU."""

from __future__ import annotations

from ..errors import LucegenError


def load_hf_model(model_dir):
    """(torch, transformers, model): the checkpoint in ``model_dir`` as HF's BF16 model, on the GPU, in eval mode."""
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise LucegenError(f"the HF baseline needs torch and transformers: {exc}") from None
    model = transformers.Qwen3_5ForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16).cuda().eval()
    return torch, transformers, model
