"""`python -m landlock`: the landlock-exec command."""
from .cli import main

main()
