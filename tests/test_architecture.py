"""The package's import graph: every import of every lucegen module (module-level, inside functions and under
TYPE_CHECKING alike) points down the layer order below, and no group of modules imports itself round a circle.

Layers, low to high (a module imports only from lower layers and its own):

    base (errors, atomic, the package root) -> target -> model (formats and checkpoint readers)
    -> model reference | weight generation (separate: neither imports the other) -> families -> codegen / compile
    -> runtime -> front ends (bench, commands) -> cli

The checker is also run on a small package written to tmp_path with an upward import and a circle planted in it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import lucegen

#: (rank, layer, module prefixes): a module belongs to the layer of its longest matching prefix; an import may go to
#: a lower rank or to its own layer, never to another layer of the same or a higher rank.
LAYERS = (
    (0, "base", ("lucegen", "lucegen.errors", "lucegen.atomic", "lucegen.kernel_signature")),
    (1, "target", ("lucegen.target", "lucegen.descriptor_paths", "lucegen.tuning")),
    (2, "model", ("lucegen.model", "lucegen.kernels_ref")),
    (3, "model reference", ("lucegen.model.reference", "lucegen.model.dflash_reference", "lucegen.model.chunked")),
    (3, "weight generation", ("lucegen.model.init_weights", "lucegen.model.init_gguf", "lucegen.model.init_dflash",
                              "lucegen.model.init_tokenizer")),
    (4, "families", ("lucegen.families",)),
    (5, "codegen", ("lucegen.codegen", "lucegen.compile")),
    (6, "runtime", ("lucegen.runtime",)),
    (7, "front ends", ("lucegen.bench", "lucegen.commands", "lucegen.api", "lucegen.devtools", "lucegen.serve")),
    (8, "cli", ("lucegen.cli",)),
)


def modules(root: Path, package: str) -> dict[str, Path]:
    """Every module of the package in directory ``root``: dotted name -> file (a package is its __init__.py)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join([package, *parts])] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules that module ``name`` (file ``path``) imports, anywhere in its code."""
    is_package = path.name == "__init__.py"
    found = set()

    def nearest(dotted: str) -> str | None:  # the module itself, or the package that holds the name
        while dotted and dotted not in known:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    # A package's module-level __getattr__ (PEP 562) re-exports public names lazily: the package root's does so
    # for lucegen.LLM (lucegen.api), which the root must not import when it loads. Those imports are not edges.
    lazy = {id(n) for f in tree.body if is_package and isinstance(f, ast.FunctionDef) and f.name == "__getattr__"
            for n in ast.walk(f)}
    for node in ast.walk(tree):
        if id(node) in lazy:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # `from pkg import sub` imports the module pkg.sub where there is one
            targets = [f"{module}.{alias.name}" if f"{module}.{alias.name}" in known else module
                       for alias in node.names]
        else:
            continue
        found |= {m for m in map(nearest, targets) if m is not None and m != name}
    return found


def import_graph(root: Path, package: str) -> dict[str, set[str]]:
    known = modules(root, package)
    return {name: imports(name, path, known) for name, path in known.items()}


def layer_of(module: str, layers) -> tuple[int, str] | None:
    best = None
    for rank, layer, prefixes in layers:
        for prefix in prefixes:
            # the package root is a layer of its own module only, not a prefix of everything
            matches = module == prefix or ("." in prefix and module.startswith(prefix + "."))
            if matches and (best is None or len(prefix) > best[0]):
                best = (len(prefix), rank, layer)
    return None if best is None else best[1:]


def upward_imports(graph: dict[str, set[str]], layers) -> list[str]:
    """Each import that leaves its layer for one of the same or a higher rank, and each unassigned module."""
    problems = []
    for module in sorted(graph):
        here = layer_of(module, layers)
        if here is None:
            problems.append(f"{module}: in no layer (add it to LAYERS)")
            continue
        for target in sorted(graph[module]):
            there = layer_of(target, layers)
            if there is not None and there[1] != here[1] and there[0] >= here[0]:
                problems.append(f"{module} ({here[1]}) imports {target} ({there[1]})")
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(groups)


LUCEGEN = Path(lucegen.__file__).resolve().parent


def test_lucegen_imports_point_down_the_layers():
    graph = import_graph(LUCEGEN, "lucegen")
    assert "lucegen.runtime.megakernel" in graph and "lucegen.families.base" in graph["lucegen.codegen"]
    problems = upward_imports(graph, LAYERS)
    assert not problems, "imports against the layer order:\n" + "\n".join(problems)


def test_lucegen_has_no_import_circles():
    found = cycles(import_graph(LUCEGEN, "lucegen"))
    assert not found, "import circles:\n" + "\n".join(" -> ".join(group) for group in found)


def _write_package(root: Path, files: dict[str, str]) -> Path:
    pkg = root / "pkg"
    for name, text in files.items():
        path = pkg / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return pkg


SYNTHETIC_LAYERS = ((0, "low", ("pkg", "pkg.low", "pkg.sub")), (1, "high", ("pkg.high",)))


def test_checker_finds_a_planted_upward_import_and_circle(tmp_path):
    pkg = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "def f():\n    from .high import g  # an upward import inside a function\n    return g\n",
        "high.py": "from . import low\n\ndef g():\n    return low\n",
        "sub/__init__.py": "",
        "sub/a.py": "from . import b\n",
        "sub/b.py": "def h():\n    import pkg.sub.a\n",
        "stray.py": "",
    })
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.low"] == {"pkg.high"} and graph["pkg.sub.a"] == {"pkg.sub.b"}
    assert upward_imports(graph, SYNTHETIC_LAYERS) == ["pkg.low (low) imports pkg.high (high)",
                                                       "pkg.stray: in no layer (add it to LAYERS)"]
    assert cycles(graph) == [["pkg.high", "pkg.low"], ["pkg.sub.a", "pkg.sub.b"]]


def test_checker_passes_a_clean_package(tmp_path):
    pkg = _write_package(tmp_path, {
        "__init__.py": "",
        "low.py": "import os\n",
        "high.py": "from .low import os\nfrom pkg import sub\n\ndef g():\n    from .sub import a\n",
        "sub/__init__.py": "",
        "sub/a.py": "from . import b\n",
        "sub/b.py": "",
    })
    graph = import_graph(pkg, "pkg")
    assert graph["pkg.high"] == {"pkg.low", "pkg.sub", "pkg.sub.a"}
    assert upward_imports(graph, SYNTHETIC_LAYERS) == [] and cycles(graph) == []


def test_runtime_renders_and_compiles_nothing_itself():
    """The runtime gets every kernel module from codegen.build (a family's route from parameters to a compiled
    module) and only loads it: no runtime module renders a template or calls the compiler (codegen.signature, the
    lookup of a family's kernel declarations, renders nothing)."""
    forbidden = {"render", "render_string", "render_family", "compile_family", "compile_source"}
    found = []
    for name, path in modules(LUCEGEN / "runtime", "lucegen.runtime").items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "codegen" \
                    and node.attr not in ("build", "signature"):
                found.append(f"{name}:{node.lineno}: codegen.{node.attr}")
            elif isinstance(node, ast.ImportFrom) and forbidden & {alias.name for alias in node.names}:
                found.append(f"{name}:{node.lineno}: imports {', '.join(a.name for a in node.names)}")
    assert not found, "\n".join(found)
    builds = [name for name, path in modules(LUCEGEN / "runtime", "lucegen.runtime").items()
              if "codegen.build(" in path.read_text(encoding="utf-8")]
    assert {"lucegen.runtime.megakernel", "lucegen.runtime.tree_verify", "lucegen.runtime.draft",
            "lucegen.runtime.prefill.gemm"} <= set(builds)
