"""DDTree host logic (lucegen.runtime.ddtree) against plain-Python statements of the algorithms.

The oracles here are written independently of the implementation: the tree is "the ``budget`` best paths, ordered by
(score descending, rank tuple ascending)" computed by enumerating every path; a second oracle runs the textbook
priority queue over a dict-of-children tree; accept is "the deepest node whose path spells the target's greedy
continuation".
"""

from __future__ import annotations

import heapq
import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lucegen.runtime.ddtree import accept, build_tree, chain, emitted_tokens

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# log-probs from a small grid so that ties (equal path scores) are frequent
GRID = [0.0, -0.25, -0.5, -1.0, -1.5, -2.0, -3.0, -np.inf]


@st.composite
def draft_topk(draw, max_depth=4, max_k=4, vocab=12, grid=True):
    depth = draw(st.integers(0, max_depth))
    k = draw(st.integers(1, max_k))
    values = st.sampled_from(GRID) if grid else st.floats(-8.0, 0.0)
    lp = np.array([sorted(draw(st.lists(values, min_size=k, max_size=k)), reverse=True)
                   for _ in range(depth)], dtype=np.float64).reshape(depth, k)
    tok = np.array([draw(st.permutations(range(vocab)))[:k] for _ in range(depth)], dtype=np.int64).reshape(depth, k)
    return lp, tok


# ------------------------------------------------------------------------------------------------ oracles
def oracle_paths(lp, budget, chain_seed=False):
    """Every path (rank tuple) of depth 1..D, scored by summing its log-probs root to leaf; the tree is the first
    ``budget`` in (score desc, ranks asc) order; with chain_seed the top-1 chain comes first."""
    depth, k = lp.shape
    paths = []
    for d in range(1, depth + 1):
        for ranks in itertools.product(range(k), repeat=d):
            score = 0.0
            for level, r in enumerate(ranks):
                score += float(lp[level, r])
            paths.append((ranks, score))
    if chain_seed:
        seeded = [(tuple([0] * d), None) for d in range(1, min(depth, budget) + 1)]
        seeded_set = {p for p, _ in seeded}
        rest = sorted(((p, s) for p, s in paths if p not in seeded_set), key=lambda ps: (-ps[1], ps[0]))
        scores = dict(paths)
        chosen = [(p, scores[p]) for p, _ in seeded] + rest
    else:
        chosen = sorted(paths, key=lambda ps: (-ps[1], ps[0]))
    return chosen[:budget]


def oracle_priority_queue(lp, tok, budget):
    """Textbook best-first expansion over a dict-of-children tree: frontier = children of expanded nodes."""
    depth, k = lp.shape
    tree = {(): {}}  # path -> {token: child path}
    order = []
    frontier = [(-float(lp[0, r]), (r,)) for r in range(k)] if depth else []
    heapq.heapify(frontier)
    while frontier and len(order) < budget:
        neg, path = heapq.heappop(frontier)
        tree[path[:-1]][int(tok[len(path) - 1, path[-1]])] = path
        tree[path] = {}
        order.append(path)
        if len(path) < depth:
            for r in range(k):
                heapq.heappush(frontier, (neg - float(lp[len(path), r]), path + (r,)))
    return order, tree


def tree_paths(tree):
    """Rank tuple of every node of a built Tree, in node order."""
    out = []
    for i in range(tree.n_nodes):
        p = int(tree.parents[i])
        out.append((out[p] if p >= 0 else ()) + (int(tree.ranks[i]),))
    return out


def greedy(f, context, n):
    seq = list(context)
    for _ in range(n):
        seq.append(f(tuple(seq)))
    return seq[len(context):]


def hashed_target(seed, vocab):
    """A deterministic 'model': next token = a hash of the whole context."""
    def f(context):
        return hash((seed,) + tuple(context)) % vocab
    return f


def target_argmax(tree, f, context, root):
    """What the verify pass returns: the target's greedy token after every slot, seeing its ancestors only."""
    out = [f(tuple(context) + (root,))]
    for i in range(tree.n_nodes):
        out.append(f(tuple(context) + (root,) + tuple(int(tree.tokens[n]) for n in tree.path(i))))
    return np.array(out)


def oracle_accept(tree, f, context, root):
    """The deepest node whose root path spells the target's greedy continuation (none: the empty path)."""
    best = []
    for i in range(tree.n_nodes):
        path = tree.path(i)
        want = greedy(f, tuple(context) + (root,), len(path))
        if [int(tree.tokens[n]) for n in path] == want and len(path) > len(best):
            best = path
    bonus = greedy(f, tuple(context) + (root,) + tuple(int(tree.tokens[n]) for n in best), 1)[0]
    return best, bonus


# ------------------------------------------------------------------------------------------------ build_tree
@SETTINGS
@given(draft_topk(), st.integers(0, 40), st.booleans())
def test_tree_is_the_best_budget_paths(topk, budget, chain_seed):
    lp, tok = topk
    tree = build_tree(lp, tok, budget, chain_seed=chain_seed)
    expected = oracle_paths(lp, budget, chain_seed)
    assert tree_paths(tree) == [p for p, _ in expected]
    assert tree.scores.tolist() == [s for _, s in expected]
    for i, path in enumerate(tree_paths(tree)):
        assert tree.tokens[i] == tok[len(path) - 1, path[-1]]
        assert tree.depth[i] == len(path)


@SETTINGS
@given(draft_topk(grid=False), st.integers(0, 40))
def test_tree_matches_textbook_priority_queue(topk, budget):
    lp, tok = topk
    # distinct scores: the textbook frontier breaks ties by rank tuple too, but only distinct scores make the
    # node *order* comparable without relying on that
    assume(len({s for _, s in oracle_paths(lp, 10**9)}) == len(oracle_paths(lp, 10**9)))
    tree = build_tree(lp, tok, budget)
    order, children = oracle_priority_queue(lp, tok, budget)
    assert tree_paths(tree) == order
    built = tree_paths(tree)
    for i in range(tree.n_nodes):
        parent = int(tree.parents[i])
        key = built[parent] if parent >= 0 else ()
        assert children[key][int(tree.tokens[i])] == built[i]


@SETTINGS
@given(draft_topk(max_depth=6, max_k=5), st.integers(0, 64), st.booleans())
def test_tree_invariants(topk, budget, chain_seed):
    lp, tok = topk
    tree = build_tree(lp, tok, budget, chain_seed=chain_seed)
    n = tree.n_nodes
    depth, k = lp.shape
    assert n == min(budget, sum(k ** d for d in range(1, depth + 1)))  # budget respected and used when possible
    for i in range(n):
        p = int(tree.parents[i])
        assert -1 <= p < i  # parents precede children
        assert tree.depth[i] == (1 if p < 0 else tree.depth[p] + 1)
        if p >= 0:
            assert tree.scores[i] <= tree.scores[p]  # a path never scores above its prefix
    for s in range(n + 1):  # children of each slot: ranks 0..m-1 in order, distinct tokens
        kids = [i for i in range(n) if tree.parents[i] + 1 == s]
        assert [int(tree.ranks[i]) for i in kids] == list(range(len(kids)))
        assert len({int(tree.tokens[i]) for i in kids}) == len(kids)
    mask = tree.attention_mask()
    assert mask.shape == (n + 1, n + 1)
    for q in range(n + 1):
        ancestors = {0} | {a + 1 for a in (tree.path(q - 1) if q else [])}
        assert {j for j in range(n + 1) if mask[q, j]} == ancestors
        for j in np.flatnonzero(mask[q]):  # ancestor-closed: what j sees, q sees
            assert not np.any(mask[j] & ~mask[q])
    assert tree.positions(100).tolist() == [100] + [100 + int(d) for d in tree.depth]
    assert tree.verify_parents().tolist() == [-1] + [int(p) + 1 for p in tree.parents]
    assert tree.verify_tokens(7).tolist() == [7] + tree.tokens.tolist()


def test_tree_small_worked_example():
    # depth 1: a(-0.1) b(-1.0); depth 2: c(-0.2) d(-3.0). Paths: a -0.1, ac -0.3, b -1.0, bc -1.2, ad -3.1, ...
    lp = np.array([[-0.1, -1.0], [-0.2, -3.0]])
    tok = np.array([[10, 11], [20, 21]])
    tree = build_tree(lp, tok, 4)
    assert tree.tokens.tolist() == [10, 20, 11, 20]
    assert tree.parents.tolist() == [-1, 0, -1, 2]
    assert tree.depth.tolist() == [1, 2, 1, 2]
    np.testing.assert_allclose(tree.scores, [-0.1, -0.3, -1.0, -1.2])
    assert tree.attention_mask().astype(int).tolist() == [
        [1, 0, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [1, 1, 1, 0, 0],
        [1, 0, 0, 1, 0],
        [1, 0, 0, 1, 1]]
    # chain seeding puts the top-1 chain (a, ac) first, then the best of the rest
    assert build_tree(lp, tok, 3, chain_seed=True).tokens.tolist() == [10, 20, 11]


def test_chain_is_the_top1_tree():
    lp = -np.sort(np.random.default_rng(0).random((15, 4)), axis=1)
    tok = np.stack([np.random.default_rng(i).permutation(1000)[:4] for i in range(15)])
    c = chain(tok[:, 0], lp[:, 0])
    t = build_tree(lp[:, :1], tok[:, :1], 15)
    for a, b in ((c.tokens, t.tokens), (c.parents, t.parents), (c.depth, t.depth), (c.scores, t.scores)):
        assert a.tolist() == b.tolist()
    assert build_tree(lp[:, :1], tok[:, :1], 5).tokens.tolist() == tok[:5, 0].tolist()
    assert chain([]).n_nodes == 0 and chain([]).attention_mask().tolist() == [[True]]


@pytest.mark.parametrize("lp, tok, budget, match", [
    ([[-1.0, -0.5]], [[1, 2]], 4, "sorted"),
    ([[0.5, -0.5]], [[1, 2]], 4, "<= 0"),
    ([[float("nan"), -0.5]], [[1, 2]], 4, "NaN"),
    ([[-0.5, -1.0]], [[3, 3]], 4, "repeats"),
    ([[-0.5, -1.0]], [[3]], 4, "must both be"),
    ([[-0.5, -1.0]], [[3, 4]], -1, "budget"),
    ([[-0.5, -1.0]], [[3, 4]], 2.0, "budget"),
    ([[-0.5, -1.0]], [[0.5, 4]], 2, "integers"),
])
def test_build_tree_rejects_bad_input(lp, tok, budget, match):
    with pytest.raises(ValueError, match=match):
        build_tree(np.array(lp), np.array(tok), budget)


# ------------------------------------------------------------------------------------------------ accept
@SETTINGS
@given(draft_topk(max_depth=5, max_k=3, vocab=4), st.integers(0, 30), st.booleans(), st.integers(0, 2**16),
       st.lists(st.integers(0, 3), max_size=3), st.integers(0, 3))
def test_accept_random_target_and_greedy_losslessness(topk, budget, chain_seed, seed, context, root):
    lp, tok = topk
    f = hashed_target(seed, vocab=4)  # tiny vocab: the draft often guesses right, so paths of all lengths occur
    tree = build_tree(lp, tok, budget, chain_seed=chain_seed)
    nodes, bonus = accept(tree, target_argmax(tree, f, context, root))
    want_nodes, want_bonus = oracle_accept(tree, f, context, root)
    assert nodes.tolist() == want_nodes and bonus == want_bonus
    emitted = emitted_tokens(tree, nodes, bonus)
    # lossless: exactly the target's own greedy continuation after the root
    assert emitted == greedy(f, tuple(context) + (root,), len(emitted))


@SETTINGS
@given(st.integers(1, 15), st.integers(0, 2**16), st.integers(0, 50))
def test_accept_oracle_chain_accepts_everything(n, seed, root):
    f = hashed_target(seed, vocab=1000)
    continuation = greedy(f, (root,), n + 1)
    tree = chain(continuation[:n])
    nodes, bonus = accept(tree, target_argmax(tree, f, (), root))
    assert nodes.tolist() == list(range(n)) and bonus == continuation[n]


@SETTINGS
@given(st.integers(1, 15), st.integers(0, 2**16), st.sets(st.integers(0, 14), max_size=4))
def test_accept_corrupted_chain_stops_at_first_corruption(n, seed, corrupt):
    f = hashed_target(seed, vocab=1000)
    continuation = greedy(f, (5,), n + 1)
    proposal = list(continuation[:n])
    corrupt = {c for c in corrupt if c < n}
    for c in corrupt:
        proposal[c] = (proposal[c] + 1) % 1000
    tree = chain(proposal)
    nodes, bonus = accept(tree, target_argmax(tree, f, (), 5))
    first = min(corrupt, default=n)
    assert nodes.tolist() == list(range(first))
    assert bonus == continuation[first]  # the target's own token where the draft went wrong


@SETTINGS
@given(st.integers(1, 8), st.integers(2, 4), st.integers(0, 2**16), st.integers(0, 40), st.data())
def test_accept_oracle_inside_a_tree(depth, k, seed, budget, data):
    """The target's continuation is planted at hypothesis-chosen ranks; the accepted path is the part of it the tree
    kept (plus corruption: ranks >= k mean 'not proposed at this depth')."""
    f = hashed_target(seed, vocab=50)
    continuation = greedy(f, (3,), depth + 1)
    planted = data.draw(st.lists(st.integers(0, k), min_size=depth, max_size=depth))
    rng = np.random.default_rng(seed)
    lp = -np.sort(rng.random((depth, k)) * 3, axis=1)
    tok = np.zeros((depth, k), np.int64)
    for d in range(depth):
        others = [t for t in rng.permutation(50).tolist() if t != continuation[d]]
        row = others[:k]
        if planted[d] < k:
            row[planted[d]] = continuation[d]
        tok[d] = row
    tree = build_tree(lp, tok, budget)
    nodes, bonus = accept(tree, target_argmax(tree, f, (), 3))
    assert (nodes.tolist(), bonus) == oracle_accept(tree, f, (), 3)
    # everything proposed at rank 0 and budget >= depth with the chain seeded: all accepted
    if all(r == 0 for r in planted) and budget >= depth:
        seeded = build_tree(lp, tok, budget, chain_seed=True)
        nodes, bonus = accept(seeded, target_argmax(seeded, f, (), 3))
        assert len(nodes) == depth and bonus == continuation[depth]


@SETTINGS
@given(st.integers(0, 2**16), st.integers(0, 2**16), st.integers(0, 24), st.booleans(), st.integers(1, 6))
def test_speculative_loop_equals_greedy_decoding(target_seed, draft_seed, budget, chain_seed, block):
    """Many rounds of draft -> tree -> verify -> accept reproduce plain greedy decoding token for token, whatever
    the draft proposes (here a draft that agrees with the target about half the time)."""
    vocab = 6
    f = hashed_target(target_seed, vocab)
    rng = np.random.default_rng(draft_seed)
    prompt = [1, 2]
    want = greedy(f, prompt, 40)
    seq = list(prompt) + [f(tuple(prompt))]  # the first token comes from prefill, as in the reference
    while len(seq) < len(prompt) + 40:
        # draft: top-3 per depth, the true greedy token at a random rank (or absent) along the top-1 chain
        cont = greedy(f, seq, block)
        tok = np.array([[t for t in rng.permutation(vocab).tolist() if t != cont[d]][:3] for d in range(block)])
        planted = rng.integers(0, 4, size=block)  # 3: the right token is not proposed at this depth
        for d in range(block):
            if planted[d] < 3:
                tok[d, planted[d]] = cont[d]
        lp = -np.sort(rng.random((block, 3)), axis=1)
        tree = build_tree(lp, tok, budget, chain_seed=chain_seed)
        nodes, bonus = accept(tree, target_argmax(tree, f, seq[:-1], seq[-1]))
        seq += emitted_tokens(tree, nodes, bonus)
    assert seq[len(prompt):len(prompt) + 40] == want


def test_accept_rejects_wrong_verdict_length():
    tree = chain([1, 2, 3])
    with pytest.raises(ValueError, match="4 slots"):
        accept(tree, np.array([1, 2, 3]))


def test_budget_22_build_is_fast():
    import time

    rng = np.random.default_rng(0)
    lp = np.log(np.sort(rng.dirichlet(np.ones(32), size=15), axis=1)[:, ::-1][:, :22])
    tok = np.stack([rng.permutation(248320)[:22] for _ in range(15)])
    start = time.perf_counter()
    for _ in range(100):
        tree = build_tree(lp, tok, 22)
        tree.attention_mask()
    per_step = (time.perf_counter() - start) / 100
    assert tree.n_nodes == 22
    assert per_step < 2e-3, f"{per_step * 1e6:.0f} us per tree build"
