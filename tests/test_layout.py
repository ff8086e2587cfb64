"""The package's layout holds: one public API, imports that go one way, old paths that still resolve, and
plug-ins that live in a top-level module of the user's own."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import bench
from bench._moved import MOVED_MODULES
from bench.targets.frameworks.envs import TARGET_ENVS
from bench.targets.registry import REGISTRY

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bench"

# The API the issue names, which plug-ins and notebooks use; `bench.__all__` may hold more, never less.
PROMISED = {"run", "RunConfig", "load_report", "SampleRecord", "RolloutJob", "TrajectorySpec", "TargetAdapter"}

# (importing package, imported package, why the arrow must not exist)
RULES = [
    ("bench.targets", "bench.server", "a target talks to the server over HTTP only, as real rollout code does"),
    ("bench.invariants", "bench.server", "invariants judge what a run recorded, not how the server works"),
    ("bench.invariants", "bench.targets", "invariants judge records whatever target produced them"),
    ("bench.records", "bench", "records are the shared ground: they import nothing else of the bench"),
    ("faults", "bench", "the fault engine stands alone: the bench uses it, never the other way round"),
    *((layer, "bench.orchestration", "a lower layer never depends on how a run is orchestrated")
      for layer in ("bench.trace", "bench.tokenizer", "bench.synth", "bench.replay", "bench.records")),
]


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _type_only(tree: ast.Module) -> set[int]:
    """ids of the import nodes under `if TYPE_CHECKING:`: annotations, not a dependency at run time."""
    return {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
            and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
            for statement in node.body for inner in ast.walk(statement)}


def imports_of(module: str, source: str, *, is_package: bool) -> set[str]:
    """Every bench module `module` imports at run time (at the top or inside a function; not the names
    imported for annotations under `if TYPE_CHECKING:`), relative imports resolved."""
    found: set[str] = set()
    here = module.split(".") if is_package else module.split(".")[:-1]
    tree = ast.parse(source)
    type_only = _type_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""]).strip(".") if node.level \
                else node.module or ""
            if base == "bench":  # `from bench import server`: the name is the module
                found.update(f"bench.{alias.name}" for alias in node.names)
            else:
                found.add(base)
    return {name for name in found if _within(name, "bench")}


def broken_rules(modules: dict[str, tuple[str, bool]]) -> list[str]:
    """`module imports other (why)` for each import a rule forbids; `modules` maps name -> (source, is_package)."""
    broken = []
    for module, (source, is_package) in sorted(modules.items()):
        for imported in sorted(imports_of(module, source, is_package=is_package)):
            for importer, forbidden, why in RULES:
                if _within(module, importer) and _within(imported, forbidden) and not _within(imported, importer):
                    broken.append(f"{module} imports {imported} ({why})")
    return broken


def package_modules() -> dict[str, tuple[str, bool]]:
    modules = {}
    for path in [*PACKAGE.rglob("*.py"), *(ROOT / "faults").rglob("*.py")]:
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = (path.read_text(encoding="utf-8"), is_package)
    return modules


def test_the_public_api_is_the_objects_that_do_the_work() -> None:
    assert PROMISED <= set(bench.__all__) and sorted(bench.__all__) == sorted(bench._PUBLIC)
    for name in bench.__all__:
        home = importlib.import_module(bench._PUBLIC[name])
        assert getattr(bench, name) is getattr(home, bench._RENAMED.get(name, name)), name
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        getattr(bench, "no_such_name")


def test_importing_bench_alone_stays_cheap() -> None:
    """The worker and the pytest plugin import `bench` in every process: its names resolve on first use."""
    loaded = subprocess.run([sys.executable, "-c", "import bench, json, sys; print(json.dumps(sorted(m for m in "
                             "sys.modules if m.startswith('bench'))))"], capture_output=True, text=True, check=True,
                            cwd=ROOT)
    assert json.loads(loaded.stdout) == ["bench", "bench._moved"]


def test_imports_go_one_way() -> None:
    modules = package_modules()
    assert len(modules) > 100 and {"bench.records.sample", "bench.invariants.provenance", "faults.engine"} <= set(modules)
    assert broken_rules(modules) == []


def test_the_rule_check_catches_an_import_the_wrong_way() -> None:
    """The check above could pass by seeing nothing: a module breaking each rule is caught, lazily or not."""
    bad = {
        "bench.invariants.bad": ("from ..server.context import ServerContext\n"
                                 "def f():\n    from bench.targets import base\n", False),
        "bench.targets.reference.bad": ("from bench import server\n", False),
        "bench.records.bad": ("from bench.orchestration import runner\n", False),
        "bench.targets.fine": ("from bench.records import sample\nfrom . import base\n", False),
        "faults.catalogue.bad": ("from bench.targets import hooks\n", False),
        "bench.synth.bad": ("from bench.orchestration.progress import progress\n", False),
        "faults.fine": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from bench.replay import Generation\n",
                        False),
    }
    assert broken_rules(bad) == [
        "bench.invariants.bad imports bench.server.context (invariants judge what a run recorded, not how the "
        "server works)",
        "bench.invariants.bad imports bench.targets (invariants judge records whatever target produced them)",
        "bench.records.bad imports bench.orchestration (records are the shared ground: they import nothing else "
        "of the bench)",
        "bench.records.bad imports bench.orchestration (a lower layer never depends on how a run is orchestrated)",
        "bench.synth.bad imports bench.orchestration.progress (a lower layer never depends on how a run is "
        "orchestrated)",
        "bench.targets.reference.bad imports bench.server (a target talks to the server over HTTP only, as real "
        "rollout code does)",
        "faults.catalogue.bad imports bench.targets (the fault engine stands alone: the bench uses it, never the "
        "other way round)",
    ]


# Old file paths too: a docstring or Makefile pointing at a file that moved misleads as much as an import.
OLD_FILES = [old.replace(".", "/") + ".py" for old in MOVED_MODULES] + ["bench/known_findings", "envs/"]


def _old_paths_in(text: str) -> set[str]:
    dotted = {old for old in MOVED_MODULES if re.search(rf"(?<![\w.]){re.escape(old)}(?![\w.])", text)}
    return dotted | {old for old in OLD_FILES if re.search(rf"(?<![\w./]){re.escape(old)}", text)}


def test_nothing_of_ours_uses_an_old_path() -> None:
    """Old paths are for users' code; the bench, its tests, benchmarks, notebooks and README use the new ones."""
    users = {path: _old_paths_in(path.read_text(encoding="utf-8"))
             for folder in ("bench", "faults", "tests", "benchmarks", "notebooks", ".ci", ".github")
             for path in (ROOT / folder).rglob("*")
             if path.is_file() and path.suffix in {".py", ".ipynb", ".md", ".toml", ".yml", ""}
             and path.name not in {"_moved.py", "test_layout.py"}}
    users.update({ROOT / name: _old_paths_in((ROOT / name).read_text(encoding="utf-8"))
                  for name in ("Makefile", "pyproject.toml")})
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    users[ROOT / "README.md"] = _old_paths_in(readme.split("\nModules moved when", 1)[0])  # that paragraph lists them
    assert {str(path.relative_to(ROOT)): sorted(old) for path, old in users.items() if old} == {}


def test_old_module_paths_are_the_new_modules_with_a_deprecation_warning() -> None:
    script = textwrap.dedent("""
        import importlib, json, sys, warnings
        from bench._moved import MOVED_MODULES
        seen = {}
        for old, new in MOVED_MODULES.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                module = importlib.import_module(old)
            messages = [str(w.message) for w in caught if w.category is DeprecationWarning]
            seen[old] = [module is importlib.import_module(new), module.__name__, messages]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            from bench.targets import SampleRecord
            from bench.targets import DROPPED_OUTCOMES
            from bench.sweep import run_sweep  # the package's own entry point: no warning
        import bench
        seen["attributes"] = [SampleRecord is bench.SampleRecord and DROPPED_OUTCOMES is bench.DROPPED_OUTCOMES,
                              [f"{w.filename.rsplit('/', 1)[-1]}: {w.message}" for w in caught]]
        print(json.dumps(seen))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    seen = json.loads(run.stdout)
    for old, new in MOVED_MODULES.items():
        same, name, messages = seen[old]
        assert same and name == new, old
        assert messages == [f"{old} is deprecated: it moved to {new} (the public API is `from bench import ...`)"]
    same, messages = seen["attributes"]
    assert same and messages == [
        "<string>: bench.targets.SampleRecord is deprecated: use `from bench import SampleRecord`",
        "<string>: bench.targets.DROPPED_OUTCOMES is deprecated: use `from bench import DROPPED_OUTCOMES`",
    ]


def test_an_old_path_loaded_by_name_warns_at_the_line_that_asked() -> None:
    """Plug-in loaders and `--target old.path:attr` import by name: the warning names their line, not importlib's
    (Python's default filters would hide a warning attributed to importlib)."""
    script = "import importlib, warnings\nwarnings.simplefilter('always')\nimportlib.import_module('bench.runner')\n"
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True, cwd=ROOT)
    assert run.stderr.startswith("<string>:3: DeprecationWarning: bench.runner is deprecated: it moved to "
                                 "bench.orchestration.runner"), run.stderr


def test_running_an_old_path_as_a_script_says_where_it_went() -> None:
    run = subprocess.run([sys.executable, "-m", "bench.runner"], capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 1 and "bench.runner moved to bench.orchestration.runner: run that instead" in run.stderr


def test_the_pytest_plugin_entry_point_loads_the_plugin() -> None:
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "rollout_bench"]
    assert entry.value == "bench.testing.pytest_plugin"
    plugin = entry.load()
    assert callable(plugin.bench_run) and plugin is importlib.import_module("bench.testing.pytest_plugin")


def test_the_readme_layout_names_every_folder_of_the_package() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    layout = readme.split("\n## Layout\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"^\s*([\w<>]+/)", layout, flags=re.M))
    folders = {f"{path.name}/" for path in PACKAGE.iterdir() if (path / "__init__.py").exists()}
    folders |= {f"{path.name}/" for path in (PACKAGE / "targets").iterdir() if (path / "__init__.py").exists()}
    assert folders - named == set()  # every package folder is in the layout
    listed = {name for name in named if name not in {"<name>/"}}
    tree = folders | {f"{path.name}/" for path in ROOT.iterdir() if path.is_dir()}
    assert listed - tree == set()  # and the layout names no folder that is not there
    folders_of = {path.name.replace("_", "-"): path.name for path in (PACKAGE / "targets" / "frameworks").iterdir()
                  if path.is_dir() and not path.name.startswith("__")}  # a module's `_` is a target name's `-`
    frameworks = set(folders_of)
    assert frameworks == {name for name in REGISTRY if not name.startswith("ref-")}  # each a built-in target
    assert all(f"`{name}`" in readme for name in frameworks)  # and documented
    for name in frameworks:
        folder = PACKAGE / "targets" / "frameworks" / folders_of[name]
        own_environment = TARGET_ENVS[name][0] == name  # slime-retool runs in slime's
        required = {"__init__.py", "target.py"} | ({"env.txt", "env.lock"} if own_environment else set())
        assert required <= {path.name for path in folder.iterdir()}


PLUGIN = '''
"""A user's plug-in target, in a top-level module, written against the public API only."""
from __future__ import annotations

import aiohttp

from bench import TRAJECTORY_HEADER, Emit, ErrorInfo, RolloutJob, SampleRecord


class Sound:
    name = "my-rollout-plugin:sound"
    fail_fast = False

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        async with aiohttp.ClientSession() as http:
            for spec in job.trajectories:
                body = {"input_ids": list(spec.prompt_ids), "sampling_params": dict(spec.sampling_params),
                        "return_logprob": True}
                async with http.post(f"{job.base_url}/generate", json=body,
                                     headers={TRAJECTORY_HEADER: spec.id}) as reply:
                    if reply.status != 200:
                        emit(SampleRecord(spec.id, spec.group, "failed", prompt_length=len(spec.prompt_ids),
                                          error=ErrorInfo(f"HTTP {reply.status}", await reply.text(), "")))
                        continue
                    answer = await reply.json()
                triples = answer["meta_info"]["output_token_logprobs"]
                ids = [t[1] for t in triples]
                emit(SampleRecord(spec.id, spec.group, "completed", prompt_length=len(spec.prompt_ids),
                                  response_ids=ids, logprobs=[t[0] for t in triples], loss_mask=[1] * len(ids),
                                  response_length=len(ids), reward=1.0))


class Buggy(Sound):
    name = "my-rollout-plugin:buggy"

    async def run(self, job: RolloutJob, emit: Emit) -> None:
        doomed = job.trajectories[3].id

        def scored(record: SampleRecord) -> None:
            if record.trajectory == doomed:
                raise KeyError("reward_breakdown")
            emit(record)

        await super().run(job, scored)
'''


@pytest.mark.parametrize("variant", ["Sound", "Buggy"])
def test_a_plug_in_in_a_top_level_module_runs_from_its_folder(tmp_path: Path, variant: str) -> None:
    (tmp_path / "my_rollout_plugin.py").write_text(PLUGIN, encoding="utf-8")
    run = subprocess.run([sys.executable, "-m", "bench", "run", "--target", f"my_rollout_plugin:{variant}",
                          "--trace", "rlvr-500", "--n", "8", "--fault", "latency:ms=1,p=1", "--repro-reruns", "0",
                          "--out", str(tmp_path / "out")], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["target"] == f"my-rollout-plugin:{variant.lower()}"
    if variant == "Sound":
        assert run.returncode == 0, run.stdout + run.stderr
        assert summary["violations"] == [] and summary["provenance"]["match"] == 8
    else:
        assert run.returncode == 1, run.stdout + run.stderr
        assert "batch_survival   g00000-3: the batch crashed" in run.stdout
        assert f'{tmp_path / "my_rollout_plugin.py"}", line 41, in scored' in run.stdout
