"""The DFlash draft's projection matrices on the device, in one of two forms behind one interface:

- :class:`DenseDraftWeights`: compute-dtype rows packed into one buffer, run by the prefill GEMMs (GemmKernels);
- :class:`QuantDraftWeights`: a draft whose every matrix is stored in Q8_0 (a GGUF) kept in its blocks, run by the
  quantised GEMM (half the bytes of BF16: the 27B's draft is 1.71 GiB instead of 3.22).

Either gives ``gemm`` (``rows_f32`` / ``swiglu`` / ``residual``, GemmKernels' signatures), ``matrix(key)`` (what
``gemm`` takes as W) for "fc", ("qkv", l) = [q | k | v] rows, ("kv", l) = its k and v rows, ("o", l), ("gateup", l)
and ("down", l); ``ss_parts`` (the RMSNorm partial sums per row a residual launch leaves; every draft residual has
the hidden size's columns) and ``ss_scratch`` (the parts it writes, as many or more); ``split_k`` (the residual
launches' workspace keywords); ``weight_bytes``; ``free()``.
"""

from __future__ import annotations

import numpy as np

from .device import Buffer
from .packing import checked_shape, matrix_bits
from .prefill.gemm import GemmKernels
from .quant_gemm import QuantGemm

ALIGN = 128  # elements: every packed matrix starts 256-byte aligned (TMA needs 16)
QUANT_TYPES = ("Q8_0",)  # the draft matrices' GGML types kept in blocks


def _align(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def matrix_names(config, l: int) -> dict[str, tuple[str, ...]]:
    """Layer l's matrix groups: key -> the checkpoint tensors stacked into it, in row order."""
    p, sa = f"layers.{l}.", f"layers.{l}.self_attn."
    return {"qkv": (sa + "q_proj.weight", sa + "k_proj.weight", sa + "v_proj.weight"), "o": (sa + "o_proj.weight",),
            "gateup": (p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"), "down": (p + "mlp.down_proj.weight",)}


def is_quantised(checkpoint) -> bool:
    """Whether every matrix of a draft checkpoint is stored in a type the quantised GEMM reads in place."""
    config = checkpoint.config
    names = ["fc.weight"] + [n for l in range(config.num_layers) for g in matrix_names(config, l).values() for n in g]
    return hasattr(checkpoint, "gguf_tensor") and all(checkpoint.dtype(n) in QUANT_TYPES for n in names)


class DenseDraftWeights:
    """The matrices as compute-dtype rows in one buffer ``wmat``; gate and up rows interleaved, as the SwiGLU
    epilogue reads them."""

    def __init__(self, device, target, pf: dict, checkpoint, rows: int):
        c = checkpoint.config
        H, I = c.hidden_size, c.intermediate_size
        self.device, self.config = device, c
        self.gemm = GemmKernels(device, target, pf)
        self.ss_parts = self.ss_scratch = pf["ss_parts"]
        self.offset: dict = {}
        elems = 0
        for key, n in [("fc", H * c.fc_in_features)] + [
                (key, n) for l in range(c.num_layers)
                for key, n in ((("qkv", l), (c.q_dim + 2 * c.kv_dim) * H), (("o", l), H * c.q_dim),
                               (("gateup", l), 2 * I * H), (("down", l), H * I))]:
            self.offset[key] = elems
            elems += _align(n)
        self.wmat = device.alloc(2 * elems)
        device.memset(self.wmat)
        self.weight_bytes = 0
        shapes = c.tensor_shapes()

        def bits(name):
            return checked_shape(checkpoint, name, shapes[name], matrix_bits(checkpoint, name, target.compute_dtype))

        def put(key, array):
            array = np.ascontiguousarray(array)
            device.upload(array, Buffer(self.wmat.ptr + 2 * self.offset[key], array.nbytes, None))
            self.weight_bytes += array.nbytes

        put("fc", bits("fc.weight"))
        for l in range(c.num_layers):
            groups = matrix_names(c, l)
            put(("qkv", l), np.concatenate([bits(n) for n in groups["qkv"]]))
            put(("o", l), bits(groups["o"][0]))
            gate, up = (bits(n) for n in groups["gateup"])
            put(("gateup", l), np.stack([gate, up], axis=1).reshape(-1))
            put(("down", l), bits(groups["down"][0]))
        self.resid_ws_bytes = self.gemm.residual_workspace_bytes(max(rows, c.block_size), H)
        self.resid_ws = device.alloc(self.resid_ws_bytes)  # split-K of the few-row residual GEMMs
        self.split_k = {"workspace": self.resid_ws.ptr, "workspace_bytes": self.resid_ws_bytes}

    def matrix(self, key) -> int:
        if key[0] == "kv":  # the k and v rows of the layer's [q | k | v]
            return self.matrix(("qkv", key[1])) + 2 * self.config.q_dim * self.config.hidden_size
        return self.wmat.ptr + 2 * self.offset[key]

    def free(self) -> None:
        for b in (self.wmat, self.resid_ws):
            b.free()


class QuantDraftWeights:
    """The matrices in their GGML blocks (QuantMatrix groups); the k|v rows a view of the qkv group."""

    def __init__(self, device, target, checkpoint):
        c = checkpoint.config
        self.gemm = QuantGemm(device, target, c.hidden_size, c.rms_norm_eps)
        shapes = c.tensor_shapes()  # the loader checked every tensor's

        def group(names, pair=False):
            segments = [(checkpoint.dtype(n), checkpoint.gguf_tensor(n)[1], shapes[n][0], 0) for n in names]
            return self.gemm.matrix(segments, shapes[names[0]][1], pair=pair)

        self.matrices = {"fc": group(("fc.weight",))}
        for l in range(c.num_layers):
            for key, names in matrix_names(c, l).items():
                self.matrices[(key, l)] = group(names, pair=key == "gateup")
            self.matrices[("kv", l)] = self.matrices[("qkv", l)].tail(1)
        self.weight_bytes = sum(m.weight_bytes for m in self.matrices.values())
        self.ss_parts = self.gemm.ss_parts(self.matrices[("o", 0)])
        self.ss_scratch = self.gemm.ss_scratch_parts(self.matrices[("o", 0)])
        self.split_k: dict = {}

    def matrix(self, key):
        return self.matrices[key]

    def free(self) -> None:
        for m in self.matrices.values():
            m.free()
        self.gemm.free()


def draft_weights(device, target, pf: dict, checkpoint, rows: int):
    """The draft's matrices on ``device``: kept in blocks when every one is Q8_0, else in the compute dtype."""
    if is_quantised(checkpoint):
        return QuantDraftWeights(device, target, checkpoint)
    return DenseDraftWeights(device, target, pf, checkpoint, rows)
