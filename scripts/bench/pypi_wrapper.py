"""A wrapper a proxy author might write with the PyPI `landlock` package:
the same path rules as the manifest, rlimits, the uid drop, then exec.
(That package handles filesystem rights only: no network rules, no scopes.)
Run by the benchmark with that package's venv; never imported (its `landlock`
is not this repository's, hence no type checking here)."""
# mypy: ignore-errors
import json, os, resource, sys
from landlock import FSAccess, Ruleset

rules = json.loads(os.environ.pop("BENCH_LANDLOCK_RULES"))
R = FSAccess.READ_FILE | FSAccess.READ_DIR
RX = R | FSAccess.EXECUTE
RW = FSAccess.all() & ~FSAccess.EXECUTE
RWX = FSAccess.all()
FILE = FSAccess.all_file()
rs = Ruleset()
for key, access in (("rx", RX), ("r", R), ("rwx", RWX), ("rw", RW)):
    for path in rules[key]:
        if not os.path.exists(path):
            continue
        rs.allow(path, rules=access if os.path.isdir(path) else access & FILE)
for res, soft, hard in rules["rlimits"]:
    resource.setrlimit(res, (soft, hard))
os.setsid()
if os.geteuid() == 0:
    os.setgroups([])
os.setresgid(rules["gid"], rules["gid"], rules["gid"])
os.setresuid(rules["uid"], rules["uid"], rules["uid"])
rs.apply()
os.execve(sys.argv[1], sys.argv[1:], os.environ)
