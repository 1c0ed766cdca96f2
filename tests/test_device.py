"""Platform selection (issue 18 part 4): ``zoo.set_device``, ``inference.fit(device=)``, ``$BAYES_ZOO_DEVICE``,
``zoo --device``, and NUTS's chain method per platform. CI has no GPU: the selection logic is tested on the CPU,
with JAX's device list replaced (monkeypatch) or in fresh processes with the environment variables set."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from typer.testing import CliRunner

import inference
import zoo
from inference import nuts
from inference._timing import Stopwatch
from zoo import _runtime
from zoo_cli import app

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("num_chains,platform,devices,expected", [
    (2, "cpu", 2, "parallel"),      # the default: one chain per host device
    (4, "cpu", 2, "sequential"),    # more chains than CPU devices: one after the other
    (2, "cpu", 1, "sequential"),
    (2, "gpu", 1, "vectorized"),    # one GPU: every chain in one program
    (64, "gpu", 1, "vectorized"),
    (4, "gpu", 2, "vectorized"),    # fewer GPUs than chains
    (2, "gpu", 2, "parallel"),      # a GPU per chain
    (4, "tpu", 1, "vectorized"),
    (1, "gpu", 1, "parallel"),      # one chain: NumPyro ignores the method
])
def test_nuts_chain_method_is_parallel_with_a_device_per_chain_else_vectorized_on_accelerators(
        num_chains, platform, devices, expected):
    assert nuts.chain_method(num_chains, platform, devices) == expected


def fake_accelerator(monkeypatch, platform="gpu", count=1):
    """This process seen as running on ``count`` devices of ``platform`` (JAX's answers replaced)."""
    monkeypatch.setattr(jax, "default_backend", lambda: platform)
    monkeypatch.setattr(jax, "local_device_count", lambda *a, **k: count)
    monkeypatch.setattr(_runtime, "found_platforms", lambda: ["cpu", platform])


def test_nuts_on_one_gpu_builds_a_vectorized_sampler_and_on_the_cpu_a_parallel_one(monkeypatch):
    """The sampling program ``run_nuts`` builds (``nuts._sampling_program``; building compiles nothing) takes the
    rule's method."""
    model = zoo.get("ppca").model
    settings = tuple((k, nuts.OPTIONS[k].default) for k in nuts.PROGRAM_SETTINGS)
    assert nuts._sampling_program.__wrapped__(model, (), settings).chain_method == "parallel"
    fake_accelerator(monkeypatch)
    assert nuts._sampling_program.__wrapped__(model, (), settings).chain_method == "vectorized"


def test_set_device_selects_or_checks_and_every_failure_is_a_value_error_naming_the_argument(monkeypatch):
    jnp.zeros(1).block_until_ready()  # JAX has started on the CPU in this process
    assert zoo.set_device("cpu") == "cpu" and zoo.current_device() == "cpu"
    for bad in ("GPU ", "cuda", "tpu", None, 1):
        with pytest.raises(ValueError, match=r"^device: expected one of \['cpu', 'gpu'\], got "):
            zoo.set_device(bad)
    with pytest.raises(ValueError) as info:
        zoo.set_device("gpu")
    message = str(info.value)
    assert message.startswith("device: 'gpu' asked for, but JAX found no GPU: its devices are on platforms "
                              "['cpu']")
    assert f'pip install -U "jax[cuda13]=={jax.__version__}"' in message
    fake_accelerator(monkeypatch)
    assert zoo.set_device("gpu", "--device") == "gpu"
    with pytest.raises(ValueError, match=r"^--device: 'cpu' asked for, but this process already computes on "
                                         r"'gpu': JAX picks its platform once per process"):
        zoo.set_device("cpu", "--device")


def test_fit_with_device_gpu_on_a_cpu_machine_is_a_value_error_before_anything_compiles(monkeypatch):
    data = {"Y": np.zeros((5, 2))}
    with Stopwatch() as watch, pytest.raises(ValueError, match=r"^device: 'gpu' asked for, but JAX found no GPU"):
        inference.fit("ppca", data, "svi", seed=0, device="gpu")
    with pytest.raises(ValueError, match=r"^device: expected one of \['cpu', 'gpu'\], got 'metal'"):
        inference.fit("ppca", data, "svi", seed=0, device="metal")
    assert watch.compile_events == 0
    monkeypatch.setenv("BAYES_ZOO_DEVICE", "quantum")
    with pytest.raises(ValueError, match=r"^BAYES_ZOO_DEVICE: expected one of \['cpu', 'gpu'\], got 'quantum'"):
        inference.fit("ppca", data, "svi", seed=0)


def fresh_python(code: str, **env: str) -> str:
    """stdout + stderr of ``code`` in a new interpreter (JAX not started) with ``env`` over a clean JAX env."""
    base = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", "BAYES_ZOO_DEVICE")}
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, env={**base, **env},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout


SELECT = """
    from zoo import _runtime
    import jax
    print("platforms", jax.config.jax_platforms, "started", _runtime.xla_bridge.backends_are_initialized())
    try:
        _runtime.set_device({device!r}, {name!r})
    except ValueError as exc:
        print("error", exc)
    print("computes on", _runtime.current_device())
"""


def test_in_a_fresh_process_the_default_is_the_cpu_and_gpu_is_selected_then_refused_with_what_was_found():
    """Fresh interpreters: without settings JAX is pointed at the CPU; ``BAYES_ZOO_DEVICE=gpu`` points it at
    CUDA first (``cuda,cpu``) before it starts; ``set_device("gpu")`` on a machine without a GPU ends in a
    ValueError naming the variable it came from, the platforms found and the CUDA install line, and the
    process goes on on the CPU. A user's own ``JAX_PLATFORMS`` is kept."""
    plain = fresh_python(SELECT.format(device="cpu", name="device"))
    assert "platforms cpu started False" in plain and "computes on cpu" in plain and "error" not in plain
    gpu = fresh_python(SELECT.format(device="gpu", name="BAYES_ZOO_DEVICE"), BAYES_ZOO_DEVICE="gpu")
    assert "platforms cuda,cpu started False" in gpu
    assert "error BAYES_ZOO_DEVICE: 'gpu' asked for, but JAX found no GPU" in gpu and "['cpu']" in gpu
    assert "jax[cuda13]" in gpu and "computes on cpu" in gpu
    user = fresh_python(SELECT.format(device="cpu", name="device"), JAX_PLATFORMS="cpu", BAYES_ZOO_DEVICE="gpu")
    assert "platforms cpu started False" in user and "computes on cpu" in user


@pytest.mark.parametrize("command", [["fit", "ppca", "--out", "x.nc"], ["compare", "ppca"], ["demo"],
                                     ["sensitivity", "ppca"], ["references", "ppca", "--check"]])
def test_every_fitting_command_takes_device_and_refuses_gpu_without_one_as_a_usage_error(command):
    runner = CliRunner()
    plain = lambda result: " ".join(result.output.replace("│", " ").split())
    assert "--device" in runner.invoke(app, [*command[:1], "--help"]).output
    result = runner.invoke(app, [*command, "--device", "gpu"])
    assert result.exit_code == 2, result.output
    assert "--device" in plain(result) and "'gpu' asked for, but JAX found no GPU" in plain(result)
    bad = runner.invoke(app, [*command, "--device", "tpu"])
    assert bad.exit_code == 2 and "expected one of ['cpu', 'gpu'], got 'tpu'" in plain(bad)


def test_a_cache_threshold_that_is_not_seconds_is_a_value_error_naming_the_variable(monkeypatch, tmp_path):
    """``BAYES_ZOO_JAX_CACHE_MIN_SECONDS`` is read as seconds; anything else is refused before the cache is set up
    (no directory made, JAX's cache settings untouched)."""
    import jax

    before = jax.config.jax_compilation_cache_dir
    for bad in ("half a second", "-1", "nan", "inf"):
        monkeypatch.setenv(_runtime.CACHE_MIN_SECONDS_ENV, bad)
        with pytest.raises(ValueError, match="BAYES_ZOO_JAX_CACHE_MIN_SECONDS: expected a number of seconds >= 0"):
            _runtime.enable_compilation_cache(tmp_path / "cache")
    assert not (tmp_path / "cache").exists()
    assert jax.config.jax_compilation_cache_dir == before


def test_the_zoo_command_refuses_an_unreadable_cache_threshold_as_a_usage_error():
    """In a fresh interpreter, the CLI's set-up turns the ValueError into a usage error (exit 2) naming the
    variable, not a traceback."""
    out = fresh_python("""
        import sys
        from typer.testing import CliRunner
        from zoo_cli.commands import app
        result = CliRunner().invoke(app, ["fit", "ppca", "--out", "x.nc"])
        print("exit", result.exit_code, " ".join(result.output.replace("│", " ").split()))
        print("traceback", type(result.exception).__name__)
        """, BAYES_ZOO_JAX_CACHE_MIN_SECONDS="soon")
    assert "exit 2" in out and "BAYES_ZOO_JAX_CACHE_MIN_SECONDS: expected a number of seconds >= 0, got 'soon'" in out
    assert "traceback SystemExit" in out
