"""The verify pass's attention launches (templates/dflash/tree_verify.cu.j2): a slot's softmax over the committed
keys and its path's, in one of two bodies chosen by the slot's key count alone.

    attention = TreeAttention(module, target, pf, slots=23, max_context=16384)
    attention.enqueue(S, attention.bodies(S, position), q_ws=..., proj=..., kv=..., ...)

- ``tree_attention`` (plain FMAs): a block per (slot, query head), or per key range of one; the fastest for few keys.
  Where a pass has more of those blocks than the chip holds at once, ``tree_attention_packed`` takes them: the same
  sums (so the same bits) on a quarter of the threads.
- ``tree_attention_mma`` + ``tree_attention_merge`` (tensor cores, where families.tree_verify.attention_tiling
  renders them): every slot of a kv head against one read of each key range, the ranges joined in order; the
  fastest for many keys and many slots.

A slot of n keys (pos0 + depth + 1) takes the tensor cores when n >= the descriptor's
``[ddtree] tensor_core_attention_keys``, and both kernels read that bound and leave the other's slots alone, so a
slot's bits depend on its key count, not on the tree around it. A pass's slots have pos0 + 1 .. pos0 + S keys, so the
host, which knows pos0, launches only the kernels whose side holds a slot: :meth:`TreeAttention.bodies`.
"""

from __future__ import annotations

import numpy as np

from ..errors import LucegenError
from ..families.tree_verify import (ATTENTION_PACK, ATTENTION_SLOTS, ATTENTION_STREAMS, MMA_WAVES, THREADS,
                                    attention_ranges, attention_smem, attention_tiling, mma_range_keys,
                                    partial_ranges)
from .device import address

#: mma_keys for "never": past any context.
NEVER = np.iinfo(np.int32).max


def partial_bytes(pf: dict, target) -> int:
    """Bytes per slot of the key ranges' partial softmax sums, (O, m, l) per (head, range), any context."""
    return 4 * pf["NH"] * partial_ranges(pf, target) * (pf["HD"] + 2)


class TreeAttention:
    """The attention launches of verify passes of up to ``slots`` slots over a cache of ``max_context`` positions;
    slots of ``tensor_core_keys`` keys or more on tensor cores (None: the descriptor's choice)."""

    def __init__(self, module, target, pf: dict, slots: int, max_context: int, tensor_core_keys: int | None = None):
        self.target, self.pf, self.max_context = target, pf, max_context
        self.partial_ranges = partial_ranges(pf, target)
        tiling = attention_tiling(pf, target)
        keys = tiling["ta_mma_keys"] if tensor_core_keys is None else tensor_core_keys
        if tensor_core_keys is not None:
            if isinstance(keys, bool) or not isinstance(keys, int) or keys < 1:
                raise LucegenError(f"tensor_core_keys must be a positive integer, got {keys!r}")
            if keys <= max_context and not tiling["ta_mma"]:
                raise LucegenError(f"tensor_core_keys {keys}: {target.name} has no tensor-core tree_attention for "
                                   "this model and KV cache (families/tree_verify.py attention_tiling)")
        self.mma_keys = keys if tiling["ta_mma"] and keys <= max_context else None
        # the FMA body's blocks per (slot, head): for its slots' keys (below mma_keys), whatever the pass
        self.fma_ranges = attention_ranges(max_context if self.mma_keys is None else self.mma_keys - 1)
        self.fma_fn = module.function("tree_attention", programmatic=True)
        self.packed_fn = module.function("tree_attention_packed", programmatic=True)
        self._fma_resident: int | None = None  # tree_attention's blocks the chip holds at once (fma_kernel)
        if self.mma_keys is None:
            return
        self.mma_fn = module.function("tree_attention_mma", programmatic=True)
        self.merge_fn = module.function("tree_attention_merge", programmatic=True)
        self.block_kv, self.range_keys = tiling["ta_bkv"], mma_range_keys(max_context)
        self._mma_grids: dict[int, tuple] = {}  # S -> (grid, smem): _mma_grid
        self.mma_ranges = -(-max_context // self.range_keys)
        optin = target.smem_per_block_optin
        two = target.features.cp_async and attention_smem(pf, self.block_kv, 2, slots) <= optin
        self.stages = 2 if two else 1  # double-buffered K/V tiles where they fit beside the slots' own rows
        need = attention_smem(pf, self.block_kv, self.stages, slots)
        if need > optin:
            raise LucegenError(f"tree budget {slots - 1}: tree_attention_mma stages {need} bytes of shared memory for "
                               f"{slots} slots, over {target.name}'s smem_per_block_optin {optin}")
        if need > target.smem_per_block:
            self.mma_fn.set_max_dynamic_smem(need)

    def _mma_grid(self, S: int) -> tuple[tuple[int, int, int], int]:
        """tree_attention_mma's grid and dynamic shared memory for S slots, worked out once per S (an occupancy
        query): blocks of (ATTENTION_SLOTS slots, key ranges, kv head), the ranges' blocks up to MMA_WAVES waves."""
        if S not in self._mma_grids:
            pf = self.pf
            smem, groups = attention_smem(pf, self.block_kv, self.stages, S), -(-S // ATTENTION_SLOTS)
            per_cu = self.mma_fn.max_active_blocks_per_cu(ATTENTION_SLOTS * self.target.warp_size, smem)
            per_range = max(1, min(self.mma_ranges, MMA_WAVES * self.target.compute_units * per_cu
                                   // (groups * pf["NKV"])))
            self._mma_grids[S] = ((groups, per_range, pf["NKV"]), smem)
        return self._mma_grids[S]

    def fma_kernel(self, S: int) -> tuple[object, int]:
        """The FMA body's kernel for an S-slot pass and its threads a block: tree_attention (a warp a key stream)
        while the chip holds all of the pass's blocks at once, else tree_attention_packed (the same sums on a quarter
        of the threads): one wave instead of several."""
        warp = self.target.warp_size
        if self._fma_resident is None:
            per_cu = self.fma_fn.max_active_blocks_per_cu(ATTENTION_STREAMS * warp)
            self._fma_resident = self.target.compute_units * per_cu
        if S * self.pf["NH"] * self.fma_ranges <= self._fma_resident:
            return self.fma_fn, ATTENTION_STREAMS * warp
        return self.packed_fn, ATTENTION_STREAMS // ATTENTION_PACK * warp

    def bodies(self, S: int, position: int) -> tuple[bool, bool]:
        """(FMA, tensor cores): whether an S-slot pass at ``position`` has slots for each body (its slots have
        position + 1 .. position + S keys)."""
        if self.mma_keys is None:
            return True, False
        return position + 1 < self.mma_keys, position + S >= self.mma_keys

    def enqueue(self, S: int, bodies: tuple[bool, bool], *, q_ws: int, proj: int, kv: int, anc: int, depth: int,
                out: int, pos0_at: int, amax: int, partial: int, arrived: int, stream) -> None:
        """Queue an S-slot pass's attention in ``bodies`` (:meth:`bodies`, for the pass's position): device addresses
        of the roped queries, the projections (the gates), one layer's cache, the tree's path table and depths, the
        output rows, pos0, the output's magnitudes (0: none), the partial sums (:func:`partial_bytes` a slot) and
        the FMA body's counters (an int a (slot, head), zero between launches)."""
        pf, warp = self.pf, self.target.warp_size
        mma_keys = NEVER if self.mma_keys is None else self.mma_keys
        common = dict(q_ws=address(q_ws), proj=address(proj), kv=address(kv), max_context=self.max_context,
                      anc=address(anc), anc_stride=S, depth=address(depth), out=address(out), n_slots=S,
                      pos0_at=address(pos0_at), amax_out=address(amax), partial=address(partial))
        fma, mma = bodies
        if fma:
            fn, threads = self.fma_kernel(S)
            fn.launch((S, pf["NH"], self.fma_ranges), threads, stream=stream, **common, arrived=address(arrived),
                      mma_keys=mma_keys)
        if not mma:
            return
        grid, smem = self._mma_grid(S)
        self.mma_fn.launch(grid, ATTENTION_SLOTS * warp, smem=smem, stream=stream, **common,
                           max_ranges=self.partial_ranges, mma_keys=mma_keys, range_keys=self.range_keys,
                           stages=self.stages)
        if self.mma_ranges > 1:  # some slot may have keys in more than one range
            self.merge_fn.launch((S, pf["NH"]), THREADS, stream=stream, proj=address(proj), depth=address(depth),
                                 out=address(out), pos0_at=address(pos0_at), amax_out=address(amax),
                                 partial=address(partial), max_ranges=self.partial_ranges, mma_keys=mma_keys,
                                 range_keys=self.range_keys)
