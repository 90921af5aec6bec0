-- 0017: dispatch allowances, so that the cluster-wide quota check (0013) is not a lock
-- every dispatch round of a tenant takes in turn, on every node.
--
-- Each round locked the tenant's bucket row until its intents committed: one tenant's
-- rounds took turns across the whole cluster, and three nodes on one machine dispatched
-- a quarter of what one did (issue 14: 470 against 1,990 tasks/s, the rounds waiting
-- 22 ms on average for that lock). A round that finds the tenant far from both limits
-- now also grants its node an allowance: a number of tasks the node may dispatch for the
-- tenant within ALLOWANCE_S without asking again (scheduler/core/quotas.py decides it;
-- store/quotas.py and docs/operations.md#tenants-and-quotas tell the rules). Its tokens
-- are drawn from the bucket when it is granted; its attempts count against the tenant's
-- concurrency, for the other nodes' checks, until it expires or is replaced.

-- A node's current allowance for a tenant: ``attempts`` tasks granted, valid until
-- expires_at (PostgreSQL's clock) and only as long as grant_id is the node's current one
-- (a node that was replaced, or a round that raced its node's newer grant, refuses it).
CREATE TABLE tenant_dispatch_allowances (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    node_id     text NOT NULL,
    grant_id    uuid NOT NULL,
    attempts    integer NOT NULL CHECK (attempts >= 0),
    expires_at  timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, node_id)
);

-- The dispatch path's, like tenant_dispatch_buckets: chronoshard_api is granted nothing.
ALTER TABLE tenant_dispatch_allowances ENABLE ROW LEVEL SECURITY;
CREATE POLICY tenant_isolation ON tenant_dispatch_allowances
    USING (tenant_id = chronoshard_current_tenant())
    WITH CHECK (tenant_id = chronoshard_current_tenant());

-- The locks a dispatch round takes for its tenants: transaction-scoped advisory locks,
-- ('chrq', hashtext(tenant)), taken in key order whatever their strength (one order for
-- every round: two rounds never deadlock on them; tenants sharing a key only wait for
-- each other more). A tenant the round checks in full (``checked``) is locked
-- exclusively: that round waits for every round that dispatches the tenant under an
-- allowance, and its fresh reads that follow see what they wrote. A tenant dispatched
-- under an allowance is locked shared: such rounds, on any node, do not wait for one
-- another, only for a check. Not row locks on the bucket: a share-lock of a row is
-- written into the row (a MultiXact once several rounds hold it), which cost a round
-- ~0.3 ms under three nodes' rounds at once; an advisory lock is only in memory.
-- A lock helper only: what the rounds decide is in Python (core/quotas.py).
CREATE FUNCTION chronoshard_lock_dispatch_quotas(checked uuid[], allowed uuid[])
RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    held record;
BEGIN
    FOR held IN
        SELECT hashtext(t::text) AS key, bool_or(t = ANY (checked)) AS exclusive
        FROM unnest(checked || allowed) AS t
        GROUP BY 1
        ORDER BY 1
    LOOP
        IF held.exclusive THEN
            PERFORM pg_advisory_xact_lock(1667789425, held.key);
        ELSE
            PERFORM pg_advisory_xact_lock_shared(1667789425, held.key);
        END IF;
    END LOOP;
END;
$$;
