"""Speculative decoding with sampling is lossless in distribution (lucegen.runtime.ddtree.accept_sampled through
lucegen.runtime.dflash.SpecDecoder), on the CPU.

The toy target's logits after a sequence are a fixed random function of the whole sequence over a 4-token
vocabulary; the fake verifier answers each tree slot with the logits after the slot's path (as
tests/test_dflash_loop.py does for greedy). For every seed of a fixed set, the speculative engine emits the tokens
after the first root; their frequencies at the first positions (the joint of positions 1 and 2, and position 3) are
tested against the exact distribution plain sampling draws from (enumerated from the reference sampler's
probabilities) with a chi-square test at significance 0.001: a correct rule fails it for one seed set in a thousand,
and the seed set is fixed, so the test is deterministic. The same test must reject the rule changed to accept the
first child always (test_the_test_rejects_a_wrong_rule).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import pytest

from lucegen.errors import LucegenError
from lucegen.model.sampling import SamplingParams, draw, philox_uniform, probabilities, sample
from lucegen.runtime import ddtree
from lucegen.runtime.dflash import OracleDrafter, SpecDecoder

VOCAB = 4
PROMPT = [1, 3, 0]
SEEDS = range(2500)
#: chi-square critical values at significance 0.001, by degrees of freedom
CHI2_CRITICAL = {1: 10.83, 2: 13.82, 3: 16.27, 4: 18.47, 5: 20.52, 6: 22.46, 7: 24.32, 8: 26.12, 9: 27.88,
                 10: 29.59, 11: 31.26, 12: 32.91, 13: 34.53, 14: 36.12, 15: 37.70}
PARAMS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.8, top_k=3, top_p=0.9)]


def target_logits(seq) -> np.ndarray:
    """The toy target's logits after ``seq``: a function of the whole sequence."""
    h = 1469598103934665603
    for t in seq:
        h = ((h ^ int(t)) * 1099511628211) % (1 << 64)
    return (1.3 * np.random.default_rng(h).standard_normal(VOCAB)).astype(np.float32)


@dataclass
class FakeDecoder:
    sequence: list
    max_context: int = 10_000
    next_token: int | None = None

    @property
    def position(self) -> int:
        return len(self.sequence)


class FakeVerifier:
    """TreeVerifier's contract over the toy target: the logits after each slot's path."""

    def __init__(self, prompt, budget, root):
        self.budget = budget
        self.dec = FakeDecoder(list(prompt), next_token=root)

    def verify(self, tree, root, *, logits=False):
        seqs = [self.dec.sequence + [root]]
        seqs += [self.dec.sequence + [root] + [int(tree.tokens[n]) for n in tree.path(i)] for i in range(tree.n_nodes)]
        rows = np.stack([target_logits(s) for s in seqs])
        argmax = rows.argmax(1)
        return (argmax, rows) if logits else argmax

    def commit(self, tree, accepted, bonus):
        self.dec.sequence += [self.dec.next_token] + [int(tree.tokens[n]) for n in accepted]
        self.dec.next_token = bonus


def plain(params, seed, n) -> list[int]:
    """Plain sampling: the first root then n - 1 tokens, each drawn at its sequence position."""
    p = SamplingParams(**{**params.__dict__, "seed": seed})
    seq = list(PROMPT)
    for _ in range(n):
        seq.append(sample(target_logits(seq), p, len(seq)))
    return seq[len(PROMPT):]


def speculative(params, seed, n, drafter, budget=6, tree=True) -> tuple[list[int], SpecDecoder]:
    p = SamplingParams(**{**params.__dict__, "seed": seed})
    root = sample(target_logits(PROMPT), p, len(PROMPT))  # the prefill's draw
    spec = SpecDecoder(FakeVerifier(PROMPT, budget, root), drafter, tree=tree)
    return spec.generate(n, sampling=p), spec


def exact_distribution(params) -> tuple[np.ndarray, np.ndarray]:
    """Plain sampling's exact distribution of (token 1, token 2) [VOCAB, VOCAB] and of token 3 [VOCAB] (token 0 is
    the first root)."""
    joint, third = np.zeros((VOCAB, VOCAB)), np.zeros(VOCAB)
    p0 = probabilities(target_logits(PROMPT), params)
    for a, b, c in itertools.product(range(VOCAB), repeat=3):
        pa = p0[a]
        pb = probabilities(target_logits(PROMPT + [a]), params)[b]
        pc = probabilities(target_logits(PROMPT + [a, b]), params)[c]
        joint[b, c] += pa * pb * pc
        p3 = probabilities(target_logits(PROMPT + [a, b, c]), params)
        third += pa * pb * pc * p3
    return joint, third


def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, float]:
    """(statistic, critical value at 0.001) of observed ``counts`` against ``probs``; cells of probability 0 must
    be empty (else the statistic is inf)."""
    counts, probs = counts.ravel(), probs.ravel()
    if counts[probs == 0].any():
        return float("inf"), 0.0
    live = probs > 0
    expected = counts.sum() * probs[live]
    assert expected.min() >= 5, "the chi-square approximation needs >= 5 expected per cell"
    return float(((counts[live] - expected) ** 2 / expected).sum()), CHI2_CRITICAL[int(live.sum()) - 1]


def frequencies(runs) -> tuple[np.ndarray, np.ndarray]:
    joint, third = np.zeros((VOCAB, VOCAB)), np.zeros(VOCAB)
    for tokens in runs:
        joint[tokens[1], tokens[2]] += 1
        third[tokens[3]] += 1
    return joint, third


@dataclass
class ToyDrafter:
    """A deterministic draft: row d holds the top-``k`` tokens of a second toy model's logits after the history and
    d (uniformly random drafts would hide a biased rule: its errors average out over the drafted token)."""

    depth: int = 3
    k: int = 2

    def propose(self, history):
        rows = np.stack([target_logits([7, *history, 9, d]) for d in range(self.depth)])
        tokens = np.argsort(-rows, axis=1, kind="stable")[:, : self.k]
        return -np.arange(self.k, dtype=np.float64)[None, :].repeat(self.depth, 0), tokens

    def committed(self, path, pos0, slots):
        """Nothing to keep."""


def drafter_for(seed):
    return ToyDrafter()


def check(params, runs) -> list[str]:
    joint, third = exact_distribution(params)
    got_joint, got_third = frequencies(runs)
    failures = []
    for name, counts, probs in (("tokens 1-2", got_joint, joint), ("token 3", got_third, third)):
        stat, critical = chi_square(counts, probs)
        if not stat < critical:
            failures.append(f"{name}: chi-square {stat:.1f} >= {critical}")
    return failures


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.8-k3-p0.9"])
def test_plain_sampling_passes_its_own_test(params):
    assert check(params, [plain(params, seed, 4) for seed in SEEDS]) == []


@pytest.mark.parametrize("params", PARAMS, ids=["t1", "t0.8-k3-p0.9"])
def test_speculative_sampling_matches_plain_sampling(params):
    runs, accepted = [], 0
    for seed in SEEDS:
        tokens, spec = speculative(params, seed, 4, drafter_for(seed))
        runs.append(tokens)
        accepted += sum(spec.stats.accepted)
    assert accepted > len(SEEDS), "the drafts must be accepted often for the test to exercise the rule"
    assert check(params, runs) == []


def accept_first(tree, logits, params, base, history=None):
    """A wrong rule: the first child of every slot is accepted, whatever the target says."""
    nodes, slot = [], 0
    while tree.children[slot]:
        node = next(iter(tree.children[slot].values()))
        nodes.append(node)
        slot = node + 1
    return np.array(nodes, np.int64), sample(logits[slot], params, base + len(nodes) + 1)


def full_bonus(tree, logits, params, base, history=None):
    """A wrong rule: the right acceptance test, but the bonus is drawn from the whole distribution instead of the
    residual (a rejected token can come back)."""
    nodes, slot = [], 0
    while True:
        step = base + len(nodes) + 1
        p = probabilities(logits[slot], params)
        residual, nxt = p.copy(), None
        for lane, (token, node) in enumerate(tree.children[slot].items()):
            if philox_uniform(params.seed, step, lane) < residual[token] / residual.sum():
                nxt = node
                break
            residual[token] = 0.0
        if nxt is None:
            return np.array(nodes, np.int64), draw(p, params.seed, step)
        nodes.append(nxt)
        slot = nxt + 1


@pytest.mark.parametrize("wrong_rule", [accept_first, full_bonus])
def test_the_test_rejects_a_wrong_rule(monkeypatch, wrong_rule):
    """The chi-square test has power: rules that are not lossless fail it."""
    monkeypatch.setattr(ddtree, "accept_sampled", wrong_rule)
    params = PARAMS[0]
    assert check(params, [speculative(params, seed, 4, drafter_for(seed))[0] for seed in SEEDS]) != []


def test_without_drafts_speculative_sampling_is_plain_sampling_token_for_token():
    params = PARAMS[1]
    for seed in range(30):
        got, _ = speculative(params, seed, 6, drafter_for(seed), budget=0)
        assert got == plain(params, seed, 6)


def test_a_rejected_draft_is_never_emitted_where_the_target_excludes_it():
    """top-k 1 at temperature > 0 leaves one token: every emitted token is the target's argmax, whatever the drafts
    (the oracle proposes wrong tokens at rank 0 everywhere)."""
    params = SamplingParams(temperature=1.0, top_k=1, seed=3)
    greedy = []
    seq = list(PROMPT)
    for _ in range(8):
        seq.append(int(np.argmax(target_logits(seq))))
    greedy = seq[len(PROMPT):]
    wrong = [(t + 1) % VOCAB for t in greedy]
    tokens, spec = speculative(params, 3, 8, OracleDrafter(wrong, VOCAB, depth=3, k=2))
    assert tokens == greedy


def test_sampling_params_are_checked_before_decoding():
    ver = FakeVerifier(PROMPT, 4, 0)
    spec = SpecDecoder(ver, drafter_for(0))
    with pytest.raises(LucegenError, match="top_p=0"):
        spec.generate(3, sampling=SamplingParams(temperature=1.0, top_p=0.0))
    with pytest.raises(LucegenError, match="CPU engine only"):
        spec.generate(3, sampling=SamplingParams(temperature=1.0, presence_penalty=0.5))
    assert ver.dec.sequence == PROMPT
