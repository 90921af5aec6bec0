"""Region names, the region rule, and the fairness and region settings' validation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from chronoshard.scheduler.config import SchedulerConfig
from chronoshard.scheduler.core.models import Priority
from chronoshard.scheduler.core.regions import REGION_NAME, RegionPolicy, check_region_name
from chronoshard.scheduler.errors import InvalidArgument, WrongRegion
from chronoshard.settings import ConfigError, load

region_names = st.from_regex(REGION_NAME, fullmatch=True)


@given(region_names, st.lists(region_names, max_size=3), region_names)
def test_a_home_region_is_served_exactly_when_it_is_the_cluster_s_or_adopted(
    name: str, adopted: list[str], home: str
) -> None:
    policy = RegionPolicy.of(name, adopted)
    served = home == name or home in adopted
    assert policy.serves(home) is served
    if served:
        policy.check("t", home)
    else:
        with pytest.raises(WrongRegion) as refused:
            policy.check("t", home)
        assert refused.value.metadata == {"home_region": home, "region": name}


@pytest.mark.parametrize("bad", ["", "EU", "eu_west", "-eu", "eu-", "a" * 64, "eu west"])
def test_a_region_name_that_is_no_dns_label_is_refused_naming_the_field(bad: str) -> None:
    with pytest.raises(InvalidArgument) as refused:
        check_region_name(bad, "home_region")
    assert refused.value.field == "home_region"


def test_the_fairness_settings_reach_the_selector_s_policy() -> None:
    config = load(
        SchedulerConfig,
        env={
            "CHRONOSHARD_FAIRNESS__BULK_CAP_FRACTION": "0.25",
            "CHRONOSHARD_FAIRNESS__CRITICAL_WEIGHT": "16",
            "CHRONOSHARD_FAIRNESS__STRICT_CRITICAL": "false",
        },
    )
    policy = config.fairness.policy()
    assert policy.class_in_flight_caps[Priority.BULK] == 0.25
    assert policy.class_weights[Priority.CRITICAL] == 16.0
    assert policy.strict_critical is False


@pytest.mark.parametrize(
    ("env", "key"),
    [
        ({"CHRONOSHARD_REGION__NAME": "Eu_West"}, "region.name"),
        ({"CHRONOSHARD_REGION__ADOPTED": "east,-bad"}, "region.adopted"),
        ({"CHRONOSHARD_FAIRNESS__BULK_CAP_FRACTION": "1.5"}, "fairness.bulk_cap_fraction"),
        ({"CHRONOSHARD_FAIRNESS__CRITICAL_WEIGHT": "0"}, "fairness.critical_weight"),
        (
            {"CHRONOSHARD_FAIRNESS__CRITICAL_RESERVE_FRACTION": "1"},
            "fairness.critical_reserve_fraction",
        ),
    ],
)
def test_a_bad_region_or_fairness_setting_stops_the_node_naming_the_key(
    env: dict[str, str], key: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        load(SchedulerConfig, env=env)
    assert refused.value.key == key
