"""User-facing errors.

Every error a user can cause by what they wrote (a file, a flag, a preset name) is a `SimdistError`.
Its message names where (file and line when known), what (the field path) and the fix. The CLI prints
`error: <message>` as one line on stderr and exits with status 2; library callers catch the class.
"""

from __future__ import annotations

EXIT_USAGE = 2


class SimdistWarning(UserWarning):
    """Something a user should know about a result that is still given (a calibration used outside what it was
    fitted on, too few points, ...). Raised with `warnings.warn`; the CLI prints ``warning: <one line>`` on
    stderr, once per message."""


class SimdistError(Exception):
    """Base class of errors caused by user input.

    Parameters mirror what a reader needs: ``problem`` (what is wrong), ``field`` (dotted path of the
    offending field, e.g. ``inter_node.nic_bandwidth``), ``source`` (file, optionally with ``:line``) and
    ``fix`` (what to write instead).
    """

    def __init__(
        self,
        problem: str,
        *,
        field: str | None = None,
        source: str | None = None,
        fix: str | None = None,
    ) -> None:
        self.problem = problem
        self.field = field
        self.source = source
        self.fix = fix
        super().__init__(self.one_line())

    def one_line(self) -> str:
        parts: list[str] = []
        if self.source:
            parts.append(self.source)
        if self.field:
            parts.append(self.field)
        head = ": ".join(parts)
        text = f"{head}: {self.problem}" if head else self.problem
        if self.fix:
            text = f"{text} (fix: {self.fix})"
        # One line, always: a message spanning lines is hard to grep and to test.
        return " ".join(text.split())

    def located(self, *, source: str | None = None, field_prefix: str | None = None) -> SimdistError:
        """Return a copy that also names the file and/or sits under a parent field."""
        field = self.field
        if field_prefix:
            field = f"{field_prefix}.{field}" if field else field_prefix
        return type(self)(self.problem, field=field, source=source or self.source, fix=self.fix)


class UnitError(SimdistError):
    """A quantity could not be parsed (missing or unknown unit, negative value, ...)."""


class SpecError(SimdistError):
    """An input file or override does not match the schema."""


class PresetError(SimdistError):
    """An unknown preset name (the message lists the valid ones)."""


class TopologyError(SimdistError):
    """A topology that cannot be built (disconnected GPUs, impossible fabric, ...)."""


class LayoutError(SimdistError):
    """A parallel layout that cannot be placed on the cluster."""


class LimitError(SimdistError):
    """An input that asks for more work or memory than `simdist.limits` allows (the message gives the numbers)."""


class OutputError(SimdistError):
    """A file that cannot be written (the message names the target and the reason)."""


class SimdistNote(SimdistWarning):
    """Something a user should know that does not put the result in doubt (a dropped torn line, a measurement
    ignored); the CLI prints ``note: <one line>``."""


def note(message: str) -> None:
    """Tell the user something (``note: ...`` on stderr from the CLI; a `SimdistNote` for library callers)."""
    import warnings

    warnings.warn(" ".join(message.split()), SimdistNote, stacklevel=2)
