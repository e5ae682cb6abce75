"""The decode megakernel (templates/megakernel/decode.cu.j2), rendered for the default model shape."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..kernel_signature import KernelSignature, pointer, scalar
from ..target import Target

#: The model shape `lucegen build` renders the megakernel for; the runtime renders the loaded model's own shape.
DEFAULT_MODEL = "qwen3.5-0.8b"
TEMPLATE = "megakernel/decode.cu.j2"


def _params(target: Target) -> dict:
    from ..model.config import ModelConfig
    from ..runtime.packing import kernel_params

    return {"mk": kernel_params(ModelConfig.preset(DEFAULT_MODEL), target)}


#: The kernel's name.
KERNEL_NAME = "qwen35_decode"
#: Its parameters (wt_t, kv_t and code6_t are the template's types of a weight, a KV cache element and a byte of the
#: lm_head screen's codes).
SIGNATURES = (
    KernelSignature(KERNEL_NAME, (
        pointer("wmat", "wt_t", const=True, restrict=False), pointer("wvec", "float", const=True, restrict=False),
        pointer("conv_state", "float", restrict=False), pointer("recurrent", "float", restrict=False),
        pointer("kv_cache", "kv_t", restrict=False), pointer("scratch", "unsigned long long", restrict=False),
        pointer("barrier", "unsigned", restrict=False), pointer("argmax", "unsigned long long", restrict=False),
        pointer("tokens_in", "int", const=True, restrict=False), pointer("tokens_out", "int", restrict=False),
        pointer("logits", "float", restrict=False), pointer("lm_codes", "code6_t", const=True, restrict=False),
        pointer("lm_rows", "float2", const=True, restrict=False),
        pointer("screen_floor", "unsigned long long", restrict=False),
        pointer("profile", "unsigned long long", restrict=False), scalar("max_context", "int"),
        scalar("start_pos", "int"), scalar("n_steps", "int"), scalar("n_forced", "int"),
        scalar("epoch_base", "unsigned"),
    )),
)

FAMILIES = (KernelFamily("megakernel", TEMPLATE, params=_params, quantised_target=False, signatures=SIGNATURES),)
