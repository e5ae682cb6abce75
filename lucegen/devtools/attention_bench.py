"""Time the verify pass's attention (lucegen/runtime/tree_attention.py) alone at a model's attention shape, over the
context and the slot count: one layer's launches on a KV cache of random rows, the slots a chain (slot s at depth s),
and the GB/s that reading the layer's committed K/V once would take in that time. ``--bodies`` times each body for
every slot (fma, mma) or the descriptor's choice by key count (auto). The cache has ``--max-context`` positions
(0: each context's own plus the most slots, as an engine opened for that context).

    python -m lucegen.devtools.attention_bench [--preset qwen3.5-27b] [--contexts 32,4096,16384] [--slots 1,23]
                                               [--kv fp16,q4_0] [--bodies auto,fma,mma] [--max-context N]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from lucegen.bench.gemm import time_graph_us
from lucegen.families.prefill import prefill_params
from lucegen.model import kv_cache
from lucegen.model.config import ModelConfig
from lucegen.runtime import ddtree
from lucegen.runtime.device import Device
from lucegen.runtime.prefill.attention import query_workspace_bytes
from lucegen.runtime.tree_attention import NEVER, TreeAttention, partial_bytes
from lucegen.runtime.tree_verify import load_module, tree_layout

#: --bodies: the tensor-core key bound each names (None: the descriptor's)
BODIES = {"auto": None, "fma": NEVER, "mma": 1}


def _ints(text: str) -> list[int]:
    """A comma-separated list of positive integers: "1,23"."""
    values = [int(v) for v in text.split(",")]
    if min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text}: every value must be at least 1")
    return values


def _names(choices):
    """A comma-separated list of names from ``choices``."""
    def parse(text: str) -> list[str]:
        names = text.split(",")
        unknown = [n for n in names if n not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(f"{', '.join(unknown)}: not one of {', '.join(choices)}")
        return names
    return parse


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m lucegen.devtools.attention_bench",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="qwen3.5-27b", help="the model whose attention shape is timed")
    ap.add_argument("--contexts", type=_ints, default=[32, 1024, 4096, 16384], help="committed keys, e.g. 32,4096")
    ap.add_argument("--slots", type=_ints, default=[1, 23], help="slot counts, e.g. 1,23")
    ap.add_argument("--kv", type=_names(tuple(kv_cache.FORMATS)), default=["fp16"], help="KV cache formats")
    ap.add_argument("--bodies", type=_names(tuple(BODIES)), default=["auto"], help="auto, fma, mma")
    ap.add_argument("--max-context", type=int, default=0, help="cache positions (0: each context's own)")
    ap.add_argument("--repeats", type=int, default=20)
    return ap


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    dev = Device.open()
    t = dev.target.quantised_target()
    config = ModelConfig.preset(args.preset)
    contexts, slot_counts = args.contexts, args.slots
    rng = np.random.default_rng(0)
    print(f"{'kv':6} {'body':5} {'context':>8} {'slots':>6} {'us':>9} {'K/V MB':>8} {'GB/s of one read':>17}")
    for kv_name, body in ((k, b) for k in args.kv for b in args.bodies):
        fmt = kv_cache.kv_format(kv_name)
        pf = dict(prefill_params(config, t), **fmt.template_params())
        module = load_module(dev, t, pf)
        max_context = args.max_context or max(contexts) + max(slot_counts)
        row_bytes = fmt.row_bytes(pf["HD"])
        kv = dev.upload(rng.integers(0, 256, 2 * pf["NKV"] * max_context * row_bytes, dtype=np.uint8)
                        if fmt.quantised else
                        (rng.standard_normal(2 * pf["NKV"] * max_context * pf["HD"]) * 0.5).astype(np.float16))
        for S in slot_counts:
            q_ws = dev.upload((rng.standard_normal(query_workspace_bytes(pf, S) // 2) * 0.1).astype(np.float16))
            proj = dev.upload(rng.standard_normal(S * pf["NIN_AT"]).astype(np.float32))
            out = dev.alloc(S * pf["NH"] * pf["HD"] * 2)
            partial = dev.alloc(S * partial_bytes(pf, t))
            arrived = dev.alloc(4 * S * pf["NH"])
            dev.memset(arrived)
            layout = tree_layout(ddtree.chain(np.arange(S - 1) + 7))
            lay = dev.upload(layout.astype(np.int32))
            depth, anc = lay.ptr + 4 * S, lay.ptr + 8 * S
            for ctx in contexts:
                pos0 = dev.upload(np.array([ctx], np.int32))
                attention = TreeAttention(module, t, pf, max(slot_counts), args.max_context or ctx + max(slot_counts),
                                          BODIES[body])
                bodies = attention.bodies(S, ctx)

                def launch(stream):
                    attention.enqueue(S, bodies, q_ws=q_ws.ptr, proj=proj.ptr, kv=kv.ptr, anc=anc, depth=depth,
                                      out=out.ptr, pos0_at=pos0.ptr, amax=0, partial=partial.ptr,
                                      arrived=arrived.ptr, stream=stream)

                us = time_graph_us(dev, launch, args.repeats)
                mb = 2 * pf["NKV"] * ctx * row_bytes / 1e6
                print(f"{kv_name:6} {body:5} {ctx:8d} {S:6d} {us:9.1f} {mb:8.1f} {mb / us * 1e3:17.0f}")
                pos0.free()
            for b in (q_ws, proj, out, partial, arrived, lay):
                b.free()
        kv.free()
        module.unload()
    return 0


if __name__ == "__main__":
    sys.exit(main())
