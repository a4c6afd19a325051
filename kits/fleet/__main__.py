"""`python -m kits.fleet FOLDER`: the wheels the tests install, built before they start (`make test`)."""

import shutil
import sys
from pathlib import Path

from kits.fleet.install import build_ahead

if __name__ == "__main__":
    out = Path(sys.argv[1])
    shutil.rmtree(out, ignore_errors=True)
    build_ahead(out)
