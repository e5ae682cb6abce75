"""The ``<think>`` splitter: generated text into reasoning and content, piece by piece, holding back only a tail
that may still turn out to be the start of a tag. (Tokens to text and stop strings: lucegen.model.text_stream.)"""

from __future__ import annotations

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


def partial_suffix(text: str, tags) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of one of ``tags`` (to hold back)."""
    best = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:n]):
                best = n
                break
    return best


class ThinkSplitter:
    """Splits generated text into reasoning (inside ``<think>...</think>``) and content. ``in_think``: the prompt
    already opened the block (Qwen's template ends the generation prompt with ``<think>\\n`` when thinking is on).
    ``feed(piece) -> [(kind, text)]`` with kind ``"reasoning"`` or ``"content"``; the newlines right after either
    tag are dropped, as the template writes them."""

    def __init__(self, in_think: bool):
        self.in_think = in_think
        self.held = ""
        self.strip_newlines = in_think  # at the start of a block
        self.seen_close = False

    def feed(self, piece: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        text = self.held + piece
        self.held = ""
        while text:
            tag = THINK_CLOSE if self.in_think else (None if self.seen_close else THINK_OPEN)
            if tag is None:
                self._emit(out, text)
                break
            at = text.find(tag)
            if at < 0:
                keep = partial_suffix(text, [tag])
                self._emit(out, text[:len(text) - keep])
                self.held = text[len(text) - keep:] if keep else ""
                break
            self._emit(out, text[:at])
            text = text[at + len(tag):]
            if self.in_think:
                self.seen_close = True
            self.in_think = not self.in_think
            self.strip_newlines = True
        return out

    def _emit(self, out: list, text: str) -> None:
        if self.strip_newlines:
            text = text.lstrip("\n")
            if not text:
                return
            self.strip_newlines = False
        if text:
            kind = "reasoning" if self.in_think else "content"
            if out and out[-1][0] == kind:
                out[-1] = (kind, out[-1][1] + text)
            else:
                out.append((kind, text))

    def flush(self) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        held, self.held = self.held, ""
        self._emit(out, held)
        return out
