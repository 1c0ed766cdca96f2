"""Where a pytest run's compile time goes: a pytest plugin that records every JAX tracing, lowering and XLA
compilation span with the test that caused it and the function's name, and writes them to a JSON file.

    python -m pytest -p benchmarks.compile_profile tests/test_contract.py   # writes compile_profile.json
    python -m benchmarks.compile_profile compile_profile.json               # summary: per event, function, test

``BAYES_ZOO_COMPILE_PROFILE`` names the output file (default ``compile_profile.json``). The summary separates
the many small programs (eager operations, under 0.1 s each, compiled once per primitive and shape) from the
large ones (a sampler's loop, an SVI step chunk), since the two call for different fixes. It also counts the
persistent compilation cache's hits and misses (``jax.monitoring`` events).
"""

from __future__ import annotations

import collections
import json
import os
import sys

OUT_ENV = "BAYES_ZOO_COMPILE_PROFILE"
SMALL_SECONDS = 0.1
_records: list[tuple[str | None, str, str, float]] = []
_events: collections.Counter = collections.Counter()
_current: dict[str, str | None] = {"test": None}


def _span(event: str, start: float, end: float, **kwargs) -> None:
    if event.startswith("/jax/core/compile/"):
        _records.append((_current["test"], event.rsplit("/", 1)[1], str(kwargs.get("fun_name", "?")), end - start))


def _event(event: str, **_) -> None:
    if event.startswith("/jax/compilation_cache/"):
        _events[event.rsplit("/", 1)[1]] += 1


def pytest_configure(config):
    import jax

    jax.monitoring.register_event_time_span_listener(_span)
    jax.monitoring.register_event_listener(_event)


def pytest_runtest_setup(item):
    _current["test"] = item.nodeid


def pytest_sessionfinish(session):
    with open(os.environ.get(OUT_ENV, "compile_profile.json"), "w") as f:
        json.dump({"records": _records, "cache_events": _events}, f)


def summarise(path: str, top: int = 25) -> str:
    """A text summary of a profile written by the plugin."""
    with open(path) as f:
        profile = json.load(f)
    records = profile["records"]
    by_event, by_function, by_test, counts = (collections.Counter() for _ in range(4))
    small = 0.0
    for test, event, function, seconds in records:
        by_event[event] += seconds
        by_function[event, function] += seconds
        counts[event, function] += 1
        by_test[test] += seconds
        if event == "backend_compile_duration" and seconds < SMALL_SECONDS:
            small += seconds
    lines = [f"{len(records)} spans, {sum(by_event.values()):.1f} s; persistent cache: {dict(profile['cache_events'])}"]
    lines += [f"  {event}: {seconds:.1f} s" for event, seconds in by_event.most_common()]
    lines.append(f"  of which XLA compiles under {SMALL_SECONDS} s each (eager operations): {small:.1f} s")
    lines.append(f"top {top} (event, function): seconds, spans")
    lines += [f"  {s:7.1f} {counts[k]:5d}  {k[0].removesuffix('_duration')}  {k[1]}"
              for k, s in by_function.most_common(top)]
    lines.append(f"top {top} tests: seconds")
    lines += [f"  {s:7.1f}  {t}" for t, s in by_test.most_common(top)]
    return "\n".join(lines)


if __name__ == "__main__":
    print(summarise(sys.argv[1] if len(sys.argv) > 1 else "compile_profile.json"))
