"""Fault crash-after-load: clear failure, previous version serves again, report records the rollback."""

from fault_common import (  # noqa: F401  (fixtures and tests)
    bad_deploy,
    test_host_failed_with_a_clear_message,
    test_previous_version_serves_and_is_healthy,
    test_report_records_the_rollback,
)
