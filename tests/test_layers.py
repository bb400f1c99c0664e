"""The master's layers, read from its source: no module imports a layer above its own,
and no imports go round in a cycle (master/__init__.py says which layer is which).

Also the journal's record kinds: the table of apply functions names every kind the
proto defines, in the order of their numbers (master/meta/namespace.py, ``APPLY``);
and, for the whole tree, where metrics are defined: each process's in its own
package's ``metrics.py``, common/metrics.py only the machinery and the RPC and limit
metrics every server updates; and that every path a comment, docstring or doc names
(``master/meta/store.py``, ``tls/configmap.yaml``) is a file of the tree.
"""

from __future__ import annotations

import ast
import os
import pathlib
import re

from curvine.master.meta.namespace import APPLY, Namespace
from curvine.proto import journal_pb2

ROOT = pathlib.Path(__file__).resolve().parent.parent

# Lowest first: a module may import its own layer (no cycle) and the layers below it.
LAYERS = [
    ("journal", ("curvine.journal",)),
    # the master group's consensus parts (etcd, leadership, the journal in etcd):
    # meta opens an EtcdJournal like a local one, and needs nothing above
    ("group", ("curvine.master.group",)),
    ("meta", ("curvine.master.meta",)),
    ("cluster", ("curvine.master.cluster",)),
    ("facade", ("curvine.master.master",)),
    ("ports", ("curvine.master.ports",)),
    # a member of a master group: builds the Master of its role; the ports reach it
    # through the servicer's ``member`` without importing it
    ("member", ("curvine.master.member",)),
    ("server", ("curvine.master.server",)),
]
PACKAGES = {"curvine.master": "master", "curvine.journal": "journal"}
# What the servers never import (DESIGN.md, "Layout"): the clients' side.
FORBIDDEN = ("curvine.fuse_client", "curvine.connector", "curvine.client", "curvine.cli",
             "curvine.devtools", "curvine.worker")


def _modules(packages: dict[str, str] = PACKAGES) -> dict[str, pathlib.Path]:
    """module name -> source file of every module of ``packages`` (name -> folder)."""
    out = {}
    for package, folder in packages.items():
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join([package, *parts])] = path
    return out


def _layer(module: str) -> int | None:
    for rank, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return rank
    return None


def _imports(module: str, path: pathlib.Path) -> list[tuple[str, int]]:
    """(module imported, line) of every import in ``path``, relative ones resolved;
    ``from X import name`` counts as X.name where that is a module of ours."""
    is_package = path.name == "__init__.py"
    here = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            found.append((target, node.lineno))
            found += [(f"{target}.{alias.name}", node.lineno) for alias in node.names]
    return found


def _graph(packages: dict[str, str] = PACKAGES, forbidden: tuple[str, ...] = FORBIDDEN):
    """(modules, edges: module -> the modules of ours and the forbidden ones it imports,
    the line of each edge)."""
    modules = _modules(packages)
    edges: dict[str, set[str]] = {m: set() for m in modules}
    lines: dict[tuple[str, str], int] = {}
    for module, path in modules.items():
        for target, line in _imports(module, path):
            if target in modules and target != module:
                edges[module].add(target)
                lines.setdefault((module, target), line)
            elif any(target == f or target.startswith(f + ".") for f in forbidden):
                edges[module].add(target)
                lines.setdefault((module, target), line)
    return modules, edges, lines


def _cycles(edges: dict[str, set[str]]) -> list[str]:
    """Every import cycle found by a depth-first walk, as "a -> b -> a"."""
    cycles = []
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(edges.get(module, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join(path[path.index(target):] + [target]))
            elif target not in state and target in edges:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(edges):
        if module not in state:
            visit(module)
    return cycles


def test_every_master_module_is_in_a_layer():
    unplaced = [m for m in _modules() if _layer(m) is None and m not in PACKAGES]
    assert unplaced == [], "place these modules in LAYERS (and in master/__init__.py)"


def test_no_module_imports_a_layer_above_its_own():
    modules, edges, lines = _graph()
    upward = []
    for module, targets in edges.items():
        for target in targets:
            if any(target == f or target.startswith(f + ".") for f in FORBIDDEN):
                upward.append(f"{modules[module].relative_to(ROOT)}:{lines[module, target]}: "
                              f"{module} imports {target} (a server never does)")
                continue
            mine, theirs = _layer(module), _layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                upward.append(f"{modules[module].relative_to(ROOT)}:{lines[module, target]}: "
                              f"{module} ({LAYERS[mine][0]}) imports {target} "
                              f"({LAYERS[theirs][0]})")
    assert upward == []


def test_no_import_cycle():
    _, edges, _ = _graph()
    assert _cycles(edges) == []


def test_the_record_table_names_every_kind_in_the_order_of_its_number():
    fields = journal_pb2.JournalEntry.DESCRIPTOR.oneofs_by_name["op"].fields
    assert list(APPLY) == [f.name for f in sorted(fields, key=lambda f: f.number)]
    assert all(fn.__qualname__.startswith("Namespace._apply_") for fn in APPLY.values())
    # and nothing applies a record but through the table
    unlisted = {name for name in vars(Namespace) if name.startswith("_apply_")} - {
        fn.__name__ for fn in APPLY.values()}
    assert unlisted == {"_apply_exchange"}  # the exchange form of a rename record


# -- metrics: one module per process defines them ----------------------------------------

# Every package of ours (the folder of each): where metric definitions are looked for.
TREE = ("common", "journal", "master", "worker", "client", "fuse_client", "connector",
        "cli", "devtools")
_METRIC_TYPES = {"Counter", "Gauge", "Histogram", "Summary", "Info", "Enum"}


def _metric_definitions(path: pathlib.Path) -> list[tuple[str, int, str]]:
    """(what is made, line, the name it is bound to or "") of every Prometheus metric
    or metric family that ``path`` makes: calls of the classes imported from
    prometheus_client (not, say, collections.Counter)."""
    tree = ast.parse(path.read_text(), str(path))
    ours = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("prometheus_client"):
            for alias in node.names:
                if alias.name in _METRIC_TYPES or alias.name.endswith("MetricFamily"):
                    ours[alias.asname or alias.name] = alias.name
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    bound[id(node.value)] = target.id
    return [(ours[node.func.id], node.lineno, bound.get(id(node), ""))
            for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ours]


def test_metrics_are_defined_only_in_metrics_modules():
    """A process's metrics (and the families its collectors yield) are defined in its
    package's metrics.py, beside the function that assembles its registry, not
    wherever they are updated."""
    elsewhere = [f"{path.relative_to(ROOT)}:{line}: {kind}"
                 for folder in TREE for path in sorted((ROOT / folder).rglob("*.py"))
                 if path.name != "metrics.py"
                 for kind, line, _ in _metric_definitions(path)]
    assert elsewhere == []


def test_common_metrics_defines_only_what_every_server_updates():
    """common/metrics.py is the machinery plus the RPC and limit metrics of every
    server (RPC_METRICS, LIMIT_METRICS): no process's own metrics."""
    path = ROOT / "common" / "metrics.py"
    defined = {name for _, _, name in _metric_definitions(path)}
    groups = set()
    for node in ast.parse(path.read_text()).body:
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Tuple)
                and any(isinstance(t, ast.Name) and t.id in ("RPC_METRICS", "LIMIT_METRICS")
                        for t in node.targets)):
            groups |= {e.id for e in node.value.elts if isinstance(e, ast.Name)}
    assert groups and defined == groups


# -- paths named in the tree ----------------------------------------------------------

# Every ``dir/name.ext`` that a file of the tree names (in code, comments, docstrings,
# docs, configs, manifests, units) must be a file of the tree, at that path from the
# root or from some directory of it (a package's docstring says ``meta/store.py``, a
# page on the manifests ``tls/configmap.yaml``).  Not checked:
# - text that is not ours to keep: generated protobuf modules (``*_pb2*.py[i]``, protoc's
#   output), the pyfuse3 patches (``*.patch``: paths of pyfuse3's tree) and CHANGELOG.md
#   (history: each entry names the paths of its day);
# - paths outside the tree: one whose first directory is no directory of the tree
#   (``lmcache/v1/...``, ``BASE/conf/...``, a diff's ``a/src/...``), and one that is the
#   end of a longer path or URL (after ``/``, ``.`` or a word character);
# - what the code writes rather than the tree holds: OUTPUTS.
PATH_EXTENSIONS = ("py", "pyi", "md", "sh", "toml", "yaml", "yml", "proto", "service",
                   "patch", "json", "txt")
PATH_REF = re.compile(r"(?<![\w./-])((?:[A-Za-z_][\w-]*/)+[\w.@-]+\.(?:%s))\b"
                      % "|".join(PATH_EXTENSIONS))
NOT_SCANNED = re.compile(r"(_pb2(_grpc)?\.pyi?|\.patch|^CHANGELOG\.md)$")
SKIPPED_DIRS = {".git", ".venv", ".pytest_cache", "__pycache__", "build", "tmp"}
OUTPUTS = {
    "conf/client.toml": "a local cluster's client config, BASE/conf/client.toml "
                        "(devtools/local.py writes it)",
}


def _tree_files(root: pathlib.Path = None) -> list[str]:
    """Every file of the checkout, relative to its root (no venv, caches, git)."""
    root = root or ROOT
    out = []
    for here, subdirs, names in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in SKIPPED_DIRS and not d.endswith(".egg-info")]
        rel = pathlib.Path(here).relative_to(root)
        out += [(rel / n).as_posix() for n in names]
    return sorted(out)


def stale_paths(root: pathlib.Path = None) -> list[str]:
    """"file:line: path" for every path named in the tree that is no file of it."""
    root = root or ROOT
    files = _tree_files(root)
    dirs = {d.as_posix() for f in files for d in pathlib.PurePosixPath(f).parents}
    dir_names = {pathlib.PurePosixPath(d).name for d in dirs if d != "."}
    suffixes = set(files) | {f.split("/", i)[-1] for f in files for i in range(1, f.count("/") + 1)}
    stale = []
    for f in files:
        if NOT_SCANNED.search(f) or not f.endswith(tuple("." + e for e in PATH_EXTENSIONS)
                                                   + ("Dockerfile", ".ci/run")):
            continue
        try:
            text = (root / f).read_text()
        except UnicodeDecodeError:
            continue
        for m in PATH_REF.finditer(text):
            ref = m.group(1)
            if ref.split("/")[0] not in dir_names or ref in OUTPUTS or ref in suffixes:
                continue
            stale.append(f"{f}:{text.count(chr(10), 0, m.start()) + 1}: {ref}")
    return stale


def test_every_path_named_in_the_tree_is_a_file_of_it():
    assert stale_paths() == []


def test_the_path_check_sees_a_stale_path(tmp_path):
    """The check finds a moved module named by its old path (and accepts the new one,
    a path from a package's own directory, an external path and a URL)."""
    old = "master" + "/store.py"  # not spelt out: this file is checked too
    (tmp_path / "master" / "meta").mkdir(parents=True)
    (tmp_path / "master" / "meta" / "store.py").write_text(
        '"""Keys: see master/meta/store.py and meta/store.py."""\n')
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "page.md").write_text(
        f"The store (`{old}`) ... lmcache/v1/config.py, https://example.com/{old}\n")
    assert stale_paths(tmp_path) == [f"notes/page.md:1: {old}"]
