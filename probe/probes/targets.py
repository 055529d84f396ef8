"""Probe targets: the running sum s_t, control targets of the same shape that a state tracker does not compute, and
windowed sums that a shortcut-taking model could compute instead."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from probe.errors import ProbeError

CONTROL_TARGETS = ("permuted", "history", "bigram")
"""``permuted`` (default): c_t = sum of pi(x_i) mod m for a fixed random non-affine pi. ``history`` and ``bigram``:
Hewitt & Liang type controls (a random label per number history, or per (previous, current) number). Windowed
sums (``window{k}``, ``windowed_sum``) are accepted by ``control_labels`` as well."""

WINDOW = "window"
"""``window{k}`` names the control target w_t^k = sum of the last k numbers mod m."""

WINDOWS: tuple[int | str, ...] = (3, 10, "L")
"""Default windows k of the windowed-sum control targets; ``"L"`` is the checkpoint's L_train. k = 3 and 10 are the
spans of the shortcut analysis's sum-preserving test: sums that attention over a few recent positions can compute.
k = L_train is the shortcut training cannot tell from s_t: in the training range it equals s_t exactly, so a model
that learned it is exact there and wrong beyond. k = 1 is left out on purpose: it is the current number, which every
hook downstream of the embedding carries whatever the model computes, so decoding it says nothing about a shortcut
(for k >= 2 the mod-m sum is not linear in the inputs: a linear probe decodes it only where the model computed it)."""


def is_affine(f: np.ndarray, m: int) -> bool:
    """Whether ``f(x) = a x + b mod m`` for some a, b (then sum f(x_i) = a s_t + b n_t is a function of s_t and the
    count of numbers, and a model that tracks s_t and its position decodes it without computing anything new)."""
    a, b = (int(f[1]) - int(f[0])) % m, int(f[0])
    return all(int(f[x]) == (a * x + b) % m for x in range(m))


def control_map(m: int, seed: int = 0) -> np.ndarray:
    """The fixed map pi of the ``permuted`` control: a random permutation of Z_m that is not affine.

    Z_3 has only affine permutations, so for m = 3 pi is a random non-affine function instead (the sum still
    becomes uniform on Z_3 and independent of s_t as t grows); Z_2 has no non-affine function at all.
    """
    if m < 3:
        raise ProbeError(f"the permuted control needs m >= 3 (every map of Z_{m} is affine); use --control history")
    rng = np.random.default_rng([seed, m, 0x5EED])
    while True:
        f = rng.permutation(m) if m >= 4 else rng.integers(0, m, m)
        if not is_affine(f, m):
            return f


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """A fixed pseudo-random function of a uint64 key: distinct types get independent-looking labels."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def permuted_sum(tokens: torch.Tensor, state: torch.Tensor, m: int, seed: int = 0) -> torch.Tensor:
    """c_t = (pi(x_1) + ... + pi(x_t)) mod m over the numbers so far (queries skipped); ``-1`` off state positions."""
    f = torch.as_tensor(control_map(m, seed), dtype=torch.long)
    mapped = torch.where(state, f[tokens.clamp(0, m - 1)], 0)
    return torch.where(state, mapped.cumsum(dim=1) % m, -1)


def window_size(name: str) -> int | None:
    """k of a ``window{k}`` target name (k >= 1), or None for any other name."""
    if not name.startswith(WINDOW) or not name[len(WINDOW):].isdigit():
        return None
    k = int(name[len(WINDOW):])
    return k if k >= 1 else None


def resolve_windows(windows: Sequence[int | str], train_length: int) -> list[str]:
    """Target names of ``windows`` (ints, or ``"L"`` for L_train), sorted by k, without repeats."""
    ks = set()
    for w in windows:
        k = train_length if w == "L" else w
        if isinstance(k, str) and k.isdigit():
            k = int(k)
        if not isinstance(k, int) or isinstance(k, bool) or k < 1:
            raise ProbeError(f"window {w!r}: use a positive integer or L (the training length)")
        ks.add(k)
    return [f"{WINDOW}{k}" for k in sorted(ks)]


def windowed_sum(tokens: torch.Tensor, state: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """w_t = (sum of the last k numbers up to and including x_t) mod m -- all of them while fewer than k have come --
    over the numbers so far (queries skipped, as s_t skips them); ``-1`` off state positions."""
    x = torch.where(state, tokens.clamp(0, m - 1), 0)
    total = x.cumsum(dim=1)
    count = state.long().cumsum(dim=1)  # numbers so far
    # first[b, j] = sum of the first j numbers. Off state positions count and total repeat the last number's values,
    # so scattering every position writes each slot with one value only.
    first = torch.zeros(x.shape[0], x.shape[1] + 1, dtype=total.dtype)
    first.scatter_(1, count, total)
    dropped = first.gather(1, (count - k).clamp(min=0))
    return torch.where(state, (total - dropped) % m, -1)


def _typed_labels(tokens: torch.Tensor, state: torch.Tensor, m: int, seed: int, control: str) -> torch.Tensor:
    x = tokens.clamp(0, m - 1).numpy().astype(np.uint64)
    st = state.numpy()
    b, t_len = x.shape
    key = np.zeros(b, dtype=np.uint64)
    prev = np.full(b, m, dtype=np.uint64)
    out = np.full((b, t_len), -1, dtype=np.int64)
    salt = _splitmix64(np.array([seed], dtype=np.uint64))[0]
    with np.errstate(over="ignore"):
        for t in range(t_len):
            if control == "history":  # FNV-style rolling hash of the number history (wraps modulo 2^64)
                new_key = (key * np.uint64(0x100000001B3)) ^ (x[:, t] + np.uint64(1))
            else:
                new_key = prev * np.uint64(m + 1) + x[:, t]
            label = (_splitmix64(new_key ^ salt) % np.uint64(m)).astype(np.int64)
            out[:, t] = np.where(st[:, t], label, -1)
            key = np.where(st[:, t], new_key, key)
            prev = np.where(st[:, t], x[:, t], prev)
    return torch.from_numpy(out)


def control_labels(tokens: torch.Tensor, state: torch.Tensor, m: int, seed: int = 0,
                   control: str = "permuted") -> torch.Tensor:
    """The control target at every state position (``-1`` elsewhere).

    ``permuted``: ``permuted_sum`` -- the same recurrence as s_t with the inputs relabelled by a non-affine pi, so
    a probe decodes it only from a model that computes it; beyond the first few positions it is independent of
    s_t. ``history``: a random label per number history x_1..x_t (Hewitt & Liang's word types; beyond ~3 numbers
    every history is new, so it is at chance there whatever the model). ``bigram``: a random label per (previous
    number, current number). ``window{k}``: ``windowed_sum`` of the last k numbers.
    """
    k = window_size(control)
    if k is not None:
        return windowed_sum(tokens, state, m, k)
    if control not in CONTROL_TARGETS:
        raise ProbeError(f"unknown control target {control!r}; choose one of {', '.join(CONTROL_TARGETS)} "
                         f"or {WINDOW}K (K >= 1)")
    if control == "permuted":
        return permuted_sum(tokens, state, m, seed)
    return _typed_labels(tokens, state, m, seed, control)
