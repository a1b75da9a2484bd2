"""A rank that does what its argv says, step by step: ``rank.py STEP [ARG] STEP [ARG] ...``.

Steps (each takes at most one argument):
  ready DIR        create DIR/<pid>.<role> ("main" or "child"), so a test knows this process is up
  out HEX / err HEX     write raw bytes (hex-encoded) to stdout / stderr, no newline added
  lines N          print N numbered lines to stderr
  flood BYTES      write BYTES of 100-byte lines to stdout
  sleep SECONDS    sleep (SIGTERM kills as usual unless ignore-term came first)
  ignore-term -    ignore SIGTERM from now on
  exit CODE        exit with CODE
  raise SIG        kill itself with signal SIG (core dumps are disabled)
  fork MODE        fork a child that stays in this session (MODE: "term" honours SIGTERM, "ignore" ignores it,
                   "group" ignores it and moves to a new process group of the same session; "daemon" leaves: a
                   double fork and setsid, so its parent exits and it belongs to no rank's session). The child runs the
                   steps after "fork MODE" up to "then -" and then sleeps forever; the parent runs the steps
                   after "then -"
  wait-file PATH   wait until PATH exists (exit 99 after 120 s)
  wait-ready N@DIR wait until DIR holds N ready files (exit 99 after 120 s)
  affinity -       print this process's CPU affinity as "affinity=0,1"
"""

import os
import resource
import signal
import sys
import time

resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
role = "main"


def wait(condition, limit=120.0):
    """Poll for a test's condition; a test that waits for something that never comes fails, not hangs."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            sys.stderr.write("rank.py: gave up waiting\n")
            os._exit(99)
        time.sleep(0.005)


def main(argv):
    global role
    steps = list(zip(argv[0::2], argv[1::2]))
    for step, arg in steps:
        if step == "ready":
            open(os.path.join(arg, f"{os.getpid()}.{role}"), "w").close()
        elif step == "out":
            os.write(1, bytes.fromhex(arg))
        elif step == "err":
            os.write(2, bytes.fromhex(arg))
        elif step == "lines":
            for i in range(int(arg)):
                os.write(2, f"line {i}\n".encode())
        elif step == "flood":
            line = b"x" * 99 + b"\n"
            for _ in range(int(arg) // 100):
                os.write(1, line)
        elif step == "sleep":
            time.sleep(float(arg))
        elif step == "ignore-term":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif step == "exit":
            sys.exit(int(arg))
        elif step == "raise":
            os.kill(os.getpid(), int(arg))
            time.sleep(10)
        elif step == "fork":
            if os.fork() == 0:
                role = "child"
                if arg in ("ignore", "group"):
                    signal.signal(signal.SIGTERM, signal.SIG_IGN)
                if arg == "group":
                    os.setpgid(0, 0)
                if arg == "daemon":
                    os.setsid()
                    if os.fork() != 0:
                        os._exit(0)
                rest = argv[argv.index("fork") + 2 :]
                # The child runs the steps after "fork" up to "then"; the parent skips them.
                child_steps = rest[: rest.index("then")] if "then" in rest else rest
                main(child_steps)
                while True:
                    time.sleep(3600)
            rest = argv[argv.index("fork") + 2 :]
            if "then" in rest:
                main(rest[rest.index("then") + 2 :])
            return
        elif step == "wait-file":
            wait(lambda: os.path.exists(arg))
        elif step == "wait-ready":
            count, directory = arg.split("@", 1)
            wait(lambda: len(os.listdir(directory)) >= int(count))
        elif step == "affinity":
            print("affinity=" + ",".join(str(c) for c in sorted(os.sched_getaffinity(0))), flush=True)
        else:
            raise SystemExit(f"rank.py: unknown step {step!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
