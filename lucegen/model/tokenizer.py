"""Tokenizers: load a checkpoint's ``tokenizer.json`` (HF) or the vocabulary in a GGUF file, and build the small
byte-level BPE that ``lucegen init-weights`` writes beside random weights (trained offline on generated text, so
every command runs without a download; byte-level, so any text round-trips)."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

from ..atomic import atomic_write
from ..errors import CheckpointError

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS_ID = 0  # <|endoftext|>: specials take the first ids
MAX_GENERATED_VOCAB = 4096

_WORDS = (
    "the of and to in is that it for on with as was at by be this from or have an are not but all they which one "
    "you were her his had their there been has more when will would who so no if out up what about can into "
    "model token kernel layer weight block warp thread memory cache state value key query head attention decode "
    "prefill gate norm scale bias matrix vector sum product float half bfloat quantise tensor shape stride grid "
    "chip device host launch stream event barrier shared register spill occupancy bandwidth latency throughput "
    "river mountain city garden window morning evening summer winter music colour light water stone paper story"
).split()


def training_text(seed: int = 0, sentences: int = 4000) -> list[str]:
    """Deterministic English-like text with numbers, punctuation, code and some non-ASCII."""
    rnd = random.Random(seed)
    lines = []
    for i in range(sentences):
        words = [rnd.choice(_WORDS) for _ in range(rnd.randint(4, 16))]
        if i % 7 == 0:
            words.insert(rnd.randrange(len(words)), str(rnd.randint(0, 100000)))
        line = " ".join(words).capitalize() + rnd.choice([".", ".", "?", "!", ";", ":"])
        if i % 11 == 0:
            line = f"def {words[0]}_{words[1]}(x, y={i}):\n    return x * y + {rnd.random():.3f}"
        if i % 13 == 0:
            line += " — café naïve 東京 über"
        lines.append(line)
    return lines


@cache
def _build(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_text(), trainer=trainer)
    return tok.to_str()


def build_tokenizer(model_vocab_size: int):
    """A byte-level BPE whose ids are all < ``model_vocab_size``."""
    from tokenizers import Tokenizer

    size = min(model_vocab_size, MAX_GENERATED_VOCAB)
    if size < 256 + len(SPECIAL_TOKENS):
        raise CheckpointError(f"vocab_size {model_vocab_size} is too small for a byte-level tokenizer "
                              f"(needs {256 + len(SPECIAL_TOKENS)})")
    return Tokenizer.from_str(_build(size))


def write_tokenizer(out, model_vocab_size: int) -> None:
    out = Path(out)
    tok = build_tokenizer(model_vocab_size)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": SPECIAL_TOKENS[0],
        "pad_token": SPECIAL_TOKENS[0],
        "bos_token": None,
        "unk_token": None,
        "model_max_length": 262144,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    for name, text in (("tokenizer.json", tok.to_str()), ("tokenizer_config.json", json.dumps(config, indent=2))):
        atomic_write(out / name, text)


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
        from .gguf_io import tokenizer_from_gguf

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
