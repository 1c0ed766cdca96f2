"""Gibbs samplers for GP-ALPS (paper App. C, corrected; notes §3.3-§3.4), in weight space x_j = F_j u_j.

One sweep (``collapsed=False``, the paper's uncollapsed sampler with erratum E3 fixed), per latent j in
turn with R_i^(-j) = y_i - sum_{k != j} H_ik b_k x_k and tau_i = 1 / sigma2_i:

 * b_j | X, H, b_-j, Y (App. C.3): P(b_j = 1) = sigmoid(logit theta_j + c_j),
   c_j = sum_i tau_i [H_ij x_j^T R_i^(-j) - 1/2 H_ij^2 ||x_j||^2]            (the paper's theta e^c/(e^c + theta)
   is mis-normalised, E3; ``paper_conditional=True`` reproduces it for the regression test only);
 * u_j | b_j, H, X_-j, Y: if b_j = 1, N(P_j^-1 F_j^T z_j, P_j^-1) with P_j = I + w_j F_j^T F_j,
   w_j = sum_i tau_i H_ij^2, z_j = sum_i tau_i H_ij R_i^(-j); else the prior N(0, I). (A per-latent block of
   the paper's joint C.1 draw: a valid Gibbs scan, and O(r^3) instead of O((mn)^3).)

``collapsed=True`` replaces the two steps by the exact block move G1 (notes §3.4): (b_j, u_j) jointly with
u_j integrated out of the switch update,
   log BF_j = 1/2 q^T P_j^-1 q - 1/2 log|P_j|,  q = F_j^T z_j,    b_j ~ Bern(sigmoid(logit theta_j + log BF_j)),
then u_j from its conditional as above. With V_j diag(lam_j) V_j^T = F_j^T F_j precomputed every solve
is diagonal (O(r^2) per latent).

Then H | X, b, Y row by row (App. C.2 with E6 fixed): h_i ~ N(S_i D X y_i tau_i, S_i),
S_i = (I/s + tau_i D X X^T D)^-1; and, when the noise is learned, tau_i ~ Gamma(a0 + n/2, b0 + ||y_i - f_i||^2 / 2)
(the conjugate step for the model's InvGamma(a0, b0) prior on sigma2_i).

Scale move (``rescale=True``): f depends on (H_.j, u_j) only through H_.j u_j^T, so the posterior has a ridge
(H_.j, u_j) -> (c H_.j, u_j / c) along which the alternating u | H, H | u draws crawl (notes §2.4: the demo chain
needed 120,000 sweeps for ESS 400 on |H| of an active latent). The generalised Gibbs step of Liu & Sabatti (2000)
moves along it: with the Haar measure dc/|c| and Jacobian |c|^(p - r), t = c^2 has the density
   p(t) ∝ t^(lam - 1) exp(-A_j t - B_j / t),  lam = (p - r)/2,  A_j = ||H_.j||^2 / (2 s),  B_j = ||u_j||^2 / 2
(a generalised inverse Gaussian; the likelihood is constant on the ridge). It is drawn by one independence
Metropolis-Hastings step in v = log t (log-concave) from the Laplace approximation at its mode,
v* = log t*, A_j t*^2 - lam t* - B_j = 0, sd (A_j t* + B_j / t*)^(-1/2); whose Gaussian tails are heavier than the
target's doubly exponential ones. Then c's sign is flipped with probability 1/2 (the prior's c = -1 symmetry). All
latents at once: the move of one leaves the others' conditionals unchanged.

Swap move G3 (``swap=True``): latents with identical kernels are exchangeable, so permuting their whole
(b_j, H_.j, u_j) at random leaves the target invariant (always accepted). Without it the chain keeps
whichever duplicate it switched on first (notes §3.4, E12).

Kernel shape: ``kernel(Config(learn, collapsed, swap, paper_conditional, rescale))`` gives ``init(key, problem)`` and
``step(key, state, problem)`` (``problem`` the data ``Problem``) with ``Info.objective`` the log joint
log p(Y, u, H, b, sigma2) after the sweep. The flags are static, so a sweep computes only the moves it makes;
one compilation per variant, built once (``inference.programs.cached``). Chains, warm-up and thinning:
``inference.loop.sample_chains``.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from inference import programs
from inference._methods import Draws, FitContext, Option, register_method
from inference.base import Kernel
from inference.gp_alps.common import Problem, paper_switch_logit, problem, switch_logit
from inference.loop import sample_chains
from inference.uniforms import (
    GAMMA_UNIFORMS,
    box_muller,
    log_gamma_from_uniforms,
    open_uniforms,
    split_uniforms,
    uniforms_size,
)


class State(NamedTuple):
    u: jax.Array      # (m, r)
    H: jax.Array      # (p, m)
    b: jax.Array      # (m,) float 0/1
    tau: jax.Array    # (p,) noise precisions


class Info(NamedTuple):
    objective: jax.Array  # log p(Y, u, H, b, sigma2) (sigma2's prior only when learned)
    n_on: jax.Array
    log_lik: jax.Array    # log p(Y | u, H, b, sigma2)


class Config(NamedTuple):
    """The sampler's static configuration."""

    learn: bool                      # sample the noise precisions (InvGamma prior on sigma2)
    collapsed: bool = True           # G1 switch moves with u_j integrated out
    swap: bool = True                # the G3 move
    paper_conditional: bool = False  # the paper's mis-normalised C.3 conditional (regression test only)
    rescale: bool = True             # the scale move along the (H_.j, u_j) ridge


class SweepRandoms(NamedTuple):
    """Every random number of one sweep, made from one block of uniforms (``_sweep_randoms``; ``inference.uniforms``:
    each ``jax.random`` call would compile its own Threefry loop, ``jax.random.gamma`` several). ``m`` latents,
    ``r`` basis columns, ``p`` outputs."""

    switch: jax.Array          # (m,) uniform: b_j = [switch_j < P(b_j = 1 | ...)]
    u: jax.Array               # (m, r) normal: u_j's draw
    H: jax.Array               # (p, m) normal: H's rows
    gamma: jax.Array           # (GAMMA_UNIFORMS, p) uniform: the noise precisions' Gamma variates
    scale_normal: jax.Array    # (m,) normal: the scale move's proposal
    scale_accept: jax.Array    # (m,) uniform: its acceptance
    scale_sign: jax.Array      # (m,) uniform: its sign
    swap: jax.Array            # (m,) uniform: the G3 permutation


def _sweep_randoms(key, m: int, r: int, p: int) -> SweepRandoms:
    """One sweep's random numbers from one ``open_uniforms`` call, the normals by Box-Muller (two uniforms each)."""
    shapes = {"switch": (m,), "u": (2, m, r), "H": (2, p, m), "gamma": (GAMMA_UNIFORMS, p), "scale_normal": (2, m),
              "scale_accept": (m,), "scale_sign": (m,), "swap": (m,)}
    parts = split_uniforms(open_uniforms(key, (uniforms_size(shapes.values()),)), shapes.values())
    return SweepRandoms(**{name: box_muller(part[0], part[1]) if name in ("u", "H", "scale_normal") else part
                           for name, part in zip(shapes, parts, strict=True)})


def _latents(pb, u):
    return jnp.einsum("jnr,jr->jn", pb.F, u)


@programs.cached(maxsize=16)
def kernel(config: Config) -> Kernel:
    """``init``/``step`` for this configuration's flags (module docstring)."""
    learn, collapsed, swap, paper_conditional, rescale = config

    def init(key, pb: Problem) -> State:
        m, n, r = pb.F.shape
        p = pb.Y.shape[1]
        w = open_uniforms(key, (2, m * r + p * m))
        z = box_muller(w[0], w[1])
        tau = 1.0 / (0.1 * jnp.var(pb.Y, axis=0)) if learn else 1.0 / pb.sigma2
        return State(u=z[:m * r].reshape(m, r), H=jnp.sqrt(pb.s) * z[m * r:].reshape(p, m), b=jnp.ones(m), tau=tau)

    def switch_logit_of(pb, j, tau, hj, Rj, xj, qt, prec):
        if collapsed:  # G1: u_j integrated out of the switch update
            return pb.logit_theta[j] + 0.5 * jnp.sum(qt ** 2 / prec) - 0.5 * jnp.sum(jnp.log(prec))
        # App. C.3, corrected (E3) unless paper_conditional
        c = jnp.sum(tau * (hj * (Rj @ xj) - 0.5 * hj ** 2 * (xj @ xj)))
        return (paper_switch_logit if paper_conditional else switch_logit)(pb.logit_theta[j], c)

    def step(key, state: State, pb: Problem) -> tuple[State, Info]:
        """One sweep: switches and latents per j, then H rows, then noise precisions, then the scale and swap
        moves. Its random numbers come from one draw (``_sweep_randoms``)."""
        m, n, r = pb.F.shape
        p = pb.Y.shape[1]
        rand = _sweep_randoms(key, m, r, p)
        tau = state.tau
        X = _latents(pb, state.u)
        R0 = pb.Y.T - (state.H * state.b) @ X

        def body(j, carry):
            st, R = carry
            Fj, lam, V = pb.F[j], pb.lam[j], pb.V[j]
            xj = Fj @ st.u[j]
            hj = st.H[:, j]
            Rj = R + st.b[j] * hj[:, None] * xj[None, :]
            w = jnp.sum(tau * hj ** 2)
            z = jnp.sum((tau * hj)[:, None] * Rj, axis=0)
            qt = V.T @ (Fj.T @ z)                                          # eigen coordinates of F_j^T z_j
            prec = 1.0 + w * lam
            logit = switch_logit_of(pb, j, tau, hj, Rj, xj, qt, prec)
            bj = (rand.switch[j] < jax.nn.sigmoid(logit)).astype(R.dtype)
            eps = rand.u[j]
            post = V @ (qt / prec + eps / jnp.sqrt(prec))
            uj = jnp.where(bj > 0, post, eps)
            xj_new = Fj @ uj
            st = st._replace(u=st.u.at[j].set(uj), b=st.b.at[j].set(bj))
            return st, Rj - bj * hj[:, None] * xj_new[None, :]

        state, R = jax.lax.fori_loop(0, m, body, (state, R0))
        # H | X, b, Y, row by row (App. C.2 with E6)
        XD = _latents(pb, state.u) * state.b[:, None]                      # (m, n) = D X
        G = XD @ XD.T
        prec = jnp.eye(m)[None] / pb.s + tau[:, None, None] * G[None]      # (p, m, m)
        L = jnp.linalg.cholesky(prec)
        rhs = tau[:, None] * (pb.Y.T @ XD.T)                               # (p, m)
        mean = jax.scipy.linalg.cho_solve((L, True), rhs[..., None])[..., 0]
        H = mean + jax.scipy.linalg.solve_triangular(jnp.swapaxes(L, 1, 2), rand.H[..., None], lower=False)[..., 0]
        resid = pb.Y.T - H @ XD
        sq = jnp.sum(resid ** 2, axis=1)
        if learn:
            tau = jnp.exp(log_gamma_from_uniforms(rand.gamma, jnp.broadcast_to(pb.a0 + 0.5 * n, (p,)))) / (
                pb.b0 + 0.5 * sq)
        state = state._replace(H=H, tau=tau)
        if rescale:
            state = _rescale(state, pb.s, rand.scale_normal, rand.scale_accept, rand.scale_sign)
        if swap:
            state = _swap(rand.swap, state, pb.group)
        log_lik = jnp.sum(0.5 * n * jnp.log(tau / (2 * jnp.pi)) - 0.5 * tau * sq)
        return state, Info(objective=log_lik + _log_prior(state, pb, learn), n_on=jnp.sum(state.b), log_lik=log_lik)

    return Kernel(init, step)


def _log_prior(state: State, pb: Problem, learn):
    """log p(u) + log p(H) + log p(b) [+ log InvGamma(sigma2 | a0, b0) when the noise is learned]."""
    norm = jax.scipy.stats.norm.logpdf
    lp = jnp.sum(norm(state.u)) + jnp.sum(norm(state.H, 0.0, jnp.sqrt(pb.s)))
    lp = lp + jnp.sum(state.b * jax.nn.log_sigmoid(pb.logit_theta)
                      + (1 - state.b) * jax.nn.log_sigmoid(-pb.logit_theta))
    sigma2 = 1.0 / state.tau
    log_ig = pb.a0 * jnp.log(pb.b0) - jax.scipy.special.gammaln(pb.a0) - (pb.a0 + 1) * jnp.log(sigma2) - pb.b0 / sigma2
    return lp + jnp.sum(log_ig) if learn else lp


def _rescale(state: State, s, normal, accept_u, sign_u) -> State:
    """The scale move (module docstring): (H_.j, u_j) -> (c_j H_.j, u_j / c_j) for every latent j, c_j^2 by one
    independence Metropolis-Hastings step from the Laplace approximation of its GIG(lam, 2 B_j, 2 A_j) law in
    log scale, c_j's sign uniform. ``normal``, ``accept_u``, ``sign_u``: (m,) standard normal and two uniform
    (0, 1) draws."""
    p, r = state.H.shape[0], state.u.shape[1]
    A = jnp.sum(state.H ** 2, axis=0) / (2.0 * s)                     # (m,)
    B = 0.5 * jnp.sum(state.u ** 2, axis=1)
    lam = 0.5 * (p - r)
    root = jnp.sqrt(lam ** 2 + 4.0 * A * B)
    # the positive root of A t^2 - lam t - B = 0, in the form without cancellation for the sign of lam
    t_mode = (lam + root) / (2.0 * A) if lam >= 0 else 2.0 * B / (root - lam)
    v_mode = jnp.log(t_mode)
    sd = jax.lax.rsqrt(A * t_mode + B / t_mode)
    v = v_mode + sd * normal                                           # proposed log c^2 (current: 0)

    def log_target(x):
        return lam * x - A * jnp.exp(x) - B * jnp.exp(-x)

    def log_proposal(x):
        return -0.5 * ((x - v_mode) / sd) ** 2

    log_accept = log_target(v) - log_target(0.0) - log_proposal(v) + log_proposal(0.0)
    c = jnp.where(sign_u < 0.5, -1.0, 1.0) * jnp.where(jnp.log(accept_u) < log_accept, jnp.exp(0.5 * v), 1.0)
    return state._replace(H=state.H * c, u=state.u / c[:, None])


def _swap(score, state, group):
    """G3: a uniformly random permutation within every group of identical latents (always accepted); ``score``
    (m,) uniform (0, 1) draws."""
    m = group.shape[0]
    order_idx = jnp.argsort(group * 2.0 + jnp.arange(m) / m)           # positions, grouped, by index
    order_rand = jnp.argsort(group * 2.0 + score)                      # members, grouped, at random
    perm = jnp.zeros(m, dtype=jnp.int32).at[order_idx].set(order_rand.astype(jnp.int32))
    return state._replace(u=state.u[perm], b=state.b[perm], H=state.H[:, perm])


def run(key, pb: Problem, learn, num_chains=2, num_warmup=1000, num_samples=2000, collapsed=True, swap=True,
        paper_conditional=False, thinning=1, progress=None, rescale=True):
    """``num_chains`` chains through ``inference.loop.sample_chains``, one after another in each step
    (``chains="map"``: a sweep is a sequence of small per-latent updates, which batching the chains does not speed
    up, while the batched program compiled slower; benchmarks/results.md, "compile_cold" session 17); returns
    (State, Info) with leading (chain, draw) axes, warm-up dropped."""
    k = kernel(Config(bool(learn), bool(collapsed), bool(swap), bool(paper_conditional), bool(rescale)))
    kept, _ = sample_chains(k.init, k.step, pb, key, num_chains=num_chains, num_warmup=num_warmup,
                            num_samples=num_samples, thinning=thinning, progress=progress, desc="gp_alps gibbs",
                            chains="map")
    return kept


@register_method("gibbs", kind="sampler", models=("gp_alps",), options={
    "num_warmup": Option(1000, "nonnegative_int", "sweeps dropped at the start of every chain", tiny=20),
    "num_samples": Option(2000, "positive_int", "sweeps kept per chain", tiny=20),
    "num_chains": Option(2, "positive_int", "independent chains (run one after another in each sweep)"),
    "thinning": Option(1, "positive_int", "keep every thinning-th sweep"),
    "collapsed": Option(True, "bool", "G1 switch moves with u_j integrated out (False: the paper's App. C sweep)"),
    "swap": Option(True, "bool", "the G3 move permuting exchangeable (identical-kernel) latents"),
    "rescale": Option(True, "bool", "the scale move (H_.j, u_j) -> (c H_.j, u_j / c) along the likelihood's ridge"),
})
def run_gibbs(ctx: FitContext) -> Draws:
    """Gibbs sampler over (b, u, H, sigma2): collapsed G1 switch moves (default) or the paper's App. C
    uncollapsed sweep with the corrected Bernoulli conditional (E3), plus the scale move along the H-u ridge and the
    G3 swap move."""
    o = ctx.options
    pb, learn = problem(ctx)
    states, infos = run(ctx.key, pb, learn, o["num_chains"], o["num_warmup"], o["num_samples"], o["collapsed"],
                        o["swap"], thinning=o["thinning"], progress=o["progress"], rescale=o["rescale"])
    post = {"u": np.asarray(states.u), "H": np.asarray(states.H), "b": np.asarray(states.b).astype(np.int8)}
    if learn:
        post["sigma2"] = 1.0 / np.asarray(states.tau)
    stats = {"n_on": np.asarray(infos.n_on), "log_lik_given_b": np.asarray(infos.log_lik)}
    return Draws(posterior=post, sample_stats=stats, dims={"b": ["latent"]})
