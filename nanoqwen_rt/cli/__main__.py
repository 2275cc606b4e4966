"""`python -m nanoqwen_rt.cli ...` = the `nanoqwen` console script."""
from . import main

main(prog_name="nanoqwen")
