"""A checkpoint's stop tokens: the ids that end a generation, read from every place a model states one.

For a HF directory the set is the union of
- ``generation_config.json``'s ``eos_token_id`` (an int or a list: Qwen3.5 lists ``<|im_end|>`` and
  ``<|endoftext|>``),
- ``config.json``'s top-level ``eos_token_id`` and its ``text_config.eos_token_id`` (Qwen3.5's multimodal config
  keeps it there), each an int or a list,
- ``tokenizer_config.json``'s ``eos_token`` (a string or an added-token dict ``{"content": ...}``), looked up in
  the tokenizer;
for a GGUF, the metadata ``tokenizer.ggml.eos_token_id`` and ``tokenizer.ggml.eot_token_id`` (and
``tokenizer.ggml.eom_token_id`` where a file has it). A malformed entry is a CheckpointError naming file and key.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..errors import CheckpointError
from .gguf_io import GGUFFile

GGUF_STOP_KEYS = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read JSON: {exc}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data


def _ids(value, where: str) -> set[int]:
    """An ``eos_token_id`` entry: None, an int, or a list of ints."""
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise CheckpointError(f"{where}: expected a non-negative token id or a list of them, got {value!r}")
    return set(values)


def token_text(value, where: str) -> str | None:
    """A special token as tokenizer_config.json states it: a string, an added-token dict, or null."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    raise CheckpointError(f"{where}: expected a token string or {{\"content\": ...}}, got {value!r}")


def stop_token_ids(path, tokenizer=None) -> frozenset[int]:
    """The stop set of the checkpoint at ``path`` (a HF directory, a file in one, or a GGUF); ``tokenizer`` (a
    lucegen Tokenizer) resolves tokenizer_config.json's eos_token to its id."""
    path = Path(path)
    if path.is_file() and path.suffix == ".gguf":
        meta = GGUFFile(path).metadata
        found: set[int] = set()
        for key in GGUF_STOP_KEYS:
            found |= _ids(meta.get(key), f"{path}: metadata {key!r}")
        return frozenset(found)
    directory = path if path.is_dir() else path.parent
    found = set()
    generation = directory / "generation_config.json"
    if generation.is_file():
        found |= _ids(_read_json(generation).get("eos_token_id"), f"{generation}: 'eos_token_id'")
    config_path = directory / "config.json"
    if config_path.is_file():
        config = _read_json(config_path)
        found |= _ids(config.get("eos_token_id"), f"{config_path}: 'eos_token_id'")
        text = config.get("text_config")
        if isinstance(text, dict):
            found |= _ids(text.get("eos_token_id"), f"{config_path}: 'text_config.eos_token_id'")
    tokenizer_config = directory / "tokenizer_config.json"
    if tokenizer_config.is_file() and tokenizer is not None:
        eos = token_text(_read_json(tokenizer_config).get("eos_token"), f"{tokenizer_config}: 'eos_token'")
        if eos is not None:
            token = tokenizer.inner.token_to_id(eos)
            if token is None:
                raise CheckpointError(f"{tokenizer_config}: 'eos_token' {eos!r} is not a token of "
                                      f"{tokenizer.source}")
            found.add(token)
    return frozenset(found)


def special_tokens(path) -> dict[str, str]:
    """tokenizer_config.json's special tokens by name (``bos_token``, ``eos_token``, ...), what HF's
    apply_chat_template passes to a chat template beside the messages; empty for a GGUF or a directory without
    the file."""
    path = Path(path)
    directory = path if path.is_dir() else path.parent
    file = directory / "tokenizer_config.json"
    if path.suffix == ".gguf" or not file.is_file():
        return {}
    config = _read_json(file)
    out = {}
    for name in ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"):
        text = token_text(config.get(name), f"{file}: {name!r}")
        if text is not None:
            out[name] = text
    return out
