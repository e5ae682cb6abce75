"""Tiny replicas of what users download, written here without lucegen's writers: a Qwen3.5 HF directory saved by
transformers' own Qwen3_5ForConditionalGeneration (its config.json with text_config nesting and the real keys,
model.language_model.* and model.visual.* tensors in shards with an index, plus mtp.* tensors listed in the index),
generation_config.json, tokenizer_config.json and a Qwen-style tokenizer.json; and the GGUF llama.cpp's converter
would make of it, written through gguf's GGUFWriter with gguf's own QWEN35 tensor-name map and the converter's
changes (1 + w norms, ssm_a = -exp(A_log), ssm_dt.bias, squeezed conv1d, value heads to ggml's tiled order). Each
loads; the directory and its GGUF give the same numpy-reference logits, HF's model gives them too; the tokenizers
agree."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")

from test_gguf_tokenizer import ADDED, HF_QWEN35, SPECIAL, qwen_tokenizer_json  # noqa: E402  (tests/)

VOCAB = 768  # the tokenizer's ~710 tokens padded, as Qwen pads 248077 tokens to 248320
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=2,
            num_key_value_heads=1, head_dim=32, linear_key_head_dim=16, linear_value_head_dim=16,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
            max_position_embeddings=4096, tie_word_embeddings=False,
            rope_parameters={"rope_type": "default", "rope_theta": 1e7, "partial_rotary_factor": 0.25,
                             "mrope_interleaved": True, "mrope_section": [1, 1, 0]})
VISION = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=64, out_hidden_size=64,
              num_position_embeddings=16)


@pytest.fixture(scope="module")
def replica(tmp_path_factory):
    from safetensors.numpy import save_file
    from tokenizers import Tokenizer
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    root = tmp_path_factory.mktemp("replica")
    hf = root / "Qwen3.5-tiny"
    tok_json = qwen_tokenizer_json(HF_QWEN35)
    tok = Tokenizer.from_str(tok_json)
    im_end, eot = tok.token_to_id("<|im_end|>"), tok.token_to_id("<|endoftext|>")
    config = Qwen3_5Config(text_config={**TEXT, "eos_token_id": im_end}, vision_config=VISION,
                           tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3_5ForConditionalGeneration(config)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0, 0.3 if p.ndim == 1 else 0.08)
            if name.endswith("A_log"):
                p.uniform_(-1.0, 1.0)
    model.to(torch.bfloat16).save_pretrained(hf, max_shard_size="40KB")
    index_path = hf / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    assert len(set(index["weight_map"].values())) > 1, "the replica is sharded"
    mtp = {"mtp.fc.weight": np.zeros((64, 128), np.float32), "mtp.layers.0.input_layernorm.weight": np.ones(64, np.float32),
           "mtp.norm.weight": np.ones(64, np.float32)}
    save_file(mtp, str(hf / "model-mtp.safetensors"))
    index["weight_map"].update({n: "model-mtp.safetensors" for n in mtp})
    index_path.write_text(json.dumps(index))
    (hf / "tokenizer.json").write_text(tok_json)
    (hf / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "model_max_length": 262144, "add_bos_token": False, "split_special_tokens": False,
        "chat_template": "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"}))
    (hf / "generation_config.json").write_text(json.dumps({"bos_token_id": eot, "eos_token_id": [im_end, eot],
                                                           "pad_token_id": eot, "do_sample": True,
                                                           "temperature": 0.6, "top_k": 20, "top_p": 0.95}))
    write_llama_cpp_gguf(model, config.text_config, tok_json, root / "Qwen3.5-tiny-BF16.gguf")
    return root, hf, root / "Qwen3.5-tiny-BF16.gguf", model


def tiled(num_k: int, num_v: int) -> np.ndarray:
    """llama.cpp's value-head reorder: tiled position v * num_k + g holds HF's grouped head g * (num_v / num_k) + v."""
    r = num_v // num_k
    return np.array([(p % num_k) * r + p // num_k for p in range(num_v)])


def write_llama_cpp_gguf(model, text, tok_json: str, path) -> None:
    """What convert_hf_to_gguf.py's Qwen3_5TextModel writes for the text model: qwen35 metadata, gguf's tensor names,
    matrices BF16 (the same bits), vectors F32, the converter's changes applied; the tokenizer as llama.cpp's
    gpt2 vocabulary with pre "qwen35", padded with UNUSED tokens."""
    nk, nv, dk, dv = (text.linear_num_key_heads, text.linear_num_value_heads, text.linear_key_head_dim,
                      text.linear_value_head_dim)
    order = tiled(nk, nv)
    rows = lambda d: (order[:, None] * d + np.arange(d)).reshape(-1)  # noqa: E731
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.QWEN35, text.num_hidden_layers)
    w = gguf.GGUFWriter(path, "qwen35")
    w.add_name("Qwen3.5-tiny")
    w.add_file_type(32)  # LLAMA_FTYPE_MOSTLY_BF16
    w.add_context_length(text.max_position_embeddings)
    w.add_embedding_length(text.hidden_size)
    w.add_block_count(text.num_hidden_layers)
    w.add_feed_forward_length(text.intermediate_size)
    w.add_head_count(text.num_attention_heads)
    w.add_head_count_kv(text.num_key_value_heads)
    w.add_key_length(text.head_dim)
    w.add_value_length(text.head_dim)
    w.add_rope_freq_base(text.rope_parameters["rope_theta"])
    w.add_rope_dimension_count(int(text.head_dim * text.rope_parameters["partial_rotary_factor"]))
    w.add_rope_dimension_sections([1, 1, 0, 0])
    w.add_layer_norm_rms_eps(text.rms_norm_eps)
    w.add_ssm_conv_kernel(text.linear_conv_kernel_dim)
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(nv * dv)
    w.add_full_attention_interval(4)
    data = json.loads(tok_json)
    by_id = {i: t for t, i in data["model"]["vocab"].items()}
    kinds = {}
    for a in data["added_tokens"]:
        by_id[a["id"]] = a["content"]
        kinds[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    tokens = [by_id.get(i, f"[PAD{i}]") for i in range(text.vocab_size)]
    types = [kinds.get(i, gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED) for i in range(text.vocab_size)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen35")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in data["model"]["merges"]])
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_add_bos_token(False)
    for hf_name, p in model.state_dict().items():
        if not (hf_name.startswith("model.language_model.") or hf_name == "lm_head.weight"):
            continue  # the vision tower goes to an mmproj file
        name = hf_name.replace("model.language_model.", "model.", 1)
        x = p.float().numpy()
        leaf = name.rsplit(".", 1)[0]
        bias = name.endswith("dt_bias")
        if name.endswith(("input_layernorm.weight", "post_attention_layernorm.weight", "q_norm.weight",
                          "k_norm.weight")) or name == "model.norm.weight":
            x = x + 1
        if name.endswith("A_log"):
            x, leaf = -np.exp(x), name
        if bias:
            leaf = name.replace("dt_bias", "dt_proj")
        if name.endswith("conv1d.weight"):
            x = x[:, 0, :]
        if nv != nk and ".linear_attn." in name:
            if name.endswith(("in_proj_qkv.weight", "conv1d.weight")):
                x = np.concatenate([x[: 2 * nk * dk], x[2 * nk * dk :][rows(dv)]])
            elif name.endswith("in_proj_z.weight"):
                x = x[rows(dv)]
            elif name.endswith(("in_proj_a.weight", "in_proj_b.weight", "A_log", "dt_bias")):
                x = x[order]
            elif name.endswith("out_proj.weight"):
                x = x[:, rows(dv)]
        gname = names.get_name(leaf)
        assert gname is not None, name
        gname += ".bias" if bias else ("" if name.endswith("A_log") else ".weight")
        x = np.ascontiguousarray(x, np.float32)
        if x.ndim == 2 and not name.endswith("conv1d.weight"):
            bits = (x.view(np.uint32) >> 16).astype(np.uint16)  # exact: the values are BF16 already
            w.add_tensor(gname, bits, raw_shape=x.shape, raw_dtype=gguf.GGMLQuantizationType.BF16)
        else:
            w.add_tensor(gname, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_the_replica_and_its_gguf_load_as_one_model(replica):
    from lucegen.model.checkpoint import load_checkpoint

    root, hf, gg, _ = replica
    a, b = load_checkpoint(hf), load_checkpoint(gg)
    assert a.config.to_hf_config() == b.config.to_hf_config()
    assert a.names() == b.names() and not [n for n in a.names() if "visual" in n or "mtp" in n]
    index = json.loads((hf / "model.safetensors.index.json").read_text())["weight_map"]
    assert any(n.startswith("model.visual.") for n in index) and any(n.startswith("mtp.") for n in index)
    for name in a.names():
        x, y = a.f32(name), b.f32(name)
        assert np.allclose(x, y, rtol=1e-6, atol=1e-6 * (1 + np.abs(x).max())), name


def test_the_replica_and_its_gguf_give_the_same_logits(replica):
    """The numpy Reference over the HF directory and over its GGUF, and HF's own model over the directory."""
    from lucegen.model.checkpoint import load_checkpoint
    from lucegen.model.reference import Reference

    root, hf, gg, model = replica
    tokens = np.array([5, 17, 300, 2, 9, 44, 101, 7, 7, 600, 3], np.int32)
    logits = []
    for path in (hf, gg):
        ck = load_checkpoint(path)
        ref = Reference(ck.config, ck)
        logits.append(ref.forward(tokens, ref.new_state(32)))
    np.testing.assert_allclose(logits[1], logits[0], rtol=2e-4, atol=2e-4 * np.abs(logits[0]).max())
    with torch.no_grad():
        theirs = model.float()(input_ids=torch.tensor(tokens[None], dtype=torch.long)).logits[0].numpy()
    assert np.abs(theirs - logits[0]).max() <= 2e-3 * np.abs(theirs).max()


def test_the_replica_and_its_gguf_tokenize_alike(replica):
    from lucegen.model.tokenizer import load_tokenizer

    root, hf, gg, _ = replica
    a, b = load_tokenizer(hf), load_tokenizer(gg)
    for text in ["def f(x):\n    return 12345\n\n", "<think>\nplan\n</think>\n\n<tool_call>{}</tool_call>",
                 "東京 🎉 cafe\u0301 <|im_start|>user\nhi<|im_end|>\n"] + [t * 2 for t in SPECIAL + ADDED]:
        assert a.encode(text) == b.encode(text), text
