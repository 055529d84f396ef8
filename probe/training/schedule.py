"""The live schedule of one run: at each step, the attention gate, what trains, and how the gradient is taken."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError
from probe.training.policies import PLAIN, DetachAttention, GradientPolicy, InitialAttentionPath, MlpPlacebo, SplitCut
from probe.training.settings import ScheduleConfig, check_fits_model

if TYPE_CHECKING:
    from torch import Tensor

    from probe.models import HookedSequenceModel
    from probe.wrapped import WrappedModel


class Schedule:
    """The live schedule of one run. Its only mutable state is the adaptive switch step (saved for resume)."""

    def __init__(self, cfg: ScheduleConfig, total_steps: int, switched_at: int | None = None) -> None:
        self.cfg = cfg
        self.total_steps = total_steps
        self.switch_step = 0 if cfg.switch is None else cfg.switch.resolve(total_steps)
        self.window = cfg.ramp_window.resolve(total_steps)
        self.min_switch = cfg.min_switch.resolve(total_steps)
        fixed = (cfg.gate != "on" or cfg.attention_trains == "from-switch") and not cfg.adaptive
        if fixed and self.switch_step >= total_steps:
            raise ProbeError(
                f"schedule {cfg.name}: attention would switch on at step {self.switch_step}, after the last step "
                f"({total_steps}); give the switch as a fraction of the run (schedule.switch=44%) or train longer"
            )
        self.switched_at = switched_at
        self.initial_attention: dict[str, Tensor] | None = None
        self._best = -1.0
        self._stale = 0

    @property
    def effective_switch(self) -> int:
        """The step phase 2 starts at: the adaptive switch once it has happened, else the configured one."""
        if self.cfg.adaptive and self.switched_at is not None:
            return self.switched_at
        return self.switch_step

    def gate(self, step: int) -> float:
        """Attention gate at ``step`` (the same for every block)."""
        t = self.effective_switch
        if self.cfg.gate == "on":
            return 1.0
        if step < t:
            return 0.0
        if self.cfg.gate == "ramp" and self.window > 0:
            return min(1.0, (step - t + 1) / self.window)
        return 1.0

    def attention_trains(self, step: int) -> bool:
        return self.cfg.attention_trains == "always" or step >= self.effective_switch

    def recurrent_trains(self, step: int) -> bool:
        return not (self.cfg.freeze_recurrent_after_switch and step >= self.effective_switch)

    def cuts(self, step: int) -> bool:
        """Whether attention's backward path is cut at ``step``."""
        if self.cfg.cut == "none":
            return False
        if self.cfg.cut_until is not None:
            return step < self.cfg.cut_until.resolve(self.total_steps)
        return self.cfg.switch is None or step < self.effective_switch

    def gradient_policy(self, step: int) -> GradientPolicy:
        """How the gradient of ``step`` is taken: plainly, or with attention's backward path cut for some
        parameters."""
        if not self.cuts(step):
            return PLAIN
        if self.cfg.cut == "all":
            return DetachAttention(self.cfg.cut_through)
        if self.cfg.cut_mode == "initial-attention":
            if self.initial_attention is None:
                raise ProbeError(f"schedule {self.cfg.name}: the gradient through attention's initial weights needs "
                                 f"them; call Schedule.remember_initial(model) on the freshly built model")
            return InitialAttentionPath(self.cfg.cut_block, self.cfg.cut_through, self.initial_attention)
        if self.cfg.cut_mode == "mlp-placebo":
            return MlpPlacebo(self.cfg.cut_block)
        return SplitCut(self.cfg.cut, self.cfg.cut_block, self.cfg.cut_through)

    def remember_initial(self, model: HookedSequenceModel) -> None:
        """Keep the initial weights of the attention the ``initial-attention`` cut routes through; call it on the
        freshly built model (a resumed run rebuilds it from the same seed before loading its weights, so it keeps the
        same ones). A no-op for other schedules."""
        if self.cfg.cut_mode != "initial-attention":
            return
        names = {id(p): n for n, p in model.named_parameters()}
        through = self.cfg.cut_through
        chosen = [b for i, b in enumerate(model.blocks) if hasattr(b, "attn") and (through is None or i in through)]
        self.initial_attention = {names[id(p)]: p.detach().clone() for b in chosen for m in (b.attn, b.ln_attn)
                                  for p in m.parameters()}

    def check_model(self, model: HookedSequenceModel) -> None:
        """Refuse, before any training, a schedule that does nothing on this model or a cut that names blocks the
        model does not have."""
        check_fits_model(self.cfg, model.cfg)
        if not hasattr(model, "blocks"):
            self._check_wrapped(model)
            return
        n = len(model.blocks)
        block = self.cfg.cut_block
        if block is not None and not (block < n and model.recurrent_parameters(block)):
            raise ProbeError(f"schedule {self.cfg.name}: the model has no recurrent sublayer in block {block} "
                             f"({n} blocks)")
        for b in self.cfg.cut_through or ():
            if not (b < n and hasattr(model.blocks[b], "attn")):
                raise ProbeError(f"schedule.cut_through: the model has no attention in block {b} ({n} blocks)")

    def _check_wrapped(self, model: WrappedModel) -> None:
        """On a wrapped model a cut acts through its named modules: ``cut_block`` is the i-th named recurrent module,
        ``cut_through`` the i-th named attention module. The cuts that need probe's own blocks (an MLP placebo, the
        path through attention's initial weights, which reads each block's pre-LN) are refused."""
        if self.cfg.cut_mode in ("initial-attention", "mlp-placebo"):
            raise ProbeError(f"schedule {self.cfg.name}: the {self.cfg.cut_mode} cut needs probe's own blocks (their "
                             "MLPs and pre-LayerNorms); a wrapped model trains joint, dat, ramp, frozen, adaptive and "
                             "the stopgrad cuts")
        n_rec, n_att = len(model.recurrent_names), len(model.attention_names)
        if self.cfg.cut_block is not None and self.cfg.cut_block >= n_rec:
            raise ProbeError(f"schedule {self.cfg.name}: the model has {n_rec} named recurrent module(s), no "
                             f"number {self.cfg.cut_block} (schedule.cut_block counts them from 0)")
        for b in self.cfg.cut_through or ():
            if b >= n_att:
                raise ProbeError(f"schedule.cut_through: the model has {n_att} named attention module(s), no number "
                                 f"{b} (it counts them from 0)")

    def observe(self, step: int, state_accuracy: float) -> bool:
        """Feed a validation accuracy (adaptive only). Returns True if this observation switches attention on."""
        if not self.cfg.adaptive or self.switched_at is not None:
            return False
        if state_accuracy > self._best + self.cfg.min_delta:
            self._best, self._stale = state_accuracy, 0
        else:
            self._stale += 1
        if step >= self.min_switch and (self._stale >= self.cfg.patience or state_accuracy >= self.cfg.target):
            self.switched_at = step + 1
            return True
        return False

    def state_dict(self) -> dict[str, Any]:
        return {"switched_at": self.switched_at, "best": self._best, "stale": self._stale}

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.switched_at = d.get("switched_at")
        self._best = float(d.get("best", -1.0))
        self._stale = int(d.get("stale", 0))

