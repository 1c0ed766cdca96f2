data { int<lower=0> J; array[J] real y; }
parameters { real mu; vector[J] theta; cholesky_factor_corr[2] L; }
model { mu ~ normal(0, 5); theta ~ normal(mu, 1); y ~ normal(theta, 1); L ~ lkj_corr_cholesky(2); }
