"""Random-weight GGUF files in llama.cpp's ``qwen35`` layout (:mod:`lucegen.model.gguf_io` reads them): the values
of :mod:`lucegen.model.init_weights` for the same seed, in any of its quantisations (the Q4_K_M mix as llama.cpp
chooses it), with the generated tokenizer embedded. A streaming writer through ``gguf.GGUFWriter`` (imported
lazily)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from .config import ModelConfig
from .gguf_io import ARCH, gguf_name, to_gguf_layout
from .init_tokenizer import build_tokenizer
from .init_weights import Progress, checkpoint_config, init_tensor_f32, tensor_rng
from .quant import TYPES, nbytes, pack_k_scales, quantize
from .tokenizer import SPECIAL_TOKENS


def use_more_bits(i: int, n: int) -> bool:
    """llama.cpp's choice of layers that get more bits in the _M mixes (src/llama-quant.cpp)."""
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


#: llama.cpp's fallback for a row length that is not a multiple of the block (tensor_type_fallback); F16 where the
#: fallback's 32 does not divide it either.
_FALLBACK = {"Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}
#: The quantised tensors of a qwen35 model that a quantiser keeps in F32: the DeltaNet gates' projections, small
#: ([value heads, hidden]) and read by a recurrence that compounds their rounding (turbo-tan/llama.cpp-tq3 PR 75,
#: "keep hybrid-SSM state gates (ssm_alpha/ssm_beta) in f32 by default"; the mix issue 68 reports of a real 27B file).
F32_GATES = ("ssm_alpha.weight", "ssm_beta.weight")


def _fallback(kind: str, row: int) -> str:
    if row % TYPES[kind][1]:
        kind = _FALLBACK.get(kind, kind)
        if row % TYPES[kind][1]:
            kind = "F16"
    return kind


def _quantised(g: str, shape) -> bool:
    """llama.cpp's tensor_allows_quantization for a qwen35 tensor: 2-D weights but norms and ssm_conv1d."""
    return len(shape) >= 2 and g.endswith("weight") and "_norm.weight" not in g and "ssm_conv1d" not in g


def q4_k_m_types(config: ModelConfig) -> dict[str, str]:
    """LLAMA_FTYPE_MOSTLY_Q4_K_M as current llama.cpp chooses it for a qwen35 model (src/llama-quant.cpp,
    llama_tensor_get_type_impl at ggml-org/llama.cpp 007dbbf): Q4_K by default; output (token_embd when tied) Q6_K
    (Q8_0 for rows not a multiple of 256); attn_v *and* attn_qkv are one category (category_is_attn_v), counted
    together in llama.cpp's tensor order (layer, then name: one of the two per layer), Q6_K where use_more_bits(i, n)
    for the i-th of n; ffn_down Q6_K in the use_more_bits layers; ssm_out and the rest Q4_K; ssm_alpha / ssm_beta
    kept F32 (:data:`F32_GATES`); norms, 1-D tensors and ssm_conv1d F32. Rows not divisible by the block fall back as
    llama.cpp does."""
    shapes = config.tensor_shapes()
    wv = [n for n in shapes if gguf_name(n).endswith(("attn_v.weight", "attn_qkv.weight"))]
    wv.sort(key=lambda n: int(n.split(".")[1]))
    i_wv = {n: i for i, n in enumerate(wv)}
    types = {}
    for name, shape in shapes.items():
        g = gguf_name(name)
        if not _quantised(g, shape) or g.endswith(F32_GATES):
            types[name] = "F32"
            continue
        kind = "Q4_K"
        if g == "output.weight" or (config.tie_word_embeddings and g == "token_embd.weight"):
            kind = "Q6_K" if shape[1] % 256 == 0 else "Q8_0"
        elif name in i_wv:
            kind = "Q6_K" if use_more_bits(i_wv[name], len(wv)) else "Q4_K"
        elif g.endswith("ffn_down.weight"):
            kind = "Q6_K" if use_more_bits(int(g.split(".")[1]), config.num_layers) else "Q4_K"
        types[name] = _fallback(kind, shape[-1])
    return types


def q4_k_m_legacy_types(config: ModelConfig) -> dict[str, str]:
    """The Q4_K_M mix of llama.cpp before attn_qkv joined attn_v's category (llama_tensor_get_type at ggml-org/llama.cpp
    8784689), which lucegen wrote until it followed the current one: Q4_K by default; output (token_embd when tied)
    Q6_K; attn_v Q6_K in the use_more_bits attn_v layers (counted over attn_v alone); ffn_down Q6_K in the
    use_more_bits layers; attn_qkv Q5_K; ssm_alpha / ssm_beta Q4_K; norms, 1-D tensors and ssm_conv1d F32."""
    types = {}
    n_v = len(config.full_attention_layers)
    i_v = 0
    for name, shape in config.tensor_shapes().items():
        g = gguf_name(name)
        if not _quantised(g, shape):
            types[name] = "F32"
            continue
        kind = "Q4_K"
        if g == "output.weight" or (config.tie_word_embeddings and g == "token_embd.weight"):
            kind = "Q6_K" if shape[1] % 256 == 0 else "Q8_0"
        elif g.endswith("attn_v.weight"):
            kind = "Q6_K" if use_more_bits(i_v, n_v) else "Q4_K"
            i_v += 1
        elif g.endswith("ffn_down.weight"):
            kind = "Q6_K" if use_more_bits(int(g.split(".")[1]), config.num_layers) else "Q4_K"
        elif g.endswith("attn_qkv.weight"):
            kind = "Q5_K"
        types[name] = _fallback(kind, shape[-1])
    return types


#: The K-quant mixes by --quant name.
K_MIXES = {"q4_k_m": q4_k_m_types, "q4_k_m_legacy": q4_k_m_legacy_types}


def tensor_types(config: ModelConfig, quant: str) -> dict[str, str]:
    if quant in K_MIXES:
        return K_MIXES[quant](config)
    base = {"bf16": "BF16", "f16": "F16", "f32": "F32", "q8_0": "Q8_0", "q4_0": "Q4_0"}[quant]
    out = {}
    for name, shape in config.tensor_shapes().items():
        g = gguf_name(name)
        small = len(shape) < 2 or "_norm.weight" in g or "ssm_conv1d" in g
        kind = "F32" if small else base
        if shape[-1] % TYPES[kind][1]:
            kind = "F16"
        out[name] = kind
    return out


FILE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "q4_k_m": 15, "q4_k_m_legacy": 15, "bf16": 32}  # llama_ftype


def random_k_blocks(rng: np.random.Generator, type_name: str, n_blocks: int, std: float) -> np.ndarray:
    """Valid random blocks of a K-quant (or Q8_0) whose values have mean ~0 and standard deviation ~std: random
    quants, 6-bit sub-scales in 32..63, super-scales set so the values are centred. For files too large to
    quantise from floats in reasonable time (27B)."""
    size = TYPES[type_name][2]
    blocks = np.frombuffer(rng.bytes(n_blocks * size), np.uint8).reshape(n_blocks, size).copy()
    if type_name in ("Q4_K", "Q5_K"):
        nmax = 15 if type_name == "Q4_K" else 31
        sc = rng.integers(32, 64, size=(n_blocks, 8), dtype=np.uint8)
        # x = d*sc*q - dmin*m with q ~ U{0..nmax}: std = d*sc*sqrt(((nmax+1)^2-1)/12); centre with dmin*m = d*sc*nmax/2
        d = np.float32(std / (47.5 * np.sqrt(((nmax + 1) ** 2 - 1) / 12)))
        blocks[:, 0:2] = np.full((n_blocks, 1), d, np.float16).view(np.uint8)
        blocks[:, 2:4] = np.full((n_blocks, 1), d * nmax / 2, np.float16).view(np.uint8)

        blocks[:, 4:16] = pack_k_scales(sc, sc)
    elif type_name == "Q6_K":
        scales = rng.integers(64, 128, size=(n_blocks, 16), dtype=np.int8)
        blocks[:, 192:208] = scales.view(np.uint8)
        blocks[:, 208:210] = np.full((n_blocks, 1), std / (96 * 18.5), np.float16).view(np.uint8)
    elif type_name == "Q8_0":
        blocks[:, 0:2] = np.full((n_blocks, 1), std / 73.6, np.float16).view(np.uint8)
    else:
        raise ValueError(f"no random-block generator for {type_name}")
    return blocks.reshape(-1)


def write_gguf_checkpoint(config: ModelConfig, out, quant: str = "bf16", seed: int = 0, progress: bool = True,
                          draw_blocks: bool | None = None) -> float:
    """Random weights (same values as the safetensors writer for the same seed) as a qwen35 GGUF with the
    generated tokenizer embedded. Streams tensor by tensor into a temp file, then renames it. ``draw_blocks``
    (default: for models over 4 B parameters with a K-quant mix) draws K-quant blocks directly instead of
    quantising the float init."""
    import gguf

    out = Path(out)
    config = checkpoint_config(config)
    types = tensor_types(config, quant)
    if draw_blocks is None:
        draw_blocks = quant in K_MIXES and config.num_parameters() > 4e9
    shapes = config.tensor_shapes()

    with atomic_path(out) as tmp:
        writer = gguf.GGUFWriter(tmp, ARCH)
        writer.add_name(config.name)
        writer.add_file_type(FILE_TYPES[quant])
        writer.add_context_length(config.max_position_embeddings)
        writer.add_embedding_length(config.hidden_size)
        writer.add_block_count(config.num_layers)
        writer.add_feed_forward_length(config.intermediate_size)
        writer.add_head_count(config.num_attention_heads)
        writer.add_head_count_kv(config.num_kv_heads)
        writer.add_key_length(config.head_dim)
        writer.add_value_length(config.head_dim)
        writer.add_rope_freq_base(config.rope_theta)
        writer.add_rope_dimension_count(config.rotary_dim)
        writer.add_rope_dimension_sections([11, 11, 10, 0])
        writer.add_layer_norm_rms_eps(config.rms_norm_eps)
        writer.add_ssm_conv_kernel(config.conv_kernel)
        writer.add_ssm_state_size(config.linear_key_head_dim)
        writer.add_ssm_group_count(config.linear_num_key_heads)
        writer.add_ssm_time_step_rank(config.linear_num_value_heads)
        writer.add_ssm_inner_size(config.linear_value_dim)
        writer.add_full_attention_interval(4)
        _add_tokenizer(writer, build_tokenizer(config.vocab_size), config.vocab_size, SPECIAL_TOKENS)

        for name, shape in shapes.items():
            stored = (shape[0], shape[2]) if name.endswith("conv1d.weight") else shape
            n = int(np.prod(stored, dtype=np.int64))
            kind = types[name]
            writer.add_tensor_info(gguf_name(name), stored, np.dtype(np.float32), nbytes(kind, n),
                                   raw_dtype=gguf.GGMLQuantizationType[kind])
        bar = Progress(sum(nbytes(types[n], int(np.prod(s, dtype=np.int64))) for n, s in shapes.items()),
                       f"writing {out}") if progress else None
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for name, shape in shapes.items():
            kind = types[name]
            if draw_blocks and kind in ("Q4_K", "Q5_K", "Q6_K", "Q8_0"):
                n = int(np.prod(shape, dtype=np.int64))
                data = random_k_blocks(tensor_rng(seed, name), kind, n // TYPES[kind][1], config.initializer_range)
            else:
                data = quantize(to_gguf_layout(config, name, init_tensor_f32(config, name, seed)), kind)
            writer.write_tensor_data(data)
            if bar:
                bar(data.nbytes)
        writer.close()
    return bar.finish() if bar else 0.0


def _add_tokenizer(writer, tok, vocab_size: int, specials) -> None:
    """gpt2-style BPE vocabulary padded to the model's vocab_size (as llama.cpp's converter pads)."""
    import gguf

    vocab = tok.get_vocab(with_added_tokens=True)
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        if i in by_id:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.CONTROL if by_id[i] in specials else gguf.TokenType.NORMAL)
        else:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")  # the generated tokenizer splits as GPT-2 does (lucegen/model/init_tokenizer.py)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(vocab[specials[0]])
    writer.add_pad_token_id(vocab[specials[0]])
    writer.add_add_bos_token(False)
