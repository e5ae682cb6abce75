"""What :class:`lucegen.LLM` drives: an engine holds a model's weights on one device, a sequence holds one
conversation's state (KV cache, conv windows, recurrent state) in it.

    engine = CpuEngine(checkpoint, max_context=512)
    seq = engine.sequence()
    first = seq.prefill(prompt_ids, params)        # the prompt, then the first generated token
    for ids in seq.decode(first, 63, params):      # the next tokens, in chunks as the engine produces them
        ...
    seq.close(); engine.close()

``decode(first, n, params)`` consumes ``first`` and yields the tokens after it, ``n`` in all, in chunks; the caller
may stop iterating after any chunk (a stop token) and the engine does no more work for it. A chunk is one token for
an engine that picks on the host, up to ``chunk`` tokens for a GPU engine whose greedy steps run back to back on
the device, the accepted path plus the bonus token for a speculative step. ``params`` is a
:class:`lucegen.model.sampling.SamplingParams`; the token that takes sequence position ``p`` is drawn with the
sampler's RNG at step ``p`` (lucegen/model/sampling.py), so a seed gives the same tokens on every engine that
computes the same logits, and a sequence restored to a position draws what it drew there. ``history`` for the
penalties is the prompt and every token generated so far.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..model.config import ModelConfig

if TYPE_CHECKING:
    from ..model.sampling import SamplingParams


class Sequence:
    """One sequence's state in an engine: prompt, then decoding. Subclasses implement the three methods."""

    #: tokens emitted per speculative step, when the engine is speculative (else None)
    acceptance_length: float | None = None

    def prefill(self, prompt: list[int], params: SamplingParams, history: list[int] | None = None) -> int:
        """Consume ``prompt`` from the sequence's position; return the next token. ``history`` (default ``prompt``)
        is what the penalties count."""
        raise NotImplementedError

    def decode(self, first: int, n: int, params: SamplingParams, history: list[int]) -> Iterator[list[int]]:
        """Consume ``first`` and the tokens after it; yield the next ``n`` tokens in chunks. ``history`` (prompt +
        generated, ending with ``first``) is extended in place as tokens are yielded."""
        raise NotImplementedError

    def close(self) -> None:
        """Free what the sequence holds (the engine stays usable)."""


class Engine:
    """A model loaded for generation. ``name`` says which engine on which device, ``device`` is "cpu" or "gpu",
    ``config`` the model's, ``max_context`` the positions a sequence may hold (prompt + generated, plus a
    speculative engine's verify rows: ``reserve``)."""

    name: str
    device: str
    config: ModelConfig
    max_context: int
    #: positions past the last generated token a sequence needs (a verify pass's rows)
    reserve: int = 0
    #: the energy counter of the engine's GPU (lucegen/runtime/energy.py's EnergyMeter); None: not measured
    energy = None

    def sequence(self) -> Sequence:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def check_params(self, params: SamplingParams) -> None:
        """Refuse (a LucegenError) sampling parameters this engine cannot run; validated ones otherwise."""
