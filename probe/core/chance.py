"""The accuracy of guessing: what "above chance" means for each subtask."""

from __future__ import annotations

from typing import Any


def chance(task: Any, subtask: str) -> float:
    """Accuracy of a guess that knows the label space but nothing about the sequence.

    A state answer is a residue mod ``m``; a recall answer is a dictionary value, drawn uniformly from
    ``n_values`` (with repeats), so a uniform guess is right 1 / n_values of the time. 1 / n_pairs is a different
    floor: a model that has read the dictionary and picks one of its entries without finding the key -- already a
    skill, not chance."""
    if subtask == "recall":
        return 1.0 / task.n_values
    return 1.0 / task.m
