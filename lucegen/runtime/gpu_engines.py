"""The GPU engines behind :class:`lucegen.LLM`, one per kind of checkpoint:

- :class:`MegakernelEngine`: a float checkpoint (BF16/FP16 safetensors, or a GGUF whose matrices are not
  K-quants, dequantised): the prompt through the prefill kernels, greedy steps through the decode megakernel,
  ``chunk`` steps a launch;
- :class:`QuantEngine`: a K-quant GGUF (Q4_K_M and the like) on the quantised target: the prompt through the
  prefill kernels on the quantised GEMM, plain decoding as one-slot verify passes queued on the device
  (``TreeVerifier.decode``: the lossless reference of the speculative path), ``chunk`` passes at a time;
- :class:`SpeculativeEngine`: either target with a DFlash draft: per step the draft proposes, a DDTree of at most
  ``budget`` nodes is verified in one pass, the accepted path and the bonus token are emitted.

Greedy steps run back to back on the device and come back ``chunk`` at a time; the caller checks each chunk for a
stop token and asks for no more, so at most ``chunk - 1`` steps run past a stop token (the chunks start at one step
and double up to ``chunk``, so a short answer wastes fewer). Sampling is the runtime's (lucegen/runtime/
device_sampling.py): temperature alone is drawn on the device inside those steps; top-k, top-p and min-p are drawn
on the host from each step's logits, one step a launch; speculative decoding samples by recursive rejection
sampling over the tree, lossless in distribution. The penalties are the CPU engine's alone.

Each engine holds one sequence at a time (the decoder's state on the device): opening a sequence resets it, and a
sequence that was replaced refuses to go on.
"""

from __future__ import annotations

from collections.abc import Iterator

from ..errors import LucegenError
from ..model.sampling import SamplingParams
from .device_sampling import checked_sampling, fused
from .energy import EnergyMeter
from .engine import Engine, Sequence


def chunk_sizes(n: int, chunk: int) -> Iterator[int]:
    """Steps per launch for ``n`` greedy steps: 1, 2, 4, ... up to ``chunk``, then ``chunk`` until done."""
    size = 1
    while n > 0:
        step = min(size, chunk, n)
        yield step
        n -= step
        size *= 2


class GpuSequence(Sequence):
    """The one live sequence of a GPU engine (see the module docstring)."""

    def __init__(self, engine: GpuEngine):
        self.engine = engine
        engine.decoder.device.make_current()
        engine.reset()
        engine.live = self

    def _check_live(self) -> None:
        """Refuse a replaced sequence; make the device's context current in the calling thread (a sequence may be
        stepped by another thread than the one that built the engine, as lucegen serve's engine thread does)."""
        if self.engine.live is not self:
            raise LucegenError(f"{self.engine.name} holds one sequence at a time; this one was replaced by a newer "
                               "one (open a second LLM for a second concurrent sequence)")
        self.engine.decoder.device.make_current()

    @property
    def position(self) -> int:
        """Tokens consumed so far."""
        return self.engine.decoder.position

    def prefill(self, prompt: list[int], params: SamplingParams, history: list[int] | None = None) -> int:
        self._check_live()
        if history is not None and params.uses_history:
            raise LucegenError("the GPU engines take no penalties (history)")
        return self.engine.prefiller.prefill(prompt, sampling=checked_sampling(params))

    def close(self) -> None:
        if self.engine.live is self:
            self.engine.live = None


class MegakernelSequence(GpuSequence):
    def decode(self, first: int, n: int, params: SamplingParams, history: list[int]) -> Iterator[list[int]]:
        self._check_live()
        dec, sampling = self.engine.decoder, checked_sampling(params)
        dec.next_token = first
        # temperature alone is drawn on the device; the filters one step at a time from the step's logits
        chunk = self.engine.chunk if sampling is None or fused(sampling) else 1
        for steps in chunk_sizes(n, chunk):
            new = [int(t) for t in dec.run([dec.next_token], steps, sampling=sampling).tokens]
            history.extend(new)
            yield new


class QuantSequence(GpuSequence):
    def decode(self, first: int, n: int, params: SamplingParams, history: list[int]) -> Iterator[list[int]]:
        self._check_live()
        dec, verifier, sampling = self.engine.decoder, self.engine.verifier, checked_sampling(params)
        dec.next_token = first
        for steps in chunk_sizes(n, self.engine.chunk):
            new = verifier.decode(steps + 1, sampling=sampling)[1:]  # decode's first token is the one it consumes
            history.extend(new)
            yield new


class SpeculativeSequence(GpuSequence):
    def decode(self, first: int, n: int, params: SamplingParams, history: list[int]) -> Iterator[list[int]]:
        self._check_live()
        spec, sampling = self.engine.spec, checked_sampling(params)
        self.engine.decoder.next_token = first
        left = n
        emitted = [first]
        while left > 0:
            new = spec.step(emitted, sampling)
            emitted.extend(new)
            new = new[:left]  # the last step may commit past n: show only what was asked for
            left -= len(new)
            history.extend(new)
            self.acceptance_length = spec.stats.acceptance_length
            yield new


class GpuEngine(Engine):
    """The parts every GPU engine holds: ``decoder`` (a MegakernelDecoder or QuantDecoder), ``prefiller``, for
    the quantised target and speculative decoding a ``verifier``, and the ``energy`` meter of the decoder's GPU."""

    device = "gpu"
    sequence_class: type[GpuSequence]

    def check_params(self, params: SamplingParams) -> None:
        """The runtime's check: no penalties on a GPU engine (they need the whole sequence on the host)."""
        checked_sampling(params)

    def __init__(self, decoder, *, chunk: int = 16, what: str):
        if chunk < 1:
            raise LucegenError(f"chunk must be at least 1, got {chunk}")
        self.decoder, self.chunk = decoder, chunk
        self.config, self.max_context = decoder.config, decoder.max_context
        self.name = f"{what} on {decoder.device.target.name}"
        self.live: GpuSequence | None = None
        self.verifier = self.draft = None
        self.prefiller = None
        self.energy = EnergyMeter.for_device(decoder.device)

    def reset(self) -> None:
        self.decoder.reset()
        if self.draft is not None:
            self.draft.reset()

    def sequence(self) -> GpuSequence:
        if self.decoder is None:
            raise LucegenError("this engine is closed")
        return self.sequence_class(self)

    def close(self) -> None:
        if self.decoder is not None:
            self.decoder.device.make_current()
        self.close_parts()
        if self.decoder is not None:
            self.decoder.close()
        self.decoder = self.live = None

    def close_parts(self) -> None:
        """Free what the engine built around its decoder (a constructor that fails calls this; the decoder is its
        caller's)."""
        for part in (getattr(self, "verifier", None), getattr(self, "prefiller", None), getattr(self, "draft", None),
                     getattr(self, "energy", None)):
            if part is not None:
                part.close()
        self.verifier = self.prefiller = self.draft = self.energy = None


class MegakernelPrefill:
    """The prompt token by token through the decode megakernel (teacher-forced steps), with the prefill kernels'
    ``prefill(tokens, sampling=None)`` contract: the next token."""

    def __init__(self, decoder):
        self.decoder = decoder

    def prefill(self, tokens, *, sampling=None) -> int:
        self.decoder.prefill(tokens, sampling=sampling)
        return self.decoder.next_token

    def close(self) -> None:
        """Holds nothing of its own."""


class MegakernelEngine(GpuEngine):
    sequence_class = MegakernelSequence

    def __init__(self, decoder, *, chunk: int = 16, prefill: str = "kernels"):
        from .prefill.runner import Prefiller

        super().__init__(decoder, chunk=chunk, what="the decode megakernel")
        if prefill not in ("kernels", "megakernel"):
            raise LucegenError(f"prefill must be 'kernels' or 'megakernel', got {prefill!r}")
        self.prefiller = Prefiller(decoder) if prefill == "kernels" else MegakernelPrefill(decoder)


class QuantEngine(GpuEngine):
    sequence_class = QuantSequence

    def __init__(self, decoder, *, chunk: int = 16):
        from .prefill.runner import Prefiller
        from .tree_verify import TreeVerifier

        super().__init__(decoder, chunk=chunk, what="the quantised target")
        try:
            self.prefiller = Prefiller(decoder)
            self.verifier = TreeVerifier(decoder, budget=0)
        except BaseException:
            self.close_parts()
            raise
        self.reserve = 1


class SpeculativeEngine(GpuEngine):
    """``decoder`` with the DFlash draft at ``draft`` (a path): ``budget`` tree nodes per verify (the descriptor's
    by default), ``draft_top_k`` candidates per draft position, ``tree=False`` for the top-1 chain."""

    sequence_class = SpeculativeSequence

    def __init__(self, decoder, draft, *, budget: int | None = None, draft_top_k: int = 8, tree: bool = True,
                 draft_ring: int | None = None):
        from .dflash import SpecDecoder
        from .draft import DFlashDrafter
        from .prefill.runner import Prefiller
        from .tree_verify import TreeVerifier

        super().__init__(decoder, what="speculative decoding (DFlash draft, DDTree verify)")
        try:
            self.draft = DFlashDrafter(decoder, draft, k=draft_top_k, ring=draft_ring)
            self.prefiller = Prefiller(decoder, draft=self.draft)
            self.verifier = TreeVerifier(decoder, budget=budget, draft=self.draft)
            self.spec = SpecDecoder(self.verifier, self.draft, tree=tree)
        except BaseException:
            self.close_parts()
            raise
        self.reserve = self.verifier.budget + 1

    def reset(self) -> None:
        super().reset()
        self.spec.stats = type(self.spec.stats)()

    def memory_plan(self) -> str:
        from .memory_plan import MemoryPlan

        return MemoryPlan.of_engine(self.decoder, self.verifier, self.draft).format()
