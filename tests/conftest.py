"""Test set-up: the JAX compilation cache in the repository, headless matplotlib, per-test keys."""

import os
import pathlib
import zlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("BAYES_ZOO_JAX_CACHE", str(ROOT / ".jax_cache"))
os.environ.setdefault("MPLBACKEND", "Agg")
# Every program goes to the persistent cache, however fast it compiled: the suite releases programs when memory
# runs high (``_release_compiled_programs``) and the notebooks run in kernels of their own (which inherit this),
# and both meet many of the same programs again.
os.environ.setdefault("BAYES_ZOO_JAX_CACHE_MIN_SECONDS", "0")
# The suite is compile-bound (tiny data, hundreds of distinct programs): XLA's backend optimisation level 0
# compiles about 40 % faster (test_log_q.py, cold cache: 349 -> 202 CPU-seconds), and programs of this size
# run fast enough unoptimised. Semantics are unchanged (only the last bits of reductions may differ, which no
# test may depend on). ``make test-all`` sets BAYES_ZOO_TEST_XLA_OPT=full for the heavy statistical runs;
# users, the demo and the benchmarks always get XLA's default optimisation. Set before JAX starts a backend,
# and inherited by the notebook kernels that tests/test_notebooks.py starts (but for the run-bound notebooks of
# tests/notebook_runs.py, ``OPTIMISED``).
if os.environ.get("BAYES_ZOO_TEST_XLA_OPT", "fast-compile") == "fast-compile" \
        and "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

from zoo import _runtime  # noqa: E402,F401  (JAX set-up: float64, 2 host devices, numpyro before arviz)

# isort: split
import pytest  # noqa: E402


@pytest.fixture
def seed(request) -> int:
    """A seed derived from the test's id: fixed run to run, different between tests."""
    return zlib.crc32(request.node.nodeid.encode()) % (2**31)


RSS_LIMIT_BYTES = 6 * 2**30
# Every compiled XLA:CPU executable holds memory maps of its own; a process that reaches Linux's default
# vm.max_map_count (65530) has its mmaps fail. Programs are released well before that.
MAP_LIMIT = 30_000


def resident_bytes() -> int | None:
    """This process's resident memory (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def memory_maps() -> int | None:
    """How many memory maps this process holds (Linux ``/proc``; None elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            return sum(1 for _ in f)
    except OSError:
        return None


def release_compiled_programs() -> None:
    """Drop the compiled programs of the registry (``inference.programs.clear``: the loop's chunks, the NUTS and
    SVI programs, the log densities, the kernels) and every program JAX holds (``jax.clear_caches``)."""
    import gc

    import jax

    from inference import programs

    programs.clear()
    gc.collect()
    jax.clear_caches()
    gc.collect()


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """After a test module, release every compiled program (``release_compiled_programs``) only once the process
    holds more than ``RSS_LIMIT_BYTES`` or ``MAP_LIMIT`` memory maps; until then programs stay alive across
    modules, so a module that fits a model the same way as an earlier one (same model, options and data
    shapes) does not compile it again. Measured on the 2-core CI box: 2374 s for the suite releasing after every
    module, 2047 s and 2326 s keeping programs (within the box's run-to-run spread; benchmarks/results.md,
    "test_suite").

    Why a bound at all: a full ``make test`` that kept everything alive segfaulted in XLA's CPU compiler
    (``backend_compile_and_load``) two hundred tests in, at several GB resident (each module alone passes); the
    cause was not pinned down, so both resident memory and memory maps (vm.max_map_count) are bounded. After a
    release, programs come back from the persistent compilation cache (every program is written to it in tests,
    see the top of this file) at the cost of tracing and lowering only."""
    yield
    rss, maps = resident_bytes(), memory_maps()
    if rss is None or maps is None or rss > RSS_LIMIT_BYTES or maps > MAP_LIMIT:
        release_compiled_programs()


# Under pytest-xdist (``make test``: ``-n 2 --dist loadfile``) each test module runs whole in one worker, and the
# workers take modules in collection order. These modules take longest (benchmarks/results.md, "test_suite"), so
# they are collected first: the last module a worker takes is a short one (longest-processing-time order).
LONGEST_MODULES = ("test_contract.py", "test_notebooks.py", "test_docs.py", "test_log_q.py",
                   "test_hostile_input.py", "test_diagnostics_references.py", "test_hlcr_gibbs.py", "test_ssgp_vb.py",
                   "test_nuts_reformulations.py", "test_hlcr_gibbs_blocked.py", "test_fedhlcr.py",
                   "test_real_data.py")


def pytest_collection_modifyitems(session, config, items):
    """In an xdist worker, the modules of ``LONGEST_MODULES`` first (in that order), the rest as collected; the
    tests of a module keep their order. Every worker sorts alike, so their collections stay identical."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    rank = {name: i for i, name in enumerate(LONGEST_MODULES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


_SESSION_WATCH = None
_WATCH_RUNNING = False
# Per-worker figures that the xdist workers hand to the controller (``pytest_testnodedown``).
_WORKER_REPORTS: dict[str, dict] = {}


def _cpu_seconds(children: bool = True) -> float:
    """User + system CPU seconds of this process and (``children``) of its waited-for children (notebook kernels,
    spawned demo workers)."""
    import resource

    used = [resource.getrusage(resource.RUSAGE_SELF)]
    if children:
        used.append(resource.getrusage(resource.RUSAGE_CHILDREN))
    return sum(u.ru_utime + u.ru_stime for u in used)


def _figures() -> dict:
    """This process's JAX compile figures and CPU seconds since the session began."""
    import resource

    watch = _SESSION_WATCH
    return {"wall": watch.wall_seconds, "compile": watch.compile_seconds, "spans": watch.compile_events,
            "xla": len(watch.xla_compiles), "cpu": _cpu_seconds(),
            "max_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20}


def pytest_sessionstart(session):
    """Time JAX's tracing, lowering and XLA compilation over the whole run (``inference._timing.Stopwatch``), so
    the summary can say how much of the suite is compilation."""
    global _SESSION_WATCH, _WATCH_RUNNING
    from inference._timing import Stopwatch

    _SESSION_WATCH, _WATCH_RUNNING = Stopwatch().__enter__(), True


def _stop_watch() -> None:
    global _WATCH_RUNNING
    if _WATCH_RUNNING:
        _SESSION_WATCH.__exit__(None, None, None)
        _WATCH_RUNNING = False


def pytest_sessionfinish(session):
    """An xdist worker hands its figures to the controller, which prints them in its summary."""
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None and _SESSION_WATCH is not None:
        _stop_watch()
        workeroutput["bayes_zoo_figures"] = _figures()


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    """xdist: keep a finished worker's figures (``pytest_sessionfinish`` above) for the summary."""
    figures = getattr(node, "workeroutput", {}).get("bayes_zoo_figures")
    if figures is not None:
        _WORKER_REPORTS[node.gateway.id] = figures


def pytest_terminal_summary(terminalreporter):
    if _SESSION_WATCH is None:
        return
    _stop_watch()
    flags = f"(XLA_FLAGS={os.environ.get('XLA_FLAGS', '')!r})"
    if not _WORKER_REPORTS:
        f = _figures()
        terminalreporter.write_line(
            f"JAX tracing + lowering + XLA compilation: {f['compile']:.0f} s of {f['wall']:.0f} s wall "
            f"({100 * f['compile'] / max(f['wall'], 1e-9):.0f} %), {f['spans']} spans, {f['xla']} XLA programs; "
            f"{f['cpu']:.0f} CPU-seconds, peak resident {f['max_rss_gib']:.1f} GiB {flags}")
        return
    wall = _SESSION_WATCH.wall_seconds
    total = {k: sum(r[k] for r in _WORKER_REPORTS.values()) for k in ("compile", "spans", "xla", "cpu")}
    terminalreporter.write_line(
        f"JAX tracing + lowering + XLA compilation over {len(_WORKER_REPORTS)} workers: {total['compile']:.0f} s "
        f"(worker-seconds) in {wall:.0f} s wall, {total['spans']} spans, {total['xla']} XLA programs; "
        f"{total['cpu']:.0f} CPU-seconds, and {_cpu_seconds(children=False):.0f} in the controller {flags}")
    for name, r in sorted(_WORKER_REPORTS.items()):
        terminalreporter.write_line(
            f"  {name}: {r['wall']:.0f} s wall, {r['compile']:.0f} s compiling, {r['spans']} spans, {r['xla']} XLA "
            f"programs, {r['cpu']:.0f} CPU-seconds, peak resident {r['max_rss_gib']:.1f} GiB")
