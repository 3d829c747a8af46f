"""Speculative decoding's parts without a model: prompt-lookup drafts (`NgramIndex`) against a
brute-force search, the scheduler's policy (`Speculator`: who drafts, how much, what a verify
step accepted, the grammar cut) and `expand_rows`."""

from __future__ import annotations

import random

import pytest
from test_constrained_support import Oracle, make_compiler, make_tokenizer, make_vocab

from sgl.runtime.messages import GenerateRequest
from sgl.runtime.request import Req
from sgl.runtime.sampling import SamplingParams
from sgl.runtime.speculative import NgramIndex, Speculator, expand_rows
from sgl.runtime.speculative.speculator import MAX_BACKOFF_STEPS, STEP_TOKEN_BUDGET


def brute_propose(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The tokens after the latest earlier occurrence of the longest suffix (min_n..max_n long)
    that occurred earlier, found by scanning the whole sequence."""
    if k <= 0:
        return []
    size = len(tokens)
    for n in range(min(max_n, size - 1), min_n - 1, -1):
        suffix = tokens[size - n :]
        for end in range(size - 1, n - 1, -1):  # the occurrence ends before the suffix's end
            if tokens[end - n : end] == suffix:
                return tokens[end : end + k]
    return []


def random_tokens(rng: random.Random, size: int, alphabet: int) -> list[int]:
    return [rng.randrange(alphabet) for _ in range(size)]


@pytest.mark.parametrize("min_n,max_n", [(1, 4), (1, 1), (2, 3), (3, 5)])
def test_propose_equals_brute_force_on_random_sequences(min_n, max_n):
    rng = random.Random(min_n * 10 + max_n)
    hits = 0
    for _ in range(400):
        tokens = random_tokens(rng, rng.randint(0, 30), rng.choice([2, 3, 5, 8]))
        k = rng.randint(0, 6)
        got = NgramIndex(min_n, max_n).propose(tokens, k)
        assert got == brute_propose(tokens, k, min_n, max_n), (tokens, k)
        hits += bool(got)
    assert hits > 100  # the small alphabets make matches common: the oracle was exercised


@pytest.mark.parametrize("min_n,max_n", [(1, 4), (2, 2)])
def test_incremental_propose_as_the_scheduler_calls_it(min_n, max_n):
    """One index per sequence, asked after every growth of 1-4 tokens (a step's accepted
    draft and draw), each answer equal to a fresh brute-force search."""
    rng = random.Random(7 + max_n)
    hits = 0
    for _ in range(60):
        alphabet = rng.choice([2, 4, 6])
        tokens = random_tokens(rng, rng.randint(1, 8), alphabet)
        index = NgramIndex(min_n, max_n)
        for _ in range(25):
            k = rng.randint(1, 5)
            got = index.propose(tokens, k)
            assert got == brute_propose(tokens, k, min_n, max_n), (tokens, k)
            hits += bool(got)
            tokens = tokens + random_tokens(rng, rng.randint(1, 4), alphabet)
    assert hits > 500


def test_truncate_then_regrow_equals_brute_force():
    """Jump-forward re-tokenizes a tail: after `truncate` the index answers for the new tokens,
    not the forgotten ones."""
    rng = random.Random(3)
    for _ in range(200):
        tokens = random_tokens(rng, rng.randint(4, 30), 4)
        index = NgramIndex(1, 4)
        assert index.propose(tokens, 3) == brute_propose(tokens, 3, 1, 4)
        cut = rng.randint(0, len(tokens))
        index.truncate(cut)
        tokens = tokens[:cut] + random_tokens(rng, rng.randint(0, 6), 4)
        for _ in range(3):
            assert index.propose(tokens, 4) == brute_propose(tokens, 4, 1, 4), (tokens, cut)
            tokens = tokens + random_tokens(rng, 2, 4)


def test_propose_examples_and_bad_ngram_bounds():
    index = NgramIndex(1, 4)
    # "7 8 9" occurred before: what followed it (5 6 7 8 9...) is the draft, at most k long
    assert index.propose([1, 7, 8, 9, 5, 6, 7, 8, 9], 3) == [5, 6, 7]
    assert NgramIndex(1, 4).propose([1, 2, 3], 4) == []  # no earlier occurrence
    assert NgramIndex(1, 4).propose([4, 4], 4) == [4]  # the tail is what there is
    assert NgramIndex(2, 4).propose([4, 4], 4) == []  # shorter than min_n + 1
    for lo, hi in [(0, 2), (3, 2)]:
        with pytest.raises(ValueError, match="min_n <= max_n"):
            NgramIndex(lo, hi)


# ---------------------------------------------------------------- the speculator


def make_req(prompt: list[int], output: list[int] = (), max_new_tokens: int = 64, pending=1):
    """A real `Req` in decode: `pending` of its tokens lack K/V."""
    params = SamplingParams(max_new_tokens=max_new_tokens)
    r = Req(GenerateRequest("r", list(prompt), params), list(prompt))
    r.output_ids = list(output)
    r.kv_len = r.seq_len - pending
    return r


REPEATING = list(range(1, 11)) * 2 + [1, 2]  # lookup drafts 3 4 5 6 7 8 9 10


def test_accept_counts_up_to_the_first_difference():
    spec = Speculator(num_draft_tokens=4)
    r = make_req(REPEATING)
    cases = [  # (draft, drawn at each of its len + 1 positions, accepted)
        ([3, 4, 5, 6], [3, 4, 5, 6, 1], 4),
        ([3, 4, 5, 6], [3, 4, 9, 6, 1], 2),
        ([3, 4, 5], [9, 4, 5, 6], 0),
        ([], [8], 0),
    ]
    for draft, drawn, want in cases:
        assert spec.accept(r, draft, drawn) == want
    assert (r.spec_verify_ct, r.spec_draft_tokens, r.spec_accepted_tokens) == (4, 11, 6)
    info = spec.info()
    assert info["algorithm"] == "NGRAM" and info["num_draft_tokens"] == 4
    assert info["step_budget"] == STEP_TOKEN_BUDGET
    assert (info["verify_steps"], info["draft_tokens"], info["accepted_tokens"]) == (4, 11, 6)
    assert info["acceptance_rate"] == pytest.approx(6 / 11)
    assert info["avg_spec_accept_length"] == pytest.approx((6 + 4) / 4)
    assert spec.stats.by_length == {4: 1, 2: 1, 0: 1}  # the empty draft verified nothing
    assert info["accept_histogram"] == {"0": 1, "2": 1, "4": 1}


def test_fresh_stats_have_no_rates():
    info = Speculator(num_draft_tokens=3).info()
    assert info["verify_steps"] == info["draft_tokens"] == 0
    assert info["acceptance_rate"] is None and info["avg_spec_accept_length"] is None


def test_draft_length_follows_acceptance():
    spec = Speculator(num_draft_tokens=6)
    r = make_req(REPEATING)
    spec.propose([r])
    assert len(r.draft_ids) == 6
    spec.accept(r, [3, 4, 5, 6, 7, 8], [3, 4, 0, 0, 0, 0, 0])  # 2 accepted: next time 3
    spec.propose([r])
    assert r.draft_ids == [3, 4, 5]
    spec.accept(r, r.draft_ids, [3, 4, 5, 6])  # all accepted: 3 + 2
    spec.propose([r])
    assert len(r.draft_ids) == 5
    spec.accept(r, r.draft_ids, r.draft_ids + [0])  # all again: capped at num_draft_tokens
    spec.propose([r])
    assert len(r.draft_ids) == 6


def test_wholly_rejected_drafts_back_off_1_3_7_steps_capped():
    spec = Speculator(num_draft_tokens=4)
    r = make_req(REPEATING)
    for misses in range(1, 7):
        spec.propose([r])
        draft = r.draft_ids
        assert draft, misses  # the lookup always has a draft here: only the wait skips it
        spec.accept(r, draft, [99] * (len(draft) + 1))
        wait = min(2**misses - 1, MAX_BACKOFF_STEPS)
        for _ in range(wait):
            spec.propose([r])
            assert r.draft_ids == []
            spec.accept(r, [], [99])  # a plain decode step: the wait goes on
        assert r.spec.wait == 0
    spec.propose([r])
    spec.accept(r, r.draft_ids[:1], [r.draft_ids[0], 99])  # an accepted token ends the misses
    assert r.spec.misses == 0 and r.spec.wait == 0
    spec.propose([r])
    assert r.draft_ids  # drafting again at once


def test_propose_leaves_room_for_the_drawn_token():
    """max_new_tokens - len(output) - 1 drafts at most: the step also draws one token."""
    spec = Speculator(num_draft_tokens=8)
    for out_len, limit, want in [(0, 20, 8), (3, 8, 4), (3, 5, 1), (3, 4, 0), (0, 1, 0)]:
        r = make_req(REPEATING, output=[3, 4, 5, 6, 7, 8][:out_len], max_new_tokens=limit)
        spec.propose([r])
        assert len(r.draft_ids) == want, (out_len, limit)


def test_no_draft_while_forced_tokens_wait_for_kv():
    spec = Speculator(num_draft_tokens=4)
    waiting = make_req(REPEATING, pending=3)  # jump-forward appended 2 forced tokens
    plain = make_req(REPEATING)
    waiting.draft_ids = [7]  # a stale draft is cleared, not reused
    spec.propose([waiting, plain])
    assert waiting.draft_ids == [] and plain.draft_ids == [3, 4, 5, 6]


def test_step_budget_caps_the_drafts_of_a_step_most_valuable_first():
    """Without a measured cost the budget alone rations: every request's first drafted token
    (worth p) before any second one (p^2)."""
    spec = Speculator(num_draft_tokens=4, step_budget=10)
    reqs = [make_req(REPEATING) for _ in range(5)]
    spec.propose(reqs)
    assert [len(r.draft_ids) for r in reqs] == [2, 2, 2, 2, 2]
    assert all(r.draft_ids == [3, 4] for r in reqs)  # each a prefix of its lookup


def test_drafts_after_a_jump_forward_rollback_follow_the_new_tokens():
    """Jump-forward re-tokenizes the output's tail with the forced text: tokens are deleted
    and others appended. The next draft must come from the tokens the request has now."""
    spec = Speculator(num_draft_tokens=4)
    r = make_req([7, 1, 2, 3, 4, 5], output=[1, 2])
    spec.propose([r])  # indexes the n-grams of 7 1 2 3 4 5 1 2
    del r.output_ids[-2:]  # as _jump_forward: the re-tokenized tail goes (and it tells the
    r.spec.index.truncate(r.seq_len)  # index), then its new tokens come, are fed, decode
    r.output_ids += [6, 6, 1]
    r.kv_len = r.seq_len - 1
    spec.propose([r])
    assert r.draft_ids == brute_propose(r.fill_ids, 4, 1, 4) == [2, 3, 4, 5]


# ---------------------------------------------------------------- the grammar cut

GRAMMAR_CASES = [
    (r"[ab]{2,6}!", "ab!"),
    (r"\d{1,3}(,\d{3}){0,2}", "0123456789,"),
    (r"(yes|no|maybe) (yes|no)", "yesnomab "),
    (r"[a-c]{3,5}", "abcd"),
]


def oracle_cut(oracle: Oracle, vocab, done_bytes: bytes, draft: list[int]) -> list[int]:
    """The longest prefix of `draft` that stays a prefix of a member, ending before a token
    after which the text is complete and nothing may follow (the matcher's is_done)."""
    data, n = done_bytes, 0
    for t in draft:
        data += vocab.token_bytes[t]
        if not oracle.is_prefix(data):
            break
        text = data.decode("utf-8")
        if oracle.full(text) and not oracle.next_chars(text):
            break
        n += 1
    return draft[:n]


@pytest.mark.parametrize("pattern,alphabet", GRAMMAR_CASES)
def test_drafts_are_cut_where_the_grammar_refuses(pattern, alphabet):
    """Drafts of a constrained request (valid walks with a corruption now and then) are cut
    as the brute-force oracle says, and the matcher is left where it was."""
    vocab = make_vocab("byte_level")
    grammar = make_compiler("byte_level").compile("regex", pattern)
    oracle = Oracle(pattern)
    pool = [
        t for t, tb in enumerate(vocab.token_bytes) if tb and all(chr(b) in alphabet for b in tb)
    ]
    marks = [t for t, tb in enumerate(vocab.token_bytes) if tb and t not in pool][:2]
    rng = random.Random(len(pattern))
    cut_short = full_length = 0
    for _ in range(60):
        matcher = grammar.matcher()
        out: list[int] = []
        for _ in range(rng.randint(0, 2)):  # some committed output first
            options = [t for t in pool if oracle.is_prefix(_bytes(vocab, out + [t]))]
            if not options:
                break
            out.append(rng.choice(options))
            assert matcher.accept(out[-1])
        draft = []
        for _ in range(rng.randint(1, 8)):
            options = [t for t in pool if oracle.is_prefix(_bytes(vocab, out + draft + [t]))]
            draft.append(rng.choice(options if options and rng.random() < 0.85 else pool))
        # the draft rides in the request's own text: it followed the prompt's last 2 tokens
        r = make_req(marks + draft + marks)
        r.matcher = matcher
        before = _mask(matcher, vocab)
        Speculator(num_draft_tokens=len(draft)).propose([r])
        want = oracle_cut(oracle, vocab, _bytes(vocab, out), draft)
        assert r.draft_ids == want, (pattern, out, draft)
        assert _mask(matcher, vocab) == before  # the matcher is back where it was
        cut_short += len(want) < len(draft)
        full_length += len(want) == len(draft)
    assert cut_short > 5 and full_length > 5  # both outcomes were exercised


def _bytes(vocab, ids: list[int]) -> bytes:
    return b"".join(vocab.token_bytes[t] for t in ids)


def _mask(matcher, vocab) -> list[int]:
    from sgl.constrained import allocate_bitmask

    row = allocate_bitmask(1, vocab.vocab_size)
    matcher.fill_mask(row[0])
    return row[0].tolist()


class RecordingKV:
    """The KV manager's truncate, recorded."""

    def __init__(self) -> None:
        self.cuts: list[int] = []

    def truncate(self, r, seq_len: int) -> None:
        self.cuts.append(seq_len)


def test_verify_keeps_the_accepted_draws_and_frees_the_rest():
    spec = Speculator(num_draft_tokens=4)
    r = make_req(REPEATING)
    for draft, drawn, accepted in [
        ([3, 4, 5], [3, 4, 9, 7], 2),
        ([3, 4], [3, 4, 5], 2),
        ([], [8], 0),
    ]:
        r.draft_ids = draft
        picks = [(t, -0.5 * i, None) for i, t in enumerate(drawn)]
        kv = RecordingKV()
        kept, verified = spec.verify(r, picks, kv)
        assert kept == picks[: accepted + 1] and verified == draft[:accepted]
        assert kv.cuts == [r.seq_len + accepted]  # the newest token and accepted drafts keep K/V


@pytest.mark.parametrize("k", [2, 8])
def test_a_constraints_forced_text_is_drafted(k):
    """Where the grammar forces text (jump-forward off or unable), the draft is that text's
    tokens, at most k of them, whatever the lookup would say."""
    tokenizer = make_tokenizer("byte_level")
    grammar = make_compiler("byte_level").compile("regex", r'\{"name": "[a-z]+"\}')
    r = make_req(REPEATING)
    r.matcher = grammar.matcher()
    spec = Speculator(num_draft_tokens=k, tokenizer=tokenizer)
    spec.propose([r])
    forced = tokenizer('{"name": "', add_special_tokens=False).input_ids
    assert len(forced) > 2
    assert r.draft_ids == forced[:k]
    assert tokenizer.decode(r.draft_ids) == '{"name": "'[: len(tokenizer.decode(r.draft_ids))]


# ---------------------------------------------------------------- verify rows


def test_expand_rows_gives_each_request_its_verify_rows_in_order():
    assert expand_rows([4, 9, 11], [[7, 8], [], [1]]) == [2, 3, 4, 9, 10, 11]
    rng = random.Random(0)
    for _ in range(100):  # rows laid out as the batch does: each request's block ends at its row
        drafts = [random_tokens(rng, rng.randint(0, 4), 5) for _ in range(rng.randint(1, 6))]
        rows, end = [], -1
        for d in drafts:
            end += rng.randint(0, 3) + len(d) + 1  # some prefill rows in between
            rows.append(end)
        got = expand_rows(rows, drafts)
        want = [row - len(d) + j for row, d in zip(rows, drafts) for j in range(len(d) + 1)]
        assert got == want and len(set(got)) == len(got)
