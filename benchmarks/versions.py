"""Two icemaint versions side by side in one benchmark run: the working tree and an earlier commit.

`checkout(rev)` makes a detached git worktree of `rev` in a temporary directory (removed after);
`Worker` runs `benchmarks/compaction_worker.py` in a subprocess with PYTHONPATH at one version's
source, keeps its Spark session for the whole run and answers JSON requests.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from benchmarks.compaction_worker import REPLY

REPO = Path(__file__).resolve().parent.parent
WORKER_SCRIPT = Path(__file__).resolve().parent / "compaction_worker.py"
# The commit before stage-prove-publish (rewrite_data_files on main, prove, roll back on failure).
BEFORE_STAGING = "4b85ad6"


class WorkerFailed(RuntimeError):
    """A worker process could not answer a request (its traceback and log tail are in the message)."""


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], check=True, capture_output=True, text=True).stdout.strip()


def describe_source(path: Path) -> dict:
    """The commit a checkout is at and whether it has uncommitted changes to tracked files."""
    commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    subject = subprocess.run(["git", "-C", str(path), "log", "-1", "--format=%s"], capture_output=True,
                             text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(path), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    if len(subject) > 120:
        subject = subject[:120].rsplit(" ", 1)[0].rstrip(";,:") + " ..."
    return {"path": str(path), "commit": commit, "subject": subject,
            "uncommitted_changes": sorted(line[3:] for line in dirty.splitlines())}


@contextlib.contextmanager
def checkout(rev: str) -> Iterator[Path]:
    """A detached worktree of `rev` in a temporary directory, removed (and pruned) afterwards."""
    tmp = Path(tempfile.mkdtemp(prefix="icemaint-bench-before-"))
    path = tmp / "src"
    _git("worktree", "add", "--detach", str(path), rev)
    try:
        yield path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run(["git", "-C", str(REPO), "worktree", "prune"], capture_output=True)


class Worker:
    """One version's compaction worker process (see compaction_worker.py for the protocol)."""

    def __init__(self, label: str, source: Path, log_path: Path, cwd: Path):
        self.label = label
        self.source = source
        self.log_path = log_path
        env = dict(os.environ)
        env["PYTHONPATH"] = str(source)  # before site-packages and the editable install's finder
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        cwd.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "wb")
        self.proc = subprocess.Popen([sys.executable, str(WORKER_SCRIPT)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._log, env=env, cwd=str(cwd))
        self.info: dict = {}

    def send(self, op: str, **fields) -> None:
        self.proc.stdin.write((json.dumps({"op": op, **fields}) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self) -> dict:
        while True:
            line = self.proc.stdout.readline()
            if not line:
                raise WorkerFailed(f"the {self.label} worker exited (code {self.proc.poll()}); log tail:\n"
                                   f"{self.log_tail()}")
            text = line.decode("utf-8", "replace")
            if text.startswith(REPLY):
                reply = json.loads(text[len(REPLY):])
                if not reply.get("ok"):
                    raise WorkerFailed(f"the {self.label} worker failed: {reply.get('error')}\n"
                                       f"{reply.get('traceback', '')}")
                return reply.get("result") or {}

    def request(self, op: str, **fields) -> dict:
        self.send(op, **fields)
        return self.receive()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.receive()
                self.proc.wait(timeout=60)
            except Exception:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self._log.close()


def start_workers(specs: list[tuple[str, Path]], config_doc_for, root: Path, log_dir: Path) -> dict[str, Worker]:
    """Starts one worker per (label, source) and initialises their Spark sessions concurrently.

    `config_doc_for(label)` gives each worker its config document (its own state_dir: claims and
    audit are per version, the warehouse is shared).
    """
    workers = {label: Worker(label, source, log_dir / f"worker_{label}.log", root) for label, source in specs}
    try:
        for label, w in workers.items():
            w.send("init", label=label, config=config_doc_for(label), root=str(root))
        for label, w in workers.items():
            w.info = w.receive()
            expected = Path(w.source).resolve() / "icemaint"
            if Path(w.info["icemaint"]) != expected:
                raise WorkerFailed(f"the {label} worker imported icemaint from {w.info['icemaint']}, not {expected}")
    except BaseException:
        for w in workers.values():
            w.close()
        raise
    return workers
