"""Typed errors for user mistakes: each message says what was wrong and how to fix it."""


class JaxcoreError(Exception):
    """Base class of every error jaxcore raises on purpose."""


class ConfigError(JaxcoreError, ValueError):
    """A configuration field has a value that cannot work (names the field and the fix)."""


class BatchError(JaxcoreError, ValueError):
    """A batch does not fit the mesh or the step (names the array and the fix)."""


class StateError(JaxcoreError, ValueError):
    """A train state cannot be used (it was donated to an earlier step, say)."""


class TrainingDivergedError(JaxcoreError, RuntimeError):
    """Training stopped because steps kept producing a non-finite loss or gradient.

    Attributes:
        step: the train step (``state.step`` after it) that crossed the limit.
        state: the newest train state, which holds the last finite update (skipped steps
            leave it untouched), so a run can be saved or inspected before it stops.
    """

    def __init__(self, message: str, *, step: int, state: object = None):
        super().__init__(message)
        self.step = step
        self.state = state


def check_keywords(
    what: str,
    known: list[str],
    given: dict,
    hints: dict[str, str] | None = None,
    owner: str | None = None,
) -> None:
    """Raise `ConfigError` for a keyword of ``given`` that is not in ``known``, naming the
    setting meant (``hints[name]``, else a close spelling, else every setting).
    ``what`` starts the message (the call); ``owner`` is the class whose settings these
    are (default ``jaxcore.<what>``)."""
    import difflib

    for name in given:
        if name in known:
            continue
        if hints and name in hints:
            hint = hints[name]
        elif close := difflib.get_close_matches(name, known, n=1):
            hint = f"did you mean {close[0]!r}?"
        else:
            hint = f"the settings are {', '.join(known)}."
        raise ConfigError(
            f"{what}: {name!r} is not a setting of {owner or 'jaxcore.' + what}; {hint}"
        )
