"""Tokenizers: load a checkpoint's ``tokenizer.json`` (HF) or the vocabulary in a GGUF file. The byte-level BPE that
``lucegen init-weights`` writes beside random weights is :mod:`lucegen.model.init_tokenizer`'s."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from ..errors import CheckpointError
from .gguf_io import GGUFFile

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_ID = 0  # <|endoftext|>: specials take the first ids


class Tokenizer:
    """``encode(text) -> list[int]``, ``decode(ids) -> str``, ``vocab_size``, ``eos_id``."""

    def __init__(self, inner, source, eos_id: int | None = None):
        self.inner, self.source = inner, source
        self.eos_id = eos_id if eos_id is not None else inner.token_to_id(SPECIAL_TOKENS[0])

    @property
    def vocab_size(self) -> int:
        return self.inner.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str) -> list[int]:
        return list(self.inner.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        return self.inner.decode([int(i) for i in ids], skip_special_tokens=False)


def json_type(value) -> str:
    """The JSON name of a parsed value's type (for messages about a file's JSON)."""
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number",
            type(None): "null"}.get(type(value), type(value).__name__)


def load_tokenizer(path) -> Tokenizer:
    """From a HF checkpoint directory (or its tokenizer.json) or from a GGUF file's embedded vocabulary."""
    from tokenizers import Tokenizer as HFTokenizer

    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        return tokenizer_from_gguf(path)
    file = path / "tokenizer.json" if path.is_dir() else path
    if not file.is_file():
        raise CheckpointError(f"{file}: no tokenizer.json")
    try:
        inner = HFTokenizer.from_file(str(file))
    except Exception as exc:  # the tokenizers library raises plain Exceptions on bad JSON
        raise CheckpointError(f"{file}: cannot load tokenizer: {exc}") from None
    eos = None
    config_path = file.parent / "config.json"
    if config_path.is_file():
        try:
            config = json.loads(config_path.read_text())
        except (OSError, ValueError):
            config = {}
        if not isinstance(config, dict):
            raise CheckpointError(f"{config_path}: expected a JSON object, got {json_type(config)}")
        eos = config.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
    return Tokenizer(inner, file, eos if isinstance(eos, int) else None)


# The pre-tokenizers a GGUF's ``tokenizer.ggml.pre`` selects (llama.cpp src/llama-vocab.cpp, llama_vocab::impl::load
# and llm_tokenizer_bpe's regex_exprs): each a list of regexes applied in turn, matches and the text between them
# kept as pieces (HF's Split, behavior "isolated"), and whether HF's tokenizer.json for that family normalises to NFC
# first. The Qwen patterns are the "original regex from tokenizer.json" llama.cpp quotes (its own spell the
# case-insensitive contractions out), as transformers' Qwen2Converter writes the Qwen2 one.
QWEN2_SPLIT = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
#: Qwen3.5's: combining marks (\p{M}) stay with their letters and out of the punctuation runs.
QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
#: llama.cpp's LLAMA_VOCAB_PRE_TYPE_DEFAULT: four splits in turn (tokenizer.ggml.pre "default", or missing).
DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_SPLIT, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclasses.dataclass(frozen=True)
class PreTokenizer:
    name: str  # llama.cpp's LLAMA_VOCAB_PRE_TYPE_<name>
    splits: tuple[str, ...]
    nfc: bool


PRE_TOKENIZERS = {
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2"), PreTokenizer("QWEN2", (QWEN2_SPLIT,), True)),
    "qwen35": PreTokenizer("QWEN35", (QWEN35_SPLIT,), True),
    "gpt-2": PreTokenizer("GPT2", (GPT2_SPLIT,), False),
    "default": PreTokenizer("DEFAULT", DEFAULT_SPLITS, False),
}
#: Token types of tokenizer.ggml.token_type (llama.cpp's llama_token_type / gguf.TokenType).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def gguf_pre_tokenizer(path, pre) -> PreTokenizer:
    """The pre-tokenizer ``tokenizer.ggml.pre`` = ``pre`` selects; llama.cpp's default (with one warning naming the
    value) for one it does not know, and for none."""
    if pre is None:
        return PRE_TOKENIZERS["default"]
    if pre not in PRE_TOKENIZERS:
        log.warning("%s: tokenizer.ggml.pre %r is not a pre-tokenizer lucegen knows (%s); using llama.cpp's default "
                    "pre-tokenizer instead, so tokens may differ from the model's own tokenizer", path, pre,
                    ", ".join(sorted(PRE_TOKENIZERS)))
        return PRE_TOKENIZERS["default"]
    return PRE_TOKENIZERS[pre]


def tokenizer_from_gguf(path):
    """Rebuild the byte-level BPE tokenizer a GGUF's tokenizer.ggml.* metadata declares: the pre-tokenizer
    ``tokenizer.ggml.pre`` selects (:data:`PRE_TOKENIZERS`; NFC first where HF's tokenizer.json for that family has
    it), byte-level, the vocabulary and merges, CONTROL tokens as special added tokens and USER_DEFINED ones
    (``<think>``, ``<tool_call>``, ...) as added tokens: matched whole in the text, as in HF's tokenizer.json."""
    from tokenizers import AddedToken, Regex, Tokenizer as HFTokenizer, decoders, models, normalizers, pre_tokenizers

    g = GGUFFile(path)
    meta = g.metadata
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.model': {meta.get('tokenizer.ggml.model')!r} "
                              "is not a byte-level BPE ('gpt2')")
    tokens = meta.get("tokenizer.ggml.tokens")
    types = meta.get("tokenizer.ggml.token_type")
    merges = meta.get("tokenizer.ggml.merges", [])
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.tokens': missing or not a list of strings")
    if types is None:
        types = [NORMAL] * len(tokens)
    if (not isinstance(types, list) or len(types) != len(tokens)
            or not all(isinstance(k, int) and not isinstance(k, bool) for k in types)):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.token_type': not one integer per token "
                              f"({len(tokens)} tokens)")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.merges': not a list of strings")
    pre = meta.get("tokenizer.ggml.pre")
    if pre is not None and not isinstance(pre, str):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.pre': expected a string, got {pre!r}")
    spec = gguf_pre_tokenizer(path, pre)
    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k != UNUSED}
    pairs = [tuple(m.split(" ", 1)) for m in merges if " " in m]
    try:  # the tokenizers library raises plain Exceptions (a merge of tokens not in the vocabulary, ...)
        inner = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, continuing_subword_prefix="", end_of_word_suffix="",
                                       fuse_unk=False, byte_fallback=False))
        if spec.nfc:
            inner.normalizer = normalizers.NFC()
        inner.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in spec.splits]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        inner.decoder = decoders.ByteLevel()
        added = [(t, k) for t, k in zip(tokens, types) if k in (CONTROL, USER_DEFINED)]
        inner.add_tokens([AddedToken(t, special=k == CONTROL, normalized=False) for t, k in added])
    except Exception as exc:
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.*' does not form a BPE tokenizer: {exc}") from None
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(inner, path, eos if isinstance(eos, int) else None)
