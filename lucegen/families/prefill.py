"""The prefill kernel modules (templates/prefill/*.cu.j2), rendered for the default model shape; the runtime renders
the loaded model's own shape through the same templates."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..target import TILED_EPILOGUES, Target

#: The model shape `lucegen build` renders the prefill kernels for.
DEFAULT_MODEL = "qwen3.5-0.8b"
#: (module name, template): one kernel module per job.
MODULES = (
    ("prefill_common", "prefill/common.cu.j2"),
    ("prefill_gemm", "prefill/gemm.cu.j2"),
    ("prefill_deltanet", "prefill/deltanet.cu.j2"),
    ("prefill_attention", "prefill/attention.cu.j2"),
)


def _params(target: Target) -> dict:
    from ..model.config import ModelConfig
    from ..runtime.prefill.params import prefill_params

    return {"pf": prefill_params(ModelConfig.preset(DEFAULT_MODEL), target)}


def _arch(target: Target) -> str | None:
    """The GEMM's wgmma mainloop needs the sm_90a target (architecture-specific instructions)."""
    return "sm_90a" if target.matmul.instruction.startswith("wgmma") else None


def _gemm_instance(epilogue: str) -> KernelFamily:
    """The GEMM instance of an epilogue with its own tiling (``[matmul.<epilogue>]``): rendered only for targets
    that have one."""
    from ..runtime.prefill.gemm import instance_params

    return KernelFamily(f"prefill_gemm_{epilogue}", "prefill/gemm.cu.j2",
                        params=lambda t: {"pf": instance_params(_params(t)["pf"], epilogue)},
                        applies=lambda t: epilogue in t.matmul.tilings(), arch=_arch)


FAMILIES = tuple(KernelFamily(name, template, params=_params, arch=_arch if name == "prefill_gemm" else lambda t: None)
                 for name, template in MODULES) + tuple(_gemm_instance(ep) for ep in TILED_EPILOGUES)
