"""Sampling parameters as the GPU engines take them: which sampling they run on the device, and the kernel arguments
that carry it (the rule is lucegen/model/sampling.py's; the kernels add each token's Gumbel noise where they compute
its logit and keep their argmax reduction)."""

from __future__ import annotations

from ..errors import LucegenError
from ..model.sampling import SamplingParams


def checked_sampling(sampling: SamplingParams | None) -> SamplingParams | None:
    """``sampling`` validated, or None for greedy decoding (None or temperature 0). The penalties need the whole
    sequence, prompt included, which only the CPU engine keeps: refused here."""
    if sampling is None:
        return None
    if not isinstance(sampling, SamplingParams):
        raise LucegenError(f"sampling must be a SamplingParams or None, got {type(sampling).__name__}")
    sampling.validate()
    if sampling.uses_history:
        raise LucegenError("repetition, presence and frequency penalties run on the CPU engine only; the GPU engines "
                           "sample with temperature, top-k, top-p and min-p")
    return None if sampling.greedy else sampling


def fused(sampling: SamplingParams) -> bool:
    """Whether the kernels draw this sampling where they compute the logits (temperature alone: each token's noise
    is its own); the filters (top-k, top-p, min-p) need the whole row first and are drawn on the host from the
    step's logits, one round trip a token."""
    return sampling.top_k == 0 and sampling.top_p == 1 and sampling.min_p == 0
