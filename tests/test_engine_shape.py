"""The driver stays readable: no function or method in addernet/engine/ is longer than 60 lines (read with ast)."""

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parent.parent / "addernet" / "engine"
MAX_LINES = 60


def long_functions(source, limit=MAX_LINES):
    """(name, lines) of every function in ``source`` spanning more than ``limit`` lines, decorators included."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            if node.end_lineno - first + 1 > limit:
                out.append((node.name, node.end_lineno - first + 1))
    return out


def test_the_check_sees_a_long_function_nested_in_a_class():
    body = "\n".join(f"        x{i} = {i}" for i in range(60))
    assert long_functions(f"class A:\n    def f(self):\n{body}\n") == [("f", 61)]
    assert long_functions(f"def g():\n{body.split(chr(10), 1)[1]}\n") == []  # 60 lines: allowed


def test_no_engine_function_is_longer_than_60_lines():
    found = {
        f"{path.name}:{name}": lines
        for path in sorted(ENGINE.glob("*.py"))
        for name, lines in long_functions(path.read_text())
    }
    assert found == {}, f"split these (lines): {found}"
