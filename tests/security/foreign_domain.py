"""The attacker of `audit-foreign-domain`: a Landlock domain made from a pid
a victim session's child gets next, denied after that child's fork.

Run as an unprivileged local user, or as a confined server (its domain is
then a nested one). Prints the pid P that creates the domain, which exits
at once, leaving L (same domain) waiting; at a line on stdin L tries to
create a file in each path of argv (a make_reg denial of that directory:
the `allocated` record, emitted now, names P), then everything exits, M
last ("done" once L is gone).
"""
import ctypes
import os
import struct
import sys

MAKE_REG = 1 << 8
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long


def restrict() -> None:
    attr = struct.pack("Q", MAKE_REG)   # handled_access_fs only: everything else stays allowed
    fd = libc.syscall(444, attr, len(attr), 0)
    if fd < 0 or libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, fd, 0) != 0:
        raise OSError(ctypes.get_errno(), "landlock")


go_r, go_w = os.pipe()
done_r, done_w = os.pipe()
p = os.fork()
if p == 0:
    restrict()
    if os.fork() == 0:
        os.close(go_w)
        os.close(done_r)
        os.read(go_r, 1)
        for path in sys.argv[1:]:
            try:
                os.close(os.open(os.path.join(path, "x"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
            except OSError:
                pass
        os._exit(0)
    os._exit(0)
os.close(done_w)
os.waitpid(p, 0)
print(p, flush=True)
sys.stdin.readline()
os.write(go_w, b"g")
os.close(go_w)
os.read(done_r, 1)   # EOF: L is gone
print("done", flush=True)
