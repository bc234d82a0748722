"""The house rules: every module of kvviz/ and kernels/ (and app.py) against the floors written in docs/DESIGN.md.

The floors are read from the fenced ```floors block of docs/DESIGN.md ("Layers"), so the document and this test
cannot drift. Each module's imports are read with `ast` (at module level, under `if TYPE_CHECKING:`, and inside
functions), and checked for:
- a floor: every module stands on one;
- no import of a higher floor, and sideways only inside one entry of the block (one package, or one module);
- no import cycle between modules (imports inside functions included: they hide cycles, they do not remove them);
- an import inside a function only of what the block's `optional` line names (optional dependencies, and the jit
  modules that need them);
- no private name (`_x`, a module or a name) imported from another entry of the block;
- no `from kvviz import X` inside kvviz for an X that is not a module: import it from the module that defines it.

    python -m pytest tests/test_layers.py -q
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("kvviz", "kernels")


@dataclass(frozen=True)
class Floors:
    entries: dict[str, int]  # "kvviz/formats/" or "kvviz/attention.py" -> floor number (1 = bottom)
    optional: tuple[str, ...]  # import names (triton) or source paths (kernels/jit/) allowed inside functions

    def entry(self, path: str) -> str | None:
        """The block's entry a source path (kvviz/formats/core.py) stands under: the longest that matches."""
        hits = [e for e in self.entries if path == e or (e.endswith("/") and path.startswith(e))]
        return max(hits, key=len) if hits else None


@dataclass(frozen=True)
class Import:
    source: str  # importing file, relative to the root: kvviz/cache/sides.py
    line: int
    target: str  # dotted module imported: kvviz.attention (a name imported from a module counts as the module)
    names: tuple[str, ...]  # the names a `from` import takes from the target
    in_function: bool


def read_floors() -> Floors:
    """The ```floors block of docs/DESIGN.md: `N  entry entry ...` lines and one `optional  name name ...` line."""
    text = (ROOT / "docs" / "DESIGN.md").read_text(encoding="utf-8")
    found = re.search(r"^```floors\n(.*?)^```", text, re.S | re.M)
    assert found, "docs/DESIGN.md has no ```floors block (the layer order this test reads)"
    entries, optional = {}, ()
    for raw in found.group(1).splitlines():
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "optional":
            optional = tuple(words[1:])
        else:
            assert words[0].isdigit(), f"a floors line starts with its number or `optional`: {raw!r}"
            for entry in words[1:]:
                assert entry not in entries, f"{entry} stands on two floors in docs/DESIGN.md"
                entries[entry] = int(words[0])
    assert entries and optional, "the floors block lists no floors or no optional imports"
    return Floors(entries, optional)


def module_name(path: str) -> str:
    parts = path[: -len(".py")].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def source_files() -> dict[str, str]:
    """dotted module name -> source path, for every module of kvviz/, kernels/ and app.py."""
    files = [p for d in SOURCES for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]
    return {module_name(p.relative_to(ROOT).as_posix()): p.relative_to(ROOT).as_posix() for p in files}


def imports_of(path: str, modules: dict[str, str], root: Path = ROOT) -> list[Import]:
    """Every import statement of one file (path relative to root), resolved to dotted module names."""
    tree = ast.parse((root / path).read_text(encoding="utf-8"), path)
    package = module_name(path) if path.endswith("__init__.py") else module_name(path).rpartition(".")[0]
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(path, child.lineno, alias.name, (), inner))
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    anchor = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                for alias in child.names:
                    sub = f"{base}.{alias.name}"
                    if sub in modules:  # `from kvviz import quality`, `from . import floats`: a module
                        found.append(Import(path, child.lineno, sub, (), inner))
                    else:
                        found.append(Import(path, child.lineno, base, (alias.name,), inner))
            visit(child, inner)

    visit(tree, False)
    return found


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def connect(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            connect(v)
    return out


def violations() -> list[str]:
    floors, modules = read_floors(), source_files()
    out, edges = [], {}
    for name, path in sorted(modules.items()):
        here = floors.entry(path)
        if here is None:
            out.append(f"{path}: stands on no floor of docs/DESIGN.md's floors block")
        for imp in imports_of(path, modules):
            where = f"{imp.source}:{imp.line}"
            what = f"{imp.target}" + (f" ({', '.join(imp.names)})" if imp.names else "")
            target_path = modules.get(imp.target)
            if imp.in_function and not _optional(imp.target, target_path, floors):
                out.append(f"{where}: import inside a function of {what} (only the optional line's names may be)")
            if target_path is None:
                continue  # not kvviz, kernels or app: a third-party or standard module
            if imp.target != name:
                edges.setdefault(name, set()).add(imp.target)
            there = floors.entry(target_path)
            if here is None or there is None:
                continue  # reported once, as that module's own line; its cycles below
            if floors.entries[there] > floors.entries[here]:
                out.append(f"{where}: imports {what} from floor {floors.entries[there]} ({there}) on floor "
                           f"{floors.entries[here]} ({here})")
            elif floors.entries[there] == floors.entries[here] and there != here:
                out.append(f"{where}: imports {what} sideways from another package ({there}) of its floor")
            private = [n for n in imp.names if n.startswith("_")]
            if any(part.startswith("_") and part != "__init__" for part in imp.target.split(".")):
                private.append(imp.target)
            if there != here and private:
                out.append(f"{where}: imports the private {', '.join(private)} from another package ({there})")
            if (imp.target == "kvviz" and imp.names and name.startswith("kvviz.") and name != "kvviz.__main__"):
                out.append(f"{where}: `from kvviz import {', '.join(imp.names)}`: import it from the module that "
                           "defines it")
    for cycle in _cycles(edges):
        out.append(f"import cycle between {', '.join(cycle)}")
    return out


def _optional(target: str, target_path: str | None, floors: Floors) -> bool:
    top = target.split(".")[0]
    if top in floors.optional:
        return True
    return target_path is not None and any(o.endswith("/") and target_path.startswith(o) for o in floors.optional)


def test_the_house_has_no_cycles_and_no_arrows_up():
    found = violations()
    assert not found, "the import graph breaks docs/DESIGN.md's floors:\n" + "\n".join(found)


def test_the_checker_catches_each_rule(tmp_path):
    """The rules catch what they should: an upward import, a cycle, a hidden import and a private name."""
    modules = {"kvviz.formats.a": "kvviz/formats/a.py", "kvviz.cache.b": "kvviz/cache/b.py"}
    src = tmp_path / "kvviz"
    (src / "formats").mkdir(parents=True)
    (src / "formats" / "a.py").write_text("def f():\n    from kvviz.cache.b import _g\n")
    imps = imports_of("kvviz/formats/a.py", modules, root=tmp_path)
    assert imps == [Import("kvviz/formats/a.py", 2, "kvviz.cache.b", ("_g",), True)]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    floors = Floors({"kvviz/formats/": 2, "kvviz/cache/": 5}, ("numba",))
    assert floors.entry("kvviz/formats/a.py") == "kvviz/formats/" and floors.entry("kvviz/x.py") is None
    assert _optional("numba.core", None, floors) and not _optional("kvviz.cache.b", "kvviz/cache/b.py", floors)

