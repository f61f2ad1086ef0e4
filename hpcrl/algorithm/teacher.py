"""The frozen teacher of on-policy distillation (`algorithm.name: distill`): which model it is.

One function, read by the expand rules (hpcrl.experiment.rules), the memory planner (hpcrl.plan.memory)
and the ranks (hpcrl.rl.roles), so the three cannot disagree on what `algorithm.teacher_path` names.
"""

from __future__ import annotations

from hpcrl.algorithm.config import AlgorithmConfig
from hpcrl.train.config import ModelConfig


def teacher_model(algo: AlgorithmConfig, student: ModelConfig) -> ModelConfig | None:
    """The teacher's ModelConfig: its architecture from `algorithm.teacher_path`'s config.json, in the
    student's dtype (its log-probs are compared token by token with the student's); None without one."""
    if algo.teacher_path is None:
        return None
    return ModelConfig(hf_path=algo.teacher_path, dtype=student.dtype)
