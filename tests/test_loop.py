"""The shared step logic on literal token lists."""

import pytest

from specdesk.engines.speculation.loop import check_prompt, commit, step_budget, step_event
from specdesk.engines.types import SpecDeskError

EOS = 2


def is_eog(token):
    return token == EOS


def test_all_accepted_commits_the_draft_and_the_target_token():
    assert commit([5, 6, 7], 3, 8, remaining=10, room=100, is_eog=is_eog, stop_at_eos=True) == (
        [5, 6, 7, 8], [True, True, True, False], None)


def test_a_rejection_keeps_the_prefix_and_the_target_token():
    assert commit([5, 6, 7], 1, 9, remaining=10, room=100, is_eog=is_eog, stop_at_eos=True) == (
        [5, 9], [True, False], None)


def test_eos_inside_the_draft_ends_the_run_there():
    assert commit([5, EOS, 7], 3, 8, remaining=10, room=100, is_eog=is_eog, stop_at_eos=True) == (
        [5, EOS], [True, True], "eos")
    assert commit([5, EOS, 7], 3, 8, remaining=10, room=100, is_eog=is_eog, stop_at_eos=False)[2] is None


def test_max_tokens_and_the_context_cut_the_step():
    assert commit([5, 6, 7], 3, 8, remaining=2, room=100, is_eog=is_eog, stop_at_eos=True) == (
        [5, 6], [True, True], "length")
    assert commit([5, 6, 7], 3, 8, remaining=10, room=3, is_eog=is_eog, stop_at_eos=True) == (
        [5, 6, 7], [True, True, True], "context")
    assert commit([5, EOS], 2, 8, remaining=2, room=2, is_eog=is_eog, stop_at_eos=True)[2] == "eos"


def test_budget_leaves_room_for_the_target_token():
    assert step_budget(8, remaining=100, room=100) == 8
    assert step_budget(8, remaining=3, room=100) == 2
    assert step_budget(8, remaining=100, room=1) == 0
    assert step_budget(0, remaining=100, room=100) == 0


def test_prompt_checks_name_the_problem():
    check_prompt([1, 2, 3], n_ctx=8, n_vocab=10)
    with pytest.raises(SpecDeskError, match="the prompt is 8 tokens but the context holds 8"):
        check_prompt([1] * 8, n_ctx=8, n_vocab=10)
    with pytest.raises(SpecDeskError, match="token id 12 is outside the vocabulary of 10"):
        check_prompt([1, 12], n_ctx=8, n_vocab=10)


def test_event_reports_positions_and_the_end():
    event = step_event(3, 1, [5, 9], [True, False], "ab", 0.1, 0.2, None)
    assert event.position_accepted == (True, False, False) and not event.finished
    assert step_event(0, 0, [4], [False], "c", 0.0, 0.2, "eos").finished
