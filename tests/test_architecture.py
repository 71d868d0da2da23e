"""The package's imports flow one way: each module imports only from the layers below it (docs/architecture.md)."""

import ast
from pathlib import Path

import pytest

from qwenvl_lab import cli

PACKAGE = Path(__file__).resolve().parents[1] / "qwenvl_lab"

# lowest first; a module imports from lower layers and, inside a subpackage, from its own subpackage (without cycles)
LAYERS = [
    ["checks"],
    ["files", "resources", "pictures"],
    ["tokenizing", "fonts", "dump", "options"],
    ["img_pos"],
    ["fake_ids"],
    ["prompt_table"],
    ["vision", "injection", "layout", "clip", "placeholder_merge", "stagediff"],
    ["modeling", "grounding", "qwen2_vl", "qwen2_lm"],
    ["checkpoint"],
    ["unified_checkpoint", "limits"],
    ["requests"],
    ["engine"],
    ["trtllm"],
    ["chat"],
    ["answer_stages"],
    ["infer", "trtllm.pipeline"],
    ["toy"],
    ["bench", "stage_dumps"],
    ["cli"],
    ["course"],  # the course's apparatus, above everything: nothing outside it imports it
]
LAYER = {part: i for i, parts in enumerate(LAYERS) for part in parts}


def layer(module: str) -> int:
    """The layer of a module: its own entry ('trtllm.pipeline') or its subpackage's ('trtllm')."""
    parts = module.split(".")
    return next(LAYER[".".join(parts[:n])] for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in LAYER)


def module_name(path: Path) -> str:
    """'engine.decode.torch_ops' for qwenvl_lab/engine/decode/torch_ops.py ('engine' for its __init__.py)."""
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


FILES = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py")) if p != PACKAGE / "__init__.py"}


def resolve(dotted: str):
    """The package module that `dotted` (relative to qwenvl_lab) names or lies in, or None outside the package."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in FILES:
            return ".".join(parts[:n])
    return None


def imports_of(path: Path) -> set[str]:
    """The package modules a file imports, anywhere in the file (inside functions too)."""
    package = module_name(path).split(".")[: None if path.name == "__init__.py" else -1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {
                alias.name.removeprefix("qwenvl_lab.") for alias in node.names if alias.name.startswith("qwenvl_lab.")
            }
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            elif (node.module or "").startswith("qwenvl_lab"):
                base = node.module.removeprefix("qwenvl_lab").lstrip(".")
            else:
                continue
            found |= {f"{base}.{alias.name}" if base else alias.name for alias in node.names}
    return {module for module in map(resolve, found) if module is not None}


MODULES = {name: imports_of(path) for name, path in FILES.items()}


def test_every_module_has_a_layer():
    assert sorted({m.split(".")[0] for m in MODULES} - set(LAYER)) == []


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_go_down_the_layers(module):
    top = module.split(".")[0]
    upward = [name for name in MODULES[module] if name.split(".")[0] != top and layer(name) >= layer(module)]
    assert upward == [], f"{module} imports {upward}, which are not below it (layer order in docs/architecture.md)"


def test_no_import_cycle():
    graph = {m: {i for i in imports if i in MODULES and i != m} for m, imports in MODULES.items()}
    state = {}

    def visit(module, path):
        if state.get(module) == "done":
            return
        assert state.get(module) != "active", f"import cycle: {' -> '.join(path + [module])}"
        state[module] = "active"
        for target in sorted(graph[module]):
            visit(target, path + [module])
        state[module] = "done"

    for module in sorted(graph):
        visit(module, [])


def test_the_checker_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """imports_of reads what a module really imports (a broken checker would let every test above pass)."""
    assert "chat" in MODULES["infer"] and "engine" in MODULES["infer"]
    assert "unified_checkpoint" in MODULES["trtllm.pipeline"]  # imported inside a function
    assert (
        "engine.layers" in MODULES["engine.decode.numba_step"] and "engine.decode" in MODULES["engine.decode.torch_ops"]
    )


def test_the_runtimes_import_no_answer_path():
    """The engine and TensorRT-LLM's runner serve any caller: nothing in them imports the chat or run.py's layer."""
    runtime = [m for m in MODULES if m.split(".")[0] in ("engine", "trtllm") and m != "trtllm.pipeline"]
    above = {m: sorted(i for i in MODULES[m] if i in ("chat", "infer", "trtllm.pipeline")) for m in runtime}
    assert {m: i for m, i in above.items() if i} == {}


def test_nothing_outside_the_course_room_imports_it():
    """The mechanism reads without the course's apparatus: only modules of course/ import course/."""
    outside = {
        m: sorted(i for i in MODULES[m] if i.split(".")[0] == "course") for m in MODULES if m.split(".")[0] != "course"
    }
    assert {m: i for m, i in outside.items() if i} == {}


def test_the_package_never_imports_the_projects_tools():
    """tools/ (the class load test, the study-time model, the site builder) is the project's, not the installed
    package's: no module of the package imports it."""
    found = {}
    for name, path in FILES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            modules = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            modules += [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            if any(m == "tools" or m.startswith("tools.") for m in modules):
                found.setdefault(name, []).append(node.lineno)
    assert found == {}


def test_every_cli_subcommand_names_a_function_that_exists():
    """The command line's one dispatch table: each entry names a module and a function in it; only the course's own
    commands (doctor, lab) name course/, and they load only when run."""
    for name, (target, _) in cli.SUBCOMMANDS.items():
        module, _, function = target.partition(":")
        assert module.startswith("qwenvl_lab.") and function, name
        assert callable(cli.command_function(name)), name
    assert sorted(n for n, (t, _) in cli.SUBCOMMANDS.items() if t.startswith("qwenvl_lab.course.")) == ["doctor", "lab"]
