"""Launch a few prefill GEMM shapes once each (for ncu): python experiments/gemm_profile.py"""
import torch  # noqa: F401  (shares the primary context with lucegen's Device)

from lucegen.bench.gemm import bench_gemm_shapes
from lucegen.families.prefill import prefill_params
from lucegen.model.config import ModelConfig
from lucegen.runtime.device import Device

dev = Device.open()
pf = prefill_params(ModelConfig.preset("qwen3.5-0.8b"), dev.target)
rows = bench_gemm_shapes(dev, dev.target, pf, [(4096, 1024, 3584, "residual"), (520, 8224, 1024, "rows_f32")],
                         repeats=1)
print(rows)
