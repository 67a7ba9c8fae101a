"""Multiple-choice answers (GPQA, MMLU-style letters).

Read from the answer section (after the thinking block). The answer line the
prompt asks for decides first, as in simple-evals' GPQA rule (``gpqa_eval.py``
reads ``Answer: $LETTER``): a line that begins with the prompt's prefix
(``ANSWER:``; "Answer:" when the prompt names none; after markdown such as
``**``, ``#``, ``>``, ``-``, and an optional "Final"). The last such line that
states something is the answer, whatever text follows it ("a common mistake is
to think the answer is D" after ``ANSWER: B`` is a remark); a hedged or
malformed answer line (``ANSWER: C or D``) names none. Without such a line, the
chosen letter is the LAST of:

- an anchor followed by a letter: "answer is", "answer:" (any case, ``**``
  bold around it), "correct option/choice is", "final choice:", and the
  task's own format when its prompt names one (GPQA asks for
  ``ANSWER: $LETTER``: see ``prompt_answer_format``);
- a box holding a letter: ``\\boxed{C}``, ``\\boxed{\\text{(C)}}``,
  ``\\boxed{C. 42 kJ/mol}`` (but not ``\\boxed{E = mc^2}``).

The text is read in Unicode NFKC form without zero-width characters (full-width
``ＡＮＳＷＥＲ：Ｃ`` is ``ANSWER: C``). Between anchor and letter, markdown and
LaTeX wrappers are skipped (``**``, backticks, quotes, ``$``, ``\\(``,
parentheses, brackets (``<C>`` too), ``\\boxed{``, ``\\text{``, ``\\mathbf{``,
``\\underline{`` and the other font commands, "option").
Letters are upper-case only (as in simple-evals, whose pattern's letter must
equal the upper-case gold): "the answer is a consequence of symmetry" names no
letter. A letter must end there (``ANSWER: Cl`` is not C), "I" followed by a
lower-case word is the pronoun, a letter followed by ``=``, ``<``, ``>``, ``+``,
``^`` starts a formula (``the answer is E = mc^2``), and a letter joined to
another by "or", "and", ``,``, ``/``, ``&`` is a hedge that names none
(``ANSWER: C or D``), unless the sentence goes on to dismiss the listed letters
(``ANSWER: B, A and C are incorrect.`` is B); so is a letter asked as a
question (``the answer is B?``). "answer is" and "correct option is" after an
indefinite or hedging qualifier on the same line ("a good answer is B", "one
possible answer is B", "the wrong answer is B") state no answer ("...are all
wrong\nAnswer: B" is B). When the last statement names a letter outside the
choices (``ANSWER: E`` of four) there is no answer: an earlier one is not
rescued. A stray letter without an anchor or box is never an
answer; "cannot determine" and the like are reported as refusals.
"""

from __future__ import annotations

import functools
import re
import unicodedata

from .base import Verdict, answer_section
from .math import boxes

__all__ = ["grade_choice", "extract_choice", "prompt_answer_format"]

_FONT = r"\\(?:boxed|fbox|text(?:bf|it|sf|tt|rm|normal)?|math(?:bf|rm|it|sf|tt)|bm|boldsymbol|underline|emph)\s*\{"
_WRAPPERS = rf"(?:\s|\*|_|\$|`|['\"‘’“”]|\\[(\[]|[(\[{{<]|{_FONT}|(?i:option|choice|letter)\b)*"
_ONE_LETTER = r"[A-Z](?![A-Za-z0-9])(?!(?<=I)\s+[a-z])"
_CLOSERS = r"[\s*`'\"’”)\]}>$]*"
# after "B, A and C" a verb that dismisses the listed letters: a new clause, not a hedge
# ("ANSWER: B, A and C are incorrect.")
_DISMISSED = (
    r"\s+(?i:(?:are|is|were|was)\s+(?:(?:all|both|also|clearly|each|therefore|thus|definitely)\s+)?"
    r"(?:not\b|incorrect|wrong|false|invalid|ruled\s+out|eliminated|excluded|impossible|unlikely|implausible)"
    r"|(?:can|could|must|should|may)\s+(?:all\s+|both\s+)?be\s+(?:ruled\s+out|eliminated|excluded|discarded|rejected)"
    r"|(?:fail|violate|contradict)s?\b)"
)
_LIST_TAIL = rf"(?:{_CLOSERS}(?:,|\b(?:and|or)\b){_WRAPPERS}{_ONE_LETTER})*{_CLOSERS}"
_LETTER = (
    rf"(?P<letter>{_ONE_LETTER})(?!\s*[=<+^?])(?!(?<!<[A-Z])\s*>)"
    rf"(?!{_CLOSERS}(?:[/&]|\b(?:or|and)\b){_WRAPPERS}{_ONE_LETTER})"
    rf"(?!{_CLOSERS},{_WRAPPERS}{_ONE_LETTER}(?!{_LIST_TAIL}{_DISMISSED}))"
)
_ANCHORS = [
    r"(?i:answer)(?:\s*(?:\*\*|__))?\s*(?:(?i:is)\b\s*:?|[:：])",
    r"(?i:correct\s+(?:option|choice|letter))(?:\s*(?:\*\*|__))?\s*(?:(?i:is)\b\s*:?|[:：])",
    r"(?i:final\s+choice)(?:\s*(?:\*\*|__))?\s*[:：]",
]
# a qualifier that makes "answer is X" not the answer: "a good", "one possible", "the wrong" (up to two words after it)
# (on the anchor's own line: "...are all wrong\nAnswer: B" is no qualifier)
_NOT_THE_ANSWER = re.compile(
    r"\b(?:a|an|one|another|wrong|incorrect|bad|possible|plausible|tempting|alternative)[ \t]+"
    r"(?:[\w-]+[ \t]+){0,2}$",
    re.I,
)
_BOX_LETTER = re.compile(r"^(?:\((?P<p>[A-Z])\)|(?P<letter>[A-Z])(?:[.:)\]]|\s+[-–—(]|$))")
_INNER_WRAP = re.compile(_FONT + r"([^{}]*)\}")
_INVISIBLE = dict.fromkeys(map(ord, "\u200b\u200c\u200d\u2060\ufeff"))
_FORMAT = re.compile(
    r"['\"‘“`](?P<prefix>[^'\"’”`\n]{0,40}?)(?:\$?LETTER|<letter>|\{letter\}"
    r"|(?<=[:(\[] )X|(?<=[:(\[])X)(?![\w-])[^'\"’”`\n]{0,20}['\"’”`]",
    re.I,
)
_REFUSAL = re.compile(r"cannot\s+(?:be\s+)?determine|can't\s+determine|cannot\s+be\s+determined|none\s+of\s+the", re.I)


def prompt_answer_format(template: str) -> str | None:
    """The answer prefix a prompt asks for, in quotes before a placeholder for the
    letter (``$LETTER``, ``<letter>``, ``{letter}``, or ``X`` after a colon or an
    opening bracket): ``ANSWER:`` from "...of the form 'ANSWER: $LETTER' (without
    quotes)...", ``FINAL:`` from 'end with "FINAL: X"'; None when it names none."""
    match = _FORMAT.search(template)
    prefix = match.group("prefix").strip() if match else ""
    return prefix or None


def _anchor_pattern(prefix: str) -> str:
    """A prefix such as "ANSWER:" as an anchor: words in any case, spaces flexible."""
    parts = [re.escape(word) for word in prefix.split()]
    return r"(?i:" + r"\s*".join(parts) + ")"


@functools.lru_cache(maxsize=64)
def _line_pattern(prefix: str) -> re.Pattern:
    """Lines that begin with the answer prefix (the line the prompt asks for): after
    markdown (``**``, ``#``, ``>``, ``-``) and an optional "final"; any case; spaces and
    bold markers between the prefix's parts (``**ANSWER**: C``, ``Final Answer: C``)."""
    parts = [re.escape(tok) for tok in re.findall(r"\w+|[^\w\s]", prefix)]
    return re.compile(r"^[ \t>#*_-]*(?i:final[ \t*_]+)?(?i:" + r"[ \t*_]*".join(parts) + ")", re.M)


_STATEMENT = re.compile(_WRAPPERS + _LETTER)
_ANY_LETTER = re.compile(_WRAPPERS + _ONE_LETTER)


def _hits(text: str, anchors: list[str]) -> list[tuple[int, str]]:
    """``(position, letter)`` of every anchored letter and boxed letter in ``text``."""
    hits = []
    for i, anchor in enumerate(anchors):
        for m in re.finditer(anchor + _WRAPPERS + _LETTER, text):
            if i < 2 and _NOT_THE_ANSWER.search(text, max(0, m.start() - 40), m.start()):
                continue  # "a good answer is B": a remark, not the answer
            hits.append((m.start("letter"), m.group("letter")))
    for start, inner in boxes(text):
        inner = _INNER_WRAP.sub(r"\1", inner).strip(" $*")
        m = _BOX_LETTER.match(inner)
        if m:
            hits.append((start, m.group("p") or m.group("letter")))
    return sorted(hits)


def _answer_line(text: str, prefix: str, hits: list[tuple[int, str]]) -> tuple[bool, str | None]:
    """What the last answer line that makes a statement says: ``(True, letter)``,
    ``(True, None)`` when it names no single letter (a hedge, a formula), or
    ``(False, None)`` when no answer line states anything."""
    for m in reversed(list(_line_pattern(prefix).finditer(text))):
        if (stated := _STATEMENT.match(text, m.end())) is not None:
            return True, stated.group("letter")
        if _ANY_LETTER.match(text, m.end()) is not None:
            return True, None  # "ANSWER: C or D", "ANSWER: E = mc^2"
        end = text.find("\n", m.end())
        inside = [h for h in hits if m.end() <= h[0] < (len(text) if end < 0 else end)]
        if inside:  # "ANSWER: the correct option is (B)"
            return True, inside[-1][1]
    return False, None


def extract_choice(text: str, letters: str = "ABCD", answer_format: str | None = None) -> str | None:
    """The chosen letter in ``text`` (rules in the module doc), or None.

    Args:
        text: the answer section.
        letters: the valid letters (one per choice).
        answer_format: the prompt's own answer prefix (e.g. "ANSWER:"): its answer
            line wins over every other statement; None: "Answer:" (simple-evals').
    """
    text = unicodedata.normalize("NFKC", text).translate(_INVISIBLE)
    anchors = list(_ANCHORS) + ([_anchor_pattern(answer_format)] if answer_format else [])
    hits = _hits(text, anchors)
    stated, letter = _answer_line(text, answer_format or "Answer:", hits)
    if not stated:
        if not hits:
            return None
        letter = hits[-1][1]  # the last statement, even when it names no valid letter
    return letter if letter is not None and letter in letters else None


def grade_choice(response: str, gold, *, truncated: bool = False, letters: str = "ABCD") -> Verdict:
    """Grade a multiple-choice response.

    Args:
        response: the model's full output.
        gold: the gold letter, or ``{"answer": letter, "letters": "ABCD", "format": "ANSWER:"}``
            (``load_problems`` builds this from the task: its number of choices and
            the answer format its prompt asks for).
        truncated: the response hit the token budget (reported in the detail).
        letters: valid letters when ``gold`` is a plain letter.

    Returns:
        ``Verdict`` ("correct", "wrong" or "no_answer").

    Raises:
        ValueError: a gold letter outside the valid letters.
    """
    answer_format = None
    if isinstance(gold, dict):
        letters, answer_format, gold = gold.get("letters", letters), gold.get("format"), gold["answer"]
    gold = str(gold).strip().upper()
    if gold not in letters:
        raise ValueError(f"gold letter {gold!r} is not one of {letters!r}")
    section = answer_section(response)
    if section is None:
        return Verdict(False, "no_answer", None, "thinking never closed")
    choice = extract_choice(section, letters, answer_format)
    if choice is None:
        detail = "refused" if _REFUSAL.search(section) else ("truncated" if truncated else "no letter found")
        return Verdict(False, "no_answer", None, detail)
    ok = choice == gold
    return Verdict(ok, "correct" if ok else "wrong", choice)
