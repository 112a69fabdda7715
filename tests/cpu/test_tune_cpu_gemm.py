"""CPU GEMM schedule tuning (library/gemm/tune.py): the rule-generated space, the learned correction, measurement
into the database (a second time measures nothing), and tuned schedules giving eager's results."""
import math

import pytest
import torch

from kiln.library.gemm.source import GemmSchedule, schedule_for
from kiln.library.gemm import op as cpu_gemm
from kiln.library.gemm import tune as tg
from kiln.tune.choices import Choices
from kiln.tune.ranking import spearman

pytestmark = pytest.mark.skipif(not cpu_gemm.available(), reason="no AVX2/AVX-512 compiler for kiln's kernels")
MACHINE = tg.Machine(l1=32 * 1024, l2=1024 * 1024, nr=32, tile_heights=(8, 12))


@pytest.mark.parametrize("m,k,n", [(64, 1024, 4096), (256, 3072, 768), (5, 7, 3), (1000, 2500, 96)])
def test_space_is_valid_and_holds_the_rule(m, k, n):
    space = tg.candidates(m, k, n, MACHINE)
    assert len(space) == len(set(space)) and schedule_for(m, k) in space  # (the rule for a small weight)
    for s in space:
        assert s.mr in MACHINE.tile_heights and s.mc % s.mr == 0 and 1 <= s.kc <= k
        assert -(-k // s.kc) * s.kc - k < -(-k // s.kc)  # equal K blocks (at most one short by the rounding)


def test_estimate_follows_the_costs_it_models():
    m, k, n = 256, 1024, 1024
    deep, shallow = GemmSchedule(mr=8, kc=1024, mc=256), GemmSchedule(mr=8, kc=128, mc=256)
    assert tg.estimate_s(deep, m, k, n, MACHINE) < tg.estimate_s(shallow, m, k, n, MACHINE)  # C reloaded per block
    ragged = GemmSchedule(mr=12, kc=1024, mc=264)  # 256 rows in 12-row tiles: 8 rows computed for nothing
    assert tg.estimate_s(deep, m, k, n, MACHINE) < tg.estimate_s(ragged, m, k, n, MACHINE)


def test_correction_learns_what_the_estimate_misses():
    """Synthetic 'measurements': the estimate times 1.3 for 12-row tiles and a cost of A blocks past L2.  Fitted
    on two problems, the corrected model ranks a third as those measurements would."""
    def measured(s, m, k, n):
        return tg.estimate_s(s, m, k, n, MACHINE) * (1.3 if s.mr == 12 else 1.0) * \
            math.exp(0.2 * s.mc * s.kc * 4 / MACHINE.l2)

    train = [(s, m, k, n, measured(s, m, k, n)) for m, k, n in ((64, 1024, 4096), (256, 768, 2304))
             for s in tg.candidates(m, k, n, MACHINE)]
    correction = tg.fit_correction(train, MACHINE)
    assert correction.samples == len(train)
    assert correction.weights[tg.FEATURES.index("tall_tile")] == pytest.approx(math.log(1.3), abs=0.05)
    m, k, n = 1024, 1024, 1024
    space = tg.candidates(m, k, n, MACHINE)
    truth = sorted(space, key=lambda s: measured(s, m, k, n))
    ranked = tg.rank(m, k, n, MACHINE, correction)
    assert ranked[0] == truth[0]
    assert ranked[:3] != sorted(space, key=lambda s: tg.estimate_s(s, m, k, n, MACHINE))[:3]  # it did learn
    assert sum(abs(ranked.index(s) - truth.index(s)) for s in space) <= len(space) // 2
    none = tg.fit_correction([], MACHINE)
    assert none.samples == 0 and none.factor(tg.features(space[0], MACHINE)) == 1.0


def test_tuning_measures_the_best_ranked_once(tmp_path, monkeypatch):
    choices = Choices(db_path=str(tmp_path / "tuning.sqlite"))
    calls = []

    def fake_measure(schedules, m, k, n):
        calls.append(list(schedules))
        return [0.001 * (1 + i) for i in range(len(schedules))][::-1]  # the last measured is fastest

    try:
        chosen = tg.schedule(96, 512, 256, tune=True, choices=choices, measure=fake_measure)
        space = tg.candidates(96, 512, 256, tg.Machine.here())
        assert len(calls) == 1 and len(calls[0]) == min(tg.MEASURED, len(space))  # the rule is in this space
        assert chosen == calls[0][-1]
        samples = [r for r in choices.db.records() if r.kind == tg.SAMPLE_KIND]
        assert len(samples) == len(calls[0])  # every timing is kept for the next fit
        again = tg.schedule(96, 512, 256, tune=True, choices=choices,
                            measure=lambda *a: pytest.fail("a tuned problem was measured again"))
        assert again == chosen
        # the service reported both: measured, then stored
        assert [(m.kind, m.how) for m in choices.schedules] == [(f"schedule:{tg.KIND}", "measured"),
                                                            (f"schedule:{tg.KIND}", "stored")]
        assert tg.schedule(96, 512, 257, tune=False, choices=choices) is None  # default mode: the rule
    finally:
        choices.close()


@pytest.mark.parametrize("mr,kc,mc", [(8, 100, 16), (12, 512, 24), (8, 37, 8)])
def test_any_schedule_of_the_space_computes_the_product(mr, kc, mc):
    gen = torch.Generator().manual_seed(mr + kc)
    x, w, b = torch.randn(50, 300, generator=gen), torch.randn(70, 300, generator=gen), torch.randn(70, generator=gen)
    got = torch.ops.kiln.linear_packed(x, cpu_gemm.pack_weight(w), b, 70, mr, kc, mc)
    ref = (x.double() @ w.double().T + b.double()).float()
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)


def test_spearman():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 1, 1], [1, 2, 3]) == 0.0


@pytest.mark.parametrize("m,k,n", [(128, 512, 256), (64, 384, 512)])
def test_cost_model_ranks_measured_small_kernels(m, k, n):
    """Real measurements on small products (a few ms in all): over schedules from very shallow K blocks and
    tiny A blocks up to the deep ones the rule picks - where the costs the model describes differ by up to ~2x -
    its ranking agrees with the measured times (Spearman >= 0.7; 0.86-0.96 in repeated runs on the dev box), and
    the best of its top 8 is within 5% of the best measured."""
    machine = tg.Machine.here()
    space = [GemmSchedule(mr=8, kc=kc, mc=mc) for kc in (16, 32, 64, 128, k) for mc in (8, 32, 128)]
    measured = tg._time_all(space, m, k, n)
    estimated = [tg.estimate_s(s, m, k, n, machine) for s in space]
    assert spearman(estimated, measured) >= 0.7, list(zip(space, measured, estimated))
    top = sorted(range(len(space)), key=lambda i: estimated[i])[:8]
    assert min(measured[i] for i in top) <= 1.05 * min(measured)


def test_a_product_too_big_for_the_budget_keeps_the_rule(tmp_path):
    from kiln import config
    choices = Choices(db_path=str(tmp_path / "tuning.sqlite"))
    try:
        with config.scope(tune_budget_s=0.001):
            assert tg.schedule(512, 512, 512, tune=True, choices=choices,
                               measure=lambda *a: pytest.fail("measured beyond the budget")) is None
    finally:
        choices.close()


def test_size_buckets_are_the_next_power_of_two():
    from kiln.ir.sym import Symbol, bucket, bucket_hint
    assert bucket_hint(37) == 37 and bucket_hint(Symbol("s0", 2, None, 37) * 2) == 128
    assert [bucket(m) for m in (1, 2, 3, 4, 5, 8, 9, 37, 64, 65, 512, 513)] == \
        [1, 2, 4, 4, 8, 8, 16, 64, 64, 128, 512, 1024]


def test_bucket_schedules_pickle_without_their_compiles_store(tmp_path):
    """A graph holding per-bucket schedules pickles (``kiln bisect``'s reproducers); unpickled it measures nothing."""
    import pickle
    from kiln import config
    from kiln.ir.sym import Symbol
    with config.scope(cache_dir=str(tmp_path)):
        choices = Choices()
        schedules = tg.BucketSchedules(Symbol("s0", 2, None, 37), 64, 32, True, choices,
                                       measure=lambda *a: pytest.fail("measured"))
        choices.db  # (open, as during a compile)
        args = pickle.loads(pickle.dumps(schedules.args()))
        choices.close()
        assert [a.field for a in args] == ["mr", "kc", "mc"]
        assert [a.at({"s0": 37}) for a in args] == [0, 0, 0]  # (no record: the rule)
