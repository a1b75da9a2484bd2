"""``--token``'s forms on the connect-mode agent's command line: where the run's key comes from.

There is no other form: a token on the command line would be every local user's to read. Its own module so that the
agent's start path (``xrun.launch.connect``) reads them without importing the renderer (``xrun.launch.command``).
"""

TOKEN_ON_STDIN = "-"  # noqa: S105 - "read it from stdin's first line"
TOKEN_ENV_PREFIX = "env:"  # noqa: S105 - "env:NAME": read it from variable NAME
TOKEN_ANNOUNCE = "announce"  # noqa: S105 - make a one-time key and announce it on stdout (xrun.channel.announce)
