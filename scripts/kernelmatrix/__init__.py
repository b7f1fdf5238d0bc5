"""scripts/multikernel's program: the Landlock tests under many kernels, as a matrix.

Standard library only: it runs before any venv exists. In the order of a run:
  main.py     the command line, then prepare every kernel at once, run the guests, print
  kernels.py  the kernels as a table: how each is had and which Landlock ABI it should show
  host.py     the host: its packages, its Debian mirrors, a private APT, the cache lock
  patched.py  the test-only kernel, built once from Debian's source with the ABI patch
  qemu.py     the initramfs and the qemu command line every guest boots with
  debian.py   Debian's generic kernels, downloaded, with an initramfs that reaches the host root
  guest.py    one guest run: its script, its kernel command line, its console log read
  matrix.py   the printed matrix
  proc.py     child processes in their own groups, logs, the two failures (Skip, Fail)
  config.py   where things are (the repository, scripts/multikernel.d, the cache)
"""
