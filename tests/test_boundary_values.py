"""The valid edges API-BOUNDARY-ACCEPTED tries: hint values whose text misleads, and a group's own timeout."""

from __future__ import annotations

from conformance.checks import api


def test_text_ordered_ctas_pairs_are_valid_numbers_whose_text_orders_the_other_way() -> None:
    for low, high in api.TEXT_ORDERED_CTAS:
        assert 1 <= low <= high and str(low) > str(high)
    pairs = [e["hints"] for e in api.hint_edges() if {"minCTAs", "maxCTAs"} <= set(e.get("hints", {}))]
    assert [(int(h["minCTAs"]), int(h["maxCTAs"])) for h in pairs] == list(api.TEXT_ORDERED_CTAS)
    mixed = [e for e in api.hint_edges() if "min_ctas" in e or "max_ctas" in e]
    assert len(mixed) == 2 * len(api.TEXT_ORDERED_CTAS)  # a field beside a hint, each way round


def test_agreeing_hints_say_what_their_field_says() -> None:
    cases = api.agreeing_hints()
    spellings = set()
    for options, effective in cases:
        hints = options["hints"]
        if "is_high_priority_stream" in effective:
            (spelled,) = hints.values()
            spellings.add(spelled)
            assert effective["is_high_priority_stream"] is (spelled.lower() in ("true", "1"))
            assert options["is_high_priority_stream"] is effective["is_high_priority_stream"]
        else:
            assert {int(v) for v in hints.values()} == {options["min_ctas"], options["max_ctas"]}
            assert effective == {"min_ctas": options["min_ctas"], "max_ctas": options["max_ctas"]}
    assert {"false", "0", "FALSE"} <= spellings  # the spellings of False that a truthiness test reads as True


def test_own_timeout_timings_separate_a_correct_backend_from_the_classes_it_is_for() -> None:
    assert api.SHORT_WORLD_S < api.WELL_LATE_S < api.OWN_TIMEOUT_S  # past the world's timeout, inside the group's
    assert api.WELL_LATE_S > api.OWN_TIMEOUT_S / 2  # past the group's timeout shared among two peers
    # the first rank joins the all_reduce once both messages came (at most PROMPT_S after the second's send) and
    # still waits past the world's timeout for the last rank
    assert api.WELL_LATE_S - api.RECV_LATE_S[1] - api.PROMPT_S > api.SHORT_WORLD_S
    first, second = api.RECV_LATE_S
    # a poll interval that doubles cannot see both messages within PROMPT_S: a poll p in [first, first + PROMPT_S)
    # is followed by one at 2p or later, which is at or past second + PROMPT_S; and one gap holding both sends
    # makes the first wait more than second - first
    assert second <= 2 * first - api.PROMPT_S and second - first > api.PROMPT_S
