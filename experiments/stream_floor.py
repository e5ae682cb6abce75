"""The floor of a decode step made of one launch per weight matrix: a plain streaming read of each matrix group of a
quantised target's GGUF (per layer the in-projection, the out-projection, gate + up, down; then the lm_head), the
groups' bytes laid out one after another as the weights are, one launch each, captured in a CUDA graph (median of
--repeats replays). What a step's GEMMs would take if they did nothing but read their weights, so the launches'
structure is set apart from the kernels' own work (notes/quant-gemm-perf.md, session 42).

    python experiments/stream_floor.py MODEL.gguf [--blocks-per-sm 1 2 4] [--repeats 20]

The step is timed plain, programmatic (the kernel lets the next one start at once and waits for its predecessor only
before it exits: the most overlap programmatic launch allows) and dependent (as the GEMMs: it lets the next start at
once, loads its first words, then waits for its predecessor to complete before reading the rest: the chain of a
real step, where every launch reads what the one before wrote); then the whole as one launch, and each group's
launches alone.
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from lucegen import codegen
from lucegen.bench.gemm import time_graph_us
from lucegen.compile import compile_source
from lucegen.runtime.device import Device

SOURCE = r"""
{% include "common/prelude.cuh.j2" %}
// Read n 16-byte words, 4 loads in flight a thread; the XOR of them is stored only if it equals a value it cannot
// plausibly take, so the loads stay and the output is (almost) never written.
// programmatic: 0 plain; 1 the next kernel starts at once and this one waits for its predecessor only before it
// exits; 2 dependent, as the GEMMs: the next may start at once, but this one waits for its predecessor after its
// first loads and before the rest (the real chain of a decode step, whose every launch reads what the one before wrote).
extern "C" __global__ void __launch_bounds__(512) stream_read(const uint4* __restrict__ p, unsigned long long n,
                                                             unsigned* out, int programmatic) {
  if (programmatic) lg_launch_dependents();
  const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
  unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0u;
  bool waiting = programmatic == 2;  // dependent: wait once the first loads are on their way
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldg(p + i), b = __ldg(p + i + stride);
    const uint4 c = __ldg(p + i + 2 * stride), d = __ldg(p + i + 3 * stride);
    if (waiting) {
      lg_grid_dependency_wait();
      waiting = false;
    }
    acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
  }
  for (; i < n; i += stride) {
    const uint4 a = __ldg(p + i);
    acc ^= a.x ^ a.y ^ a.z ^ a.w;
  }
  if (programmatic == 1 || waiting) lg_grid_dependency_wait();  // (dependent: threads with no whole batch)
  if (acc == 0x9E3779B9u) out[0] = acc;
}
"""


def matrix_groups(path: str) -> list[tuple[str, int]]:
    """(group, bytes) in a decode step's launch order."""
    import gguf

    reader = gguf.GGUFReader(path)
    layers: dict[int, dict[str, int]] = {}
    lm_head = 0
    for t in reader.tensors:
        if t.name == "output.weight":
            lm_head = int(t.n_bytes)
        elif (m := re.match(r"blk\.(\d+)\.(.*)\.weight$", t.name)) and len(t.shape) == 2:
            layers.setdefault(int(m[1]), {})[m[2]] = int(t.n_bytes)
    out = []
    for i in sorted(layers):
        g = layers[i]
        if "attn_qkv" in g:
            dn_in = g["attn_qkv"] + g["attn_gate"] + g["ssm_alpha"] + g["ssm_beta"]
            out += [("dn_in", dn_in), ("dn_out", g["ssm_out"])]
        else:
            out += [("at_in", g["attn_q"] + g["attn_k"] + g["attn_v"]), ("at_o", g["attn_output"])]
        out += [("gate_up", g["ffn_gate"] + g["ffn_up"]), ("down", g["ffn_down"])]
    return out + [("lm_head", lm_head)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--blocks-per-sm", type=int, nargs="*", default=[1, 2, 4])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args()
    groups = matrix_groups(args.model)
    total = sum(b for _, b in groups)
    dev = Device.open()
    cus = dev.target.compute_units
    fn = dev.load(compile_source(dev.target, "stream_floor", codegen.render_string(dev.target, SOURCE))) \
        .function("stream_read")
    weights, out = dev.alloc(total + 4096), dev.alloc(16)
    starts = np.cumsum([0] + [b for _, b in groups])
    print(f"{len(groups)} launches, {total / 1e9:.3f} GB: {total / 3.1e6:.1f} us at 3.10 TB/s")

    def read(stream, pieces, blocks: int, programmatic: int) -> None:
        """One launch per (bytes, offset) piece of the weights."""
        for nbytes, start in pieces:
            n = nbytes // 16
            fn.launch(min(blocks, max(1, -(-n // (4 * 512)))), 512,
                      (np.uint64(weights.ptr + int(start) // 16 * 16), np.uint64(n), out, np.int32(programmatic)),
                      stream=stream, programmatic=bool(programmatic))

    every = [(b, s) for (_, b), s in zip(groups, starts)]
    for per_sm in args.blocks_per_sm:
        for programmatic, mode in enumerate(("plain", "programmatic", "dependent")):
            us = time_graph_us(dev, lambda st: read(st, every, per_sm * cus, programmatic), args.repeats, batch=1)
            print(f"{per_sm} block(s) an SM, {mode}: step {us:.1f} us, "
                  f"{total / us / 1e6:.2f} TB/s")
    us = time_graph_us(dev, lambda st: read(st, [(total, 0)], 4 * cus, False), args.repeats, batch=1)
    print(f"one launch of it all: {us:.1f} us, {total / us / 1e6:.2f} TB/s")
    per_sm = max(args.blocks_per_sm)
    print(f"per group, {per_sm} blocks an SM, plain launches (us a launch):")
    for name in dict.fromkeys(n for n, _ in groups):
        mine = [(b, s) for (n, b), s in zip(groups, starts) if n == name]
        us = time_graph_us(dev, lambda st: read(st, mine, per_sm * cus, False), args.repeats, batch=1)
        nbytes = sum(b for b, _ in mine)
        print(f"  {name:8} x{len(mine):3}: {us / len(mine):7.1f} us, {nbytes / len(mine) / 1e6:7.1f} MB, "
              f"{nbytes / us / 1e6:.2f} TB/s")


if __name__ == "__main__":
    main()
