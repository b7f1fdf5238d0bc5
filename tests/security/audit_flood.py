"""The attacker of `audit-flood-foreign`: denials from Landlock domains the
supervisor does not know, as fast as it can, for argv[1] seconds: a child
at a time, each in a fresh domain, making argv[2] denied opens."""
import ctypes
import os
import struct
import sys
import time

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
attr = struct.pack("Q", 1 << 2)   # READ_FILE handled
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    if os.fork() == 0:
        fd = libc.syscall(444, attr, len(attr), 0)
        if fd < 0 or libc.prctl(38, 1, 0, 0, 0) != 0 or libc.syscall(446, fd, 0) != 0:
            os._exit(1)
        for _ in range(int(sys.argv[2])):
            try:
                os.close(os.open("/etc/hostname", os.O_RDONLY))
            except OSError:
                pass
        os._exit(0)
    os.wait()
