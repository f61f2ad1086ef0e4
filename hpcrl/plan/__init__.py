"""Memory preflight planner: `predict(cfg) -> MemoryPlan` (hpcrl.plan.memory), formulas with sources
(hpcrl.plan.formulas), capacities (hpcrl.plan.capacity), CPU/GPU measurement (hpcrl.plan.measure),
`hpcrl plan` (hpcrl.cli.plan)."""
