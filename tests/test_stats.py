"""Equivalence tests (TOST) of paired differences, against scipy's one-sided t-tests."""

from boltzmann_attention.experiments.stats import paired


def test_tost_is_the_90_percent_interval_inside_the_margin():
    """TOST at 0.05 rejects non-equivalence exactly when the 90% t interval lies inside (-margin, margin); its
    p-value is the larger one-sided p-value, checked against scipy's one-sided one-sample t-tests."""
    import numpy as np
    from scipy.stats import t, ttest_1samp

    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(2, 8))
        d = rng.normal(rng.uniform(-20, 20), rng.uniform(0.5, 15), size=n)
        c = paired({s: float(x) for s, x in enumerate(d)}, {s: 0.0 for s in range(n)}, lambda a, b: a - b)
        margin = 15.0
        lower = ttest_1samp(d, -margin, alternative="greater").pvalue
        upper = ttest_1samp(d, margin, alternative="less").pvalue
        assert abs(c.tost_p(margin) - max(lower, upper)) < 1e-12
        half = t.ppf(0.95, n - 1) * d.std(ddof=1) / np.sqrt(n)
        assert c.equivalent(margin) == (d.mean() - half > -margin and d.mean() + half < margin)
    one = paired({0: 1.0}, {0: 0.0}, lambda a, b: a - b)
    assert one.tost_p(15.0) is None and not one.equivalent(15.0)
