"""Token continuity per session (`--tokenize gateway`): a prompt that extends an earlier completion is that
completion's prompt ids + its sampled ids, verbatim, + the canonical tokens of what is new.

Why: re-rendering a history re-tokenizes what the model sampled. When it sampled other ids than the
template's canonical ones (a word in pieces, `<tool_call>` as text), the next prompt is no longer
prompt + sampled ids, and a trainer sees tokens the policy never produced. Matching is done on the text
the chat template renders, so it holds for any template:

- each answered call is remembered as its prompt text and that text + the text of its sampled ids. With
  thinking off, Qwen3's template (and ours) ends the generation prompt with an empty think block that it
  leaves out of past turns: that `block` is left out of the remembered text, and kept in the ids verbatim;
- a request whose rendered prompt starts with an earlier call's prompt + sampled text extends it (a call
  that did not end with the end-of-turn token, cut by `length`, only when the template closes the turn
  right there): the prompt is that call's ids + the rest of the rendered text, tokenized alone;
- a request that renders exactly as an earlier call's prompt is a retry: it gets that call's prompt ids
  and continues what that call continued;
- anything else (a first call, a rewritten history, a sub-agent's other system prompt, reasoning or text
  the harness dropped or edited) renders from scratch: a new chain, `continues: null`.

The memory lives in the gateway process (a restart renders from scratch) and is bounded: the last
`turns` calls per session, `sessions` sessions (least recently used go first), `tokens` ids in all.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Any, Protocol

TURNS, SESSIONS, TOKENS = 16, 1024, 8_000_000


class Tokens(Protocol):
    """What continuity needs of a tokenizer (the engine's ChatTokenizer has it)."""

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str: ...


@dataclass(frozen=True)
class Key:
    """A text by its length and digest: prefixes are compared without keeping the text."""

    length: int
    digest: bytes

    @classmethod
    def of(cls, text: str) -> Key:
        return cls(len(text), hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).digest())

    def starts(self, text: str) -> bool:
        """Whether `text` begins with the text this key stands for."""
        return len(text) >= self.length and Key.of(text[: self.length]) == self


@dataclass(frozen=True)
class Prompt:
    """One call's prompt ids and where they came from (recorded in the call's `metadata_json`)."""

    text: str  # the rendered prompt
    ids: list[int]
    continues: str | None = None  # the completion whose prompt + sampled ids this prompt starts with
    added: int = 0  # tokens after that completion's ids (all of them when rendered from scratch)
    retry_of: str | None = None  # an earlier call this one repeats (same rendered prompt)
    block: str = ""  # the end of the generation prompt a later history renders without (ChatTokenizer)

    @property
    def kept_text(self) -> str:
        """The prompt as a later history renders it, up to where the sampled text follows."""
        return self.text.removesuffix(self.block)

    def metadata(self) -> dict[str, Any]:
        found = {"continues": self.continues, "added_tokens": self.added}
        return found | ({"retry_of": self.retry_of} if self.retry_of else {})


@dataclass(frozen=True)
class Turn:
    """A remembered call: its prompt, its sampled ids, and the keys of their texts."""

    completion_id: str
    prompt_key: Key
    reply_key: Key  # prompt text (without its block) + the text of the sampled ids
    closed: bool  # the sampled text ends with the end-of-turn token's text
    prompt: array
    sampled: array
    continues: str | None
    added: int

    @property
    def size(self) -> int:
        return len(self.prompt) + len(self.sampled)


class Continuity:
    """The recent calls of each session, and the prompt a new request gets from them. Thread-safe."""

    def __init__(self, tokenizer: Tokens, end_of_turn: str, turns: int = TURNS, sessions: int = SESSIONS,
                 tokens: int = TOKENS) -> None:
        self.tokenizer, self.end_of_turn = tokenizer, end_of_turn
        self.turns, self.sessions, self.tokens = turns, sessions, tokens
        self._memory: OrderedDict[str, deque[Turn]] = OrderedDict()
        self._held = 0  # token ids held in all
        self._lock = threading.Lock()

    def prompt(self, session: str, text: str, block: str = "") -> Prompt:
        """The prompt for a request of `session` that renders as `text`, its generation prompt ending with
        `block` (see `Prompt.block`)."""
        turns = self._recent(session)
        retried = next((t for t in reversed(turns) if t.prompt_key.length == len(text)
                        and t.prompt_key.starts(text)), None)
        if retried is not None:
            return Prompt(text, retried.prompt.tolist(), retried.continues, retried.added, retried.completion_id,
                          block)
        extended = [t for t in turns if self._extends(t, text)]
        if not extended:
            return self._scratch(text, block)
        base = max(extended, key=lambda t: t.reply_key.length)
        added = self.tokenizer.encode(text[base.reply_key.length:])
        ids = base.prompt.tolist() + base.sampled.tolist() + added
        return Prompt(text, ids, base.completion_id, len(added), block=block)

    def _scratch(self, text: str, block: str) -> Prompt:
        ids = self.tokenizer.encode(text)
        return Prompt(text, ids, None, len(ids), block=block)

    def _extends(self, turn: Turn, text: str) -> bool:
        """`text` holds the turn's prompt and sampled text, then something new (a closed turn first)."""
        rest = turn.reply_key.length
        if len(text) <= rest or not turn.reply_key.starts(text):
            return False
        return turn.closed or text.startswith(self.end_of_turn, rest)

    def remember(self, session: str, completion_id: str, prompt: Prompt, sampled: list[int]) -> None:
        """Keep an answered call, so later requests of its session can continue it."""
        if not sampled:
            return
        reply = self.tokenizer.decode(sampled)
        turn = Turn(completion_id, Key.of(prompt.text), Key.of(prompt.kept_text + reply),
                    reply.endswith(self.end_of_turn), array("i", prompt.ids), array("i", sampled), prompt.continues,
                    prompt.added)
        with self._lock:
            kept = self._memory.setdefault(session, deque())
            self._memory.move_to_end(session)
            kept.append(turn)
            self._held += turn.size
            if len(kept) > self.turns:
                self._held -= kept.popleft().size
            self._bound()

    def _recent(self, session: str) -> list[Turn]:
        with self._lock:
            if session not in self._memory:
                return []
            self._memory.move_to_end(session)
            return list(self._memory[session])

    def _bound(self) -> None:
        """Forget the least recently used sessions' oldest calls until within the bounds."""
        while self._memory and (len(self._memory) > self.sessions or self._held > self.tokens):
            session, kept = next(iter(self._memory.items()))
            self._held -= kept.popleft().size
            if not kept:
                del self._memory[session]

    @property
    def held(self) -> int:
        """Token ids held now (prompts and sampled ids of every remembered call)."""
        return self._held
