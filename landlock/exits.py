"""The seed's exit codes, which landlock-exec and landlock-supervisor share: imports nothing."""

EXIT_USAGE = 2             # a spec, manifest or command line that cannot be used
EXIT_UNAVAILABLE = 3       # Landlock, or a required feature, missing
EXIT_THREADS = 4           # more than one thread: the domain would confine one
EXIT_EXEC_FAILED = 126     # confined, but the exec failed (as a shell has it)
EXIT_NOT_FOUND = 127       # no such program (as a shell has it)
