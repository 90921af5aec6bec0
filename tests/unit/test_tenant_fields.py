"""What the operator's tenant commands refuse before any statement, and when the
operator flag is written (``store/tenants.py``)."""

from __future__ import annotations

import pytest

from chronoshard.scheduler.errors import InvalidArgument
from chronoshard.scheduler.store import tenants


@pytest.mark.parametrize(
    ("rate_limit_rps", "max_concurrent_workers", "field"),
    [
        (0.0, 1, "rate_limit_rps"),
        (-1.0, 1, "rate_limit_rps"),
        (float("nan"), 1, "rate_limit_rps"),
        (1.0, 0, "max_concurrent_workers"),
    ],
)
def test_limits_out_of_range_name_their_field(
    rate_limit_rps: float, max_concurrent_workers: int, field: str
) -> None:
    with pytest.raises(InvalidArgument) as raised:
        tenants.check_limits(rate_limit_rps, max_concurrent_workers)
    assert raised.value.field == field


def test_the_smallest_limits_are_accepted() -> None:
    tenants.check_limits(1e-9, 1)


@pytest.mark.parametrize("name", ["", "   ", "n" * (tenants.MAX_NAME_CHARS + 1)])
def test_an_operator_tenant_needs_a_name_of_1_to_200_characters(name: str) -> None:
    with pytest.raises(InvalidArgument) as raised:
        tenants.check_operator_fields(name, 1.0, 1)
    assert raised.value.field == "name"


def test_the_name_is_checked_before_the_limits() -> None:
    with pytest.raises(InvalidArgument) as raised:
        tenants.check_operator_fields("", 0.0, 0)
    assert raised.value.field == "name"
    tenants.check_operator_fields("n" * tenants.MAX_NAME_CHARS, 1.0, 1)


@pytest.mark.parametrize(
    ("wanted", "current", "written"),
    [
        (None, False, False),
        (None, True, False),
        (True, True, False),
        (True, False, True),
        (False, True, True),
        (False, False, False),
    ],
)
def test_the_operator_flag_is_written_only_when_asked_and_different(
    wanted: bool | None, current: bool, written: bool
) -> None:
    assert tenants.operator_flag_changes(wanted, current) is written
