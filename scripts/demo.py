"""The main job: a real MCP server through the supervisor, and the kernel saying no.

Run by scripts/demo after set-up. Starts the supervisor with the example
manifests, talks MCP to @modelcontextprotocol/server-filesystem through it,
then tells the server a directory is allowed that its manifest does not
grant: the server's own checks let the read through, Landlock stops it.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "examples"))

from mcp_session import McpSession, tool_text  # noqa: E402

from supervisor.client import Client  # noqa: E402


def step(text: str) -> None:
    print(f"\n== {text}", flush=True)


def main() -> int:
    work = tempfile.mkdtemp(prefix="landlock-demo-")
    projects, secret = os.path.join(work, "projects"), os.path.join(work, "secret")
    os.makedirs(projects)
    os.makedirs(secret)
    with open(os.path.join(projects, "notes.txt"), "w") as f:
        f.write("hello from an allowed project\n")
    with open(os.path.join(secret, "id_ed25519"), "w") as f:
        f.write("-----BEGIN OPENSSH PRIVATE KEY----- (not really)\n")
    repo = os.path.join(work, "repo")
    subprocess.run(["git", "init", "-q", repo], check=True)
    if os.geteuid() == 0:
        # The examples run as dynamic uids under root: they must reach their directories.
        os.chmod(work, 0o755)
        subprocess.run(["chmod", "-R", "a+rwX", projects, repo], check=True)
    sock = os.path.join(work, "run", "supervisor.sock")
    env = dict(os.environ, MCP_SERVERS=os.path.join(REPO, ".servers"), MCP_PROJECTS=projects, MCP_REPO=repo)

    step("landlock-supervisor serve --manifests examples/   (the fork-server, on a private socket)")
    server = subprocess.Popen([sys.executable, "-m", "supervisor", "--socket", sock, "serve",
                               "--manifests", os.path.join(REPO, "examples"),
                               "--state-root", os.path.join(work, "state")], env=env)
    try:
        client = Client(sock)
        while True:
            if server.poll() is not None:
                raise SystemExit(f"the supervisor did not start (exit {server.returncode})")
            try:
                client.ping()
                break
            except OSError:
                time.sleep(0.05)
        # The proxy tells the server that `secret` is allowed too. The
        # manifest grants only `projects`: the kernel has the last word.
        in_r, in_w = os.pipe()
        out_r, out_w = os.pipe()
        started = time.monotonic()
        log = os.open(os.path.join(work, "filesystem.stderr"), os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600)
        with client.spawn("filesystem", [secret], stdin=in_r, stdout=out_w, stderr=log) as child:
            for fd in (in_r, out_w, log):
                os.close(fd)
            report = child.report
            print(f"spawned filesystem server, pid {child.pid}: Landlock ABI {report.abi}, "
                  f"{len(report.handled_fs)} filesystem rights and TCP handled, scopes: {', '.join(report.scoped)}, "
                  f"no_new_privs, capabilities dropped: {report.capabilities_dropped}")
            if report.downgraded:
                print("not on this kernel: " + "; ".join(f"{k} ({v})" for k, v in report.downgraded.items()))
            session = McpSession(in_w, out_r, timeout=20)
            info = session.initialize()
            print(f"initialize: {info['serverInfo']['name']} {info['serverInfo']['version']} "
                  f"in {time.monotonic() - started:.2f} s")
            tools = [t["name"] for t in session.list_tools()]
            print(f"tools/list: {len(tools)} tools: {', '.join(tools[:6])}, ...")
            allowed = session.call_tool("list_allowed_directories", {})
            print(f"the server believes it may use: {tool_text(allowed).strip()}")

            step(f"read_text_file {projects}/notes.txt  (granted by the manifest)")
            print(tool_text(session.call_tool("read_text_file", {"path": os.path.join(projects, "notes.txt")})).strip())

            step(f"read_text_file {secret}/id_ed25519  (the server allows it; the manifest does not)")
            result = session.call_tool("read_text_file", {"path": os.path.join(secret, "id_ed25519")})
            text = tool_text(result).strip()
            print(text)
            denied = result.get("isError") and "EACCES" in text
            print("-> denied by the kernel (Landlock), not by the server" if denied
                  else "-> NOT DENIED: the sandbox failed")
            os.close(in_w)
            child.wait(10)
            os.close(out_r)
    finally:
        server.terminate()
        server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    return 0 if denied else 1


if __name__ == "__main__":
    sys.exit(main())
