"""The offline post-training stages: each trains on a fixed dataset, no rollout.

| file                 | stage | what it trains                                                              |
|----------------------|-------|-----------------------------------------------------------------------------|
| sft.py               | sft   | the policy on demonstrations: completion-only NLL                           |
| dpo.py               | dpo   | the policy on preference pairs against a frozen reference: DPO, IPO (and KTO's driver) |
| kto.py               | dpo (`loss_type: kto`) | the policy on unpaired desirable / undesirable rows                 |
| rm.py                | rm    | a reward model (scalar head) on preference pairs: Bradley-Terry             |
| preference_losses.py |       | the DPO, IPO, KTO and Bradley-Terry losses (each with its paper's equation) |
| preference_setup.py  |       | what the preference stages share: data, policy and reference, pair batches and workers |

Each stage's `main(cfg, run_dir, lifecycle)` is its entrypoint (hpcrl.experiment.stage_kinds); the step
loop, checkpointing and export are hpcrl.stages', the trainer worker over DP ranks hpcrl.train.workers'.
The RL dataflow (hpcrl.rl) and this package never import each other (an import-linter contract).
"""
