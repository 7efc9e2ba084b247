"""The reward of the rl protocol (docs/rl-scoring.md, "The reward"), in float32 as upstream.

Every row is a one-step episode: the policy's actions become a split of the order's quantity
over the venues; each venue fills what its capacity allows, with a rebate on what is filled
and a penalty on what is not; the sum is scaled by log1p of the quantity.
"""

from __future__ import annotations

import numpy as np

from modules.rl.validation_set import COLUMNS_PER_VENUE, INFO_FIXED_COLUMNS

F32 = np.float32


def rewards(actions: np.ndarray, info: np.ndarray) -> np.ndarray:
    """The float32 reward of every row; `actions` (rows, V), `info` (rows, 3 + 4V)."""
    actions = np.asarray(actions, dtype=F32)
    info = np.asarray(info, dtype=F32)
    rows, venues = actions.shape
    qty = info[:, 0:1]
    duration = info[:, 1:2]
    per_venue = info[:, INFO_FIXED_COLUMNS:].reshape(rows, venues, COLUMNS_PER_VENUE)
    fill_rate, rebate_bps, punish, latest_vol = (per_venue[:, :, k] for k in range(4))

    positive = np.maximum(actions, F32(0))
    total = positive.sum(axis=1, keepdims=True)
    # A row whose actions sum to 0 allocates nothing; NaN sums stay NaN.
    probs = np.divide(positive, total, out=np.zeros_like(positive), where=total != 0)
    alloc = probs * qty
    window = F32(1) + F32(0.6) * (F32(1) - np.exp(F32(-0.9) * duration))
    capacity = np.maximum(latest_vol, F32(0)) * window * np.clip(fill_rate, F32(0), F32(1))
    filled = np.minimum(alloc, capacity)
    unfilled = alloc - filled
    gained = rebate_bps / F32(10000) * filled + punish * unfilled
    with np.errstate(divide="ignore", invalid="ignore"):  # qty 0: the average says -999
        return gained.sum(axis=1) / np.log1p(qty[:, 0])


def average_reward(row_rewards: np.ndarray) -> np.float32:
    """The float32 mean of all rows' rewards (numpy's mean of the float32 array)."""
    return np.mean(np.asarray(row_rewards, dtype=F32))
