"""Templates → source → compiled module: the Jinja environment, ``render()``, the registry of kernel families and
``build()``, the one route from a family to a module the runtime loads.

A *kernel family* is one template, described as data by :class:`lucegen.families.base.KernelFamily`: its template
parameters (``family.params(target, shape)``), where it applies, its compiler options. Families are registered by
modules in the :mod:`lucegen.families` package: every module there defines ``FAMILIES = (KernelFamily(...), ...)``
and is picked up automatically (no central list to edit). To add one, create ``lucegen/families/<yours>.py``::

    from ..kernel_signature import KernelSignature, pointer, scalar
    from .base import KernelFamily

    def _params(target, shape):               # per-target template parameters (beyond target.template_params())
        return {"instances": [d for d in target.dtypes if d in ("bf16", "fp16")], "block_threads": 256}

    SIGNATURES = (KernelSignature("argmax_f32", (pointer("x", "float", const=True), scalar("n", "int"),
                                                 pointer("out", "int"))),)
    FAMILIES = (KernelFamily("small_kernels", "kernels/small_kernels.cu.j2", params=_params, signatures=SIGNATURES),)

then ``lucegen build`` renders, writes and compiles it for every target, and the runtime gets the compiled module
with ``codegen.build(target, "small_kernels")`` (render + compile through the cache) and loads it with
``device.load(...)``. The template writes each kernel's parameter list from its declaration
(``{{ kernel_signature("argmax_f32") }}``, lucegen.kernel_signature) and the runtime launches it with named
arguments (``fn.launch(1, 256, x=x, n=n, out=out)``). A shape-dependent family (the megakernel, prefill, tree verify, the draft) renders for a model
shape: ``codegen.build(target, "megakernel", config)``; a runtime that derived a loaded model's variant of the
parameters with the family's own functions (a GGUF's value-head order, its KV cache format) passes them as
``params=``.

``generated/`` (the committed review copy) holds one file per family, target and shape:

    generated/<chip>/[quant/][<shape>/]<family>.cu     (.hip on AMD)

``quant/``: rendered for the chip's quantised-target variant (``Target.quantised_target()``, the GGUF engine's
descriptor) where that differs from the descriptor and changes the file. ``<shape>/``: the model preset a
shape-dependent family was rendered for (:func:`shapes`: the family's ``shapes`` on the descriptor,
``quantised_shapes`` on the variant), absent for shape-free families. E.g. ``generated/sm_90/small_kernels.cu``,
``generated/sm_90/qwen3.5-0.8b/megakernel.cu``, ``generated/sm_90/quant/qwen3.5-27b/tree_verify.cu``. Each is
rendered with ``family.params(target, shape)``; an engine's load-time variant of those parameters (the GGUF
engine's tiled value heads, its weights' partial-sum parts and int8 activations) is rendered at load through the
same functions.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from typing import Any

import jinja2

from . import GENERATED_DIR, TEMPLATES_DIR
from .compile import CompiledModule, compile_source
from .errors import LucegenError, TemplateError
from .families.base import KernelFamily
from .kernel_signature import KernelSignature, SignatureError, find
from .target import Target


@functools.cache
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.globals["kernel_signature"] = _kernel_signature
    return env


@jinja2.pass_context
def _kernel_signature(context, kernel: str, **values) -> str:
    """The template global ``kernel_signature(name, **values)``: ``name(<parameters>)`` rendered from the declaration
    that the families rendering this template give for the kernel ``name`` (KernelSignature.render)."""
    declared = tuple(dict.fromkeys(s for f in all_families() if f.template == context.name for s in f.signatures))
    found = find(declared, kernel)
    if found is None:
        raise SignatureError(f"no family rendering this template declares the kernel {kernel} "
                             f"(declared: {', '.join(sorted({s.name for s in declared})) or 'none'})")
    return found.render(kernel, values)


def signature(family_name: str, kernel: str) -> KernelSignature | None:
    """The declaration of ``kernel`` in the family ``family_name`` (None if that family does not declare it or no
    family is so named)."""
    for f in all_families():
        if f.name == family_name:
            return find(f.signatures, kernel)
    return None


def render(target: Target, template: str, **extra: Any) -> str:
    """Render ``templates/<template>`` with ``target.template_params()`` plus ``extra``."""
    params = target.template_params()
    params.update(extra)
    try:
        return environment().get_template(template).render(**params)
    except jinja2.TemplateSyntaxError as exc:
        raise TemplateError(f"{exc.filename or template}:{exc.lineno}: {exc.message} (target {target.name})") from None
    except jinja2.TemplateNotFound as exc:
        raise TemplateError(f"template {exc.name!r} not found under {TEMPLATES_DIR} (target {target.name})") from None
    except jinja2.UndefinedError as exc:
        raise TemplateError(f"{template}: {exc.message} (target {target.name})") from None
    except SignatureError as exc:
        raise TemplateError(f"{template}: {exc} (target {target.name})") from None


def render_string(target: Target, text: str, **extra: Any) -> str:
    """Render template text (not a file) in the same environment; for tests and one-off kernels."""
    params = target.template_params()
    params.update(extra)
    try:
        return environment().from_string(text).render(**params)
    except jinja2.TemplateError as exc:
        raise TemplateError(f"<string>: {exc} (target {target.name})") from None


@functools.cache
def all_families() -> tuple[KernelFamily, ...]:
    """Every family registered in the lucegen.families package, in module-name order."""
    from . import families as package

    found: list[KernelFamily] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        found.extend(getattr(module, "FAMILIES", ()))
    names = [f.name for f in found]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise LucegenError(f"kernel family names registered twice: {', '.join(duplicates)}")
    return tuple(found)


def shapes(target: Target, fam: KernelFamily) -> tuple[str | None, ...]:
    """The shapes ``lucegen build`` renders ``fam`` for on ``target`` (preset names; None: shape-free): the family's
    ``quantised_shapes`` on a quantised-target variant; on a descriptor its ``shapes``, and also its
    ``quantised_shapes`` where the descriptor is its own quantised target (no [quant] difference). () where the
    family does not apply."""
    if not fam.applies(target):
        return ()
    if target.variant == "quant":
        return fam.quantised_shapes
    own = fam.shapes
    if target.quantised_target() is target:
        own += tuple(s for s in fam.quantised_shapes if s not in own)
    return own


def families(target: Target) -> list[KernelFamily]:
    """The families ``lucegen build`` renders for ``target`` (on its quantised-target variant: those that target
    loads)."""
    return [f for f in all_families() if shapes(target, f)]


def family(name: str) -> KernelFamily:
    for f in all_families():
        if f.name == name:
            return f
    raise LucegenError(f"no kernel family {name!r} (registered: {', '.join(f.name for f in all_families())})")


def _family(fam: KernelFamily | str) -> KernelFamily:
    return family(fam) if isinstance(fam, str) else fam


def render_family(target: Target, fam: KernelFamily | str, shape=None, *, params: dict | None = None) -> str:
    """The family's source for ``target``: rendered with ``fam.params(target, shape)`` (``shape``: a config or a
    preset name of a shape-dependent family), or with ``params`` instead of a shape."""
    fam = _family(fam)
    if params is not None and shape is not None:
        raise LucegenError(f"kernel family {fam.name}: render for a shape or with params, not both")
    if params is None:
        if fam.preset is not None and shape is None:
            raise LucegenError(f"kernel family {fam.name} renders for a model shape: give a config or a preset "
                               f"name (lucegen build renders {', '.join(filter(None, fam.shapes))})")
        params = fam.params(target, fam.shape(shape) if isinstance(shape, str) else shape)
    return render(target, fam.template, **params)


def generated_path(target: Target, fam: KernelFamily, shape: str | None = None) -> Path:
    """Where ``lucegen build`` writes the family's source for ``target`` and the preset ``shape`` (module
    docstring)."""
    return GENERATED_DIR / target.name / target.variant / (shape or "") / f"{fam.name}{target.source_suffix}"


def compile_family(target: Target, fam: KernelFamily | str, source: str) -> CompiledModule:
    """Compile a family's rendered ``source`` for ``target`` (through the cache), with the family's module name,
    compiler options and arch."""
    fam = _family(fam)
    return compile_source(target, fam.name, source, template=fam.template, options=tuple(fam.options(target)),
                          arch=fam.arch(target))


def build(target: Target, fam: KernelFamily | str, shape=None, *, params: dict | None = None) -> CompiledModule:
    """Render and compile the family ``fam`` (or its name) for ``target`` and ``shape`` (a config or preset name; None
    for a shape-free family), or with ``params`` that the caller derived with the family's own functions: the
    compiled module the runtime loads with ``device.load``."""
    return compile_family(target, fam, render_family(target, fam, shape, params=params))
