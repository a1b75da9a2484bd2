"""Print what xrun gave this rank: the env contract and the arguments. No torch needed.

    xrun --num_gpus 2 examples/hello.py --any "args you like"
"""

import json
import os
import socket
import sys

KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES")

print(json.dumps({"host": socket.gethostname(), "argv": sys.argv[1:], **{k: os.environ.get(k) for k in KEYS}}))
