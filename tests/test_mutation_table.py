"""bench/device/mutations.py's table cannot rot silently: every mutation's old text occurs once in its template and
the new one differs, the template is part of the family named for it, and the selection names GPU tests that exist.
(Rendering and compiling the mutated templates is the script's --dry-run.)"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from lucegen import TEMPLATES_DIR, codegen

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("mutations", ROOT / "bench" / "device" / "mutations.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


MUTATIONS = _script().MUTATIONS
REFERENCE = re.compile(r"""\{%-?\s*(?:include|from|import)\s+["']([^"']+)["']""")


def _templates_of(template: str) -> set[str]:
    """The template and every template it includes or imports, transitively."""
    seen, todo = set(), [template]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(REFERENCE.findall((TEMPLATES_DIR / name).read_text()))
    return seen


def test_names_are_unique():
    names = [m.name for m in MUTATIONS]
    assert len(names) == len(set(names)), names


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_mutation_applies_once_to_its_familys_template(m):
    text = (TEMPLATES_DIR / m.template).read_text()
    assert text.count(m.old) == 1, f"{m.template}: {m.old!r} occurs {text.count(m.old)} times"
    assert m.new != m.old
    assert m.template in _templates_of(codegen.family(m.family).template), (m.family, m.template)


@pytest.mark.parametrize("m", MUTATIONS, ids=lambda m: m.name)
def test_selection_names_existing_gpu_tests(m):
    for selection in m.tests:
        path, _, node = selection.partition("::")
        assert path.startswith("tests/gpu/"), selection
        source = (ROOT / path).read_text()
        if node:
            function = node.split("[")[0]
            assert re.search(rf"^def {function}\(", source, re.M), f"{path} defines no {function}"
        if m.k:  # each word of the -k expression names a test of the file or one of its parameters
            for word in set(m.k.split()) - {"and", "or", "not"}:
                assert re.search(rf"^def test_\w*{re.escape(word)}|[\"']{re.escape(word)}[\"']", source, re.M), \
                    (path, word)
