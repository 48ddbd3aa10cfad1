"""wire/, agent/, host/ and worker/ are copied to bare hosts: standard library only, Python 3.8+."""

from __future__ import annotations

import ast
import builtins
import io
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit

WIRE = ROOT / "potato_queue" / "wire"
BARE = [WIRE, ROOT / "potato_queue" / "agent", ROOT / "potato_queue" / "host", ROOT / "potato_queue" / "worker"]
# Served in agent.pyz and copied to remote hosts with the bare packages (potato_queue.code_package).
TRAINERS = ROOT / "potato_queue" / "trainers"
STDLIB = set(sys.stdlib_module_names) | {"__future__"}


def module_level_imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append(node.module)
    return found


def bare_files() -> list[Path]:
    return sorted(p for folder in [*BARE, TRAINERS] for p in folder.rglob("*.py"))


def test_bare_packages_exist() -> None:
    assert len(bare_files()) >= 4


@pytest.mark.parametrize("path", bare_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_stdlib_only_at_module_level(path: Path) -> None:
    foreign = [
        m
        for m in module_level_imports(path)
        if m.split(".")[0] not in STDLIB
        and not m.startswith(
            (
                "potato_queue.wire",
                "potato_queue.agent",
                "potato_queue.host",
                "potato_queue.worker",
                "potato_queue.trainers",
            )
        )
    ]
    assert foreign == [], f"{path} imports {foreign} at module level; agent/ and worker/ run on bare hosts"


@pytest.mark.parametrize("path", sorted(WIRE.rglob("*.py")), ids=lambda p: p.name)
def test_wire_is_the_ground_floor(path: Path) -> None:
    """Every side imports wire/; it imports nothing of potato-queue but itself (at any depth), so that what
    the agent, the host scripts and the worker share never ties them to one another."""
    ours = [m for m in all_imports(path, "potato_queue.wire") if m.startswith("potato_queue")]
    assert [m for m in ours if not m.startswith("potato_queue.wire")] == [], f"{path.name} imports {ours}"


@pytest.mark.parametrize("script", ["boot.py", "ray_entry.py"])
def test_the_first_stages_import_nothing_of_ours_at_module_level(script: str) -> None:
    """host/boot.py (ssh) and host/ray_entry.py (a Ray job's entrypoint) run on a host where none of our code is
    yet (they fetch it): only the standard library at their top; boot.py imports ours inside boot(), once the
    code is there, and ray_entry.py never (it execs the agent)."""
    ours = [m for m in all_imports(ROOT / "potato_queue" / "host" / script) if m.startswith("potato_queue")]
    if script == "boot.py":
        ours = [
            m for m in module_level_imports(ROOT / "potato_queue" / "host" / script) if m.startswith("potato_queue")
        ]
    assert ours == [], f"host/{script} imports {ours} before the code is on the host"


# What each bare package may import of the others (beyond wire/): the agent runs the host scripts' GPU choice
# and starts the worker as a process (a meaning both own, the checkpoint folder's layout, is in wire/); the
# worker and the host scripts import neither it nor each other.
BARE_MAY_IMPORT = {
    "agent": ("potato_queue.host",),
    "host": (),
    "worker": ("potato_queue.trainers",),
}


@pytest.mark.parametrize("package", sorted(BARE_MAY_IMPORT))
def test_the_bare_packages_import_one_way(package: str) -> None:
    others = tuple(f"potato_queue.{name}" for name in BARE_MAY_IMPORT if name != package)
    bad = sorted(
        {
            f"{path.relative_to(ROOT / 'potato_queue').as_posix()}: {m}"
            for path in (ROOT / "potato_queue" / package).rglob("*.py")
            for m in all_imports(
                path,
                ".".join(("potato_queue", package, *path.relative_to(ROOT / "potato_queue" / package).parent.parts)),
            )
            if m.startswith(others) and not m.startswith(BARE_MAY_IMPORT[package])
        }
    )
    assert bad == [], f"{package}/ imports what imports it back or a sibling: {bad}"


def test_scanner_catches_a_foreign_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import os\nimport requests\nfrom potato_queue.config import LOCAL\n")
    assert module_level_imports(bad) == ["os", "requests", "potato_queue.config"]


def test_vermin_says_python_38_is_enough() -> None:
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    proc = subprocess.run(
        [
            vermin,
            "--no-tips",
            "--target=3.8-",
            "--violations",
            "--eval-annotations",
            "--backport",
            "typing",
            *map(str, BARE),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_trainers_run_on_python_38_too() -> None:
    """Their annotations are never evaluated (from __future__ import annotations), so only the code counts."""
    vermin = shutil.which("vermin") or str(Path(sys.executable).parent / "vermin")
    proc = subprocess.run(
        [vermin, "--no-tips", "--target=3.8-", "--violations", "--backport", "typing", str(TRAINERS)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_served_code_is_the_bare_packages_and_is_the_same_each_time() -> None:
    import zipfile

    from potato_queue.code_package import agent_zipapp

    package = agent_zipapp()
    agent_zipapp.cache_clear()
    assert agent_zipapp().sha256 == package.sha256, "the same code makes the same archive (its hash names it)"
    with zipfile.ZipFile(io.BytesIO(package.data)) as archive:
        names = set(archive.namelist())
    expected = {f"potato_queue/{p.relative_to(ROOT / 'potato_queue').as_posix()}" for p in bare_files()}
    assert expected <= names and "__main__.py" in names
    assert not [
        n for n in names if n.startswith(("potato_queue/server", "potato_queue/executors", "potato_queue/config"))
    ]


# ---------------------------------------------------------------- what each part may import

PACKAGE = ROOT / "potato_queue"
HEAVY = ("celery", "kombu", "fastapi", "starlette", "uvicorn", "torch", "transformers", "peft", "sklearn")
CORE = [
    "config.py",
    "validate.py",
    "run.py",
    "store",
    "bounds.py",
    "bundle",
    "schemes",
    "runs/finalize.py",
    "runs/gate.py",
    "runs/checks.py",
    "insight",
    "lab",
]
NOT_FOR_THE_CORE = (
    "potato_queue.executors",
    "potato_queue.server",
    "potato_queue.processes",
    "potato_queue.agent",
    "potato_queue.host",
    "potato_queue.worker",
    "potato_queue.runs.lifecycle",
    "potato_queue.runs.dispatch",
)


def all_imports(path: Path, package: str | None = None) -> list[str]:
    """Every module a file imports, at any depth (function-level imports included).
    Relative imports are resolved against `package` (default: the file's own, under ROOT)."""
    parts = package.split(".") if package else list(path.relative_to(ROOT).parent.parts)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = parts[: len(parts) - node.level + 1] if node.level else []
            found.append(".".join((*base, node.module)))
    return found


def _files(*names: str) -> list[Path]:
    out: list[Path] = []
    for name in names:
        target = PACKAGE / name
        out += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    return out


def executor_modules() -> list[Path]:
    """One module per backend type; the ssh transport they share is the executors/remote/ sub-package."""
    return [p for p in (PACKAGE / "executors").glob("*.py") if p.name not in ("__init__.py", "base.py")]


def test_there_is_an_executor_module_per_runnable_backend_type() -> None:
    from potato_queue.executors import RUNNABLE

    assert {p.stem for p in executor_modules()} >= set(RUNNABLE)


@pytest.mark.parametrize("path", executor_modules(), ids=lambda p: p.name)
def test_an_executor_imports_no_celery_fastapi_torch_nor_another_executor(path: Path) -> None:
    others = {f"potato_queue.executors.{p.stem}" for p in executor_modules()} - {f"potato_queue.executors.{path.stem}"}
    bad = [
        m
        for m in all_imports(path)
        if m.split(".")[0] in HEAVY
        or m in others
        or m.startswith(("potato_queue.server", "potato_queue.processes", "potato_queue.runs"))
    ]
    assert bad == [], f"{path.name} imports {bad}; executors/ is the plug-in boundary"


@pytest.mark.parametrize("path", _files(*CORE), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_core_imports_no_executor_server_tasks_or_agent(path: Path) -> None:
    bad = [m for m in all_imports(path) if m.startswith(NOT_FOR_THE_CORE) or m.split(".")[0] in HEAVY]
    assert bad == [], f"{path.relative_to(PACKAGE)} imports {bad}"


@pytest.mark.parametrize("path", _files("store", "run.py"), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_the_store_imports_nothing_of_a_runs_life(path: Path) -> None:
    """Nothing runs back up: runs/ asks the store, never the other way round."""
    bad = [m for m in all_imports(path) if m.startswith("potato_queue.runs")]
    assert bad == [], f"{path.relative_to(PACKAGE)} imports {bad}"


def test_the_import_scanner_sees_function_level_and_relative_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    import torch\n    from .local import LocalExecutor\n    from ..store import X\n")
    assert all_imports(probe, "potato_queue.executors") == [
        "torch",
        "potato_queue.executors.local",
        "potato_queue.store",
    ]


# ---------------------------------------------------------------- sizes

MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def package_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_no_module_is_over_400_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for p in package_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}, f"split these by what they do: {long}"


def test_the_routes_raise_the_cores_errors_never_an_http_exception() -> None:
    """One table maps the core's errors to HTTP statuses (server/guard.py STATUS_OF_ERROR); a route that raised
    its own HTTPException would choose a status beside it, with a body of another shape."""
    found = [
        f"{path.relative_to(PACKAGE)}:{node.lineno}"
        for path in sorted((PACKAGE / "server").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.Name) and node.id == "HTTPException")
        or (isinstance(node, ast.alias) and node.name.endswith("HTTPException"))
        or (isinstance(node, ast.Attribute) and node.attr == "HTTPException")
    ]
    assert found == [], f"raise a potato_queue.errors error instead (its status is in guard.py): {found}"


def test_one_error_reply_shape() -> None:
    defined = [str(p.relative_to(PACKAGE)) for p in package_files() if "class ErrorReply(" in p.read_text()]
    assert defined == ["server/deps.py"], defined


MAX_TOP_LEVEL_MODULES = 12


def test_the_top_level_holds_the_cores_vocabulary_only() -> None:
    """A newcomer reads the package's top level first: the core's words (run, config, errors, clock, ...), with
    the command line in cli/, the shared ground floor in wire/, and each other part in its own room."""
    top = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} top-level modules: {top}; give the newest a room"
    assert not [name for name in top if name.startswith("cli")], "the command line lives in cli/"


def test_no_function_is_over_60_lines() -> None:
    long = {}
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    long[f"{path.relative_to(ROOT)}:{node.name}"] = size
    assert long == {}, f"shorten these: {long}"


# ---------------------------------------------------------------- the import graph


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
    """Each module's imports of our modules (at any depth), and every private name one imports from another."""
    modules = {module_name(p): p for p in package_files()}

    def owner(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, set[str]] = {}
    private: list[tuple[str, str, str]] = []
    for name, path in modules.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets |= {owner(a.name) for a in node.names if a.name.startswith("potato_queue")}
            elif isinstance(node, ast.ImportFrom):
                base = package[: len(package) - node.level + 1] if node.level else []
                source = ".".join([*base, node.module] if node.module else base)
                if not source.startswith("potato_queue"):
                    continue
                for alias in node.names:
                    target = f"{source}.{alias.name}" if f"{source}.{alias.name}" in modules else owner(source)
                    targets.add(target)
                    if alias.name.startswith("_") and not alias.name.startswith("__") and target != name:
                        private.append((name, source, alias.name))
        # Importing a.b.c runs a/__init__ and a/b/__init__ first: an edge to each package not already ours.
        ours = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
        targets |= {parent for t in set(targets) for parent in packages_above(t, modules) if parent not in ours}
        edges[name] = {t for t in targets if t and t != name}
    return edges, private


def packages_above(module: str, modules: dict[str, Path]) -> list[str]:
    parts = module.split(".")
    return [p for i in range(2, len(parts)) if (p := ".".join(parts[:i])) in modules]


def import_cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in edges.get(node, ()):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = stack[stack.index(node) :]
            del stack[stack.index(node) :]
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return cycles


def test_no_import_circle_even_through_imports_inside_functions() -> None:
    edges, _ = import_graph()
    assert import_cycles(edges) == [], "a module imports, directly or not, one that imports it back"


def test_the_cycle_finder_finds_one() -> None:
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_private_name_is_imported_from_another_module() -> None:
    _, private = import_graph()
    assert private == [], "make these public (no leading underscore, in __all__) or keep them in their module"


# ---------------------------------------------------------------- one name for each state

RUN_STATE_TEXTS = {"queued", "starting", "collecting", "succeeded", "failed", "cancelled", "broken"}
# Where a run state's text may be spelled: its definition, and the standard-library parts that speak other
# protocols (a worker's status, SLURM's, Potato's) and cannot import it.
STATE_TEXT_ALLOWED = (
    "run.py",
    "wire/",
    "agent/",
    "host/",
    "worker/",
    "trainers/",
    "store/potato_ledger.py",
    "potato_hook.py",
)


def test_every_run_state_is_named_through_the_enum() -> None:
    """`queued` etc. as string literals outside run.py: compare with RunState, never with the text."""
    found = []
    for path in package_files():
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith(STATE_TEXT_ALLOWED):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in RUN_STATE_TEXTS:
                found.append(f"{relative}:{node.lineno} {node.value!r}")
    assert found == [], "name these through potato_queue.run.RunState"


# ---------------------------------------------------------------- the store owns Redis; the clock owns time

# Where a Redis client may be made or used directly: the store, and the process edges that make the client
# for a URL they were handed (processes/, cli/) or ping a URL before anything is built (embedded_redis.py).
REDIS_ALLOWED = ("store/", "processes/", "cli/")
REDIS_ALLOWED_FILES = ("embedded_redis.py",)
# What of a Redis client is the store's alone, whoever holds the object: its client, a client made from a
# URL, a subscription.
REDIS_ONLY_IN_STORE = {"redis", "from_url", "pubsub", "StrictRedis"}


def redis_uses(path: Path) -> list[str]:
    """Each place a file reaches Redis itself: `x.redis` (the store's client), a client made or subscribed
    to, or anything of the redis package but its error types (caught) and the Redis type (annotated)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    modules = {
        alias.asname or alias.name.split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name.split(".")[0] == "redis"
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in REDIS_ONLY_IN_STORE:
            found.append(f"{node.lineno} .{node.attr}")
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and not node.attr.endswith(("Error", "Exception"))
            and node.attr != "Redis"
        ):
            found.append(f"{node.lineno} {node.value.id}.{node.attr}")
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "Redis":
            found.append(f"{node.lineno} a Redis client made")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno} import {a.name}" for a in node.names if a.name.startswith("redis.")]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "redis":
            found += [
                f"{node.lineno} from {node.module} import {a.name}"
                for a in node.names
                if not a.name.endswith(("Error", "Exception"))
            ]
    return found


def outside_the_store() -> list[Path]:
    return [
        p
        for p in package_files()
        if not p.relative_to(PACKAGE).as_posix().startswith(REDIS_ALLOWED) and p.name not in REDIS_ALLOWED_FILES
    ]


def test_the_store_owns_every_redis_call() -> None:
    """A route, a run's life or an executor asks the store (a named part: store.retrain, store.offers,
    store.presence, ...), so that every key, script and subscription of ours is in one place."""
    found = [f"{path.relative_to(PACKAGE)}:{use}" for path in outside_the_store() for use in redis_uses(path)]
    assert found == [], f"give these a store method: {found}"


def test_the_redis_scanner_catches_a_direct_call(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import redis\nimport redis.asyncio as aioredis\nfrom redis.client import PubSub\n"
        "from redis import RedisError\n"
        "def f(store, client: redis.Redis):\n"
        "    store.redis.ping()\n    client.pubsub()\n    aioredis.Redis.from_url('x')\n"
        "    redis.Redis(host='h')\n    try:\n        pass\n    except redis.RedisError:\n        pass\n"
    )
    uses = [use.split(" ", 1)[1] for use in redis_uses(probe)]
    assert sorted(uses) == sorted(
        [
            "import redis.asyncio",
            "from redis.client import PubSub",
            ".redis",
            ".pubsub",
            ".from_url",
            "a Redis client made",
        ]
    ), uses


# The clock is read through a Clock (store.clock, potato_queue.clock): tests hand the store a ManualClock. The
# command line and the bare packages (which run without the store) read time themselves.
TIME_ALLOWED = ("clock.py", "cli/", "agent/", "host/", "worker/", "wire/", "trainers/")


def module_reads(path: Path, module: str, names: set[str]) -> list[int]:
    """The lines that use one of `names` of the standard-library `module`: `module.name` (under any name the
    module was imported as), or `from module import name`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    aliases = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import)
        for alias in node.names
        if alias.name == module
    }
    found = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and node.attr in names
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
        ):
            found.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == module and any(a.name in names for a in node.names):
            found.append(node.lineno)
    return sorted(found)


def time_time_reads(path: Path) -> list[int]:
    """The lines that read the wall clock themselves: time.time() or `from time import time`."""
    return module_reads(path, "time", {"time"})


def outside(allowed: tuple[str, ...], lines_of: Callable[[Path], list[int]]) -> list[str]:
    """`path:line` of what `lines_of` finds in the package's modules, but those under `allowed`."""
    return [
        f"{path.relative_to(PACKAGE)}:{line}"
        for path in package_files()
        if not path.relative_to(PACKAGE).as_posix().startswith(allowed)
        for line in lines_of(path)
    ]


def test_every_clock_read_goes_through_a_clock() -> None:
    found = outside(TIME_ALLOWED, time_time_reads)
    assert found == [], f"read store.clock.now_s() (a potato_queue.clock.Clock) instead: {found}"


def test_the_clock_scanner_catches_a_wall_clock_read(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import time\nimport time as t\nfrom time import time as now\n"
        "a = time.time()\nb = t.time()\nc = time.monotonic()\nd = now()\n"
    )
    assert time_time_reads(probe) == [3, 4, 5]


# Only a process's edge reads the environment (settings.py's Settings.from_env, called there); below it the
# settings are handed down. The edges: the command line; Celery's own entry point; Potato's side, which runs
# in Potato's process; and what runs on a host or in the worker (their environment is the allow-listed one).
ENVIRONMENT_ALLOWED = (
    "cli/",
    "celery_entry.py",
    "potato_remote.py",
    "settings.py",
    "agent/",
    "host/",
    "worker/",
    "wire/",
    "trainers/",
)


def environment_reads(path: Path) -> list[int]:
    """The lines that read the process's environment: os.environ, os.environb, os.getenv, os.getenvb."""
    return module_reads(path, "os", {"environ", "environb", "getenv", "getenvb"})


def test_only_a_process_edge_reads_the_environment() -> None:
    found = outside(ENVIRONMENT_ALLOWED, environment_reads)
    assert found == [], f"add a field to settings.Settings and hand it down (config.settings) instead: {found}"


def test_the_environment_scanner_catches_every_way_in(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os\nimport os as o\nfrom os import getenv\n"
        "a = os.environ.get('X')\nb = o.getenv('Y')\nc = os.path.join('a')\nd = dict(os.environ)\n"
    )
    assert sorted(environment_reads(probe)) == [3, 4, 5, 7]


# Each side's errors have one root: errors.py's PotatoQueueError (message, fix, exit code) for the server, the
# executors and the command line; agent/errors.py's AgentError; worker/errors.py's WorkerError. wire/ and host/
# raise a plain built-in error or two (a parse's ValueError, the GPU pick's refusal), and Potato's side,
# potato_remote.py, raises Potato's own TrainerError.
ROOTS = {"errors.py": "PotatoQueueError", "agent/errors.py": "AgentError", "worker/errors.py": "WorkerError"}
OWN_ROOTS = ("wire/", "host/", "potato_remote.py")
BUILTIN_ERRORS = {
    name
    for name in dir(builtins)
    if isinstance(getattr(builtins, name), type) and issubclass(getattr(builtins, name), BaseException)
}


def classes_on_a_builtin_error(path: Path) -> list[str]:
    """The classes here that derive straight from a built-in exception (Exception, ValueError, ...)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id in BUILTIN_ERRORS for base in node.bases)
    ]


def test_every_error_is_under_its_sides_root() -> None:
    found = {}
    for path in package_files():
        where = path.relative_to(PACKAGE).as_posix()
        if where.startswith(OWN_ROOTS):
            continue
        stray = [name for name in classes_on_a_builtin_error(path) if name != ROOTS.get(where)]
        if stray:
            found[where] = stray
    assert found == {}, f"derive these from their side's root ({ROOTS}): {found}"


def test_the_error_scanner_sees_a_builtin_base(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "class A(Exception):\n    pass\nclass B(A):\n    pass\nclass C(ValueError, A):\n    pass\nclass D:\n    pass\n"
    )
    assert classes_on_a_builtin_error(probe) == ["A", "C"]
