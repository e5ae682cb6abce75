"""Pack a checkpoint into the decode megakernel's weight layout (lucegen.families.megakernel.plan_layout), and the
kernel's per-step counts the runtime sizes its buffers by.

``pack_pieces(layout, checkpoint, dtype)`` yields the packed arrays piece by piece for upload.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from ..errors import CheckpointError
from ..families.megakernel import Layout, in_rows, out_cols
from ..model.config import ModelConfig
from ..model.dtypes import bf16_bits_to_f32


def barriers_per_step(config: ModelConfig) -> int:
    """Grid barriers per decode step: one, after the lm_head (the phases hand over through epoch-tagged words; the
    screened lm_head's floor through an atomic)."""
    return 1


def phases_per_step(config: ModelConfig) -> int:
    """Phases per decode step: five per layer and the lm_head."""
    return 5 * config.num_layers + 1


# ---------------------------------------------------------------------------------------------- packing
def matrix_bits(checkpoint, name: str, dtype: str) -> np.ndarray:
    """A checkpoint tensor as uint16 bits of ``dtype`` (bf16: exact for BF16 checkpoints; fp16: rounded)."""
    if dtype == "bf16":
        return np.ascontiguousarray(checkpoint.bf16(name), dtype=np.uint16)
    if dtype == "fp16":
        return np.ascontiguousarray(checkpoint.f32(name).astype(np.float16)).view(np.uint16)
    raise CheckpointError(f"weights are packed as bf16 or fp16 bits, not {dtype}")


def checked_shape(checkpoint, name: str, shape: tuple[int, ...], array: np.ndarray) -> np.ndarray:
    """``array`` (checkpoint tensor ``name``) if it has ``shape``; else one error naming the file and the tensor."""
    if tuple(array.shape) != tuple(shape):
        raise CheckpointError(f"{getattr(checkpoint, 'path', 'checkpoint')}: {name}: shape {tuple(array.shape)}, "
                              f"expected {tuple(shape)}")
    return array


def pack_pieces(layout: Layout, checkpoint, dtype: str, matrices: bool = True) -> Iterator[tuple[str, int, np.ndarray]]:
    """Yield (buffer, offset, array): buffer "wmat" (uint16 bits, element offset) or "wvec" (float32, float
    offset). Together they fill every tensor of the layout; padding stays as allocated (zeroed by the caller).
    ``matrices=False``: the "wvec" pieces only (no matrix is read)."""
    c = layout.config
    shapes = c.tensor_shapes()

    def mat(name):
        return checked_shape(checkpoint, name, shapes[name], matrix_bits(checkpoint, name, dtype))

    def vec(name):
        return checked_shape(checkpoint, name, shapes[name], np.ascontiguousarray(checkpoint.f32(name), np.float32))

    yield "wvec", layout.final_norm, vec("norm.weight")
    rd = c.rotary_dim
    inv_freq = (np.float32(1) / np.power(np.float32(c.rope_theta), np.arange(0, rd, 2, dtype=np.float32) / np.float32(rd)))
    yield "wvec", layout.inv_freq, inv_freq.astype(np.float32)
    for i, lay in enumerate(layout.layers):
        p = f"layers.{i}."
        if lay.kind == 0:
            la = p + "linear_attn."
            if matrices:
                yield "wmat", lay.in_mat, np.concatenate(
                    [mat(la + "in_proj_qkv.weight"), mat(la + "in_proj_z.weight"), mat(la + "in_proj_a.weight"),
                     mat(la + "in_proj_b.weight")], axis=0)
                yield "wmat", lay.out_mat, mat(la + "out_proj.weight")
            yield "wvec", lay.conv_w, vec(la + "conv1d.weight").reshape(c.conv_dim, c.conv_kernel)
            yield "wvec", lay.a_log, vec(la + "A_log")
            yield "wvec", lay.dt_bias, vec(la + "dt_bias")
            yield "wvec", lay.gnorm, vec(la + "norm.weight")
        else:
            sa = p + "self_attn."
            if matrices:
                yield "wmat", lay.in_mat, np.concatenate(
                    [mat(sa + "q_proj.weight"), mat(sa + "k_proj.weight"), mat(sa + "v_proj.weight")], axis=0)
                yield "wmat", lay.out_mat, mat(sa + "o_proj.weight")
            yield "wvec", lay.q_norm, vec(sa + "q_norm.weight")
            yield "wvec", lay.k_norm, vec(sa + "k_norm.weight")
        if matrices:
            gate, up = mat(p + "mlp.gate_proj.weight"), mat(p + "mlp.up_proj.weight")
            yield "wmat", lay.gateup, np.stack([gate, up], axis=1).reshape(2 * c.intermediate_size, c.hidden_size)
            yield "wmat", lay.down, mat(p + "mlp.down_proj.weight")
        yield "wvec", lay.in_norm, vec(p + "input_layernorm.weight")
        yield "wvec", lay.post_norm, vec(p + "post_attention_layernorm.weight")
    if matrices:
        yield "wmat", layout.embed, mat("embed_tokens.weight")
        if not c.tie_word_embeddings:
            yield "wmat", layout.lm_head, mat("lm_head.weight")


def pack_host(layout: Layout, checkpoint, dtype: str = "bf16") -> tuple[np.ndarray, np.ndarray]:
    """The whole packed (wmat uint16 bits, wvec float32) on the host (tests and small models)."""
    wmat = np.zeros(layout.wmat_elems, np.uint16)
    wvec = np.zeros(layout.wvec_floats, np.float32)
    for buffer, offset, array in pack_pieces(layout, checkpoint, dtype):
        flat = array.reshape(-1)
        target = wmat if buffer == "wmat" else wvec
        if offset + flat.size > target.size:
            raise AssertionError(f"{buffer} piece at {offset} overruns the layout")
        target[offset : offset + flat.size] = flat
    return wmat, wvec


def unpack_matrix(layout: Layout, wmat: np.ndarray, layer: int, which: str) -> np.ndarray:
    """Read a packed matrix back as float32 [rows, cols] (bf16 bits): the inverse view used by tests."""
    c = layout.config
    lay = layout.layers[layer]
    rows, cols = {
        "in_mat": (in_rows(c, lay.kind), c.hidden_size),
        "out_mat": (c.hidden_size, out_cols(c, lay.kind)),
        "gateup": (2 * c.intermediate_size, c.hidden_size),
        "down": (c.hidden_size, c.intermediate_size),
    }[which]
    off = getattr(lay, which)
    return bf16_bits_to_f32(wmat[off : off + rows * cols]).reshape(rows, cols)
