"""Exceptions that map to the process exit codes in DESIGN.md.

Stages raise these (or plain ValueError / FileNotFoundError for bad input); only the
process edge (`python -m ...` entry points) maps them to exit codes via `exit_code_for`.
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_BAD_INPUT = 2  # bad usage, config or input data: never retried
EXIT_KILLED = 3  # aborted by a kill criterion (non-finite loss, Q divergence, ...): never retried
EXIT_SIGTERM = 143  # stopped by SIGTERM after writing a checkpoint: retried
EXIT_CUDA_OOM = 75  # CUDA out of memory (sysexits' EX_TEMPFAIL): no checkpoint of the broken state; retried


class InputError(ValueError):
    """Bad input data or configuration. Message names the file, the record and the rule broken."""

    def __init__(self, path: object, record: object, rule: str):
        self.path, self.record, self.rule = path, record, rule
        where = f"{path}" if record is None else f"{path}, record {record}"
        super().__init__(f"{where}: {rule}")


class KillCriterion(RuntimeError):
    """Training aborted by a kill criterion; `reason` is a short machine-readable tag."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        super().__init__(f"kill criterion '{reason}' fired" + (f": {detail}" if detail else ""))


def exit_code_for(exc: BaseException) -> int:
    """Exit code for an exception escaping a process entry point."""
    if isinstance(exc, KillCriterion):
        return EXIT_KILLED
    if isinstance(exc, (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError)):
        return EXIT_BAD_INPUT
    return 1
