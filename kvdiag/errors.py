"""Errors that reach the user: each carries the process exit code and a one-line message."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_USAGE = 2
EXIT_ABORTED = 3


class KvdiagError(Exception):
    """An error the CLI reports as one line (no traceback unless ``--debug``)."""

    exit_code: int = EXIT_USAGE

    def __init__(self, message: str, exit_code: int | None = None) -> None:
        super().__init__(message)
        if exit_code is not None:
            self.exit_code = exit_code


class UsageError(KvdiagError):
    """Bad option values or an impossible configuration."""


class InputError(KvdiagError):
    """A file that cannot be read or is not what it claims to be."""


class DeviceUnavailable(KvdiagError):
    """The requested executor or device is not present on this machine."""


class DeviceFault(KvdiagError):
    """A device call or kernel failed mid-run; ``cuda_error`` is the driver's own text. The
    capture records it as an abort and ends, as the server would."""

    exit_code = EXIT_ABORTED

    def __init__(self, message: str, cuda_error: str) -> None:
        super().__init__(message)
        self.cuda_error = cuda_error


class Terminated(KvdiagError):
    """A termination signal arrived (SIGTERM, SIGHUP): raised by the handler that a long
    command installs so that its ``finally`` blocks run (a capture writes its End event);
    exit 128 + the signal number, as a shell reports it."""

    def __init__(self, signal_name: str, signum: int) -> None:
        super().__init__(f"terminated by {signal_name}", 128 + signum)
        self.signal_name = signal_name
