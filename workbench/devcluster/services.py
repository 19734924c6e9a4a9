"""The services under Slurm: munge (authentication), MariaDB and slurmdbd (accounting).

MariaDB is reachable only through its Unix socket: ``--skip-networking``
opens no TCP port, and the socket's directory (``run/``) is 0700, so only the
OS user running the cluster can connect at all. Its superuser accounts use
``unix_socket`` authentication: ``root`` for the OS root, and the cluster's OS
user by name, so there is no superuser password to store or leak, and whoever
can log in as one already owns the data directory. slurmdbd uses its own
account, limited to the accounting database, with the password from
:func:`~workbench.devcluster.config.db_password`; it has no socket setting and
reaches the socket through ``$MYSQL_UNIX_PORT``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from workbench.devcluster.config import DB_NAME, DB_USER, db_password
from workbench.devcluster.daemons import as_host, daemon_env, run_client, start, wait_until
from workbench.devcluster.layout import ACCOUNT, CLUSTER_NAME, Layout

# Small and fast rather than durable across host crashes: this is a throw-away accounting DB.
# (slurmdbd logs that these are "not recommended values"; harmless here.)
MARIADB_TUNING = (
    "--innodb-buffer-pool-size=32M",
    "--innodb-log-file-size=16M",
    "--skip-log-bin",
    "--innodb-flush-log-at-trx-commit=2",
    "--innodb-doublewrite=0",
    # slurmdbd's schema set-up holds locks for long on a busy host
    "--innodb-lock-wait-timeout=900",
)


def start_munged(layout: Layout, state: dict) -> None:
    if not layout.munge_key.exists():
        subprocess.run(["mungekey", "-c", "-k", str(layout.munge_key)], check=True, capture_output=True)
    layout.munge_key.chmod(0o600)
    os.chmod(layout.munge, 0o700)
    # munged refuses a socket directory that others may write to; clients need to traverse it.
    layout.munge_socket_dir.mkdir(exist_ok=True)
    os.chmod(layout.munge_socket_dir, 0o755)
    layout.munge_socket.unlink(missing_ok=True)
    start(
        layout,
        state,
        "munged",
        [
            "munged",
            "--foreground",
            "--force",
            f"--socket={layout.munge_socket}",
            f"--key-file={layout.munge_key}",
            f"--pid-file={layout.run / 'munged.pid'}",
            f"--seed-file={layout.munge / 'munged.seed'}",
        ],
        daemon_env(layout),
    )
    wait_until(lambda: layout.munge_socket.exists(), time.monotonic() + 15, layout, "munged")


def start_mariadb(layout: Layout, state: dict, user: str, deadline: float) -> None:
    """Start MariaDB on its Unix socket only; make the accounts slurmdbd and the cluster's user need."""
    if not (layout.mysql_data / "mysql").is_dir():
        shutil.rmtree(layout.mysql_data, ignore_errors=True)
        subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={layout.mysql_data}",
                f"--user={user}",
                "--auth-root-authentication-method=socket",
                f"--auth-root-socket-user={user}",
                "--skip-test-db",
                *MARIADB_TUNING,
            ],
            check=True,
            capture_output=True,
            text=True,
        )
    layout.run.chmod(0o700)
    layout.mysql_socket.unlink(missing_ok=True)
    start(
        layout,
        state,
        "mariadbd",
        [
            "mariadbd",
            "--no-defaults",
            f"--datadir={layout.mysql_data}",
            f"--user={user}",
            f"--socket={layout.mysql_socket}",
            "--skip-networking",
            f"--pid-file={layout.run / 'mariadbd.pid'}",
            f"--log-error={layout.log_of('mariadbd')}",
            "--skip-name-resolve",
            *MARIADB_TUNING,
        ],
        daemon_env(layout),
    )
    accounts = _accounts_sql(user, db_password(layout))
    wait_until(lambda: _as_superuser(layout, user, accounts), deadline, layout, "mariadbd")


def _accounts_sql(user: str, password: str) -> str:
    """Idempotent: superusers by ``unix_socket`` only, slurmdbd's account, nothing else that logs in.

    Also brings a state directory made before this (root with an empty
    password, also at 127.0.0.1, ::1 and the host name) to the same accounts.
    """
    superuser = (
        []
        if user == "root"
        else [
            f"CREATE USER IF NOT EXISTS '{user}'@'localhost' IDENTIFIED VIA unix_socket;",
            f"ALTER USER '{user}'@'localhost' IDENTIFIED VIA unix_socket;",
            f"GRANT ALL PRIVILEGES ON *.* TO '{user}'@'localhost' WITH GRANT OPTION;",
        ]
    )
    return "".join(
        [
            f"DELETE FROM mysql.global_priv WHERE user = '' OR (user IN ('root', '{DB_USER}') AND host <> 'localhost');",
            "FLUSH PRIVILEGES;",
            *superuser,
            "ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket;",
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'localhost' IDENTIFIED BY '{password}';",
            f"ALTER USER '{DB_USER}'@'localhost' IDENTIFIED BY '{password}';",
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'localhost';",
        ]
    )


def _as_superuser(layout: Layout, user: str, sql: str) -> bool:
    """Run ``sql`` as the cluster's user (unix_socket), else as a passwordless root (a state dir from before).

    On stdin, not in argv: it holds slurmdbd's password, and any user may read another's argv.
    """
    for db_user in dict.fromkeys((user, "root")):
        client = ["mariadb", "--no-defaults", f"--socket={layout.mysql_socket}", f"-u{db_user}"]
        if subprocess.run(client, input=sql.encode(), capture_output=True).returncode == 0:
            return True
    return False


def start_slurmdbd(layout: Layout, state: dict, head: str, deadline: float) -> None:
    env = {**daemon_env(layout), "MYSQL_UNIX_PORT": str(layout.mysql_socket)}
    start(layout, state, "slurmdbd", [*as_host(head), "slurmdbd", "-D"], env)
    wait_until(
        lambda: run_client(layout, ["sacctmgr", "-n", "-P", "list", "cluster"], check=False).returncode == 0,
        deadline,
        layout,
        "slurmdbd",
    )


def ensure_associations(layout: Layout, user: str) -> None:
    """Cluster, account and the user's association; sacctmgr refuses duplicates, so ask first."""

    def listed(entity: str, *fmt: str) -> set[str]:
        out = run_client(layout, ["sacctmgr", "-n", "-P", "list", entity, f"format={','.join(fmt)}"]).stdout
        return {line.strip() for line in out.splitlines() if line.strip()}

    if CLUSTER_NAME not in listed("cluster", "Cluster"):
        run_client(layout, ["sacctmgr", "-i", "add", "cluster", CLUSTER_NAME])
    if ACCOUNT not in listed("account", "Account"):
        run_client(
            layout,
            [
                "sacctmgr",
                "-i",
                "add",
                "account",
                ACCOUNT,
                f"Cluster={CLUSTER_NAME}",
                "Description=workbench dev cluster",
                "Organization=workbench",
            ],
        )
    if f"{user}|{ACCOUNT}" not in listed("association", "User", "Account"):
        run_client(
            layout,
            [
                "sacctmgr",
                "-i",
                "add",
                "user",
                user,
                f"Account={ACCOUNT}",
                f"DefaultAccount={ACCOUNT}",
                f"Cluster={CLUSTER_NAME}",
            ],
        )
