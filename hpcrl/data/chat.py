"""Chat rows: OpenAI-style `[{role, content}, ...]` conversations, rendered with the tokenizer's chat template.

Row shapes accepted by every file source (the conventions of TRL, verl and OpenRLHF):
  messages: [...]   a whole conversation. SFT trains on every assistant turn; an RL or preference prompt
                    is the conversation before its last assistant turn, and the answer defaults to that
                    turn's content.
  prompt:   [...]   the prompt as a conversation (verl's RL parquet); the answer as for flat rows.
  chosen / rejected / completion: a string, or a list holding one assistant message.
Roles: system, user, assistant, tool; content: a string. Anything else is a ConfigError naming the row and
the key (`parse_conversation`), found at `expand` (hpcrl.data.validate) before anything is submitted.

Rendering is `tokenizer.apply_chat_template`, so an Instruct model gets its own template, and the tiny char
tokenizer its small Jinja template (hpcrl.data.tokenizer.TINY_CHAT_TEMPLATE). An RL prompt ends with the
generation prompt (the assistant header), so the rollout writes the assistant's turn.

Assistant-only loss mask (SFT on multi-turn rows), from rendering prefixes (as TRL and OpenRLHF do for
templates without `{% generation %}` markers): for each assistant turn i,
    before_i  = tokens(render(messages[:i], add_generation_prompt=True))
    through_i = tokens(render(messages[:i + 1]))
`before_i` must be a prefix of `through_i` (and of every later rendering); the tokens between them are turn
i's content and the template's end-of-turn token: those carry the loss, all others (system, user, tool,
the headers) do not. A template that rewrites earlier turns (e.g. one that drops past reasoning) breaks the
prefix property and is refused naming the row, rather than training on a silently shifted mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcrl.errors import ConfigError, Problem, short

ROLES = ("system", "user", "assistant", "tool")
MESSAGE_KEYS = frozenset({"role", "content"})
MESSAGES_KEY = "messages"
"""The field of a whole conversation (TRL's conversational format)."""


@dataclass(frozen=True)
class Message:
    role: str
    content: str

    def as_dict(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}


Conversation = tuple[Message, ...]


@dataclass(frozen=True)
class Segment:
    """A run of token ids, and whether they carry the loss (assistant turns) or not."""

    ids: tuple[int, ...]
    trained: bool


def conversation_problem(value: object) -> str | None:
    """Why `value` is not a conversation, or None."""
    if not isinstance(value, list):
        return f"expected a list of {{role, content}} messages, got {type(value).__name__}"
    if not value:
        return "empty conversation"
    for i, message in enumerate(value):
        if not isinstance(message, dict):
            return f"message {i} is a {type(message).__name__}, not a {{role, content}} mapping"
        missing = sorted(MESSAGE_KEYS - set(message))
        if missing:
            return f"message {i} has no {missing[0]!r}"
        extra = sorted(str(k) for k in set(message) - MESSAGE_KEYS)
        if extra:
            return f"message {i} has unsupported keys {short(extra)} (only role and content)"
        if message["role"] not in ROLES:
            return f"message {i} has role {short(message['role'])}; roles: {', '.join(ROLES)}"
        if not isinstance(message["content"], str):
            return f"message {i} content is a {type(message['content']).__name__}, not a string"
    return None


def parse_conversation(value: object, *, where: str, file: str | None, key: str) -> Conversation:
    """`value` as a Conversation; a ConfigError naming `where` (e.g. "row 3"), the file and the key if not."""
    problem = conversation_problem(value)
    if problem is not None:
        raise ConfigError(Problem(f"{where}: {problem}", file=file, key=key))
    return tuple(Message(m["role"], m["content"]) for m in value)  # type: ignore[union-attr]


@dataclass(frozen=True)
class ChatRow:
    """A parsed chat row before rendering: its prompt turns, answer and whole conversation."""

    prompt: Conversation
    """The turns before the last assistant turn (the RL or preference prompt)."""
    answer: str
    """The row's answer field, else the last assistant turn's content, else ''."""
    conversation: Conversation


def chat_row(turns: Conversation, answer: object, *, where: str, file: str | None, key: str) -> ChatRow:
    """The ChatRow of a conversation; an answer field must be a string (or one assistant message)."""
    prompt, last = split_last_assistant(turns)
    if turns[0].role == "assistant":
        raise ConfigError(
            Problem(f"{where}: the first turn is the assistant's (nothing to answer)", file, key)
        )
    if answer is None:
        return ChatRow(prompt, last or "", turns)
    return ChatRow(prompt, response_text(answer, where=where, file=file, key=key), turns)


def split_last_assistant(conversation: Conversation) -> tuple[Conversation, str | None]:
    """(the turns before the last assistant turn, that turn's content); (all turns, None) without one."""
    for i in range(len(conversation) - 1, -1, -1):
        if conversation[i].role == "assistant":
            return conversation[:i], conversation[i].content
    return conversation, None


def response_text(value: object, *, where: str, file: str | None, key: str) -> str:
    """A response field: a string, or a conversation of exactly one assistant message (its content)."""
    if isinstance(value, str):
        return value
    turns = parse_conversation(value, where=where, file=file, key=key)
    if len(turns) != 1 or turns[0].role != "assistant":
        roles = [m.role for m in turns]
        raise ConfigError(Problem(f"{where}: expected one assistant message, got roles {roles}", file, key))
    return turns[0].content


def _with_bos(tokenizer, ids: list[int]) -> list[int]:
    """BOS first when the tokenizer has one and the template did not already write it."""
    bos = tokenizer.bos_token_id
    return ids if bos is None or ids[:1] == [bos] else [bos, *ids]


def render_ids(tokenizer, turns: Sequence[Message], add_generation_prompt: bool) -> list[int]:
    """Token ids of `turns` under the tokenizer's chat template (with BOS, see _with_bos)."""
    return _with_bos(
        tokenizer,
        tokenizer(render_text(tokenizer, turns, add_generation_prompt), add_special_tokens=False)[
            "input_ids"
        ],
    )


def render_text(tokenizer, turns: Sequence[Message], add_generation_prompt: bool) -> str:
    """`turns` rendered as text by the tokenizer's chat template; a tokenizer without one, or a template
    that fails on these turns, is a ConfigError."""
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(
            Problem(
                "chat rows need a chat template, and this model's tokenizer has none", key="model.hf_path"
            )
        )
    try:
        return tokenizer.apply_chat_template(
            [m.as_dict() for m in turns], tokenize=False, add_generation_prompt=add_generation_prompt
        )
    except Exception as err:  # jinja2's TemplateError and the template's own raise_exception(...)
        raise ConfigError(Problem(f"the chat template failed: {short(str(err))}", key="data")) from None


def prompt_text(tokenizer, turns: Conversation) -> str:
    """An RL or preference prompt: the turns rendered with the generation prompt (the assistant header)."""
    return render_text(tokenizer, turns, add_generation_prompt=True)


CONTINUED = (Message("user", "x"), Message("assistant", "y"))
"""A conversation whose rendering a continuation is taken after (`continuation_ids`)."""


def continuation_ids(tokenizer, turns: Sequence[Message]) -> list[int]:
    """Tokens that continue a conversation after an assistant turn with `turns` (e.g. a tool's reply),
    through the generation prompt, so the model writes the next assistant turn: the rendering of
    [..., assistant, *turns] (generation prompt on) less that of [..., assistant], as verl's multi-turn
    rollouts take a turn's delta. A template that renders earlier turns differently once more follow (no
    prefix property) raises ValueError: the delta would not be what the model reads."""
    before = render_text(tokenizer, CONTINUED, add_generation_prompt=False)
    after = render_text(tokenizer, (*CONTINUED, *turns), add_generation_prompt=True)
    if not after.startswith(before):
        raise ValueError("the chat template renders earlier turns differently when more follow")
    return tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"]


def conversation_segments(tokenizer, conversation: Conversation) -> list[Segment]:
    """The conversation's tokens as segments: each assistant turn's (trained) and the rest (not). See the
    module docstring for the prefix rendering; a template without the prefix property raises ConfigError."""
    if conversation[0].role == "assistant":  # chat_row refuses such rows when the data is read
        raise ConfigError(Problem("the first turn is the assistant's (nothing to answer)", key="data"))
    segments: list[Segment] = []
    done: list[int] = []
    for i, message in enumerate(conversation):
        if message.role != "assistant":
            continue
        before = render_ids(tokenizer, conversation[:i], add_generation_prompt=True)
        through = render_ids(tokenizer, conversation[: i + 1], add_generation_prompt=False)
        _require_prefix(done, before, i)
        _require_prefix(before, through, i)
        segments += [Segment(tuple(before[len(done) :]), False), Segment(tuple(through[len(before) :]), True)]
        done = through
    everything = render_ids(tokenizer, conversation, add_generation_prompt=False)
    _require_prefix(done, everything, len(conversation) - 1)
    segments.append(Segment(tuple(everything[len(done) :]), False))
    return [s for s in segments if s.ids]


def _require_prefix(prefix: list[int], ids: list[int], turn: int) -> None:
    if ids[: len(prefix)] != prefix:
        raise ConfigError(
            Problem(
                f"the chat template renders turn {turn} so that earlier turns change (no prefix property): "
                "the assistant-only loss mask cannot be derived",
                key="data",
            )
        )
