"""The speculative-decoding loop's host side (lucegen.runtime.dflash, tree_verify.tree_layout) on the CPU.

The target here is a plain-Python greedy "model": the next token is a hash of the whole sequence so far, and a fake
verifier answers each tree slot with that function of the slot's path. Against it the loop must emit exactly the
model's greedy continuation whatever the drafter proposes (random, oracle, corrupted oracle; chain or tree), and
commit exactly the root plus the accepted path. The GPU twin is tests/gpu/test_tree_verify.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lucegen.errors import LucegenError
from lucegen.runtime import ddtree
from lucegen.runtime.dflash import OracleDrafter, RandomDrafter, SpecDecoder
from lucegen.runtime.tree_verify import tree_layout

VOCAB = 50


def next_token(seq) -> int:
    """The toy target's greedy choice after ``seq`` (a function of the whole sequence)."""
    h = 1469598103934665603
    for t in seq:
        h = ((h ^ int(t)) * 1099511628211) % (1 << 64)
    return h % VOCAB


def greedy(prompt, n) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(seq))
        seq.append(out[-1])
    return out


@dataclass
class FakeDecoder:
    sequence: list  # committed tokens
    max_context: int
    next_token: int | None = None

    @property
    def position(self) -> int:
        return len(self.sequence)


class FakeVerifier:
    """TreeVerifier's contract over the toy target: verify answers per slot from the slot's path."""

    def __init__(self, prompt, budget, max_context=10_000):
        self.budget = budget
        self.dec = FakeDecoder(list(prompt), max_context, next_token(prompt))
        self.verified_slots = []

    def verify(self, tree, root):
        seqs = [self.dec.sequence + [root]]
        for i in range(tree.n_nodes):
            seqs.append(self.dec.sequence + [root] + [int(tree.tokens[n]) for n in tree.path(i)])
        self.verified_slots.append(len(seqs))
        return np.array([next_token(s) for s in seqs], np.int64)

    def commit(self, tree, accepted, bonus):
        root = self.dec.next_token
        self.dec.sequence += [root] + [int(tree.tokens[n]) for n in accepted]
        self.dec.next_token = bonus


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(prompt=st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=20), n=st.integers(1, 60),
       budget=st.integers(0, 20), depth=st.integers(1, 8), k=st.integers(1, 4), tree=st.booleans(),
       kind=st.sampled_from(["random", "oracle", "corrupted"]), corrupt=st.frozensets(st.integers(0, 60)),
       seed=st.integers(0, 1000))
def test_loop_emits_the_greedy_continuation(prompt, n, budget, depth, k, tree, kind, corrupt, seed):
    want = greedy(prompt, n + 20)
    ver = FakeVerifier(prompt, budget)
    if kind == "random":
        drafter = RandomDrafter(VOCAB, depth, k, seed)
    else:
        drafter = OracleDrafter(want, VOCAB, depth, k, corrupt if kind == "corrupted" else frozenset(), seed)
    spec = SpecDecoder(ver, drafter, tree=tree)
    got = spec.generate(n)
    assert got == want[:n]
    # committed: the prompt, the first root and every emitted token but the last (the next root)
    assert ver.dec.sequence == list(prompt) + want[: spec.stats.emitted]
    assert ver.dec.next_token == want[spec.stats.emitted]
    assert max(ver.verified_slots, default=1) <= budget + 1
    if kind == "oracle" and budget >= depth and not tree:
        # every drafted position is the truth: each chain step emits the whole block plus the bonus (a best-first
        # tree of the same budget may spend nodes on rank-1 siblings instead of the deepest rank-0 ones)
        assert spec.stats.accepted[:-1] == [depth] * (spec.stats.steps - 1)


def test_corruption_is_found_by_a_tree_not_a_chain():
    want = greedy([3, 1], 40)
    bad = frozenset({5})
    runs = {}
    for tree in (False, True):
        ver = FakeVerifier([3, 1], budget=32)
        spec = SpecDecoder(ver, OracleDrafter(want, VOCAB, depth=8, k=2, corrupt=bad), tree=tree)
        assert spec.generate(30) == want[:30]
        runs[tree] = spec.stats.accepted
    assert runs[False][0] == 4, "the chain stops before the wrong rank-0 token at index 5"
    assert runs[True][0] > 5, "the tree takes the true token at rank 1 and goes on"


def test_oracle_rows_are_valid_topk():
    want = list(range(10, 40))
    d = OracleDrafter(want, VOCAB, depth=6, k=3, corrupt=frozenset({4}), seed=1)
    lp, tok = d.propose([want[0], want[1]])  # root = index 1: rows are indices 2 .. 7
    ddtree.build_tree(lp, tok, 10)  # sorted rows, distinct tokens (ddtree checks both)
    assert list(tok[:, 0]) == [12, 13, tok[2, 0], 15, 16, 17] and tok[2, 0] != 14 and tok[2, 1] == 14


def test_spec_budget_is_checked():
    ver = FakeVerifier([1], budget=4)
    with pytest.raises(LucegenError, match="budget"):
        SpecDecoder(ver, RandomDrafter(VOCAB), budget=5)
    with pytest.raises(LucegenError, match="at least"):
        RandomDrafter(3, k=4)


@settings(max_examples=100, deadline=None)
@given(seed=st.integers(0, 10_000), budget=st.integers(0, 30))
def test_tree_layout_is_the_attention_mask(seed, budget):
    rng = np.random.default_rng(seed)
    depth, k = int(rng.integers(1, 7)), int(rng.integers(1, 5))
    lp = -np.cumsum(rng.exponential(1.0, (depth, k)), axis=1)
    tok = np.array([rng.permutation(VOCAB)[:k] for _ in range(depth)])
    tree = ddtree.build_tree(lp, tok, budget)
    S = tree.n_nodes + 1
    flat = tree_layout(tree)
    parent, dep, anc = flat[:S], flat[S : 2 * S], flat[2 * S :].reshape(S, S)
    assert list(parent) == list(tree.verify_parents())
    mask = tree.attention_mask()
    for s in range(S):
        path = anc[s, : dep[s] + 1]
        assert path[-1] == s and path[0] == 0
        assert sorted(path) == list(np.nonzero(mask[s])[0])
        assert all(parent[path[i + 1]] == path[i] for i in range(dep[s]))
