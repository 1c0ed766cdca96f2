"""The paper's variational scheme for GP-ALPS (App. B; notes §3.1 and §2.5(C)): binary-Concrete switches,
reparameterised stochastic gradients, the App. B.7 temperature schedule, Adam.

Relaxed model and guide (in logit space for stability; NumPyro's ``RelaxedBernoulliLogits(T, l)`` is
``sigmoid(Logistic(l / T, 1 / T))``, and the KL is invariant under the shared sigmoid map, notes §2.5(C)):

    model:  u_j ~ N(0, I_r), H_ij ~ N(0, s), z_j ~ Logistic(logit theta_j / lam_p, 1 / lam_p), b_j = sigmoid(z_j),
            [sigma2_i ~ InvGamma(a0, b0)], Y ~ N((H diag(b) X)^T, sigma2), X_j = F_j u_j;
    guide:  q(u_j) = N(mu_j, L_j L_j^T) (full r x r within a latent, independent across latents: the paper's
            q(X^z), E4), q(H_ij) = N(m_ij, s_ij) (fully factorised), q(z_j) = Logistic(logit rho_j / lam_q,
            1 / lam_q) (binary Concrete, location rho/(1 - rho)), [q(sigma2_i) = LogNormal].

``relaxed_model`` and ``guide`` are these as NumPyro programs (the specification; the tests check the kernel against
NumPyro's densities and ``Trace_ELBO`` of them). lam_p = 1/2 and lam_q follows App. B.7 (iteration k of N):

    lam_q(k, N) = 0.66 + (10.0 - 0.66) exp(-(k - 0.75 N)^2 / (0.083^2 N^2))

(a re-heating bump at 75 % of training, notes §3.1/E14; ``schedule="constant"`` keeps 0.66, the ablation of
notes T6). Objective: the ``num_particles``-sample (the paper's S) reparameterised estimate of the relaxed ELBO,
maximised with Adam.

Deviation from the paper: no inducing points. Each latent is in weight space x_j = F_j u_j; for the
linear-periodic kernels (rank 2) this is exactly what ell >= 2 inducing points represent, for full-rank
kernels it is the non-sparse variant the notes recommend for n <= ~500 (notes §2.5(C)). The objective is
an ELBO of the *relaxed* model (E15), not comparable with the Bernoulli ELBO of ``vbem``. Reported
activation probabilities: rho_j = P_q(b_j > 1/2) for every temperature; draws use hard switches
b_j ~ Bern(rho_j) (notes §3.1 "Prediction").

The step is NumPyro's ``SVI(relaxed_model, guide, optax.adam(lr), Trace_ELBO(S)).update`` written out (the same
function of the parameters and the noise, so the same gradient; one program of a few hundred HLO operations
instead of thousands, benchmarks/results.md "svi_concrete_program"):

* the guide's parameters are optimised unconstrained, as NumPyro does (``biject_to`` of each ``param``'s
  constraint: L_j = strictly lower part of a vector + diag(exp of its last r entries), ``sH`` and ``sig_scale``
  = exp), all in one flat vector x (``Layout``), so Adam is one update of one array;
* every particle's draw is reparameterised, u = mu + L eps, H = mH + sqrt(sH) eps', z = (logit rho + l) / lam_q,
  sigma2 = exp(sig_loc + sig_scale eps''), from one block of uniforms per step (``noise``: Box-Muller normals
  eps, logistic l = log v - log(1 - v)) drawn with the loop's step key, instead of one random-number program per
  site and particle under NumPyro's ``seed`` handler;
* log q at the draw is written in the noise: log N(mu + L eps | mu, L L^T) = sum log N(eps | 0, 1) - sum log
  diag L, log Logistic(z | loc, 1 / lam) = log Logistic(l | 0, 1) + log lam, log LogNormal(sigma2) = log N(eps'')
  - log sig_scale - log sigma2. As functions of the parameters these are the densities NumPyro's ``Trace_ELBO``
  evaluates at the reparameterised draws, so the gradient is the same (no score-function term either way).

The start (NumPyro's ``SVI.init`` of ``guide``: mu ~ N(0, I), mH ~ 0.1 N(0, I) from the guide's keys, the rest
constants) and the draws from the fitted guide run once per fit, in NumPy on the host (``host_init``,
``host_draws``): the same numbers as ``init`` and the seeded draws of the guide (JAX's threefry replayed,
``inference.host_draws``), no compiled program. A fit compiles the run and the tree's densities only.

Spaces: there is no closed-form bound; ``elbo_relaxed`` is the 4-particle estimate of the relaxed model's ELBO at
each step (its own space (u, H, z, sigma2), at the step's temperature). ``log_q`` is the density of the guide's
q(u) q(H) q(sigma2) at the draws of gp_alps' sites (u, H, sigma2): the model sums b out, so z is not in it. The
guide's parameters and the last temperature are stored in group ``variational``.

Kernel shape: ``init(key, problem)`` (NumPyro's ``SVI.init``), ``step(key, state, problem)`` (one Adam step at the
schedule's temperature, the particles' noise from ``key``; ``Info.objective`` = the step's relaxed ELBO estimate),
run for exactly ``num_steps`` steps by ``inference.loop.run_until_converged`` from ``host_init``'s state (no early
stop: the estimate is noisy).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
import optax
import xarray as xr
from numpyro.distributions import constraints
from scipy import special

from inference import host_draws as hd
from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.loop import StopRule, run_until_converged

LAM_P = 0.5
LOG_2PI = float(np.log(2 * np.pi))


def temperature(k, N, low=0.66, high=10.0, width=0.083, centre=0.75):
    """App. B.7: lam_q(k, N) = 0.66 + (10 - 0.66) exp(-(k - 0.75 N)^2 / (0.083^2 N^2))."""
    return low + (high - low) * jnp.exp(-((k - centre * N) ** 2) / (width ** 2 * N ** 2))


def relaxed_model(F, Y, theta, s, sigma2, a0, b0, lam_q=None):
    m, n, r = F.shape
    p = Y.shape[1]
    with numpyro.plate("latent", m, dim=-1):
        u = numpyro.sample("u", dist.Normal(0.0, 1.0).expand([r]).to_event(1))
        z = numpyro.sample("z", dist.Logistic(jnp.log(theta / (1 - theta)) / LAM_P, 1.0 / LAM_P))
    with numpyro.plate("output", p, dim=-2), numpyro.plate("latent", m, dim=-1):
        H = numpyro.sample("H", dist.Normal(0.0, jnp.sqrt(s)))
    if sigma2 is None:
        sig2 = numpyro.sample("sigma2", dist.InverseGamma(a0, b0).expand([p]).to_event(1))
    else:
        sig2 = jnp.full((p,), sigma2)
    b = jax.nn.sigmoid(z)
    X = jnp.einsum("jnr,jr->jn", F, u)
    numpyro.sample("Y", dist.Normal(((H * b) @ X).T, jnp.sqrt(sig2)).to_event(2), obs=Y)


def guide(F, Y, theta, s, sigma2, a0, b0, lam_q=0.66):
    m, n, r = F.shape
    p = Y.shape[1]
    key = numpyro.prng_key()
    # unseeded (NumPyro's set-up traces the guide once without a key): jax.random.key(0) and key(1), built from
    # their words on the host (as JAX operations they ran a program each)
    k1, k2 = jax.random.split(key) if key is not None else (host_keys.wrap([0, 0]), host_keys.wrap([0, 1]))
    mu = numpyro.param("mu", jax.random.normal(k1, (m, r)))
    L = numpyro.param("L", jnp.broadcast_to(0.3 * jnp.eye(r), (m, r, r)), constraint=constraints.lower_cholesky)
    mH = numpyro.param("mH", 0.1 * jax.random.normal(k2, (p, m)))
    sH = numpyro.param("sH", jnp.full((p, m), 0.1), constraint=constraints.positive)
    logit_rho = numpyro.param("logit_rho", jnp.full((m,), 2.0))
    with numpyro.plate("latent", m, dim=-1):
        # no argument check: L is lower Cholesky by its constraint, and the check on its concrete initial value ran
        # as JAX operations one at a time in every first fit
        numpyro.sample("u", dist.MultivariateNormal(mu, scale_tril=L, validate_args=False))
        numpyro.sample("z", dist.Logistic(logit_rho / lam_q, 1.0 / lam_q))
    with numpyro.plate("output", p, dim=-2), numpyro.plate("latent", m, dim=-1):
        numpyro.sample("H", dist.Normal(mH, jnp.sqrt(sH)))
    if sigma2 is None:
        loc = numpyro.param("sig_loc", jnp.log(0.1 * jnp.var(Y, axis=0)))
        scale = numpyro.param("sig_scale", jnp.full((p,), 0.1), constraint=constraints.positive)
        numpyro.sample("sigma2", dist.LogNormal(loc, scale).to_event(1))


# --- the guide's parameters: one flat unconstrained vector -------------------------------------------------------

class Layout(NamedTuple):
    """Where each of the guide's parameters sits in the flat unconstrained vector x (``guide``'s order: mu, L, mH,
    sH, logit_rho[, sig_loc, sig_scale]); unconstrained shapes (L_j as NumPyro's ``LowerCholeskyTransform``
    domain, a vector of r (r - 1) / 2 strictly lower entries, row by row, then r log-diagonal entries)."""

    m: int
    r: int
    p: int
    learn: bool

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        m, r, p = self.m, self.r, self.p
        shapes = {"mu": (m, r), "L": (m, r * (r + 1) // 2), "mH": (p, m), "sH": (p, m), "logit_rho": (m,)}
        return {**shapes, "sig_loc": (p,), "sig_scale": (p,)} if self.learn else shapes

    @property
    def size(self) -> int:
        return sum(int(np.prod(s)) for s in self.shapes.values())

    def unflatten(self, x) -> dict:
        """The unconstrained parameters of ``x`` (NumPy or JAX; leading axes kept)."""
        out, i = {}, 0
        for name, shape in self.shapes.items():
            size = int(np.prod(shape))
            out[name] = x[..., i:i + size].reshape(*x.shape[:-1], *shape)
            i += size
        return out


def layout_of(kw: dict) -> Layout:
    m, _, r = np.shape(kw["F"])
    return Layout(int(m), int(r), int(np.shape(kw["Y"])[1]), kw["sigma2"] is None)


def lower_cholesky(v, r: int, xp=jnp):
    """NumPyro's ``LowerCholeskyTransform``: the strictly lower part of an r x r matrix from the first r (r - 1) / 2
    entries of ``v`` (row by row), its diagonal exp of the last r (``xp``: ``jnp`` or ``np``; leading axes kept)."""
    rows, cols = np.tril_indices(r, -1)
    where = np.full((r, r), len(rows))
    where[rows, cols] = np.arange(len(rows))
    padded = xp.concatenate([v[..., :len(rows)], xp.zeros((*v.shape[:-1], 1))], axis=-1)
    return padded[..., where] + xp.exp(v[..., len(rows):])[..., None] * np.eye(r)


def constrain(layout: Layout, x, xp=jnp) -> dict:
    """The guide's parameters (constrained, as ``SVI.get_params`` returns them) from the flat vector ``x``."""
    q = layout.unflatten(x)
    q["L"] = lower_cholesky(q["L"], layout.r, xp)
    q["sH"] = xp.exp(q["sH"])
    if layout.learn:
        q["sig_scale"] = xp.exp(q["sig_scale"])
    return q


# --- the relaxed ELBO at reparameterised draws ----------------------------------------------------------------

def noise(key, num_particles: int, layout: Layout):
    """Standard noise of ``num_particles`` reparameterised draws from one block of uniforms v in [tiny, 1) (one
    random-number program): (eps_u (S, m, r), eps_H (S, p, m), eps_sigma2 (S, p) or None, l (S, m)), the normals by
    Box-Muller (sqrt(-2 log v1) cos(2 pi v2) and sin(2 pi v2), independent N(0, 1)), l = log v - log(1 - v)
    standard logistic."""
    m, r, p, learn = layout
    k = m * r + p * m + (p if learn else 0)
    half = -(-k // 2)
    v = jax.random.uniform(key, (num_particles, 2 * half + m), minval=jnp.finfo(jnp.float64).tiny)
    radius, angle = jnp.sqrt(-2.0 * jnp.log(v[:, :half])), 2.0 * jnp.pi * v[:, half:2 * half]
    eps = jnp.concatenate([radius * jnp.cos(angle), radius * jnp.sin(angle)], axis=1)
    logistic = jnp.log(v[:, 2 * half:]) - jnp.log1p(-v[:, 2 * half:])
    eps_u = eps[:, :m * r].reshape(num_particles, m, r)
    eps_H = eps[:, m * r:m * r + p * m].reshape(num_particles, p, m)
    eps_s = eps[:, m * r + p * m:k] if learn else None
    return eps_u, eps_H, eps_s, logistic


def _log_logistic(e):
    """log of the standard logistic density at e: -|e| - 2 log(1 + exp(-|e|))."""
    a = jnp.abs(e)
    return -a - 2.0 * jnp.log1p(jnp.exp(-a))


def inverse_gamma_log_norm(a0, b0) -> float:
    """a0 log b0 - log Gamma(a0), the log normaliser of InvGamma(a0, b0) (on the host: log Gamma compiles to a long
    polynomial)."""
    return float(a0 * np.log(b0) - special.gammaln(a0))


def relaxed_elbo(layout: Layout, x, eps, kw: dict, lam_q, ig_log_norm):
    """log p_relaxed(Y, u, H, z[, sigma2]) - log q(u, H, z[, sigma2]) of ``relaxed_model`` and ``guide`` at the guide
    parameters ``x`` (flat, unconstrained) and the draws reparameterised from the noise ``eps`` (``noise``), one
    value per particle (S,); ``ig_log_norm``: ``inverse_gamma_log_norm(a0, b0)`` (unused for a fixed noise).

    Term by term, with the unconstrained log diag L, log sH, log sig_scale read off x (the normalisers of the
    standard normals of u cancel):

        u:      -1/2 sum (u^2 - eps_u^2) + sum log diag L
        H:      -1/2 sum (H^2 / s - eps_H^2) + 1/2 sum log sH - p m / 2 log s
        z:      sum [log Logistic(lam_p z - logit theta) - log Logistic(l)] + m log(lam_p / lam_q)
        sigma2: sum [ig_log_norm - a0 log sigma2 - b0 / sigma2 + 1/2 eps^2 + log sig_scale] + p / 2 log 2 pi
        Y:      -n/2 sum_i log(2 pi sigma2_i) - 1/2 sum (Y - (H diag(sigmoid z) X)^T)^2 / sigma2."""
    m, r, p, learn = layout
    v = layout.unflatten(x)
    eps_u, eps_H, eps_s, ell = eps
    F, Y, s = kw["F"], kw["Y"], kw["s"]
    n = F.shape[1]
    u = v["mu"] + jnp.einsum("jab,sjb->sja", lower_cholesky(v["L"], r), eps_u)
    H = v["mH"] + jnp.exp(0.5 * v["sH"]) * eps_H
    z = (v["logit_rho"] + ell) / lam_q
    logit_theta = jnp.log(kw["theta"]) - jnp.log1p(-kw["theta"])
    elbo = (-0.5 * jnp.sum(u ** 2 - eps_u ** 2, (1, 2)) + jnp.sum(v["L"][:, r * (r - 1) // 2:])
            - 0.5 * jnp.sum(H ** 2 / s - eps_H ** 2, (1, 2)) + 0.5 * jnp.sum(v["sH"]) - 0.5 * p * m * jnp.log(s)
            + jnp.sum(_log_logistic(LAM_P * z - logit_theta) - _log_logistic(ell), 1)
            + m * (np.log(LAM_P) - jnp.log(lam_q)))
    if learn:
        log_sig = v["sig_loc"] + jnp.exp(v["sig_scale"]) * eps_s
        elbo = elbo + jnp.sum(ig_log_norm - kw["a0"] * log_sig - kw["b0"] * jnp.exp(-log_sig) + 0.5 * eps_s ** 2
                              + v["sig_scale"], 1) + 0.5 * p * LOG_2PI
        sig = jnp.exp(log_sig)
    else:
        log_sig = jnp.broadcast_to(jnp.log(kw["sigma2"]), (1, p))
        sig = jnp.broadcast_to(kw["sigma2"], (1, p))
    X = jnp.einsum("jnr,sjr->sjn", F, u)
    mean = jnp.einsum("spj,sjn->snp", H * jax.nn.sigmoid(z)[:, None, :], X)
    return (elbo - 0.5 * n * (jnp.sum(log_sig, 1) + p * LOG_2PI)
            - 0.5 * jnp.sum((Y - mean) ** 2 / sig[:, None, :], (1, 2)))


# --- the kernel ---------------------------------------------------------------------------------------------

class State(NamedTuple):
    x: jax.Array        # the guide's parameters, unconstrained, flat (``Layout``)
    adam: Any           # optax Adam state of x
    t: jax.Array        # steps taken


class Info(NamedTuple):
    objective: jax.Array    # the num_particles-sample relaxed ELBO estimate at this step (before its update)
    temperature: jax.Array  # lam_q used at this step


class SVIProblem(NamedTuple):
    """The loop's problem: the model's inputs (``_kw``), the number of steps N of the schedule, whether the B.7
    schedule is used (False: constant 0.66) and the InvGamma prior's log normaliser."""

    kw: dict
    num_steps: jax.Array
    paper_schedule: jax.Array
    ig_log_norm: jax.Array   # inverse_gamma_log_norm(a0, b0) (0 for a fixed noise)


def _temperature_at(problem: SVIProblem, t):
    return jnp.where(problem.paper_schedule, temperature(t, problem.num_steps), 0.66)


def _initial_x(layout: Layout, Y, normal_mu, normal_mH, xp=np):
    """The flat unconstrained start of ``guide`` (``xp``: ``np`` or ``jnp``) from its two standard-normal draws:
    mu = N(0, I), L = 0.3 I, mH = 0.1 N(0, I), sH = 0.1, logit rho = 2[, sig_loc = log(0.1 var(Y)), sig_scale =
    0.1], each by the inverse of its constraint's transform."""
    m, r, p, learn = layout
    start = {"mu": normal_mu, "L": np.tile(np.r_[np.zeros(r * (r - 1) // 2), np.full(r, np.log(0.3))], (m, 1)),
             "mH": 0.1 * normal_mH, "sH": np.full((p, m), np.log(0.1)), "logit_rho": np.full(m, 2.0)}
    if learn:
        start.update(sig_loc=xp.log(0.1 * xp.var(Y, axis=0)), sig_scale=np.full(p, np.log(0.1)))
    return xp.concatenate([xp.ravel(start[k]) for k in layout.shapes])


def init(key, problem: SVIProblem, optimiser) -> State:
    """NumPyro's ``SVI.init(key)`` of ``guide``: ``key`` split in three (the third seeds the guide), the guide's
    ``prng_key()`` the second half of that seed's split, split again for mu and mH."""
    layout = layout_of(problem.kw)
    m, r, p, _ = layout
    k1, k2 = jax.random.split(jax.random.split(jax.random.split(key, 3)[2])[1])
    x = _initial_x(layout, problem.kw["Y"], jax.random.normal(k1, (m, r)), jax.random.normal(k2, (p, m)), jnp)
    return State(x, optimiser.init(x), jnp.asarray(0, jnp.int64))


def host_init(key, problem: SVIProblem, optimiser) -> State:
    """``init(key, problem)`` in NumPy on the host (threefry replayed, ``inference.host_draws``; equal to it up to the
    last bits of ``erfinv``): nothing compiles. Adam's state is zeros (``optax.adam``'s init) of its abstract shape."""
    layout = layout_of(problem.kw)
    if not hd.threefry_native():
        return jax.device_get(jax.jit(functools.partial(init, optimiser=optimiser))(key, problem))
    m, r, p, _ = layout
    seed = hd.threefry_split(hd.threefry_split(host_keys.words(key), 3)[2])[1]
    k1, k2 = hd.threefry_split(seed)
    with np.errstate(all="ignore"):   # data that overflow here are named by the fit's check of non-finite values
        x = _initial_x(layout, problem.kw["Y"], hd.threefry_normal(k1, (m, r)), hd.threefry_normal(k2, (p, m)))
    adam = jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), jax.eval_shape(optimiser.init, x))
    return State(x, adam, np.asarray(0, np.int64))


def step(key, state: State, problem: SVIProblem, optimiser, num_particles: int) -> tuple[State, Info]:
    """One Adam step on the relaxed ELBO estimate at temperature lam_q(t, N), the particles' noise from ``key``."""
    layout = layout_of(problem.kw)
    lam = _temperature_at(problem, state.t)
    eps = noise(key, num_particles, layout)
    elbo, grad = jax.value_and_grad(
        lambda x: jnp.mean(relaxed_elbo(layout, x, eps, problem.kw, lam, problem.ig_log_norm)))(state.x)
    updates, adam = optimiser.update(-grad, state.adam, state.x)
    return State(optax.apply_updates(state.x, updates), adam, state.t + 1), Info(objective=elbo, temperature=lam)


@programs.cached(maxsize=16)
def kernel(learning_rate: float, num_particles: int) -> Kernel:
    """``init``/``step`` for the loop, one kernel per optimiser setting (compiled runs reused across fits)."""
    optimiser = optax.adam(learning_rate)
    return Kernel(functools.partial(init, optimiser=optimiser),
                  functools.partial(step, optimiser=optimiser, num_particles=num_particles))


def fit_state(key, kw, num_steps, learning_rate=0.01, num_particles=4, schedule="paper", progress=None):
    """Adam on the relaxed ELBO with the temperature schedule from ``host_init``; returns (final ``State``, relaxed
    ELBO trace, temperatures) (host arrays)."""
    k = kernel(float(learning_rate), int(num_particles))
    log_norm = inverse_gamma_log_norm(kw["a0"], kw["b0"]) if kw["sigma2"] is None else 0.0
    problem = SVIProblem(kw, np.asarray(float(num_steps)), np.asarray(schedule == "paper"),   # host: no eager op
                         np.asarray(log_norm))
    # restart 0's key, as the loop derives it for a fresh start (``split(key, 1)[0]``); on the device already (the
    # loop's ``jnp.asarray`` of a NumPy array compiles a program of its own, ``stage``)
    start = host_init(host_keys.parts(key, 1)[0], problem, k.init.keywords["optimiser"])
    start = jax.device_put(jax.tree.map(lambda a: np.asarray(a)[None], start))
    # XLA's default optimisation: thousands of steps, which level 0 runs several times slower
    # (benchmarks/results.md, "opt_level")
    r = run_until_converged(k.init, k.step, problem, key, StopRule(int(num_steps)), progress=progress,
                            desc="gp_alps svi_concrete", init_state=start, compiler_options=programs.OPTIMISED)
    return jax.device_get(r.state), r.info.objective, r.info.temperature


def fit_params(key, kw, num_steps, learning_rate=0.01, num_particles=4, schedule="paper", progress=None):
    """Adam on the relaxed ELBO with the temperature schedule; returns (params (constrained, NumPy), relaxed ELBO
    trace, temperatures)."""
    state, elbo, temps = fit_state(key, kw, num_steps, learning_rate, num_particles, schedule, progress)
    return constrain(layout_of(kw), np.asarray(state.x), np), elbo, temps


# --- draws from the fitted guide, on the host -------------------------------------------------------------------

def host_draws(params: dict, key, num_samples: int) -> tuple[dict, np.ndarray]:
    """Draws of (u, H[, sigma2]) from the fitted guide, hard switches b ~ Bern(rho), and log q(u, H[, sigma2]) at each,
    in NumPy. Draw ``i`` is seeded with ``split(key, num_samples)[i]``, split in four (u, H, b, sigma2), as the
    guide's distributions draw with ``jax.random`` (replayed: ``MultivariateNormal``: mu + L eps; ``Normal``;
    ``bernoulli``: uniform < rho; ``LogNormal``: exp of a normal); keys that are not JAX's default threefry draw
    from ``np.random.default_rng`` seeded with the key's words instead (reproducible, other numbers)."""
    mu, L, mH, sH = (np.asarray(params[k], float) for k in ("mu", "L", "mH", "sH"))
    rho = special.expit(np.asarray(params["logit_rho"], float))
    learn = "sig_loc" in params
    (m, r), p = mu.shape, mH.shape[0]
    if hd.threefry_native():
        keys = hd.threefry_split(host_keys.words(host_keys.split(key, num_samples)), 4)
        eps_u = hd.threefry_normal(keys[:, 0], (m, r))
        eps_H = hd.threefry_normal(keys[:, 1], (p, m))
        v = hd.threefry_uniform(keys[:, 2], (m,))
        eps_s = hd.threefry_normal(keys[:, 3], (p,))
    else:
        rng = np.random.default_rng(host_keys.words(key))
        eps_u, eps_H = rng.standard_normal((num_samples, m, r)), rng.standard_normal((num_samples, p, m))
        v, eps_s = rng.random((num_samples, m)), rng.standard_normal((num_samples, p))
    u = mu + np.einsum("jab,njb->nja", L, eps_u)
    H = mH + np.sqrt(sH) * eps_H
    draws = {"u": u, "H": H, "b": (v < rho).astype(np.int32)}
    log_q = hd.mvn_tril_log_pdf(u, mu, L).sum(-1) + hd.normal_log_pdf(H, mH, np.sqrt(sH)).sum((-2, -1))
    if learn:
        loc, scale = np.asarray(params["sig_loc"], float), np.asarray(params["sig_scale"], float)
        log_sig = loc + scale * eps_s
        draws["sigma2"] = np.exp(log_sig)
        log_q = log_q + (hd.normal_log_pdf(log_sig, loc, scale) - log_sig).sum(-1)
    return draws, log_q


def q_dataset(params, lam_q) -> xr.Dataset:
    """Group ``variational``: the fitted guide's parameters (constrained): mu (latent, rank), L (latent, rank,
    rank_bis) of q(u_j) = N(mu_j, L_j L_j^T); mH, sH (output, latent) of q(H_ij) = N(mH, sH); logit_rho (latent)
    of q(z_j) = Logistic(logit_rho_j / lam_q, 1 / lam_q); sig_loc, sig_scale (output) of q(sigma2_i) =
    LogNormal (only when the noise is learned); attribute ``lam_q``: the temperature of the last step."""
    dims = {"mu": ("latent", "rank"), "L": ("latent", "rank", "rank_bis"), "mH": ("output", "latent"),
            "sH": ("output", "latent"), "logit_rho": ("latent",), "sig_loc": ("output",), "sig_scale": ("output",)}
    return xr.Dataset({k: (dims[k], np.asarray(v)) for k, v in params.items()}, attrs={"lam_q": lam_q})


def _kw(ctx):
    mk = ctx.model_kwargs
    return {"F": np.asarray(mk["F"]), "Y": np.asarray(mk["Y"]), "theta": np.asarray(mk["theta"]),
            "s": mk["s"], "sigma2": mk["sigma2"], "a0": mk["a0"], "b0": mk["b0"]}


@register_method("svi_concrete", kind="variational", models=("gp_alps",), options={
    "num_steps": Option(5000, "positive_int", "Adam steps (the B.7 schedule spans them)", tiny=50),
    "learning_rate": Option(0.01, "positive", "Adam step size"),
    "num_particles": Option(4, "positive_int", "Monte Carlo samples per ELBO estimate (the paper's S)"),
    "num_samples": Option(1000, "positive_int", "draws from the fitted guide", tiny=20),
    "schedule": Option("paper", "string", "posterior temperature: 'paper' (App. B.7 bump) or 'constant' (0.66)",
                       choices=("paper", "constant")),
})
def run_svi_concrete(ctx: FitContext) -> Draws:
    """The paper's App. B scheme: binary-Concrete q(b) and Concrete prior (lam_p = 1/2), the B.7 temperature
    schedule, reparameterised gradients with Adam (weight-space latents instead of inducing points)."""
    o = ctx.options
    kw = _kw(ctx)
    k_fit, k_draw = host_keys.parts(ctx.key)
    state, elbo, temps = fit_state(k_fit, kw, o["num_steps"], o["learning_rate"], o["num_particles"], o["schedule"],
                                   o["progress"])
    params = constrain(layout_of(kw), np.asarray(state.x), np)
    draws, log_q = host_draws(params, k_draw, int(o["num_samples"]))
    rho = special.expit(params["logit_rho"])
    return Draws(posterior={k: np.asarray(v)[None] for k, v in draws.items()},
                 sample_stats={"log_q": np.asarray(log_q)[None]},
                 traces={"elbo_relaxed": np.asarray(elbo), "temperature": np.asarray(temps)},
                 dims={"b": ["latent"]}, groups={"variational": q_dataset(params, float(temps[-1]))},
                 attrs={"rho": rho.tolist(), "q_H_mean": np.asarray(params["mH"]).tolist(),
                        "q_H_var": np.asarray(params["sH"]).tolist()},
                 converged=False, n_iter=int(np.asarray(elbo).shape[0]))
