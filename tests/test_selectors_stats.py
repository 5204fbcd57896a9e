"""Statistical tests of the random selectors through the public Table API, with fixed seeds.

Chi-square statistics are compared with the 0.1% critical values (scipy is not a
dependency), so a correct selector fails one of these with probability ~0.001 per
seed; the seeds are fixed, so the outcome is reproducible."""

from statistics import NormalDist

import numpy as np
import pytest
from conftest import insert_scalars

import reprise as rp

# Upper 0.1% points of the chi-square distribution, by degrees of freedom.
CHI2_999 = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322,
            8: 26.124, 9: 27.877, 10: 29.588, 15: 37.697, 19: 43.820}


def chi_square(counts, probabilities):
    counts = np.asarray(counts, dtype=np.float64)
    expected = counts.sum() * np.asarray(probabilities, dtype=np.float64)
    assert expected.min() >= 5, "too few expected counts for a chi-square test"
    return float(((counts - expected) ** 2 / expected).sum())


def assert_fits(counts, probabilities):
    stat = chi_square(counts, probabilities)
    df = len(counts) - 1
    assert stat < CHI2_999[df], f"chi-square {stat:.2f} >= {CHI2_999[df]} (df={df}); counts {list(counts)}"


def counts_by_key(keys, drawn):
    keys, drawn = np.asarray(keys), np.asarray(drawn)
    order = np.argsort(keys)
    at = np.minimum(np.searchsorted(keys[order], drawn), len(keys) - 1)
    assert (keys[order][at] == drawn).all(), "a drawn key that is not among the items"
    return np.bincount(order[at], minlength=len(keys))


def weights(priorities, exponent):
    w = np.asarray(priorities, dtype=np.float64) ** exponent
    return w / w.sum()


def table(store, sampler, name="t", seed=0, **kwargs):
    return rp.Table(name, store, sampler=sampler, remover=rp.selectors.Fifo(), max_size=2000, seed=seed, **kwargs)


# --- Uniform ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_uniform_frequencies_fit_one_over_n(scalar_store, seed):
    t = table(scalar_store, rp.selectors.Uniform(), seed=seed)
    keys = insert_scalars(t, range(10))
    drawn = np.concatenate([t.sample(500).keys for _ in range(40)])
    assert_fits(counts_by_key(keys, drawn), np.full(10, 0.1))


def test_uniform_single_draws_fit_one_over_n(scalar_store):
    t = table(scalar_store, rp.selectors.Uniform(), seed=7)
    keys = insert_scalars(t, range(6))
    drawn = [int(t.sample(1).keys[0]) for _ in range(3000)]
    assert_fits(counts_by_key(keys, drawn), np.full(6, 1 / 6))


def test_uniform_frequencies_after_deletes_cover_only_remaining_items(scalar_store):
    t = table(scalar_store, rp.selectors.Uniform(), seed=3)
    keys = insert_scalars(t, range(20))
    t.delete(keys[::2])
    remaining = keys[1::2]
    drawn = t.sample(20000).keys
    assert set(drawn.tolist()) <= set(remaining.tolist())
    assert_fits(counts_by_key(remaining, drawn), np.full(10, 0.1))
    np.testing.assert_allclose(t.sample(10).probabilities, 0.1)


def test_uniform_remover_evicts_each_position_equally_often(scalar_store):
    t = rp.Table("u", scalar_store, remover=rp.selectors.Uniform(), max_size=5, seed=11)
    counts = np.zeros(5, dtype=np.int64)
    for _ in range(1500):
        t.reset()
        keys = insert_scalars(t, range(5)).tolist()
        insert_scalars(t, [5])
        (gone,) = set(keys) - {k for k, *_ in t.items()}
        counts[keys.index(gone)] += 1
    assert_fits(counts, np.full(5, 0.2))


# A +10% bias on one of 10 items is nearly invisible to the chi-square tests above (at 20k draws
# its non-centrality is ~16 against a 0.1% critical value of 27.9: power ~0.4). The test below
# looks at each item alone with 10x the draws: the largest per-item |z| of the counts against
# Binomial(N, 1/10), at a family-wise 0.1% level (Bonferroni over the items). At N = 200k such
# a bias moves its item's z by ~13, far past the 3.89 threshold (simulated power > 0.999; a
# correct sampler fails with probability ~0.001); the negative control shows the statistic
# rejecting numpy draws that carry exactly that bias.

BIAS_ITEMS, BIAS_DRAWS = 10, 200_000
Z_999 = NormalDist().inv_cdf(1 - 0.001 / (2 * BIAS_ITEMS))


def max_abs_z(counts, probabilities):
    """The largest |z| of per-item counts against their binomial expectations."""
    counts = np.asarray(counts, dtype=np.float64)
    p = np.broadcast_to(np.asarray(probabilities, dtype=np.float64), counts.shape)
    n = counts.sum()
    return float(np.max(np.abs(counts - n * p) / np.sqrt(n * p * (1 - p))))


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("history", ["fresh", "after deletes"])
def test_uniform_frequencies_show_no_bias_on_any_single_item(scalar_store, seed, history):
    t = table(scalar_store, rp.selectors.Uniform(), seed=seed)
    if history == "fresh":
        keys = insert_scalars(t, range(BIAS_ITEMS))
    else:  # deletes move items between slots; newer items fill the freed ones
        old = insert_scalars(t, range(15))
        t.delete(old[::3])
        new = insert_scalars(t, range(100, 105))
        t.delete(old[1::3])
        keys = np.concatenate([old[2::3], new])
    assert sorted(k for k, *_ in t.items()) == sorted(keys.tolist())
    drawn = np.concatenate([t.sample(BIAS_DRAWS // 4).keys for _ in range(4)])
    z = max_abs_z(counts_by_key(keys, drawn), 1 / BIAS_ITEMS)
    assert z < Z_999, f"an item's count is {z:.2f} standard deviations off 1/{BIAS_ITEMS} (threshold {Z_999:.2f})"


@pytest.mark.parametrize("biased", range(BIAS_ITEMS))
def test_single_item_statistic_rejects_a_ten_percent_bias(biased):
    """Negative control: draws where one item weighs 1.1 fail the test above."""
    w = np.ones(BIAS_ITEMS)
    w[biased] = 1.1
    drawn = np.random.default_rng(1000 + biased).choice(BIAS_ITEMS, size=BIAS_DRAWS, p=w / w.sum())
    z = max_abs_z(np.bincount(drawn, minlength=BIAS_ITEMS), 1 / BIAS_ITEMS)
    assert z >= Z_999, f"a +10% bias on item {biased} went unseen: max |z| {z:.2f} < {Z_999:.2f}"


# --- Prioritized ------------------------------------------------------------------------------------


@pytest.mark.parametrize("exponent", [0.6, 1.0, 1.5])
def test_prioritized_frequencies_fit_p_to_the_a_over_the_sum(scalar_store, exponent):
    priorities = [0.5, 1.0, 2.0, 4.0, 8.0, 3.0, 0.25]
    t = table(scalar_store, rp.selectors.Prioritized(exponent), seed=5)
    keys = insert_scalars(t, range(len(priorities)), priorities=priorities)
    drawn = np.concatenate([t.sample(1000).keys for _ in range(20)])
    assert_fits(counts_by_key(keys, drawn), weights(priorities, exponent))


def test_prioritized_frequencies_are_not_uniform(scalar_store):
    """The test has power: skewed priorities fail the uniform hypothesis by far."""
    priorities = [1.0, 2.0, 3.0, 4.0]
    t = table(scalar_store, rp.selectors.Prioritized(1.0), seed=6)
    keys = insert_scalars(t, range(4), priorities=priorities)
    drawn = t.sample(5000).keys
    assert chi_square(counts_by_key(keys, drawn), np.full(4, 0.25)) > 10 * CHI2_999[3]


def test_prioritized_frequencies_follow_priority_updates(scalar_store):
    t = table(scalar_store, rp.selectors.Prioritized(0.8), seed=8)
    keys = insert_scalars(t, range(8), priorities=1.0)
    new = [8.0, 1.0, 0.5, 3.0, 2.0, 6.0, 1.5, 4.0]
    assert t.update_priorities(keys, new) == 8
    drawn = t.sample(20000).keys
    assert_fits(counts_by_key(keys, drawn), weights(new, 0.8))


def test_prioritized_frequencies_over_many_items_fit_in_bins(scalar_store):
    rng = np.random.default_rng(0)
    priorities = rng.uniform(0.1, 10.0, size=1000)
    t = table(scalar_store, rp.selectors.Prioritized(0.7), seed=9)
    keys = insert_scalars(t, range(1000), priorities=priorities)
    drawn = np.concatenate([t.sample(5000).keys for _ in range(10)])
    p = weights(priorities, 0.7)
    # Group items into 10 bins of near-equal total probability.
    order = np.argsort(p)
    bins = np.minimum((np.cumsum(p[order]) * 10).astype(int), 9)
    bin_of = np.empty(1000, dtype=int)
    bin_of[order] = bins
    per_item = counts_by_key(keys, drawn)
    counts = np.bincount(bin_of, weights=per_item, minlength=10)
    expected = np.bincount(bin_of, weights=p, minlength=10)
    assert_fits(counts, expected)


def test_prioritized_remover_evicts_in_proportion_to_priority(scalar_store):
    priorities = [1.0, 2.0, 3.0, 4.0]
    t = rp.Table("p", scalar_store, remover=rp.selectors.Prioritized(1.0), max_size=4, seed=12)
    counts = np.zeros(4, dtype=np.int64)
    for _ in range(1500):
        t.reset()
        keys = insert_scalars(t, range(4), priorities=priorities).tolist()
        insert_scalars(t, [4], priorities=1.0)
        (gone,) = set(keys) - {k for k, *_ in t.items()}
        counts[keys.index(gone)] += 1
    assert_fits(counts, weights(priorities, 1.0))


# --- reported probabilities ---------------------------------------------------------------------------


@pytest.mark.parametrize("exponent", [0.0, 0.5, 1.0, 2.0])
def test_reported_probabilities_equal_p_to_the_a_over_the_sum(scalar_store, exponent):
    rng = np.random.default_rng(int(exponent * 10))
    priorities = rng.uniform(0.01, 5.0, size=50)
    if exponent > 0:
        priorities[::7] = 0.0  # weight 0: never drawn (0 ** 0 would be 1)
    t = table(scalar_store, rp.selectors.Prioritized(exponent), seed=1)
    keys = insert_scalars(t, range(50), priorities=priorities)
    expected = dict(zip(keys.tolist(), weights(priorities, exponent)))
    s = t.sample(2000)
    np.testing.assert_allclose(s.probabilities, [expected[k] for k in s.keys.tolist()], rtol=1e-12)
    assert all(expected[k] > 0 for k in s.keys.tolist())
    np.testing.assert_allclose(s.priorities, [priorities[keys.tolist().index(k)] for k in s.keys.tolist()])


def test_reported_probabilities_track_updates_and_deletes(scalar_store):
    t = table(scalar_store, rp.selectors.Prioritized(0.5), seed=2)
    priorities = np.array([1.0, 4.0, 9.0, 16.0])
    keys = insert_scalars(t, range(4), priorities=priorities)
    t.update_priorities(keys[:1], [25.0])
    t.delete(keys[1:2])
    live = {int(keys[0]): 25.0, int(keys[2]): 9.0, int(keys[3]): 16.0}
    total = sum(p ** 0.5 for p in live.values())  # 5 + 3 + 4
    s = t.sample(500)
    np.testing.assert_allclose(s.probabilities, [live[k] ** 0.5 / total for k in s.keys.tolist()], rtol=1e-12)
    assert set(s.keys.tolist()) == set(live)


def test_importance_weights_follow_reported_probabilities(scalar_store):
    t = table(scalar_store, rp.selectors.Prioritized(1.0), seed=4)
    insert_scalars(t, range(4), priorities=[1.0, 1.0, 2.0, 4.0])
    s = t.sample(200)
    w = (4 * s.probabilities) ** -1.0
    np.testing.assert_allclose(s.importance_weights(1.0), w / w.max())
    assert s.importance_weights(0.0).tolist() == [1.0] * 200
