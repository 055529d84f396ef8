"""The one exception type for problems a user can cause and fix (bad path, bad checkpoint, bad config)."""

from __future__ import annotations


class ProbeError(Exception):
    """A user-fixable problem. Its message is one line that names the problem and, where it helps, the fix.

    CLIs print ``error: <message>`` on stderr and exit with code 2; library callers catch it like any exception.
    """
