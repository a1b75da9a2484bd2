import sys

from xrun.runner.cli import main

sys.exit(main())
