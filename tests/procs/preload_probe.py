"""What a rank can see of how it was started, as one JSON line on stdout: run it started by Popen and forked from
the preload helper (tests/test_preload.py), and the two must agree on everything but their pids.

``preload_probe.py [KEY=VALUE ...]``: ``sleep=S`` sleeps S seconds first (after printing ``up``), ``torch=1``
adds torch's thread count and seed, ``mp=1`` runs a spawn and a fork multiprocessing pool, ``rand=1`` adds
draws from every global generator.
"""

import ctypes
import faulthandler
import gc
import json
import os
import signal
import sys
import time

import __main__


def handler_name(h):
    if h is signal.default_int_handler:
        return "default_int_handler"
    return {signal.SIG_DFL: "SIG_DFL", signal.SIG_IGN: "SIG_IGN", None: "None"}.get(h, repr(h))


def getenv(name):
    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    value = libc.getenv(name.encode())
    return None if value is None else value.decode()


def stream(s):
    raw = s.buffer if not hasattr(s.buffer, "raw") else s.buffer.raw
    return {"type": type(s.buffer).__name__, "name": getattr(raw, "name", None), "write_through": s.write_through,
            "line_buffering": s.line_buffering, "encoding": s.encoding, "errors": s.errors, "mode": s.mode,
            "fileno": s.fileno(), "same_as_dunder": s is getattr(sys, f"__{raw.name.strip('<>')}__")}


def proc_words(name):
    with open(f"/proc/self/{name}", "rb") as f:
        return [w.decode() for w in f.read().split(b"\0")[:-1]]


def main():
    opts = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    if "sleep" in opts:
        print("up", flush=True)
        time.sleep(float(opts["sleep"]))
    main_keys = {k: type(v).__name__ for k, v in vars(__main__).items() if k.startswith("__")}
    spec = getattr(__main__, "__spec__", None)
    report = {
        "argv": sys.argv, "orig_argv": getattr(sys, "orig_argv", None), "path": sys.path, "executable": sys.executable,
        "main": main_keys, "file": getattr(__main__, "__file__", None), "name": __name__,
        "spec": getattr(spec, "name", None), "loader": type(getattr(__main__, "__loader__", None)).__name__,
        "main_is_module": sys.modules["__main__"] is __main__,
        "environ": dict(os.environ), "c_env": {k: getenv(k) for k in ("PROBE_VAR", "PATH", "HOME")},
        "cwd": os.getcwd(), "session_leader": os.getsid(0) == os.getpid(), "group_leader": os.getpgid(0) == os.getpid(),
        "ppid": os.getppid(),
        "cmdline": proc_words("cmdline"), "proc_environ": sorted(proc_words("environ")),
        "comm": open("/proc/self/comm").read().strip(),
        "signals": {s.name: handler_name(signal.getsignal(s)) for s in signal.Signals
                    if s not in (signal.SIGKILL, signal.SIGSTOP)},
        "blocked": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "stdin": sys.stdin.read(), "stdout": stream(sys.stdout), "stderr": stream(sys.stderr),
        "stdin_stream": stream(sys.stdin),
        "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd"))[:3],
        "affinity": sorted(os.sched_getaffinity(0)), "umask": os.umask(0o22),
        "flags": list(sys.flags), "xrun_loaded": "xrun" in sys.modules,
        "threads": len(os.listdir("/proc/self/task")),
        "gc": [gc.isenabled(), gc.get_threshold()],
        "dont_write_bytecode": sys.dont_write_bytecode, "faulthandler": faulthandler.is_enabled(),
    }
    if opts.get("torch"):
        import torch

        report["torch_threads"] = torch.get_num_threads()
        report["torch_seed"] = torch.initial_seed()
    if opts.get("rand"):
        import random

        import numpy

        report["draws"] = [random.random(), float(numpy.random.random())]
        if "torch" in sys.modules:
            report["draws"].append(float(sys.modules["torch"].rand(1)))
        import multiprocessing

        report["authkey"] = multiprocessing.current_process().authkey.hex()
    if opts.get("mp"):
        import multiprocessing

        for method in ("spawn", "fork"):
            with multiprocessing.get_context(method).Pool(2) as pool:
                report[f"mp_{method}"] = pool.map(abs, [-1, -2, -3])
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
