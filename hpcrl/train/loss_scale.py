"""fp16's dynamic loss scale, shared by both update backends (one source for its defaults)."""

from __future__ import annotations


class DynamicLossScale:
    """fp16 loss scaling (Micikevicius et al. 2018, "Mixed Precision Training", §3.2): multiply the loss
    by S before backward so small gradients survive in fp16, divide the fp32 grads by S before the step;
    on inf/NaN skip the step and halve S; after `growth_interval` clean steps double S."""

    def __init__(self, initial: float = 2.0**16, growth_interval: int = 1000, minimum: float = 1.0):
        self.scale, self.growth_interval, self.minimum = initial, growth_interval, minimum
        self._clean_steps = 0

    def update(self, finite: bool) -> None:
        if not finite:
            self.scale, self._clean_steps = max(self.scale / 2, self.minimum), 0
            return
        self._clean_steps += 1
        if self._clean_steps == self.growth_interval:
            self.scale, self._clean_steps = self.scale * 2, 0

    def state_dict(self) -> dict[str, float]:
        """JSON-able state (saved with a checkpoint's run state: an fp16 resume continues the same scale)."""
        return {"scale": self.scale, "clean_steps": self._clean_steps}

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.scale, self._clean_steps = float(state["scale"]), int(state["clean_steps"])
