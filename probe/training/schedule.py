"""The live schedule of one run: at each step, the attention gate, what trains, and how the gradient is taken."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from probe.errors import ProbeError
from probe.schedules.settings import ScheduleConfig, check_fits_model
from probe.training.policies import (
    PLAIN,
    AttentionHistory,
    CounterfactualPath,
    DetachAttention,
    GradientPolicy,
    LaggedAttentionPath,
    MlpPlacebo,
    RandomDirection,
    SplitCut,
    random_direction_seed,
)

if TYPE_CHECKING:
    from torch import Tensor

    from probe.models import HookedSequenceModel
    from probe.wrapped import WrappedModel


class Schedule:
    """The live schedule of one run. Its mutable state is the adaptive switch step and, for ``lagged-attention``, the
    attention weights of the last ``cut_lag`` steps (both saved for resume). ``seed``: the run's, which seeds the
    ``random-direction`` draws."""

    def __init__(self, cfg: ScheduleConfig, total_steps: int, switched_at: int | None = None, seed: int = 0) -> None:
        self.cfg = cfg
        self.seed = seed
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
        self.initial_attention: dict[str, Tensor] | None = None  # initial-attention's counterfactual weights
        self.initial_model: dict[str, Tensor] | None = None  # initial-model's
        self.history: AttentionHistory | None = None  # lagged-attention's copies of attention, by step
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
        if self.cfg.cut_mode in ("initial-attention", "initial-model", "lagged-attention"):
            replaced = {"initial-attention": self.initial_attention, "initial-model": self.initial_model,
                        "lagged-attention": self.history}[self.cfg.cut_mode]
            if replaced is None:
                raise ProbeError(f"schedule {self.cfg.name}: the gradient through a counterfactual model needs its "
                                 f"weights; call Schedule.remember_initial(model) on the freshly built model")
            if isinstance(replaced, AttentionHistory):
                return LaggedAttentionPath(self.cfg.cut_block, self.cfg.cut_through, replaced, step)
            return CounterfactualPath(self.cfg.cut_block, self.cfg.cut_through, replaced)
        if self.cfg.cut_mode == "mlp-placebo":
            return MlpPlacebo(self.cfg.cut_block)
        if self.cfg.cut_mode == "random-direction":
            return RandomDirection(self.cfg.cut_block, self.cfg.cut_through, random_direction_seed(self.seed, step))
        return SplitCut(self.cfg.cut, self.cfg.cut_block, self.cfg.cut_through)

    def remember_initial(self, model: HookedSequenceModel) -> None:
        """Keep the initial weights that a counterfactual cut routes through: attention's (with its pre-LN) for
        ``initial-attention``, every parameter's but the learning recurrent sublayer's for ``initial-model``, and
        attention's as the first entry of ``lagged-attention``'s history. Call it on the freshly built model (a
        resumed run rebuilds it from the same seed before loading its weights, so it keeps the same ones; its
        history comes from the checkpoint). A no-op for other schedules."""
        mode = self.cfg.cut_mode
        if mode not in ("initial-attention", "initial-model", "lagged-attention"):
            return
        names = {id(p): n for n, p in model.named_parameters()}
        if mode == "initial-model":
            learning = {id(p) for p in model.recurrent_parameters(self.cfg.cut_block)}
            self.initial_model = {n: p.detach().clone() for n, p in model.named_parameters() if id(p) not in learning}
            return
        through = self.cfg.cut_through
        chosen = [b for i, b in enumerate(model.blocks) if hasattr(b, "attn") and (through is None or i in through)]
        attention = [names[id(p)] for b in chosen for m in (b.attn, b.ln_attn) for p in m.parameters()]
        if mode == "lagged-attention":
            self.history = AttentionHistory(attention, int(self.cfg.cut_lag or 0))
            self.history.record(model, 0)
            return
        params = dict(model.named_parameters())
        self.initial_attention = {n: params[n].detach().clone() for n in attention}

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
        if self.cfg.cut_mode in ("initial-attention", "mlp-placebo", "lagged-attention", "initial-model"):
            raise ProbeError(f"schedule {self.cfg.name}: the {self.cfg.cut_mode} cut needs probe's own blocks (their "
                             "MLPs and pre-LayerNorms); a wrapped model trains joint, dat, ramp, frozen, adaptive, "
                             "the stopgrad cuts and random-path")
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

    def state_dict(self, resume: bool = False) -> dict[str, Any]:
        """The mutable state; with ``resume`` also ``lagged-attention``'s history of attention weights, which only a
        checkpoint to resume from needs (it is ``cut_lag`` copies of attention: kept out of trajectory snapshots)."""
        d: dict[str, Any] = {"switched_at": self.switched_at, "best": self._best, "stale": self._stale}
        if resume and self.history is not None:
            d["attention_history"] = self.history.state_dict()
        return d

    def load_state_dict(self, d: dict[str, Any]) -> None:
        self.switched_at = d.get("switched_at")
        self._best = float(d.get("best", -1.0))
        self._stale = int(d.get("stale", 0))
        if self.history is not None and "attention_history" in d:
            self.history.load_state_dict(d["attention_history"])

