import sys

from flyexplore.cli import main

sys.exit(main())
