"""Regions: which tenants a cluster serves, and the refusal that sends the others home.

A cluster runs in one region (``[region] name``); each tenant has a home region
(``tenants.home_region``, set by ``chronoshard tenants create/update --home-region``). A
call from a tenant homed elsewhere is refused with ``FAILED_PRECONDITION``, reason
``WRONG_REGION``, its error details naming the home region, so the client can follow it
(``Client(regions=...)``) and nothing is written in a region that does not own the
tenant's data. A cluster that took over a failed region in a disaster recovery also serves
that region's tenants (``[region] adopted``; docs/operations.md#disaster-recovery).

Pure: no I/O, names in, a decision out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from chronoshard.scheduler.errors import InvalidArgument, WrongRegion

DEFAULT_REGION = "local"
"""The region of a cluster and of a tenant that were given none."""

REGION_NAME = re.compile(r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?")
"""A region name is a DNS label (``eu-west-1``): it goes into hostnames, labels, logs."""


def check_region_name(value: str, field: str) -> str:
    """``value`` if it is a valid region name.

    Raises:
        InvalidArgument: it is not a lowercase DNS label (``field`` named).
    """
    if not isinstance(value, str) or REGION_NAME.fullmatch(value) is None:
        raise InvalidArgument(
            field,
            f"{value!r} is not a region name: lowercase letters, digits and '-', "
            "1-63 characters, starting and ending with a letter or digit",
        )
    return value


@dataclass(frozen=True, slots=True)
class RegionPolicy:
    """The region a cluster runs in and the home regions it serves (its own and the
    ``adopted`` ones)."""

    name: str = DEFAULT_REGION
    adopted: frozenset[str] = frozenset()

    @classmethod
    def of(cls, name: str, adopted: Iterable[str] = ()) -> RegionPolicy:
        """Raises InvalidArgument for a name that is not a region name."""
        check_region_name(name, "region.name")
        adopted_set = frozenset(check_region_name(a, "region.adopted") for a in adopted)
        return cls(name, adopted_set - {name})

    def serves(self, home_region: str) -> bool:
        return home_region == self.name or home_region in self.adopted

    def check(self, tenant_name: str, home_region: str) -> None:
        """Raises WrongRegion when a tenant homed in ``home_region`` is not served here."""
        if not self.serves(home_region):
            raise WrongRegion(tenant_name, home_region, self.name)
