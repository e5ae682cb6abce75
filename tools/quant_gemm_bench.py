"""Time the quantised GEMM on the 27B's matrix shapes: GB/s of weights per launch and rows (M) per launch.

    python3 tools/quant_gemm_bench.py [M ...]
"""

from __future__ import annotations

import sys

import numpy as np

from lucegen.model.gguf_io import random_k_blocks
from lucegen.model.quant import TYPES
from lucegen.runtime.device import Device
from lucegen.runtime.quant_gemm import QuantGemm

H, I, V = 5120, 17408, 248320
SHAPES = {  # name: (segments [(type, rows)], K, epilogue)
    "dn_in (Q5_K qkv + Q4_K z, a, b)": ([("Q5_K", 10240), ("Q4_K", 6144), ("Q4_K", 48), ("Q4_K", 48)], H, "rows_f32"),
    "gate/up (Q4_K pair)": ([("Q4_K", I), ("Q4_K", I)], H, "swiglu"),
    "down (Q6_K)": ([("Q6_K", H)], I, "residual"),
    "down (Q4_K)": ([("Q4_K", H)], I, "residual"),
    "dn_out (Q4_K)": ([("Q4_K", H)], 6144, "residual"),
    "lm_head (Q6_K)": ([("Q6_K", V)], H, "rows_f32"),
}


def main(ms):
    dev = Device.open()
    qg = QuantGemm(dev, dev.target, H, 1e-6)
    rng = np.random.default_rng(0)
    st = dev.stream()
    start, end = dev.event(), dev.event()
    for name, (segs, K, ep) in SHAPES.items():
        raw = [(t, random_k_blocks(rng, t, r * K // TYPES[t][1], 0.02), r, 0) for t, r in segs]
        W = qg.matrix(raw, K, pair=ep == "swiglu")
        for M in ms:
            a = dev.upload(np.full((M, K), 0x3F80, np.uint16))
            N = W.rows
            out = dev.alloc(M * max(N, H) * 4)
            x = dev.alloc(M * N * 4)
            xn = dev.alloc(M * N * 2)
            w = dev.upload(np.zeros(N, np.float32))
            ss = dev.alloc(4 * M * 1024)

            def launch():
                if ep == "rows_f32":
                    qg.rows_f32(a.ptr, K, W, None, M, N, K, 0, 0, M, out.ptr, N, stream=st)
                elif ep == "swiglu":
                    qg.swiglu(a.ptr, K, W, None, M, 2 * N, K, 0, 0, M, out.ptr, N, stream=st)
                else:
                    qg.residual(a.ptr, K, W, None, M, N, K, x.ptr, N, w.ptr, xn.ptr, N, ss.ptr, M, stream=st)
            reps = 20
            st.begin_capture()  # a graph of reps launches: the launches' host cost stays out of the timing
            for _ in range(reps):
                launch()
            graph = st.end_capture()
            graph.launch(st)
            start.record(st)
            graph.launch(st)
            end.record(st)
            end.synchronize()
            ms_each = start.elapsed_ms(end) / reps
            print(f"{name:34s} M={M:3d}  {ms_each * 1e3:8.1f} us  {W.weight_bytes / ms_each / 1e6:7.0f} GB/s  "
                  f"parts={qg.parts(W)}", flush=True)
            graph.destroy()
            for b in (a, out, x, xn, w, ss):
                b.free()
        W.free()


if __name__ == "__main__":
    main([int(m) for m in sys.argv[1:]] or [1, 8, 16, 23, 32])
