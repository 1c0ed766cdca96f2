"""Closed-form mean-field VB (CAVI / VB-EM) for GP-ALPS with a TRUE Bernoulli q(b) (notes §3.2).

The paper (App. B) relaxes the switches to binary Concrete variables and estimates the ELBO by Monte
Carlo. That is unnecessary: the likelihood is Gaussian, b_j^2 = b_j, and under the mean field
q(u) q(H) q(b) q(tau) the triples (H_ij, b_j, x_j) are independent across j, so (notes §3.2)

    E_q ||y_i - f_i||^2 = Q_i = ||y_i - sum_j rho_j m_ij d_j||^2
                                + sum_j [rho_j (m_ij^2 + s_ij) E_j - rho_j^2 m_ij^2 ||d_j||^2]

with d_j = F_j mu_j = E[x_j], E_j = E||x_j||^2 = tr(F_j^T F_j (Sigma_j + mu_j mu_j^T)). Family (weight space,
x_j = F_j u_j): q(u_j) = N(mu_j, Sigma_j), q(H_ij) = N(m_ij, s_ij), q(b_j) = Bern(rho_j), and, when the noise
is learned, q(tau_i) = Gamma(a_i, b_i) for tau_i = 1/sigma2_i (prior InvGamma(a0, b0) on sigma2_i).

One sweep, per latent j in turn with R_i^(-j) = y_i - sum_{k != j} rho_k m_ik d_k (notes §3.2 steps 1-3,
E[tau_i] in place of 1/sigma_i^2):
 1. q(u_j): precision I + alpha_j F_j^T F_j, alpha_j = rho_j sum_i E[tau_i] (m_ij^2 + s_ij);
    mean = Sigma_j F_j^T (rho_j sum_i E[tau_i] m_ij R_i^(-j)) (2 x 2 for linear-periodic latents);
 2. q(H_.j): s_ij = (1/s + rho_j E[tau_i] E_j)^-1, m_ij = s_ij rho_j E[tau_i] d_j^T R_i^(-j);
 3. q(b_j): logit rho_j = logit theta_j + sum_i E[tau_i] (m_ij d_j^T R_i^(-j) - 1/2 (m_ij^2 + s_ij) E_j);
then 4. q(tau_i) = Gamma(a0 + n/2, b0 + Q_i / 2) (the conjugate version of the notes' M-step).
Each step maximises the ELBO exactly in its block, so the ELBO (computed after every sweep, in closed
form, no Monte Carlo) never decreases:

    ELBO = sum_i [n/2 (E log tau_i - log 2 pi) - E[tau_i] Q_i / 2] - sum_j KL(N(mu_j, Sigma_j) || N(0, I))
           - sum_ij KL(N(m_ij, s_ij) || N(0, s)) - sum_j KL(Bern(rho_j) || Bern(theta_j))
           - sum_i KL(q(tau_i) || p(tau_i)).

Spaces: the ELBO above is on the switch-augmented space (u, H, b, tau); the model (``zoo.gp_alps.model``) sums the
switches out, so ``log_q`` (``draw``) is the density of q(u) q(H) q(sigma2) at the draws of the model's sites
(u, H, sigma2 = 1/tau, with the Jacobian of that map); b is drawn from q(b) for display only. The ELBO of that
q on the marginal space is >= the ELBO above. Every parameter of q is stored in group ``variational``.

Run by ``inference.loop.run_until_converged`` (restarts vmapped, the highest final ELBO wins; stops when
the relative ELBO change of a sweep is <= ``tol``). Kernel shape: ``init(key, problem)``, ``step(key, state,
problem)`` with ``Info.objective`` = the ELBO after the sweep, ``draw(seed, state, n)`` (NumPy, on the host);
``kernel(learn)`` binds the static noise flag.

Initialisation (notes §3.2 "known behaviour"): rho = 1 and random non-zero means, since mu = m = 0 is a
fixed point and a latent whose rho has collapsed to 0 cannot switch back on. q(u) means start N(0, I),
q(H) means N(0, 0.01^2): with small H the first sweeps let each latent fit its own frequency before the
mixing weights grow. On the periodic mixture this start reaches the parsimonious optimum (one latent per
duplicate pair) with a higher ELBO than N(0, 0.1^2) or N(0, 1) starts, which stall at both duplicates on
(benchmarks/results.md, "lab notes from inference/").
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import xarray as xr
from jax.scipy.special import digamma, gammaln
from scipy import special

from inference import host_draws as hd
from inference import host_keys, programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.gp_alps.common import Problem, problem
from inference.loop import Run, StopRule, run_until_converged


class State(NamedTuple):
    mu: jax.Array        # (m, r) q(u) means
    Sigma: jax.Array     # (m, r, r) q(u) covariances
    mH: jax.Array        # (p, m) q(H) means
    sH: jax.Array        # (p, m) q(H) variances
    logit_rho: jax.Array  # (m,) q(b) logits
    a_tau: jax.Array     # (p,) q(tau) shapes (unused when the noise is fixed)
    b_tau: jax.Array     # (p,) q(tau) rates


class Info(NamedTuple):
    objective: jax.Array  # the ELBO after the sweep (closed form)
    rho: jax.Array        # (m,) q(b_j = 1)


class VBProblem(NamedTuple):
    """The loop's problem: the data arrays, the initial logit of q(b) and whether q(b) is updated."""

    data: Problem
    init_logit_rho: jax.Array
    update_switches: jax.Array


def _tau_moments(state, pb: Problem, learn):
    if learn:
        return state.a_tau / state.b_tau, digamma(state.a_tau) - jnp.log(state.b_tau)
    return 1.0 / pb.sigma2, -jnp.log(pb.sigma2)


def _moments(state, pb):
    D = jnp.einsum("jnr,jr->jn", pb.F, state.mu)                                   # (m, n) d_j
    GF = jnp.einsum("jnr,jns->jrs", pb.F, pb.F)
    E = jnp.einsum("jrs,jsr->j", GF, state.Sigma + jnp.einsum("jr,js->jrs", state.mu, state.mu))
    return D, E


def expected_sq_residual(state, pb):
    """Q_i = E_q ||y_i - f_i||^2 (notes §3.2), (p,)."""
    D, E = _moments(state, pb)
    rho = jax.nn.sigmoid(state.logit_rho)
    W = rho * state.mH                                                              # (p, m)
    R = pb.Y.T - W @ D
    dd = jnp.sum(D * D, axis=1)
    return jnp.sum(R * R, axis=1) + ((state.mH ** 2 + state.sH) * rho) @ E - (W ** 2) @ dd


def elbo(state, pb: Problem, learn):
    n, p = pb.Y.shape
    Etau, Elogtau = _tau_moments(state, pb, learn)
    Q = expected_sq_residual(state, pb)
    ell = jnp.sum(0.5 * n * (Elogtau - jnp.log(2 * jnp.pi)) - 0.5 * Etau * Q)
    r = state.mu.shape[1]
    _, logdet = jnp.linalg.slogdet(state.Sigma)
    kl_u = 0.5 * jnp.sum(jnp.trace(state.Sigma, axis1=1, axis2=2) + jnp.sum(state.mu ** 2, 1) - r - logdet)
    kl_h = jnp.sum(0.5 * jnp.log(pb.s / state.sH) + (state.sH + state.mH ** 2) / (2 * pb.s) - 0.5)
    lr, lt = state.logit_rho, pb.logit_theta
    log_r, log_1r = jax.nn.log_sigmoid(lr), jax.nn.log_sigmoid(-lr)
    log_t, log_1t = jax.nn.log_sigmoid(lt), jax.nn.log_sigmoid(-lt)
    rho = jnp.exp(log_r)
    kl_b = jnp.sum(rho * (log_r - log_t) + (1 - rho) * (log_1r - log_1t))
    out = ell - kl_u - kl_h - kl_b
    if learn:
        a, b = state.a_tau, state.b_tau
        kl_tau = jnp.sum((a - pb.a0) * digamma(a) - gammaln(a) + gammaln(pb.a0) + pb.a0 * (jnp.log(b) - jnp.log(pb.b0))
                         + a * (pb.b0 - b) / b)
        out = out - kl_tau
    return out


def init(key, problem: VBProblem, learn) -> State:
    """q(u) means N(0, I), q(H) means N(0, 0.01^2), every logit rho = ``problem.init_logit_rho`` (docstring)."""
    pb = problem.data
    m, n, r = pb.F.shape
    p = pb.Y.shape[1]
    k1, k2 = jax.random.split(key)
    vy = jnp.var(pb.Y, axis=0)
    return State(mu=jax.random.normal(k1, (m, r)), Sigma=jnp.broadcast_to(jnp.eye(r), (m, r, r)),
                 mH=0.01 * jax.random.normal(k2, (p, m)), sH=jnp.full((p, m), pb.s),
                 logit_rho=jnp.full((m,), 1.0) * problem.init_logit_rho,
                 a_tau=jnp.full((p,), pb.a0 + 0.5 * n), b_tau=pb.b0 + 0.5 * n * 0.1 * vy)


def step(key, state: State, problem: VBProblem, learn) -> tuple[State, Info]:
    """One CAVI sweep (steps 1-3 per latent, then q(tau)); returns the ELBO after the sweep.
    ``problem.update_switches`` False keeps q(b) fixed (with rho = 1: the plain LMM baseline, notes T10).
    Deterministic: ``key`` is unused."""
    pb, update_switches = problem.data, problem.update_switches
    m = pb.F.shape[0]
    Etau, _ = _tau_moments(state, pb, learn)
    D, _ = _moments(state, pb)
    rho0 = jax.nn.sigmoid(state.logit_rho)
    R0 = pb.Y.T - (rho0 * state.mH) @ D                                             # (p, n) full residual

    def body(j, carry):
        st, R = carry
        Fj, lam, V = pb.F[j], pb.lam[j], pb.V[j]
        dj_old = Fj @ st.mu[j]
        rho_j = jax.nn.sigmoid(st.logit_rho[j])
        Rj = R + rho_j * st.mH[:, j][:, None] * dj_old[None, :]                      # R^(-j)
        # 1. q(u_j)
        alpha = rho_j * jnp.sum(Etau * (st.mH[:, j] ** 2 + st.sH[:, j]))
        g = Fj.T @ (rho_j * jnp.sum((Etau * st.mH[:, j])[:, None] * Rj, axis=0))
        ev = 1.0 / (1.0 + alpha * lam)
        Sigma_j = (V * ev) @ V.T
        mu_j = Sigma_j @ g
        dj = Fj @ mu_j
        Ej = jnp.trace((V * lam) @ V.T @ (Sigma_j + jnp.outer(mu_j, mu_j)))
        # 2. q(H_.j)
        sH_j = 1.0 / (1.0 / pb.s + rho_j * Etau * Ej)
        proj = Rj @ dj                                                               # (p,) d_j^T R_i^(-j)
        mH_j = sH_j * rho_j * Etau * proj
        # 3. q(b_j) (corrected conditional, E3)
        c = jnp.sum(Etau * (mH_j * proj - 0.5 * (mH_j ** 2 + sH_j) * Ej))
        lr_j = jnp.where(update_switches, pb.logit_theta[j] + c, st.logit_rho[j])
        rho_new = jax.nn.sigmoid(lr_j)
        st = st._replace(mu=st.mu.at[j].set(mu_j), Sigma=st.Sigma.at[j].set(Sigma_j),
                         mH=st.mH.at[:, j].set(mH_j), sH=st.sH.at[:, j].set(sH_j),
                         logit_rho=st.logit_rho.at[j].set(lr_j))
        return st, Rj - rho_new * mH_j[:, None] * dj[None, :]

    state, _ = jax.lax.fori_loop(0, m, body, (state, R0))
    if learn:  # 4. q(tau_i), conjugate
        n = pb.Y.shape[0]
        state = state._replace(a_tau=jnp.full_like(state.a_tau, pb.a0 + 0.5 * n),
                               b_tau=pb.b0 + 0.5 * expected_sq_residual(state, pb))
    return state, Info(objective=elbo(state, pb, learn), rho=jax.nn.sigmoid(state.logit_rho))


@programs.cached(maxsize=4)
def kernel(learn: bool) -> Kernel:
    """``init``/``step`` for the loop with the static noise flag bound (one kernel per flag, so compiled runs are
    reused across fits)."""
    return Kernel(functools.partial(init, learn=learn), functools.partial(step, learn=learn))


def run(key, pb: Problem, learn, max_iter=200, tol=0.0, init_logit_rho=10.0, num_restarts=1, update_switches=True,
        progress=None) -> Run:
    """CAVI sweeps from ``init`` until the relative ELBO change is <= ``tol`` (0: ``max_iter`` sweeps unless the
    ELBO repeats exactly), ``num_restarts`` initialisations vmapped (keys ``split(key, num_restarts)``; one run
    starts from ``init(key)``); the run with the highest final ELBO wins
    (CAVI finds local optima, e.g. both duplicates on). ``inference.loop.Run`` (``info.objective`` the ELBO trace)."""
    k = kernel(bool(learn))
    vp = VBProblem(pb, np.asarray(float(init_logit_rho)), np.asarray(bool(update_switches)))   # host: no eager op
    # a single run starts from init(key) itself (as before the loop existed: the tests' measured optima)
    return run_until_converged(k.init, k.step, vp, key, StopRule(int(max_iter), float(tol), "relative"),
                               num_restarts=num_restarts, progress=progress, desc="gp_alps vbem",
                               start_from_key=num_restarts == 1)


def run_lmm(key, pb: Problem, learn, max_iter=200) -> Run:
    """The plain LMM baseline (b = 1 for every latent, notes §2.2): the same sweeps with q(b) clamped at
    rho = 1 - 1e-13 (logit 30)."""
    return run(key, pb, learn, max_iter, init_logit_rho=30.0, update_switches=False)


def predictive_moments(state: State, pb: Problem, learn, F_new):
    """Moment-matched Gaussian predictive of y at new inputs (``F_new`` (m, n_new, r), e.g. from
    ``zoo.gp_alps.predictive_factors``): mean sum_j rho_j m_ij d*_j and variance
    sum_j [rho_j (m_ij^2 + s_ij)(d*_j^2 + V*_j) - rho_j^2 m_ij^2 d*_j^2] + E[sigma2_i]; both (n_new, p).
    The closed-form predictive of q itself (used to compare with the LMM baseline, notes T10); the model's
    ``inference.predict`` works from any tree's draws (``inference.gp_alps.predict``)."""
    rho = jax.nn.sigmoid(state.logit_rho)
    d = jnp.einsum("jnr,jr->jn", F_new, state.mu)
    V = jnp.einsum("jnr,jrs,jns->jn", F_new, state.Sigma, F_new)
    mean = (rho * state.mH) @ d
    var = ((state.mH ** 2 + state.sH) * rho) @ (d ** 2 + V) - (rho * state.mH) ** 2 @ (d ** 2)
    noise = state.b_tau / (state.a_tau - 1.0) if learn else pb.sigma2
    return mean.T, (var + noise[:, None]).T


def draw(seed, state: State, num_samples: int, learn):
    """``num_samples`` draws of (u, H, sigma2, b) from q and log q at each (model sites u, H, sigma2, constrained
    space), in NumPy from ``np.random.default_rng(seed)`` (``inference.host_draws``: a one-shot job, not worth
    compiling). q(u_j) = N(mu_j, L_j L_j^T) with L_j = chol(Sigma_j) (no jitter: log q must be the density of
    the stored q(u)); q(H_ij) = N(mH_ij, sH_ij); b_j ~ Bern(rho_j) (display only: the model sums the switches
    out); sigma2_i = 1/tau_i, tau_i ~ Gamma(a_tau_i, rate b_tau_i), so log q(sigma2) = log q_tau(1/sigma2)
    - 2 log sigma2."""
    rng = np.random.default_rng(seed)
    st = jax.tree.map(np.asarray, jax.device_get(state))
    S = int(num_samples)
    L = np.linalg.cholesky(st.Sigma)
    u = hd.mvn_variates(rng, st.mu, L, (S,))                                        # (S, m, r)
    sd = np.sqrt(st.sH)
    H = st.mH + sd * rng.standard_normal((S, *st.mH.shape))                         # (S, p, m)
    b = (rng.random((S, st.logit_rho.shape[0])) < special.expit(st.logit_rho)).astype(np.int32)
    log_q = hd.mvn_tril_log_pdf(u, st.mu, L).sum(1) + hd.normal_log_pdf(H, st.mH, sd).sum((1, 2))
    out = {"u": u, "H": H, "b": b}
    if learn:
        tau = np.exp(hd.log_gamma_variates(rng, st.a_tau, (S, st.a_tau.shape[0]))) / st.b_tau
        sigma2 = 1.0 / tau
        log_q = log_q + (hd.gamma_log_pdf(tau, st.a_tau, st.b_tau) - 2.0 * np.log(sigma2)).sum(1)
        out["sigma2"] = sigma2
    return out, log_q


def q_dataset(state: State, learn, rho=None) -> xr.Dataset:
    """Group ``variational``: every parameter of q, so that ``log_q`` and the ELBO can be recomputed from the
    tree: mu (latent, rank), Sigma (latent, rank, rank_bis) of q(u_j); mH, sH (output, latent) of q(H_ij);
    rho (latent) = q(b_j = 1); a_tau, b_tau (output) of q(tau_i) = Gamma(shape, rate), i.e. q(sigma2_i) =
    InvGamma(a_tau, b_tau) (only when the noise is learned)."""
    ds = {"mu": (("latent", "rank"), np.asarray(state.mu)),
          "Sigma": (("latent", "rank", "rank_bis"), np.asarray(state.Sigma)),
          "mH": (("output", "latent"), np.asarray(state.mH)), "sH": (("output", "latent"), np.asarray(state.sH)),
          "rho": (("latent",), np.asarray(special.expit(np.asarray(state.logit_rho)) if rho is None else rho))}
    if learn:
        ds["a_tau"], ds["b_tau"] = (("output",), np.asarray(state.a_tau)), (("output",), np.asarray(state.b_tau))
    return xr.Dataset(ds)


@register_method("vbem", kind="variational", models=("gp_alps",), options={
    "max_iter": Option(200, "positive_int", "CAVI sweeps at most", tiny=20),
    "tol": Option(1e-8, "positive", "stop when a sweep changes the ELBO by <= tol x |ELBO|"),
    "num_samples": Option(1000, "positive_int", "draws from the fitted q", tiny=20),
    "init_logit_rho": Option(10.0, "real", "initial logit of q(b_j = 1) (10: every latent on, notes §3.2)"),
    "num_restarts": Option(4, "positive_int", "independent initialisations (vmapped); the highest final ELBO wins",
                           tiny=2),
})
def run_vbem(ctx: FitContext) -> Draws:
    """Closed-form mean-field VB-EM with Bernoulli q(b) (notes §3.2); deterministic ELBO per sweep."""
    o = ctx.options
    pb, learn = problem(ctx)
    k_init, _ = host_keys.parts(ctx.key)
    r = run(k_init, pb, learn, o["max_iter"], o["tol"], o["init_logit_rho"], o["num_restarts"], progress=o["progress"])
    state = jax.device_get(r.state)
    draws, log_q = draw((ctx.seed, 2), state, int(o["num_samples"]), bool(learn))
    rho = special.expit(np.asarray(state.logit_rho))
    return Draws(posterior={k: np.asarray(v)[None] for k, v in draws.items()},
                 sample_stats={"log_q": np.asarray(log_q)[None]},
                 traces={"elbo": np.asarray(r.info.objective), "rho": np.asarray(r.info.rho)},
                 dims={"b": ["latent"], "rho": ["iteration", "latent"]},
                 groups={"variational": q_dataset(state, learn, rho)},
                 attrs={"rho": rho.tolist(), "objective_per_restart": np.asarray(r.objective_per_restart).tolist(),
                        "q_H_mean": np.asarray(state.mH).tolist(), "q_H_var": np.asarray(state.sH).tolist()},
                 objective=r.objective, converged=r.converged, n_iter=r.n_iter)
