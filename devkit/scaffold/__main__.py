"""`python -m devkit.scaffold NAME`: see devkit/scaffold/__init__.py."""

import sys

from devkit.scaffold import main

sys.exit(main())
