from __future__ import annotations

import pytest
from pydantic import ValidationError

from raftlog.node.core.config import RaftConfig, describe_validation_error


def test_defaults_are_the_source_documents_values() -> None:
    c = RaftConfig()
    assert c.backfill_threshold == 10
    assert c.max_backfill_entries_per_round == 128
    assert c.learner_promotion_lag == 10


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("backfill_threshold", -1, "greater than or equal to 0"),
        ("max_backfill_entries_per_round", 0, "greater than or equal to 1"),
        ("election_ticks", "soon", "valid integer"),
        ("compact_every_operations", 0, "greater than or equal to 1"),
        ("election_ticks", 2, "greater than or equal to 3"),
        ("heartbeat_ticks", 0, "greater than or equal to 1"),
        ("compact_number_entries", -1, "greater than or equal to 0"),
    ],
)
def test_bad_value_names_field_and_reason(field: str, value: object, reason: str) -> None:
    with pytest.raises(ValidationError) as info:
        RaftConfig(**{field: value})
    text = describe_validation_error(info.value)
    assert text.startswith(f"{field}: ") and reason in text


def test_unknown_field_is_refused() -> None:
    with pytest.raises(ValidationError) as info:
        RaftConfig(backfil_threshold=5)  # type: ignore[call-arg]
    assert "backfil_threshold: Extra inputs are not permitted" in describe_validation_error(
        info.value
    )


def test_heartbeat_must_be_below_election() -> None:
    with pytest.raises(ValidationError) as info:
        RaftConfig(election_ticks=5, heartbeat_ticks=5)
    assert "heartbeat_ticks (5) must be below election_ticks (5)" in str(info.value)


def test_the_promotion_window_is_not_a_node_setting() -> None:
    # Only the operator watches it; a node given it refuses it by name.
    with pytest.raises(ValidationError) as info:
        RaftConfig(learner_promotion_stable_window=3.0)  # type: ignore[call-arg]
    assert "learner_promotion_stable_window: Extra inputs" in describe_validation_error(info.value)


@pytest.mark.parametrize(
    "settings",
    [
        {"snapshot_retry_ticks": 20, "snapshot_retry_max_ticks": 20},  # no back-off growth
        {"max_append_bytes": 4096, "max_message_bytes": 4096},  # an append as large as allowed
    ],
)
def test_limits_that_meet_are_allowed(settings: dict[str, int]) -> None:
    RaftConfig(**settings)
