"""The engine thread: ``slots`` sequences, a bounded FIFO queue in front of them, and the prefix cache.

One thread owns the engine. Each turn of its loop it admits queued jobs into free slots (prefilling their prompts)
and then advances every active slot by one engine step, in slot order: one ``next()`` of the slot's decode
generator, which is one token on a host-sampling engine and a chunk on a GPU engine. The slots are stepped one after
another, not batched into one pass; a sequence's tokens depend only on its own state, so a greedy request gives the
same tokens alone and under load.

A job that is cancelled (its client went away, or its stop string appeared) is dropped at the next turn: its
decode generator is closed, so the engine does no more work for it, and its slot is free for the next job.

Prefix cache: when the engine's sequences can be snapshotted (the CPU engine's: ``snapshot()``/``restore()``), a
slot keeps its sequence after a job, with snapshots one token before the end of the prompt and at the end of the
completion (every token consumed). A new job goes to the free slot holding the longest snapshot whose tokens are a
proper prefix of its prompt (a multi-turn chat resends the conversation; a repeated prompt matches the first
snapshot): the sequence is restored to it (KV cache, conv windows and DeltaNet states as they were there) and only
the rest of the prompt is prefilled. A prompt is always prefilled as "all but its last token, then the last token",
so a repeated prompt gives the same logits whether it resumes or starts afresh (and the sampler's draw is a
function of the seed and the token's position, so the same tokens).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

from ..errors import LucegenError

log = logging.getLogger("lucegen.serve")


#: snapshots a slot keeps (the longest: a conversation's latest turns)
MAX_SNAPSHOTS = 4


class QueueFull(LucegenError):
    """Every slot is busy and the queue is full (HTTP 429)."""

    status = 429


class ShuttingDown(LucegenError):
    """The server stops: no new jobs (HTTP 503)."""

    status = 503


@dataclass
class ThinkBudget:
    """Close the think block after ``max_tokens`` tokens of thinking: ``close_ids`` (a newline, ``</think>`` and the
    blank line after it) are fed to the sequence after the last sampled token and emitted as generated tokens, and
    decoding goes on from there. ``in_think``: the prompt opened the block."""

    max_tokens: int
    close_ids: list[int]
    in_think: bool
    close_text: str = "</think>"
    open_text: str = "<think>"


@dataclass
class Job:
    """One generation: the prompt's token ids, how many tokens at most, how to pick them, the ids that end it.
    ``emit(event)`` is called on the engine thread with ("tokens", [ids]), then once ("done", reason) or ("error",
    message). reason: "stop" (a stop token), "length" (max_tokens), "cancelled" (``cancel()``: the client left, or
    a stop string appeared in the text)."""

    prompt: list[int]
    max_tokens: int
    params: object  # lucegen.model.sampling.SamplingParams
    stop_ids: frozenset
    emit: Callable
    think: ThinkBudget | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    generated: list[int] = field(default_factory=list)
    cached_tokens: int = 0
    arrival: float = field(default_factory=time.perf_counter)
    first_token_at: float | None = None
    last_token_at: float | None = None
    thinking_tokens: int = 0
    think_text: str = ""  # the tail of the generated text, to see the think block close
    stopped_by_shutdown: bool = False

    def cancel(self) -> None:
        self.cancelled.set()


@dataclass
class Snapshot:
    tokens: tuple  # the tokens the state has consumed
    state: object


@dataclass
class Slot:
    index: int
    seq: object = None
    job: Job | None = None
    gen: object = None
    history: list = field(default_factory=list)
    snapshots: list = field(default_factory=list)
    last_used: float = 0.0


class Scheduler:
    """``Scheduler(engine, tokenizer, slots, queue_size, metrics, sequence_factory)``. ``sequence_factory()`` opens a
    sequence of the engine (default ``engine.sequence``); sequences with ``snapshot``/``restore`` (and ``prefill``
    from their current position) get the prefix cache and the thinking budget."""

    def __init__(self, engine, tokenizer, slots: int, queue_size: int, metrics, sequence_factory=None):
        if slots < 1:
            raise LucegenError(f"--slots must be at least 1, got {slots}")
        self.engine, self.tokenizer, self.metrics = engine, tokenizer, metrics
        self.new_sequence = sequence_factory or engine.sequence
        self.slots = [Slot(i) for i in range(slots)]
        self.queue: deque[Job] = deque()
        self.queue_size = queue_size
        self.lock = threading.Condition()
        self.running = True
        self.thread = threading.Thread(target=self._loop, name="lucegen-engine", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------------------------------ from the server
    def submit(self, job: Job) -> None:
        with self.lock:
            if not self.running:
                raise ShuttingDown("the server is shutting down")
            if len(self.queue) >= self.queue_size:
                raise QueueFull(f"all {len(self.slots)} slots are busy and {len(self.queue)} requests are queued")
            self.queue.append(job)
            self.metrics.queue_depth.set(len(self.queue))
            self.lock.notify()

    def active(self) -> int:
        return sum(1 for s in self.slots if s.job is not None)

    def waiting(self) -> int:
        return len(self.queue)

    def shutdown(self, timeout: float = 30.0) -> None:
        """Stop admitting; end queued jobs with an error; let the active ones finish for up to ``timeout`` seconds,
        then end them with an error too; stop the thread, closing every sequence. Safe to call again."""
        with self.lock:
            self.running = False
            while self.queue:
                self.queue.popleft().emit(("error", "the server is shutting down"))
            self.metrics.queue_depth.set(0)
            self.lock.notify()
        deadline = time.monotonic() + timeout
        while self.active() and time.monotonic() < deadline:
            time.sleep(0.01)
        for slot in self.slots:
            job = slot.job
            if job is not None:
                job.stopped_by_shutdown = True
                job.cancel()
        with self.lock:
            self.lock.notify()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------------------------------------ engine thread
    def _loop(self) -> None:
        while True:
            with self.lock:
                while self.running and not self.queue and not self.active():
                    self.lock.wait(timeout=0.5)
                if not self.running and not self.active():
                    break
                admitted = []
                while self.queue and any(s.job is None for s in self.slots):
                    job = self.queue.popleft()
                    admitted.append((self._choose_slot(job), job))
                self.metrics.queue_depth.set(len(self.queue))
            for slot, job in admitted:
                self._start(slot, job)
            for slot in self.slots:
                if slot.job is not None:
                    self._step(slot)
            self.metrics.active_slots.set(self.active())
        for slot in self.slots:
            self._drop_sequence(slot)
        self.metrics.active_slots.set(0)

    def _choose_slot(self, job: Job) -> Slot:
        """The free slot with the longest usable snapshot (a prefix of the prompt), else the least recently used;
        marked taken (under the lock)."""
        best, best_len = None, -1
        for slot in self.slots:
            if slot.job is not None:
                continue
            n = max((len(s.tokens) for s in slot.snapshots if _usable(s, job.prompt)), default=0)
            if n > best_len or (n == best_len and slot.last_used < best.last_used):
                best, best_len = slot, n
        best.job = job
        return best

    def _start(self, slot: Slot, job: Job) -> None:
        prompt = list(job.prompt)
        try:
            if job.cancelled.is_set():
                raise _Cancelled
            snap = max((s for s in slot.snapshots if _usable(s, prompt)), key=lambda s: len(s.tokens), default=None)
            if snap is not None:
                slot.seq.restore(snap.state)
                job.cached_tokens = len(snap.tokens)
                slot.snapshots = [s for s in slot.snapshots if len(s.tokens) <= len(snap.tokens)]
            else:
                self._drop_sequence(slot)
                slot.seq = self.new_sequence()
            rest = prompt[job.cached_tokens:]
            if hasattr(slot.seq, "snapshot") and len(rest) > 1:
                # a snapshot one token short of the prompt's end: the same prompt again resumes there
                slot.seq.prefill(rest[:-1], job.params, history=prompt)
                slot.snapshots.append(Snapshot(tuple(prompt[:-1]), slot.seq.snapshot()))
                rest = rest[-1:]
            first = slot.seq.prefill(rest, job.params, history=prompt)
            del slot.snapshots[:-MAX_SNAPSHOTS]
            self.metrics.prompt_tokens.inc(len(prompt))
            self.metrics.cached_tokens.inc(job.cached_tokens)
            slot.history = prompt + [first]
            slot.gen = None
            self._accept(slot, [first])
        except _Cancelled:
            self._release(slot, None)
        except LucegenError as exc:
            job.emit(("error", str(exc)))
            self._release(slot, None, keep=False)
        except Exception as exc:  # an engine failure ends this job, not the server
            log.exception("engine failure while prefilling")
            job.emit(("error", f"engine failure: {type(exc).__name__}: {exc}"))
            self._release(slot, None, keep=False)

    def _step(self, slot: Slot) -> None:
        job = slot.job
        if job.cancelled.is_set():
            self._release(slot, None)
            return
        try:
            if slot.gen is None:
                remaining = job.max_tokens - len(job.generated)
                slot.gen = slot.seq.decode(slot.history[-1], remaining, job.params, slot.history)
            chunk = next(slot.gen, None)
            if chunk is None:
                self._release(slot, "length")
                return
            self._accept(slot, list(chunk))
        except LucegenError as exc:
            job.emit(("error", str(exc)))
            self._release(slot, None, keep=False)
        except Exception as exc:
            log.exception("engine failure while decoding")
            job.emit(("error", f"engine failure: {type(exc).__name__}: {exc}"))
            self._release(slot, None, keep=False)

    def _accept(self, slot: Slot, chunk: list[int]) -> None:
        """Take the tokens of one engine step: emit them up to a stop token or max_tokens, then apply the thinking
        budget."""
        job = slot.job
        now = time.perf_counter()
        if job.first_token_at is None:
            job.first_token_at = now
            self.metrics.ttft.observe(now - job.arrival)
        else:
            self.metrics.itl.observe((now - job.last_token_at) / max(1, len(chunk)))
        job.last_token_at = now
        acceptance = getattr(slot.seq, "acceptance_length", None)
        if acceptance:
            self.metrics.acceptance.observe(acceptance)
        out, reason = [], None
        for token in chunk:
            if token in job.stop_ids:
                reason = "stop"
                break
            out.append(token)
            if len(job.generated) + len(out) >= job.max_tokens:
                reason = "length"
                break
        job.generated.extend(out)
        self.metrics.generated_tokens.inc(len(out))
        if out:
            job.emit(("tokens", out))
        if reason is not None:
            self._release(slot, reason)
        elif job.think is not None:
            self._think_budget(slot, out)

    def _think_budget(self, slot: Slot, tokens: list[int]) -> None:
        job, think = slot.job, slot.job.think
        text = job.think_text + self.tokenizer.decode(tokens)
        if think.in_think:
            job.thinking_tokens += len(tokens)
            if think.close_text in text:
                think.in_think = False
        elif think.open_text in text:
            think.in_think = True
            job.thinking_tokens = 0
        job.think_text = text[-32:]
        if not think.in_think or job.thinking_tokens < think.max_tokens or not hasattr(slot.seq, "snapshot"):
            return
        # close the block: after the last token (picked, not yet consumed) come the closing tokens
        if slot.gen is not None:
            slot.gen.close()
            slot.gen = None
        think.in_think = False
        forced = list(think.close_ids)[:job.max_tokens - len(job.generated)]
        job.generated.extend(forced)
        self.metrics.generated_tokens.inc(len(forced))
        if forced:
            job.emit(("tokens", forced))
        if len(job.generated) >= job.max_tokens:
            self._release(slot, "length")
            return
        consume = [slot.history[-1], *forced]
        slot.history.extend(forced)
        nxt = slot.seq.prefill(consume, job.params, history=slot.history)
        slot.history.append(nxt)
        self._accept(slot, [nxt])

    def _release(self, slot: Slot, reason: str | None, keep: bool = True) -> None:
        job = slot.job
        if slot.gen is not None:
            slot.gen.close()
            slot.gen = None
        if job is not None and reason is not None:
            job.emit(("done", reason))
        elif job is not None and job.stopped_by_shutdown:
            job.emit(("error", "the server shut down before this request finished"))
        elif job is not None and job.cancelled.is_set():
            job.emit(("done", "cancelled"))
        if keep and hasattr(slot.seq, "snapshot") and slot.seq is not None and slot.history:
            consumed = tuple(slot.history[:-1])  # the last token was picked, not consumed
            if len(consumed) > 0 and not any(s.tokens == consumed for s in slot.snapshots):
                slot.snapshots.append(Snapshot(consumed, slot.seq.snapshot()))
        elif not keep or not hasattr(slot.seq, "snapshot"):
            self._drop_sequence(slot)
        slot.history = []
        slot.last_used = time.monotonic()
        with self.lock:
            slot.job = None
            self.lock.notify()

    def _drop_sequence(self, slot: Slot) -> None:
        if slot.gen is not None:
            slot.gen.close()
            slot.gen = None
        if slot.seq is not None:
            slot.seq.close()
            slot.seq = None
        slot.snapshots = []


class _Cancelled(Exception):
    pass


def _usable(snap: Snapshot, prompt: list[int]) -> bool:
    """A snapshot resumes ``prompt`` when its tokens are a proper prefix of it (at least one token is left to
    prefill: the first token is picked from its logits)."""
    n = len(snap.tokens)
    if n >= len(prompt) or n == 0:
        return False
    return tuple(prompt[:n]) == snap.tokens
