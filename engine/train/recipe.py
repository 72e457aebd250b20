"""The v2 training schedule: which rows, terms and Markov-head learning rate each step uses.

With ``objective="kd"`` a run goes through up to four phases (steps counted from 0):

    regress   steps [0, regress_steps)          positions <= early_positions, hidden regression only,
                                                Markov head frozen at zero: a bounded, well-conditioned
                                                start that pulls the output towards the target's state
                                                instead of the self-prediction / unigram trap
    early     steps [regress_steps, early_steps) positions <= early_positions, KD + regression, Markov
                                                head frozen (the backbone must learn the anchor itself)
    full      until steps - final_steps         every position, KD + regression, Markov head at
                                                lr x markov_lr_mult
    final     the last final_steps              as full, plus 0.5 TV + the confidence head (and KD
                                                at 0.5), so the confidence labels c* are meaningful
With ``objective="ce_tv"`` every step is the run-3 recipe (one "ce_tv" phase).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.train.config import TrainConfig


@dataclass(frozen=True)
class Phase:
    """What one training step optimises."""

    name: str  # "ce_tv" | "regress" | "early" | "full" | "final"
    max_position: int | None  # draft positions k <= this are trained (None: all)
    weights: dict  # loss weights: kd / hidden (kd objective) or ce / tv / conf
    markov_mult: float  # the Markov head's lr relative to the rest (0 = frozen)

    @property
    def early(self) -> bool:
        """True in the position-curriculum phases (the gate's clock runs here)."""
        return self.name in ("regress", "early")


def phase_at(cfg: TrainConfig, step: int) -> Phase:
    """The phase of ``step`` under ``cfg``."""
    if cfg.objective == "ce_tv":
        ce, tv, conf = cfg.loss_weights
        return Phase("ce_tv", None, {"ce": ce, "tv": tv, "conf": conf}, 1.0)
    if step < cfg.regress_steps:
        return Phase("regress", cfg.early_positions, {"kd": 0.0, "hidden": cfg.hidden_weight}, 0.0)
    if step < cfg.early_steps:
        return Phase("early", cfg.early_positions, {"kd": 1.0, "hidden": cfg.hidden_weight}, 0.0)
    if step >= cfg.steps - cfg.final_steps:
        weights = {"kd": 0.5, "hidden": cfg.hidden_weight, "tv": 0.5, "conf": 1.0}
        return Phase("final", None, weights, cfg.markov_lr_mult)
    return Phase("full", None, {"kd": 1.0, "hidden": cfg.hidden_weight}, cfg.markov_lr_mult)
