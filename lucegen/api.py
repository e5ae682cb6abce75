"""``lucegen.LLM``: generate text from a checkpoint in a few lines.

    import lucegen

    with lucegen.LLM("/models/qwen3.5-0.8b") as llm:
        print(llm.generate("The capital of France is", max_tokens=32).text)
        for piece in llm.stream("Once upon a time", max_tokens=64, temperature=0.8, seed=1):
            print(piece.text, end="", flush=True)
        reply = llm.chat([{"role": "user", "content": "Hi!"}], max_tokens=128)

The engine is picked from the checkpoint and the device (lucegen/runtime/engine.py): on a GPU, the decode
megakernel for a float checkpoint (BF16/FP16 safetensors, or a GGUF in float types), the quantised target for a
K-quant GGUF (Q4_K_M and the like; plain decoding through its one-slot verify passes), either with DFlash
speculative decoding when a ``draft`` is given; on the CPU (``device="cpu"``, or no GPU visible) the numpy
reference, for tiny models.

Generation stops at ``max_tokens``, at one of the model's stop tokens (lucegen/model/generation.py: the union of
every eos the checkpoint states; ``stop_token_ids`` adds more) or at a stop string (``stop``; text-level, across
token boundaries, not part of the text). ``finish_reason`` says which: "length" or "stop". Sampling parameters are
lucegen/model/sampling.py's (temperature 0, the default, is greedy); a seed gives the same tokens every time.
Every argument is checked before any device work: a bad value is a LucegenError of one line.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from .errors import LucegenError
from .model.chat_template import ChatTemplate, ChatTemplateError, load_chat_template, template_file
from .model.generation import special_tokens, stop_token_ids
from .model.sampling import SamplingParams
from .model.text_stream import TextStream
from .runtime.energy import energy_j

log = logging.getLogger("lucegen")

#: KV positions a GPU engine allocates when ``max_context`` is not given (capped by the model's limit)
DEFAULT_GPU_CONTEXT = 4096


@dataclass
class Timings:
    """``ttft_s``: seconds from the call to the first generated token (the prompt's prefill); ``prefill_tok_s``:
    prompt tokens per second of it; ``decode_tok_s``: generated tokens after the first per second of decoding
    (None with fewer than two); ``acceptance_length``: tokens per speculative step (None when not speculative);
    ``energy_j``: joules the GPU used from the call to the last token, prefill included (NVML's energy counter,
    lucegen/runtime/energy.py; None where it is unavailable, and on the CPU engine)."""

    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    prefill_tok_s: float
    decode_s: float
    decode_tok_s: float | None
    acceptance_length: float | None = None
    energy_j: float | None = None

    @property
    def tok_per_j(self) -> float | None:
        """Generated tokens per joule (None without a positive energy reading)."""
        return self.generated_tokens / self.energy_j if self.energy_j else None

    def format(self) -> str:
        """One line for a terminal."""
        decode = f"{self.decode_tok_s:.1f} tok/s" if self.decode_tok_s is not None else "n/a"
        al = f", acceptance length {self.acceptance_length:.2f}" if self.acceptance_length is not None else ""
        energy = ""
        if self.energy_j is not None:
            per_j = f" ({self.tok_per_j:.1f} tok/J)" if self.tok_per_j is not None else ""
            energy = f", energy {self.energy_j:.1f} J{per_j}"
        return (f"{self.prompt_tokens} prompt tokens, {self.generated_tokens} generated; TTFT {self.ttft_s * 1e3:.1f} "
                f"ms, prefill {self.prefill_tok_s:.1f} tok/s, decode {decode}{al}{energy}")


@dataclass
class Completion:
    """What :meth:`LLM.generate` returns. ``token_ids`` are the generated ids (a stop token not included),
    ``stop_reason`` the stop token id or stop string that ended it (None for "length")."""

    text: str
    token_ids: list[int]
    prompt_token_ids: list[int]
    finish_reason: str
    timings: Timings
    stop_reason: int | str | None = None


@dataclass
class StreamPiece:
    """One piece of :meth:`LLM.stream`: the new text (never a partial character), the ids it came from; the last
    piece carries ``finish_reason``, ``stop_reason`` and ``timings``."""

    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    timings: Timings | None = None


def gpu_visible() -> bool:
    """Whether an NVIDIA GPU can be opened (its driver answers and reports a device)."""
    from .errors import DeviceError
    from .runtime.device import detect

    try:
        detect()
    except DeviceError:
        return False
    return True


class LLM:
    """A model ready to generate. ``path``: a HF checkpoint directory or a .gguf file; ``draft``: a DFlash draft
    (directory or .gguf) for speculative decoding on the GPU; ``target``: a descriptor name or file (default: the
    one matching the GPU); ``device``: "cpu", "gpu", None (the GPU if one is visible, else the CPU) or an open
    Device to share; ``max_context``: KV positions per sequence (default: 4096 on a GPU, capped by the model's
    limit; the model's limit on the CPU); ``kv_cache``: the quantised target's KV cache format;
    ``chat_template``: a template's text, or a path (``os.PathLike``) to a template file, instead of the model's.
    Speculative options: ``budget`` (tree nodes per verify), ``draft_top_k`` (draft candidates per position),
    ``chain`` (verify the top-1 chain), ``draft_ring``. ``chunk``: greedy steps a GPU engine runs between
    looks at the tokens (stop tokens are seen at chunk ends); ``prefill``: the megakernel engine's prompt path,
    "kernels" (the prefill kernels) or "megakernel" (token by token through the decode megakernel)."""

    def __init__(self, path, draft=None, *, target=None, device=None, max_context: int | None = None,
                 kv_cache: str | None = None, chat_template: str | os.PathLike | None = None,
                 budget: int | None = None, draft_top_k: int = 8, chain: bool = False,
                 draft_ring: int | None = None, chunk: int = 16, prefill: str = "kernels"):
        from .model.checkpoint import load_checkpoint
        from .model.tokenizer import load_tokenizer

        self.path = Path(path)
        self.engine = self._own_device = None
        if max_context is not None and (isinstance(max_context, bool) or not isinstance(max_context, int)
                                        or max_context < 2):
            raise LucegenError(f"max_context must be an integer of at least 2, got {max_context!r}")
        if device not in (None, "cpu", "gpu") and not hasattr(device, "target"):
            raise LucegenError(f"device must be 'cpu', 'gpu', None or an open Device, got {device!r}")
        self.tokenizer = load_tokenizer(self.path)
        self.stop_token_ids = stop_token_ids(self.path, self.tokenizer)
        self.special_tokens = special_tokens(self.path)
        self._chat_template = self._template(chat_template)
        checkpoint = load_checkpoint(self.path)
        self.config = checkpoint.config
        if device is None:
            device = "gpu" if gpu_visible() else "cpu"
            if device == "cpu":
                log.warning("no NVIDIA GPU visible: %s runs on the numpy reference (CPU), which suits tiny models",
                            self.path.name)
        if device == "cpu":
            if draft is not None:
                raise LucegenError("speculative decoding (a draft) runs on the GPU engines, not on the CPU")
            from .runtime.cpu_engine import CpuEngine

            limit = max_context or self.config.max_position_embeddings
            self.engine = CpuEngine(checkpoint, limit, kv_cache=kv_cache)
        else:
            self.engine = self._gpu_engine(checkpoint, draft, target, device, max_context, kv_cache, budget,
                                           draft_top_k, chain, draft_ring, chunk, prefill)
        log.debug("%s: %s, %d positions per sequence", self.path.name, self.engine.name, self.engine.max_context)

    def _template(self, override) -> ChatTemplate | None:
        return None if override is None else given_template(override)

    def _gpu_engine(self, checkpoint, draft, target, device, max_context, kv_cache, budget, draft_top_k, chain,
                    draft_ring, chunk, prefill):
        from .model.nvfp4_checkpoint import refuse_on_gpu
        from .runtime.device import Device
        from .runtime.gpu_engines import MegakernelEngine, QuantEngine, SpeculativeEngine
        from .runtime.memory_fit import available_bytes, forecast
        from .runtime.quant_target import QuantDecoder, open_target
        from .target import Target

        refuse_on_gpu(checkpoint)  # before the device is opened
        if prefill not in ("kernels", "megakernel"):
            raise LucegenError(f"prefill must be 'kernels' or 'megakernel', got {prefill!r}")
        if draft is not None and prefill != "kernels":
            raise LucegenError("speculative decoding needs prefill='kernels' (the draft's context comes from it)")
        if device == "gpu":
            dev = self._own_device = Device.open(target)
        else:  # an open Device: a descriptor name must be the one it was opened with
            dev = device
            if isinstance(target, str) and target not in (dev.target.name, str(getattr(dev.target, "path", ""))):
                raise LucegenError(f"target {target!r}: the device given was opened with {dev.target.name}")
        context = max_context or min(DEFAULT_GPU_CONTEXT, self.config.max_position_embeddings)
        decoder = None
        try:
            # before any allocation: a checkpoint or context the device cannot hold is one line saying what fits
            need = forecast(checkpoint, dev.target, kv_cache, prefill_kernels=prefill == "kernels",
                            speculative=draft is not None)
            need.check(context, available_bytes(dev), self.path.name, dev.name)
            decoder = open_target(checkpoint, target=target if isinstance(target, Target) else None,
                                  max_context=context, device=dev, kv_cache=kv_cache)
            if draft is not None:
                return SpeculativeEngine(decoder, draft, budget=budget, draft_top_k=draft_top_k, tree=not chain,
                                         draft_ring=draft_ring)
            if isinstance(decoder, QuantDecoder):
                if prefill != "kernels":
                    raise LucegenError("the quantised target prefills with the prefill kernels (prefill='kernels')")
                return QuantEngine(decoder, chunk=chunk)
            return MegakernelEngine(decoder, chunk=chunk, prefill=prefill)
        except BaseException:
            if decoder is not None:
                decoder.close()
            if self._own_device is not None:
                self._own_device.close()
                self._own_device = None
            raise

    # ---------------------------------------------------------------------------------------------- lifetime
    def close(self) -> None:
        """Free the engine's memory (every device allocation of a GPU engine)."""
        if getattr(self, "engine", None) is not None:
            self.engine.close()
            self.engine = None
        dev = getattr(self, "_own_device", None)
        if dev is not None:
            dev.close()
            self._own_device = None

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def max_context(self) -> int:
        return self._engine().max_context

    def _engine(self):
        if self.engine is None:
            raise LucegenError("this LLM is closed")
        return self.engine

    # ---------------------------------------------------------------------------------------------- prompts
    def encode(self, prompt: str | list[int]) -> list[int]:
        """``prompt`` as token ids (text is encoded with the model's tokenizer; special tokens written in the text,
        such as a chat template's ``<|im_start|>``, become their ids)."""
        if isinstance(prompt, str):
            ids = self.tokenizer.encode(prompt)
        elif isinstance(prompt, (list, tuple)) and all(isinstance(i, int) and not isinstance(i, bool)
                                                       for i in prompt):
            ids = list(prompt)
        else:
            raise LucegenError("the prompt must be a string or a list of token ids")
        if not ids:
            raise LucegenError("the prompt encodes to no tokens")
        vocab = self.config.vocab_size
        bad = [i for i in ids if not 0 <= i < vocab]
        if bad:
            raise LucegenError(f"prompt token id {bad[0]} is outside the model's vocabulary [0, {vocab})")
        return ids

    def chat_template(self, tools=None) -> ChatTemplate:
        """The template :meth:`chat` renders: the ``chat_template`` given, else the model's."""
        return self._chat_template or model_chat_template(self.path, tools)

    def apply_chat_template(self, messages, tools=None, add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text for ``messages``, as HF's ``tokenizer.apply_chat_template(messages, tools=tools,
        add_generation_prompt=..., tokenize=False, **kwargs)`` renders it (``enable_thinking=False`` and the like
        go in ``kwargs``)."""
        return self.chat_template(tools).render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                                                special_tokens=self.special_tokens, **kwargs)

    # ---------------------------------------------------------------------------------------------- generation
    def generate(self, prompt: str | list[int], **options) -> Completion:
        """Generate a completion of ``prompt`` (text or token ids). Options: ``max_tokens`` (default 256),
        ``temperature`` (0: greedy), ``top_p``, ``top_k``, ``min_p``, ``repetition_penalty``,
        ``presence_penalty``, ``frequency_penalty``, ``seed``, ``stop`` (strings), ``stop_token_ids`` (added
        to the model's), ``ignore_eos`` (the model's stop tokens do not stop it; ``stop_token_ids`` still do)."""
        request = self._request(prompt, **options)
        text, ids, last = [], [], None
        for piece in self._generate(*request):
            text.append(piece.text)
            ids.extend(piece.token_ids)
            last = piece
        return Completion("".join(text), ids, request[1], last.finish_reason, last.timings, last.stop_reason)

    def chat(self, messages, *, tools=None, chat_template_kwargs: dict | None = None, **options) -> Completion:
        """Generate the assistant's reply to ``messages`` (rendered with the chat template; ``tools`` and
        ``chat_template_kwargs`` such as ``{"enable_thinking": False}`` go to the template)."""
        prompt = self.apply_chat_template(messages, tools=tools, **(chat_template_kwargs or {}))
        return self.generate(prompt, **options)

    def stream(self, prompt: str | list[int], **options) -> Iterator[StreamPiece]:
        """Like :meth:`generate`, yielding :class:`StreamPiece` s as the tokens arrive. Every argument is
        checked when this is called, before any device work."""
        return self._generate(*self._request(prompt, **options))

    def _request(self, prompt, *, max_tokens: int = 256, temperature: float = 0.0, top_p: float = 1.0,
                 top_k: int = 0, min_p: float = 0.0, repetition_penalty: float = 1.0, presence_penalty: float = 0.0,
                 frequency_penalty: float = 0.0, seed: int = 0, stop=None, stop_token_ids=None,
                 ignore_eos: bool = False) -> tuple:
        """Every argument checked: (engine, prompt ids, params, max_tokens, stop strings, stop ids)."""
        engine = self._engine()
        params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed,
                                repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                                frequency_penalty=frequency_penalty).validate()
        engine.check_params(params)
        stops = check_stop_strings(stop)
        extra = check_stop_ids(stop_token_ids, self.config.vocab_size)
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise LucegenError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        ids = self.encode(prompt)
        # the last generated token is never consumed: prompt + max_tokens - 1 positions, plus the engine's reserve
        room = engine.max_context - engine.reserve - len(ids) + 1
        if room < 1:
            raise LucegenError(f"the prompt has {len(ids)} tokens; the context holds {engine.max_context} "
                               f"positions (max_context)")
        if max_tokens > room:
            raise LucegenError(f"the prompt ({len(ids)} tokens) + max_tokens {max_tokens} overflow the context of "
                               f"{engine.max_context} positions (max_context; at most {room} new tokens fit)")
        return engine, ids, params, max_tokens, stops, extra if ignore_eos else self.stop_token_ids | extra

    def _generate(self, engine, prompt: list[int], params: SamplingParams, max_tokens: int, stops: tuple[str, ...],
                  stop_ids: frozenset[int]) -> Iterator[StreamPiece]:
        text = TextStream(self.tokenizer, stops)
        generated: list[int] = []
        finish, reason = "length", None
        meter = engine.energy
        e0 = meter.read_mj() if meter is not None else None
        t0 = time.perf_counter()
        seq = engine.sequence()
        decoding = None
        try:
            first = seq.prefill(prompt, params)
            t1 = time.perf_counter()
            decoding = seq.decode(first, max_tokens - 1, params, prompt + [first])
            chunk = [first]
            while chunk:
                kept = []
                for token in chunk:
                    if token in stop_ids:
                        finish, reason = "stop", token
                        break
                    kept.append(token)
                    if len(generated) + len(kept) == max_tokens:
                        break
                generated.extend(kept)
                delta, stopped = text.push(kept)
                if stopped:
                    finish, reason = "stop", text.stopped
                if delta or kept:
                    yield StreamPiece(delta, kept)
                if finish == "stop" or len(generated) >= max_tokens:
                    break
                chunk = next(decoding, None)
            t2 = time.perf_counter()
            joules = energy_j(e0, meter.read_mj()) if e0 is not None else None
        finally:
            if decoding is not None:
                decoding.close()
            seq.close()
        tail = text.finish() if finish == "length" else ""
        decode_s = t2 - t1
        timings = Timings(prompt_tokens=len(prompt), generated_tokens=len(generated), ttft_s=t1 - t0,
                          prefill_tok_s=len(prompt) / max(t1 - t0, 1e-9), decode_s=decode_s,
                          decode_tok_s=(len(generated) - 1) / decode_s if len(generated) > 1 and decode_s > 0
                          else None, acceptance_length=seq.acceptance_length, energy_j=joules)
        yield StreamPiece(tail, [], finish, reason, timings)


def given_template(override: str | os.PathLike) -> ChatTemplate:
    """A template given by the caller: its text, or a path (``os.PathLike``) to a file holding it."""
    if isinstance(override, os.PathLike):
        return template_file(override)
    if isinstance(override, str):
        return ChatTemplate(override, "the chat_template argument")
    raise LucegenError(f"chat_template must be a template string or a path, got {type(override).__name__}")


def model_chat_template(path, tools=None) -> ChatTemplate:
    """The chat template of the checkpoint at ``path``; a ChatTemplateError saying where it was looked for when
    the model has none."""
    found = load_chat_template(path, tools)
    if found is None:
        raise ChatTemplateError(f"{path} has no chat template (tokenizer_config.json 'chat_template', "
                                "chat_template.jinja or GGUF 'tokenizer.chat_template'); pass chat_template= "
                                "(--chat-template-file) or generate from a plain prompt")
    return found


def chat_prompt(path, messages, *, chat_template: str | os.PathLike | None = None, tools=None,
                add_generation_prompt: bool = True, **kwargs) -> str:
    """:meth:`LLM.apply_chat_template` without loading the model: the prompt text for ``messages`` with the
    checkpoint's template (or ``chat_template``) and its special tokens."""
    template = given_template(chat_template) if chat_template is not None else model_chat_template(path, tools)
    return template.render(messages, tools=tools, add_generation_prompt=add_generation_prompt,
                           special_tokens=special_tokens(path), **kwargs)


def check_stop_strings(stop) -> tuple[str, ...]:
    """``stop``: None, a string, or a list of non-empty strings."""
    if stop is None:
        return ()
    values = [stop] if isinstance(stop, str) else stop
    if not isinstance(values, (list, tuple)) or not all(isinstance(s, str) for s in values):
        raise LucegenError(f"stop must be a string or a list of strings, got {stop!r}")
    if any(s == "" for s in values):
        raise LucegenError("stop strings must not be empty")
    return tuple(values)


def check_stop_ids(ids, vocab_size: int) -> frozenset[int]:
    if ids is None:
        return frozenset()
    if not isinstance(ids, (list, tuple, set, frozenset)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in ids):
        raise LucegenError(f"stop_token_ids must be token ids in [0, {vocab_size}), got {ids!r}")
    return frozenset(ids)
