"""What the two deferred-import tests share (tests/runtime/test_imports.py, tests/compiler/test_architecture.py): the
imports inside functions of a module, and the `# deferred: <reason>` comment each carries on its line or heads it
from the comment lines above (one comment may head a run of imports, blank lines between its groups included). Read with `ast`; nothing is imported."""

from __future__ import annotations

import ast

MARK = "# deferred:"


def function_imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def walk(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if in_function and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            walk(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, False)
    return found


def deferred_comment(lines: list[str], node: ast.stmt, imports: list[ast.Import | ast.ImportFrom]) -> str | None:
    """The `# deferred:` comment of an import: on one of its lines, or on the comment lines above it, reading up
    through a run of function-level imports (one comment may head the run)."""
    for line in lines[node.lineno - 1 : node.end_lineno]:
        if MARK in line:
            return line[line.index(MARK) :]
    ends = {i.end_lineno: i for i in imports}
    n = node.lineno - 1  # the line above, 1-based
    while n >= 1:
        text = lines[n - 1].strip()
        if text.startswith(MARK):
            return text
        if text.startswith("#") or not text:  # a comment, or a blank line between groups of the run
            n -= 1
        elif n in ends:
            above = ends[n]
            if MARK in lines[above.lineno - 1]:
                return None  # that import's own comment, not the run's
            n = above.lineno - 1
        else:
            return None
    return None
