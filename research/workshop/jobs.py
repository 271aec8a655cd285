"""Run many training commands side by side (the study scripts' job runner)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path


def run_jobs(jobs: list[tuple[str, list[str], Path]], parallel: int = 1, threads: int = 1) -> list[str]:
    """Run ``(name, command, log file)`` jobs, ``parallel`` at a time with ``OMP_NUM_THREADS=threads`` each.

    Each command is written beside its log as ``command.txt``. Returns the names of the jobs that failed.
    """
    if parallel < 1 or threads < 1:
        raise ValueError(f"parallel and threads must be at least 1, got {parallel} and {threads}")
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1"}
    pending, running, failed, start = list(jobs), {}, [], time.monotonic()
    print(f"{len(pending)} runs, {parallel} at a time", flush=True)
    while pending or running:
        while pending and len(running) < parallel:
            name, command, log_path = pending.pop(0)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            (log_path.parent / "command.txt").write_text(" ".join(command) + "\n")
            log = open(log_path, "w")
            running[subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)] = (name, log)
        time.sleep(1)
        for proc in [p for p in running if p.poll() is not None]:
            name, log = running.pop(proc)
            log.close()
            status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"[{time.monotonic() - start:7.0f}s] {name}: {status}", flush=True)
            if proc.returncode:
                failed.append(name)
    return failed
