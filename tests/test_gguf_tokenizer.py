"""A GGUF's tokenizer rebuilt as the model's own: a Qwen-style tokenizer.json written here (the pipeline of HF's
Qwen3.5 file: NFC, the Split regex llama.cpp quotes as "original regex from tokenizer.json", byte-level without its
own regex; special and non-special added tokens) and the GGUF written from it here through gguf's GGUFWriter
(CONTROL and USER_DEFINED token types, tokenizer.ggml.pre "qwen35" or "qwen2") give the same ids on generated text."""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

gguf = pytest.importorskip("gguf")
tokenizers = pytest.importorskip("tokenizers")

from lucegen.model.tokenizer import load_tokenizer  # noqa: E402

# Qwen's pre-tokenizer patterns as their tokenizer.json files hold them (llama.cpp src/llama-vocab.cpp quotes them
# above LLAMA_VOCAB_PRE_TYPE_QWEN2 and _QWEN35; transformers' Qwen2Converter writes the first).
HF_QWEN2 = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
HF_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
             r"|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ADDED = ["<think>", "</think>", "<tool_call>", "</tool_call>"]  # "special": false in Qwen's tokenizer.json
CORPUS = [
    "def main(x, y=3):\n    return x * y  # the product\n\n\nclass A:\n\tpass\n",
    "Qwen3.5 reads 12345 tokens; it's what they'll see. THE END'S NEAR!",
    "東京は日本の首都です。你好，世界！今天是2026年8月13日",
    "café naïve über résumé — emoji 🎉🚀👍🏽 and ∑∫ math ½",
    "<think>\nreasoning\n</think>\n\n<tool_call>{\"name\": \"f\"}</tool_call>",
]


def qwen_tokenizer_json(pattern: str) -> str:
    """A byte-level BPE trained on CORPUS with Qwen's pipeline, as a tokenizer.json text with Qwen's added tokens."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS * 20, trainer=trainer)
    data = json.loads(tok.to_str())
    n = len(data["model"]["vocab"])
    data["added_tokens"] = [{"id": n + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
                             "normalized": False, "special": t in SPECIAL} for i, t in enumerate(SPECIAL + ADDED)]
    return json.dumps(data)


def write_gguf_from(tokenizer_json: str, path, pre: str | None) -> None:
    """The tokenizer.ggml.* of llama.cpp's converter for this tokenizer.json: tokens by id, added special tokens
    CONTROL, the other added ones USER_DEFINED, merges as "a b" strings."""
    data = json.loads(tokenizer_json)
    by_id = {i: t for t, i in data["model"]["vocab"].items()}
    kinds = {}
    for a in data["added_tokens"]:
        by_id[a["id"]] = a["content"]
        kinds[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    n = max(by_id) + 1
    w = gguf.GGUFWriter(path, "qwen35")
    w.add_tokenizer_model("gpt2")
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list([by_id[i] for i in range(n)])
    w.add_token_types([kinds.get(i, gguf.TokenType.NORMAL) for i in range(n)])
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    w.add_eos_token_id(data["added_tokens"][2]["id"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    w.close()


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    """(HF tokenizer from tokenizer.json, lucegen's from the GGUF) for the qwen35 and qwen2 pre-tokenizers."""
    from tokenizers import Tokenizer

    root = tmp_path_factory.mktemp("tok")
    out = {}
    for pre, pattern in (("qwen35", HF_QWEN35), ("qwen2", HF_QWEN2)):
        text = qwen_tokenizer_json(pattern)
        (root / f"{pre}.json").write_text(text)
        write_gguf_from(text, root / f"{pre}.gguf", pre)
        out[pre] = (Tokenizer.from_file(str(root / f"{pre}.json")), load_tokenizer(root / f"{pre}.gguf"))
    return out


PIECES = st.sampled_from(["0", "7", "12345", "\n", "\n\n", "  ", "    ", "\t", "):\n", " x", "Word", "'s", "'LL", "'Re",
                          "東京", "你好，", "！", "🎉", "👍🏽", "e\u0301", "n\u0303o", "\u00e9", "a\u0308b", "∑",
                          " ", "<think>", "</think>", "<tool_call>", "<|im_end|>", "<|im_start|>", "<|endoftext|>",
                          "def f(x):", "  return", "'", "\"", "\r\n", "ΑΒΓ", "пример", "١٢٣", "½", "\u200b"])
TEXT = st.one_of(st.lists(PIECES, max_size=24).map("".join), st.text(max_size=40))


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(text=TEXT, pre=st.sampled_from(["qwen35", "qwen2"]))
def test_gguf_tokenizer_gives_the_ids_of_its_tokenizer_json(pairs, text, pre):
    hf, ours = pairs[pre]
    assert ours.encode(text) == hf.encode(text, add_special_tokens=False).ids


def test_added_tokens_are_one_token_each(pairs):
    hf, ours = pairs["qwen35"]
    for t in SPECIAL + ADDED:
        assert len(ours.encode(t)) == 1 and ours.encode(t) == [hf.token_to_id(t)], t
    assert ours.eos_id == hf.token_to_id("<|im_end|>")
    text = "<think>\nok\n</think>\n\n東京 🎉 e\u0301"
    assert ours.decode(ours.encode(text)) == "<think>\nok\n</think>\n\n東京 🎉 \u00e9"  # NFC, as HF's


def test_qwen35_keeps_combining_marks_with_their_letters(pairs):
    """The one difference of qwen35's split from qwen2's: a mark after punctuation (U+0301 after ')') joins the
    letter class, not the punctuation run."""
    from lucegen.model.tokenizer import QWEN2_SPLIT, QWEN35_SPLIT
    from tokenizers import Regex, pre_tokenizers

    text = "x)\u0301y"
    pieces = {p: [s for s, _ in pre_tokenizers.Split(Regex(pat), "isolated").pre_tokenize_str(text)]
              for p, pat in (("qwen2", QWEN2_SPLIT), ("qwen35", QWEN35_SPLIT))}
    assert pieces["qwen2"] != pieces["qwen35"], pieces


def test_the_qwen2_pipeline_is_transformers_converters():
    """lucegen's qwen2 pipeline (lucegen/model/tokenizer.py) pre-tokenizes as transformers' Qwen2Converter's does."""
    pytest.importorskip("transformers")
    from types import SimpleNamespace

    from transformers.convert_slow_tokenizer import Qwen2Converter

    from lucegen.model.tokenizer import QWEN2_SPLIT

    theirs = Qwen2Converter(SimpleNamespace(encoder={"a": 0}, bpe_ranks={})).converted()
    assert QWEN2_SPLIT in json.dumps(json.loads(theirs.to_str())["pre_tokenizer"]).replace("\\\\", "\\")
    assert json.loads(theirs.to_str())["normalizer"]["type"] == "NFC"


def test_unknown_and_missing_pre_tokenizers(tmp_path, caplog):
    """An unknown tokenizer.ggml.pre: one warning naming it and what is used instead (llama.cpp's default); none:
    llama.cpp's default without a warning."""
    text = qwen_tokenizer_json(HF_QWEN35)
    write_gguf_from(text, tmp_path / "odd.gguf", "martian-7")
    write_gguf_from(text, tmp_path / "none.gguf", None)
    with caplog.at_level(logging.WARNING):
        odd = load_tokenizer(tmp_path / "odd.gguf")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "'martian-7'" in warnings[0] and "llama.cpp's default" in warnings[0]
    assert "\n" not in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        none = load_tokenizer(tmp_path / "none.gguf")
    assert not [r for r in caplog.records if r.levelno == logging.WARNING]
    # the default splits punctuation runs off first: "x)" -> "x", ")"
    assert odd.encode("ab 12, cd") == none.encode("ab 12, cd")
    assert len(odd.encode("<think>")) == 1
