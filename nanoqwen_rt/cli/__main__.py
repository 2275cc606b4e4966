"""`python -m nanoqwen_rt.cli ...` = the `nanoqwen` console script."""
from .commands import main

main(prog_name="nanoqwen")
