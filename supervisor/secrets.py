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


def secret(path: str, homes: frozenset[str] | tuple[str, ...]) -> bool:
    """Whether path is, or is inside, a location holding credentials (in
    any of `homes`, or the system's), or is a .env file."""
    if any(within(path, s) for s in SYSTEM_SECRETS) or is_env_file(os.path.basename(path)):
        return True
    name = os.path.basename(path)
    if os.path.dirname(path) == SSH_HOST_KEYS and name.startswith("ssh_host_") and name.endswith("_key"):
        return True
    return any(within(path, os.path.join(home, s)) for home in homes for s in HOME_SECRETS)
