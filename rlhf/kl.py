"""KL-penalty coefficient controllers (host side: they change between iterations only)."""

from __future__ import annotations

import dataclasses

from jaxcore import ConfigError


@dataclasses.dataclass
class FixedKLController:
    """A constant KL coefficient (TRL PPO's ``kl_coef``, 0.05)."""

    value: float = 0.05

    def update(self, current_kl: float, n_steps: int) -> float:
        del current_kl, n_steps
        return self.value


@dataclasses.dataclass
class AdaptiveKLController:
    """Ziegler et al. 2019's adaptive coefficient (TRL's ``AdaptiveKLController``).

    After each batch of ``n_steps`` samples with measured KL ``current_kl``, the coefficient
    is multiplied by ``1 + clip(current_kl / target - 1, -0.2, 0.2) * n_steps / horizon``:
    above the target the penalty grows, below it shrinks, at most 20% per horizon.
    Defaults are the paper's: init 0.2, target 6 nats, horizon 10000.
    """

    value: float = 0.2
    target: float = 6.0
    horizon: int = 10_000

    def __post_init__(self) -> None:
        if self.target <= 0 or self.horizon <= 0:
            raise ConfigError(
                f"AdaptiveKLController: target={self.target} and horizon={self.horizon} "
                "must be > 0."
            )

    def update(self, current_kl: float, n_steps: int) -> float:
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
        return self.value
