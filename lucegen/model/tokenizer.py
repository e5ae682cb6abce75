"""Tokenizers: load a checkpoint's ``tokenizer.json`` (HF) or the vocabulary in a GGUF file. The byte-level BPE that
``lucegen init-weights`` writes beside random weights is :mod:`lucegen.model.init_tokenizer`'s."""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError
from .gguf_io import GGUFFile

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


def tokenizer_from_gguf(path):
    """Rebuild a byte-level BPE tokenizer from a GGUF's tokenizer.ggml.* metadata."""
    from tokenizers import AddedToken, Tokenizer as HFTokenizer, decoders, models, pre_tokenizers

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
        types = [1] * len(tokens)
    if (not isinstance(types, list) or len(types) != len(tokens)
            or not all(isinstance(k, int) and not isinstance(k, bool) for k in types)):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.token_type': not one integer per token "
                              f"({len(tokens)} tokens)")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.merges': not a list of strings")
    vocab = {t: i for i, (t, k) in enumerate(zip(tokens, types)) if k != 5}  # 5: UNUSED padding
    pairs = [tuple(m.split(" ", 1)) for m in merges if " " in m]
    try:  # the tokenizers library raises plain Exceptions (a merge of tokens not in the vocabulary, ...)
        inner = HFTokenizer(models.BPE(vocab=vocab, merges=pairs))
        inner.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        inner.decoder = decoders.ByteLevel()
        inner.add_special_tokens([AddedToken(t, special=True) for t, k in zip(tokens, types) if k == 3])
    except Exception as exc:
        raise CheckpointError(f"{path}: metadata 'tokenizer.ggml.*' does not form a BPE tokenizer: {exc}") from None
    eos = meta.get("tokenizer.ggml.eos_token_id")
    return Tokenizer(inner, path, eos if isinstance(eos, int) else None)
