"""The schedule registry: each schedule's maths in any array namespace, the rules the config asks
each class, and a new schedule added as one class and a registry line."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from attnlab.config import Config, TrainConfig, check_warmup
from attnlab.errors import ConfigError
from attnlab.schedules import SCHEDULES, Schedule
from attnlab.train.optimizer import make_schedule

TOTAL, WARMUP = 100, 10


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_numpy_float64_and_jax_float32_agree_to_float32_rounding(name):
    """The maths is one function of its namespace: numpy (the float64 references' tool) and
    jax.numpy (training's) give the same curve."""
    train = TrainConfig(schedule=name, learning_rate=1e-2, warmup_steps=WARMUP).decay()
    schedule = SCHEDULES[name](train.learning_rate, WARMUP, TOTAL, train.min_lr_ratio,
                               train.decay_fraction, train.cooldown, 64)
    steps = np.arange(TOTAL + 1)
    got = np.asarray(jax.vmap(make_schedule(train, TOTAL, d_model=64))(steps), np.float64)
    np.testing.assert_allclose(got, schedule.lr(steps, np, "float64"), rtol=2e-6, atol=0)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_branch_is_accepted_exactly_where_the_schedule_has_a_stable_phase(name):
    settings = dict(schedule=name, warmup_steps=WARMUP, branch_from="../trunk", branch_step=20)
    if SCHEDULES[name].branches:
        TrainConfig(**settings)
    else:
        with pytest.raises(ConfigError, match="^config.train.schedule: a cooldown branch"):
            TrainConfig(**settings)


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_a_warmup_longer_than_the_run_is_refused_where_the_schedule_asks_it_to_fit(name):
    train = TrainConfig(schedule=name, warmup_steps=TOTAL + 1)
    if SCHEDULES[name].warmup_within_run:
        with pytest.raises(ConfigError, match="^config.train.warmup_steps"):
            check_warmup(train, TOTAL)
    else:
        check_warmup(train, TOTAL)


@dataclasses.dataclass(frozen=True)
class Linear(Schedule):
    """Warmup, then a straight line from the peak to its floor: a schedule written for this
    test only, to show what adding one takes."""

    name = "linear_to_floor"
    decay_defaults = {"min_lr_ratio": 0.5, "decay_fraction": 0.2, "cooldown": "linear"}

    def lr(self, count, xp, dtype="float32"):
        t = xp.asarray(count, dtype)
        p = self.progress(t, self.warmup_steps, xp)
        decayed = self.peak + (self.floor - self.peak) * p
        return xp.where(t < self.warmup_steps, self.warmup(t, xp), decayed)


def test_a_new_schedule_is_one_class_and_a_registry_line(monkeypatch):
    monkeypatch.setitem(SCHEDULES, Linear.name, Linear)
    cfg = Config(train=TrainConfig(schedule=Linear.name, learning_rate=0.1, warmup_steps=WARMUP,
                                   steps=TOTAL))
    assert cfg.to_dict()["train"]["min_lr_ratio"] == 0.5  # its own default, saved with the run
    lr = jax.vmap(make_schedule(cfg.train, cfg.total_steps, 64))(jnp.arange(TOTAL + 1))
    assert float(lr[0]) == pytest.approx(0.01)
    assert float(lr[WARMUP]) == pytest.approx(0.1 * (1 - 0.5 / (TOTAL - WARMUP + 1)))
    assert float(lr[TOTAL]) == pytest.approx(0.05)
    with pytest.raises(ConfigError, match="^config.train.schedule"):
        TrainConfig(schedule="not_registered")
