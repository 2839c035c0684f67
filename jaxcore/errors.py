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


# What a local weights or tokenizer path ends in, never a Hub repository id (ids may
# hold dots: Qwen/Qwen2.5-0.5B).
_FILE_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".json", ".model")


def hub_name_hint(spec: object) -> str:
    """A sentence for a missing path that reads as a Hugging Face Hub id (``org/name``):
    nothing is downloaded, so say how to fetch it; ``""`` for what is plainly a local
    path (``./x``, ``/x``, ``missing/``, ``out/model.safetensors``, a folder that exists)."""
    import os
    from pathlib import Path

    if isinstance(spec, os.PathLike):
        spec = os.fspath(spec)
    if not isinstance(spec, str) or spec.count("/") != 1:
        return ""
    path = Path(spec)
    if (
        spec.startswith((".", "/", "~"))
        or spec.endswith("/")
        or path.suffix in _FILE_SUFFIXES
        or path.parent.exists()
    ):
        return ""
    return (
        " It looks like a Hugging Face Hub name: nothing is downloaded, so fetch it first "
        f"(huggingface_hub.snapshot_download({spec!r})) and pass the folder."
    )
