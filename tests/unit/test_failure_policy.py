"""The one failure policy (`chronos.domain.delivery.after_failure`): what becomes of a message whose
publish failed, for the firer's rows (a bounded number of attempts) and the consumer's late messages
(tried until published or refused for good) alike, and for their dead letters."""

from __future__ import annotations

import pytest

from chronos.domain.delivery import (PERMANENT_FAILURE, PRODUCER_FAILURE, REFUSED, UNANSWERED_FAILURE, UNCLEAR_FAILURE,
                                     AfterFailure, after_failure)


@pytest.mark.parametrize("kind,failures,action", [
    (PERMANENT_FAILURE, 1, AfterFailure.DEAD),      # at once, whatever the attempts left
    (REFUSED, 1, AfterFailure.RETRY),
    (REFUSED, 2, AfterFailure.RETRY),
    (REFUSED, 3, AfterFailure.DEAD),                # the last allowed attempt failed
    (REFUSED, 7, AfterFailure.DEAD),
    (UNCLEAR_FAILURE, 3, AfterFailure.DEAD),
    (UNANSWERED_FAILURE, 3, AfterFailure.RELEASE),  # an outage never exhausts a row's attempts
    (PRODUCER_FAILURE, 9, AfterFailure.RELEASE),    # nor does a producer at fault
])
def test_a_publish_with_a_bounded_number_of_attempts(kind, failures, action):
    assert after_failure(kind, failures, max_attempts=3) == action


@pytest.mark.parametrize("kind,action", [
    (PERMANENT_FAILURE, AfterFailure.DEAD),
    (REFUSED, AfterFailure.RETRY),
    (UNCLEAR_FAILURE, AfterFailure.RETRY),
    (UNANSWERED_FAILURE, AfterFailure.RELEASE),
    (PRODUCER_FAILURE, AfterFailure.RELEASE),
])
def test_a_publish_without_a_limit_is_retried_until_refused_for_good(kind, action):
    assert after_failure(kind, 1000) == action


@pytest.mark.parametrize("kind,action", [
    (PERMANENT_FAILURE, AfterFailure.PARK),   # the dead-letter topic refuses it for good: kept in PostgreSQL
    (REFUSED, AfterFailure.RETRY),            # never dead-lettered twice, however many attempts
    (UNCLEAR_FAILURE, AfterFailure.RETRY),
    (UNANSWERED_FAILURE, AfterFailure.RELEASE),
    (PRODUCER_FAILURE, AfterFailure.RELEASE),
])
def test_a_dead_letter_is_parked_when_refused_for_good_and_retried_otherwise(kind, action):
    assert after_failure(kind, 1000, max_attempts=3, dead_letter=True) == action
