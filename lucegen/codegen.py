"""Templates → source: the Jinja environment, ``render()``, and the registry of kernel families.

A *kernel family* is one template rendered into one source file per target (``generated/<target>/<name>.cu`` or
``.hip``), described as data by :class:`KernelFamily`. Families are registered by modules in the
:mod:`lucegen.families` package: every module there defines ``FAMILIES = (KernelFamily(...), ...)`` and is picked
up automatically (no central list to edit). To add one, create ``lucegen/families/<yours>.py``::

    from lucegen.codegen import KernelFamily
    from lucegen.kernel_signature import KernelSignature, pointer, scalar

    def _params(target):                      # per-target template parameters (beyond target.template_params())
        return {"instances": [d for d in target.dtypes if d in ("bf16", "fp16")], "block_threads": 256}

    SIGNATURES = (KernelSignature("argmax_f32", (pointer("x", "float", const=True), scalar("n", "int"),
                                                 pointer("out", "int"))),)
    FAMILIES = (KernelFamily("small_kernels", "kernels/small_kernels.cu.j2", params=_params, signatures=SIGNATURES),)

then ``lucegen build`` renders, writes and compiles it for every target, and the runtime gets the compiled module
with ``codegen.build(target, "small_kernels")`` (render + compile through the cache). The template writes each
kernel's parameter list from its declaration (``{{ kernel_signature("argmax_f32") }}``, lucegen.kernel_signature)
and the runtime launches it with named arguments (``fn.launch(1, 256, x=x, n=n, out=out)``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
from pathlib import Path
from typing import Any, Callable

import jinja2

from . import GENERATED_DIR, TEMPLATES_DIR
from .errors import LucegenError, TemplateError
from .kernel_signature import KernelSignature, SignatureError, find
from .target import Target


@dataclasses.dataclass(frozen=True)
class KernelFamily:
    """One template → one translation unit per target.

    ``params(target)`` returns the extra template parameters (e.g. the dtype ``instances`` to emit);
    ``applies(target)`` says whether the family exists on that target (e.g. a wgmma GEMM only where
    ``target.features.wgmma``); ``options(target)`` extra compiler options; ``arch(target)`` an arch string
    override (e.g. ``"sm_90a"``), None for the target's own. ``quantised_target``: the quantised GGUF target loads
    it too, so it is also rendered for ``Target.quantised_target()`` where that differs (generated/<target>/quant/).
    ``signatures``: the declarations of its kernels' parameter lists (lucegen.kernel_signature), from which the
    template's C signatures are rendered and the runtime's launches packed.
    """

    name: str
    template: str
    params: Callable[[Target], dict[str, Any]] = lambda target: {}
    applies: Callable[[Target], bool] = lambda target: True
    options: Callable[[Target], tuple[str, ...]] = lambda target: ()
    arch: Callable[[Target], str | None] = lambda target: None
    quantised_target: bool = True
    signatures: tuple[KernelSignature, ...] = ()


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


def families(target: Target) -> list[KernelFamily]:
    """The families that exist on ``target`` (on its quantised-target variant: those that target loads)."""
    return [f for f in all_families() if f.applies(target) and (f.quantised_target or target.variant != "quant")]


def family(name: str) -> KernelFamily:
    for f in all_families():
        if f.name == name:
            return f
    raise LucegenError(f"no kernel family {name!r} (registered: {', '.join(f.name for f in all_families())})")


def render_family(target: Target, fam: KernelFamily) -> str:
    return render(target, fam.template, **fam.params(target))


def generated_path(target: Target, fam: KernelFamily) -> Path:
    return GENERATED_DIR / target.name / target.variant / f"{fam.name}{target.source_suffix}"


def compile_family(target: Target, fam: KernelFamily, source: str | None = None):
    """Compile a family's rendered source for ``target`` (through the cache) → CompiledModule."""
    from .compile import compile_source

    if source is None:
        source = render_family(target, fam)
    return compile_source(target, fam.name, source, template=fam.template, options=tuple(fam.options(target)),
                          arch=fam.arch(target))


def build(target: Target, name: str):
    """Render and compile the family ``name`` for ``target``: what the runtime loads."""
    return compile_family(target, family(name))
