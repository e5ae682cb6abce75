"""The DFlash draft network on the GPU (lucegen/runtime/draft.py) against the numpy DraftReference.

- **Numbers.** After a prefill (prompts longer than one capture, so the context arrives in several segments) and
  after speculative steps whose commits keep whole tree paths (an oracle, corrupted so that trees take rank-1
  siblings, proposes; the network drafts alongside and ingests every commit), the device draft's top-k rows are
  checked against DraftReference fed the numpy target's tapped hidden states of the same committed tokens: the
  log-probabilities of the device's tokens within a bound, its top-1 equal to the reference's where the
  reference's margin exceeds that bound. A ring smaller than the context is checked too (the reference's window).
- **Lossless.** Speculative decoding with the draft network proposing must emit exactly the verifier's greedy
  tokens (its random weights accept little: the commit is mostly the bonus token).
- **Q8_0 drafts.** ``tiny-q8`` is the ``tiny-q`` pair with the draft written as a Q8_0 GGUF: its matrices stay in
  blocks on the device (QuantDraftWeights, the quantised GEMM); its reference runs the dequantised weights.

Pairs: ``tiny`` (BF16 target, ``dflash-tiny``), ``tiny-q`` (the tiny-q preset as a Q4_K_M GGUF on the quantised
target, ``dflash-tiny-q``: the draft gathers the GGML embedding and runs the quantised lm_head; its reference is the
numpy Reference of the dequantised weights) and, with LUCEGEN_08B_DIR, the 0.8B.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen.errors import CheckpointError, LucegenError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.dflash import load_dflash_directory
from lucegen.model.dflash_reference import DraftReference, log_softmax_topk
from lucegen.model.reference import Reference
from lucegen.runtime.dflash import ControlledDrafter, OracleDrafter, SpecDecoder

from gpu_models import checkpoint_dir, draft_dir, draft_gguf, gguf_file, gpu_device  # tests/gpu/gpu_models.py

pytestmark = pytest.mark.gpu

PAIRS = {"tiny": ("tiny", "dflash-tiny"), "tiny-q": ("tiny-q", "dflash-tiny-q"),
         "tiny-q8": ("tiny-q", "dflash-tiny-q"), "0.8b": ("qwen3.5-0.8b", "dflash-qwen3.5-0.8b")}
QUANTISED = {"tiny-q", "tiny-q8"}  # the target preset written as a Q4_K_M GGUF, loaded by QuantDecoder
Q8_DRAFTS = {"tiny-q8"}  # the draft written as a Q8_0 GGUF, its matrices kept in blocks (QuantDraftWeights)
SMALL = ["tiny", "tiny-q", "tiny-q8"]  # the pairs every test runs on
BUDGET = 16
ROWS = 64  # capture rows: prompts past 64 tokens prefill in several segments
#: |device - reference| log-probability of the device's top-k tokens (the target's hidden states differ by the
#: prefill's bounds first, then the draft adds its own bf16 rounding)
LP_TOL = {"tiny": 0.05, "tiny-q": 0.05, "tiny-q8": 0.05, "0.8b": 0.15}


def engine(pair: str, ring: int | None = None):
    """(decoder, drafter, prefiller, verifier) of ``pair`` with a context ring of ``ring`` rows (None: the whole
    context), built once per (pair, ring)."""
    return _engine(pair, ring)


@functools.cache
def _engine(pair: str, ring: int | None):
    from lucegen.runtime.draft import DFlashDrafter
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.tree_verify import TreeVerifier

    target, draft = PAIRS[pair]
    if pair in QUANTISED:
        from lucegen.runtime.quant_target import QuantDecoder

        dec = QuantDecoder(gguf_file(target), device=gpu_device(), max_context=512)
    else:
        path = os.environ.get("LUCEGEN_08B_DIR") if pair == "0.8b" else None
        dec = MegakernelDecoder(load_checkpoint(path or str(checkpoint_dir(target))), device=gpu_device(),
                                max_context=512)
    drafter = DFlashDrafter(dec, draft_path(pair), k=4, ring=ring, rows=ROWS)
    if pair in Q8_DRAFTS:
        from lucegen.runtime.draft_weights import QuantDraftWeights

        assert isinstance(drafter.weights, QuantDraftWeights)
    return dec, drafter, Prefiller(dec, draft=drafter), TreeVerifier(dec, budget=BUDGET, draft=drafter)


@functools.cache
def references(pair: str, ring: int | None) -> tuple[Reference, DraftReference]:
    dec, drafter = engine(pair, ring)[:2]
    dtype = dec.target.compute_dtype
    ref = Reference(dec.config, dec.checkpoint, gemm_inputs=dtype, int8_inputs=dec.int8_weights)
    return ref, DraftReference(drafter.config, drafter.checkpoint, ref.w["embed_tokens.weight"], ref.lm_head,
                               gemm_inputs=dtype, window=ring)


def start(pair: str, prompt, ring=None) -> int:
    dec, drafter, pre, _ = engine(pair, ring)
    dec.reset()
    drafter.reset()
    return pre.prefill(prompt)


def check_rows(pair: str, ring, committed, root: int, history) -> dict:
    """The device draft's rows after ``committed`` tokens (root next) against the reference's."""
    dec, drafter = engine(pair, ring)[:2]
    ref, dref = references(pair, ring)
    assert dec.position == len(committed)
    _, hidden = ref.forward(committed, ref.new_state(dec.max_context), hidden_layers=drafter.taps, logits="none")
    ctx = dref.new_context()
    dref.add_context(ctx, dref.features(hidden), np.arange(len(committed)))
    want = dref.block_logits(ctx, root, len(committed))
    want_lp, want_tok = log_softmax_topk(want, want.shape[1])  # every token, ranked
    lp, tok = drafter.propose(history)
    assert lp.shape == tok.shape == (drafter.depth, drafter.k)
    assert np.all(np.diff(lp, axis=1) <= 0), "rows sorted best first"
    full = np.empty_like(want_lp)
    np.put_along_axis(full, want_tok, want_lp, axis=1)  # reference log-probabilities by token id
    err = float(np.abs(lp - np.take_along_axis(full, tok, axis=1)).max())
    tol = LP_TOL[pair]
    decided = want_lp[:, 0] - want_lp[:, 1] > 2 * tol
    assert err <= tol, f"log-probability error {err:.4f} > {tol}"
    assert np.array_equal(tok[decided, 0], want_tok[decided, 0]), "top-1 where the reference is sure"
    return {"err": round(err, 4), "decided": int(decided.sum())}


@pytest.mark.parametrize("pair", SMALL)
@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(length=st.integers(1, 200), seed=st.integers(0, 2**16), ring=st.sampled_from([None, 9]))
def test_draft_after_prefill_matches_reference(pair, length, seed, ring):
    dec = engine(pair, ring)[0]
    prompt = np.random.default_rng(seed).integers(0, dec.config.vocab_size, length)
    root = start(pair, prompt, ring)
    print(check_rows(pair, ring, list(prompt), root, [root]))


@pytest.mark.parametrize("pair", SMALL)
@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(length=st.integers(1, 100), seed=st.integers(0, 2**16), tree=st.booleans(),
       corrupt=st.frozensets(st.integers(1, 60), max_size=8))
def test_draft_after_spec_steps_matches_reference(pair, length, seed, tree, corrupt):
    dec, drafter, _, ver = engine(pair)
    prompt = [int(t) for t in np.random.default_rng(seed).integers(0, dec.config.vocab_size, length)]
    start(pair, prompt)
    truth = ver.greedy(80)
    history = [start(pair, prompt)]
    oracle = OracleDrafter(truth, dec.config.vocab_size, depth=drafter.depth, k=4, corrupt=corrupt, seed=seed)
    spec = SpecDecoder(ver, ControlledDrafter(drafter, oracle), tree=tree)
    while len(history) < 48:
        history += spec.step(history)
    assert history == truth[: len(history)]
    assert max(spec.stats.accepted) > 1, "commits of whole paths"
    print(check_rows(pair, None, prompt + history[:-1], history[-1], history))


def lossless(pair: str, length: int, n: int, seed: int) -> float:
    dec, drafter, _, ver = engine(pair)
    prompt = np.random.default_rng(seed).integers(0, dec.config.vocab_size, length)
    start(pair, prompt)
    want = ver.greedy(n)
    start(pair, prompt)
    spec = SpecDecoder(ver, drafter, tree=True)
    assert spec.generate(n) == want
    return spec.stats.acceptance_length


@pytest.mark.parametrize("pair", SMALL)
@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(length=st.integers(1, 150), seed=st.integers(0, 2**16))
def test_spec_decoding_with_the_draft_is_lossless(pair, length, seed):
    print("AL", lossless(pair, length, 40, seed))


@pytest.mark.skipif(not os.environ.get("LUCEGEN_08B_DIR"), reason="set LUCEGEN_08B_DIR to a 0.8B checkpoint")
def test_draft_08b():
    dec = engine("0.8b")[0]
    prompt = np.random.default_rng(5).integers(0, dec.config.vocab_size, 100)
    root = start("0.8b", prompt)
    print(check_rows("0.8b", None, list(prompt), root, [root]))
    print("AL", lossless("0.8b", 32, 24, 3))


def test_bad_pairs_and_out_of_step_contexts():
    from lucegen.runtime.draft import DFlashDrafter

    dec, drafter, pre, _ = engine("tiny")
    start("tiny", [1, 2, 3])
    dec.reset()
    with pytest.raises(LucegenError, match="draft context holds 3 positions"):
        drafter.propose([5])
    with pytest.raises(LucegenError, match="reset both together"):
        pre.prefill([1, 2])
    drafter.reset()
    with pytest.raises(LucegenError, match="draft k must be"):
        DFlashDrafter(dec, drafter.checkpoint, k=99)
    other = load_checkpoint(str(checkpoint_dir("tiny-gqa")))
    from lucegen.runtime.megakernel import MegakernelDecoder
    gqa = MegakernelDecoder(other, device=gpu_device(), max_context=64)
    try:
        with pytest.raises(CheckpointError, match="num_target_layers 4: the target has 8 layers"):
            DFlashDrafter(gqa, load_dflash_directory(draft_dir("dflash-tiny")))
    finally:
        gqa.close()
    with pytest.raises(CheckpointError, match="hidden_size 128 does not match the target's 256"):
        DFlashDrafter(engine("tiny-q")[0], drafter.checkpoint)  # the quantised target: the same pair checks


def model_path(pair: str) -> str:
    target = PAIRS[pair][0]
    return str(gguf_file(target) if pair in QUANTISED else checkpoint_dir(target))


def draft_path(pair: str) -> str:
    draft = PAIRS[pair][1]
    return str(draft_gguf(draft) if pair in Q8_DRAFTS else draft_dir(draft))


@pytest.mark.parametrize("pair", SMALL)
def test_cli_run_with_draft(capsys, pair):
    from lucegen.cli import main

    code = main(["run", "--model", model_path(pair), "--draft", draft_path(pair),
                 "--prompt", "def f(x):", "--max-tokens", "20", "--budget", "8"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "20 generated" in err and "speculative steps, acceptance length" in err, err


def test_cli_bench_dflash_with_draft_on_the_quantised_target(capsys):
    """``lucegen bench dflash --model FILE.gguf --draft DIR``: the network runs every step on the quantised target
    (the bench raises if any acceptance-controlled run is not lossless)."""
    from lucegen.cli import main

    code = main(["bench", "dflash", "--model", model_path("tiny-q"), "--draft", str(draft_dir("dflash-tiny-q")),
                 "--prompt-tokens", "8", "--gen-tokens", "24", "--repeats", "1", "--budgets", "0", "4"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "drafter: DFlash" in captured.out and "draft forward" in captured.out, captured.out
