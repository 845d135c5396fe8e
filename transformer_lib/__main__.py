"""`python -m transformer_lib ...` runs the course's command line (see transformer_lib/cli.py)."""
import sys

from transformer_lib.cli import main

sys.exit(main())
