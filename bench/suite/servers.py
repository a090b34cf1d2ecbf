"""A real `qsm server` on 127.0.0.1 (plaintext TCP) with one registered node, and the
client's environment for it. The server process is bench/load.py's."""

import os
import shutil
import sys

from common import QSM, REPO, Commands, run

sys.path.insert(0, os.path.join(REPO, "bench"))
import load  # noqa: E402  (bench/load.py: Server, proc_cpu)

PASSWORD = "bench-password"


class Served:
    """A server under ROOT (catalog and pool in ROOT unless CATALOG/POOL place them) with the
    node `bench`."""

    def __init__(self, root, catalog=None, pool=None):
        os.makedirs(root, exist_ok=True)
        self.root = root
        self.server = load.Server(os.path.join(root, "srv"), pool or os.path.join(root, "pool"),
                                  catalog)
        r = self.server.admin("register-node", "bench", stdin=PASSWORD + "\n")
        if r.returncode != 0:
            self.server.stop()
            raise SystemExit(f"register-node: {r.stderr}")
        pw = os.path.join(root, "pw")
        with open(pw, "w") as f:
            f.write(PASSWORD + "\n")
        os.chmod(pw, 0o600)
        self.env = {"QSM_SERVER": self.server.url, "QSM_NODE": "bench",
                    "QSM_PASSWORD_FILE": pw, "HOME": root,
                    "QSM_HOME": os.path.join(root, "no-embedded")}

    def cpu(self):
        """The server's user+sys seconds so far."""
        return load.proc_cpu(self.server.proc.pid)

    def client(self, cmds: Commands, *args, shape=None, qsm=QSM):
        """Runs `qsm ARGS` (the binary QSM) as the node, measured; the command (or SHAPE) is
        noted for the document."""
        argv = [qsm, *args]
        cmds.note(argv, {"QSM_SERVER": "http://127.0.0.1:PORT", "QSM_NODE": "bench"},
                  shape=shape and f"QSM_SERVER=http://127.0.0.1:PORT QSM_NODE=bench {shape}")
        return run(argv, env=self.env)

    def timed(self, cmds: Commands, *args, shape=None):
        """(client Run, server CPU seconds during it)."""
        before = self.cpu()
        r = self.client(cmds, *args, shape=shape)
        return r, self.cpu() - before

    def stop(self):
        """Stops the server and removes its directory: catalog and pool (a benchmark's pool
        grows by every run, and only its timings are kept)."""
        self.server.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()
