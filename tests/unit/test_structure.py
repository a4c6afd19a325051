"""The size rule of the package: no module in chronos/ over 600 lines, no class over 300, so that a reader
finds one concept per module and a class small enough to hold in mind."""

from __future__ import annotations

import ast
from pathlib import Path

import chronos

MAX_MODULE_LINES = 600
MAX_CLASS_LINES = 300

PACKAGE = Path(chronos.__file__).parent


def oversized(root: Path, max_module: int = MAX_MODULE_LINES, max_class: int = MAX_CLASS_LINES) -> list[str]:
    """The modules under `root` over `max_module` lines and the classes over `max_class` (from their `class`
    line to their last), each as "path: what (lines)", paths relative to root's parent."""
    found = []
    for path in sorted(root.rglob("*.py")):
        name = path.relative_to(root.parent).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = len(text.splitlines())
        if lines > max_module:
            found.append(f"{name}: module ({lines} lines)")
        for node in ast.walk(ast.parse(text, filename=name)):
            if isinstance(node, ast.ClassDef):
                assert node.end_lineno is not None
                length = node.end_lineno - node.lineno + 1
                if length > max_class:
                    found.append(f"{name}: class {node.name} ({length} lines)")
    return found


def test_no_module_or_class_over_the_limits() -> None:
    offenders = oversized(PACKAGE)
    assert not offenders, "over the size limits:\n" + "\n".join(offenders)


def _class(name: str, lines: int) -> str:
    return f"class {name}:\n" + "".join(f"    x{i} = {i}\n" for i in range(lines - 1))


def test_the_check_names_what_is_over_and_only_that(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "fits.py").write_text("x = 1\n" * 20)
    (package / "sub" / "long.py").write_text("x = 1\n" * 21)
    (package / "classes.py").write_text(_class("Big", 6) + _class("Fits", 5))
    assert oversized(package, max_module=20, max_class=5) == ["pkg/classes.py: class Big (6 lines)",
                                                              "pkg/sub/long.py: module (21 lines)"]


def test_no_two_test_modules_share_a_name() -> None:
    """pytest imports test modules by their file's name (the folders have no __init__.py), so two of one name
    stop the collection of the whole suite."""
    tests = Path(__file__).resolve().parents[1]
    names: dict[str, list[str]] = {}
    for path in sorted(tests.rglob("test_*.py")):
        names.setdefault(path.name, []).append(path.relative_to(tests).as_posix())
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}
