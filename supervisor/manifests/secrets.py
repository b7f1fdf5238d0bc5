"""Where credentials live: what learn never reads or grants, and what a denial's proposed line never names."""
from __future__ import annotations

import os

# Under a home directory: credentials, tokens, keys, shell histories.
HOME_SECRETS = (".ssh", ".aws", ".gnupg", ".config/gh", ".config/hub", ".netrc", ".git-credentials",
                ".docker", ".kube", ".password-store", ".local/share/keyrings", ".pki", ".config/gcloud",
                ".azure", ".npmrc", ".pypirc", ".vault-token", ".terraform.d", ".cargo/credentials",
                ".cargo/credentials.toml", ".config/op", ".mozilla", ".config/google-chrome",
                ".config/chromium", ".bash_history", ".zsh_history", ".python_history", ".node_repl_history",
                ".psql_history", ".mysql_history", ".lesshst", ".viminfo")
SYSTEM_SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers",
                  "/etc/sudoers.d", "/etc/ssl/private", "/etc/security/opasswd", "/etc/krb5.keytab",
                  "/etc/credstore", "/etc/credstore.encrypted", "/run/credentials", "/etc/wireguard",
                  "/etc/NetworkManager/system-connections", "/var/lib/sss", "/var/backups",
                  "/var/lib/landlock-supervisor")
SSH_HOST_KEYS = "/etc/ssh"   # its ssh_host_*_key files; ssh_config stays readable


def is_env_file(name: str) -> bool:
    """`.env`, `.env.local`, `.env.production`: where projects keep their secrets."""
    return name == ".env" or name.startswith(".env.")


def within(path: str, root: str) -> bool:
    return root == "/" or path == root or path.startswith(root.rstrip("/") + "/")


def secret(path: str) -> bool:
    """Whether path is, or is inside, a location holding credentials,
    wherever it lies: a run of components of HOME_SECRETS anywhere in it
    (`.ssh`, `.config/gh`: in a home /etc/passwd does not list, under a
    $HOME set by the environment, in a project), a `.env` file (or a
    directory of that name), the system's own."""
    if any(within(path, s) for s in SYSTEM_SECRETS):
        return True
    name = os.path.basename(path)
    if os.path.dirname(path) == SSH_HOST_KEYS and name.startswith("ssh_host_") and name.endswith("_key"):
        return True
    parts = [p for p in path.split("/") if p]
    if any(is_env_file(p) for p in parts):
        return True
    return any(parts[i:i + len(run)] == run for run in _SECRET_RUNS for i in range(len(parts) - len(run) + 1))


# HOME_SECRETS as runs of components.
_SECRET_RUNS = tuple(s.split("/") for s in HOME_SECRETS)
