"""DDTree verify and greedy speculative decoding on the GPU (lucegen/runtime/tree_verify.py, runtime/dflash.py).

Two kinds of check:

- **Numbers.** Every slot of a verified tree against the numpy Reference run along that slot's path alone (a copy
  of the prompt's state, then the path's tokens one sequence): the slot's logits, and after committing a path, the
  decoder's DeltaNet states, conv windows and KV cache against the Reference's state after that path. The bounds
  are the prefill's (tests/gpu/test_prefill.py: the verify is the prefill's layer loop, bf16 GEMM inputs, held to
  ``Reference(gemm_inputs=bf16)``).
- **Lossless.** Greedy decoding through one-slot trees (``TreeVerifier.greedy``) against speculative runs through
  the same verifier, token for token, with the random drafter (nearly nothing accepted), the oracle drafter (the
  greedy continuation itself: nearly everything accepted, long commits) and the oracle corrupted at hypothesis-
  chosen positions (rejections mid-tree; a tree still finds the true token at rank 1, a chain cannot), chain and
  tree verify. Equality is exact: a slot's numbers do not depend on the tree it sits in (module docstring of
  tree_verify.py), so any difference is a bug in the tree kernels, the commit or the loop.
"""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from lucegen.errors import LucegenError
from lucegen.model.checkpoint import load_checkpoint
from lucegen.model.reference import Reference
from lucegen.runtime import ddtree
from lucegen.runtime.dflash import OracleDrafter, RandomDrafter, SpecDecoder
from lucegen.runtime.prefill.runner import MixWrote

from gpu_models import checkpoint_dir, compare, gguf_file, gpu_device, state_errors  # tests/gpu/gpu_models.py
from test_prefill import BOUNDS

pytestmark = pytest.mark.gpu

PRESETS = {"tiny": "tiny", "tiny-gqa": "tiny-gqa", "0.8b": "qwen3.5-0.8b", "tiny-q": "tiny-q",
           "tiny-q-legacy": "tiny-q"}
# GGUF Q4_K_M, loaded by QuantDecoder (tests/gpu/test_quant_target.py): tiny-q in llama.cpp's current mix (F32
# ssm_alpha/ssm_beta, converted to Q8_0 at load), tiny-q-legacy in the older one (every matrix a K-quant)
QUANTISED = {"tiny-q", "tiny-q-legacy", "27b"}
QUANT_MIX = {"tiny-q-legacy": "q4_k_m_legacy"}
BUDGET = 24
# The logits bound (rel, cos) of a quantised KV cache, where a K/V value may sit one code away from the Reference's
# (gpu_models.py): a q4_0 code is an eighth of its block's absmax. Measured worst: rel 0.055, cos 0.99838 (tiny-q,
# a one-token prompt: the one cached row carries the whole attention), on main and on the m1 GEMM alike. A tq3_0
# level is up to 0.81 of its block's rms away from the next; measured worst over 12 random cases (`.exp` probe of
# check_slots, H100, 2026-11-24): rel 0.072, cos 0.9979, beside q4_0's 0.073 / 0.9971 in the same cases.
KV_LOGITS_BOUNDS = {"q4_0": (8e-2, 0.997), "tq3_0": (1.1e-1, 0.995)}
# The bounds (logits rel, cos, states) of a quantised target whose K-quant groups take int8 activations
# ([quant] int8_activations): the Reference rounds the same inputs alike, but an input a float ulp away from the
# Reference's can round to the neighbouring code, a step of 1/127 of its 256 values' absmax, and the steps compound
# through the layers. How far, measured on the Reference against itself (experiments/int8_floor.py: tiny-q, 30 random
# prompts, 6 draws each, the same root token): one code in 2,500 moved to its neighbour (--flip 0.01) leaves the root
# slot's logits at rel 0.080 / 0.207 / 0.312 (median / 99% / max), cos 0.980 / 0.948 (1% / min), and the states after
# it at 0.180 / 0.405 / 0.565; one code in 25,000 (--flip 0.001): rel 0.040 / 0.124 / 0.177, cos 0.9926 / 0.9886,
# states 0.107 / 0.225 / 0.244. The bounds are the 99% of the first. The device's worst so far (H100): rel 0.171,
# cos 0.987 (133 tokens, seed 24020), states 0.207 (a KV k row, 134 tokens). What these bounds cannot see: a fault
# confined to one 256-value block of one int8 input at one token (doubled, zeroed or rotated by a value) moves the
# logits as far from the middle layers on (`experiments/int8_floor.py --faults`, 8 prompts: rel 0.09-0.58, cos
# 0.87-0.995); the int8 GEMMs' rounding is held bit-exact to numpy by tests/gpu/test_quant_gemm.py, the mixers'
# magnitudes by test_mixers_leave_their_outputs_magnitudes below.
INT8_BOUNDS = (2.1e-1, 0.98, 4.1e-1)


def model_of(preset: str) -> tuple[str, str | None]:
    """A preset names a model and, for a quantised target, optionally its KV cache format: "tiny-q/q4_0"."""
    model, _, kv = preset.partition("/")
    return model, kv or None


def engine(preset: str, max_context: int = 640, tensor_core_keys: int | None = None):
    """(decoder, prefiller, verifier) of ``preset``, built once per (preset, max_context, tensor_core_keys); the
    verifier's slots of ``tensor_core_keys`` keys or more attend on tensor cores (None: the descriptor's choice)."""
    return _engine(preset, max_context, tensor_core_keys)


@functools.cache
def _engine(preset: str, max_context: int, tensor_core_keys: int | None):
    from lucegen.runtime.megakernel import MegakernelDecoder
    from lucegen.runtime.prefill.runner import Prefiller
    from lucegen.runtime.tree_verify import TreeVerifier

    preset, kv = model_of(preset)
    if preset in QUANTISED:
        from lucegen.runtime.quant_target import QuantDecoder

        path = (os.environ["LUCEGEN_27B_GGUF"] if preset == "27b"
                else gguf_file(PRESETS[preset], QUANT_MIX.get(preset, "q4_k_m")))
        dec = QuantDecoder(path, device=gpu_device(), max_context=max_context, kv_cache=kv)
        return dec, Prefiller(dec), TreeVerifier(dec, budget=BUDGET, tensor_core_keys=tensor_core_keys)
    assert kv is None, "the megakernel decoder keeps the descriptor's KV cache type"
    path = os.environ.get("LUCEGEN_08B_DIR") if preset == "0.8b" else None
    ckpt = load_checkpoint(path or str(checkpoint_dir(PRESETS[preset])))
    dec = MegakernelDecoder(ckpt, device=gpu_device(), max_context=max_context)
    return dec, Prefiller(dec), TreeVerifier(dec, budget=BUDGET, tensor_core_keys=tensor_core_keys)


def needs_tensor_cores(preset: str) -> None:
    """Skip where the chip renders no tensor-core tree_attention for ``preset``'s model and KV cache."""
    from lucegen.families.tree_verify import attention_tiling

    dec, _, ver = engine(preset)
    if not attention_tiling(ver.pf, dec.target)["ta_mma"]:
        pytest.skip(f"{dec.target.name}: no tensor-core tree_attention for {preset}")


@functools.cache
def reference(preset: str) -> Reference:
    dec = engine(preset)[0]
    return Reference(dec.config, dec.checkpoint, gemm_inputs=dec.target.compute_dtype, kv_cache=dec.kv_format.name,
                     int8_inputs=dec.int8_weights)


def start(preset: str, prompt, tc: int | None = None) -> int:
    """Reset the decoder (of the engine with ``tensor_core_keys=tc``) and prefill ``prompt``; returns the first
    root."""
    dec, pre, _ = engine(preset, tensor_core_keys=tc)
    dec.reset()
    return pre.prefill(prompt)


def random_tree(rng: np.random.Generator, vocab: int, budget: int, shape: tuple[int, int] | None = None) -> ddtree.Tree:
    """A best-first tree over random top-K rows with random (sorted) log-probabilities: random shapes (``shape``:
    depth and K given)."""
    depth, k = shape or (int(rng.integers(1, 8)), int(rng.integers(1, 5)))
    _, tok = RandomDrafter(vocab, depth, k, seed=int(rng.integers(2**31))).propose([])
    lp = -np.cumsum(rng.exponential(1.0, (depth, k)), axis=1)
    return ddtree.build_tree(lp, tok, budget)


@settings(max_examples=6, deadline=None, suppress_health_check=list(HealthCheck))
@given(preset=st.sampled_from(["tiny", "tiny-gqa"]), length=st.integers(1, 300), seed=st.integers(0, 2**16),
       budget=st.integers(0, BUDGET))
@example(preset="tiny-gqa", length=600, seed=7, budget=BUDGET)  # 3 key ranges of tree_attention (over 512 keys)
def test_every_slot_matches_its_path(preset, length, seed, budget):
    check_slots(preset, length, seed, budget)


def check_slots(preset: str, length: int, seed: int, budget: int, tc: int | None = None,
                shape: tuple[int, int] | None = None) -> None:
    """Every slot of a random tree (``shape``: random_tree's) against the Reference along its path; then a commit
    against its state. ``tc``: the verifier's tensor_core_keys. A budget over the engine's verifier's takes a verifier
    of its own on the same decoder."""
    dec, pre, ver = engine(preset, tensor_core_keys=tc)
    if budget > ver.budget:
        from lucegen.runtime.tree_verify import TreeVerifier

        ver = TreeVerifier(dec, budget=budget, tensor_core_keys=tc)
        try:
            _check_slots(preset, length, seed, budget, tc, shape, ver)
        finally:
            ver.close()
    else:
        _check_slots(preset, length, seed, budget, tc, shape, ver)


def _check_slots(preset, length, seed, budget, tc, shape, ver) -> None:
    dec = engine(preset, tensor_core_keys=tc)[0]
    ref = reference(preset)
    rng = np.random.default_rng(seed)
    vocab = dec.config.vocab_size
    prompt = rng.integers(0, vocab, length)
    root = start(preset, prompt, tc)
    state = ref.new_state(dec.max_context)
    ref.forward(prompt, state, logits="none")
    tree = random_tree(rng, vocab, budget, shape)
    argmax, logits = ver.verify(tree, root, logits=True)
    assert np.array_equal(argmax, logits.argmax(axis=1)), "the device argmax is the argmax of its logits"
    model, kv = model_of(preset)
    tol, cos_min, state_tol = BOUNDS[model]["rounded"]
    # independent roundings (a quantised KV cache, int8 activations): their relative errors add in quadrature, their
    # cosine deficits (~ rel^2 / 2) add (measured, tiny-q with both: rel 0.096, cos 0.9942, a one-slot pass)
    sources = (([KV_LOGITS_BOUNDS[kv]] if kv in KV_LOGITS_BOUNDS else [])
               + ([INT8_BOUNDS[:2]] if dec.int8_weights else []))
    if sources:
        tol = max(tol, float(np.sqrt(sum(rel ** 2 for rel, _ in sources))))
        cos_min = min(cos_min, 1.0 - sum(1.0 - cos for _, cos in sources))
    if dec.int8_weights:
        state_tol = max(state_tol, INT8_BOUNDS[2])
    tokens = tree.verify_tokens(root)
    paths = [[]] + [tree.path(i) for i in range(tree.n_nodes)]
    for slot, path in enumerate(paths):
        s = state.copy()
        want = ref.forward(tokens[[0] + [n + 1 for n in path]], s, logits="last")[0]
        c = compare(logits[slot], want)
        assert c["rel"] <= tol and c["cos"] >= cos_min, (slot, path, c)
        if c["decided"]:
            assert argmax[slot] == int(np.argmax(want)), (slot, c)
    # commit a random slot's path: the decoder's state must be the Reference's after that path
    slot = int(rng.integers(tree.n_nodes + 1))
    nodes = paths[slot]
    pos0 = dec.position
    ver.commit(tree, nodes, int(argmax[slot]))
    assert dec.position == pos0 + 1 + len(nodes) and dec.next_token == int(argmax[slot])
    ref.forward(tokens[[0] + [n + 1 for n in nodes]], state, logits="none")
    worst = state_errors(dec.download_state(), state, dec.kv_format)
    bad = {k: v for k, v in worst.items() if v[0] > state_tol}
    assert not bad, f"states off after the commit (relative error, layer): {bad}"


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(preset=st.sampled_from(["tiny", "tiny-gqa"]), length=st.integers(1, 300), seed=st.integers(0, 2**16),
       budget=st.integers(0, BUDGET))
@example(preset="tiny-gqa", length=600, seed=7, budget=BUDGET)  # three key ranges of tree_attention_mma
@example(preset="tiny", length=1, seed=3, budget=BUDGET)  # the root's one committed key, the rest the tree's
def test_every_slot_matches_its_path_on_tensor_cores(preset, length, seed, budget):
    """The same check with every slot on tree_attention_mma (tensor_core_keys=1)."""
    needs_tensor_cores(preset)
    check_slots(preset, length, seed, budget, tc=1)


def test_commit_replays_the_pass_bit_for_bit():
    """The verify keeps each slot's DeltaNet update (g, k, delta), not its state, and the commit replays the accepted
    path's updates over the committed state. What it leaves (states, conv windows, KV rows) equals, bit for bit, what
    one one-slot pass per token of the path leaves: the lossless property rests on it."""
    dec, _, ver = engine("tiny-gqa")
    rng = np.random.default_rng(11)
    vocab = dec.config.vocab_size
    prompt = rng.integers(0, vocab, 9)
    for trial in range(3):
        root = start("tiny-gqa", prompt)
        tree = random_tree(rng, vocab, BUDGET)
        tokens = tree.verify_tokens(root)
        argmax = ver.verify(tree, root)
        slot = int(np.argmax(np.concatenate([[0], tree.depth])))  # a deepest slot
        nodes = [] if slot == 0 else tree.path(slot - 1)
        ver.commit(tree, nodes, int(argmax[slot]))
        by_tree = dec.download_state()
        start("tiny-gqa", prompt)
        empty = ddtree.chain(np.zeros(0, np.int64))
        path_tokens = [int(tokens[0])] + [int(tokens[n + 1]) for n in nodes]
        for i, token in enumerate(path_tokens):
            ver.verify(empty, token)
            ver.commit(empty, [], path_tokens[i + 1] if i + 1 < len(path_tokens) else 0)
        by_steps = dec.download_state()
        assert by_tree["position"] == by_steps["position"]
        for layer, (a, b) in enumerate(zip(by_tree["layers"], by_steps["layers"])):
            for key in a:
                assert np.array_equal(a[key], b[key]), (trial, layer, key, nodes)
    with pytest.raises(LucegenError, match="last verify"):
        ver.commit(empty, [], 0)  # the pass was committed already


@pytest.mark.parametrize("preset, length", [("tiny-gqa", 9), ("tiny-gqa", 600), ("tiny-q", 40)])
def test_packed_attention_gives_the_same_bits(preset, length):
    """tree_attention_packed (several key streams a warp, for passes of many slots) computes tree_attention's sums:
    a verify pass with every attention launch on the one and on the other gives the same logits, bit for bit. The
    tiny presets' passes fit one wave of tree_attention, so the packed kernel is forced here; length 600 splits the
    FMA body's keys into ranges where the chip has no tensor-core body for them."""
    from lucegen.runtime.tree_attention import NEVER
    from lucegen.runtime.tree_verify import TreeVerifier

    dec = engine(preset)[0]
    rng = np.random.default_rng(length)
    vocab = dec.config.vocab_size
    prompt = rng.integers(0, vocab, length)
    tree = random_tree(rng, vocab, BUDGET)
    logits = {}
    for packed in (False, True):
        ver = TreeVerifier(dec, budget=BUDGET, tensor_core_keys=NEVER)
        ver.tree_attention._fma_resident = 0 if packed else NEVER  # every pass on the one kernel
        root = start(preset, prompt)
        _, logits[packed] = ver.verify(tree, root, logits=True)
        ver.close()
    assert np.array_equal(logits[False].view(np.uint32), logits[True].view(np.uint32))


def test_mixers_leave_their_outputs_magnitudes():
    """On a target whose out-projections take int8 activations, the tree kernels that write a layer's token mix
    (tree_gated_norm, tree_attention) also write its magnitudes per 16 values, from which those GEMMs take their int8
    scales (enqueue_layers then launches no quant_gemm_amax): each the largest |value| of its 16, as compute-dtype
    bits. Checked on the last DeltaNet and the last attention layer of a verify pass, each mixer run again."""
    dec, _, ver = engine("tiny-q")
    if not dec.int8_weights:
        pytest.skip(f"{dec.target.name}'s quantised target takes no int8 activations")
    c, d = dec.config, dec.device
    rng = np.random.default_rng(3)
    root = start("tiny-q", rng.integers(0, c.vocab_size, 7))
    tree = random_tree(rng, c.vocab_size, BUDGET)
    S = len(tree.verify_tokens(root))
    ver.verify(tree, root)
    for kind, width in ((0, ver.pf["VD"]), (1, c.num_attention_heads * c.head_dim)):
        layer = [l for l in dec.layout.layers if l.kind == kind][-1]
        with d.alloc(S * width // 8) as amax:
            d.memset(amax)
            wrote = ver._mix(S, ver.tree_attention.bodies(S, dec.position))(layer, S, amax.ptr)
            assert wrote == MixWrote.MAGNITUDES
            ver.stream.synchronize()
            out = d.download(ver.acts.mix, np.uint16, (S * width,)).view(np.float16).reshape(S, width // 16, 16)
            want = np.abs(out).max(axis=-1).view(np.uint16)
            np.testing.assert_array_equal(d.download(amax, np.uint16, (S, width // 16)), want, err_msg=f"kind {kind}")
            assert want.any()


@pytest.mark.parametrize("nodes", [8, 15, 20])
def test_gated_norm_quantises_as_the_gemms_quantiser(nodes):
    """Where the DeltaNet out-projection's launch is prequantised, tree_gated_norm_q8 writes its int8 activations and
    da: byte for byte what quant_gemm_q8_rows makes from tree_gated_norm's rows and magnitudes (zero for the group's
    tokens past the pass), checked on the last DeltaNet layer of a pass; and a whole verify pass gives the same logits
    with the mixers quantising and without, bit for bit."""
    from lucegen.runtime.quant_gemm import Prequantised

    dec, _, ver = engine("tiny-q")
    if ver.norm_q8_fn is None:
        pytest.skip(f"{dec.target.name}: no tree_gated_norm_q8 for tiny-q")
    c, d, gemm = dec.config, dec.device, ver.gemm
    rng = np.random.default_rng(nodes)
    root = start("tiny-q", rng.integers(0, c.vocab_size, 11))
    tree = ddtree.chain(rng.integers(0, c.vocab_size, nodes))
    S, VD = nodes + 1, ver.pf["VD"]
    ver.use_graphs = False
    logits = {}
    for quantise in (False, True):
        ver.mixers_quantise = quantise
        _, logits[quantise] = ver.verify(tree, root, logits=True)
    ver.mixers_quantise, ver.use_graphs = True, True
    assert np.array_equal(logits[False].view(np.uint32), logits[True].view(np.uint32))
    layer = [l for l in dec.layout.layers if l.kind == 0][-1]
    W = ver.weights.matrix(layer.out_mat)
    dest = gemm.prequantised(W, S, ver.acts.mix.ptr, VD)
    assert dest is not None, f"{S} slots: the out-projection's launch is prequantised"
    group_rows = -(-S // dest.group) * dest.group
    mix = ver._mix(S, ver.tree_attention.bodies(S, dec.position))
    sizes = (group_rows * VD, group_rows * VD // 256 * 4)
    with d.alloc(sizes[0]) as aq, d.alloc(sizes[1]) as da, d.alloc(S * VD // 8) as amax:
        got = {}
        for name in ("own", "gemm"):
            for b in (aq, da):
                d.memset(b, 0x5A)
            if name == "own":
                assert mix(layer, S, amax.ptr, Prequantised(aq.ptr, da.ptr, dest.group)) == MixWrote.INT8
            else:
                assert mix(layer, S, amax.ptr) == MixWrote.MAGNITUDES
                gemm._q8_rows(ver.stream, None, A=ver.acts.mix.ptr, lda=VD, a_amax=amax.ptr, M=S, K=VD,
                              group=dest.group, aq=aq.ptr, a_da=da.ptr)
            ver.stream.synchronize()
            got[name] = (d.download(aq, np.uint8, (sizes[0],)), d.download(da, np.uint32, (sizes[1] // 4,)))
        np.testing.assert_array_equal(got["own"][0], got["gemm"][0])
        np.testing.assert_array_equal(got["own"][1], got["gemm"][1])
        assert got["own"][0].any() and got["own"][1].any()


def test_rows_argmax_takes_the_first_of_equal_maxima():
    """rows_argmax (each row split over blocks) as numpy.argmax over finite values: the lowest index among equal
    maxima, wherever they fall among the blocks; NaN never wins; a row of -inf gives 0. Every row count of a pass,
    over rows of whole float4s (the vocabulary's 512) and rows of an odd length (the kernel's scalar loads)."""
    dec, _, ver = engine("tiny")
    V, rng = dec.config.vocab_size, np.random.default_rng(5)
    assert V % 4 == 0
    for n_cols in (V, V - 3):
        for S in (1, 7, ver.slots):
            logits = rng.standard_normal((S, n_cols)).astype(np.float32)
            for s in range(S):
                cols = np.sort(rng.choice(n_cols, 3, replace=False))  # a tie of three, maybe in three blocks' slices
                logits[s, cols] = 9.0
                logits[s, rng.choice(n_cols, 4)] = np.nan
            logits[0, :] = -np.inf
            logits[0, 3] = np.nan
            if S > 1:
                logits[1, [n_cols - 2, n_cols - 1]] = 10.0  # the maxima in the last slice's last columns
            ver.device.upload(logits, ver.logits)
            ver._enqueue_argmax(S, n_cols)
            ver.stream.synchronize()
            got = ver.device.download(ver.argmax, np.int32, (S,))
            want = np.nan_to_num(logits, nan=-np.inf).argmax(axis=1)
            np.testing.assert_array_equal(got, want, err_msg=f"{n_cols} columns, {S} rows")


def test_verify_rejects_bad_requests():
    dec, pre, ver = engine("tiny")
    root = start("tiny", [1, 2, 3])
    too_big = ddtree.chain(np.arange(BUDGET + 1) % 7)
    with pytest.raises(LucegenError, match="budget"):
        ver.verify(too_big, root)
    with pytest.raises(LucegenError, match="out of range"):
        ver.verify(ddtree.chain([dec.config.vocab_size]), root)
    tree = ddtree.chain([4, 5, 6])
    with pytest.raises(LucegenError, match="not a path"):
        ver.commit(tree, [1], 0)
    assert dec.position == 3, "a refused request changes nothing"


def run_spec(preset: str, prompt, n: int, drafter, *, tree: bool, tc: int | None = None) -> tuple[list[int], float]:
    ver = engine(preset, tensor_core_keys=tc)[2]
    start(preset, prompt, tc)
    spec = SpecDecoder(ver, drafter, tree=tree)
    out = spec.generate(n)
    return out, spec.stats.acceptance_length


@functools.cache
def baseline(preset: str, seed: int, length: int, n: int,
             tc: int | None = None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(prompt, greedy tokens through one-slot trees)."""
    dec, _, ver = engine(preset, tensor_core_keys=tc)
    prompt = np.random.default_rng(seed).integers(0, dec.config.vocab_size, length)
    start(preset, prompt, tc)
    return tuple(int(t) for t in prompt), tuple(ver.greedy(n))


def check_lossless(preset: str, seed: int, length: int, n: int, corrupt: frozenset[int], tc: int | None = None) -> dict:
    """Greedy against speculative decoding through one verifier (``tc``: its tensor_core_keys) with the random, the
    oracle and the corrupted oracle drafters, chain and tree verify: token for token."""
    dec = engine(preset, tensor_core_keys=tc)[0]
    prompt, want = baseline(preset, seed, length, n, tc)
    vocab, report = dec.config.vocab_size, {}
    drafters = {
        "random": lambda: RandomDrafter(vocab, depth=15, k=4, seed=seed),
        "oracle": lambda: OracleDrafter(list(want), vocab, depth=15, k=4, seed=seed),
        "corrupted": lambda: OracleDrafter(list(want), vocab, depth=15, k=4, corrupt=corrupt, seed=seed),
    }
    for name, make in drafters.items():
        for tree in (False, True):
            got, al = run_spec(preset, prompt, n, make(), tree=tree, tc=tc)
            report[f"{name}/{'tree' if tree else 'chain'}"] = round(al, 2)
            assert got == list(want), (name, tree, next(i for i, (a, b) in enumerate(zip(got, want)) if a != b))
    # the oracle's drafts are the truth: whole blocks are accepted (commit of up to 15 nodes per step)
    assert report["oracle/chain"] >= 8 and report["oracle/tree"] >= 8, report
    return report


@settings(max_examples=5, deadline=None, suppress_health_check=list(HealthCheck))
@given(preset=st.sampled_from(["tiny", "tiny-gqa"]), seed=st.integers(0, 2**16), length=st.integers(1, 200),
       corrupt=st.frozensets(st.integers(1, 95), max_size=12))
def test_spec_decoding_is_lossless(preset, seed, length, corrupt):
    print(preset, check_lossless(preset, seed, length, 96, corrupt))


@settings(max_examples=3, deadline=None, suppress_health_check=list(HealthCheck))
@given(preset=st.sampled_from(["tiny", "tiny-gqa"]), seed=st.integers(0, 2**16), length=st.integers(1, 200),
       cross=st.integers(1, 60), corrupt=st.frozensets(st.integers(1, 95), max_size=12))
def test_spec_decoding_is_lossless_across_the_tensor_core_bound(preset, seed, length, cross, corrupt):
    """Lossless where the run crosses tensor_core_keys ``cross`` tokens after the prompt: passes on either body and
    passes whose slots take both (a slot's body by its key count alone, so its bits are those of the greedy pass at
    its position)."""
    needs_tensor_cores(preset)
    print(preset, check_lossless(preset, seed, length, 96, corrupt, tc=length + cross))


def live_state_bytes(dec) -> dict[str, bytes]:
    """The decoder's live conv windows and DeltaNet states, as raw bytes (for bit-for-bit comparisons)."""
    return {name: dec.device.download(getattr(dec, name), np.uint8, (getattr(dec, name).nbytes,)).tobytes()
            for name in ("conv", "recurrent")}


def check_decode_is_greedy(preset: str, length: int, seed: int, n: int, tc: int | None = None) -> None:
    """decode (every step queued on the device, one graph per attention body, one deltanet_decode_step launch a
    DeltaNet layer) against greedy through one-slot trees (the tree kernels) on the engine with tensor_core_keys
    ``tc``: the same tokens, and the same conv windows and DeltaNet states bit for bit after them."""
    dec, _, ver = engine(preset, tensor_core_keys=tc)
    prompt = np.random.default_rng(seed).integers(0, dec.config.vocab_size, length)
    start(preset, prompt, tc)
    want = ver.greedy(n)
    want_state, pos = live_state_bytes(dec), dec.position
    start(preset, prompt, tc)
    assert ver.decode(n) == want and dec.position == pos and dec.next_token == want[-1]
    got_state = live_state_bytes(dec)
    for name in want_state:
        assert got_state[name] == want_state[name], f"{preset}: the live {name} differs after {n} decoded tokens"


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(preset=st.sampled_from(["tiny", "tiny-gqa"]), length=st.integers(1, 200), seed=st.integers(0, 2**16))
def test_device_decode_is_greedy_bit_for_bit(preset, length, seed):
    check_decode_is_greedy(preset, length, seed, 24)


def test_device_decode_crosses_the_tensor_core_bound():
    """decode against greedy through one-slot trees over a run that crosses tensor_core_keys."""
    needs_tensor_cores("tiny-gqa")
    check_decode_is_greedy("tiny-gqa", 37, 11, 48, tc=60)


@pytest.mark.skipif(not os.environ.get("LUCEGEN_08B_DIR"), reason="set LUCEGEN_08B_DIR to a 0.8B checkpoint")
def test_spec_decoding_is_lossless_08b():
    print(check_lossless("0.8b", 7, 32, 64, frozenset({3, 17, 18, 40})))
