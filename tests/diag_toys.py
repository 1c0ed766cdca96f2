"""Toy models with exact posteriors for the diagnostics tests (registered only in tests, never in zoo/).

* ``dq_normal``: mu ~ N(mu0, tau0^2), y_i ~ N(mu, sigma^2) (conjugate normal-normal).
* ``dq_beta``: theta ~ Beta(a, b), y_i ~ Bernoulli(theta) (conjugate beta-binomial), with a strong
  prior by default (a = b = 20), so that dropping it matters;
* ``dq_linreg``: beta ~ N(0, s0^2 I_2), y ~ N(X beta, sigma^2 I) with strongly correlated columns of X,
  so the exact posterior is a bivariate normal with correlation about -0.95.

Hand-made "methods" with known defects, each registered through the public route:

* ``exact``: iid draws from the closed-form posterior (a perfect sampler);
* ``noprior``: iid draws from the likelihood alone, N(ybar, sigma^2/n) -- a sampler that drops the prior
  (invisible to SBC in this location model: N(ybar, sigma^2/n) is a calibrated pivot for mu);
  (``dq_beta``: draws from Beta(1 + k, 1 + n - k), the flat-prior posterior -- far too wide under the
  strong Beta(20, 20) prior, and SBC sees it);
* ``doubleprior``: iid draws from the posterior with the prior counted twice (too narrow, over-shrunk);
* ``exact_q``: the closed-form posterior as a variational method (stores log q);
* ``meanfield``: the mean-field KL(q||p) optimum for a Gaussian: exact means, variances 1/Lambda_ii
  (too narrow when the posterior is correlated; sd ratio sqrt(1 - rho^2));
* ``shifted``: the exact posterior moved by ``shift`` posterior sd (a biased approximation);
* ``narrow``: the exact posterior with its sd times ``factor``;
* ``ar1``: an exact but slowly mixing sampler (Gaussian AR(1) chains with the exact stationary law).
"""

from __future__ import annotations

import contextlib
import functools

import jax
import numpy as np
import numpyro
import numpyro.distributions as dist
import xarray as xr

import zoo
from inference import Draws, register_method

# ----------------------------------------------------------------------------- conjugate normal


def normal_model(y, mu0=0.0, tau0=1.0, sigma=2.0):
    """mu ~ N(mu0, tau0^2); y_i ~ N(mu, sigma^2), i = 1..n."""
    mu = numpyro.sample("mu", dist.Normal(mu0, tau0))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def normal_simulate(seed, n=4, mu0=0.0, tau0=1.0, sigma=2.0):
    """Draws mu from the prior with the default hyperparameters, then y."""
    rng = np.random.default_rng(seed)
    mu = rng.normal(mu0, tau0)
    return {"y": rng.normal(mu, sigma, n)}, {"mu": mu}


def normal_posterior(y, mu0, tau0, sigma):
    prec = 1 / tau0**2 + len(y) / sigma**2
    return (mu0 / tau0**2 + np.sum(y) / sigma**2) / prec, prec**-0.5


NORMAL = zoo.ModelSpec(
    name="dq_normal", model=normal_model, simulate=normal_simulate, paper="(diagnostics test toy)",
    data_fields=(zoo.DataField("y", ("n",)),),
    hyperparameters={"mu0": zoo.Hyper(0.0, "any"), "tau0": zoo.Hyper(1.0), "sigma": zoo.Hyper(2.0)},
    settings=zoo.ZooSettings(
        demo_sizes={"n": 4},
        demo_options={"nuts": {"num_warmup": 300, "num_samples": 500}, "svi": {"num_steps": 1500}}),
)

# ----------------------------------------------------------------------------- conjugate beta-binomial


def beta_model(y, a=20.0, b=20.0):
    """theta ~ Beta(a, b); y_i ~ Bernoulli(theta), i = 1..n."""
    theta = numpyro.sample("theta", dist.Beta(a, b))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Bernoulli(theta), obs=y)


def beta_simulate(seed, n=10, a=20.0, b=20.0):
    rng = np.random.default_rng(seed)
    theta = rng.beta(a, b)
    return {"y": (rng.uniform(size=n) < theta).astype(np.int64)}, {"theta": theta}


BETA = zoo.ModelSpec(
    name="dq_beta", model=beta_model, simulate=beta_simulate, paper="(diagnostics test toy)",
    data_fields=(zoo.DataField("y", ("n",), kind="binary"),),
    hyperparameters={"a": zoo.Hyper(20.0), "b": zoo.Hyper(20.0)},
    settings=zoo.ZooSettings(demo_sizes={"n": 10}),
)

# ----------------------------------------------------------------------------- correlated regression

RHO_X = 0.95


def linreg_model(X, y, s0=3.0, sigma=1.0):
    """beta ~ N(0, s0^2 I_2); y ~ N(X beta, sigma^2 I)."""
    beta = numpyro.sample("beta", dist.Normal(0.0, s0).expand([2]).to_event(1))
    with numpyro.plate("obs", y.shape[0]):
        numpyro.sample("y", dist.Normal(X @ beta, sigma), obs=y)


def linreg_simulate(seed, n=40, s0=3.0, sigma=1.0):
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, RHO_X], [RHO_X, 1.0]])
    X = rng.multivariate_normal(np.zeros(2), cov, size=n)
    beta = rng.normal(0.0, s0, 2)
    return {"X": X, "y": X @ beta + sigma * rng.normal(size=n)}, {"beta": beta}


def linreg_posterior(X, y, s0, sigma):
    """(mean, covariance) of the Gaussian posterior of beta."""
    prec = X.T @ X / sigma**2 + np.eye(2) / s0**2
    cov = np.linalg.inv(prec)
    return cov @ X.T @ y / sigma**2, cov


LINREG = zoo.ModelSpec(
    name="dq_linreg", model=linreg_model, simulate=linreg_simulate, paper="(diagnostics test toy)",
    data_fields=(zoo.DataField("X", ("n", 2)), zoo.DataField("y", ("n",))),
    hyperparameters={"s0": zoo.Hyper(3.0), "sigma": zoo.Hyper(1.0)},
    settings=zoo.ZooSettings(
        demo_sizes={"n": 40},
        demo_options={"nuts": {"num_warmup": 300, "num_samples": 500}, "svi": {"num_steps": 1500},
                      "exact": {"num_samples": 2000, "num_chains": 2}}),
)

# ----------------------------------------------------------------------------- the hand-made methods


def _gaussian(ctx):
    """(site name, mean vector, covariance, event shape) of the exact posterior of either toy."""
    if ctx.spec.name == "dq_normal":
        m, s = normal_posterior(ctx.data["y"], **ctx.hyper)
        return "mu", np.array([m]), np.array([[s**2]]), ()
    m, c = linreg_posterior(ctx.data["X"], ctx.data["y"], **ctx.hyper)
    return "beta", m, c, (2,)


def _draw(ctx, mean, cov, event, num_chains, num_samples, log_q=False):
    x, lq = _gaussian_draws(ctx.key, np.asarray(mean), np.linalg.cholesky(cov), np.asarray(cov),
                            (num_chains, num_samples, len(mean)), log_q)
    stats = {"log_q": lq} if log_q else {}
    return x.reshape((num_chains, num_samples) + (event or ())), stats


@functools.partial(jax.jit, static_argnums=(4, 5))
def _gaussian_draws(key, mean, chol, cov, shape, log_q):
    """x = mean + L z with z ~ N(0, I) from ``key`` (and log q(x) when asked): one program per shape."""
    x = mean + jax.random.normal(key, shape) @ chol.T
    return x, (dist.MultivariateNormal(mean, cov).log_prob(x) if log_q else None)


_beta = jax.jit(jax.random.beta, static_argnums=3)
_host_seed = jax.jit(lambda key: jax.random.randint(key, (), 0, 2**31 - 1))


_OPTS = {"num_samples": 2000, "num_chains": 2}
_TOYS = ("dq_normal", "dq_linreg")


def _beta_draws(ctx, a, b):
    shape = (ctx.options["num_chains"], ctx.options["num_samples"])
    return Draws(posterior={"theta": _beta(ctx.key, a, b, shape)})


@register_method("exact", kind="sampler", models=(*_TOYS, "dq_beta"), options=_OPTS)
def exact(ctx):
    """iid draws from the closed-form posterior."""
    if ctx.spec.name == "dq_beta":
        k, n = ctx.data["y"].sum(), len(ctx.data["y"])
        return _beta_draws(ctx, ctx.hyper["a"] + k, ctx.hyper["b"] + n - k)
    name, m, c, event = _gaussian(ctx)
    x, _ = _draw(ctx, m, c, event, ctx.options["num_chains"], ctx.options["num_samples"])
    return Draws(posterior={name: x})


@register_method("noprior", kind="sampler", models=("dq_normal", "dq_beta"), options=_OPTS)
def noprior(ctx):
    """A biased sampler: the posterior with the prior dropped (replaced by a flat one)."""
    if ctx.spec.name == "dq_beta":
        k, n = ctx.data["y"].sum(), len(ctx.data["y"])
        return _beta_draws(ctx, 1.0 + k, 1.0 + n - k)
    y, sigma = ctx.data["y"], ctx.hyper["sigma"]
    x, _ = _draw(ctx, np.array([y.mean()]), np.array([[sigma**2 / len(y)]]), (),
                 ctx.options["num_chains"], ctx.options["num_samples"])
    return Draws(posterior={"mu": x})


@register_method("doubleprior", kind="sampler", models=("dq_normal",), options=_OPTS)
def doubleprior(ctx):
    """A biased sampler: the prior enters twice (precision 2/tau0^2 + n/sigma^2)."""
    h = ctx.hyper
    y = ctx.data["y"]
    prec = 2 / h["tau0"] ** 2 + len(y) / h["sigma"] ** 2
    mean = (2 * h["mu0"] / h["tau0"] ** 2 + y.sum() / h["sigma"] ** 2) / prec
    x, _ = _draw(ctx, np.array([mean]), np.array([[1 / prec]]), (), ctx.options["num_chains"],
                 ctx.options["num_samples"])
    return Draws(posterior={"mu": x})


_VI_OPTS = {"num_samples": 2000, "shift": 0.5, "factor": 0.5}


@register_method("exact_q", kind="variational", models=_TOYS, options=_VI_OPTS)
def exact_q(ctx):
    """The exact posterior, presented as a variational approximation (with log q)."""
    name, m, c, event = _gaussian(ctx)
    x, stats = _draw(ctx, m, c, event, 1, ctx.options["num_samples"], log_q=True)
    return Draws(posterior={name: x}, sample_stats=stats, traces={"elbo": -np.geomspace(100, 1, 50)})


@register_method("meanfield", kind="variational", models=("dq_linreg",), options=_VI_OPTS)
def meanfield(ctx):
    """The mean-field optimum of KL(q || p) for a Gaussian p: exact means, variances 1 / Lambda_ii."""
    name, m, c, event = _gaussian(ctx)
    var = 1 / np.diag(np.linalg.inv(c))
    x, stats = _draw(ctx, m, np.diag(var), event, 1, ctx.options["num_samples"], log_q=True)
    return Draws(posterior={name: x}, sample_stats=stats, traces={"elbo": -np.geomspace(80, 2, 40)})


@register_method("shifted", kind="variational", models=_TOYS, options=_VI_OPTS)
def shifted(ctx):
    """The exact posterior moved by ``shift`` posterior sd in every coordinate."""
    name, m, c, event = _gaussian(ctx)
    m = m + ctx.options["shift"] * np.sqrt(np.diag(c))
    x, stats = _draw(ctx, m, c, event, 1, ctx.options["num_samples"], log_q=True)
    return Draws(posterior={name: x}, sample_stats=stats)


@register_method("narrow", kind="variational", models=_TOYS, options=_VI_OPTS)
def narrow(ctx):
    """The exact posterior with every sd multiplied by ``factor``."""
    name, m, c, event = _gaussian(ctx)
    x, stats = _draw(ctx, m, c * ctx.options["factor"] ** 2, event, 1, ctx.options["num_samples"], log_q=True)
    return Draws(posterior={name: x}, sample_stats=stats)


@register_method("point", kind="point", models=_TOYS, options={"shift": 0.0})
def point(ctx):
    """One draw: the posterior mean moved by ``shift`` posterior sd (a point estimate such as EM's)."""
    name, m, c, _ = _gaussian(ctx)
    x = m + ctx.options["shift"] * np.sqrt(np.diag(c))
    return Draws(posterior={name: np.asarray(x)[None, None]})


_AR1_OPTS = {"num_samples": 1000, "num_chains": 2, "num_warmup": 0, "phi": 0.9, "init_sd": 0.0}


@register_method("ar1", kind="sampler", models=_TOYS, options=_AR1_OPTS)
def ar1(ctx):
    """An exact but slowly mixing sampler: per chain a Gaussian AR(1) process whose stationary distribution is
    the exact posterior, x_t = m + phi (x_{t-1} - m) + sqrt(1 - phi^2) L e_t (L L^T the posterior covariance).
    Its ESS per draw is (1 - phi) / (1 + phi); chains start at m + init_sd L e_0 (``init_sd`` > 1:
    overdispersed starts, for R-hat) and the first ``num_warmup`` draws are dropped."""
    from scipy.signal import lfilter

    name, m, c, event = _gaussian(ctx)
    o = ctx.options
    phi = float(o["phi"])
    rng = np.random.default_rng(int(_host_seed(ctx.key)))
    n = o["num_warmup"] + o["num_samples"]
    chol = np.linalg.cholesky(c)
    start = o["init_sd"] * rng.normal(size=(o["num_chains"], 1, len(m)))
    shocks = np.sqrt(1 - phi**2) * rng.normal(size=(o["num_chains"], n, len(m)))
    z = lfilter([1.0], [1.0, -phi], shocks, axis=1, zi=phi * start)[0]  # standardised AR(1), (chain, n, d)
    x = (m + z @ chol.T)[:, o["num_warmup"]:]
    return Draws(posterior={name: x.reshape((o["num_chains"], o["num_samples"]) + (event or ()))})


def hand_tree(posterior: dict, *, model: str | None = None, method: str = "candidate", log_q=None,
              sample_stats: dict | None = None) -> xr.DataTree:
    """A DataTree made by hand (no ``inference.fit``): ``posterior`` name -> array (chain, draw, ...); attrs
    ``model`` (for the registry's summaries and bounds) and ``method``; ``log_q`` (chain, draw) makes it a
    variational tree. Unregistered methods get their kind from the structure (``diagnostics.view.method_kind``)."""
    ds = xr.Dataset({k: (("chain", "draw") + tuple(f"{k}_dim_{i}" for i in range(np.ndim(v) - 2)), np.asarray(v))
                     for k, v in posterior.items()})
    groups = {"posterior": ds}
    stats = dict(sample_stats or {})
    if log_q is not None:
        stats["log_q"] = np.asarray(log_q)
    if stats:
        groups["sample_stats"] = xr.Dataset({k: (("chain", "draw"), v) for k, v in stats.items()})
    tree = xr.DataTree.from_dict(groups)
    tree.attrs.update({"method": method, **({"model": model} if model else {})})
    return tree


@contextlib.contextmanager
def registered(*specs: zoo.ModelSpec):
    """The toy specs registered for the duration of the block (tests never leave them in the registry)."""
    for spec in specs:
        zoo.register(spec, replace=True)
    try:
        yield
    finally:
        for spec in specs:
            zoo.unregister(spec.name)
