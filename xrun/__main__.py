from xrun.runner.cli import entry

entry()
