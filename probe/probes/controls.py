"""Controls that bound what a probe's accuracy means; each row has ``passed`` and a test that makes it fail."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numpy.random import default_rng

from probe.probes.fit import Activations, band_mask, fit_probe

MARGIN = 0.2
"""A probe counts as reading s_t when it beats every control by at least this much."""


def pooled(rows: pd.DataFrame, columns: list[str]) -> pd.Series:
    """``n``-weighted mean of accuracy columns over rows (e.g. the beyond-range rows of several test lengths), and
    the total ``n``."""
    w = rows.n.to_numpy(dtype=float)
    return pd.Series({**{c: float(np.average(rows[c], weights=w)) for c in columns}, "n": int(w.sum())})


def control_target_rows(by_length: pd.DataFrame, control: str) -> list[dict[str, Any]]:
    """The control target, per training band: on the hook whose probe reads s_t best at ``beyond`` positions
    (pooled over the test lengths beyond L_train), the probe for the control target must score at least
    ``MARGIN`` less (selectivity >= MARGIN).

    Fails when the model (or the probe) gives the control target as readily as s_t -- a model that computes the
    permuted sum as well, or a probe so expressive that it reads anything -- and where nothing beyond L_train
    decodes s_t at all (selectivity ~0 at chance): then there is no s_t-specific decoding to claim.
    """
    out = []
    beyond = by_length[by_length.test_positions == "beyond"]
    for band, rows in beyond.groupby("train_positions", sort=False):
        stats = {h: pooled(r, ["probe_acc", "control_acc", "majority_acc"])
                 for h, r in rows.groupby("hook", sort=False)}
        if not stats:
            continue
        hook = max(stats, key=lambda h: stats[h].probe_acc)
        s = stats[hook]
        out.append({"control": f"{control}_target", "hook": hook, "train_positions": band,
                    "test_positions": "beyond", "n": int(s.n), "probe_acc": float(s.probe_acc),
                    "control_acc": float(s.control_acc), "majority_acc": float(s.majority_acc),
                    "selectivity": float(s.probe_acc - s.control_acc),
                    "passed": bool(s.probe_acc - s.control_acc >= MARGIN),
                    "value": float(s.probe_acc - s.control_acc), "threshold": MARGIN, "passes_if": ">=",
                    "what": "selectivity (s_t probe minus control-target probe) beyond L_train; a fail means no "
                            "s_t-specific decoding there: the model's state does not hold s_t beyond L_train (or the "
                            "probe reads anything), not a broken tool"})
    return out


def shuffled_labels_row(train: Activations, test: Activations, hook: str, train_length: int, seed: int,
                        n_shuffles: int = 3) -> dict[str, Any]:
    """Negative control: the probe on ``hook`` trained on labels shuffled across positions (training range),
    scored at the training-range positions of the test sequences. Passes below majority + ``MARGIN``; fails for a
    pipeline that leaks the labels or a probe that memorises its training set into the test.

    When the features cluster by s_t, a shuffled-label probe maps whole clusters to random classes, so one
    shuffle's accuracy jumps in steps of about 1/m; the mean over ``n_shuffles`` permutations is steadier.
    """
    tr = train.select(band_mask(train.position, train_length, "in"))
    te = test.select(band_mask(test.position, train_length, "in"))
    values, counts = np.unique(tr.labels, return_counts=True)
    majority = int(values[counts.argmax()])
    rng = default_rng(seed)
    accs = [float((fit_probe(tr.x(hook), rng.permutation(tr.labels), seed).predict(te.x(hook)) == te.labels).mean())
            for _ in range(n_shuffles)]
    majority_acc = float((te.labels == majority).mean())
    return {"control": "shuffled_labels", "hook": hook, "train_positions": "in", "test_positions": "in",
            "n": len(te.labels), "acc": float(np.mean(accs)), "acc_max": max(accs), "majority_acc": majority_acc,
            "passed": float(np.mean(accs)) < majority_acc + MARGIN, "value": float(np.mean(accs)),
            "threshold": majority_acc + MARGIN, "passes_if": "<",
            "what": "accuracy of a probe trained on shuffled labels; a fail means labels leak into the test or the "
                    "probe memorises: a broken pipeline"}
