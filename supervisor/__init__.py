"""The single-threaded fork-server that spawns confined servers, and its clients."""
