"""Greedy speculative decoding with a DDTree: draft → tree → verify → accept → commit, one step per loop.

    ver = TreeVerifier(dec, budget=22)                  # after a prefill: dec.next_token is the first root
    spec = SpecDecoder(ver, drafter)                    # tree=False: chain verify of the draft's top-1 path
    tokens = spec.generate(128)
    spec.stats.acceptance_length, spec.stats.seconds    # tokens per step; time per stage

A *drafter* proposes, for the ``depth`` positions after the root, its top-K tokens with log-probabilities (each
row sorted, best first), given every token emitted so far (the root last): ``propose(history) -> (logprobs [D, K],
tokens [D, K])``; after every commit it hears which verify slots were kept: ``committed(path, pos0, slots)``.
The DFlash draft network is such a drafter (:class:`lucegen.runtime.draft.DFlashDrafter`). Two drafters serve the
tests and the acceptance-controlled benchmark, where random weights would accept nothing:

- :class:`OracleDrafter` proposes a known continuation (the target's own greedy one), the true token at rank 0 of
  every row; at the continuation indices in ``corrupt`` rank 0 is a wrong token and the true one drops to rank 1
  (a tree can still find it, a chain cannot).
- :class:`RandomDrafter` proposes random tokens.

:class:`ControlledDrafter` runs a network drafter (its cost counts) but proposes an oracle's rows: the benchmark's
acceptance-controlled mode.

Whatever the drafter, the emitted tokens are the verifier's greedy tokens (lossless): ``ddtree.accept`` keeps a
drafted token only where the target's argmax after its parent equals it, and every step emits the target's own
choice after the last kept one. With ``sampling`` (a :class:`~lucegen.model.sampling.SamplingParams` of temperature
> 0) the verify returns every slot's logits and ``ddtree.accept_sampled`` walks the tree by recursive rejection
sampling: the emitted tokens are distributed exactly as plain sampling's (lossless in distribution), and a seed
fixes them. The first root (the decoder's next token after the prefill) is the prefill's: sample it there
(``Prefiller.prefill(ids, sampling=...)``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..errors import LucegenError
from ..model.sampling import SamplingParams
from . import ddtree
from .device_sampling import checked_sampling

STAGES = ("draft", "tree", "verify", "commit")


def _rows(depth: int, k: int) -> np.ndarray:
    """Log-probabilities of a drafter without a network: sorted along each row, less sure deeper."""
    return -(0.05 * np.arange(depth)[:, None] + 0.5 * np.arange(k)[None, :])


def _fill_distinct(rng: np.random.Generator, row: np.ndarray, taken: set[int], vocab: int) -> None:
    """Fill the -1 entries of ``row`` with random tokens, distinct from each other and from ``taken``."""
    for i in range(row.size):
        if row[i] < 0:
            t = int(rng.integers(vocab))
            while t in taken:
                t = int(rng.integers(vocab))
            row[i] = t
            taken.add(t)


@dataclass
class RandomDrafter:
    """Random top-K rows: ``depth`` positions, ``k`` distinct tokens each."""

    vocab: int
    depth: int = 15
    k: int = 4
    seed: int = 0

    def __post_init__(self):
        if self.k > self.vocab:
            raise LucegenError(f"drafter: top-{self.k} rows need at least {self.k} tokens in the vocabulary")
        self.rng = np.random.default_rng(self.seed)

    def propose(self, history) -> tuple[np.ndarray, np.ndarray]:
        tokens = np.full((self.depth, self.k), -1, np.int64)
        for row in tokens:
            _fill_distinct(self.rng, row, set(), self.vocab)
        return _rows(self.depth, self.k), tokens

    def committed(self, path, pos0: int, slots: int) -> None:
        """Nothing to keep."""


@dataclass
class OracleDrafter:
    """Proposes ``continuation`` (the token stream that starts with the first root, e.g. the target's greedy
    output): the row for continuation index i carries continuation[i] at rank 0, or, where i is in ``corrupt``, a
    wrong token at rank 0 and the true one at rank 1. Positions past the continuation's end are random."""

    continuation: list[int]
    vocab: int
    depth: int = 15
    k: int = 4
    corrupt: frozenset[int] = field(default_factory=frozenset)
    seed: int = 0

    def __post_init__(self):
        if self.k > self.vocab or self.vocab < 2:
            raise LucegenError(f"drafter: top-{self.k} rows need at least {max(self.k, 2)} tokens in the vocabulary")
        self.continuation = [int(t) for t in self.continuation]
        self.corrupt = frozenset(int(i) for i in self.corrupt)
        self.rng = np.random.default_rng(self.seed)

    def propose(self, history) -> tuple[np.ndarray, np.ndarray]:
        start = len(history)  # continuation index of the first drafted position (history[-1] is the root)
        tokens = np.full((self.depth, self.k), -1, np.int64)
        for d, row in enumerate(tokens):
            i = start + d
            taken: set[int] = set()
            if i < len(self.continuation):
                truth = self.continuation[i]
                if i in self.corrupt:
                    wrong = (truth + 1 + int(self.rng.integers(self.vocab - 1))) % self.vocab  # never the truth
                    row[0] = wrong
                    taken.add(wrong)
                    if self.k > 1:
                        row[1] = truth
                else:
                    row[0] = truth
                taken.add(truth)
            _fill_distinct(self.rng, row, taken, self.vocab)
        return _rows(self.depth, self.k), tokens

    def committed(self, path, pos0: int, slots: int) -> None:
        """Nothing to keep."""


@dataclass
class ControlledDrafter:
    """``network`` drafts every step (its context kept up to date, its time spent) but ``oracle``'s rows are
    proposed: a speculative run with the real draft's cost at an acceptance the oracle sets."""

    network: object
    oracle: OracleDrafter

    def propose(self, history) -> tuple[np.ndarray, np.ndarray]:
        self.network.propose(history)
        return self.oracle.propose(history)

    def committed(self, path, pos0: int, slots: int) -> None:
        self.network.committed(path, pos0, slots)


@dataclass
class SpecStats:
    steps: int = 0
    emitted: int = 0
    accepted: list[int] = field(default_factory=list)  # drafted tokens kept per step
    seconds: dict[str, float] = field(default_factory=lambda: {s: 0.0 for s in STAGES})

    @property
    def acceptance_length(self) -> float:
        """Tokens emitted per step: accepted draft tokens + the bonus token (AL; 1 = nothing accepted)."""
        return self.emitted / self.steps if self.steps else 0.0


class SpecDecoder:
    """Speculative decoding through a :class:`~lucegen.runtime.tree_verify.TreeVerifier`: per step the drafter's
    rows become a best-first DDTree of at most ``budget`` nodes (``tree=False``: the top-1 chain), one verify pass
    checks every node, the path the target accepts is committed plus the bonus token: greedy (the longest path the
    target's argmax agrees with), or with ``sampling`` by recursive rejection sampling (``ddtree.accept_sampled``)."""

    def __init__(self, verifier, drafter, *, budget: int | None = None, tree: bool = True, chain_seed: bool = False):
        self.verifier, self.drafter = verifier, drafter
        self.budget = verifier.budget if budget is None else budget
        if isinstance(self.budget, bool) or not isinstance(self.budget, int) or not 0 <= self.budget <= verifier.budget:
            raise LucegenError(f"spec budget must be an integer in [0, {verifier.budget}] (the verifier's), "
                               f"got {self.budget!r}")
        self.tree, self.chain_seed = tree, chain_seed
        self.stats = SpecStats()

    def _tree(self, lp, tok, budget: int) -> ddtree.Tree:
        if self.tree:
            return ddtree.build_tree(lp, tok, budget, chain_seed=self.chain_seed)
        return ddtree.chain(np.asarray(tok)[: min(budget, len(tok)), 0])

    def step(self, history: list[int], sampling: SamplingParams | None = None) -> list[int]:
        """One draft → tree → verify → commit step after ``history`` (emitted so far, the root last); returns the
        tokens it emits (accepted drafts, then the bonus token). ``sampling``: None (greedy) or checked_sampling's."""
        ver, dec = self.verifier, self.verifier.dec
        budget = min(self.budget, dec.max_context - dec.position - 1)
        if budget < 0:
            raise LucegenError(f"the context of {dec.max_context} tokens is full (--max-context)")
        t0 = time.perf_counter()
        lp, tok = self.drafter.propose(history)
        t1 = time.perf_counter()
        tree = self._tree(lp, tok, budget)
        t2 = time.perf_counter()
        if sampling is None:
            nodes, bonus = ddtree.accept(tree, ver.verify(tree, history[-1]))
        else:
            _, logits = ver.verify(tree, history[-1], logits=True)
            nodes, bonus = ddtree.accept_sampled(tree, logits, sampling, dec.position)
        t3 = time.perf_counter()
        pos0 = dec.position
        ver.commit(tree, nodes, bonus)
        t4 = time.perf_counter()
        self.drafter.committed([0] + [int(n) + 1 for n in nodes], pos0, tree.n_nodes + 1)
        t5 = time.perf_counter()
        for stage, dt in zip(STAGES, (t1 - t0 + t5 - t4, t2 - t1, t3 - t2, t4 - t3)):
            self.stats.seconds[stage] += dt
        emitted = ddtree.emitted_tokens(tree, nodes, bonus)
        self.stats.steps += 1
        self.stats.emitted += len(emitted)
        self.stats.accepted.append(len(nodes))
        return emitted

    def generate(self, n: int, callback=None, *, sampling: SamplingParams | None = None) -> list[int]:
        """``n`` tokens from the decoder's next token (the first root, itself the first token returned), greedy or
        with ``sampling``. The last step may commit a few tokens past ``n``; they are not returned."""
        sampling = checked_sampling(sampling)
        if self.verifier.dec.next_token is None:
            raise LucegenError("generate: prefill the prompt first")
        out = [self.verifier.dec.next_token]
        while len(out) < n:
            new = self.step(out, sampling)
            out.extend(new)
            if callback:
                callback(new)
        return out[:n]
