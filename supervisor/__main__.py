"""`python -m supervisor`: the landlock-supervisor command."""
import sys

from .cli import main

sys.exit(main())
