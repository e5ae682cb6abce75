"""Whether a checkpoint fits a device, decided before anything is allocated on it.

    need = forecast(checkpoint, device.target)                   # the decoder the checkpoint gets, at no cost
    need.check(max_context, available_bytes(device), "q27.gguf", device.name)  # a LucegenError when it does not fit

The forecast is the memory plan's arithmetic (lucegen/runtime/memory_plan.py) with the terms known before loading:

    weights + state + prefill workspace(min(segment, context)) + context * per_token

- **weights**: the decoder's matrices and vectors as it stores them on the device: the BF16 megakernel's packed
  matrices, float32 vectors and lm_head screen tables (lucegen/model/lm_screen.py, where the kernel renders the
  screen); the quantised target's tile-blocks of every matrix group in its block type (Q8_0 for those it converts
  at load), its embedding as stored, its float32 vectors;
- **state**: the DeltaNet conv windows and recurrent state (and the megakernel's scratch);
- **prefill workspace**: the prefill kernels' activation rows, DeltaNet and attention workspaces and logits row for
  a segment of the descriptor's ``prefill.max_tokens`` rows, fewer at a shorter context;
- **per_token**: one context position: the KV rows of every attention layer in the cache's format and the int32
  token entries of the decoder, prefiller and verifier.

Left out: the verify slots, the split-K partial sums, a DFlash draft (its weights, ring and the prefill segment it
caps: a speculative forecast counts no prefill workspace), and what the driver holds beside lucegen's buffers. The
forecast is a lower bound: a checkpoint it refuses cannot load, and one it passes may still want a little more,
which the allocation then reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..errors import LucegenError
from ..families.megakernel import Layout, kernel_params, plan_layout
from ..families.prefill import prefill_params
from ..families.quant_gemm import GEMM_TYPES
from ..model import kv_cache, lm_screen
from .memory_plan import GIB, kv_token_bytes
from .prefill.attention import query_workspace_bytes
from .prefill.deltanet import workspace_floats
from .prefill.runner import Activations, Prefiller
from .quant_target import QuantDecoder, is_quantised_target, matrix_names
from .quant_tiles import TILE_ROWS, tile_bytes
from .tree_verify import TreeVerifier

MIB = 2**20


@dataclasses.dataclass(frozen=True)
class Forecast:
    """The device bytes an engine's decoder and prefill need at a context (``kv``: the KV cache format counted in
    ``per_token``; ``workspace(rows)``: the prefill's for a segment of that many rows, at most ``segment``)."""

    engine: str  # which decoder: "the decode megakernel" or "the quantised target"
    weights: int
    state: int
    per_token: int
    kv: str
    max_position: int  # the model's max_position_embeddings
    segment: int = 0  # the prefill's rows per segment (0: no prefill workspace counted)
    workspace: Callable[[int], int] = dataclasses.field(default=lambda rows: 0, compare=False, repr=False)

    def fixed_at(self, context: int) -> int:
        """Everything but the KV cache and token entries: weights, state, the prefill workspace."""
        rows = min(self.segment, context)
        return self.weights + self.state + (self.workspace(rows) if rows > 0 else 0)

    def bytes_at(self, context: int) -> int:
        return self.fixed_at(context) + context * self.per_token

    def largest_context(self, available: int) -> int:
        """The longest context whose bytes fit ``available`` (capped by the model's limit; 0: none does)."""
        if self.bytes_at(1) > available:
            return 0
        lo, hi = 1, self.max_position  # bytes_at grows with the context: the last that fits, by bisection
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if self.bytes_at(mid) <= available else (lo, mid - 1)
        return lo

    def check(self, context: int, available: int, model: str, device: str) -> None:
        """Refuse (one line) a context whose bytes exceed ``available``, saying what would fit on ``device``."""
        need = self.bytes_at(context)
        if need <= available:
            return
        fits = self.largest_context(available)
        what = (f"the largest max_context that fits is {fits}" if fits >= 2 else
                f"nothing: the weights alone need {size(self.weights)}" if self.weights > available else
                f"nothing: the weights, state and prefill workspace need {size(self.fixed_at(2))} at max_context 2")
        raise LucegenError(f"{model} needs at least {size(need)} of device memory for {self.engine} at max_context "
                           f"{context} (weights {size(self.weights)}, state and prefill workspace "
                           f"{size(self.fixed_at(context) - self.weights)}, KV cache {self.kv} and token entries "
                           f"{size(context * self.per_token)}); {device} has {size(max(available, 0))} free; what "
                           f"would fit: {what}")


def size(n: int) -> str:
    """Bytes for a reader: GiB, MiB or KiB."""
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    return f"{n / MIB:.1f} MiB" if n >= MIB else f"{n / 1024:.1f} KiB"


def available_bytes(device) -> int:
    """What a device can still allocate: the driver's free memory on a GPU (after every other process and
    engine), the descriptor's memory less the ledger on the host-only device."""
    free, _ = device.memory_info()
    return int(free)


def forecast(checkpoint, target, kv_cache_name: str | None = None, *, prefill_kernels: bool = True,
             speculative: bool = False) -> Forecast:
    """The forecast for a loaded ``checkpoint`` on a device of descriptor ``target``: the quantised target for a
    K-quant GGUF (KV cache ``kv_cache_name``, default the descriptor's), else the decode megakernel (its cache in
    the descriptor's type). ``prefill_kernels``: the engine prefills with the prefill kernels (their workspace
    counted, unless ``speculative``: the draft caps the segment); ``speculative``: a verifier's token entries too."""
    config = checkpoint.config
    layout = plan_layout(config)
    state = 4 * (layout.conv_state_floats() + layout.recurrent_floats())
    if is_quantised_target(checkpoint):
        t = target.quantised_target()
        fmt = kv_cache.kv_format(kv_cache_name or t.kv_cache_type)
        ints = QuantDecoder.token_buffers + Prefiller.token_buffers + TreeVerifier.token_buffers
        pf = prefill_params(config, t, QuantDecoder.v_heads)
        # the RMSNorm partial sums: one per row tile of the down projection's output, and the rows' totals
        pf["ss_parts"] = -(-config.hidden_size // TILE_ROWS)
        pf["ss_scratch"] = pf["ss_parts"] + 1
        engine, weights = "the quantised target", quantised_weight_bytes(checkpoint, layout)
    else:
        from .megakernel import MegakernelDecoder

        t = target
        fmt = kv_cache.kv_format(t.kv_cache_type)
        ints = MegakernelDecoder.token_buffers + Prefiller.token_buffers + (TreeVerifier.token_buffers if speculative
                                                                             else 0)
        pf = prefill_params(config, t, MegakernelDecoder.v_heads)
        engine, weights = "the decode megakernel", 2 * layout.wmat_elems + 4 * layout.wvec_floats
        if screened(config, t):
            weights += config.vocab_size * (lm_screen.packed_row_bytes(config.hidden_size) + 8)
        state += 8 * layout.scratch_floats
    counted = prefill_kernels and not speculative
    return Forecast(engine, weights, state, kv_token_bytes(config, layout, fmt) + 4 * ints, fmt.name,
                    config.max_position_embeddings, t.prefill.max_tokens if counted else 0,
                    lambda rows: prefill_workspace_bytes(config, pf, rows))


def screened(config, target) -> bool:
    """Whether the megakernel reads the lm_head through its screen (tables of its own); False for a model it cannot
    render on ``target``, whose decoder says why when it is built."""
    try:
        return bool(kernel_params(config, target).get("lm_screen"))
    except LucegenError:
        return False


def prefill_workspace_bytes(config, pf: dict, rows: int) -> int:
    """The prefill kernels' workspace for a segment of ``rows`` rows (Prefiller._allocate's, less the split-K
    partial sums): the activation rows, the DeltaNet and attention workspaces, the logits row."""
    return (rows * sum(Activations.row_bytes(config, pf).values()) + 4 * workspace_floats(pf, rows)
            + query_workspace_bytes(pf, rows) + 4 * config.vocab_size)


def quantised_weight_bytes(checkpoint, layout: Layout) -> int:
    """The quantised target's weights on the device: each matrix group's tile-blocks (a matrix outside the GEMM's
    types as the Q8_0 it is converted to), the embedding as stored (gathered by row), the float32 vectors."""
    shapes = checkpoint.config.tensor_shapes()
    total = 4 * layout.wvec_floats
    for _, names, _ in matrix_names(layout):
        for name in names:
            rows, cols = shapes[name]
            stored = checkpoint.dtype(name)
            total += tile_bytes(stored if stored in GEMM_TYPES else "Q8_0", rows, cols)
    embedding, _ = checkpoint.gguf_tensor("embed_tokens.weight")
    return total + embedding.nbytes
