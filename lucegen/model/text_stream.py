"""Generated token ids to text as they arrive: UTF-8 safe, with stop strings.

``TextStream(tokenizer, stop=["\\n\\n"])``; ``push(ids)`` returns the new text that is certain (a multi-byte
character split across tokens is held back until it is whole; so is a tail that could still become a stop string)
and whether a stop string appeared; ``finish()`` returns what was held back at the end of a generation that
stopped for another reason. A stop string ends the text where it begins and is not part of it; it may span token
boundaries. ``text`` is everything released so far.

Decoding follows the offsets scheme of vLLM's detokenizer: the ids since ``prefix`` are decoded with and without
the new ones, and the difference is the new text, so a tokenizer whose decoding of a token depends on its
neighbours (a leading-space marker) still gives the text the whole sequence decodes to.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"
#: tokens of context decoded before the new ones
CONTEXT_TOKENS = 6


class TextStream:
    def __init__(self, tokenizer, stop=()):
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.prefix = 0  # ids[prefix:read] decode to the tail of ``decoded``
        self.read = 0
        self.decoded = ""  # the text of ids[:read]
        self.text = ""  # released text
        self.stopped: str | None = None  # the stop string that ended the text

    def push(self, ids) -> tuple[str, bool]:
        if self.stopped is not None:
            return "", True
        self.ids.extend(int(i) for i in ids)
        before = self.tokenizer.decode(self.ids[self.prefix : self.read])
        after = self.tokenizer.decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith(REPLACEMENT) and after.startswith(before):
            self.decoded += after[len(before):]
            self.read = len(self.ids)
            self.prefix = max(0, self.read - CONTEXT_TOKENS)
        elif not after.endswith(REPLACEMENT) and not after.startswith(before):
            # the new tokens changed how the context decodes: take the whole sequence's text
            self.decoded = self.tokenizer.decode(self.ids)
            self.read = len(self.ids)
            self.prefix = max(0, self.read - CONTEXT_TOKENS)
        return self._release(final=False)

    def finish(self) -> str:
        """The held-back text at the end of the generation (a stop string that never completed is text)."""
        if self.stopped is not None:
            return ""
        if self.read < len(self.ids):  # an incomplete character at the very end: decode it as it is
            self.decoded = self.tokenizer.decode(self.ids)
            self.read = len(self.ids)
        return self._release(final=True)[0]

    def _release(self, final: bool) -> tuple[str, bool]:
        pending_from = len(self.text)
        # the earliest stop string that begins in the unreleased text (or in the held-back tail before it)
        start = max(0, pending_from - max((len(s) for s in self.stop), default=0) + 1)
        hits = [(self.decoded.find(s, start), s) for s in self.stop]
        hits = [(at, s) for at, s in hits if at >= 0]
        if hits:
            at, s = min(hits)
            new = self.decoded[pending_from:at] if at >= pending_from else ""
            self.text += new
            self.stopped = s
            return new, True
        end = len(self.decoded)
        if not final:
            end -= self._held(self.decoded)
        new = self.decoded[pending_from:max(end, pending_from)]
        self.text += new
        return new, False

    def _held(self, text: str) -> int:
        """Characters at the end of ``text`` that begin some stop string (to wait for the next tokens)."""
        longest = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), longest, -1):
                if text.endswith(s[:n]):
                    longest = n
                    break
        return longest
