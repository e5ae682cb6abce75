"""The DFlash draft's kernels (templates/dflash/draft.cu.j2), rendered for the published draft of the 27B target;
the runtime renders the loaded draft's own shape."""

from __future__ import annotations

from ..codegen import KernelFamily

#: The draft shape `lucegen build` renders for.
DEFAULT_DRAFT = "dflash-qwen3.5-27b"


def _params(target) -> dict:
    from ..model.dflash import DFlashConfig
    from ..runtime.draft import draft_params

    return {"dp": draft_params(DFlashConfig.preset(DEFAULT_DRAFT), target)}


FAMILIES = (KernelFamily("dflash_draft", "dflash/draft.cu.j2", params=_params),)
