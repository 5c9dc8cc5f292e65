"""colocgrpo trainer: TRL GRPO with vLLM colocated in the training processes.

Only `config` (the trainer-config contract) and `planner` are light modules that the
operator may import; everything that needs torch is imported lazily by the entrypoint.
"""
