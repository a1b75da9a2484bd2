"""What the head leaves in ``--log_dir`` once the verdict is in, beside ``summary.json`` (``figures``): a failed
job's ``failure.json`` (the hang doctor's collective findings and where each node's full records are), then
``report.html`` (issue 40 §2), the record drawn, once every other file is written."""

from __future__ import annotations

import os

from xrun.common.result.failure_report import write_json
from xrun.runner.job.doctor import HeadDoctor
from xrun.runner.job.events import Verdict
from xrun.runner.job.last_words import headline


def write_end_files(log_dir: str, verdict: Verdict, doctor: HeadDoctor, *, recorded: bool) -> None:
    """``failure.json`` where the job failed and the doctor has findings; ``report.html`` where the job was
    recorded (``recorded``: the record's ``events.jsonl`` is in ``log_dir``)."""
    findings = doctor.findings
    if verdict.exit_code != 0 and findings is not None:
        write_json(os.path.join(log_dir, "failure.json"), {
            "exit_code": verdict.exit_code, "headline": headline(verdict),
            "collectives": {"findings": findings.to_json(), "files": doctor.findings_files}})
    if recorded:
        # Lazy: the page's modules (~1.3 MiB of RSS, hashlib's OpenSSL among them) are needed once, at the end:
        # the head does not carry them while the job runs.
        from xrun.runner.report.command import write_report

        write_report(log_dir)
