"""The two-process rule, visible in the tree: only trainer_core/worker/ imports the ML stack. Every other
module of the project (the dashboard's pages and their imports, db/, ui/, the gateway, the jobs package,
the CLI) is imported in a fresh interpreter, which must end up without torch, transformers & co."""
from __future__ import annotations

import ast
import json
import sys

from tests.support import ROOT, run_python

ML_STACK = ("torch", "transformers", "peft", "trl", "unsloth", "datasets", "accelerate", "bitsandbytes")
PACKAGES = ("trainer_core", "db", "ui", "gateway")
SCRIPTS = ("streamlit_app.py", *(f"pages/{p.name}" for p in sorted((ROOT / "pages").glob("*.py"))))


def project_modules() -> list[str]:
    """Every module of the project's packages outside trainer_core/worker/."""
    names = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if parts[:2] == ("trainer_core", "worker"):
                continue
            names.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
    return names


def script_imports() -> list[str]:
    """What the Streamlit scripts import (running them needs a Streamlit session, importing them does not)."""
    names = set()
    for script in SCRIPTS:
        for node in ast.walk(ast.parse((ROOT / script).read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.update(f"{node.module}.{a.name}" if node.module in PACKAGES or "." in node.module else node.module
                             for a in node.names)
            elif isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
    return sorted(n for n in names if n.split(".")[0] in PACKAGES)


IMPORT_ALL = """
import importlib, json, sys
for name in json.loads(sys.argv[1]):
    try:
        importlib.import_module(name)
    except ModuleNotFoundError:
        parent, _, attr = name.rpartition(".")  # "from package import name" where name is not a module
        getattr(importlib.import_module(parent), attr)
print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))
"""


def test_only_the_worker_imports_the_ml_stack():
    modules = project_modules() + script_imports()
    assert "trainer_core.jobs.orchestrator" in modules and "db.store" in modules
    assert "trainer_core.data.preview" in modules
    assert not any(m.startswith("trainer_core.worker.") for m in project_modules())
    result = run_python(IMPORT_ALL, json.dumps(modules), json.dumps(ML_STACK))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_store_imports_only_the_protocol_from_trainer_core():
    tree = ast.parse((ROOT / "db" / "store.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    imported |= {a.name for node in ast.walk(tree) if isinstance(node, ast.Import) for a in node.names}
    ours = sorted(m for m in imported if m.split(".")[0] == "trainer_core")
    assert ours and all(m.startswith("trainer_core.protocol") for m in ours), ours


# The one exception: the pump decodes every event line with orjson (7x json.loads, its largest cost per
# event); a small compiled parser that both processes already install, nothing of the ML stack or the UI.
PROTOCOL_THIRD_PARTY = {"orjson"}


def test_the_protocol_needs_only_the_standard_library():
    for path in sorted((ROOT / "trainer_core" / "protocol").glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                top = name.split(".")[0]
                assert top in sys.stdlib_module_names or top in PROTOCOL_THIRD_PARTY \
                    or name.startswith("trainer_core.protocol") or name == "__future__", f"{path.name} imports {name}"


def test_test_module_names_are_unique():
    """pytest imports test modules by basename (tests/ folders are not packages): two test_hardening.py in
    different folders stop collection of the whole suite ("import file mismatch"), as CI found once."""
    seen: dict[str, str] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        rel = str(path.relative_to(ROOT))
        if path.name in seen:
            clashes.append((seen[path.name], rel))
        seen.setdefault(path.name, rel)
    assert clashes == []


def test_benchmarks_and_scripts_import_only_the_test_support_package():
    """bench/ and scripts/ share tests/support/ (tiny models, fakes, data) and never import a test module: a test
    file is free to change its helpers, and importing one would also drag its fixtures and markers along."""
    imported = []
    for folder in ("bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                    [a.name for a in node.names] if isinstance(node, ast.Import) else []
                imported += [(path.name, n) for n in names if n.split(".")[0] == "tests"]
    assert imported and all(n == "tests.support" or n.startswith("tests.support.") for _, n in imported), imported


COLLECT_ALL = """
import importlib.util, json, sys
for i, path in enumerate(json.loads(sys.argv[1])):
    spec = importlib.util.spec_from_file_location(f"collected_{i}", path)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    leaked = [m for m in json.loads(sys.argv[2]) if m in sys.modules]
    if leaked:
        print(json.dumps([path, leaked]))
        break
else:
    print(json.dumps(None))
"""


def test_collecting_the_tests_imports_no_ml_stack():
    """pytest imports every test module into one process before the first test: a module that imports torch at
    its top (directly or through a worker module) makes every "the dashboard never imported torch" assertion of
    the session fail. Worker modules the tests import must keep the ML stack in their functions."""
    modules = sorted(str(p) for p in (ROOT / "tests").rglob("*.py"))
    result = run_python(COLLECT_ALL, json.dumps(modules), json.dumps(ML_STACK))
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) is None


def module_imports(name: str, path) -> set[str]:
    """The project modules ``name`` imports at module level (imports inside functions are lazy by design and
    ``if TYPE_CHECKING:`` blocks never run)."""
    modules = module_files()
    is_package = path.name == "__init__.py"

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            continue
        for statement in node.body if isinstance(node, ast.Try) else [node]:
            if isinstance(statement, ast.Import):
                found.update(resolve(a.name) for a in statement.names)
            elif isinstance(statement, ast.ImportFrom):
                module = statement.module or ""
                if statement.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    module = ".".join(base[:len(base) - statement.level + 1] + ([module] if module else []))
                found.update(resolve(f"{module}.{a.name}") if f"{module}.{a.name}" in modules else resolve(module)
                             for a in statement.names)
    return {m for m in found if m and m != name}


def module_files() -> dict:
    files = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
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
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_no_import_circles():
    """Issue 18: no two project modules import each other, directly or around a circle, at module level."""
    graph = {name: module_imports(name, path) for name, path in module_files().items()}
    assert "trainer_core.jobs.pump" in graph["trainer_core.jobs.orchestrator"]  # the graph sees real imports
    assert import_cycles(graph) == []
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # and finds circles


LONG_MODULE_LINES = 330  # "about 300 lines at most" (issue 18): past this a module says why it is one module


def test_every_long_module_says_why_it_is_kept_whole():
    """A module over ~300 lines carries a 'Kept whole:' paragraph in its docstring naming why it is one module; a
    module that grows past the line without one is a prompt to split it (or to write down why not)."""
    unexplained = []
    for folder in (*PACKAGES, "pages", "bench", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            if text.count("\n") > LONG_MODULE_LINES and "Kept whole:" not in (ast.get_docstring(ast.parse(text)) or ""):
                unexplained.append(f"{path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    assert unexplained == [], "split these modules, or say why each is one module ('Kept whole: ...' in its " \
                              f"docstring): {unexplained}"


# ---- issue 30 #2: packages in layers (docs/architecture.md, "Layers")
# Lowest row first. A package imports only from its own row or the rows below it, lazy imports (inside functions)
# included and ``if TYPE_CHECKING:`` imports left out (they never run), and no packages import each other around a
# circle (same row included). Something two rows need moves down, not sideways.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("trainer_core.protocol", "trainer_core.auth", "trainer_core.host"),  # shared vocabulary, who may, this host
    ("trainer_core.methods", "trainer_core.kinds", "trainer_core.rewards"),  # methods' dashboard halves, model kinds'
    # capability rows and the rewards GRPO learns from: config's method sections, planning's and data's kind answers
    ("trainer_core.config",),  # the one TrainConfig: its method sections come from the method registry
    ("trainer_core.planning", "trainer_core.data"),  # what a model is and needs; datasets and their preview
    ("trainer_core.specs", "trainer_core.launchers", "db"),  # JobSpec and model sources; where workers run; the store
    ("trainer_core.evaluation", "trainer_core.serving", "trainer_core.export"),  # the job kinds' dashboard halves
    ("trainer_core.jobs",),  # the orchestrator: every kind's lifecycle
    ("trainer_core.tryout", "trainer_core.views", "trainer_core.feedback", "trainer_core.sweeps", "trainer_core.api",
     "trainer_core.recipes"),
    # trying a model; what pages draw; people's votes and ratings (over the store and model sources); sweeps (their
    # trials are runs started through the orchestrator); OpenAI's fine-tuning API mapped onto the orchestrator; data
    # recipes (a job kind whose models are served through the orchestrator first)
    ("gateway",),  # the shared mode's sign-in service, and the fine-tuning API's HTTP server
    ("ui", "trainer_core.cli", "trainer_core.__main__"),  # the surfaces: the dashboard's ui/ (pages/ above) and the CLI
)
BESIDE = "trainer_core.worker"  # the worker process: may import every row below the surfaces; nothing imports it
SURFACES = LAYERS[-1]


def is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name) and test.id == "TYPE_CHECKING" or \
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def all_imports(name: str, path, modules) -> list[tuple[int, str]]:
    """(line, project module) for every import of module ``name``, at module level and inside functions, except
    those under ``if TYPE_CHECKING:``. ``from package import x`` imports module ``package.x`` when that is a module."""
    is_package = path.name == "__init__.py"
    found: list[tuple[int, str]] = []

    def resolve(dotted: str) -> str | None:
        while dotted and dotted not in modules:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and is_type_checking(child.test):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.extend((node.lineno, resolve(a.name)) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            if node.level:
                base = name.split(".") if is_package else name.split(".")[:-1]
                module = ".".join(base[:len(base) - node.level + 1] + ([module] if module else []))
            found.extend((node.lineno, resolve(f"{module}.{a.name}") if f"{module}.{a.name}" in modules
                          else resolve(module)) for a in node.names)
        visit(node)

    visit(ast.parse(path.read_text()))
    return [(line, m) for line, m in found if m and m != name]


def unit_of(module: str) -> str | None:
    """The package a module counts for: trainer_core's sub-packages (and its __main__, the CLI) one by one, and the
    top-level packages whole. None for trainer_core's own (empty) __init__."""
    parts = module.split(".")
    if parts[0] != "trainer_core":
        return parts[0]
    return ".".join(parts[:2]) if len(parts) > 1 else None


def package_imports() -> list[tuple[str, str, str, int, str]]:
    """(importing package, imported package, importing file, line, imported module) for every import that crosses
    from one package to another."""
    modules = module_files()
    edges = []
    for name, path in modules.items():
        for line, target in all_imports(name, path, modules):
            source, dest = unit_of(name), unit_of(target)
            if source and dest and source != dest:
                edges.append((source, dest, str(path.relative_to(ROOT)), line, target))
    return edges


def layer_problems(edges) -> list[str]:
    row = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    problems = []
    for source, dest, file, line, target in edges:
        if dest == BESIDE:
            problems.append(f"{file}:{line} imports {target}: nothing outside {BESIDE} imports the worker")
        elif source == BESIDE:
            if dest in SURFACES:
                problems.append(f"{file}:{line} imports {target}: the worker imports nothing of the surfaces "
                                f"{SURFACES}")
        elif source not in row or dest not in row:
            problems.append(f"{file}:{line} imports {target}: give {source if source not in row else dest} a row "
                            "in tests/test_layering.py's LAYERS (and docs/architecture.md)")
        elif row[dest] > row[source]:
            problems.append(f"{file}:{line} imports {target}: {source} (row {row[source]}) may not import {dest} "
                            f"(row {row[dest]}, above it); move what both need down")
    return problems


def cycle_problems(edges) -> list[str]:
    graph: dict[str, set[str]] = {}
    for source, dest, *_ in edges:
        graph.setdefault(source, set()).add(dest)
    row = {unit: i for i, units in enumerate(LAYERS) for unit in units}
    problems = []
    for cycle in import_cycles(graph):
        members = set(cycle)
        inside = [e for e in edges if e[0] in members and e[1] in members]
        inside.sort(key=lambda e: row.get(e[1], len(LAYERS)) <= row.get(e[0], len(LAYERS)))  # upward ones first
        where = [f"{file}:{line} imports {target}" for source, dest, file, line, target in inside]
        problems.append(f"{' <-> '.join(cycle)} import each other: " + "; ".join(where[:12]))
    return problems


def test_every_package_imports_only_from_its_row_or_below():
    edges = package_imports()
    assert any(e[2] == "trainer_core/jobs/orchestrator.py" and e[1] == "db" for e in edges)  # the graph sees imports
    assert any(e[0] == "trainer_core.data" and e[1] == "trainer_core.planning" for e in edges)  # lazy ones too
    known = {unit for units in LAYERS for unit in units} | {BESIDE}
    packages = {unit_of(name) for name in module_files()} - {None}
    assert packages - known == set(), "give each package a row in LAYERS"
    assert layer_problems(edges) == []


def test_no_two_packages_import_each_other():
    assert cycle_problems(package_imports()) == []



def test_db_imports_only_the_protocol_and_auth_of_trainer_core():
    """db/ sits in row 4 so that the job kinds and jobs/ may use it; it needs nothing of trainer_core but the shared
    vocabulary and the roles of users (auth)."""
    assert {e[1] for e in package_imports() if e[0] == "db"} == {"trainer_core.protocol", "trainer_core.auth"}


def test_the_layer_checks_name_the_bad_import():
    """The checks fail, naming file, line and module: an upward import, an import of the worker, a package
    without a row, and a circle within one row."""
    edges = [("trainer_core.config", "trainer_core.jobs", "trainer_core/config/checks.py", 7,
              "trainer_core.jobs.queue"),
             ("trainer_core.jobs", "trainer_core.worker", "trainer_core/jobs/pump.py", 9, "trainer_core.worker.train"),
             ("trainer_core.newthing", "trainer_core.protocol", "trainer_core/newthing/a.py", 3,
              "trainer_core.protocol"),
             ("trainer_core.worker", "ui", "trainer_core/worker/train.py", 5, "ui.form"),
             ("trainer_core.jobs", "trainer_core.config", "trainer_core/jobs/queue.py", 4, "trainer_core.config")]
    problems = layer_problems(edges)
    assert problems[0] == ("trainer_core/config/checks.py:7 imports trainer_core.jobs.queue: trainer_core.config "
                           "(row 2) may not import trainer_core.jobs (row 6, above it); move what both need down")
    assert problems[1].startswith("trainer_core/jobs/pump.py:9 imports trainer_core.worker.train: nothing outside")
    assert problems[2].startswith("trainer_core/newthing/a.py:3 imports trainer_core.protocol: give "
                                  "trainer_core.newthing a row")
    assert problems[3].startswith("trainer_core/worker/train.py:5 imports ui.form: the worker imports nothing")
    assert len(problems) == 4
    sideways = [("trainer_core.data", "trainer_core.planning", "trainer_core/data/audio.py", 287,
                 "trainer_core.planning.modality"),
                ("trainer_core.planning", "trainer_core.data", "trainer_core/planning/memory.py", 30,
                 "trainer_core.data.sources")]
    assert layer_problems(sideways) == []
    assert cycle_problems(sideways) == [
        "trainer_core.data <-> trainer_core.planning import each other: trainer_core/data/audio.py:287 imports "
        "trainer_core.planning.modality; trainer_core/planning/memory.py:30 imports trainer_core.data.sources"]


if __name__ == "__main__":  # `python tests/test_layering.py`: the package graph's circles and upward imports
    found = package_imports()
    pairs = sorted({tuple(sorted((e[0], e[1]))) for e in found if any(f[0] == e[1] and f[1] == e[0] for f in found)})
    in_cycles = sorted({unit for cycle in import_cycles({s: {d for s2, d, *_ in found if s2 == s} for s, *_ in found})
                        for unit in cycle})
    print(f"{len(in_cycles)} packages in circles: {', '.join(in_cycles) or 'none'}")
    print(f"{len(pairs)} pairs that import each other: {', '.join(' <-> '.join(p) for p in pairs) or 'none'}")
    print("\n".join(layer_problems(found)) or "no import from a lower row to a higher one")
