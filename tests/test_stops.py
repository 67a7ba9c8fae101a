"""Where a response ends: a stop string completing inside a round's accepted tokens
cuts the ids, response_tokens and acceptance statistics where the text is cut, on
the one-sequence and on the batched path; stops of thinking tasks apply only
to the answer after </think>, past its first non-blank character."""

import pytest

from relaxtune.decoding.sampling import SamplingParams
from relaxtune.engine.batch import Request, generate_batch
from relaxtune.engine.sequence import generate, stop_index

from .scripted import ScriptedBackend

SAMPLING = SamplingParams(temperature=0.8)


def run(path: str, backend: ScriptedBackend, n_draft: int = 4, max_new_tokens: int = 30, stop=(), stop_after=None):
    if path == "one":
        return generate(
            backend,
            [0],
            n_draft=n_draft,
            sampling=SAMPLING,
            max_new_tokens=max_new_tokens,
            stop=stop,
            stop_after=stop_after,
        )
    # batched: three copies in one batch, with a longer-budget neighbour, must agree
    requests = [Request([0], 7, max_new_tokens, tuple(stop), stop_after, key=k) for k in range(3)]
    requests.append(Request([0, 0], 8, max_new_tokens + 5, key="neighbour"))
    out = {r.key: g for r, g in generate_batch(backend, requests, n_draft=n_draft, sampling=SAMPLING, batch_size=4)}
    assert out[0].token_ids == out[1].token_ids == out[2].token_ids
    return out[0]


PATHS = pytest.mark.parametrize("path", ["one", "batched"])


def ids_of(backend: ScriptedBackend, *tokens: str) -> list[int]:
    return [backend.vocab.index(t) for t in tokens]


@PATHS
def test_the_issue_example_a_b_stop_c_d(path):
    backend = ScriptedBackend(["a", "b", "|", "c", "d", "e", "f"])
    g = run(path, backend, stop=["|"])
    # one round: drafts a b | c accepted, d the bonus; the stop completes at the third token
    assert g.text == "ab"
    assert g.token_ids == ids_of(backend, "a", "b", "|")
    s = g.stats
    assert (s.response_tokens, s.rounds, s.drafted, s.accepted, s.emitted, s.discarded) == (3, 1, 4, 3, 3, 2)
    assert s.finish_reason == "stop" and s.acceptance_length == 3.0


@PATHS
@pytest.mark.parametrize(
    "script, stop, kept, text, accepted",
    [
        (["x", "ab", "c", "d", "e", "f"], ["bc"], ["x", "ab", "c"], "xa", 3),  # spans two tokens
        (["a", "b", "c", "d", "e"], ["abc", "b"], ["a", "b"], "a", 2),  # the earliest to complete wins
        (["a", "xy|z", "b", "c", "d"], ["|"], ["a", "xy|z"], "axy", 2),  # inside one token: ids keep it
        (["a", "b", "c", "d", "|"], ["|"], ["a", "b", "c", "d", "|"], "abcd", 4),  # the bonus token completes it
        (["|", "b", "c", "d", "e"], ["|", "zz"], ["|"], "", 1),  # the first token
    ],
    ids=["spanning", "earliest", "inside-token", "bonus", "first"],
)
def test_stop_strings_cut_ids_where_the_text_is_cut(path, script, stop, kept, text, accepted):
    backend = ScriptedBackend(script)
    g = run(path, backend, stop=stop)
    assert g.text == text and g.token_ids == ids_of(backend, *kept)
    assert g.stats.response_tokens == len(kept) == g.stats.emitted
    assert g.stats.accepted == accepted and g.stats.finish_reason == "stop"
    assert g.stats.discarded == 5 - len(kept)  # N + 1 = 5 tokens emitted in the round


@PATHS
def test_a_stop_string_started_in_the_previous_round(path):
    backend = ScriptedBackend(["p", "q", "r", "[", "]", "z", "w"])
    g = run(path, backend, n_draft=2, stop=["r["])
    assert g.token_ids == ids_of(backend, "p", "q", "r", "[") and g.text == "pq"
    # round 1: p q accepted + r (bonus); round 2: [ accepted, then cut (] and the bonus z discarded)
    s = g.stats
    assert (s.rounds, s.accepted, s.emitted, s.discarded) == (2, 3, 4, 2)


@PATHS
def test_eos_and_budget_come_before_a_later_stop_string(path):
    backend = ScriptedBackend(["a", "<eos>", "|", "c", "d"], eos=("<eos>",))
    g = run(path, backend, stop=["|"])
    assert g.token_ids == ids_of(backend, "a", "<eos>") and g.stats.finish_reason == "stop"
    assert (g.stats.accepted, g.stats.emitted, g.stats.discarded) == (2, 2, 3)
    backend = ScriptedBackend(["a", "b", "|", "c", "d"])
    g = run(path, backend, max_new_tokens=2, stop=["|"])
    assert g.token_ids == ids_of(backend, "a", "b") and g.text == "ab" and g.stats.finish_reason == "length"


@PATHS
def test_stops_apply_only_after_the_thinking_ends(path):
    script = ["<think>", "a", "|", "b", "</think>", "c", "|", "d", "e", "f"]
    backend = ScriptedBackend(script)
    g = run(path, backend, stop=["|"], stop_after="</think>")
    assert g.text == "<think>a|b</think>c" and g.token_ids == ids_of(backend, *script[:7])
    assert g.stats.finish_reason == "stop" and g.stats.response_tokens == 7
    g = run(path, backend, stop=["|"])  # without it, the reasoning is cut
    assert g.text == "<think>a"
    g = run(path, ScriptedBackend(["<think>", "a", "|", "b"] * 3), max_new_tokens=12, stop=["|"], stop_after="</think>")
    assert g.stats.finish_reason == "length" and g.stats.response_tokens == 12  # never closed: no stop fires


@PATHS
def test_a_blank_line_right_after_think_does_not_end_the_answer(path):
    # a task whose stops include "\n\n": the model's blank line after </think> used to cut the whole answer
    script = ["<think>", "a", "\n\n", "b", "</think>", "\n\n", "c", "\n\n", "d", "e"]
    backend = ScriptedBackend(script)
    g = run(path, backend, stop=["\n\n"], stop_after="</think>")
    assert g.text == "<think>a\n\nb</think>\n\nc" and g.token_ids == ids_of(backend, *script[:8])
    assert g.stats.finish_reason == "stop" and g.stats.response_tokens == 8
    blank = ["<think>", "a", "</think>", "\n\n", " ", "\n\n", "\n\n", " "]  # no answer text: no stop fires
    g = run(path, ScriptedBackend(blank), max_new_tokens=8, stop=["\n\n"], stop_after="</think>")
    assert g.stats.finish_reason == "length" and g.text == "".join(blank)


def test_stop_index():
    assert stop_index("ab|cd", ["|"]) == 2
    assert stop_index("<think>x</think>\n\nThe answer\n\nmore", ["\n\n"], "</think>") == 28
    assert stop_index("<think>x</think>\n\n", ["\n\n"], "</think>") is None  # no answer yet
    assert stop_index("</think> Question: 2", ["Question:"], "</think>") is None  # never an empty answer
    assert stop_index("</think>A\n\n", ["\n\n"], "</think>") == 9
    assert stop_index("\n\nx\n\ny", ["\n\n"], "") == 3  # "": the answer starts at the text's start
    assert stop_index("ab|cd", ["", "x"]) is None  # empty stop strings never match
    assert stop_index("a|b</think>c|d", ["|"], "</think>") == 12
    assert stop_index("a|b<think>", ["|"], "</think>") is None
    assert stop_index("xabcbc", ["bc", "abc"]) == 1  # the earliest start among those present


class _Server:
    """A native speculative server's stand-in: returns the script, noting the stop strings it was sent."""

    def __init__(self, backend: ScriptedBackend, script: list[str]):
        self.ids, self.backend, self.sent = ids_of(backend, *script), backend, None

    def check(self, knob, n_draft):
        pass

    def generate(self, prompt_ids, *, threshold, n_draft, sampling, max_new_tokens, seed, stop=()):
        from relaxtune.backends.sglang_native import SpecTelemetry

        self.sent = list(stop)
        ids = self.ids[:max_new_tokens]
        return ids, self.backend.decode(ids), "length", SpecTelemetry(3, 6, 9, ("a", "b")), 0.5


def test_a_native_server_never_gets_stops_it_would_fire_inside_the_reasoning():
    script = ["<think>", "a", "|", "b", "</think>", "c", "|", "d"]
    backend = ScriptedBackend(script)
    backend.native = server = _Server(backend, script)
    g = generate(
        backend,
        [0],
        method="sglang_threshold",
        knob=1.0,
        n_draft=3,
        sampling=SAMPLING,
        max_new_tokens=8,
        stop=["|"],
        stop_after="</think>",
    )
    assert server.sent == [] and g.text == "<think>a|b</think>c" and g.token_ids == ids_of(backend, *script[:7])
    assert g.stats.finish_reason == "stop" and g.stats.response_tokens == 7 and g.stats.rounds == 3
    generate(
        backend, [0], method="sglang_threshold", knob=1.0, n_draft=3, sampling=SAMPLING, max_new_tokens=8, stop=["|"]
    )
    assert server.sent == ["|"]  # without thinking the server applies them itself
