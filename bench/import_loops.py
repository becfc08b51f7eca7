"""Count memlab's function-local imports and the import loop they hide.

A function-local `from memlab.core.x import y` is either a lazy import of something heavy or a way to dodge an import
cycle. This script lists them, then builds the module graph counting every import (module-level and local) and prints
the strongly connected components: a component of more than one module is a loop held together by local imports.

    python bench/import_loops.py [--list] [--under core/predict]
"""
from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {"memlab.core": ROOT / "core", "memlab.tui": ROOT / "tui", "memlab.cli": ROOT / "memlab" / "cli"}


def module_files() -> dict[str, Path]:
    files = {}
    for prefix, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = path.relative_to(folder).with_suffix("").parts
            name = ".".join((prefix, *parts)).removesuffix(".__init__")
            files[name] = path
    return files


def imports_of(name: str, path: Path, known: set[str]) -> list[tuple[str, bool, int]]:
    """(imported memlab module, is_local, line) for every memlab import in one file."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []

    def visit(node: ast.AST, local: bool) -> None:
        for child in ast.iter_child_nodes(node):
            is_func = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # type-only imports never run
            if isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    base = ".".join(package.split(".")[: len(package.split(".")) - child.level + 1] + [base]).rstrip(".")
                for alias in child.names:
                    target = f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                    if target in known:
                        found.append((target, local, child.lineno))
            elif isinstance(child, ast.Import):
                found.extend((a.name, local, child.lineno) for a in child.names if a.name in known)
            visit(child, local or is_func)

    visit(tree, False)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    sys.setrecursionlimit(10000)

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            out.append(sorted(comp))

    for v in graph:
        if v not in index:
            strong(v)
    return out


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--list", action="store_true", help="print every function-local memlab import")
    parser.add_argument("--under", default="", help="only count files under this folder (e.g. core/predict)")
    args = parser.parse_args()
    files = module_files()
    known = set(files)
    graph: dict[str, set[str]] = {}
    local_count = 0
    for name, path in sorted(files.items()):
        found = imports_of(name, path, known)
        # importing a package runs its __init__: an edge to the package is an edge to its __init__ module
        targets = {t for t, _, _ in found}
        targets |= {t.rsplit(".", k)[0] for t in targets for k in range(1, t.count("."))}
        graph[name] = {t for t in targets if t in known and t != name and not name.startswith(t + ".")}
        in_scope = not args.under or str(path).startswith(str(ROOT / args.under))
        for target, local, line in found:
            if local and in_scope:
                local_count += 1
                if args.list:
                    print(f"{path.relative_to(ROOT)}:{line}: {target}")
    loops = [c for c in strongly_connected(graph) if len(c) > 1]
    print(f"function-local memlab imports: {local_count}")
    for comp in sorted(loops, key=len, reverse=True):
        print(f"import loop of {len(comp)} modules: {', '.join(m.removeprefix('memlab.') for m in comp)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
