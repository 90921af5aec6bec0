-- Operators: a tenant whose API key may also call the cluster-wide admin operations
-- (AdminService.DrainNode). Reading the topology needs only a valid key; changing the
-- cluster needs this flag. It is set by `chronoshard tenants create NAME --operator`
-- (the dev launcher's default tenant has it), never through the API.
ALTER TABLE tenants
    ADD COLUMN operator boolean NOT NULL DEFAULT false;
