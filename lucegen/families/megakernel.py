"""The decode megakernel (templates/megakernel/decode.cu.j2), rendered for the default model shape."""

from __future__ import annotations

from ..codegen import KernelFamily
from ..target import Target

#: The model shape `lucegen build` renders the megakernel for; the runtime renders the loaded model's own shape.
DEFAULT_MODEL = "qwen3.5-0.8b"
TEMPLATE = "megakernel/decode.cu.j2"


def _params(target: Target) -> dict:
    from ..model.config import ModelConfig
    from ..runtime.packing import kernel_params

    return {"mk": kernel_params(ModelConfig.preset(DEFAULT_MODEL), target)}


FAMILIES = (KernelFamily("megakernel", TEMPLATE, params=_params, quantised_target=False),)
