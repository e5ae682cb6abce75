"""DDTree, the host side of tree speculative decoding: build the draft tree, lay it out for the verify pass, walk
the target's verdict.

The algorithm is DDTree's (liranringel/ddtree ``ddtree.py``: ``build_ddtree_tree``, ``compile_ddtree_tree``,
``follow_verified_tree``; ported to C++ in Luce-Org/lucebox-hub ``dflash``'s ``build_ddtree`` /
``follow_verified_tree``):

- The draft (DFlash) proposes, for each of the D positions after the last committed token, its top-K tokens with
  log-probabilities, row d = position root + d + 1, rank 0 = the most likely. A path through the tree picks one rank
  per depth; its score is the sum of the picked log-probabilities (the draft's factorised probability of that
  continuation).
- ``build_tree`` keeps the ``budget`` highest-scoring paths, best first, with a heap: popping a node pushes its next
  sibling (same parent, rank + 1) and its first child (rank 0 at the next depth). Because rows are sorted, a node's
  score never exceeds its parent's or its previous sibling's, so the popped set is always a tree (prefix-closed,
  siblings contiguous from rank 0) and it is the best ``budget`` paths.
- **The root is not counted**: it is the last committed token (the previous step's bonus token), already certain;
  ``budget`` counts draft nodes only, as in the reference (``parents`` has ``budget + 1`` entries there with the root
  at 0). The verify batch is the root followed by the nodes: ``1 + n_nodes`` slots, slot ``i + 1`` = node ``i``.
- Verify runs the target once over the batch with ``attention_mask()`` (each slot sees its ancestors and itself, plus
  the whole committed context) at ``positions(base)`` (root at ``base``, a node at ``base + depth``).
- ``accept`` walks from the root: the target's argmax after slot s picks the child of s carrying that token; the walk
  stops at the first miss, and that argmax is the bonus token. Emitted tokens = the accepted nodes' tokens + bonus.
  With greedy decoding this is lossless: every emitted token is the target's own greedy choice given the tokens
  before it.

Choices where the reference leaves room, made explicit here:

- Scores are float64 and a node's score is ``parent score + its log-prob`` (summed root-to-leaf in depth order), not
  the reference's incremental ``sibling = score - lp[rank] + lp[rank + 1]``: the same value in exact arithmetic,
  without rounding drift, so that a test can state the result independently.
- Ties in score are broken by the rank tuple of the path, lexicographically (the reference's heap key is
  ``(-score, ranks)``), so the tree is a deterministic function of its inputs.
- ``chain_seed=True`` first inserts the draft's top-1 chain (``min(D, budget)`` nodes), then fills the rest of the
  budget best-first: lucebox-hub's default (``build_ddtree(..., chain_seed = true)``), which guarantees that the tree
  contains the plain DFlash (chain) proposal. The default, ``False``, is the paper's pure best-first tree.
- Node order is insertion (pop) order: parents precede children and each node's children appear in rank order.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from ..model.sampling import ACCEPT_STREAM, SamplingParams, draw, philox_uniform, probabilities

ROOT = -1  # parent of the root's children


@dataclass(frozen=True, eq=False)
class Tree:
    """A draft tree without its root. Node ``i`` (0-based, insertion order) carries ``tokens[i]`` at ``depth[i]``
    (1 = child of the root) under ``parents[i]`` (a node index, or -1 for the root); ``ranks[i]`` is its rank in the
    draft's top-K at its depth and ``scores[i]`` the log-probability of its whole path from the root."""

    tokens: np.ndarray  # int64 [n]
    parents: np.ndarray  # int32 [n]
    depth: np.ndarray  # int32 [n]
    ranks: np.ndarray = field(repr=False)  # int32 [n]
    scores: np.ndarray = field(repr=False)  # float64 [n]

    @property
    def n_nodes(self) -> int:
        return int(self.tokens.shape[0])

    def __len__(self) -> int:
        return self.n_nodes

    @cached_property
    def children(self) -> list[dict[int, int]]:
        """``children[s]`` maps token -> node index for the children of verify slot ``s`` (0 = the root, ``i + 1`` =
        node ``i``). Sibling tokens are distinct (they are distinct top-K entries of one row)."""
        maps: list[dict[int, int]] = [{} for _ in range(self.n_nodes + 1)]
        for i, (tok, parent) in enumerate(zip(self.tokens.tolist(), self.parents.tolist())):
            maps[parent + 1].setdefault(tok, i)
        return maps

    # ------------------------------------------------------------------------------------- verify-batch layout
    def verify_tokens(self, root_token: int) -> np.ndarray:
        """int64 [1 + n]: the root then every node, the verify pass's input tokens."""
        return np.concatenate([np.array([root_token], np.int64), self.tokens])

    def positions(self, base: int) -> np.ndarray:
        """int64 [1 + n]: RoPE positions of the verify slots; the root sits at ``base`` (the next free position of the
        committed sequence), a node at ``base + depth``. Siblings share a position."""
        return np.concatenate([np.array([base], np.int64), base + self.depth.astype(np.int64)])

    def verify_parents(self) -> np.ndarray:
        """int32 [1 + n]: the parent slot of every verify slot (-1 for the root): what tree-aware recurrent kernels
        (conv window, DeltaNet state) follow instead of ``slot - 1``."""
        return np.concatenate([np.array([-1], np.int32), (self.parents + 1).astype(np.int32)])

    def attention_mask(self) -> np.ndarray:
        """bool [1 + n, 1 + n] over verify slots: ``mask[q, k]`` is True iff slot ``k`` is slot ``q`` or one of its
        ancestors (the root is every slot's ancestor). Every slot also sees the whole committed context; that part is
        not in this matrix."""
        n = self.n_nodes + 1
        mask = np.zeros((n, n), dtype=np.bool_)
        mask[0, 0] = True
        for slot, parent_slot in enumerate(self.parents.tolist(), start=1):
            mask[slot, :slot] = mask[parent_slot + 1, :slot]
            mask[slot, slot] = True
        return mask

    def path(self, node: int) -> list[int]:
        """The nodes from the root's child down to ``node`` (inclusive)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]


def _as_rows(topk_logprobs, topk_tokens) -> tuple[np.ndarray, np.ndarray]:
    lp = np.asarray(topk_logprobs, dtype=np.float64)
    tok = np.asarray(topk_tokens)
    if lp.ndim != 2 or tok.shape != lp.shape:
        raise ValueError(f"ddtree: top-K log-probs {lp.shape} and tokens {tok.shape} must both be [depth, K]")
    if not np.issubdtype(tok.dtype, np.integer):
        raise ValueError(f"ddtree: top-K tokens must be integers, got {tok.dtype}")
    if lp.size:
        if not np.all(np.isfinite(lp) | (lp == -np.inf)) or np.any(lp > 0):
            raise ValueError("ddtree: top-K log-probs must be <= 0 and not NaN")
        if np.any(lp[:, 1:] > lp[:, :-1]):
            raise ValueError("ddtree: top-K log-probs must be sorted by rank (non-increasing along each row)")
        if np.any(tok < 0):
            raise ValueError("ddtree: top-K tokens must be non-negative")
        ordered = np.sort(tok, axis=1)
        if np.any(ordered[:, 1:] == ordered[:, :-1]):
            raise ValueError("ddtree: a top-K row repeats a token")
    return lp, tok.astype(np.int64)


def build_tree(topk_logprobs, topk_tokens, budget: int, *, chain_seed: bool = False) -> Tree:
    """The best-first DDTree of at most ``budget`` nodes (root not counted) over the draft's per-depth top-K:
    ``topk_logprobs`` float [D, K] sorted non-increasing along each row, ``topk_tokens`` int [D, K] distinct per row.
    See the module docstring for the order, the ties and ``chain_seed``."""
    if isinstance(budget, bool) or not isinstance(budget, (int, np.integer)) or budget < 0:
        raise ValueError(f"ddtree: budget must be a non-negative integer, got {budget!r}")
    lp_rows, tok_rows = _as_rows(topk_logprobs, topk_tokens)
    depth_limit, k = lp_rows.shape
    lp = lp_rows.tolist()  # python floats: exact float64 sums in path order
    tokens, parents, depths, ranks, scores = [], [], [], [], []

    def insert(parent: int, depth: int, rank: int, score: float) -> int:
        tokens.append(int(tok_rows[depth - 1, rank]))
        parents.append(parent)
        depths.append(depth)
        ranks.append(rank)
        scores.append(score)
        return len(tokens) - 1

    # heap entry: (-score, rank tuple of the path, parent node, depth, rank, parent's score)
    heap: list[tuple[float, tuple[int, ...], int, int, int, float]] = []
    if budget > 0 and depth_limit > 0 and k > 0:
        if chain_seed:
            parent, parent_score, path = ROOT, 0.0, ()
            for depth in range(1, min(depth_limit, budget) + 1):
                if k > 1:
                    heapq.heappush(heap, (-(parent_score + lp[depth - 1][1]), path + (1,), parent, depth, 1,
                                          parent_score))
                score = parent_score + lp[depth - 1][0]
                parent, parent_score, path = insert(parent, depth, 0, score), score, path + (0,)
        else:
            heap.append((-(0.0 + lp[0][0]), (0,), ROOT, 1, 0, 0.0))
    while heap and len(tokens) < budget:
        _, path, parent, depth, rank, parent_score = heapq.heappop(heap)
        score = parent_score + lp[depth - 1][rank]
        node = insert(parent, depth, rank, score)
        if rank + 1 < k:
            heapq.heappush(heap, (-(parent_score + lp[depth - 1][rank + 1]), path[:-1] + (rank + 1,), parent, depth,
                                  rank + 1, parent_score))
        if depth < depth_limit:
            heapq.heappush(heap, (-(score + lp[depth][0]), path + (0,), node, depth + 1, 0, score))
    return Tree(tokens=np.array(tokens, np.int64), parents=np.array(parents, np.int32),
                depth=np.array(depths, np.int32), ranks=np.array(ranks, np.int32),
                scores=np.array(scores, np.float64))


def chain(tokens, logprobs=None) -> Tree:
    """The draft's single path (plain DFlash verify): node ``i`` is ``tokens[i]`` at depth ``i + 1`` under node
    ``i - 1``. Equal to ``build_tree`` on the top-1 column with a budget of at least ``len(tokens)``."""
    tok = np.asarray(tokens)
    if tok.ndim != 1 or (tok.size and not np.issubdtype(tok.dtype, np.integer)):
        raise ValueError(f"ddtree: chain tokens must be a 1-D integer array, got {tok.dtype} {tok.shape}")
    n = tok.shape[0]
    lp = np.zeros(n) if logprobs is None else np.asarray(logprobs, dtype=np.float64)
    if lp.shape != (n,):
        raise ValueError(f"ddtree: chain log-probs {lp.shape} do not match {n} tokens")
    scores = np.zeros(n)
    total = 0.0
    for i, v in enumerate(lp.tolist()):
        total += v
        scores[i] = total
    return Tree(tokens=tok.astype(np.int64), parents=np.arange(-1, n - 1, dtype=np.int32),
                depth=np.arange(1, n + 1, dtype=np.int32), ranks=np.zeros(n, np.int32), scores=scores)


def accept(tree: Tree, target_argmax) -> tuple[np.ndarray, int]:
    """Walk the verified tree. ``target_argmax`` int [1 + n]: the target's greedy token after each verify slot
    (``[0]`` after the root, ``[i + 1]`` after node ``i``). Returns the accepted nodes (root's child first, int64,
    possibly empty) and the bonus token: the target's choice after the last accepted slot."""
    argmax = np.asarray(target_argmax)
    if argmax.shape != (tree.n_nodes + 1,):
        raise ValueError(f"ddtree: target argmax has shape {argmax.shape}, the verify batch has "
                         f"{tree.n_nodes + 1} slots")
    verdict = argmax.tolist()
    children = tree.children
    accepted: list[int] = []
    slot = 0
    while True:
        node = children[slot].get(verdict[slot])
        if node is None:
            return np.array(accepted, np.int64), int(verdict[slot])
        accepted.append(node)
        slot = node + 1


def accept_sampled(tree: Tree, target_logits, params: SamplingParams, base: int,
                   history=None) -> tuple[np.ndarray, int]:
    """Walk the verified tree with sampling, lossless in distribution: every emitted token is distributed as
    :func:`lucegen.model.sampling.sample` would draw it from the target after the tokens before it.

    Recursive rejection sampling over each slot's children (Chen et al. / Leviathan et al., in SpecInfer's
    multi-candidate form): the target's distribution after the slot, ``r = probabilities(logits[slot])``, meets the
    children in rank order. A child was proposed deterministically (the draft's top-K, not a draw), so its proposal
    distribution ``q`` is the point mass on its token and the rule ``accept with probability min(1, r(t) / q(t))``
    reads ``accept iff u < r(t) / sum(r)``; on a rejection the residual ``(r - q)+`` is ``r`` with ``t`` removed and
    the next sibling meets it. An accepted child's slot continues the walk; when every child of a slot is rejected
    (or it has none), the bonus token is the reference sampler's draw from the residual (Gumbel-max,
    :func:`~lucegen.model.sampling.draw`). With nothing rejected that draw is exactly plain sampling's.

    ``target_logits`` float [1 + n, vocab]: the target's logits after each verify slot. ``base``: the sequence
    position of the root, so the token after a slot at depth d takes position ``base + d + 1`` (the RNG's step).
    The uniform for the j-th child of that slot is ``philox_uniform(seed, base + d + 1, lane=j, ACCEPT_STREAM)``.
    ``history``: the tokens before the root and the root itself, for the penalties (needed when
    ``params.uses_history``)."""
    logits = np.asarray(target_logits)
    if logits.ndim != 2 or logits.shape[0] != tree.n_nodes + 1:
        raise ValueError(f"ddtree: target logits have shape {logits.shape}, the verify batch has "
                         f"{tree.n_nodes + 1} slots")
    seen = list(history) if history is not None else None
    children = tree.children
    accepted: list[int] = []
    slot, depth = 0, 0
    while True:
        step = base + depth + 1
        residual = probabilities(logits[slot], params, seen)
        nxt = None
        for lane, (token, node) in enumerate(children[slot].items()):  # insertion order = rank order
            mass = residual.sum()
            if philox_uniform(params.seed, step, lane, ACCEPT_STREAM) < residual[token] / mass:
                nxt = node
                break
            residual[token] = 0.0
        if nxt is None:
            return np.array(accepted, np.int64), draw(residual, params.seed, step)
        accepted.append(nxt)
        if seen is not None:
            seen.append(int(tree.tokens[nxt]))
        slot, depth = nxt + 1, depth + 1


def emitted_tokens(tree: Tree, accepted: np.ndarray, bonus: int) -> list[int]:
    """The tokens a step commits after the root: the accepted nodes' tokens, then the bonus token."""
    return [int(t) for t in tree.tokens[accepted]] + [int(bonus)]
