"""The ssgp VB kernel (Tan & Nott 2016; Lim 2016; notes 002 §3) in the shape of ``inference.loop``: ``State``,
``Info``, ``init(key, problem)``, ``step(key, state, problem)``, ``draw(seed, state, n)`` (NumPy, on the host),
with the static configuration (``problem.Config``, the step options included) closed over by ``kernel`` (one set
of functions per configuration, so the loop compiles once); the registered method ``vb``.

Mean-field family q(lam) q(alpha, beta) q(sigma) q(tau) [q(gamma) | q(y*) | xi] with beta = (beta0,
A-coefficients, random effects b flattened (group, term)); one sweep is ``inference.ssgp.sweep.sweep``.

**Step control (ours; the notes' a <= 10 with backtracking from a = 1 needed 417-1469 sweeps).** P holds
alpha fixed, but alpha follows lam inside the same sweep, so the curvature along the path a sweep takes is far
smaller than P and the plain step crawls. a > 1 therefore over-relaxes the mean only: a doubles after each
accepted sweep (up to ``step_max`` = 1e4); if the lower bound would decrease, the sweep is redone with a / 4,
a / 16, ... and, below 2^-13, a = 0 (q(lam) frozen: a pure CAVI sweep, never decreasing). The NCVMP pieces are
computed once per sweep for all its tries. Two more accelerations keep every accepted sweep an exact bound
increase: (i) steps 4-7 are repeated ``INNER`` = 10 times at fixed q(lam) for the Gaussian and probit models
(O(n m s) each: E[Z] and E[Z^T W Z] do not change), so q(y*) and the scales catch up with lam; (ii) each try
also runs steps 4-7 from (C_sigma, C_tau) extrapolated along their last change, by b = 2 b_prev (<= 64), and
keeps the higher bound of the two (C_sigma's EM-like drift was the slowest mode, ~0.07 per sweep).
**Stopping rule** (``inference.loop.StopRule`` with ``Info.may_stop``): |L_t - L_{t-1}| <= tol |L_t| AND the
lam mean moved less than 0.01 sd of q(lam) in that sweep: an over-relaxed step can jump across the maximum and
land on an almost equal bound.
**Warm start (E17):** the first ``warm_start`` sweeps freeze q(lam): from mu_alpha = 0 the first lam step
would send mu_lam to the prior mean 0, a stationary point with a flat f.

**Spaces of log q.** ``draw`` returns log q at the model's (non-centred) sites lam, sigma, alpha_raw, beta0,
beta, tau, b_raw, gamma, with the Jacobians of alpha_raw = sqrt(m) alpha / sigma and b_raw = b / tau. The
objective is the lower bound of ``inference.ssgp.bound`` (on the augmented space for probit and logit).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr

from inference import host_draws as hd
from inference import programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.loop import Run, StopRule, run_until_converged
from inference.ssgp.bound import joint_cov
from inference.ssgp.hfunction import inv_moment, sample_scale_host, scale_log_density
from inference.ssgp.problem import LIKELIHOOD_OF, MODELS, Config, Data, program_config, setup
from inference.ssgp.sweep import lam_terms, sweep

GROW, SHRINK, MIN_STEP = 2.0, 0.25, 2.0 ** -13  # adaptive lam step: x2 after a success, /4 per failed try
B_MAX = 64.0  # largest extrapolation factor of the coefficient scales (see ``sweep``)
LAM_TOL = 1e-2  # convergence also needs the last lam-mean move below 0.01 sd of q(lam) (Mahalanobis)
CHUNK = 50  # sweeps per compiled chunk of the loop


class State(NamedTuple):
    """Variational parameters and the cached expectations that go with them."""
    mu_lam: jax.Array   # (d,)
    Sig_lam: jax.Array  # (d, d)
    P_lam: jax.Array    # (d, d)    Sig_lam^-1 (the NCVMP step blends it, ``sweep.lam_update``)
    mu_a: jax.Array     # (2m,)
    Sig_a: jax.Array    # (2m, 2m)
    mu_b: jax.Array     # (s,)
    Sig_b: jax.Array    # (s, s)
    Sig_ab: jax.Array   # (2m, s) Cov(alpha, beta) under q (zero for the mean-field factorisation)
    C_sig: jax.Array    # ()
    C_tau: jax.Array    # (T,)
    C_gam: jax.Array    # () (LMM)
    xi: jax.Array       # (Np,) (logit)
    EZ: jax.Array       # (Np, 2m)  E[Z] under q(lam)
    ZWZ: jax.Array      # (2m, 2m)  E[Z^T W Z] (unweighted for LMM and probit)
    qz: jax.Array       # (Np,)     tr(E[z_i z_i^T] M) (logit)
    w: jax.Array        # (Np,)     pseudo-data weights at this state (``bound.pseudo``), for the next q(lam) step
    yt: jax.Array       # (Np,)     pseudo-responses at this state
    logdet_cov: jax.Array  # ()     log det Cov_q(alpha, beta), from the last pass's Cholesky factor
    bound: jax.Array    # ()        lower bound after this state's sweep
    a: jax.Array        # ()        NCVMP step actually used in the last sweep
    it: jax.Array       # ()        sweeps done
    b: jax.Array        # ()        extrapolation of the coefficient scales (C_sigma, C_tau) used in the last sweep
    dC: jax.Array       # (1+T,)    change of (C_sigma, C_tau) over the last sweep (the extrapolation direction)


class Info(NamedTuple):
    objective: jax.Array  # the lower bound after the sweep
    step: jax.Array       # NCVMP step a used
    n_tries: jax.Array    # sweeps tried (1 + backtracking)
    may_stop: jax.Array   # the lam mean has stopped moving (and the warm start is over): see ``step``


@programs.cached(maxsize=32)
def kernel(cfg: Config) -> Kernel:
    """``init(key, problem)``, ``step(key, state, problem)`` (compiled by the loop) and ``draw(seed, state,
    num_samples, n) -> (draws, log_q)`` (NumPy, on the host: ``draw``) for one static configuration; cached, so
    repeated fits share the loop's compiled program."""
    return Kernel(functools.partial(init, cfg), functools.partial(step, cfg), functools.partial(draw, cfg))


def init(cfg, key, problem, xp=jnp):
    """Initial factors (notes §3.3; deterministic, ``key`` unused): mu_lam = 0.5 (never 0), Sigma_lam = 0.5 I,
    C_sigma = (m-1) v, C_gamma = (n/2 - 1) v/4 (v = var y; 1 for the binary models), C_tau = (J/2 - 1)/2,
    mu_alpha = 0, Sigma_alpha = Sigma_beta = 0.1 I, xi = 1. E[Z] and E[Z^T W Z] start at 0: the first sweep
    computes them before it reads them (``sweep`` step 3; the pseudo-data of its step 1 read E[Z] only through
    E[Z] mu_alpha, with mu_alpha = 0). The pseudo-data (w, yt) at this state (``bound.pseudo``) in closed form:
    mu_i = 0, so probit's yt_i = s_i phi(0) / Phi(0) = s_i sqrt(2 / pi); logit's w_i = 2 omega(1); the LMM's
    w_i = E[gamma^-2] = H(n, C_gamma) / H(n - 2, C_gamma). logdet_cov = log det of Cov(alpha, beta) = 0.1 I.

    ``xp``: the array library; ``run`` builds the start in NumPy on the host (``xp=numpy``) and hands it to the
    loop as its ``init_state``, so the run program holds no start (its constant buffers, the LMM's quadrature
    grid: compile time for one evaluation)."""
    m, d, n = cfg.m, cfg.d, problem.n_obs
    data = problem
    if cfg.likelihood == "gaussian":
        ybar = xp.sum(data.mask * data.y) / n
        v = xp.maximum(xp.sum(data.mask * (data.y - ybar) ** 2) / xp.maximum(n - 1, 1), 1e-6)
    else:
        v = xp.asarray(1.0)
    f64 = xp.float64
    Np = data.X.shape[0]
    C_gam = xp.maximum(n / 2.0 - 1.0, 0.5) * v / 4.0
    if cfg.likelihood == "gaussian":
        w, yt = data.mask * inv_moment(n - 2.0, C_gam, cfg.A_gamma**2, 2.0, xp), data.y
    elif cfg.likelihood == "probit":
        w, yt = data.mask, (2.0 * data.y - 1.0) * math.sqrt(2.0 / math.pi)
    else:
        om = math.tanh(0.5) / 4.0                                     # omega(xi = 1)
        w, yt = data.mask * 2.0 * om, (data.y - 0.5) / (2.0 * om)
    return State(mu_lam=xp.broadcast_to(xp.asarray(cfg.mu_lam_init, dtype=f64), (d,)), Sig_lam=0.5 * xp.eye(d),
                 P_lam=2.0 * xp.eye(d), mu_a=xp.zeros(2 * m), Sig_a=0.1 * xp.eye(2 * m), mu_b=xp.zeros(cfg.s),
                 Sig_b=0.1 * xp.eye(cfg.s), Sig_ab=xp.zeros((2 * m, cfg.s)), C_sig=xp.maximum(m - 1.0, 0.5) * v,
                 C_tau=xp.full(cfg.T, max(0.5 * (cfg.J / 2.0 - 1.0), 0.1)), C_gam=C_gam, xi=xp.ones(Np),
                 EZ=xp.zeros((Np, 2 * m)), ZWZ=xp.zeros((2 * m, 2 * m)), qz=xp.zeros(Np), w=w, yt=yt,
                 logdet_cov=xp.asarray((2 * m + cfg.s) * math.log(0.1)), bound=xp.asarray(-xp.inf),
                 a=xp.asarray(0.0), it=xp.asarray(0), b=xp.asarray(0.0), dC=xp.zeros(1 + cfg.T))


def step(cfg, key, st, data):
    """One accepted sweep (notes §3.3, with adaptive over-relaxation of the lam mean, see ``lam_update``).

    Try a = min(GROW a_prev, step_max) (a = 1 right after the warm start); while the bound would decrease,
    redo the sweep with a / 4, a / 16, ... and, once that is below 2^-13, a = 0 (q(lam) frozen: a pure CAVI
    sweep, never decreasing). The NCVMP pieces (g, P) are computed once for all tries. ``backtrack=False``:
    plain NCVMP with a = 1 every sweep (the document's algorithm, which can decrease the bound).

    ``Info.may_stop``: the warm start is over (``it > warm_start + 2``) and the lam mean moved less than
    ``LAM_TOL`` sd of q(lam) (Mahalanobis) in this sweep; the loop's rule on the bound needs it too."""
    warm_start, step_max, backtrack = cfg.warm_start, cfg.step_max, cfg.backtrack
    if backtrack:
        a_try = jnp.where(st.it < warm_start, 0.0,
                          jnp.where(st.it == warm_start, 1.0, jnp.minimum(GROW * jnp.maximum(st.a, 0.25), step_max)))
    else:
        a_try = jnp.where(st.it < warm_start, 0.0, 1.0)
    b_try = jnp.where(backtrack & (st.it > warm_start), jnp.minimum(GROW * jnp.maximum(st.b, 0.5), B_MAX), 0.0)
    lam = lam_terms(cfg, data, st, st.w, st.yt)

    def cond(c):
        k, a, s = c
        ok = s.bound >= st.bound - 1e-13 * jnp.abs(st.bound)
        return (k == 0) | (backtrack & (a > 0) & ~ok)

    def body(c):
        k, a_prev, _ = c
        a = jnp.where(k == 0, a_try, jnp.where(a_prev * SHRINK < MIN_STEP, 0.0, a_prev * SHRINK))
        return k + 1, a, sweep(cfg, data, st, a, lam=lam, b=b_try)

    n_tries, _, new = jax.lax.while_loop(cond, body, (jnp.asarray(0), jnp.asarray(a_try, dtype=jnp.float64), st))
    # an over-relaxed lam step can jump across the maximum and land on an almost equal bound, so a small
    # change of L alone does not mean convergence: the lam mean must also have stopped moving
    dmu = new.mu_lam - st.mu_lam
    lam_moved = jnp.sqrt(dmu @ new.P_lam @ dmu)
    return new, Info(new.bound, new.a, n_tries, (new.it > warm_start + 2) & (lam_moved < LAM_TOL))


def draw(cfg, seed, st, num_samples, n):
    """``num_samples`` draws of the model's latent sites from q and log q at each (constrained space), in NumPy
    from ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job, not worth compiling; the
    scale factors by ``hfunction.sample_scale_host``); ``n`` the number of observations.

    alpha_raw = sqrt(m) alpha / sigma and b_raw = b / tau (the model is non-centred), so log q gains the
    Jacobians 2m log(sigma / sqrt m) and J sum_t log tau_t."""
    rng = np.random.default_rng(seed)
    st = jax.tree.map(np.asarray, jax.device_get(st))
    m, S_, n = cfg.m, int(num_samples), float(n)
    L_lam = np.linalg.cholesky(st.Sig_lam)
    lam = hd.mvn_variates(rng, st.mu_lam, L_lam, (S_,))
    p_s = 2.0 * m - 2.0
    sigma = sample_scale_host(rng, p_s, st.C_sig, cfg.A_sigma**2, (S_,))
    mu_t = np.concatenate([st.mu_a, st.mu_b])
    L_t = np.linalg.cholesky(joint_cov(st, np))
    theta = hd.mvn_variates(rng, mu_t, L_t, (S_,))
    alpha, beta = theta[:, :2 * m], theta[:, 2 * m:]
    log_q = (hd.mvn_tril_log_pdf(lam, st.mu_lam, L_lam) + scale_log_density(sigma, p_s, st.C_sig, cfg.A_sigma**2, np)
             + hd.mvn_tril_log_pdf(theta, mu_t, L_t) + 2.0 * m * np.log(sigma / math.sqrt(m)))
    post = {"lam": lam, "sigma": sigma, "alpha_raw": alpha * math.sqrt(m) / sigma[:, None], "beta0": beta[:, 0]}
    s_fixed = cfg.s - cfg.J * cfg.T
    if s_fixed > 1:
        post["beta"] = beta[:, 1:s_fixed]
    if cfg.T > 0:
        tau = np.stack([sample_scale_host(rng, cfg.J - 2.0, st.C_tau[t], cfg.A_tau**2, (S_,))
                        for t in range(cfg.T)], axis=1)
        b = beta[:, s_fixed:].reshape(S_, cfg.J, cfg.T)
        post["tau"], post["b_raw"] = tau, b / tau[:, None, :]
        log_q += sum(scale_log_density(tau[:, t], cfg.J - 2.0, st.C_tau[t], cfg.A_tau**2, np) for t in range(cfg.T))
        log_q += cfg.J * np.sum(np.log(tau), axis=1)
    if cfg.likelihood == "gaussian":
        gamma = sample_scale_host(rng, n - 2.0, st.C_gam, cfg.A_gamma**2, (S_,))
        post["gamma"] = gamma
        log_q += scale_log_density(gamma, n - 2.0, st.C_gam, cfg.A_gamma**2, np)
    return post, log_q


def run(cfg: Config, data: Data, *, max_iter=1000, tol=1e-6, warm_start=3, step_max=1e4, backtrack=True,
        mu_lam_init=0.5, progress=None, key=None) -> Run:
    """Sweeps (``step``) from ``init`` (built on the host, ``init(..., xp=numpy)``) until the stopping rule (module
    docstring) or ``max_iter`` sweeps, through ``inference.loop.run_until_converged``; the VB is deterministic, so
    ``key`` only feeds the loop."""
    run_cfg = program_config(cfg)._replace(warm_start=int(warm_start), step_max=float(step_max),
                                           backtrack=bool(backtrack),
                                           mu_lam_init=tuple(float(v) for v in np.ravel(mu_lam_init)))
    k = kernel(run_cfg)
    key = jax.random.key(0) if key is None else key
    start = init(run_cfg, None, jax.tree.map(np.asarray, data), xp=np)
    return run_until_converged(k.init, k.step, data, key, StopRule(int(max_iter), float(tol)), chunk=CHUNK,
                               progress=progress, desc="ssgp vb", compiler_options=compiler_options(cfg),
                               init_state=jax.tree.map(lambda a: np.asarray(a)[None], start))


SMALL_SWEEP = 2**17   # Np m^2 up to which a sweep is short enough to compile the run for compile speed


def compiler_options(cfg: Config) -> dict:
    """XLA options of the run program: ``programs.ONE_SHOT`` (backend optimisation off) where a sweep is short,
    ``programs.OPTIMISED`` where it is long. A sweep's work grows as Np m^2 (the feature moments, O(Np m^2 d)):
    level 0 compiles the run program much faster and runs each sweep about twice as slowly, which pays while a fit's
    few dozen sweeps are short next to the compile (the demo's 256 x 10^2) and stops paying on large tables, whose
    hundreds of long sweeps are the fit's cost (benchmarks/results.md, "ssgp_opt_level")."""
    return programs.ONE_SHOT if cfg.n_chunks * cfg.chunk * cfg.m**2 <= SMALL_SWEEP else programs.OPTIMISED


def state_dataset(cfg, st):
    """The variational parameters as an xarray Dataset (stored in the tree for ``predict`` and for
    recomputing ``log_q`` and the bound from the tree), with the Jaakkola-Jordan points ``xi`` for logit and the
    moments of the scale factors (``scale_moments``, in NumPy)."""
    st = jax.tree.map(np.asarray, jax.device_get(st))
    moments = scale_moments(cfg, st, float(cfg.n), np)
    ds = {"mu_lam": (["input"], st.mu_lam), "Sig_lam": (["input", "input_"], st.Sig_lam),
          "mu_alpha": (["basis"], st.mu_a), "Sig_alpha": (["basis", "basis_"], st.Sig_a),
          "mu_beta": (["coef"], st.mu_b), "Sig_beta": (["coef", "coef_"], st.Sig_b),
          "Sig_alpha_beta": (["basis", "coef"], st.Sig_ab),
          "C_sigma": ((), st.C_sig), "C_tau": (["re_term"], st.C_tau), "C_gamma": ((), st.C_gam),
          "E_sigma": ((), moments["E_sigma"])}
    if cfg.likelihood == "gaussian":
        ds["E_gamma"] = ((), moments["E_gamma"])
        ds["E_gamma2"] = ((), moments["E_gamma2"])
    if cfg.T > 0:
        ds["E_tau"] = (["re_term"], moments["E_tau"])
    if cfg.likelihood == "logit":
        ds["xi"] = (["obs"], np.asarray(st.xi)[:cfg.n])  # the Jaakkola-Jordan points of the bound (``lower_bound``)
    return xr.Dataset({k: (dims, np.asarray(v)) for k, (dims, v) in ds.items()})


def scale_moments(cfg: Config, st, n, xp=jnp) -> dict:
    """The moments of q(sigma), q(gamma), q(tau) that ``state_dataset`` stores (``n`` observations; ``xp``:
    ``hfunction``'s array library)."""
    out = {"E_sigma": inv_moment(2.0 * cfg.m - 2.0, st.C_sig, cfg.A_sigma**2, -1.0, xp)}
    if cfg.likelihood == "gaussian":
        out["E_gamma"] = inv_moment(n - 2.0, st.C_gam, cfg.A_gamma**2, -1.0, xp)
        out["E_gamma2"] = inv_moment(n - 2.0, st.C_gam, cfg.A_gamma**2, -2.0, xp)
    if cfg.T > 0:
        out["E_tau"] = xp.stack([inv_moment(cfg.J - 2.0, c, cfg.A_tau**2, -1.0, xp) for c in st.C_tau])
    return out


def _check(options):
    """Ranges the constraint words cannot state."""
    if options["step_max"] < 1:
        raise ValueError(f"step_max: expected a number >= 1, got {options['step_max']!r}")
    if np.all(np.asarray(options["mu_lam_init"], dtype=float) == 0):
        raise ValueError(f"mu_lam_init: expected finite non-zero start values (mu_lam = 0 is a stationary point "
                         f"with a flat f, notes E17), got {options['mu_lam_init']!r}")


OPTIONS = {
    "max_iter": Option(2000, "positive_int", "most sweeps", tiny=30),
    "tol": Option(1e-7, "positive", "stop when |L_t - L_{t-1}| <= tol |L_t| and the lam mean has stopped moving"),
    "num_samples": Option(1000, "positive_int", "draws from q stored as the posterior", tiny=20),
    "warm_start": Option(3, "nonnegative_int", "first sweeps with q(lam) frozen (from mu_alpha = 0, notes E17)"),
    "step_max": Option(1e4, "positive", "largest over-relaxed NCVMP step on the lam mean (>= 1)"),
    "backtrack": Option(True, "bool", "adaptive step with backtracking (False: plain NCVMP, a = 1, may decrease)"),
    "mu_lam_init": Option(0.5, "real[]", "initial mean of q(lam), a scalar or one value per input (non-zero)"),
    "chunk_size": Option(None, "positive_int|None", "observations per chunk of the feature moments (None: auto)"),
    "factorisation": Option("joint", "string", "'joint': q(alpha, beta) one Gaussian block; 'mean_field': "
                            "q(alpha) q(beta), the paper's", choices=("joint", "mean_field")),
}


def fit_state(spec, data, hyper, options, key=None):
    """Run the VB on validated ``data``: (cfg, data arrays, ``inference.loop.Run``)."""
    cfg, arrays = setup(spec.inputs(data, hyper), hyper, LIKELIHOOD_OF[spec.name], options.get("chunk_size"),
                        options.get("factorisation", "joint"))
    res = run(cfg, arrays, max_iter=options["max_iter"], tol=options["tol"], warm_start=options["warm_start"],
              step_max=options["step_max"], backtrack=options["backtrack"], mu_lam_init=options["mu_lam_init"],
              progress=options.get("progress"), key=key)
    return cfg, arrays, res


@register_method("vb", kind="variational", models=MODELS, check=_check, options=OPTIONS)
def run_vb(ctx: FitContext) -> Draws:
    """Closed-form mean-field VB with NCVMP for q(lam) (Tan & Nott 2016; Lim 2016; notes §3)."""
    o = ctx.options
    cfg, arrays, res = fit_state(ctx.spec, ctx.data, ctx.hyper, o, ctx.key)
    post, log_q = draw(cfg, (ctx.seed, 2), res.state, o["num_samples"], cfg.n)
    info = res.info
    return Draws(
        posterior={k: np.asarray(v)[None] for k, v in post.items()}, sample_stats={"log_q": np.asarray(log_q)[None]},
        traces={"bound": info.objective, "step_size": info.step, "n_tries": info.n_tries},
        groups={"variational_parameters": state_dataset(cfg, res.state)},
        objective=res.objective, converged=res.converged, n_iter=res.n_iter,
        attrs={"n_backtracked_sweeps": int(np.sum(info.n_tries > 1))})
