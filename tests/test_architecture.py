"""The import graph of the product code, read from its sources with `ast`: every import counts, also one inside a
function (a lazy import is still a dependency). walcore's layers, from the bottom: the file formats (tarantool,
limestone), the repository, the families and the layers the commands share (backup_common.py among them), the
commands (one module each, as pgBackRest's src/command/), the CLI. Generic code asks a family's `Family` and
never decides by its name."""

from __future__ import annotations

import ast
from pathlib import Path

import walcore

ROOT = Path(walcore.__file__).resolve().parent.parent  # the tree on PYTHONPATH: a branch's, or main's
PRODUCT = ("walcore", "spark_jobs", "plugins/walvault_provider", "dags")
COMMAND = "walcore.command."
NOT_COMMANDS = {"walcore.command"}  # the package


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[1:] if rel.parts[0] == "plugins" else rel.parts  # plugins/ is on the path itself
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(p): p for top in PRODUCT for p in sorted((ROOT / top).rglob("*.py"))}


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(module imported, names taken from it) for each import statement of the module."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            if node.level:
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((target, [alias.name for alias in node.names]))
    return found


def _graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Edges between product modules (an imported name that is a submodule counts as that module); and every
    (importer, module, name) of a `from module import name`."""
    sources = _sources()
    edges: dict[str, set[str]] = {name: set() for name in sources}
    names = []
    for name, path in sources.items():
        for target, taken in _imports(name, path):
            for alias in taken:
                names.append((name, target, alias))
            for module in [target] + [f"{target}.{alias}" for alias in taken]:
                if module in sources and module != name:
                    edges[name].add(module)
    return edges, names


def _external(module: str) -> set[str]:
    """Every module a module imports, product or not."""
    return {target for target, _taken in _imports(module, _sources()[module])}


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
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
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_in_the_product_code():
    """walcore, spark_jobs, the provider and the DAGs: no module reaches itself through its imports."""
    assert _circles(_graph()[0]) == []


FRAMEWORKS = ("airflow", "pyspark", "spark_jobs")


def _framework_imports(modules) -> list[tuple[str, str]]:
    return [(m, target) for m in modules for target in sorted(_external(m))
            if target.split(".")[0] in FRAMEWORKS]


def test_walcore_imports_no_framework():
    """walcore knows nothing of Airflow or Spark: `--spark` finds its runner through an entry point."""
    assert _framework_imports(m for m in _sources() if m.startswith("walcore")) == []


def _is_command(module: str) -> bool:
    return module.startswith(COMMAND) and module not in NOT_COMMANDS


def test_commands_import_no_other_command():
    """A command stands on the layers below it; what two commands share goes down a floor."""
    edges = _graph()[0]
    assert [(m, t) for m in sorted(edges) if _is_command(m) for t in sorted(edges[m]) if _is_command(t)] == []


def _submodule(package: str, name: str) -> bool:
    """A package's private module (its C extension) is the package's own: imported by name, it is no private name
    of another module."""
    return any(ROOT.joinpath(*package.split(".")).glob(name + ".*"))


def test_no_private_name_imported_from_another_module():
    sources = _sources()
    assert [(m, f"{target}.{alias}") for m, target, alias in _graph()[1]
            if alias.startswith("_") and not alias.startswith("__") and target in sources and target != m
            and not _submodule(target, alias)] == []


def test_the_graph_sees_the_code():
    """A check that finds nothing because it read nothing proves nothing: the graph holds the known edges."""
    edges, names = _graph()
    assert "walcore.repository" in edges["walcore.cli"]
    assert "walcore.command.verify" in edges["walcore.frontend"]  # a relative import inside a function
    assert any(m.startswith("walvault_provider") for m in edges) and any(m.startswith("dags") for m in edges)


FAMILY_PACKAGES = ("walcore.tarantool", "walcore.limestone")


def test_families_import_no_command():
    """A family sits below the commands: what it shares with them is a floor down (walcore.backup_common)."""
    edges = _graph()[0]
    family_modules = [m for m in sorted(edges) if any(m == p or m.startswith(p + ".") for p in FAMILY_PACKAGES)]
    assert "walcore.tarantool.family" in family_modules and "walcore.limestone.family" in family_modules
    assert [(m, t) for m in family_modules for t in sorted(edges[m])
            if t == "walcore.command" or t.startswith(COMMAND)] == []


FAMILY_NAMES = {"tarantool", "limestone"}
GENERIC = ("walcore.command", "walcore.restore_set", "walcore.restore_pitr", "walcore.repository")
REGISTRY = ("walcore.repository", "FAMILIES")  # the families a repository holds: the one place naming them all


def _family_literals(path: Path) -> list[tuple[int, str]]:
    """(line, name) of each string constant that is a family's name, but in the registry's assignment."""
    tree = ast.parse(path.read_text(), str(path))
    registry = {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == REGISTRY[1] for t in node.targets)
                for c in ast.walk(node.value)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and node.value in FAMILY_NAMES and id(node) not in registry]


def test_generic_code_names_no_family():
    """Commands, restores and the repository ask a family's `Family` (walcore.family): no comparison with a
    family's name, no dict by it, no family named in a call. Only the repository's registry names them."""
    sources = _sources()
    generic = {m: p for m, p in sources.items() if any(m == g or m.startswith(g + ".") for g in GENERIC)}
    assert "walcore.command.archive" in generic and "walcore.restore_pitr" in generic
    found = [(m, line, value) for m, path in sorted(generic.items()) for line, value in _family_literals(path)]
    assert found == []
    registry = ast.parse(sources[REGISTRY[0]].read_text())  # the check sees the names where the registry holds them
    assert {n.value for n in ast.walk(registry) if isinstance(n, ast.Constant)} >= FAMILY_NAMES
