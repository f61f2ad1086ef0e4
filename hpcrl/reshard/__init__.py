"""3D-HybridEngine: reshard actor weights between the Megatron training layout and the rollout layout.

See README.md in this folder for the file roles; `build.build_reshard_engine` is the entry point.
Light on purpose: importing the package imports no torch.
"""
