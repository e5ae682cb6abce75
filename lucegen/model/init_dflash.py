"""Random DFlash drafts: the tensors of a draft config drawn as the model family initialises them, written as a HF
directory (``write_dflash_checkpoint``) or as a GGUF file in lucebox-hub's draft layout (``write_dflash_gguf``: the
same values for the same seed, in BF16 or Q8_0)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import CheckpointError
from .dflash import SLIDING, DFlashConfig
from .dflash_gguf import ARCH, draft_gguf_name, lucebox_taps
from .dtypes import bf16_bits_to_f32, f32_to_bf16_bits
from .init_weights import NORM_SPREAD, Progress, normal_bf16, tensor_rng, write_json_atomic
from .quant import nbytes, quantize
from .safetensors_io import write_safetensors


def init_tensor(config: DFlashConfig, name: str, seed: int) -> np.ndarray:
    """The initial value of draft tensor ``name`` as bf16 bits. Linear layers: N(0, initializer_range) (HF
    ``_init_weights``); the Qwen3 RMSNorm weights (used as is, HF init ones): 1 + N(0, 0.05), like the DeltaNet norm
    in :mod:`lucegen.model.init_weights`, so that a test cannot pass on all-ones. The generator is keyed by
    ``dflash/<name>`` so a draft and a target written with one seed do not share draws."""
    shape = config.tensor_shapes()[name]
    rng = tensor_rng(seed, "dflash/" + name)
    if name.endswith("norm.weight"):
        return f32_to_bf16_bits((1.0 + NORM_SPREAD * rng.standard_normal(shape)).astype(np.float32))
    if len(shape) == 2:
        return normal_bf16(rng, shape, config.initializer_range)
    raise CheckpointError(f"init-weights: no initialiser for draft tensor {name!r}")


def write_dflash_checkpoint(config: DFlashConfig, out, seed: int = 0, progress: bool = True) -> float:
    """Write ``config.json`` + ``model.safetensors`` (BF16, one file like the published draft) into directory
    ``out``, streaming one tensor at a time, atomically; ``config.json`` last. Returns seconds spent."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"{out}: exists and is not a directory")
    out.mkdir(parents=True, exist_ok=True)
    shapes = config.tensor_shapes()
    total = 2 * config.num_parameters()
    bar = Progress(total, f"writing {out / 'model.safetensors'}") if progress else None
    (out / "config.json").unlink(missing_ok=True)  # until the new weights are complete, the directory is no model
    write_safetensors(out / "model.safetensors", [(n, "BF16", s) for n, s in shapes.items()],
                      lambda n: init_tensor(config, n, seed), metadata={"format": "pt"}, on_bytes=bar)
    for stale in out.glob("model*.safetensors"):
        if stale.name != "model.safetensors":
            stale.unlink()
    (out / "model.safetensors.index.json").unlink(missing_ok=True)
    write_json_atomic(out / "config.json", config.to_hf_config())
    return bar.finish() if bar else 0.0


QUANTS = {"bf16": "BF16", "q8_0": "Q8_0"}  # init-weights --quant: the matrices' type (norms are F32)


LAYOUTS = ("lucegen", "lucebox")


def write_dflash_gguf(config: DFlashConfig, out, quant: str = "bf16", seed: int = 0, progress: bool = True,
                      layout: str = "lucegen") -> float:
    """The random draft of ``write_dflash_checkpoint`` (same seed, same values) as a GGUF file ``out``: matrices in
    ``quant`` (bf16: the same bits; q8_0: those values quantised), norms in F32. ``layout`` "lucegen" lists the
    tapped layers (dflash.target_layer_ids, and the target's depth in dflash.n_target_layers); "lucebox" writes, as
    lucebox-hub's convert_dflash_to_gguf.py does without capture ids, only their count in dflash.n_target_layers,
    the taps then computed from the target (the draft's taps must be those). Written to a temp file, then renamed.
    Returns seconds spent."""
    import gguf

    if quant not in QUANTS:
        raise CheckpointError(f"a draft GGUF holds its matrices in {' or '.join(QUANTS)}, not {quant}")
    if layout not in LAYOUTS:
        raise CheckpointError(f"draft GGUF layout {layout!r}: expected one of {', '.join(LAYOUTS)}")
    if layout == "lucebox":
        taps = len(config.target_layer_ids)
        computed = None if config.num_target_layers is None else lucebox_taps(config.num_target_layers, taps)
        if computed != config.target_layer_ids:
            raise CheckpointError(f"draft {config.name}: taps {list(config.target_layer_ids)} are not the ones "
                                  f"lucebox-hub computes for a {config.num_target_layers}-layer target "
                                  f"({list(computed) if computed else 'unknown depth'}): write the lucegen layout")
    out, c = Path(out), config
    shapes = c.tensor_shapes()
    kinds = {n: "F32" if len(s) == 1 else QUANTS[quant] for n, s in shapes.items()}
    size = {n: nbytes(kinds[n], int(np.prod(s, dtype=np.int64))) for n, s in shapes.items()}
    with atomic_path(out) as tmp:
        w = gguf.GGUFWriter(tmp, ARCH)
        w.add_name(c.name)
        for key, value in (("embedding_length", c.hidden_size), ("block_count", c.num_layers),
                           ("feed_forward_length", c.intermediate_size),
                           ("attention.head_count", c.num_attention_heads),
                           ("attention.head_count_kv", c.num_kv_heads), ("attention.key_length", c.head_dim),
                           ("attention.value_length", c.head_dim), ("context_length", c.max_position_embeddings),
                           ("dflash.block_size", c.block_size), ("dflash.mask_token_id", c.mask_token_id),
                           ("vocab_size", c.vocab_size)):
            w.add_uint32(f"{ARCH}.{key}", value)
        w.add_float32(f"{ARCH}.attention.layer_norm_rms_epsilon", c.rms_norm_eps)
        w.add_float32(f"{ARCH}.rope.freq_base", c.rope_theta)
        if layout == "lucebox":
            w.add_uint32(f"{ARCH}.dflash.n_target_layers", len(c.target_layer_ids))
        else:
            w.add_array(f"{ARCH}.dflash.target_layer_ids", [int(i) for i in c.target_layer_ids])
            if c.num_target_layers is not None:
                w.add_uint32(f"{ARCH}.dflash.n_target_layers", c.num_target_layers)
        if SLIDING in c.layer_types:
            if c.sliding_window is not None:
                w.add_uint32(f"{ARCH}.attention.sliding_window", c.sliding_window)
            w.add_array(f"{ARCH}.attention.sliding_window_pattern", [t == SLIDING for t in c.layer_types])
        if c.is_causal is not None:
            w.add_bool(f"{ARCH}.dflash.is_causal", c.is_causal)
        for key, value, default in (("input_embedding_scale", c.input_embedding_scale, 1.0),
                                    ("output_multiplier", c.output_multiplier, 1.0),
                                    ("final_logit_softcapping", c.final_logit_softcapping or 0.0, 0.0)):
            if value != default:
                w.add_float32(f"{ARCH}.dflash.{key}", value)
        for name, shape in shapes.items():
            w.add_tensor_info(draft_gguf_name(name), shape, np.dtype(np.float32), size[name],
                              raw_dtype=gguf.GGMLQuantizationType[kinds[name]])
        bar = Progress(sum(size.values()), f"writing {out}") if progress else None
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for name in shapes:
            bits = init_tensor(c, name, seed)
            data = bits if kinds[name] == "BF16" else quantize(bf16_bits_to_f32(bits), kinds[name])
            w.write_tensor_data(np.ascontiguousarray(data))
            if bar:
                bar(data.nbytes)
        w.close()
    return bar.finish() if bar else 0.0
