"""Stands in for a module whose import initialises CUDA (tests/test_preload.py). The CPU build of torch here
cannot start CUDA, so this says it did the only way the helper can be told: torch.cuda.is_initialized(). The real
case is the GPU suite's."""
import torch

torch.cuda.is_initialized = lambda: True
