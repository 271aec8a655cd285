"""The study scripts' job runner (research/workshop/jobs.py): every job runs, with its command and log beside it,
and failures are named."""

import sys

import pytest

from workshop.jobs import run_jobs


@pytest.mark.slow
def test_runs_every_job_and_names_the_failures(tmp_path):
    jobs = [(f"job{i}", [sys.executable, "-c", f"import os; print('hi', os.environ['OMP_NUM_THREADS']); exit({code})"],
             tmp_path / f"job{i}" / "train.log") for i, code in enumerate([0, 3, 0])]
    assert run_jobs(jobs, parallel=2, threads=1) == ["job1"]
    for name, command, log in jobs:
        assert log.read_text().strip() == "hi 1"
        assert (log.parent / "command.txt").read_text().strip() == " ".join(command)


def test_refuses_zero_parallel():
    with pytest.raises(ValueError, match="parallel"):
        run_jobs([], parallel=0)
