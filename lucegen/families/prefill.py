"""The prefill kernel modules (templates/prefill/*.cu.j2), rendered for the default model shape; the runtime renders
the loaded model's own shape through the same templates."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..kernel_signature import KernelSignature, pointer, scalar, struct
from ..target import TILED_EPILOGUES, Target

#: The model shape `lucegen build` renders the prefill kernels for.
DEFAULT_MODEL = "qwen3.5-0.8b"
#: GemmTensorMap (a CUtensorMap's 128 bytes): the A and W tile maps the TMA-fed wgmma GEMM kernels take (``tma``).
TMA_MAPS = (struct("map_a", "GemmTensorMap", 128, when="tma"), struct("map_w", "GemmTensorMap", 128, when="tma"))

#: The kernels' parameters, per module; ``{T}`` is the compute type, ``{OT}`` the output type, ``{KVT}`` the KV
#: cache's element type.
COMMON = (
    KernelSignature("prefill_embed", (
        pointer("tokens", "int", const=True), pointer("embed", "{T}", const=True),
        pointer("norm_w", "float", const=True), pointer("x", "float"), pointer("xn", "{T}"), pointer("ss", "float"),
        scalar("ss_stride", "int"),
    )),
)
ATTENTION = (
    KernelSignature("prefill_attention_prepare", (
        pointer("proj", "float", const=True), pointer("q_norm", "float", const=True),
        pointer("k_norm", "float", const=True), pointer("inv_freq", "float", const=True), pointer("kv", "{KVT}"),
        scalar("max_context", "int"), pointer("q_ws", "{T}"), scalar("n_tokens", "int"), scalar("pos0", "int"),
        pointer("depth", "int", const=True), pointer("pos0_at", "int", const=True),
    )),
    KernelSignature("prefill_attention", (
        pointer("q_ws", "{T}", const=True), pointer("proj", "float", const=True), pointer("kv", "{KVT}", const=True),
        scalar("max_context", "int"), pointer("out", "{T}"), scalar("n_tokens", "int"), scalar("pos0", "int"),
    )),
)
DELTANET = (
    KernelSignature("deltanet_conv_prepare", (
        pointer("proj", "float", const=True), pointer("conv_w", "float", const=True),
        pointer("conv_state", "float", const=True), pointer("a_log", "float", const=True),
        pointer("dt_bias", "float", const=True), pointer("workspace", "float"), scalar("n_tokens", "int"),
    )),
    KernelSignature("deltanet_chunk_prepare", (pointer("workspace", "float"), scalar("n_tokens", "int"))),
    KernelSignature("deltanet_chunk_scan", (
        pointer("workspace", "float"), pointer("recurrent", "float"), scalar("n_tokens", "int"),
    )),
    KernelSignature("deltanet_chunk_output", (pointer("workspace", "float"), scalar("n_tokens", "int"))),
    KernelSignature("deltanet_gated_norm", (
        pointer("proj", "float", const=True), pointer("gnorm_w", "float", const=True),
        pointer("workspace", "float", const=True), pointer("conv_state", "float"), pointer("out", "{OT}"),
        scalar("n_tokens", "int"),
    )),
)
GEMM = (
    KernelSignature("gemm_rows_f32_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("ss", "float", const=True),
        scalar("ss_parts", "int"), scalar("ss_stride", "int"), pointer("out", "float"), scalar("ldo", "int"),
        *TMA_MAPS,
    )),
    KernelSignature("gemm_swiglu_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("ss", "float", const=True),
        scalar("ss_parts", "int"), scalar("ss_stride", "int"), pointer("out", "{T}"), scalar("ldo", "int"),
        *TMA_MAPS,
    )),
    KernelSignature("gemm_residual_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("x", "float"), scalar("ldx", "int"),
        pointer("norm_w", "float", const=True), pointer("xn", "{T}"), scalar("ldxn", "int"), pointer("ss_out", "float"),
        scalar("ss_stride", "int"), *TMA_MAPS,
    )),
    KernelSignature("gemm_partial_m{bm}", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), scalar("splits", "int"), pointer("part", "float"),
        *TMA_MAPS,
    )),
    KernelSignature("gemm_residual_reduce", (
        pointer("part", "float", const=True), scalar("splits", "int"), scalar("M", "int"), scalar("N", "int"),
        pointer("x", "float"), scalar("ldx", "int"), pointer("norm_w", "float", const=True), pointer("xn", "{T}"),
        scalar("ldxn", "int"), pointer("ss_out", "float"), scalar("ss_stride", "int"),
    )),
    KernelSignature("gemm_rows_f32_reduce", (
        pointer("part", "float", const=True), scalar("splits", "int"), scalar("M", "int"), scalar("N", "int"),
        pointer("ss", "float", const=True), scalar("ss_parts", "int"), scalar("ss_stride", "int"),
        pointer("out", "float"), scalar("ldo", "int"),
    )),
    KernelSignature("gemv_rows_f32", (
        pointer("A", "{T}", const=True), scalar("lda", "int"), pointer("W", "{T}", const=True), scalar("ldw", "int"),
        scalar("M", "int"), scalar("N", "int"), scalar("K", "int"), pointer("ss", "float", const=True),
        scalar("ss_parts", "int"), scalar("ss_stride", "int"), pointer("out", "float"), scalar("ldo", "int"),
        pointer("argmax_key", "unsigned long long"),
    )),
)

#: (module name, template, its kernels' declarations): one kernel module per job.
MODULES = (
    ("prefill_common", "prefill/common.cu.j2", COMMON),
    ("prefill_gemm", "prefill/gemm.cu.j2", GEMM),
    ("prefill_deltanet", "prefill/deltanet.cu.j2", DELTANET),
    ("prefill_attention", "prefill/attention.cu.j2", ATTENTION),
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
                        applies=lambda t: epilogue in t.matmul.tilings(), arch=_arch, signatures=GEMM)


FAMILIES = tuple(KernelFamily(name, template, params=_params, arch=_arch if name == "prefill_gemm" else lambda t: None,
                              signatures=signatures)
                 for name, template, signatures in MODULES) + tuple(_gemm_instance(ep) for ep in TILED_EPILOGUES)
