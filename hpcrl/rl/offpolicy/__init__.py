"""Asynchronous (off-policy by one step) RL, `placement.kind: async`: a rollout pool generates step k+1's
batch while the training pool trains on step k's.

| file         | role                                                                                  |
|--------------|---------------------------------------------------------------------------------------|
| placement.py | compose one rank's job: the two pools, their groups, the drivers (`build_async_driver`) |
| driver.py    | the two halves of the step: `AsyncRolloutDriver`, `AsyncTrainDriver`                   |
| channel.py   | batches from the rollout pool to the training pool (`BatchChannel`)                   |
| weights.py   | the policy's weights back to the rollout pool, double-buffered (`DoubleBufferedWeights`) |
"""
