"""The submitting client of tests/e2e/test_tracing.py, run as a process of its own:
``python tracing_client.py TARGET API_KEY`` prints ``{"traced": ID, "fails": ID}``.

It configures tracing the way our own processes do (``chronoshard.tracing.
configure_from_env`` from the ``OTEL_*`` environment the test sets: OTLP to the test's
receiver) and submits both tasks inside a span of its own, due now by the node's clock.
The test runs it under libfaketime two days in the past, so its spans are stamped two
days before the node's and the worker's. (Nothing here may call ``time.sleep``: under
libfaketime with the monotonic clock left alone, Python 3.11's sleep fails with EINVAL.)
"""

from __future__ import annotations

import json
import sys

from opentelemetry import trace

from chronoshard import SyncClient, tracing

REQUEST_SPAN = "tracing.client-request"


def main(target: str, api_key: str) -> None:
    if not tracing.configure_from_env("tracing-e2e-client"):
        raise SystemExit("tracing was not configured from the environment")
    ids: dict[str, str] = {}
    try:
        with (
            SyncClient(target, api_key=api_key) as client,
            trace.get_tracer("tracing_client").start_as_current_span(REQUEST_SPAN),
        ):
            for name in ("traced", "fails"):
                submitted = client.submit(f"tracing.{name}", {}, strict_timing=True, max_retries=0)
                ids[name] = submitted.task.id
    finally:
        tracing.shutdown()  # the spans are exported before the process ends
    print(json.dumps(ids))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
