"""The small byte-level BPE that ``lucegen init-weights`` writes beside random weights: trained offline on generated
text, so every command runs without a download; byte-level, so any text round-trips."""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

from ..atomic import atomic_write
from ..errors import CheckpointError
from .tokenizer import SPECIAL_TOKENS

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
