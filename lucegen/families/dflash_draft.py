"""The DFlash draft's kernels (templates/dflash/draft.cu.j2), rendered for the published draft of the 27B target;
the runtime renders the loaded draft's own shape."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..kernel_signature import KernelSignature, pointer, scalar

#: The draft shape `lucegen build` renders for.
DEFAULT_DRAFT = "dflash-qwen3.5-27b"


def _params(target) -> dict:
    from ..model.dflash import DFlashConfig
    from ..runtime.draft import draft_params

    return {"dp": draft_params(DFlashConfig.preset(DEFAULT_DRAFT), target)}


#: The kernels' parameters; ``{T}`` is the compute type.
SIGNATURES = (
    KernelSignature("draft_capture", (
        pointer("x", "float", const=True), pointer("capture", "{T}"), scalar("tap", "int"),
    )),
    KernelSignature("draft_context_store", (
        pointer("ctx_kv", "float", const=True), pointer("rows", "int", const=True), scalar("n", "int"),
        pointer("n_at", "int", const=True), scalar("pos0", "int"), pointer("pos0_at", "int", const=True),
        pointer("k_norm", "float", const=True), pointer("inv_freq", "float", const=True), pointer("cache", "{T}"),
        scalar("ring", "int"),
    )),
    KernelSignature("draft_block_prepare", (
        pointer("proj", "float", const=True), pointer("q_norm", "float", const=True),
        pointer("k_norm", "float", const=True), pointer("inv_freq", "float", const=True),
        pointer("start_at", "int", const=True), pointer("q_ws", "{T}"), pointer("block_kv", "{T}"),
    )),
    KernelSignature("draft_attention", (
        pointer("q_ws", "{T}", const=True), pointer("cache", "{T}", const=True), scalar("ring", "int"),
        pointer("block_kv", "{T}", const=True), pointer("start_at", "int", const=True), scalar("causal", "int"),
        scalar("window", "int"), pointer("out", "{T}"),
    )),
    KernelSignature("draft_topk_partial", (
        pointer("logits", "float", const=True), scalar("n_cols", "int"), scalar("multiplier", "float"),
        scalar("softcap", "float"), scalar("chunk_cols", "int"), pointer("cand", "dr_cand"), pointer("part", "float2"),
    )),
    KernelSignature("draft_topk_merge", (
        pointer("cand", "dr_cand", const=True), pointer("part", "float2", const=True), scalar("chunks", "int"),
        scalar("k", "int"), pointer("lp_out", "float"), pointer("tok_out", "int"),
    )),
)

FAMILIES = (KernelFamily("dflash_draft", "dflash/draft.cu.j2", params=_params, signatures=SIGNATURES),)
