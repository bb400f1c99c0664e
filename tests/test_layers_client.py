"""The client side's layers, read from its source (the import check of issue 34):

- ``client`` imports only ``common`` and ``proto`` (never the mount, the connector, the
  CLI, the devtools, the master or the worker); inside it ``files`` may import
  ``blocks`` and ``master``, and those two import neither each other nor ``files``;
- ``fuse_client`` and ``connector`` build on ``client`` (and ``common``/``proto``), never
  on each other, the CLI, the devtools, the master or the worker;
- ``cli`` and ``devtools`` do not import each other, but for the composition root:
  ``cli/main.py``'s table of command groups imports the devtools groups (local, demo,
  bench: COMPOSITION_ROOT, exactly those), each inside its loader function, so that
  importing the CLI loads none of them;
- ``common`` imports nothing of ours but ``proto`` and itself;
- no import cycle among all of these but the known ones below (KNOWN_CYCLES, empty
  now), so that no new one comes and a fixed one is struck off.

The helpers are tests/test_layers.py's (the master's check).
"""

from __future__ import annotations

import pytest

from test_layers import _cycles, _graph

PACKAGES = {"curvine.common": "common", "curvine.client": "client",
            "curvine.fuse_client": "fuse_client", "curvine.connector": "connector",
            "curvine.cli": "cli", "curvine.devtools": "devtools"}
EVERYTHING = ("curvine.common", "curvine.proto", "curvine.journal", "curvine.master",
              "curvine.worker", "curvine.client", "curvine.fuse_client", "curvine.connector",
              "curvine.cli", "curvine.devtools")

# package (or subpackage) -> the packages of ours it may import besides its own
ALLOWED = {
    "curvine.common": ("curvine.proto",),
    "curvine.client.master": ("curvine.common", "curvine.proto"),
    "curvine.client.blocks": ("curvine.common", "curvine.proto"),
    "curvine.client.files": ("curvine.client.blocks", "curvine.client.master",
                             "curvine.common", "curvine.proto"),
    "curvine.client": ("curvine.common", "curvine.proto"),  # client/__init__.py
    "curvine.fuse_client": ("curvine.client", "curvine.common", "curvine.proto"),
    "curvine.connector": ("curvine.client", "curvine.common", "curvine.proto"),
    # the operator commands and the developer tools drive whole clusters
    "curvine.cli": ("curvine.client", "curvine.common", "curvine.proto", "curvine.journal",
                    "curvine.master", "curvine.fuse_client"),
    "curvine.devtools": ("curvine.client", "curvine.common", "curvine.proto",
                         "curvine.journal", "curvine.master", "curvine.worker",
                         "curvine.fuse_client", "curvine.connector"),
}


# Cycles known and accepted, each as _cycles names it ("a -> b -> a"): none since the
# leftovers of issue 34 were fixed (the buffers' uploader takes a ``Storable``; the bench
# workloads share bench_common.py, not bench.py).  A new cycle fails the test below; one
# listed here that is gone fails it too, so the set shrinks as cycles are broken.
KNOWN_CYCLES: set[str] = set()


# The program's composition root (cli/main.py, COMMAND_GROUPS) and the devtools modules
# it, and only it, imports: each command group's module, and the package on the way.
COMPOSITION_ROOT = "curvine.cli.main"
ROOT_IMPORTS = {"curvine.devtools", "curvine.devtools.local", "curvine.devtools.demo",
                "curvine.devtools.bench"}


def _root_edge(module: str, target: str) -> bool:
    return module == COMPOSITION_ROOT and target in ROOT_IMPORTS


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _home(module: str) -> str:
    """The most specific package of ALLOWED that ``module`` is in."""
    return max((p for p in ALLOWED if _under(module, p)), key=len)


@pytest.fixture(scope="module")
def graph():
    return _graph(PACKAGES, EVERYTHING)


def test_no_client_side_package_imports_one_it_may_not(graph):
    modules, edges, lines = graph
    wrong = []
    for module, targets in sorted(edges.items()):
        home = _home(module)
        for target in sorted(targets):
            if _under(target, home) or any(_under(target, p) for p in ALLOWED[home]):
                continue
            if _root_edge(module, target):
                continue  # test_the_composition_root_imports_devtools_lazily
            wrong.append(f"{modules[module].relative_to(modules[module].parents[1])}:"
                         f"{lines[module, target]}: {module} ({home}) imports {target}")
    assert wrong == []


def test_cli_and_devtools_do_not_import_each_other(graph):
    _, edges, _ = graph
    crossing = [(m, t) for m, targets in edges.items() for t in targets
                if (_under(m, "curvine.cli") and _under(t, "curvine.devtools")
                    and not _root_edge(m, t))
                or (_under(m, "curvine.devtools") and _under(t, "curvine.cli"))]
    assert crossing == []


def test_the_composition_root_imports_devtools_lazily(graph):
    """cli/main.py imports exactly the devtools command groups, each inside a
    function (none at module level), and importing it loads no devtools module (the
    CLI's start-up); every entry of its table is a command group."""
    import ast
    import subprocess
    import sys

    modules, edges, _ = graph
    assert {t for t in edges[COMPOSITION_ROOT] if _under(t, "curvine.devtools")} == ROOT_IMPORTS
    tree = ast.parse(modules[COMPOSITION_ROOT].read_text())
    top = [node.lineno for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))
           and any(_under(name, "curvine.devtools")
                   for name in ([a.name for a in node.names] if isinstance(node, ast.Import)
                                else [node.module or ""]))]
    assert top == [], "cli/main.py imports a command group at module level"
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, curvine.cli.main; "
         "print(sorted(m for m in sys.modules if m.startswith('curvine.devtools')))"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert loaded == "[]"

    from curvine.cli.main import COMMAND_GROUPS
    for name, load in COMMAND_GROUPS.items():
        group = load()
        assert callable(group.register) and group.HELP and group.DESCRIPTION, name


def test_no_import_cycle_on_the_client_side_but_the_known_ones(graph):
    _, edges, _ = graph
    assert set(_cycles(edges)) == KNOWN_CYCLES


def _client_graph_at(root) -> dict:
    """The import edges of a ``client`` package made under ``root`` (a check's own
    test: the graph is read from there instead of the tree)."""
    import test_layers
    real = test_layers.ROOT
    test_layers.ROOT = root
    try:
        return _graph({"curvine.client": "client"}, EVERYTHING)[1]
    finally:
        test_layers.ROOT = real


def test_the_check_sees_an_upward_import(tmp_path):
    """A check that cannot fail is no check: the graph of a module that imports the
    mount from the client holds that edge, and the rule rejects it."""
    pkg = tmp_path / "client"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "bad.py").write_text("from curvine.fuse_client import operations\n")
    edges = _client_graph_at(tmp_path)
    target = "curvine.fuse_client.operations"
    assert target in edges["curvine.client.bad"]
    assert not any(_under(target, p) for p in ALLOWED[_home("curvine.client.bad")])


def test_the_check_sees_a_cycle(tmp_path):
    """Nor can the cycle check pass on a graph that has one: two modules that import
    each other, one of them only for type names (under TYPE_CHECKING, as the block
    buffers and their uploader did), make a cycle that KNOWN_CYCLES does not hold."""
    pkg = tmp_path / "client"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from . import b\n")
    (pkg / "b.py").write_text("from typing import TYPE_CHECKING\n"
                              "if TYPE_CHECKING:\n    from .a import Thing\n")
    edges = _client_graph_at(tmp_path)
    cycles = set(_cycles(edges))
    assert cycles == {"curvine.client.a -> curvine.client.b -> curvine.client.a"}
    assert cycles != KNOWN_CYCLES
