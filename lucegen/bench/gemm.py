"""Prefill GEMM timings against cuBLAS: each (M, N, K, epilogue) shape through ``GemmKernels`` and through
``torch.matmul`` in bf16 on the same shape, timed with CUDA events in the same process (torch shares the device's
primary context, so our kernels read torch-allocated tensors through ``data_ptr()``).

    rows = bench_gemm_shapes(dev, target, pf, [(520, 8224, 1024, "rows_f32"), ...])
    # each row: M N K epilogue ours_us ours_tflops cublas_us cublas_tflops ratio (= cublas_us / ours_us)
"""

from __future__ import annotations

import statistics


def _time_torch_us(torch, fn, repeats: int, batch: int = 10) -> float:
    """Median over ``repeats`` of (``batch`` back-to-back calls between two events) / batch, in microseconds:
    the GPU stays busy because torch queues each call in a few microseconds."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(batch):
            fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0 / batch)
    return statistics.median(times)


def time_graph_us(device, launch, repeats: int, batch: int = 10) -> float:
    """Our kernels captured ``batch`` times into one CUDA graph (as the prefill runner replays them: no Python
    launch cost in the measurement); median over ``repeats`` graph launches of time / batch, in microseconds."""
    stream = device.stream()
    launch(stream)  # warm-up (and first-use module work) outside the capture
    stream.synchronize()
    stream.begin_capture()
    for _ in range(batch):
        launch(stream)
    graph = stream.end_capture()
    start, end = device.event(), device.event()
    try:
        graph.launch(stream)
        times = []
        for _ in range(repeats):
            start.record(stream)
            graph.launch(stream)
            end.record(stream)
            times.append(start.elapsed_ms(end) * 1000.0 / batch)
    finally:
        stream.synchronize()
        graph.destroy()
        start.destroy()
        end.destroy()
        stream.destroy()
    return statistics.median(times)


def bench_gemm_shapes(device, target, pf: dict, shapes, repeats: int = 20, gemm=None) -> list[dict]:
    """Time each (M, N, K, epilogue) shape: ours (the launcher's own choice of kernel) vs torch.matmul in bf16.
    ``gemm``: an existing GemmKernels (e.g. with a forced block height); built from ``pf`` if None."""
    import torch

    from ..runtime.prefill.gemm import GemmKernels

    gemm = gemm or GemmKernels(device, target, pf)
    dtype = torch.bfloat16 if pf["dtype"] == "bf16" else torch.float16
    dev = torch.device("cuda")
    parts = pf["ss_parts"]
    rows = []
    for M, N, K, epilogue in shapes:
        a = torch.randn(M, K, device=dev).to(dtype)
        w = (torch.randn(N, K, device=dev) / K ** 0.5).to(dtype)
        ss = torch.rand(parts, M, device=dev) + 0.5
        if epilogue == "rows_f32":
            out = torch.empty(M, N, device=dev)
            ours = lambda s: gemm.rows_f32(a.data_ptr(), K, w.data_ptr(), K, M, N, K, ss.data_ptr(), parts, M,
                                          out.data_ptr(), N, stream=s)
        elif epilogue == "swiglu":
            out = torch.empty(M, N // 2, device=dev, dtype=dtype)
            ours = lambda s: gemm.swiglu(a.data_ptr(), K, w.data_ptr(), K, M, N, K, ss.data_ptr(), parts, M,
                                        out.data_ptr(), N // 2, stream=s)
        elif epilogue == "residual":
            x = torch.randn(M, N, device=dev)
            norm_w = torch.zeros(N, device=dev)
            xn = torch.empty(M, N, device=dev, dtype=dtype)
            ss_out = torch.empty(-(-N // pf["tile_n"]), M, device=dev)
            ours = lambda s: gemm.residual(a.data_ptr(), K, w.data_ptr(), K, M, N, K, x.data_ptr(), N,
                                          norm_w.data_ptr(), xn.data_ptr(), N, ss_out.data_ptr(), M, stream=s)
        else:
            raise ValueError(f"unknown epilogue {epilogue!r}")
        torch.cuda.synchronize()
        ours_us = time_graph_us(device, ours, repeats)
        wt = w.t()
        cublas_us = _time_torch_us(torch, lambda: torch.matmul(a, wt), repeats)
        flops = 2.0 * M * N * K
        rows.append({"M": M, "N": N, "K": K, "epilogue": epilogue, "ours_us": ours_us,
                     "ours_tflops": flops / ours_us / 1e6, "cublas_us": cublas_us,
                     "cublas_tflops": flops / cublas_us / 1e6, "ratio": cublas_us / ours_us})
    torch.cuda.synchronize()
    return rows


def qwen08b_shapes(T: int) -> list[tuple[int, int, int, str]]:
    """The 0.8B prefill GEMM shapes at T tokens (the lm_head row is M = 1)."""
    return [(T, 8224, 1024, "rows_f32"), (T, 5120, 1024, "rows_f32"), (T, 1024, 2048, "residual"),
            (T, 7168, 1024, "swiglu"), (T, 1024, 3584, "residual"), (1, 248320, 1024, "rows_f32")]


def sweep(device, target, pf: dict, shapes, overrides=({},), repeats: int = 10, log=None) -> list[dict]:
    """Tuning aid: ours at every block height (and the automatic pick) for each tile override of ``pf``
    (e.g. ``{"tile_k": 32, "stages": 3}``); rows as :func:`bench_gemm_shapes` plus ``tiles`` and ``block_rows``."""
    from ..runtime.prefill.gemm import GemmKernels

    out = []
    for change in overrides:
        p = dict(pf, **change, gemm_tilings={})  # the override is every epilogue's tiling
        p["ss_parts"] = -(-p["H"] // p["tile_n"])
        try:
            gemm = GemmKernels(device, target, p)
        except Exception as exc:  # a tiling the template or the chip cannot take: report it, keep sweeping
            out.append({"tiles": change, "error": str(exc)[:500]})
            if log:
                log(out[-1])
            continue
        resident = gemm.instances["rows_f32"].resident_clusters
        if resident:
            print("resident clusters", change, resident, flush=True)
        for bm in (None, *gemm.instances["rows_f32"].heights):
            gemm.block_rows = bm
            for row in bench_gemm_shapes(device, target, p, shapes, repeats=repeats, gemm=gemm):
                out.append({"tiles": change, "block_rows": bm or "auto", **row})
                if log:
                    log(out[-1])
    return out


def main() -> None:  # python -m lucegen.bench.gemm [--sweep | --tiles JSON] [--out FILE]
    import argparse
    import json

    from ..families.prefill import prefill_params
    from ..model.config import ModelConfig
    from ..runtime.device import Device

    ap = argparse.ArgumentParser()
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--tiles", help='JSON list of [matmul] overrides to sweep, e.g. [{"tile_n": 256}]')
    ap.add_argument("--out")
    args = ap.parse_args()
    dev = Device.open()
    pf = prefill_params(ModelConfig.preset("qwen3.5-0.8b"), dev.target)
    result = {"device": dev.name, "target": dev.target.name,
              "shapes": bench_gemm_shapes(dev, dev.target, pf, qwen08b_shapes(520) + qwen08b_shapes(4096)[:-1])}
    for g in result["shapes"]:
        print(f"{g['M']:>6} x {g['N']:>6} x {g['K']:>5} {g['epilogue']:>9} ours {g['ours_us']:>8.1f} us "
              f"{g['ours_tflops']:>6.1f} TF  cuBLAS {g['cublas_us']:>8.1f} us {g['cublas_tflops']:>6.1f} TF  "
              f"ratio {g['ratio']:.2f}", flush=True)
    if args.sweep or args.tiles:
        overrides = json.loads(args.tiles) if args.tiles else (
            {}, {"stages": 3}, {"tile_k": 32, "stages": 4}, {"warps": 4, "tile_k": 64, "stages": 3},
            {"tile_n": 256, "tile_k": 32, "stages": 3}, {"tile_n": 256, "tile_k": 64, "stages": 3})

        def log(r):
            if "error" in r:
                print("sweep", r["tiles"], "error", r["error"][:300], flush=True)
            else:
                print(f"sweep {str(r['tiles']):<45} bm {str(r['block_rows']):>4} {r['M']:>5}x{r['N']:>5}x{r['K']:>5} "
                      f"{r['epilogue']:>9} {r['ours_us']:>8.1f} us {r['ours_tflops']:>6.1f} TF ratio {r['ratio']:.2f}",
                      flush=True)

        result["sweep"] = sweep(dev, dev.target, pf, qwen08b_shapes(520)[:-1] + qwen08b_shapes(4096)[:-1],
                                overrides, log=log)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
