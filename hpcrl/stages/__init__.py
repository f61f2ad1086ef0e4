"""What every training stage shares (the RL job hpcrl.rl.job, offline DPO hpcrl.rl.dpo; SFT, reward
model and KTO next): the rank preamble, the step loop, checkpoint and resume over `Stateful`s, the run's
identity.

| file             | role                                                                             |
|------------------|----------------------------------------------------------------------------------|
| rank.py          | `enter_rank`: the stage's config rules, the resolved model, the run dir; the step-sleep test knob |
| loop.py          | `run_steps`: resume, steps, saves and stops by the trigger, final evaluation, close |
| checkpointing.py | `StageCheckpointing`: save / resume of trainers and Statefuls, run identity checks, metrics cut back |
| stateful.py      | the `Stateful` protocol; TrainerStates (weights, AdamW, loss scale), DataCursorState |
| run_identity.py  | run id = config fingerprint + first start; `run.json`                            |
"""
