"""What every kernel family module builds on: :class:`KernelFamily` (a template described as data) and the C
literal helper the families' parameter functions share. Below lucegen.codegen, which renders and compiles families,
and above lucegen.model, whose configs are the families' shapes."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import numpy as np

from ..kernel_signature import KernelSignature
from ..target import Target


@dataclasses.dataclass(frozen=True)
class KernelFamily:
    """One template → one translation unit per (target, shape).

    ``params(target, shape)`` returns the template parameters beyond ``target.template_params()`` (e.g. the dtype
    ``instances`` to emit, or a model shape's ``pf`` dict); ``shape`` is the model the kernels are rendered for (a
    :class:`~lucegen.model.config.ModelConfig`, a :class:`~lucegen.model.dflash.DFlashConfig`) or None for a
    shape-free family. ``applies(target)`` says whether the family exists on that target (e.g. a wgmma GEMM only where
    ``target.features.wgmma``); ``options(target)`` extra compiler options; ``arch(target)`` an arch string override
    (e.g. ``"sm_90a"``), None for the target's own.

    What ``lucegen build`` renders: ``shapes`` for the descriptor itself (the BF16 engine's kernels) and
    ``quantised_shapes`` for its quantised-target variant (``Target.quantised_target()``: the GGUF engine's), each a
    tuple of preset names that ``preset(name)`` turns into shapes; ``(None,)`` for a shape-free family; ``()`` where
    that engine does not load the family. ``signatures``: the declarations of its kernels' parameter lists
    (lucegen.kernel_signature), from which the template's C signatures are rendered and the runtime's launches packed.
    """

    name: str
    template: str
    params: Callable[[Target, Any], dict[str, Any]] = lambda target, shape: {}
    applies: Callable[[Target], bool] = lambda target: True
    options: Callable[[Target], tuple[str, ...]] = lambda target: ()
    arch: Callable[[Target], str | None] = lambda target: None
    shapes: tuple[str | None, ...] = (None,)
    quantised_shapes: tuple[str | None, ...] = (None,)
    preset: Callable[[str], Any] | None = None
    signatures: tuple[KernelSignature, ...] = ()

    def shape(self, name: str | None):
        """The shape object of a preset name (None: shape-free)."""
        return None if name is None else self.preset(name)


def f32_literal(x: float) -> str:
    """A C float literal that parses to exactly float32(x)."""
    return repr(float(np.float32(x)))
