"""xrun's benchmark suite: xrun against the floor, torchrun and deepspeed, side by side. See bench/README.md."""
