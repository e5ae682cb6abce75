"""lucegen.LLM on the GPU: each engine emits exactly the tokens of the runtime path it wraps (the megakernel after
the prefill kernels; the quantised target's one-slot passes), stops at a stop token within one chunk of device
steps, repeats a seeded sampled run, and frees every allocation when closed."""

from __future__ import annotations

import pytest

import lucegen
from lucegen.model.checkpoint import load_checkpoint

from gpu_models import checkpoint_dir, gguf_file, gpu_device  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

PROMPT = [3, 17, 29, 41, 5, 60, 7, 88]


def megakernel_tokens(path, n: int) -> list[int]:
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller

    dec = MegakernelDecoder(load_checkpoint(path), device=gpu_device(), max_context=128)
    pre = Prefiller(dec)
    pre.prefill(PROMPT)
    out = dec.generate(n)
    pre.close()
    dec.close()
    return out


def quant_tokens(path, n: int) -> list[int]:
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.quant_target import QuantDecoder
    from lucegen.runtime.tree_verify import TreeVerifier

    dec = QuantDecoder(path, device=gpu_device(), max_context=128)
    pre, ver = Prefiller(dec), TreeVerifier(dec, budget=0)
    pre.prefill(PROMPT)
    out = ver.greedy(n)
    for part in (ver, pre, dec):
        part.close()
    return out


@pytest.mark.parametrize("kind", ["megakernel", "quantised"])
def test_engine_tokens_and_stop_within_a_chunk(kind):
    dev = gpu_device()
    before = dev.allocated
    path = checkpoint_dir("tiny") if kind == "megakernel" else gguf_file("tiny-q")
    want = (megakernel_tokens if kind == "megakernel" else quant_tokens)(path, 40)
    with lucegen.LLM(path, device=dev, max_context=128, chunk=8) as llm:
        c = llm.generate(PROMPT, max_tokens=40, stop_token_ids=[])
        assert c.token_ids == want and c.finish_reason == "length"
        stop = want[12]
        at = want.index(stop)
        s = llm.generate(PROMPT, max_tokens=40, stop_token_ids=[stop])
        assert s.token_ids == want[:at] and s.finish_reason == "stop" and s.stop_reason == stop
        assert llm.engine.decoder.position - len(PROMPT) < at + 8  # at most one chunk of steps past the stop
        a = llm.generate(PROMPT, max_tokens=16, temperature=0.9, top_k=40, seed=11, stop_token_ids=[])
        b = llm.generate(PROMPT, max_tokens=16, temperature=0.9, top_k=40, seed=11, stop_token_ids=[])
        assert a.token_ids == b.token_ids and len(a.token_ids) == 16
        assert c.timings.decode_tok_s > 0
    assert dev.allocated == before


@pytest.mark.parametrize("sampling", [{}, dict(temperature=0.8, seed=5), dict(temperature=0.8, top_k=20, seed=5)])
def test_cpu_and_gpu_engines_agree_on_the_first_tokens(sampling):
    """The reference and the megakernel agree on a tiny model while the margins are wide (the first 4 tokens),
    greedy, sampled on the device (temperature alone) and sampled on the host (top-k): a draw is a function of the
    seed and the token's position on every engine."""
    path = checkpoint_dir("tiny")
    with lucegen.LLM(path, device="cpu") as cpu, lucegen.LLM(path, device=gpu_device(), max_context=64) as gpu:
        assert cpu.generate(PROMPT, max_tokens=4, stop_token_ids=[], **sampling).token_ids == \
            gpu.generate(PROMPT, max_tokens=4, stop_token_ids=[], **sampling).token_ids


def test_speculative_engine_is_the_plain_engines_tokens():
    """LLM with a draft emits the quantised target's own greedy tokens (lossless), and stops at a stop token
    within the step that emitted it."""
    from gpu_models import draft_dir

    path = gguf_file("tiny-q")
    want = quant_tokens(path, 40)
    with lucegen.LLM(path, draft_dir("dflash-tiny-q"), device=gpu_device(), max_context=160, budget=8) as llm:
        c = llm.generate(PROMPT, max_tokens=40, stop_token_ids=[])
        assert c.token_ids == want and c.timings.acceptance_length >= 1
        stop = want[20]
        at = want.index(stop)
        s = llm.generate(PROMPT, max_tokens=40, stop_token_ids=[stop])
        assert s.token_ids == want[:at] and s.finish_reason == "stop"
