"""What every training stage shares (the RL job hpcrl.rl.job and the offline stages of hpcrl.posttrain:
SFT, DPO / IPO / KTO, the reward model): the rank preamble, the prompt + response batch, the step loop,
checkpoint and resume over `Stateful`s, the run's identity. Which stage an element runs, and what it
reads: hpcrl.experiment.stage_kinds.

| file             | role                                                                             |
|------------------|----------------------------------------------------------------------------------|
| rank.py          | `enter_rank`: the stage's config rules, the resolved model, the run dir; the step-sleep test knob |
| sequences.py     | `response_batch`: prompt + response + <eos> rows, right padded, the loss mask on the response |
| trainer_stage.py | `run_trainer_stage`: a stage training one policy on a dataset (SFT, DPO) around its driver |
| loop.py          | `run_steps`: resume, steps, saves and stops by the trigger, final evaluation, close |
| checkpointing.py | `StageCheckpointing`: save / resume of trainers and Statefuls, run identity checks, metrics cut back |
| stateful.py      | the `Stateful` protocol; TrainerStates (weights, AdamW, loss scale), DataCursorState |
| run_identity.py  | run id = config fingerprint + first start; `run.json`                            |
"""
