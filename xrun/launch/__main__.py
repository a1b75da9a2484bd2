import sys

from xrun.launch.cli import main

sys.exit(main())
