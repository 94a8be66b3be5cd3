from __future__ import annotations

import sys

from kvdiag.cli import main

sys.exit(main())
