"""``python -m xrun`` and the ``xrun`` console script: ``xrun.joined``'s entry (the head's command line, handed what
joins the head and a node in one process).

xrun takes over SIGINT once it has started; before that, while its modules load (tens of milliseconds), a Ctrl-C
is Python's KeyboardInterrupt: nothing has started yet, so it ends xrun with 130, as a Ctrl-C later does,
instead of a traceback through the imports."""

import sys


def main() -> None:
    try:
        from xrun.joined.entry import entry  # inside the guard: a Ctrl-C while it loads exits 130
    except KeyboardInterrupt:
        sys.exit(130)
    entry()


if __name__ == "__main__":
    main()
