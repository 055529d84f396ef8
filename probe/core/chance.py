"""The accuracy of guessing: what "above chance" means for each subtask."""

from __future__ import annotations

from typing import Any


def chance(task: Any, subtask: str) -> float:
    """Accuracy of a guess that knows the label space but nothing about the sequence.

    A state answer is a residue mod ``m`` (where the task's state answers are residues; ``coupled``'s are values);
    a recall answer is a dictionary value, drawn uniformly from
    ``n_values`` (with repeats), so a uniform guess is right 1 / n_values of the time. 1 / n_pairs is a different
    floor: a model that has read the dictionary and picks one of its entries without finding the key -- already a
    skill, not chance."""
    if subtask == "recall" or not getattr(task, "residue_answers", True):
        # an answer that is a value (coupled's: the value bound to s_t) is guessed among the values, not residues
        return 1.0 / task.n_values
    return 1.0 / task.m
