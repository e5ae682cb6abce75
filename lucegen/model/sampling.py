"""The reference token sampler: temperature, top-k, top-p, min-p and penalties over one row of logits, drawn with a
counter-based Philox4x32-10 RNG so that a draw is a pure function of (seed, step, lane) and the GPU kernels can
make the same draw without any state.

The order is vLLM's and HF's: penalties, temperature, top-k, top-p, min-p, then one uniform ``u`` from Philox and
the inverse CDF over the kept tokens. Every filter is defined on *values*, never on a sort order, so that a kernel
can apply it with a threshold search instead of a sort and ties are never broken by an implementation detail:

- penalties (``history`` = the token ids seen so far; prompt and output): the repetition penalty ``r`` divides a
  seen token's positive logit by ``r`` and multiplies a negative one by ``r`` (HF); the presence penalty subtracts
  ``presence`` once from every seen token and the frequency penalty subtracts ``frequency`` times its count
  (OpenAI);
- temperature ``T > 0``: ``z = logits / T``; ``T == 0`` is greedy: the argmax, lowest index on ties, and nothing
  else applies (the greedy kernels' rule);
- top-k (``k > 0``): keep token ``i`` iff fewer than ``k`` tokens have ``z_j > z_i`` (tokens tied with the k-th
  value are all kept, like vLLM's threshold mask);
- top-p: with ``p`` the softmax of ``z`` over the tokens kept so far, keep ``i`` iff the mass of the tokens with
  ``p_j > p_i`` is below ``top_p`` (so the most likely token is always kept and ties are kept together);
- min-p: keep ``i`` iff ``p_i >= min_p * max(p)``, i.e. ``z_i - max(z) >= log(min_p)`` (independent of which set
  ``p`` is normalised over);
- draw (Gumbel-max): ``token = argmax over the kept i of z_i + g_i``, ``g_i = -log(-log(u_i))`` with
  ``u_i = philox_uniform(seed, step, lane=i, stream=NOISE_STREAM)``: an exact draw from the softmax of ``z`` over
  the kept tokens. Each token's noise is its own Philox draw, so a kernel adds it to its logit where it computes
  the logit and keeps its argmax reduction (the lowest index on equal keys, like numpy.argmax).

Philox4x32-10 is Random123's (Salmon et al., "Parallel Random Numbers: As Easy as 1, 2, 3", SC11): key =
(seed low 32 bits, seed high 32 bits), counter = (step low 32 bits, step high 32 bits, lane, stream); the uniform is
``((first word >> 9) + 0.5) * 2**-23``, strictly inside (0, 1) and exact in float32. ``step`` is the sequence
position the sampled token will take (the number of tokens before it, prompt included), so a draw is a function of
(seed, position, lane) and nothing else. Stream :data:`NOISE_STREAM` carries the Gumbel noise (lane = token id);
:data:`ACCEPT_STREAM` the speculative verifier's acceptance uniforms (lane = the sibling's rank).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import numpy as np

from lucegen.errors import LucegenError

PHILOX_M0, PHILOX_M1 = 0xD2511F53, 0xCD9E8D57
PHILOX_W0, PHILOX_W1 = 0x9E3779B9, 0xBB67AE85
PHILOX_ROUNDS = 10
MASK32 = 0xFFFFFFFF
NOISE_STREAM, ACCEPT_STREAM = 0, 1


class SamplingError(LucegenError):
    """Sampling parameters out of range."""


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each token. The defaults are greedy decoding (temperature 0)."""

    temperature: float = 0.0
    top_k: int = 0            # 0: off
    top_p: float = 1.0        # in (0, 1]; 1: off
    min_p: float = 0.0        # in [0, 1); 0: off
    seed: int = 0             # 0 .. 2**64 - 1
    repetition_penalty: float = 1.0   # > 0; 1: off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0

    def validate(self) -> SamplingParams:
        """Raise one SamplingError naming the first field out of range; return self."""
        def bad(field, value, rule):
            raise SamplingError(f"sampling parameter {field}={value!r}: {rule}")

        for field in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                      "frequency_penalty"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                bad(field, value, "must be a finite number")
        for field in ("top_k", "seed"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                bad(field, value, "must be an integer")
        if self.temperature < 0:
            bad("temperature", self.temperature, "must be >= 0 (0 is greedy)")
        if self.top_k < 0:
            bad("top_k", self.top_k, "must be >= 0 (0 turns top-k off)")
        if not 0 < self.top_p <= 1:
            bad("top_p", self.top_p, "must be in (0, 1] (1 turns top-p off)")
        if not 0 <= self.min_p < 1:
            bad("min_p", self.min_p, "must be in [0, 1) (0 turns min-p off)")
        if not 0 <= self.seed < 2**64:
            bad("seed", self.seed, "must be in [0, 2**64)")
        if self.repetition_penalty <= 0:
            bad("repetition_penalty", self.repetition_penalty, "must be > 0 (1 turns it off)")
        return self

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def uses_history(self) -> bool:
        """Whether a penalty needs the tokens seen so far."""
        return self.repetition_penalty != 1 or self.presence_penalty != 0 or self.frequency_penalty != 0


GREEDY = SamplingParams()


# ------------------------------------------------------------------------------------------------ Philox4x32-10
def _mulhilo(a: int, b: int) -> tuple[int, int]:
    product = a * b
    return product >> 32, product & MASK32


def philox4x32(counter: Iterable[int], key: Iterable[int], rounds: int = PHILOX_ROUNDS) -> tuple[int, int, int, int]:
    """Random123's philox4x32 with ``rounds`` rounds: four 32-bit counter words and two key words -> four words."""
    x0, x1, x2, x3 = (int(c) & MASK32 for c in counter)
    k0, k1 = (int(k) & MASK32 for k in key)
    for r in range(rounds):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(PHILOX_M0, x0)
        hi1, lo1 = _mulhilo(PHILOX_M1, x2)
        x0, x1, x2, x3 = hi1 ^ x1 ^ k0, lo1, hi0 ^ x3 ^ k1, lo0
    return x0, x1, x2, x3


def _key(seed: int) -> tuple[int, int]:
    return seed & MASK32, (seed >> 32) & MASK32


def _unit(word):
    """The uniform in (0, 1) of a Philox output word (int or uint64 array): ((word >> 9) + 0.5) * 2**-23."""
    if isinstance(word, np.ndarray):
        return ((word >> np.uint64(9)).astype(np.float64) + 0.5) * 2.0**-23
    return ((word >> 9) + 0.5) * 2.0**-23


def philox_uniform(seed: int, step: int, lane: int = 0, stream: int = ACCEPT_STREAM) -> float:
    """The uniform in (0, 1) for (seed, step, lane, stream)."""
    word = philox4x32((step & MASK32, (step >> 32) & MASK32, lane, stream), _key(seed))
    return float(_unit(word[0]))


def philox4x32_lanes(counter_low: tuple[int, int], lanes: np.ndarray, stream: int, key: tuple[int, int]) -> np.ndarray:
    """The first output word of Philox4x32-10 for counters (counter_low[0], counter_low[1], lane, stream) over an
    array of lanes (uint64 array of 32-bit words): :func:`philox4x32` vectorised."""
    m = np.uint64(MASK32)
    x0 = np.full(lanes.shape, counter_low[0], np.uint64)
    x1 = np.full(lanes.shape, counter_low[1], np.uint64)
    x2 = np.asarray(lanes, np.uint64) & m
    x3 = np.full(lanes.shape, stream & MASK32, np.uint64)
    k0, k1 = key
    for r in range(PHILOX_ROUNDS):
        if r:
            k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
        p0 = x0 * np.uint64(PHILOX_M0)
        p1 = x2 * np.uint64(PHILOX_M1)
        x0, x1, x2, x3 = ((p1 >> np.uint64(32)) ^ x1 ^ np.uint64(k0), p1 & m,
                          (p0 >> np.uint64(32)) ^ x3 ^ np.uint64(k1), p0 & m)
    return x0


def gumbel_noise(seed: int, step: int, n: int) -> np.ndarray:
    """float64 [n]: the Gumbel noise ``-log(-log(u_i))`` of tokens 0..n-1 at ``step`` (stream NOISE_STREAM)."""
    u = _unit(philox4x32_lanes((step & MASK32, (step >> 32) & MASK32), np.arange(n, dtype=np.uint64), NOISE_STREAM,
                               _key(seed)))
    return -np.log(-np.log(u))


# ------------------------------------------------------------------------------------------------ the filters
def apply_penalties(logits: np.ndarray, params: SamplingParams, history: Iterable[int] | None) -> np.ndarray:
    """Logits (float32) after the repetition, presence and frequency penalties over ``history``."""
    z = np.asarray(logits, np.float32).copy()
    if not params.uses_history or history is None:
        return z
    ids = np.asarray(list(history), np.int64)
    if ids.size == 0:
        return z
    if ids.min() < 0 or ids.max() >= z.size:
        raise SamplingError(f"history token {int(ids.max() if ids.max() >= z.size else ids.min())} is outside the "
                            f"vocabulary of {z.size}")
    tokens, counts = np.unique(ids, return_counts=True)
    r = np.float32(params.repetition_penalty)
    seen = z[tokens]
    z[tokens] = np.where(seen > 0, seen / r, seen * r)
    z[tokens] -= np.float32(params.presence_penalty) + np.float32(params.frequency_penalty) * counts.astype(np.float32)
    return z


def kept_weights(logits: np.ndarray, params: SamplingParams, history: Iterable[int] | None = None) -> np.ndarray:
    """The unnormalised sampling weights (float64, 0 for filtered tokens) after every filter; ``temperature > 0``."""
    z = (apply_penalties(logits, params, history) / np.float32(params.temperature)).astype(np.float64)
    if np.isnan(z).any() or (z == np.inf).any():
        raise SamplingError("the logits hold NaN or +inf: nothing to sample")
    keep = z > -np.inf
    if not keep.any():
        raise SamplingError("every logit is -inf: nothing to sample")
    zmax = z.max()
    if 0 < params.top_k < z.size:
        keep &= z >= np.sort(z)[::-1][params.top_k - 1]
    w = np.where(keep, np.exp(z - zmax), 0.0)
    if params.top_p < 1:
        p = w / w.sum()
        ascending = np.sort(p)
        suffix = np.append(np.cumsum(ascending[::-1])[::-1], 0.0)  # suffix[k] = sum(ascending[k:])
        mass_above = suffix[np.searchsorted(ascending, p, side="right")]
        keep &= mass_above < params.top_p
        w = np.where(keep, w, 0.0)
    if params.min_p > 0:
        keep &= z - zmax >= math.log(params.min_p)
        w = np.where(keep, w, 0.0)
    return w


def draw(weights: np.ndarray, seed: int, step: int) -> int:
    """The Gumbel-max draw from the (unnormalised) ``weights`` at (seed, step): argmax of log w_i + g_i."""
    w = np.asarray(weights, np.float64)
    with np.errstate(divide="ignore"):
        keys = np.log(w) + gumbel_noise(seed, step, w.size)
    return int(np.argmax(keys))


def sample(logits: np.ndarray, params: SamplingParams, step: int, history: Iterable[int] | None = None) -> int:
    """The token for one row of ``logits`` that will take sequence position ``step`` (see the module's docstring)."""
    row = np.asarray(logits)
    if row.ndim != 1 or row.size == 0:
        raise SamplingError(f"sample() takes one non-empty row of logits, got shape {row.shape}")
    if params.greedy:
        return int(np.argmax(apply_penalties(row, params, history)))
    return draw(kept_weights(row, params, history), params.seed, step)


def probabilities(logits: np.ndarray, params: SamplingParams, history: Iterable[int] | None = None) -> np.ndarray:
    """The distribution :func:`sample` draws from (float64, sums to 1); one-hot on the argmax when greedy."""
    row = np.asarray(logits)
    if params.greedy:
        p = np.zeros(row.size)
        p[int(np.argmax(apply_penalties(row, params, history)))] = 1.0
        return p
    w = kept_weights(row, params, history)
    return w / w.sum()
