"""A GGUF target whose matrices stay block-quantised on the device (Q4_K_M and the like): the DFlash / DDTree
target path for models whose BF16 weights would not fit, or would read too many bytes per token.

    dec = QuantDecoder("/models/qwen3.5-27b-q4_k_m.gguf", max_context=4096)
    first = Prefiller(dec).prefill(prompt_ids)       # the prefill contract on the quantised GEMM
    ver = TreeVerifier(dec, budget=22)                # verify passes and commits, as for a BF16 target
    ids = ver.decode(128)                              # plain greedy, one-slot passes queued on the device

What it holds is the layer loop's contract (:func:`lucegen.runtime.prefill.runner.enqueue_layers`): the state of
:class:`MegakernelDecoder` (conv windows, recurrent state, KV cache, positions) and, instead of a packed BF16
``wmat``, one :class:`lucegen.runtime.quant_gemm.QuantMatrix` per layout slot: each layer's in-projection
([qkv | z | a | b] or [q | k | v]), out-projection, gate/up pair and down projection, and the lm_head. The
embedding stays in GGML row order for the gather (a tied lm_head is the same tensor, repacked once more).

Its kernels are rendered for ``Target.quantised_target()``: activations (and a float KV cache) in the descriptor's
``[quant] compute_dtype`` where it sets one. In fp16 the K-quant GEMM fragments carry the sub-block scales, so a
256-value block is one tensor-core sum (templates/kernels/quant_gemm.cu.j2); with ``[quant] int8_activations`` the
groups of K-quants alone (Q4_K, Q5_K, Q6_K) take their inputs int8-rounded per 256 values (``int8_weights`` names
them).

The GGUF stores DeltaNet value heads in ggml's tiled order (gguf_io's module notes), and quantised blocks cannot be
permuted column-wise, so this decoder runs the DeltaNet in that order (``v_heads = "tiled"``): the kernels map
value head h to key head h % NK, and the float vectors that go with the value heads (A_log, dt_bias, the V channels
of conv1d) are uploaded in the same order. Logits are unchanged: the heads are only renumbered.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import codegen
from ..errors import CheckpointError, DeviceError, LucegenError
from ..families.megakernel import Layout, plan_layout
from ..families.quant_gemm import GEMM_TYPES
from ..families.quant_matvec import BLOCK_THREADS, QUANT_TYPES
from ..model.block_conversion import ConvertedGGUFCheckpoint
from ..model.gguf_io import GGUFCheckpoint, load_gguf, v_head_order
from ..model.kv_cache import QUANTISED as QUANTISED_KV, kv_format
from . import packing
from .device import Buffer, Device, address
from .megakernel import SequenceState
from .prefill.runner import LayerWeights
from .quant_gemm import TILE_ROWS, QuantGemm, QuantMatrix


def _vector_pieces(layout: Layout, checkpoint, tiled: bool):
    """The layout's float vectors, DeltaNet value-head vectors in ggml's tiled order when ``tiled``."""
    c = layout.config
    heads, channels = v_head_order(c, 1, True), v_head_order(c, c.linear_value_head_dim, True)
    kd2 = 2 * c.linear_key_dim
    reorder = tiled and c.linear_num_value_heads != c.linear_num_key_heads
    per_head = {off for l in layout.layers if l.kind == 0 for off in (l.a_log, l.dt_bias)}
    conv = {l.conv_w for l in layout.layers if l.kind == 0}
    for buffer, offset, array in packing.pack_pieces(layout, checkpoint, "bf16", matrices=False):
        if reorder and offset in per_head:
            array = array[heads]
        elif reorder and offset in conv:
            array = np.concatenate([array[:kd2], array[kd2:][channels]])
        yield buffer, offset, np.ascontiguousarray(array, np.float32)


#: Block types of a down projection that make a GGUF a quantised target's (open_target): the GEMM's and the block
#: types it converts to Q8_0 at load (a pure Q4_0 file; lucegen/model/block_conversion.py).
QUANTISED_FILE_TYPES = (*GEMM_TYPES, "Q4_0", "Q5_0", "Q5_1")


def is_quantised_target(checkpoint) -> bool:
    """Whether a loaded checkpoint is decoded by :class:`QuantDecoder` (else by the BF16 megakernel)."""
    return isinstance(checkpoint, GGUFCheckpoint) and \
        checkpoint.dtype("layers.0.mlp.down_proj.weight") in QUANTISED_FILE_TYPES


def matrix_names(layout: Layout):
    """(layout offset, [tensor names], pair) of every matrix group :class:`QuantDecoder` holds."""
    c = layout.config
    for i, l in enumerate(layout.layers):
        p = f"layers.{i}."
        if l.kind == 0:
            la = p + "linear_attn."
            yield l.in_mat, [la + n for n in ("in_proj_qkv.weight", "in_proj_z.weight", "in_proj_a.weight",
                                              "in_proj_b.weight")], False
            yield l.out_mat, [la + "out_proj.weight"], False
        else:
            sa = p + "self_attn."
            yield l.in_mat, [sa + n for n in ("q_proj.weight", "k_proj.weight", "v_proj.weight")], False
            yield l.out_mat, [sa + "o_proj.weight"], False
        yield l.gateup, [p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"], True
        yield l.down, [p + "mlp.down_proj.weight"], False
    yield layout.lm_head, ["embed_tokens.weight" if c.tie_word_embeddings else "lm_head.weight"], False


class QuantWeights(LayerWeights):
    """A :class:`QuantDecoder`'s matrices for the layer loop, its embedding gather and lm_head; the quantised GEMM
    is batch-invariant by construction, so prefill and verify share it."""

    def __init__(self, dec: "QuantDecoder"):
        self.dec, self.gemm = dec, dec.qgemm
        self.embed_ss_parts = -(-dec.config.hidden_size // dec.part_columns)  # templates/kernels/quant_matvec.cu.j2
        self.embed_ss_scratch = self.embed_ss_parts + 1  # and the rows' totals (QuantGemm.row_totals)

    def matrix(self, offset: int) -> QuantMatrix:
        return self.dec.matrices[offset]

    def embed(self, tokens: int, T: int, x: int, xn: int, ss: int, ss_stride: int, stream, *,
              norm: int | None = None) -> None:
        """x, xn, ss of T rows from device int32 ``tokens``: the GGML rows of token_embd (``embed_<type>``); ss holds
        a part per row tile and, at more than one row, the rows' totals after them (QuantGemm.row_totals)."""
        d = self.dec
        d.embed_fn.launch(T, BLOCK_THREADS, stream=stream,
                          tokens=address(tokens), E=d.embedding, H=d.config.hidden_size,
                          norm_w=address(self.first_norm() if norm is None else norm), x=address(x), xn=address(xn),
                          ss=address(ss), ss_stride=ss_stride, part_cols=d.part_columns,
                          totals=d.qgemm.row_totals(T))


class QuantDecoder(SequenceState):
    """Load a block-quantised GGUF and keep its matrices so on the device: those in the quantised GEMM's block types
    as stored, the others (Q4_0, Q5_0 exactly; Q5_1, F32, F16, BF16 requantised) converted to Q8_0 once at load."""

    v_heads = "tiled"

    def __init__(self, model, *, target=None, max_context: int = 2048, device: Device | None = None,
                 kv_cache: str | None = None):
        checkpoint = model if isinstance(model, GGUFCheckpoint) else load_gguf(Path(model))
        self.config = c = checkpoint.config
        self.layout = plan_layout(c)
        # before the device: a file this path cannot read is refused on any machine
        self.checkpoint = self.read_checkpoint(checkpoint)
        self._check_types()
        if kv_cache is not None:  # the descriptor's default is a float type: any head_dim
            kv_format(kv_cache).check_head_dim(c.head_dim, f"model {c.name}")
        self.device = device or Device.open(target)
        self.target = self.device.target.quantised_target()  # activations in [quant] compute_dtype
        self.kv_format = kv_format(kv_cache or self.target.kv_cache_type)
        if self.target.compute_dtype not in ("bf16", "fp16"):
            raise DeviceError(f"{self.target.name}: the quantised target needs compute_dtype bf16 or fp16")
        if not self.kv_format.quantised and self.kv_format.name != self.target.compute_dtype:
            raise LucegenError(f"KV cache {self.kv_format.name}: the quantised target on {self.target.name} computes "
                               f"in {self.target.compute_dtype} ([quant] compute_dtype), so its cache is "
                               f"{self.target.compute_dtype} or one of {', '.join(QUANTISED_KV)}")
        if not isinstance(max_context, int) or max_context < 1:
            raise LucegenError(f"max_context must be a positive integer, got {max_context!r}")
        if max_context > c.max_position_embeddings:
            raise LucegenError(f"max_context {max_context} exceeds the model's max_position_embeddings "
                               f"{c.max_position_embeddings}")
        self.max_context = max_context
        self.qgemm = QuantGemm(self.device, self.target, c.hidden_size, c.rms_norm_eps,
                               max_k=max(c.hidden_size, c.intermediate_size, c.linear_value_dim,
                                         c.num_attention_heads * c.head_dim))
        embed_type = self.checkpoint.dtype("embed_tokens.weight")
        module = self.device.load(codegen.build(self.target, "quant_matvec"))
        self.embed_fn = module.function(f"embed_{embed_type.lower()}")
        self.matrices: dict[int, QuantMatrix] = {}
        self.weight_bytes = 0
        self._allocate()
        self._upload()
        self.reset()

    # ------------------------------------------------------------------------------------------ loading
    def _matrix_names(self):
        return matrix_names(self.layout)

    def read_checkpoint(self, checkpoint: GGUFCheckpoint) -> ConvertedGGUFCheckpoint:
        """``checkpoint`` as this decoder reads it, matrices outside GEMM_TYPES converted to Q8_0 once
        (lucegen/model/block_conversion.py); its Reference reads the same (``Reference(dec.config, dec.checkpoint)``)."""
        if isinstance(checkpoint, ConvertedGGUFCheckpoint):
            return checkpoint
        # the embedding (a tied lm_head's tensor too) is gathered in its own types or refused (_check_types)
        matrices = [name for _, names, _ in self._matrix_names() for name in names if name != "embed_tokens.weight"]
        return ConvertedGGUFCheckpoint(checkpoint, matrices, GEMM_TYPES, "the quantised target")

    @property
    def conversions(self) -> list[str]:
        """The matrices converted at load, one line per kind (the memory plan prints them)."""
        return self.checkpoint.describe_conversions()

    def _check_types(self) -> None:
        ck = self.checkpoint
        for _, names, _ in self._matrix_names():
            for name in names:
                if ck.dtype(name) not in GEMM_TYPES:
                    raise CheckpointError(f"{ck.path}: tensor {ck.where[name]!r} is {ck.dtype(name)}; the quantised "
                                          f"target reads {', '.join(GEMM_TYPES)} (load a BF16 GGUF with the "
                                          "megakernel decoder instead)")
        if ck.dtype("embed_tokens.weight") not in QUANT_TYPES:
            raise CheckpointError(f"{ck.path}: token_embd.weight is {ck.dtype('embed_tokens.weight')}; the "
                                  f"quantised target (and a DFlash draft on it) gathers {', '.join(QUANT_TYPES)} "
                                  "rows")

    def _allocate(self) -> None:
        d, lay = self.device, self.layout
        self.wvec = d.alloc(lay.wvec_floats * 4)
        d.memset(self.wvec)
        self.conv = d.alloc(lay.conv_state_floats() * 4)
        self.recurrent = d.alloc(lay.recurrent_floats() * 4)
        self.kv = d.alloc(self.kv_bytes())

    def _upload(self) -> None:
        ck, shapes = self.checkpoint, self.config.tensor_shapes()
        int8: set[str] = set()
        for _, offset, array in _vector_pieces(self.layout, ck, tiled=True):
            self.device.upload(array, Buffer(self.wvec.ptr + 4 * offset, array.nbytes, None))
        for offset, names, pair in self._matrix_names():
            segments = []
            for name in names:
                tensor, raw = ck.gguf_tensor(name)
                rows, cols = shapes[name]
                segments.append((tensor.type_name, raw, rows, 0))
            # the lm_head keeps float activations: the loop's final xn has no magnitudes (nor needs them: Q6_K)
            self.matrices[offset] = self.qgemm.matrix(segments, shapes[names[0]][1], pair=pair,
                                                      int8=offset != self.layout.lm_head)
            self.weight_bytes += self.matrices[offset].weight_bytes
            if self.matrices[offset].int8:
                int8 |= set(names)
        self.int8_weights = frozenset(int8)
        _, raw = ck.gguf_tensor("embed_tokens.weight")
        self.embedding = self.device.upload(np.ascontiguousarray(raw))
        if not self.config.tie_word_embeddings:
            self.weight_bytes += raw.size
        down = self.matrices[self.layout.layers[0].down]
        self.ss_parts, self.ss_scratch = self.qgemm.ss_parts(down), self.qgemm.ss_scratch_parts(down)
        # the embedding's ss parts: a row tile's columns each, as a residual writes them, and their totals after them
        # (QuantGemm.row_totals) where the residuals' are (the embedding kernel's thread a part: one part a row would
        # be one thread's 5120 serial loads)
        self.part_columns = TILE_ROWS

    def kv_choices(self) -> tuple[str, ...]:
        """The descriptor's float type and the quantised formats."""
        return (self.target.kv_cache_type, *QUANTISED_KV)

    # ------------------------------------------------------------------------------------------ the contract
    def layer_params(self) -> dict:
        """The prefill / verify ``pf`` for this model: DeltaNet heads tiled, the quantised residual's partial sums."""
        from ..families.prefill import prefill_params

        pf = prefill_params(self.config, self.target, self.v_heads)
        pf["ss_parts"], pf["ss_scratch"] = self.ss_parts, self.ss_scratch  # parts read, parts a residual writes
        pf.update(self.kv_format.template_params())
        pf["int8"] = bool(self.int8_weights)  # the layer loop keeps its GEMM inputs' magnitudes (Activations)
        return pf

    def layer_weights(self, pf: dict, *, batch_invariant: bool = False) -> QuantWeights:
        return QuantWeights(self)

    def reset(self) -> None:
        """Forget the sequence: zero the KV cache, conv windows and recurrent state."""
        for b in (self.conv, self.recurrent, self.kv):
            self.device.memset(b)
        self.position = 0
        self.next_token: int | None = None

    def close(self) -> None:
        for m in self.matrices.values():
            m.free()
        self.matrices = {}
        self.qgemm.free()
        for name in ("wvec", "conv", "recurrent", "kv", "embedding"):
            b = getattr(self, name, None)
            if b is not None:
                b.free()
                setattr(self, name, None)


def open_target(model, *, target=None, max_context: int = 2048, device: Device | None = None,
                kv_cache: str | None = None):
    """The decoder for ``model`` (a path or a loaded checkpoint): :class:`QuantDecoder` for a GGUF whose matrices are
    in the quantised GEMM's block types (its first down projection decides), else the BF16 megakernel decoder.
    ``kv_cache`` (lucegen/model/kv_cache.py; default: the descriptor's kv_cache_type) is the quantised target's
    choice; the megakernel keeps its cache in the descriptor's float type."""
    from .megakernel import MegakernelDecoder

    if isinstance(model, (str, Path)) and Path(model).suffix == ".gguf" and Path(model).is_file():
        model = load_gguf(Path(model))
    if is_quantised_target(model):
        return QuantDecoder(model, target=target, max_context=max_context, device=device, kv_cache=kv_cache)
    if kv_cache is not None and kv_format(kv_cache).quantised:
        raise LucegenError(f"KV cache {kv_cache}: quantised KV caches are for a quantised GGUF target (Q4_K_M and "
                           "the like); the BF16 megakernel decoder keeps its cache in bf16 or fp16")
    dec = MegakernelDecoder(model, target=target, max_context=max_context, device=device)
    if kv_cache is not None and kv_cache != dec.kv_format.name:
        raise LucegenError(f"KV cache {kv_cache}: the megakernel decoder on {dec.target.name} keeps its cache in "
                           f"the descriptor's kv_cache_type {dec.kv_format.name}")
    return dec
