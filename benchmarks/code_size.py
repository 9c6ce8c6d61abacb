"""The size of the house: module count, total lines, the largest modules and the largest functions.

Lines are physical lines of each .py file; a function's lines run from its `def` (decorators
excluded) to its last line, as `ast` gives them, nested functions counted inside their parent too.

    python benchmarks/code_size.py [SRC_DIR]      (default: src/lmprof)
"""
from __future__ import annotations

import ast
import sys
from pathlib import Path


def sizes(root: Path) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(lines, module) for every module and (lines, module:function) for every function under root."""
    modules: list[tuple[int, str]] = []
    functions: list[tuple[int, str]] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        rel = path.relative_to(root.parent).as_posix()
        modules.append((len(text.splitlines()), rel))
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
                functions.append((node.end_lineno - node.lineno + 1, f"{rel}:{node.name}"))
    return modules, functions


def main() -> None:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src/lmprof")
    modules, functions = sizes(root)
    print(f"modules: {len(modules)}  total lines: {sum(n for n, _ in modules)}")
    print("largest modules (lines):")
    for n, name in sorted(modules, reverse=True)[:5]:
        print(f"  {n:5d}  {name}")
    print("largest functions (lines):")
    for n, name in sorted(functions, reverse=True)[:5]:
        print(f"  {n:5d}  {name}")


if __name__ == "__main__":
    main()
