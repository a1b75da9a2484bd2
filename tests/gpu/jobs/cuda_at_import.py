"""A module whose import initialises CUDA, as some do (tests/gpu/test_preload.py): ``--preload`` must refuse it,
since a rank forked after that cannot use the GPU ("Cannot re-initialize CUDA in forked subprocess")."""
import torch

torch.zeros(1, device="cuda")
