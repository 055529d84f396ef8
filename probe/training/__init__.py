"""The training core, one responsibility a module, in reading order:

- ``probe.schedules`` (a floor below, since a checkpoint records a schedule): a point in the run (``At``), a schedule
  as independent settings (``ScheduleConfig``, ``VARIANTS``, the one name of any schedule), and every old spelling;
  ``At``, ``ScheduleConfig``, ``VARIANTS``, ``variant_name`` and ``variant_settings`` are importable from here too.
- ``policies``: how a step's gradient is taken (plainly, or with attention's backward path cut).
- ``schedule``: the live schedule of a run (``Schedule``): the gate, what trains and the gradient policy at a step.
- ``config``: the training config (``TrainConfig``) and the learning rate at a step (``lr_at``).
- ``presets``: the named presets (``PRESETS``).
- ``overrides``: the ``--set SECTION.FIELD=VALUE`` grammar (``build_configs``, ``override_configs``).
- ``batches``: the training batch of a step (``training_batch``, ``train_batch_seed``).
- ``state``: what a checkpoint records of its step (gates, learning rate, batch draw) and how analyses read it.
- ``trainer``: the loop (``Trainer``, ``train``); ``cli``: ``python -m probe.train``.
- ``live``: a live model (yours from ``probe.wrap``) trained in place on any task's sampler (``train_model``).
- ``rollout``: a run continued from a snapshot for a few steps, as it was or without attention's gradient path into
  the recurrent sublayers (``continue_run``).

Names are imported on first use, so that importing one module does not import the trainer.
"""

from probe.core.lazy import lazy_exports

_EXPORTS = {
    "At": "probe.schedules.points",
    **dict.fromkeys(["VARIANTS", "ScheduleConfig", "variant_name", "variant_settings"], "probe.schedules.settings"),
    **dict.fromkeys(["GradientPolicy", "PLAIN"], "policies"),
    "Schedule": "schedule",
    **dict.fromkeys(["OPTIMIZER_IMPLS", "PRECISIONS", "TrainConfig", "lr_at"], "config"),
    **dict.fromkeys(["DAT_SWITCH", "PRESETS"], "presets"),
    **dict.fromkeys(["build_configs", "override_configs"], "overrides"),
    **dict.fromkeys(["train_batch_seed", "training_batch"], "batches"),
    **dict.fromkeys(["StepState", "step_state"], "state"),
    **dict.fromkeys(["Trainer", "config_diff", "train"], "trainer"),
    "train_model": "live",
    **dict.fromkeys(["continue_run", "weight_difference"], "rollout"),
    "main": "cli",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
