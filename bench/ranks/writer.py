"""A chatty rank: writes ``bytes=N`` bytes to stdout as ``line=L``-byte lines, one write per line.

Each line carries the word XBLOG so the bench can check that every line arrived, and the writer's rank, so
no two ranks write the same line (a launcher that de-duplicates still shows every one). Also writes the
usual pid file to ``dir=RUN_DIR``.
"""
import os
import sys
import time

t0 = time.time()
opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a and not a.startswith("-"))
with open(os.path.join(opts["dir"], "ranks", str(os.getpid())), "w") as f:
    f.write(f"{t0!r} {os.environ.get('RANK', '?')}\n")
size, width = int(opts.get("bytes", "20000000")), int(opts.get("line", "100"))
tag = os.environ.get("RANK", "0")[-4:].rjust(4, "0")
body = "XBLOG " + tag + "x" * (width - 7 - 8 - 4)
write = sys.stdout.write
for i in range(size // width):
    write(f"{i:08d}{body}\n")
sys.stdout.flush()
