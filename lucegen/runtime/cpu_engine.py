"""The CPU engine: the numpy reference (lucegen/model/reference.py) behind the engine interface, for tiny models.

Every sequence has its own :class:`~lucegen.model.reference.ReferenceState`, so any number of sequences can be
open at once; each step computes the last position's logits in float32 and picks the token on the host with the
reference sampler. It is the engine CI generates, samples, chats and serves through, and the tokens the GPU
engines are checked against."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..errors import LucegenError
from ..model.reference import Reference
from ..model.sampling import SamplingParams, sample
from .engine import Engine, Sequence

#: KV positions a sequence allocates at first (the reference's cache grows as needed)
INITIAL_CAPACITY = 256


class CpuSequence(Sequence):
    def __init__(self, engine: CpuEngine):
        self.engine = engine
        self.state = engine.reference.new_state(min(engine.max_context, INITIAL_CAPACITY))

    @property
    def position(self) -> int:
        """Tokens consumed so far."""
        return self.state.position

    def _pick(self, logits: np.ndarray, params: SamplingParams, history) -> int:
        """The token for the next position (the sampler's RNG step: the tokens consumed so far)."""
        return sample(logits, params, self.state.position, history if params.uses_history else None)

    def prefill(self, prompt: list[int], params: SamplingParams, history: list[int] | None = None) -> int:
        """Consume ``prompt`` from the current position (a fresh sequence, or one restored from a snapshot);
        return the next token; ``history`` (default ``prompt``) is what the penalties count."""
        if self.position + len(prompt) > self.engine.max_context:
            raise LucegenError(f"{self.position} tokens so far + a prompt of {len(prompt)} exceed the context of "
                               f"{self.engine.max_context} positions")
        logits = self.engine.reference.forward(prompt, self.state, logits="last")[-1]
        return self._pick(logits, params, prompt if history is None else history)

    def snapshot(self):
        """A copy of the state after every token consumed so far (shares nothing with the sequence)."""
        return self.state.copy()

    def restore(self, snap) -> None:
        """Set the state to a copy of ``snap`` (from :meth:`snapshot` of a sequence of the same engine)."""
        self.state = snap.copy()

    def decode(self, first: int, n: int, params: SamplingParams, history: list[int]) -> Iterator[list[int]]:
        token = first
        for _ in range(n):
            if self.state.position >= self.engine.max_context:
                raise LucegenError(f"the context of {self.engine.max_context} positions is full")
            logits = self.engine.reference.forward([token], self.state, logits="last")[-1]
            token = self._pick(logits, params, history)
            history.append(token)
            yield [token]

    def close(self) -> None:
        self.state = None


class CpuEngine(Engine):
    """``CpuEngine(checkpoint, max_context)``: a loaded checkpoint (lucegen.model.checkpoint) in float32;
    ``kv_cache``: a KV cache format of lucegen/model/kv_cache.py the cache entries are stored in (default:
    float32)."""

    device = "cpu"

    def __init__(self, checkpoint, max_context: int, kv_cache: str | None = None):
        self.config = checkpoint.config
        self.max_context = max_context
        self.reference = Reference(checkpoint.config, checkpoint, kv_cache=kv_cache)
        self.name = "the numpy reference (CPU)"

    def sequence(self) -> CpuSequence:
        if self.reference is None:
            raise LucegenError("this engine is closed")
        return CpuSequence(self)

    def close(self) -> None:
        self.reference = None
