"""One entry point for everything: lint, tests per engine, rust, integration, bench, docs, build, demo.

    nox -s ci        # what CI runs: lint + every test session + integration
    nox -s demo      # the README demo
    nox -l           # every session

uv is the venv backend when present; torch comes from uv's cache, so a new environment links
it instead of downloading ~3 GB again. Environments are reused between runs.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import sys
import threading

import nox

ROOT = pathlib.Path(__file__).parent
nox.options.default_venv_backend = "uv|virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["ci"]

PYTHON = "3.11"
# Python writes no bytecode cache while PYTHONDONTWRITEBYTECODE is set (some machines set it for
# every shell), and uv links packages without one: every process the sessions start (pytest, its
# xdist workers, the many subprocess tests) then compiles torch's sources again. Measured on a
# 2-core EPYC VM: `import torch` + a first `torch.compile` 10.4-13.7 s in a fresh process without
# the cache, 5.1 s with it. Unset for everything nox runs, each environment compiles once.
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
CORE = "packages/tb-core"
# Paths held to ruff (check + format); a package joins once it is clean.
LINTED = [
    "packages",
    "examples",
    "scripts",
    "noxfile.py",
    "integration_tests",
    "benchmarks",
]
# mypy (strict, root pyproject settings) over every package's Python sources.
TYPED = [
    f"{CORE}/src/torchburn",
    "packages/tb-cpu-rust/python/tb_cpu_rust",
    "packages/tb-cython-dispatch/src/tb_cython_dispatch",
    "packages/tb-cython-dispatch/src/turbo_torch",
    "packages/tb-wgpu/src/tb_wgpu",
    "packages/tb-llm/src/tb_llm",
    "examples/tb-example-engine/src/tb_example_engine",
]
# Every pytest run loads scripts/pytest_skip_policy.py: a skip other than for a missing GPU adapter
# or CUDA fails the run; each run's counts land here and `ci` prints the total.
SKIP_REPORTS = ROOT / ".nox" / "skip-reports"
# expecttest: imported by torch.testing._internal, where the OpInfo database lives
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100", "pytest-timeout", "expecttest", "pytest-xdist>=3.5"]
# One pytest worker per core (the CI machine has two) for every suite: the tests are independent
# (temporary folders, free ports, a download fixture safe against concurrent fetchers), and much of
# a suite's time is subprocesses and servers waiting, which a second worker overlaps. Measured on a
# 2-core EPYC VM (serial -> -n 2): integration 280 -> 194 s, wgpu 105 -> 45 s, tb-llm 145 -> 112 s,
# cython_dispatch 58 -> 42 s, example 41 -> 28 s.
WORKERS = ["-n", "2"]

# engine name -> (package folder, extra pip args). Only packages that exist take part.
ENGINE_PACKAGES: dict[str, str] = {
    "example": "examples/tb-example-engine",
    "native_cpu": "packages/tb-cpu-rust",
    "cython_dispatch": "packages/tb-cython-dispatch",
    "wgpu": "packages/tb-wgpu",
    "llm": "packages/tb-llm",
}
# Optional extras a package's tests need (tb-llm's server tests use starlette, uvicorn, openai).
TEST_EXTRAS: dict[str, str] = {"llm": "[serve,test]"}
ENGINES = ["core"] + [name for name, path in ENGINE_PACKAGES.items() if (ROOT / path / "pyproject.toml").exists()]


def _install_core(session: nox.Session, *extra: str) -> None:
    session.install(*TEST_TOOLS, "transformers>=4.40", "numpy")
    session.install("-e", CORE, *extra)


# Packages with a compiled extension: built once per CI run into dist/ (by `build`, which `ci` runs
# first) and installed from that wheel into every environment that needs them, never compiled per
# session. Run alone, a session builds the wheel it lacks (or whose sources are newer) itself.
COMPILED = {"packages/tb-cpu-rust", "packages/tb-cython-dispatch"}


def _install_package(session: nox.Session, path: str) -> None:
    if path in COMPILED:
        session.install(_compiled_wheel(session, path))
    else:
        session.install("-e", path)


def _compiled_wheel(session: nox.Session, path: str) -> str:
    name = pathlib.Path(path).name.replace("-", "_")
    found = sorted((ROOT / "dist").glob(f"{name}-*.whl"))
    if len(found) == 1 and not _newer_sources(path, found[0]):
        return str(found[0])
    for old in found:
        old.unlink()
    if (ROOT / path / "Cargo.toml").exists():
        # release profile (fat LTO): the tests measure nothing, but debug Rust kernels are 10-50x slower
        session.install("maturin>=1.5")
        session.run("maturin", "build", "--release", "-m", f"{path}/Cargo.toml", "-o", str(ROOT / "dist"))
    else:
        session.run("uv", "build", "--wheel", "--out-dir", str(ROOT / "dist"), path, external=True)
    (wheel,) = (ROOT / "dist").glob(f"{name}-*.whl")
    return str(wheel)


def _pytest(session: nox.Session, *args: str) -> None:
    """pytest with the skip policy plugin (scripts/pytest_skip_policy.py)."""
    env = {"PYTHONPATH": str(ROOT / "scripts"), "TB_SKIP_REPORT_DIR": str(SKIP_REPORTS)}
    session.run("pytest", "-p", "pytest_skip_policy", *args, env=env)


@nox.session(python=PYTHON)
@nox.parametrize("engine", ENGINES)
def tests(session: nox.Session, engine: str) -> None:
    """Each engine in its own environment with only tb-core + that engine installed."""
    _install_core(session)
    args = session.posargs or []
    if engine == "core":
        _pytest(session, *WORKERS, f"{CORE}/tests", *args)
        return
    path = ENGINE_PACKAGES[engine]
    _install_package(session, path)
    if engine in TEST_EXTRAS:
        session.install("-e", f"{path}{TEST_EXTRAS[engine]}")
    _pytest(session, *WORKERS, f"{path}/tests", *args)
    if engine == "native_cpu":
        # the stub of the extension module matches what the built module exports
        session.install("mypy>=1.10")
        allow = ROOT / path / "stubtest-allowlist.txt"
        session.run(
            "python",
            "-m",
            "mypy.stubtest",
            "tb_cpu_rust._native",
            *(["--allowlist", str(allow)] if allow.exists() else []),
        )


@nox.session(python=PYTHON)
def lint(session: nox.Session) -> None:
    # uvicorn / starlette: tb-llm's server subclasses uvicorn.Server, which strict mypy must see typed
    session.install(
        "ruff>=0.6", "mypy>=1.10", "pytest>=8", "transformers>=4.40", "uvicorn>=0.30", "starlette>=0.37", "-e", CORE
    )
    session.run("ruff", "check", *LINTED)
    session.run("ruff", "format", "--check", *LINTED)
    session.run("mypy", *TYPED)
    session.run("python", "scripts/generate_op_catalog.py", "--check")
    session.run("python", "scripts/generate_docs.py", "--check", "--only", "environment.md")


@nox.session(python=False)
def rust(session: nox.Session) -> None:
    """cargo test + clippy for tb-cpu-rust."""
    if not RUST_MANIFEST.exists():
        session.skip("packages/tb-cpu-rust does not exist yet")
    # Under `ci`, `build` compiled both already (RUST_CHECKS): these runs find them done.
    for args, tail in RUST_CHECKS:
        session.run("cargo", *args, "--manifest-path", str(RUST_MANIFEST), *tail, env=_rust_check_env(), external=True)


# The Rust checks of `rust` (their own target folder, so they never wait on another cargo's lock).
RUST_MANIFEST = ROOT / "packages/tb-cpu-rust/Cargo.toml"
RUST_CHECK_TARGET = ROOT / "target" / "ci-checks"
# (cargo arguments, arguments after the manifest); ci-test: the release profile without fat LTO
# (Cargo.toml): optimised kernels, a fraction of the link time.
RUST_CHECKS = [(["test", "--profile", "ci-test"], []), (["clippy", "--release"], ["--", "-D", "warnings"])]


def _rust_check_env() -> dict[str, str]:
    """The same for `build`'s background compile and `rust` (no venv of its own): pyo3's build
    script reruns, and pyo3 recompiles, when the interpreter it configures for changes (another
    session's venv did: 1 min 48 s of compiling again)."""
    return {"CARGO_TARGET_DIR": str(RUST_CHECK_TARGET), "PYO3_PYTHON": sys.executable}


def _compile_rust_checks_meanwhile() -> threading.Thread | None:
    """Under `ci`: compile the Rust tests and clippy's check in the background while `build` runs
    maturin. The wheel's fat-LTO, one-codegen-unit build keeps one core busy and leaves the other
    idle for most of its ~2 minutes (2-core EPYC VM: 119 s wall, 141 s CPU); the test build takes
    about as long. `rust` later runs the same commands and finds them compiled (a failure shows there)."""
    cargo = shutil.which("cargo")
    if os.environ.get("TB_CI") != "1" or cargo is None or not RUST_MANIFEST.exists():
        return None
    log = ROOT / "target" / "ci-checks.log"
    log.parent.mkdir(parents=True, exist_ok=True)

    def compile_all() -> None:
        env = {**os.environ, **_rust_check_env()}
        with open(log, "w") as out:
            for args, tail in RUST_CHECKS:
                extra = ["--no-run"] if args[0] == "test" else tail
                command = [cargo, *args, "--manifest-path", str(RUST_MANIFEST), *extra]
                subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, env=env, check=False)

    thread = threading.Thread(target=compile_all, name="rust-checks", daemon=True)
    thread.start()
    return thread


def _install_everything(session: nox.Session) -> None:
    """tb-core and every published package (not the example engine: it is a template, tested alone)."""
    _install_core(session)
    for engine in ENGINES[1:]:
        if engine == "example":
            continue
        _install_package(session, ENGINE_PACKAGES[engine])
        if engine in TEST_EXTRAS:
            session.install("-e", f"{ENGINE_PACKAGES[engine]}{TEST_EXTRAS[engine]}")


@nox.session(python=PYTHON)
def integration(session: nox.Session) -> None:
    """Every installed engine together, on the model set."""
    _install_everything(session)
    session.run("python", "scripts/generate_docs.py", "--check")
    # Every test that needs two packages together lives in this folder (collected whole, by folder).
    _pytest(session, *WORKERS, "integration_tests", *session.posargs)


@nox.session(python=PYTHON)
def bench(session: nox.Session) -> None:
    """Benchmarks: same-run interleaved ratios against eager and inductor; writes docs/benchmarks.md."""
    _install_everything(session)
    # gguf writes the llama.cpp side of the LLM comparison; cmake builds llama.cpp (once, cached).
    session.install("matplotlib", "gguf", "cmake")
    session.run("python", "-m", "benchmarks", *session.posargs)


@nox.session(python=PYTHON)
def docs(session: nox.Session) -> None:
    """Build the site with MkDocs, strict: any warning (a broken link, a missing page) fails.

    Needs only mkdocs, not the packages: the generated pages are checked against a fresh generation
    by `integration` (every package installed) and rewritten by `nox -s generate_docs`.
    """
    session.install("mkdocs>=1.6")
    session.run("mkdocs", "build", "--strict", "--site-dir", str(ROOT / "build" / "site"))


@nox.session(python=PYTHON)
def generate_docs(session: nox.Session) -> None:
    """Rewrite the generated pages (environment variables, op coverage) with every package installed."""
    _install_everything(session)
    session.run("python", "scripts/generate_docs.py")


# check-wheel-contents checks a wheel may skip, per wheel, each with its reason.
WHEEL_CHECK_IGNORES = {
    # W009 "multiple top-level library entries": tb-cython-dispatch ships tb_cython_dispatch and the
    # drop-in `import turbo_torch as torch` by design (DESIGN.md, CONVENTIONS.md "Names").
    "tb_cython_dispatch": "W009",
}


def _packages() -> list[str]:
    """Every published package folder (and the example engine) that exists, tb-core first."""
    return [CORE, *[ENGINE_PACKAGES[e] for e in ENGINES[1:]]]


@nox.session(python=PYTHON)
def build(session: nox.Session) -> None:
    """Wheel + sdist of every package into dist/, checked with twine and check-wheel-contents."""
    session.install("build", "twine", "check-wheel-contents", "maturin>=1.5")
    rust_checks = _compile_rust_checks_meanwhile()
    dist = ROOT / "dist"
    shutil.rmtree(dist, ignore_errors=True)
    for path in _packages():
        if (ROOT / path / "Cargo.toml").exists():
            # maturin builds the abi3 wheel from the sdist it just made: a fresh release build (~1.5 min).
            session.run("maturin", "build", "--release", "--sdist", "-m", f"{path}/Cargo.toml", "-o", str(dist))
        else:
            # sdist first, then the wheel built from that sdist: proves the sdist is complete.
            session.run("python", "-m", "build", "--installer", "uv", "--outdir", str(dist), path)
    session.run("twine", "check", "--strict", *sorted(str(p) for p in dist.iterdir()))
    for wheel in sorted(dist.glob("*.whl")):
        ignore = WHEEL_CHECK_IGNORES.get(wheel.name.split("-")[0])
        session.run("check-wheel-contents", *(["--ignore", ignore] if ignore else []), str(wheel))
    if rust_checks is not None:
        session.log("waiting for the Rust tests' and clippy's background compile")
        rust_checks.join()


# À la carte: which wheels of dist/ each fresh environment gets, and the plugins it must then load.
ALACARTE: dict[str, tuple[list[str], list[str]]] = {
    "core": (["tb_core"], []),
    "core+cpu-rust": (["tb_core", "tb_cpu_rust"], ["native_cpu"]),
    "core+cython-dispatch": (["tb_core", "tb_cython_dispatch"], ["cython_dispatch"]),
    "core+wgpu": (["tb_core", "tb_wgpu"], ["wgpu"]),
    "core+llm": (["tb_core", "tb_llm"], ["llm"]),
    "all": (
        ["tb_core", "tb_cpu_rust", "tb_cython_dispatch", "tb_wgpu", "tb_llm"],
        ["native_cpu", "cython_dispatch", "wgpu", "llm"],
    ),
}


SOURCE_SUFFIXES = {".py", ".pyi", ".pyx", ".rs", ".wgsl", ".toml", ".txt"}


def _newer_sources(path: str, wheel: pathlib.Path) -> list[pathlib.Path]:
    """Source files of the package at `path` changed after `wheel` was built."""
    package = ROOT / path
    sources = [
        f
        for part in ("src", "python", "pyproject.toml", "Cargo.toml", "Cargo.lock", "CMakeLists.txt")
        for f in ([package / part] if (package / part).is_file() else (package / part).rglob("*"))
        if f.suffix in SOURCE_SUFFIXES or f.name == "Cargo.lock"
    ]
    return [f for f in sources if f.stat().st_mtime > wheel.stat().st_mtime]


def _wheel(session: nox.Session, name: str) -> str:
    """The wheel of dist/ for `name`, with a warning when a source file of its package is newer."""
    found = sorted((ROOT / "dist").glob(f"{name}-*.whl"))
    if len(found) != 1:
        raise FileNotFoundError(f"expected one {name} wheel in dist/, found {found}: run `nox -s build` first")
    newer = _newer_sources(f"packages/{name.replace('_', '-')}", found[0])
    if newer:
        session.warn(f"STALE: {found[0].name} is older than {newer[0].relative_to(ROOT)}: run `nox -s build` first")
    return str(found[0])


def _fresh_venv(session: nox.Session, name: str) -> pathlib.Path:
    venv = ROOT / ".nox" / "alacarte-envs" / name
    shutil.rmtree(venv, ignore_errors=True)
    session.run("uv", "venv", "--quiet", "--python", PYTHON, str(venv), external=True)
    return venv


def _uv_install(session: nox.Session, venv: pathlib.Path, *args: str) -> None:
    # uv links torch from its cache (hard links on the same file system): no download per venv.
    session.run("uv", "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *args, external=True)


@nox.session(python=False)
def alacarte(session: nox.Session) -> None:
    """Each à la carte combination from the wheels in dist/ in a fresh venv: doctor + smoke test.

    Then the plugin API check: a plugin built for another PLUGIN_API_VERSION, installed next to the
    tb-core wheel, is refused with a message naming the versions. `nox -s alacarte -- core+wgpu`
    runs only the named combinations.
    """
    wanted = session.posargs or [*ALACARTE, "plugin-api"]
    smoke = str(ROOT / "scripts" / "smoke_install.py")
    for name in wanted:
        if name == "plugin-api":
            continue
        wheels, plugins = ALACARTE[name]
        venv = _fresh_venv(session, name)
        # transformers only builds the tiny checkpoint and the reference tokens of the LLM smoke test.
        # (tb_llm.testing passes dtype= to transformers, which needs 4.56).
        extra = ["transformers>=4.56"] if "llm" in plugins else []
        _uv_install(session, venv, *[_wheel(session, w) for w in wheels], *extra)
        session.run(str(venv / "bin" / "torchburn"), "doctor", external=True)
        session.run(str(venv / "bin" / "python"), smoke, "--expect", ",".join(plugins), external=True)
    if "plugin-api" in wanted:
        venv = _fresh_venv(session, "plugin-api")
        _uv_install(session, venv, _wheel(session, "tb_core"))
        project = venv / "tb-future-engine"
        session.run(str(venv / "bin" / "python"), str(ROOT / "scripts" / "make_incompatible_plugin.py"), str(project))
        _uv_install(session, venv, str(project))
        session.run(
            str(venv / "bin" / "python"), smoke, "--expect-incompatible", "future_module,future_engine", external=True
        )


PUBLISHED = ["tb_core", "tb_cpu_rust", "tb_cython_dispatch", "tb_wgpu", "tb_llm"]


def _declared(path: str) -> list[str]:
    """A package's declared requirements (dependencies + the `test` extra), tb-* packages left out."""
    import tomllib  # Python 3.11+; only this session needs it

    project = tomllib.loads((ROOT / path / "pyproject.toml").read_text())["project"]
    found = [*project.get("dependencies", []), *project.get("optional-dependencies", {}).get("test", [])]
    return [r for r in found if not r.replace("_", "-").lower().startswith("tb-")]


# A fresh environment each run: left-over newer versions would satisfy the bounds and hide them.
@nox.session(python=PYTHON, venv_backend="uv", reuse_venv=False)
def minimums(session: nox.Session) -> None:
    """The lowest declared version of every dependency of every package, then tb-core's tests.

    The requirements each pyproject declares are passed as direct requirements with
    `--resolution lowest-direct` (so `torch>=2.5` installs torch 2.5.0), next to the wheels of dist/
    (`nox -s build` first). A failure means a lower bound is wrong: raise it in that pyproject.
    `nox -s minimums -- packages/tb-llm/tests` runs other tests instead.
    """
    declared = sorted({r for path in _packages() if path != "examples/tb-example-engine" for r in _declared(path)})
    session.install("--resolution", "lowest-direct", *declared, *[_wheel(session, name) for name in PUBLISHED])
    # Not a declared dependency: the root pytest configuration (timeout = ...) needs the plugin.
    session.install("pytest-timeout")
    session.run("uv", "pip", "list", external=True, env={"VIRTUAL_ENV": session.virtualenv.location})
    _pytest(session, *(session.posargs or [f"{CORE}/tests"]))
    # Every package at its lowest: the engines load and match eager, tb-llm generates.
    session.run("python", "scripts/smoke_install.py", "--expect", "native_cpu,cython_dispatch,wgpu,llm")


@nox.session(python=PYTHON)
def demo(session: nox.Session) -> None:
    """Compile the README model with every installed engine; check it against eager; print speed and coverage."""
    _install_everything(session)
    session.run("torchburn", "demo", *session.posargs)


@nox.session(python=False)
def ci(session: nox.Session) -> None:
    """Everything CI checks, in order; stops at the first failure.

    `build` comes first: it compiles tb-cpu-rust and tb-cython-dispatch once (wheels + sdists in
    dist/), and every later session installs those wheels instead of compiling again.
    """
    shutil.rmtree(SKIP_REPORTS, ignore_errors=True)
    os.environ["TB_CI"] = "1"  # `build` compiles the Rust checks meanwhile (_compile_rust_checks_meanwhile)
    session.notify("build")
    session.notify("lint")
    for engine in ENGINES:
        session.notify(f"tests(engine='{engine}')")
    session.notify("rust")
    session.notify("integration")
    session.notify("docs")
    session.notify("alacarte")
    # `minimums` stays out: its first run downloads torch 2.5 (~2.5 GB) and it re-runs tb-core's tests.
    session.notify("skip_report")


@nox.session(python=False)
def skip_report(session: nox.Session) -> None:
    """The total over every pytest run since `ci` started: skips for a missing GPU adapter / CUDA, and others."""
    import json

    runs = [json.loads(p.read_text()) for p in sorted(SKIP_REPORTS.glob("*.json"))]
    allowed, other = sum(r["allowed"] for r in runs), sum(r["other"] for r in runs)
    session.log(
        f"skip policy, {len(runs)} pytest runs: {allowed} tests skipped for a missing GPU adapter / CUDA, "
        f"{other} skipped for any other reason"
    )
    if other:
        session.error(f"{other} tests skipped for a reason other than a missing GPU adapter / CUDA")
