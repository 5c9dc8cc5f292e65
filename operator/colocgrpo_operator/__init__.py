"""colocgrpo operator: turns ColocGRPOJob resources into GRPO training gangs.

Importing this package must stay cheap and must never import torch, vllm or trl.
"""

__version__ = "0.1.0"
