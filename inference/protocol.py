"""The OpenAI HTTP API's request bodies and error objects (completions and chat).

Bodies are validated strictly: unknown fields are rejected (``extra="forbid"``), and
fields the API defines but this server does not implement are accepted only at their
default values, so a client never silently gets behaviour it did not ask for.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)
from pydantic_core import PydanticCustomError

from inference.sampling import MAX_LOGIT_BIAS, MAX_TOP_LOGPROBS


class APIError(Exception):
    """An error answered as OpenAI's ``{"error": {...}}`` object with an HTTP status."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def _number(kind: str) -> Any:
    """A before-validator refusing what pydantic's lax mode would convert to a number:
    ``true`` is not 1 and ``"7"`` is not 7 (OpenAI refuses both). Integral floats such as
    ``1e3`` (a JSON number Python parses as a float) stay accepted for integer fields;
    fractional ones are refused by pydantic itself."""
    article = "an" if kind == "integer" else "a"

    def check(value: Any) -> Any:
        if isinstance(value, bool | str):
            raise PydanticCustomError(
                f"{kind}_type",
                "it must be {article} {kind}, not {got}; send a JSON number",
                {"article": article, "kind": kind, "got": json.dumps(value)},
            )
        return value

    return BeforeValidator(check)


# Integer and float fields that refuse booleans and strings.
Int = Annotated[int, _number("integer")]
Float = Annotated[float, _number("number")]


class _Strict(BaseModel):
    # allow_inf_nan=False: Python's JSON parser takes NaN and Infinity, which are no
    # sampling parameter's valid value (NaN slipped past every range check).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    @model_validator(mode="before")
    @classmethod
    def _null_means_default(cls, data: Any) -> Any:
        """An explicit ``null`` for an optional field means its default (OpenAI's API
        declares them nullable, and its client sends ``null`` for a parameter passed as
        None); required fields still refuse ``null``."""
        if not isinstance(data, dict):
            return data
        fields = cls.model_fields
        return {
            k: v
            for k, v in data.items()
            if not (v is None and k in fields and not fields[k].is_required())
        }


# Most completions one request may ask for (n, best_of): each takes a decode slot.
MAX_CHOICES = 16


class _Common(_Strict):
    model: str
    temperature: Float = Field(1.0, ge=0.0, le=2.0)
    top_p: Float = Field(1.0, gt=0.0, le=1.0)
    top_k: Int = Field(0, ge=-1)  # vLLM's extension; 0 or -1 = off
    n: Int = Field(1, ge=1, le=MAX_CHOICES)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    seed: Int | None = None
    presence_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: Float = Field(0.0, ge=-2.0, le=2.0)
    logit_bias: dict[str, Float] | None = None
    user: str | None = None
    # vLLM's sampling extensions.
    ignore_eos: bool = False
    min_tokens: Int = Field(0, ge=0)
    stop_token_ids: list[Int] | None = None
    include_stop_str_in_output: bool = False
    repetition_penalty: Float = Field(1.0, gt=0.0)
    prompt_logprobs: Int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)

    def unsupported(self) -> None:
        """Raise for implemented-nowhere features requested with non-default values."""
        self.bias()
        if self.stream_options is not None:
            if not self.stream:
                raise APIError(
                    400,
                    "stream_options needs stream=true; set stream or drop stream_options.",
                    param="stream_options",
                )
            for key in self.stream_options:
                if key != "include_usage":
                    raise APIError(
                        400,
                        f"unknown parameter: 'stream_options.{key}' (only include_usage is "
                        "supported).",
                        param=f"stream_options.{key}",
                    )
        if self.stream and self.prompt_logprobs is not None:
            raise APIError(
                400,
                "prompt_logprobs is not available when stream=true; send it without streaming.",
                param="prompt_logprobs",
            )

    def stops(self) -> tuple[str, ...]:
        """The stop strings, as many as sent: vLLM takes any number, and lm-eval's
        ``generate_until`` sends a task's ``until`` list plus the EOS string (HumanEval's is
        six), so OpenAI's cap of 4 failed whole evaluations."""
        stops = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        for i, s in enumerate(stops):
            if not s:
                where = "stop" if isinstance(self.stop, str) else f"stop.{i}"
                raise APIError(
                    400,
                    f"{where} is an empty string, which would match anywhere; drop it.",
                    param=where,
                )
        return stops

    def bias(self) -> dict[int, float]:
        """``logit_bias`` as ``{token_id: bias}``: OpenAI's keys are token ids written as
        strings (``{"50256": -100}``) and its values lie in [-100, 100]."""
        out: dict[int, float] = {}
        for key, value in (self.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit()):
                raise APIError(
                    400,
                    f"invalid value for 'logit_bias': key {json.dumps(key)} is not a token id; "
                    'keys are token ids written as strings, e.g. {"50256": -100}.',
                    param="logit_bias",
                )
            if not -MAX_LOGIT_BIAS <= value <= MAX_LOGIT_BIAS:
                raise APIError(
                    400,
                    f"invalid value for 'logit_bias.{key}': {value:g} is outside "
                    f"[-{MAX_LOGIT_BIAS:g}, {MAX_LOGIT_BIAS:g}] (-100 bans a token, 100 "
                    "forces it).",
                    param=f"logit_bias.{key}",
                )
            out[int(key)] = value
        return out

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage"))


class CompletionRequest(_Common):
    prompt: str | list[str] | list[Int] | list[list[Int]]
    max_tokens: Int | None = Field(16, ge=0)
    logprobs: Int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    echo: bool = False
    best_of: Int | None = Field(None, ge=1, le=MAX_CHOICES)
    suffix: str | None = None

    def unsupported(self) -> None:
        super().unsupported()
        if self.best_of is not None and self.best_of < self.n:
            raise APIError(400, f"best_of={self.best_of} must be >= n={self.n}.", param="best_of")
        if self.stream and (self.best_of or self.n) > self.n:
            raise APIError(
                400, "best_of > n cannot stream (the best are known at the end).", param="best_of"
            )
        if self.suffix:
            raise APIError(400, "suffix (insertion) is not supported.", param="suffix")


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[ContentPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content)


class ChatRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: Int | None = Field(None, ge=1)
    max_completion_tokens: Int | None = Field(None, ge=1)
    logprobs: bool = False
    top_logprobs: Int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    response_format: dict[str, Any] | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    # OpenAI's stored completions: only the default (not stored) is served; metadata tags
    # a stored completion, so without storage it changes nothing (OpenAI ignores it too).
    store: bool = False
    metadata: dict[str, str] | None = None
    add_generation_prompt: bool = True  # vLLM's extension

    def unsupported(self) -> None:
        super().unsupported()
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError(
                400,
                "top_logprobs needs logprobs=true; set logprobs to true (or drop top_logprobs).",
                param="top_logprobs",
            )
        if self.tools:
            raise APIError(400, "tools are not supported.", param="tools")
        if self.store:
            raise APIError(
                400,
                "store=true is not supported (this server keeps no completions); drop store.",
                param="store",
            )
        if self.tool_choice not in (None, "none", "auto"):  # without tools both mean text
            raise APIError(
                400,
                f"tool_choice={json.dumps(self.tool_choice)} asks for a tool call, but this "
                "server does not support tools; drop tool_choice (or send 'none' or 'auto').",
                param="tool_choice",
            )
        if self.response_format and self.response_format.get("type") not in (None, "text"):
            raise APIError(
                400, "only response_format type 'text' is supported.", param="response_format"
            )


class TokenizeRequest(_Strict):
    """vLLM's ``/tokenize``: a prompt or chat messages to token ids."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool = True
    add_generation_prompt: bool = True
    return_token_strs: bool = False

    def unsupported(self) -> None:
        if (self.prompt is None) == (self.messages is None):
            raise APIError(400, "give exactly one of 'prompt' and 'messages'.", param="prompt")


class DetokenizeRequest(_Strict):
    """vLLM's ``/detokenize``: token ids to text."""

    model: str | None = None
    tokens: list[Int]

    def unsupported(self) -> None:
        pass


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a JSON body; raise `APIError` (400) naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object.")
    try:
        request = model.model_validate(body)
    except ValidationError as e:
        errors = e.errors()
        err = errors[0]
        loc, tags = _field_path(body, err["loc"], missing=err["type"] == "missing")
        if tags:  # a union field: the member that got deepest says most (an image part)
            same = [x for x in errors if _field_path(body, x["loc"])[0][: len(loc)] == loc]
            err = max(same, key=lambda x: len(_field_path(body, x["loc"])[0]))
            deeper, _ = _field_path(body, err["loc"], missing=err["type"] == "missing")
            kinds = [t[-1] for x in same if (t := _field_path(body, x["loc"])[1])]
            if len(deeper) == len(loc) and kinds:
                err = {**err, "msg": f"it must be one of: {', '.join(dict.fromkeys(kinds))}"}
            loc = deeper
        name = ".".join(str(x) for x in loc)
        if err["type"] == "extra_forbidden":
            message = f"unknown parameter: '{name}'."
        elif err["type"] == "missing":
            message = f"missing required parameter: '{name}'."
        elif err["type"] == "finite_number":
            message = (
                f"invalid value for '{name}': it must be a finite number, not "
                f"{json.dumps(err['input'])}."
            )
        else:
            message = f"invalid value for '{name}': {err['msg']}."
        raise APIError(400, message, param=name or None) from None
    request.unsupported()
    return request


# How pydantic names an annotated member of a union: "function-before[check(), int]".
_VALIDATOR = re.compile(r"function-before\[\w+\(\), (\w+)\]")


def _field_path(body: Any, loc: tuple, *, missing: bool = False) -> tuple[list, list[str]]:
    """The parts of a pydantic error location that are keys and indices of ``body``, and
    the union member tags among the rest (pydantic's ``'str'``, ``'list[int]'``...)."""
    path: list = []
    tags: list[str] = []
    node = body
    for i, part in enumerate(loc):
        in_dict = isinstance(node, dict) and part in node
        in_list = isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
        if in_dict or in_list:
            node = node[part]
        elif not (missing and i == len(loc) - 1):  # the missing field itself is kept
            tags.append(_VALIDATOR.sub(r"\1", str(part)))  # "list[Int]" reads "list[int]"
            continue
        path.append(part)
    return path, tags


# A plain chat template: role tags on their own lines; generation stops at the next tag.
CHAT_STOP = "\n<|"


def chat_prompt(messages: list[ChatMessage], add_generation_prompt: bool = True) -> str:
    """The default template for models without one: ``<|role|>\\ncontent\\n`` per message,
    then ``<|assistant|>\\n`` for the reply."""
    parts = [f"<|{'system' if m.role == 'developer' else m.role}|>\n{m.text()}\n" for m in messages]
    return "".join(parts) + ("<|assistant|>\n" if add_generation_prompt else "")
