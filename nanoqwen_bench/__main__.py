"""`python -m nanoqwen_bench FILE [--device cuda] [--json OUT] ...`: the same run as `nanoqwen bench`."""
import sys

from .measure import main

sys.exit(main())
