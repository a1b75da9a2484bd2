"""A tiny Lightning job: Trainer(devices=2, strategy="ddp") must join xrun's ranks, not spawn its own.

CLIENT_DEVICES and CLIENT_NODES (2 and 1) are what a user would write in the Trainer for their cluster. Seeded: the
same weights on every run."""

import json
import os
import sys

PRELOADED = "torch" in sys.modules  # forked from xrun --preload torch's helper, which imported it (issue 32)
# ruff: noqa: E402 - the imports below come after that look

import lightning as L
import torch


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.wrapped = None  # seen during fit: Lightning unwraps the model again when fit ends

    def training_step(self, batch, _):
        if self.wrapped is None:
            self.wrapped = isinstance(self.trainer.strategy.model, torch.nn.parallel.DistributedDataParallel)
        return self.layer(batch[0]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


L.seed_everything(0, verbose=False)
data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(32, 4)), batch_size=4)
trainer = L.Trainer(accelerator="cpu", devices=int(os.environ.get("CLIENT_DEVICES", "2")),
                    num_nodes=int(os.environ.get("CLIENT_NODES", "1")), strategy="ddp", max_steps=2, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    default_root_dir=os.environ["CLIENT_OUT"])
module = Tiny()
trainer.fit(module, data)
print(json.dumps({"rank": trainer.global_rank, "world": trainer.world_size, "pid": os.getpid(),
                  "ddp": module.wrapped,
                  "env": type(trainer.strategy.cluster_environment).__name__,
                  "checksum": round(float(module.layer.weight.detach().sum()), 6), "preloaded": PRELOADED}), flush=True)
# torch 2.13's gloo can abort at interpreter teardown after a finished run ("terminate called without an active
# exception"; under torchrun too, see examples/train_ddp.py). The work is reported: leave without that teardown.
os._exit(0)
