import sys

from chronos.cli import main

sys.exit(main())
