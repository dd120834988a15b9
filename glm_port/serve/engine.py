"""The serving engine: one model, one scheduler thread, every running request's decode step in one batch.

Two parts. ``ServedModel`` is the narrow, family-facing side: it loads any registered family through the
registry (``glm_port.models``: ``family_at`` and the family's ``generation`` binding, the embedded tiny model
through ``build_tiny``) and reaches the family's chat format only through its ``chat`` binding:
``encode_chat(messages, tools) -> ids``, ``encode_prompt(text) -> ids``, ``decode(ids)``,
``parse_reply(ids, tools, final) -> (content, tool_calls)``, ``stop_ids(chat)``, ``fill(prompts, ...)``.
Nothing here imports a family module.

``Engine`` is the scheduler (continuous batching). Requests wait in a bounded queue; the scheduler thread
admits them between decode steps (up to ``max_batch`` sequences running), prefills the newly admitted ones
together (left-padded, positions counted per row), and merges their key/value caches into the running
batch's (each side left-padded to the longer, then stacked). Every decode step feeds each running sequence's
last token at its own position, with an attention mask over its own tokens, in one forward; each row is
sampled with its own settings and ``torch.Generator``. A sequence that finishes, or whose client went away
(``cancel``), leaves the batch at the next step (``batch_select_indices``), and cache columns that no row
uses any more are cut, so memory follows what is running, never what has run. When the batch empties its
cache is dropped. Families without a chat binding (GLM) are served whole: the admitted requests go through
the family's ``generate`` (GLM's blank filling), grouped by their settings.
"""

from __future__ import annotations

import collections
import itertools
import random
import threading
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers.cache_utils import DynamicCache

from glm_port.dtypes import DTYPES, parse_dtype
from glm_port.models import FAMILIES, TINY_FAMILY, build_tiny, family_at


def family_chat_formats(family) -> tuple[str, ...]:
    """The chat formats ``family`` is served in: its ``conversation`` binding's ``CHAT_FORMATS`` where it has a
    ``chat`` binding (the server's side of the format); none without one (GLM: served by blank filling)."""
    if family.chat is None or family.conversation is None:
        return ()
    return tuple(family.binding("conversation").CHAT_FORMATS)


def chat_formats() -> tuple[str, ...]:
    """Every chat format a family's bindings speak (glm-serve's ``--chat-format`` choices), as glm-chat's."""
    return tuple(dict.fromkeys(f for family in FAMILIES.values() for f in family_chat_formats(family)))


def tiny_family(chat_format: str | None = None):
    """The family of the embedded model served for ``chat_format``: the default one (``TINY_FAMILY``) for None or
    a format it speaks, else the first family with a ``tiny`` binding that speaks it (``glm4``: the tiny GLM-4)."""
    order = [FAMILIES[TINY_FAMILY]] + [f for f in FAMILIES.values() if f.name != TINY_FAMILY]
    for family in order:
        if family.tiny is not None and (chat_format is None or chat_format in family_chat_formats(family)):
            return family
    raise ValueError(f"--chat-format {chat_format}: no embedded model speaks it (known: {', '.join(chat_formats())})")


class QueueFull(RuntimeError):
    """More requests waiting than the engine's ``max_queue``."""


class ServedModel:
    """A model and its tokenizer as the server uses them, whatever the family (see the module's docstring)."""

    def __init__(self, model, tokenizer, family, name: str):
        self.model, self.tokenizer, self.family, self.name = model, tokenizer, family, name
        self.chat = family.binding("chat") if family.chat else None
        self._stops: dict[bool, frozenset[int]] = {}
        config = model.config
        self.seq_length = int(getattr(config, "seq_length", None) or getattr(config, "max_sequence_length", None)
                              or getattr(config, "max_position_embeddings", 2048))
        try:
            self.vocab = len(tokenizer)
        except TypeError:
            self.vocab = None

    @classmethod
    def load(cls, path=None, *, dtype: str | None = None, device: str = "cpu", chat_format: str | None = None,
             name: str | None = None) -> "ServedModel":
        """The model at ``path`` (any family, found by ``family_at``), or the embedded tiny model when None.
        ``dtype`` in either spelling (``bf16`` or ``bfloat16``: ``glm_port.dtypes``)."""
        torch_dtype = parse_dtype(dtype)
        if path is None:
            family = tiny_family(chat_format)
            model, tokenizer = build_tiny(family.name, **({"chat_format": chat_format} if chat_format else {}))
            model = model.to(device=device, dtype=torch_dtype or torch.float32)
            return cls(model, tokenizer, family, name or family.binding("tiny").NAME)
        family = family_at(path)
        if family.generation is None:
            raise ValueError(f"the {family.name} family has no generation binding to serve")
        spoken = family_chat_formats(family)
        if chat_format is not None and chat_format not in spoken:  # another family's format: nothing loaded
            raise ValueError(f"--chat-format {chat_format}: {path} is a {family.name} model, whose chat formats are "
                             f"{', '.join(spoken) or 'none'}")
        short = {value: name for name, value in DTYPES.items()}.get(torch_dtype)  # the loaders' short name
        model, tokenizer = family.binding("generation").load(path, dtype=short, device=device)
        if chat_format is not None and chat_format != getattr(tokenizer, "chat_format", None):
            if family.chat is None or not hasattr(tokenizer, "vocab_file"):
                raise ValueError(f"--chat-format: the {family.name} family has no chat format to choose")
            tokenizer = type(tokenizer)(tokenizer.vocab_file, chat_format=chat_format)  # its specials differ
        return cls(model.eval(), tokenizer, family, name or str(path).rstrip("/").rsplit("/", 1)[-1])

    # ------------------------------------------------------------ the family-facing interface
    @property
    def stepped(self) -> bool:
        """Decoded step by step in the engine's batch (causal families with a chat binding); else served whole."""
        return self.chat is not None

    @property
    def chat_format(self) -> str | None:
        return self.chat.chat_format(self.tokenizer) if self.chat else None

    def encode_chat(self, messages: list[dict], tools=None) -> list[int]:
        if self.chat is None:
            raise ValueError(f"the {self.family.name} family has no chat format: use /v1/completions")
        return list(self.chat.encode_messages(self.tokenizer, messages, tools))

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt's ids, the family's special tokens included (GLM: its blanks as written)."""
        return list(self.tokenizer.encode(text))

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def parse_reply(self, ids: list[int], tools=None, final: bool = True):
        return self.chat.parse_reply(self.tokenizer, ids, tools, final)

    def stop_ids(self, chat: bool) -> frozenset[int]:
        """The ids a reply ends at (chat: the chat format's; else the model's eos), computed once."""
        if chat not in self._stops:
            if chat:
                self._stops[chat] = frozenset(self.chat.reply_stop_ids(self.model, self.tokenizer))
            else:
                eos = self.model.config.eos_token_id
                self._stops[chat] = frozenset(eos if isinstance(eos, (list, tuple)) else [eos])
        return self._stops[chat]

    def fill(self, prompts: list[str], max_new_tokens: int, **kwargs) -> list[dict]:
        """Whole requests through the family's ``generate`` (GLM: every blank filled)."""
        return self.family.binding("generation").generate(self.model, self.tokenizer, prompts,
                                                          max_new_tokens=max_new_tokens, batch_size=len(prompts),
                                                          **kwargs)


@dataclass
class Sampling:
    max_tokens: int
    temperature: float = 0.8
    top_p: float = 0.8
    top_k: int = 0
    seed: int | None = None
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()


@dataclass
class Event:
    """What a sequence has so far, handed to its request's ``notify`` after each step."""
    index: int
    content: str  # the text a stream may show so far (held back where a stop string may be starting); all of it
    tool_calls: list = field(default_factory=list)  # once finished
    finish_reason: str | None = None  # "stop", "length", "tool_calls"; "error" with ``error``
    prompt_tokens: int = 0
    completion_tokens: int = 0
    error: str | None = None


class Sequence:
    """One choice of one request: its prompt, settings, what it generated; ``notify(Event)`` is called from the
    scheduler thread (thread-safe on the caller's side)."""

    _ids = itertools.count()

    def __init__(self, prompt_ids: list[int], sampling: Sampling, notify, *, index: int = 0, chat: bool = True,
                 tools=None, text: str | None = None, stream: bool = True):
        self.id = next(self._ids)
        self.stream = stream  # False: told only when it finishes
        self.prompt_ids, self.sampling, self.notify, self.index = list(prompt_ids), sampling, notify, index
        self.chat, self.tools, self.text = chat, tools, text
        self.generated: list[int] = []
        self.cancelled = False
        self.finished = False
        self.generator = torch.Generator().manual_seed(
            sampling.seed + index if sampling.seed is not None else random.getrandbits(63))
        self.prompt_tensor = torch.tensor(sorted(set(self.prompt_ids)), dtype=torch.long)


def _held_back(text: str, stops) -> int:
    """How many trailing characters of ``text`` could be the start of a stop string (not shown yet)."""
    hold = 0
    for stop in stops:
        for k in range(min(len(stop) - 1, len(text)), hold, -1):
            if text.endswith(stop[:k]):
                hold = k
                break
    return hold


class Engine:
    """The scheduler thread over one ``ServedModel`` (see the module's docstring)."""

    def __init__(self, served: ServedModel, *, max_batch: int = 16, max_queue: int = 64, batch_wait_ms: float = 5.0):
        self.served, self.max_batch, self.max_queue = served, max_batch, max_queue
        self.batch_wait = batch_wait_ms / 1000
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.cond = threading.Condition()
        self.running: list[Sequence] = []
        self.cache = None  # the running batch's DynamicCache, [rows, groups, columns, dim] per layer
        self.mask = None  # [rows, columns]: 1 where a row has a token
        self.positions = None  # [rows]: the position of each row's next token
        self.last = None  # [rows]: each row's last sampled token, not fed yet
        self.steps = 0  # decode steps run (for tests and the bench)
        self.max_rows_seen = 0  # the largest batch a step has run
        self._closed = False
        self.thread = threading.Thread(target=self._loop, name="glm-serve-engine", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------ the callers' side
    def submit(self, sequences: list[Sequence]) -> None:
        """Queue a request's sequences (all or none); QueueFull when the queue has no room for them."""
        with self.cond:
            if len(self.waiting) + len(sequences) > self.max_queue:
                raise QueueFull(f"the server's queue is full ({self.max_queue} waiting sequences); retry later")
            self.waiting.extend(sequences)
            self.cond.notify()

    def cancel(self, sequences) -> None:
        """Stop these sequences' work at the next step (a client went away)."""
        for sequence in sequences:
            sequence.cancelled = True
        with self.cond:
            self.cond.notify()

    def queued(self) -> int:
        return len(self.waiting)

    def close(self) -> None:
        with self.cond:
            self._closed = True
            self.cond.notify()
        self.thread.join(timeout=10)

    # ------------------------------------------------------------ the scheduler thread
    def _loop(self):
        torch.set_grad_enabled(False)
        while True:
            with self.cond:
                while not self._closed and not self.waiting and not self.running:
                    self.cond.wait()
                if self._closed:
                    return
                idle = not self.running
            if idle and self.batch_wait:
                time.sleep(self.batch_wait)  # requests that arrive together start together
            with self.cond:
                room = self.max_batch - len(self.running)
                admitted = []
                while self.waiting and len(admitted) < room:
                    sequence = self.waiting.popleft()
                    if not sequence.cancelled:
                        admitted.append(sequence)
            try:
                with torch.inference_mode():
                    if not self.served.stepped:
                        self._run_whole(admitted)
                        continue
                    if admitted:
                        self._prefill(admitted)
                    self._drop_finished()
                    if self.running:
                        self._step()
                        self._drop_finished()
            except Exception as error:  # the server stays up; these requests get the error
                message = f"{type(error).__name__}: {error}"
                for sequence in self.running + admitted:
                    if not sequence.finished:
                        sequence.finished = True
                        self._notify(sequence, Event(sequence.index, "", finish_reason="error", error=message))
                self.running, self.cache = [], None

    def _notify(self, sequence, event):
        try:
            sequence.notify(event)
        except Exception:  # the caller's loop is gone: nothing to tell
            sequence.cancelled = True

    def _forward(self, ids, mask, positions, cache):
        out = self.served.model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                                use_cache=True, logits_to_keep=1)
        return out.logits[:, -1].float()

    def _prefill(self, admitted: list[Sequence]):
        device = self.served.model.device
        width = max(len(s.prompt_ids) for s in admitted)
        ids = torch.zeros(len(admitted), width, dtype=torch.long)
        mask = torch.zeros(len(admitted), width, dtype=torch.long)
        for row, sequence in enumerate(admitted):
            n = len(sequence.prompt_ids)
            ids[row, width - n:] = torch.tensor(sequence.prompt_ids)
            mask[row, width - n:] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache(config=self.served.model.config)
        logits = self._forward(ids, mask, positions, cache)
        tokens = self._sample(admitted, logits)
        lengths = mask.sum(-1)
        if self.running:
            self.cache, self.mask = _merge(self.cache, self.mask, cache, mask)
            self.positions = torch.cat([self.positions, lengths])
            self.last = torch.cat([self.last, tokens])
        else:
            self.cache, self.mask, self.positions, self.last = cache, mask, lengths, tokens
        self.running += admitted
        for sequence, token in zip(admitted, tokens.tolist()):
            self._advance(sequence, token)

    def _step(self):
        self.steps += 1
        self.max_rows_seen = max(self.max_rows_seen, len(self.running))
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        logits = self._forward(self.last[:, None], self.mask, self.positions[:, None], self.cache)
        self.positions = self.positions + 1
        self.last = self._sample(self.running, logits)
        for sequence, token in zip(self.running, self.last.tolist()):
            self._advance(sequence, token)

    def _drop_finished(self):
        keep = [row for row, s in enumerate(self.running) if not (s.finished or s.cancelled)]
        if len(keep) == len(self.running):
            return
        for row, sequence in enumerate(self.running):
            if sequence.cancelled and not sequence.finished:
                sequence.finished = True
        if not keep:
            self.running, self.cache, self.mask, self.positions, self.last = [], None, None, None, None
            return
        index = torch.tensor(keep, device=self.mask.device)
        self.running = [self.running[row] for row in keep]
        self.cache.batch_select_indices(index)
        self.mask, self.positions, self.last = self.mask[index], self.positions[index], self.last[index]
        used = self.mask.any(0).nonzero()
        first = int(used[0]) if len(used) else 0
        if first:  # columns no running row uses any more
            self.cache = DynamicCache([(layer.keys[:, :, first:], layer.values[:, :, first:])
                                       for layer in self.cache.layers])
            self.mask = self.mask[:, first:]

    def _sample(self, sequences: list[Sequence], logits):
        vocab = self.served.vocab
        if vocab is not None and vocab < logits.shape[-1]:
            logits[:, vocab:] = float("-inf")  # padded rows of the embedding: no token
        tokens = []
        for row, sequence in enumerate(sequences):
            tokens.append(_sample_row(logits[row], sequence))
        return torch.tensor(tokens, dtype=torch.long, device=logits.device)

    def _advance(self, sequence: Sequence, token: int):
        """Take the new token; decide whether the sequence ends; tell its caller."""
        if sequence.finished or sequence.cancelled:
            return
        served, sampling = self.served, sequence.sampling
        sequence.generated.append(token)
        stops = served.stop_ids(sequence.chat)
        finish = None
        ids = sequence.generated
        if token in stops:
            finish, ids = "stop", ids[:-1]
        elif len(sequence.generated) >= sampling.max_tokens or \
                len(sequence.prompt_ids) + len(sequence.generated) >= served.seq_length:
            finish = "length"
        if finish is None and not sequence.stream and not sampling.stop:
            return  # nobody reads the text before the end
        content, calls = self._text(sequence, ids, final=finish is not None)
        cut = min((i for i in (content.find(s) for s in sampling.stop) if i >= 0), default=-1)
        if cut >= 0:
            finish, content, calls = "stop", content[:cut], []
        elif finish is None:
            content = content[:len(content) - _held_back(content, sampling.stop)]
        if finish is not None:
            sequence.finished = True
            if calls:
                finish = "tool_calls"
        elif not sequence.stream:
            return
        self._notify(sequence, Event(sequence.index, content, calls, finish, len(sequence.prompt_ids),
                                     len(sequence.generated)))

    def _text(self, sequence, ids, final):
        if sequence.chat:
            text, calls = self.served.parse_reply(ids, sequence.tools, final)
        else:
            text, calls = self.served.decode(ids), []
        if final:
            return text, calls
        return text.rstrip("\ufffd"), []  # a character whose bytes are not all there yet: wait for them

    def _run_whole(self, admitted: list[Sequence]):
        """Families served whole (GLM): the admitted requests through the family's ``generate``, grouped by
        their settings so that requests that arrived together share the calls."""
        groups: dict[tuple, list[Sequence]] = {}
        for sequence in admitted:
            s = sequence.sampling
            key = (s.max_tokens, s.temperature, s.top_p, s.top_k, s.repetition_penalty, s.seed)
            groups.setdefault(key, []).append(sequence)
        for (max_tokens, temperature, top_p, top_k, repetition, seed), members in groups.items():
            kwargs = {"do_sample": temperature > 0}
            if temperature > 0:
                kwargs.update(temperature=temperature, top_p=top_p, **({"top_k": top_k} if top_k else {}))
                if seed is not None:
                    torch.manual_seed(seed)
            if repetition != 1.0:
                kwargs["repetition_penalty"] = repetition
            results = self.served.fill([s.text for s in members], max_tokens, **kwargs)
            for sequence, result in zip(members, results):
                generated = sum(len(span) for span in result["generated_ids"])
                prompt = len(sequence.prompt_ids)
                text = result["text"]
                finish = "length" if any(len(span) >= max_tokens for span in result["generated_ids"]) else "stop"
                cut = min((i for i in (text.find(s) for s in sequence.sampling.stop) if i >= 0), default=-1)
                if cut >= 0:
                    text, finish = text[:cut], "stop"
                sequence.finished = True
                self._notify(sequence, Event(sequence.index, text, [], finish, prompt, generated))


def _sample_row(logits, sequence: Sequence) -> int:
    s = sequence.sampling
    if s.repetition_penalty != 1.0:  # transformers' rule, over the prompt and the reply so far
        seen = torch.cat([sequence.prompt_tensor, torch.tensor(sequence.generated, dtype=torch.long)]).unique()
        seen = seen[seen < logits.shape[-1]].to(logits.device)
        values = logits[seen]
        logits[seen] = torch.where(values > 0, values / s.repetition_penalty, values * s.repetition_penalty)
    if (s.frequency_penalty or s.presence_penalty) and sequence.generated:  # OpenAI's, over the reply so far
        counts = torch.bincount(torch.tensor(sequence.generated), minlength=logits.shape[-1])[:logits.shape[-1]]
        counts = counts.to(logits.device, logits.dtype)
        logits = logits - s.frequency_penalty * counts - s.presence_penalty * (counts > 0).to(logits.dtype)
    if s.temperature <= 0:
        return int(logits.argmax())
    logits = logits / s.temperature
    if s.top_k and s.top_k < logits.shape[-1]:
        kth = torch.topk(logits, s.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if s.top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        probs = ordered.softmax(-1)
        drop = probs.cumsum(-1) - probs > s.top_p  # keep the smallest set reaching top_p (the first always)
        logits = logits.scatter(0, order, ordered.masked_fill(drop, float("-inf")))
    probs = logits.softmax(-1).cpu()
    return int(torch.multinomial(probs, 1, generator=sequence.generator))


def _merge(cache_a, mask_a, cache_b, mask_b):
    """Two batches' caches stacked into one: each left-padded (zeros, masked out) to the longer's columns."""
    width = max(mask_a.shape[1], mask_b.shape[1])

    def pad(t, n):
        return F.pad(t, (0, 0, n, 0)) if n else t

    pa, pb = width - mask_a.shape[1], width - mask_b.shape[1]
    layers = [(torch.cat([pad(a.keys, pa), pad(b.keys, pb)]), torch.cat([pad(a.values, pa), pad(b.values, pb)]))
              for a, b in zip(cache_a.layers, cache_b.layers)]
    mask = torch.cat([F.pad(mask_a, (pa, 0)), F.pad(mask_b, (pb, 0))])
    return DynamicCache(layers), mask
