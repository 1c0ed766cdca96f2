"""The ``gp_alps`` predictor of ``inference.predict(tree, new_data)``: from any method's posterior draws.

For draw s with latent weights u_j, mixing matrix H and noise variances sigma2, the latents at new inputs are
x_j(t*) = F*_j u_j with F* = ``zoo.gp_alps.predictive_factors(t*, t, kernels)`` (linear-periodic: the exact
feature map; other kernels: the Nystrom extension, i.e. the GP conditional mean of x_j(t*) given x_j at the
data), and f(t*) = H diag(b) x(t*). The switches b come from the draw when the tree holds them (``gibbs``:
joint draws; ``vbem``/``svi_concrete``: b ~ q(b)); the model itself sums them out (``nuts``, ``svi``), so then
the exact conditional P(b | u, H, sigma2, Y) over every pattern is used (Rao-Blackwellised: its mean and
covariance, ``zoo.gp_alps.switch_posterior``). Returned moments over the posterior (law of total variance):

    f_mean = E[f(t*)],   f_var = Var[f(t*)],   mean = f_mean,   var = f_var + E[sigma2_i]   (y* = f + noise).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from inference.prediction import register_predictor
from inference.trees import problem_of
from zoo import gp_alps as za


@jax.jit
def _conditional_moments(u, H, sig2, F, F_new, Y, configs, theta):
    """E[f* | draw] and Var[f* | draw] over b ~ P(b | u, H, sigma2, Y), both (S, p, n_new)."""

    def one(args):
        uu, hh, ss = args
        probs = za.switch_posterior(uu, hh, ss, F, Y, configs, theta)
        p_on = probs @ configs
        cov = configs.T @ (probs[:, None] * configs) - jnp.outer(p_on, p_on)      # Cov(b) (m, m)
        Xn = jnp.einsum("jnr,jr->jn", F_new, uu)
        W = hh[:, :, None] * Xn[None]                                             # (p, m, n_new)
        return (hh * p_on) @ Xn, jnp.einsum("pjn,jk,pkn->pn", W, cov, W)

    return jax.lax.map(one, (u, H, sig2), batch_size=64)


@register_predictor("gp_alps")
def predict(tree, new_data) -> dict:
    """Posterior predictive moments at ``new_data["t"]`` (n_new, d): ``mean`` and ``var`` of y* and ``f_mean``,
    ``f_var`` of the noiseless f(t*), each (n_new, p) (module docstring)."""
    _, data, hyper = problem_of(tree)
    if "t" not in new_data:
        raise ValueError("new_data: expected the new inputs as new_data['t'] (n_new, d)")
    t = np.asarray(data["t"], dtype=np.float64)
    t_new = np.asarray(new_data["t"], dtype=np.float64)
    if t_new.ndim != 2 or t_new.shape[1] != t.shape[1] or not np.isfinite(t_new).all():
        raise ValueError(f"new_data['t']: expected finite inputs of shape (n_new, {t.shape[1]}), got {t_new.shape}")
    kernels = za.resolve_kernels(hyper["kernels"], t.shape[1])
    F_new = za.predictive_factors(t_new, t, kernels, hyper["rank_tol"])
    post = tree["posterior"].dataset.transpose("chain", "draw", ...)
    flat = lambda a: np.asarray(a).reshape((-1, *np.shape(a)[2:]))
    u, H = flat(post["u"].values), flat(post["H"].values)
    p = H.shape[1]
    sig2 = flat(post["sigma2"].values) if "sigma2" in post else np.full((u.shape[0], p), float(hyper["sigma2"]))
    if "b" in post:
        b = flat(post["b"].values).astype(np.float64)
        f = np.einsum("spj,sjn->spn", H * b[:, None, :], np.einsum("jnr,sjr->sjn", F_new, u))
        cond_var = np.zeros_like(f)
    else:
        kw = za.model_inputs(data, hyper)
        f, cond_var = (np.asarray(a) for a in _conditional_moments(
            jnp.asarray(u), jnp.asarray(H), jnp.asarray(sig2), jnp.asarray(kw["F"]), jnp.asarray(F_new),
            jnp.asarray(kw["Y"]), jnp.asarray(kw["configs"]), jnp.asarray(kw["theta"])))
    f_mean = f.mean(0)
    f_var = f.var(0) + cond_var.mean(0)
    noise = sig2.mean(0)[:, None]
    return {"mean": f_mean.T, "var": (f_var + noise).T, "f_mean": f_mean.T, "f_var": f_var.T}
