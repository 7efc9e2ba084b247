"""The rl reward (docs/rl-scoring.md, "The reward") against a hand-computed row and a plain
float32 implementation written here, one row and one venue at a time."""

from __future__ import annotations

import math

import numpy as np
import pytest

from devkit.tiny_policies import validation_arrays
from modules.rl.reward import average_reward, rewards

F32 = np.float32


def plain_reward(action: np.ndarray, info_row: np.ndarray) -> np.float32:
    """The protocol read literally: scalars, loops, every step in float32."""
    qty, duration = F32(info_row[0]), F32(info_row[1])
    venues = len(action)
    positive = [max(F32(a), F32(0)) for a in action]
    total = F32(0)
    for p in positive:
        total = F32(total + p)
    probs = [F32(0)] * venues if total == 0 else [F32(p / total) for p in positive]
    window = F32(F32(1) + F32(F32(0.6) * F32(F32(1) - F32(np.exp(F32(F32(-0.9) * duration))))))
    gained = F32(0)
    for v in range(venues):
        fill_rate, rebate, punish, latest = (F32(c) for c in info_row[3 + 4 * v : 7 + 4 * v])
        alloc = F32(probs[v] * qty)
        capacity = F32(F32(max(latest, F32(0)) * window) * min(max(fill_rate, F32(0)), F32(1)))
        filled = min(alloc, capacity)
        unfilled = F32(alloc - filled)
        gained = F32(gained + F32(F32(F32(rebate / F32(10000)) * filled) + F32(punish * unfilled)))
    return F32(gained / F32(np.log1p(qty)))


def test_one_row_by_hand():
    # qty 100 over two venues, actions 3 and -1: all of it goes to venue 0.
    # window = 1 + 0.6 * (1 - e^-0.9); capacity_0 = 50 * window * 0.5 (fill_rate 0.5)
    # filled_0 = min(100, capacity_0); venue 1 gets nothing.
    info = np.array([[100, 1, 7, 0.5, 20, -0.01, 50, 1, 99, -1, 1000]], dtype=np.float32)
    window = 1 + 0.6 * (1 - math.exp(-0.9))
    capacity = 50 * window * 0.5
    filled, unfilled = min(100, capacity), 100 - min(100, capacity)
    expected = (20 / 10000 * filled + -0.01 * unfilled) / math.log1p(100)
    got = rewards(np.array([[3, -1]], dtype=np.float32), info)
    assert got.dtype == np.float32
    assert got[0] == pytest.approx(expected, rel=1e-6)


def test_many_rows_equal_the_plain_float32_implementation():
    _, info = validation_arrays(300, 4, 5, seed=3)
    actions = np.random.default_rng(4).normal(0, 1, (300, 5)).astype(np.float32)
    actions[7] = [0, -1, -2, 0, -3]  # nothing positive: allocates nothing
    expected = np.array([plain_reward(a, i) for a, i in zip(actions, info, strict=True)])
    got = rewards(actions, info)
    assert got.dtype == np.float32 and got.shape == (300,)
    np.testing.assert_allclose(got, expected, rtol=2e-6, atol=1e-9)
    assert got[7] == 0  # no allocation: no rebate, no penalty
    assert average_reward(got).dtype == np.float32
    assert average_reward(got) == np.mean(got)


def test_unfilled_quantity_is_punished_and_a_zero_quantity_is_not_finite():
    info = np.array([[10, 0, 0, 1, 0, -2, 0]], dtype=np.float32)  # no volume: nothing fills
    assert rewards(np.array([[1]], np.float32), info)[0] == pytest.approx(-2 * 10 / math.log1p(10))
    info[0, 0] = 0  # qty 0: 0 / log1p(0)
    assert not np.isfinite(average_reward(rewards(np.array([[1]], np.float32), info)))


def test_nan_actions_give_a_nan_average():
    _, info = validation_arrays(4, 2, 3)
    actions = np.ones((4, 3), np.float32)
    actions[2, 1] = np.nan
    assert np.isnan(average_reward(rewards(actions, info)))
