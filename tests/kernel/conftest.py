"""Fixtures for tests that run on the host and inside every kernel of
scripts/multikernel.

EXPECT_ABI is set by scripts/multikernel: "N" (0 = no Landlock: ENOSYS or
EOPNOTSUPP) or "N+" (at least N: a kernel newer than the version table).
Unset (a plain run on the host), the running kernel's ABI is expected.
"""
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for llsyscalls, any importmode
import llsyscalls  # noqa: E402


def parse_expect_abi(value):
    """Return (abi, at_least) from an EXPECT_ABI value, None if unset."""
    if not value:
        return None
    try:
        return int(value.rstrip("+")), value.endswith("+")
    except ValueError:
        raise pytest.UsageError(f"EXPECT_ABI={value!r}: want N or N+")


def _steps():
    """Which of the confined child's other steps this kernel has (tests/kernel/test_steps.py)."""
    import errno

    from landlock import support, syscalls

    def works(call, absent=(errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)):
        try:
            call()
        except OSError as e:
            return e.errno not in absent
        return True

    def openat2():
        os.close(syscalls.openat2(syscalls.AT_FDCWD, "/", os.O_PATH, syscalls.RESOLVE_NO_SYMLINKS))
    return {"keyrings": support.keyrings_available(), "openat2": works(openat2),
            "ioprio": works(syscalls.ioprio_get)}


def pytest_report_header(config):
    # scripts/multikernel reads the ABI the guest saw from this line.
    abi, err = llsyscalls.abi()
    why = f" ({err})" if err else ""
    return [f"landlock-abi: {abi}{why} expected: {os.environ.get('EXPECT_ABI', '(host)')}",
            "kernel-steps: " + ", ".join(f"{name} {'yes' if ok else 'NO (skipped)'}"
                                         for name, ok in _steps().items())]


@pytest.fixture(scope="session")
def running_abi():
    return llsyscalls.abi()[0]


@pytest.fixture(scope="session")
def expected_abi(running_abi):
    """The Landlock ABI this kernel must have (0: none).

    For "N+" the running ABI is returned once it is at least N, so that
    tests can rely on the value; test_abi checks the bound itself.
    """
    want = parse_expect_abi(os.environ.get("EXPECT_ABI"))
    if want is None:
        return running_abi
    abi, at_least = want
    return max(abi, running_abi) if at_least else abi
